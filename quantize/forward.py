"""`verify --forward`: one forward pass of the source model and of the dequantized checkpoint, compared.

For the model classes we know how to feed (diffusers' `WanTransformer3DModel` and
`Kandinsky5Transformer3DModel`, named by config.json's `_class_name`): both models are built in
float32 from the component's config, the source with its own weights (read through the plan: every
step applied), the other with every stored tensor decoded by the checkpoint's format; the same fixed random inputs go through both and the
output SQNR must reach the recipe's `checks.min_forward_sqnr_db` (default 20 dB). It needs memory for
two float32 copies of the model: meant for the small and medium models, or a machine with the RAM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from .checkpoint import CONFIG_NAME, Component, read_tensor
from .containers import get_container
from .errors import InputError
from .formats import Format, format_info
from .layout import read_json_object
from .plan import ComponentPlan, Plan
from .recipes import Recipe

__all__ = ["MODEL_INPUTS", "check_forward", "require_known_models", "DEFAULT_MIN_FORWARD_SQNR_DB"]

DEFAULT_MIN_FORWARD_SQNR_DB = 20.0


def _wan_inputs(config: dict, g: torch.Generator) -> dict:
    p = config.get("patch_size", (1, 2, 2))
    inputs = dict(
        hidden_states=torch.randn(1, config["in_channels"], 2 * p[0], 8 * p[1], 8 * p[2], generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, config["text_dim"], generator=g),
        return_dict=False,
    )
    if config.get("image_dim"):
        inputs["encoder_hidden_states_image"] = torch.randn(1, 4, config["image_dim"], generator=g)
    return inputs


def _kandinsky5_inputs(config: dict, g: torch.Generator) -> dict:
    p = config.get("patch_size", (1, 2, 2))
    frames, h, w = 2 * p[0], 4 * p[1], 4 * p[2]
    return dict(
        hidden_states=torch.randn(1, frames, h, w, config["in_visual_dim"], generator=g),
        encoder_hidden_states=torch.randn(1, 6, config["in_text_dim"], generator=g),
        timestep=torch.tensor([500.0]),
        pooled_projections=torch.randn(1, config["in_text_dim2"], generator=g),
        visual_rope_pos=(torch.arange(frames // p[0]), torch.arange(h // p[1]), torch.arange(w // p[2])),
        text_rope_pos=torch.arange(6),
        return_dict=False,
    )


#: diffusers class name -> fixed random inputs for one forward pass, from the model's config
MODEL_INPUTS: dict[str, Callable[[dict, torch.Generator], dict]] = {
    "WanTransformer3DModel": _wan_inputs,
    "Kandinsky5Transformer3DModel": _kandinsky5_inputs,
}


def _class_name(component_dir: Path) -> str | None:
    try:
        return read_json_object(component_dir / CONFIG_NAME).get("_class_name")
    except InputError:
        return None


def require_known_models(source: Path, recipe: Recipe) -> None:
    """Refuse --forward up front when a component is not a model class we can run."""
    for rel in recipe.components:
        name = _class_name(source if rel == "." else source / rel)
        if name not in MODEL_INPUTS:
            raise InputError(
                f"{source / rel / CONFIG_NAME}: --forward runs {', '.join(MODEL_INPUTS)}; this config names {name!r}"
            )
    try:
        import diffusers  # noqa: F401
    except ImportError:
        raise InputError("--forward needs diffusers: pip install 'dit-quantize[diffusers]'") from None


def check_forward(plan: Plan, checkpoint: Path, recipe: Recipe, fmt: Format, report) -> None:
    """Record one `forward/output SQNR` check per component of `plan` (the source's plan under `recipe`)."""
    threshold = recipe.checks.min_forward_sqnr_db
    threshold = DEFAULT_MIN_FORWARD_SQNR_DB if threshold is None else threshold
    for cp in plan.components:
        name = _class_name(cp.component.dir)
        try:
            sqnr = _forward_sqnr(cp, name, checkpoint, fmt)
        except Exception as e:  # a model that will not build or run is a failed check, with its reason
            report.fail("forward", "output SQNR", f"{cp.rel}: {name} forward failed: {type(e).__name__}: {e}")
            continue
        ok = sqnr >= threshold
        message = f"{cp.rel}: {name} forward output SQNR {sqnr:.2f} dB below min_forward_sqnr_db {threshold}"
        report.record("forward", "output SQNR", ok, "" if ok else message)


def _forward_sqnr(cp: ComponentPlan, name: str, checkpoint: Path, fmt: Format) -> float:
    import diffusers

    model_cls = getattr(diffusers, name)
    reference = model_cls.from_config(cp.component.config).to(torch.float32).eval()
    # the source as the plan reads it (every step applied), not the files as they lie
    reference.load_state_dict({tp.name: tp.source.read().float() for tp in cp.tensors}, strict=True)
    quantized = model_cls.from_config(reference.config).to(torch.float32).eval()
    stored = get_container(format_info(fmt.NAME).container).open_stored(checkpoint, cp.rel)
    quantized.load_state_dict(_dequantized_state(cp, stored, fmt), strict=True)
    inputs = MODEL_INPUTS[name](dict(reference.config), torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(**inputs)[0].float()
        got = quantized(**inputs)[0].float()
    noise = float((want - got).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(want.pow(2).sum()) / noise)


def _dequantized_state(cp: ComponentPlan, stored: Component, fmt: Format) -> dict[str, torch.Tensor]:
    """The stored checkpoint decoded to float32, under the source's names (the model class is the source's)."""
    state = {}
    for tp in cp.tensors:
        parts = {
            part: read_tensor(stored.tensors[spec.name])
            for part, spec in zip(tp.parts, tp.outputs, strict=True)
        }
        state[tp.name] = (
            fmt.decode(parts, torch.float32, **tp.format_options) if tp.quantize else parts[""].float()
        )
    return state
