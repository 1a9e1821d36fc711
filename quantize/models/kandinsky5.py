"""Kandinsky 5 (T2V Lite and Pro; diffusers' `Kandinsky5Transformer3DModel`): everything the tool knows of it.

Layouts (`Kandinsky5.layouts`): ``kandinsky5-original`` (the release as its authors ship it: the DiT as one safetensors
file in ``model/``, e.g. ``kandinsky5lite_t2v_sft_5s.safetensors`` of ``kandinskylab/Kandinsky-5.0-T2V-Lite-sft-5s``,
with no config.json: its dimensions live in the GitHub repository's YAML, and are read here off the tensor shapes as
ComfyUI reads them) and ``kandinsky5`` (diffusers layout: ``transformer/`` with
``Kandinsky5Transformer3DModel``'s config, or that folder itself).

Names: the native ones are the original release's (``visual_transformer_blocks.0.cross_attention.key_norm``,
``visual_embeddings.in_layer``, ``out_layer.modulation.out_layer``), the module names of the original
``DiffusionTransformer3D`` that ComfyUI's ``comfy/ldm/kandinsky5/model.py`` builds and loads unchanged. diffusers'
port keeps every one of them, so `NAMES` maps each name to itself; it is still a table: a tensor it does not list
(a variant's extra layer) has no native name and is refused, naming it. The two namings cannot be told apart by
their names (`Family.naming` says ``diffusers`` of both); the layouts are told by the folder and its config.json.

The dimensions ComfyUI fixes (``comfy/model_detection.py``, ``comfy/ldm/kandinsky5/model.py``): it reads model_dim,
time_dim, ff_dim, visual_embed_dim and the block counts off the tensors, but not the head width: axes_dims
(16, 24, 24), a head of 64, unless model_dim is 4096 or 2560 ((32, 48, 48), a head of 128); the text widths 3584
(Qwen2.5-VL) and 768 (CLIP), out_visual_dim 16 and the (1, 2, 2) patch are its defaults; and its video model always
concatenates the image latent and a mask to the noise (visual_cond: 16 + 16 + 1 channels, visual_embed_dim
4 * 33 = 132). The examples keep all of them, and `Kandinsky5.diffusers_config` assumes them of an original file.

>>> KANDINSKY5.native_name("visual_transformer_blocks.3.cross_attention.key_norm.weight")
'visual_transformer_blocks.3.cross_attention.key_norm.weight'
>>> KANDINSKY5.native_name("visual_transformer_blocks.3.attn2.to_q.weight") is None
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .base import BlockNames, Blocks, ExampleModel, Family, ModelInputs, NameTable, SourceLayout

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["KANDINSKY5", "Kandinsky5", "Kandinsky5Shape", "NAMES", "kandinsky5_tensors", "comfyui_axes_dims"]

# --- names ---------------------------------------------------------------------------------------------

_ATTENTION = ("to_query", "to_key", "to_value", "out_layer", "query_norm", "key_norm")


def _same(names: Sequence[str]) -> dict[str, str]:
    return {n: n for n in names}


#: diffusers' names -> the original release's: the same, module by module
NAMES = BlockNames(
    root_modules=_same(
        [
            "time_embeddings.in_layer",
            "time_embeddings.out_layer",
            "text_embeddings.in_layer",
            "text_embeddings.norm",
            "pooled_text_embeddings.in_layer",
            "pooled_text_embeddings.norm",
            "visual_embeddings.in_layer",
            "out_layer.modulation.out_layer",
            "out_layer.out_layer",
        ]
    ),
    root_tensors={},
    blocks=(
        Blocks(
            "text_transformer_blocks",
            "text_transformer_blocks",
            modules=_same(
                [
                    "text_modulation.out_layer",
                    *(f"self_attention.{m}" for m in _ATTENTION),
                    "feed_forward.in_layer",
                    "feed_forward.out_layer",
                ]
            ),
        ),
        Blocks(
            "visual_transformer_blocks",
            "visual_transformer_blocks",
            modules=_same(
                [
                    "visual_modulation.out_layer",
                    *(f"{a}.{m}" for a in ("self_attention", "cross_attention") for m in _ATTENTION),
                    "feed_forward.in_layer",
                    "feed_forward.out_layer",
                ]
            ),
        ),
    ),
)

#: the folder the release keeps its DiT in (``model/kandinsky5lite_t2v_sft_5s.safetensors``)
ORIGINAL_FOLDER = "model"


def comfyui_axes_dims(model_dim: int) -> tuple[int, int, int]:
    """The RoPE axes ComfyUI builds a Kandinsky 5 of this width with (its head width is their sum): it does not
    read them off the tensors (comfy/model_detection.py)."""
    return (32, 48, 48) if model_dim in (4096, 2560) else (16, 24, 24)


# --- a forward pass's inputs -------------------------------------------------------------------------------

_KEYS = ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, None, None, _visual_channels(config)),),
        "encoder_hidden_states": ((None, None, config["in_text_dim"]),),
        "timestep": ((None,),),
        "pooled_projections": ((None, config["in_text_dim2"]),),
    }


def _visual_channels(config: dict) -> int:
    """The channels of the model's latent input: the noise, and with visual_cond the image latent and a mask."""
    c = config["in_visual_dim"]
    return 2 * c + 1 if config.get("visual_cond") else c


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    p = config.get("patch_size", (1, 2, 2))
    frames, h, w = 2 * p[0], 4 * p[1], 4 * p[2]
    return dict(
        hidden_states=torch.randn(1, frames, h, w, _visual_channels(config), generator=g),
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


# --- examples --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kandinsky5Shape:
    """The dimensions of an example Kandinsky 5 DiT. The defaults are what ComfyUI builds a Kandinsky 5 video model
    with whatever the tensors say (see the module's docstring): the examples keep them, so that every runtime loads
    them; `axes_dims` is ComfyUI's for `model_dim` unless given."""

    model_dim: int
    ff_dim: int
    time_dim: int
    num_text_blocks: int
    num_visual_blocks: int
    in_visual_dim: int = 16
    out_visual_dim: int = 16
    in_text_dim: int = 3584
    in_text_dim2: int = 768
    patch_size: tuple[int, int, int] = (1, 2, 2)
    visual_cond: bool = True
    axes_dims: tuple[int, int, int] | None = None

    @property
    def axes(self) -> tuple[int, int, int]:
        return self.axes_dims or comfyui_axes_dims(self.model_dim)

    def config(self) -> dict:
        """`Kandinsky5Transformer3DModel`'s config.json for this shape."""
        return {
            "_class_name": KANDINSKY5.diffusers_class,
            "in_visual_dim": self.in_visual_dim,
            "in_text_dim": self.in_text_dim,
            "in_text_dim2": self.in_text_dim2,
            "time_dim": self.time_dim,
            "out_visual_dim": self.out_visual_dim,
            "patch_size": list(self.patch_size),
            "model_dim": self.model_dim,
            "ff_dim": self.ff_dim,
            "num_text_blocks": self.num_text_blocks,
            "num_visual_blocks": self.num_visual_blocks,
            "axes_dims": list(self.axes),
            "visual_cond": self.visual_cond,
        }


def _linear(name: str, out: int, inp: int, bias: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{name}.weight", (out, inp))] + ([(f"{name}.bias", (out,))] if bias else [])


def _attention(prefix: str, d: int, head: int) -> list[tuple[str, tuple[int, ...]]]:
    t = (
        _linear(f"{prefix}.to_query", d, d)
        + _linear(f"{prefix}.to_key", d, d)
        + _linear(f"{prefix}.to_value", d, d)
    )
    t += [(f"{prefix}.query_norm.weight", (head,)), (f"{prefix}.key_norm.weight", (head,))]
    return t + _linear(f"{prefix}.out_layer", d, d)


def kandinsky5_tensors(s: Kandinsky5Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original Kandinsky 5 DiT (``kandinsky/models/dit.py``, as ComfyUI's
    ``comfy/ldm/kandinsky5/model.py`` builds it), in module order."""
    d, t, ff, head = s.model_dim, s.time_dim, s.ff_dim, sum(s.axes)
    patch = math.prod(s.patch_size)
    visual = (2 * s.in_visual_dim + 1 if s.visual_cond else s.in_visual_dim) * patch
    out = _linear("time_embeddings.in_layer", t, d) + _linear("time_embeddings.out_layer", t, t)
    out += _linear("text_embeddings.in_layer", d, s.in_text_dim) + [
        ("text_embeddings.norm.weight", (d,)),
        ("text_embeddings.norm.bias", (d,)),
    ]
    out += _linear("pooled_text_embeddings.in_layer", t, s.in_text_dim2) + [
        ("pooled_text_embeddings.norm.weight", (t,)),
        ("pooled_text_embeddings.norm.bias", (t,)),
    ]
    out += _linear("visual_embeddings.in_layer", d, visual)

    def feed_forward(b: str) -> list[tuple[str, tuple[int, ...]]]:
        return _linear(f"{b}.feed_forward.in_layer", ff, d, False) + _linear(
            f"{b}.feed_forward.out_layer", d, ff, False
        )

    for i in range(s.num_text_blocks):
        b = f"text_transformer_blocks.{i}"
        out += _linear(f"{b}.text_modulation.out_layer", 6 * d, t)
        out += _attention(f"{b}.self_attention", d, head) + feed_forward(b)
    for i in range(s.num_visual_blocks):
        b = f"visual_transformer_blocks.{i}"
        out += _linear(f"{b}.visual_modulation.out_layer", 9 * d, t)
        out += _attention(f"{b}.self_attention", d, head) + _attention(f"{b}.cross_attention", d, head)
        out += feed_forward(b)
    out += _linear("out_layer.modulation.out_layer", 2 * d, t)
    return out + _linear("out_layer.out_layer", patch * s.out_visual_dim, d)


#: example layouts: ``t2v`` diffusers' ``transformer/``; ``original`` the release's ``model/<one file>``
_LAYOUTS = ("t2v", "original")
#: what the example's one file is called in ``model/`` (the Lite T2V release's name, so that it reads as released)
ORIGINAL_FILE_STEM = "kandinsky5lite_t2v_sft_5s"


class Kandinsky5(Family):
    name = "kandinsky5"
    title = "Kandinsky 5"
    diffusers_class = "Kandinsky5Transformer3DModel"
    names = NAMES
    # one naming, told by these prefixes (the original's and diffusers' are the same names)
    diffusers_marks = ("visual_transformer_blocks.0.", "text_transformer_blocks.0.")
    gguf_architecture = None
    no_gguf_why = (
        "ComfyUI-GGUF's loader reads only the architectures of its IMG_ARCH_LIST (flux, sd1, sdxl, sd3, aura, "
        "hidream, cosmos, ltxv, hyvid, wan, lumina2, qwen_image), none of them Kandinsky 5, and diffusers has no "
        "single-file loader for Kandinsky5Transformer3DModel"
    )
    lora_prefixes = ("transformer.", "base_model.model.", "diffusion_model.", "model.diffusion_model.")
    default_recipes = {
        "kandinsky5": {
            "fp8_channel": "kandinsky5-fp8",
            "torchao_fp8": "kandinsky5-torchao-fp8",
            "torchao_int8": "kandinsky5-torchao-int8",
            "nf4": "kandinsky5-nf4",
            "comfy_fp8": "kandinsky5-comfy-fp8",
            "comfy_int8": "kandinsky5-comfy-int8",
            "comfy_nvfp4": "kandinsky5-comfy-nvfp4",
            "comfy_mxfp8": "kandinsky5-comfy-mxfp8",
        },
        "kandinsky5-original": {
            "fp8_channel": "kandinsky5-original-fp8",
            "torchao_fp8": "kandinsky5-original-torchao-fp8",
            "torchao_int8": "kandinsky5-original-torchao-int8",
            "nf4": "kandinsky5-original-nf4",
            "comfy_fp8": "kandinsky5-original-comfy-fp8",
            "comfy_int8": "kandinsky5-original-comfy-int8",
            "comfy_nvfp4": "kandinsky5-original-comfy-nvfp4",
            "comfy_mxfp8": "kandinsky5-original-comfy-mxfp8",
        },
    }
    presets = {
        # a head of 64 (ComfyUI's axes for these widths), Qwen's and CLIP's widths, visual_cond: what ComfyUI builds
        "tiny": Kandinsky5Shape(
            model_dim=128, ff_dim=256, time_dim=64, num_text_blocks=1, num_visual_blocks=2
        ),
        # every Linear of the blocks a multiple of 256 wide
        "small": Kandinsky5Shape(
            model_dim=256, ff_dim=1024, time_dim=128, num_text_blocks=1, num_visual_blocks=4
        ),
        # Kandinsky 5.0 T2V Lite (configs/config_5s_sft.yaml of the release)
        "lite": Kandinsky5Shape(
            model_dim=1792, ff_dim=7168, time_dim=512, num_text_blocks=2, num_visual_blocks=32
        ),
    }
    example_layouts = _LAYOUTS
    default_preset = "tiny"

    # --- recognizing it ------------------------------------------------------------------------------

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        """The diffusers layouts (`Family.layouts`), and the release's: ``model/`` holding Kandinsky 5 tensors and
        no config.json naming a class."""
        found = super().layouts(folder, open_)
        comp = open_(ORIGINAL_FOLDER)
        if comp is not None and _is_original(self, comp):
            why = (
                f"{self.title}, the original release's layout (the DiT in {ORIGINAL_FOLDER}/, original names)"
            )
            found.append(self.layout(why, "kandinsky5-original"))
        return found

    def name_table(self, role: str, fmt: str, where: str = "") -> NameTable:
        """Its native names, for every format but GGUF, which is refused here, at plan time: no GGUF reader knows
        a Kandinsky 5 architecture (`no_gguf_why`)."""
        if fmt == "gguf":
            raise InputError(
                f"{where + ': ' if where else ''}{self.title} has no GGUF architecture ({self.no_gguf_why}): "
                "convert it to another format (quantize recipes --for lists them)"
            )
        return super().name_table(role, fmt, where)

    # --- running it ------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

    def runnable_names(self, names: Sequence[str], where: Path) -> dict[str, str]:
        """Each original tensor name -> diffusers' parameter name (the same), or `InputError` naming one diffusers'
        class lacks."""
        if self.naming(names) is None:
            raise InputError(
                f"{where}: the tensors do not have {self.title}'s names (no {' or '.join(self.diffusers_marks)}"
                f"...): a forward pass cannot run it"
            )
        renamed = {}
        for name in names:
            new = self.diffusers_name(name)
            if new is None:
                raise InputError(
                    f"{where}: tensor {name!r} has no counterpart in diffusers' {self.diffusers_class} (a "
                    f"{self.title} variant it does not implement): this model cannot be run for a forward pass"
                )
            renamed[name] = new
        return renamed

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`Kandinsky5Transformer3DModel`'s config for an original file (which has no config.json), read off the
        tensor shapes as ComfyUI reads them; what the shapes do not say is what ComfyUI assumes (see the module's
        docstring), and a head width other than ComfyUI's is an error naming the tensor."""

        def shape(name: str) -> tuple[int, ...]:
            if name not in tensors:
                raise InputError(f"{where}: no tensor {name!r}: not an original {self.title} DiT")
            return tuple(tensors[name].shape)

        patch = (1, 2, 2)
        model_dim = shape("visual_embeddings.in_layer.bias")[0]
        axes = comfyui_axes_dims(model_dim)
        norm = "visual_transformer_blocks.0.self_attention.query_norm.weight"
        if shape(norm)[0] != sum(axes):
            raise InputError(
                f"{where}: tensor {norm!r} is {shape(norm)[0]} wide; ComfyUI builds a {self.title} of model_dim "
                f"{model_dim} with a head of {sum(axes)} (axes_dims {axes}): not a release it runs"
            )
        visual = shape("visual_embeddings.in_layer.weight")[1] // math.prod(patch)
        out_visual = shape("out_layer.out_layer.weight")[0] // math.prod(patch)
        cond = visual == 2 * out_visual + 1
        return {
            "_class_name": self.diffusers_class,
            "in_visual_dim": out_visual if cond else visual,
            "in_text_dim": shape("text_embeddings.in_layer.weight")[1],
            "in_text_dim2": shape("pooled_text_embeddings.in_layer.weight")[1],
            "time_dim": shape("time_embeddings.in_layer.bias")[0],
            "out_visual_dim": out_visual,
            "patch_size": list(patch),
            "model_dim": model_dim,
            "ff_dim": shape("visual_transformer_blocks.0.feed_forward.in_layer.weight")[0],
            "num_text_blocks": _count(tensors, "text_transformer_blocks."),
            "num_visual_blocks": _count(tensors, "visual_transformer_blocks."),
            "axes_dims": list(axes),
            "visual_cond": cond,
        }

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The release ships no config.json: a checkpoint converted from it is written with diffusers' config read
        off its tensors (`diffusers_config`), so that it loads as `Kandinsky5Transformer3DModel` (its names are
        diffusers' too)."""
        return self.diffusers_config({}, tensors, where)

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-video" if config.get("_class_name") == self.diffusers_class else None

    # --- examples --------------------------------------------------------------------------------------

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """``t2v``: a diffusers ``transformer/`` with the names and shapes diffusers' own class has (built on meta);
        ``original``: the release's ``model/`` holding one file of the original names, no config.json."""
        if preset not in self.presets or layout not in _LAYOUTS:
            raise InputError(
                f"Kandinsky 5 examples: preset {preset!r}, layout {layout!r}: presets {', '.join(self.presets)}, "
                f"layouts {', '.join(_LAYOUTS)}"
            )
        shape: Kandinsky5Shape = self.presets[preset]
        if layout == "original":
            return [ExampleModel(ORIGINAL_FOLDER, kandinsky5_tensors(shape), None, ORIGINAL_FILE_STEM)]
        import torch

        try:
            import diffusers
        except ImportError:
            raise InputError(
                "Kandinsky 5 examples are built from diffusers' own class: pip install 'dit-quantize[diffusers]'"
            ) from None
        config = shape.config()
        with torch.device("meta"):
            model = diffusers.Kandinsky5Transformer3DModel.from_config(config)
        tensors = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
        return [ExampleModel("transformer", tensors, config)]


def _is_original(family: Family, comp: Component) -> bool:
    """A component of the original release: Kandinsky 5 names, and no config.json naming a class."""
    return not (comp.config or {}).get("_class_name") and family.naming(comp.tensors) is not None


def _count(tensors: Mapping[str, object], prefix: str) -> int:
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in tensors):
        n += 1
    return n


KANDINSKY5 = Kandinsky5()
