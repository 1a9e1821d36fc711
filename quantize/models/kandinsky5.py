"""Kandinsky 5 (diffusers' `Kandinsky5Transformer3DModel`): everything the tool knows of it.

It is known in diffusers names only (a ``transformer/`` folder, or that folder itself); it has no native
names here yet, so the formats that write a family's native names (ComfyUI, GGUF) refuse it, naming both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError
from .base import ExampleModel, Family, ModelInputs

if TYPE_CHECKING:
    import torch

__all__ = ["KANDINSKY5", "Kandinsky5"]

_KEYS = ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, None, None, config["in_visual_dim"]),),
        "encoder_hidden_states": ((None, None, config["in_text_dim"]),),
        "timestep": ((None,),),
        "pooled_projections": ((None, config["in_text_dim2"]),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    p = config.get("patch_size", (1, 2, 2))
    frames, h, w = 2 * p[0], 4 * p[1], 4 * p[2]
    return dict(
        hidden_states=torch.randn(1, frames, h, w, config["in_visual_dim"], generator=g),
        encoder_hidden_states=torch.randn(1, 6, config["in_text_dim"], generator=g),
        timestep=torch.tensor([500.0]),
        pooled_projections=torch.randn(1, config["in_text_dim2"], generator=g),
    )


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    import torch

    p = config.get("patch_size", (1, 2, 2))
    _, frames, h, w, _ = t["hidden_states"].shape
    return dict(
        t,
        visual_rope_pos=(torch.arange(frames // p[0]), torch.arange(h // p[1]), torch.arange(w // p[2])),
        text_rope_pos=torch.arange(t["encoder_hidden_states"].shape[1]),
        return_dict=False,
    )


_INPUTS = ModelInputs(keys=lambda config: _KEYS, shapes=_shapes, random=_random, call=_call, accepts=_KEYS)

#: example configs: the text widths are the real ones (Qwen2.5-VL's 3584, CLIP's 768), the rest small
_PRESETS = {
    "tiny": dict(
        in_visual_dim=16,
        in_text_dim=3584,
        in_text_dim2=768,
        time_dim=64,
        out_visual_dim=16,
        patch_size=(1, 2, 2),
        model_dim=64,
        ff_dim=128,
        num_text_blocks=1,
        num_visual_blocks=2,
        axes_dims=(8, 12, 12),
    ),
}


class Kandinsky5(Family):
    name = "kandinsky5"
    title = "Kandinsky 5"
    diffusers_class = "Kandinsky5Transformer3DModel"
    diffusers_marks = ("visual_transformer_blocks.0.", "text_transformer_blocks.0.")
    lora_prefixes = ("transformer.", "base_model.model.")
    default_recipes = {"kandinsky5": {"torchao_fp8": "kandinsky5-torchao-fp8"}}
    presets = _PRESETS
    example_layouts = ("t2v",)

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-video" if config.get("_class_name") == self.diffusers_class else None

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """A diffusers ``transformer/`` with the names and shapes diffusers' own class has (built on meta)."""
        if preset not in _PRESETS or layout not in self.example_layouts:
            raise InputError(
                f"Kandinsky 5 examples: preset {preset!r}, layout {layout!r}: presets {', '.join(_PRESETS)}, "
                f"layouts {', '.join(self.example_layouts)}"
            )
        import torch

        try:
            import diffusers
        except ImportError:
            raise InputError(
                "Kandinsky 5 examples are built from diffusers' own class: pip install 'dit-quantize[diffusers]'"
            ) from None

        kwargs = _PRESETS[preset]
        with torch.device("meta"):
            model = diffusers.Kandinsky5Transformer3DModel(**kwargs)
        tensors = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
        config = {
            "_class_name": self.diffusers_class,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
        }
        return [ExampleModel("transformer", tensors, config)]


KANDINSKY5 = Kandinsky5()
