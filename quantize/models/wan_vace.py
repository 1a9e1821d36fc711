"""Wan2.1 VACE (1.3B, 14B; diffusers' `WanVACETransformer3DModel`): a Wan with a control branch.

Layouts (`WanVACE.layouts`): ``wan-vace`` (the release as Wan-AI ships it: shards at the root, original names,
config.json of ``VaceWanModel`` with ``vace_layers`` and ``vace_in_dim``) and ``wan-vace-diffusers`` (a diffusers
``transformer/``, or that folder itself).

Names: Wan's (`wan.NAMES`, shared, not repeated) plus the control branch: ``vace_patch_embedding`` (a Conv3d of
``vace_in_dim`` = 96 channels: 16 latent + 16 reactive latent + 64 mask), and ``vace_blocks.N``, each a Wan block
with ``after_proj`` (its hint, added to main block ``vace_layers[N]``'s output) and, in block 0 only,
``before_proj`` (the control tokens' entry: projected and added to the main stream). diffusers calls them
``proj_out`` and ``proj_in``; its single-file converter (``convert_wan_transformer_to_diffusers``, which covers
VACE) is the tests' oracle. ComfyUI (``comfy/model_detection.py``) tells VACE by ``vace_patch_embedding.weight``,
counts the ``vace_blocks`` and places them every ``num_layers // vace_layers`` blocks from 0
(``comfy/ldm/wan/model.py`` ``VaceWanModel``): the examples place them so.

>>> WAN_VACE.native_name("vace_blocks.0.proj_in.weight"), WAN_VACE.diffusers_name("vace_blocks.1.after_proj.bias")
('vace_blocks.0.before_proj.weight', 'vace_blocks.1.proj_out.bias')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .base import BlockNames, Blocks, ExampleModel, Family, ModelInputs, SourceLayout
from .wan import (
    BLOCK_MODULES,
    ROOT_MODULES,
    WAN,
    WanShape,
    _linear,
    wan_block_tensors,
    wan_config,
    wan_naming,
    wan_tensors,
)
from .wan import (
    NAMES as WAN_NAMES,
)

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["WAN_VACE", "WanVACE", "VaceShape", "NAMES", "comfyui_vace_layers"]

#: what only a VACE model has, in either naming
VACE_MARKS = ("vace_blocks.", "vace_patch_embedding.")

NAMES = BlockNames(
    root_modules={**ROOT_MODULES, "vace_patch_embedding": "vace_patch_embedding"},
    root_tensors=dict(WAN_NAMES.root_tensors),
    blocks=(
        *WAN_NAMES.blocks,
        Blocks(
            "vace_blocks",
            "vace_blocks",
            modules={**BLOCK_MODULES, "proj_in": "before_proj", "proj_out": "after_proj"},
            tensors={"scale_shift_table": "modulation"},
        ),
    ),
)


def comfyui_vace_layers(num_layers: int, vace_blocks: int) -> list[int]:
    """The main blocks ComfyUI adds the VACE hints to (it does not read them from a config)."""
    return list(range(0, num_layers, num_layers // vace_blocks))


# --- a forward pass's inputs -------------------------------------------------------------------------


def _keys(config: dict) -> tuple[str, ...]:
    keys = WAN.inputs.keys(config)
    return (*keys, "control_hidden_states", "control_hidden_states_scale")


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        **WAN.inputs.shapes(config),
        "control_hidden_states": ((None, config["vace_in_channels"], None, None, None),),
        "control_hidden_states_scale": ((len(config["vace_layers"]),),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Wan's inputs, control latents the size of the noise, and a context scale per VACE block around 1 (what
    the pipeline's ``conditioning_scale`` gives every block)."""
    import torch

    inputs = WAN.inputs.random(config, g)
    _, _, f, h, w = inputs["hidden_states"].shape
    inputs["control_hidden_states"] = torch.randn(1, config["vace_in_channels"], f, h, w, generator=g)
    inputs["control_hidden_states_scale"] = 0.5 + torch.rand(len(config["vace_layers"]), generator=g)
    return inputs


_INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"image_dim": 1}),
)


# --- examples --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VaceShape:
    """An example VACE: its Wan (text_dim 4096, freq_dim 256, 128-wide heads, as ComfyUI builds it), how many VACE
    blocks, and the control channels (96 in both releases)."""

    wan: WanShape
    vace_blocks: int
    vace_in_dim: int = 96

    @property
    def vace_layers(self) -> list[int]:
        return comfyui_vace_layers(self.wan.num_layers, self.vace_blocks)


def vace_tensors(s: VaceShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original ``VaceWanModel``: Wan's, its VACE blocks, the control patch embedding."""
    d = s.wan.dim
    t = wan_tensors(s.wan)
    for i in range(s.vace_blocks):
        b = f"vace_blocks.{i}"
        if i == 0:
            t += _linear(f"{b}.before_proj", d, d)
        t += wan_block_tensors(s.wan, b) + _linear(f"{b}.after_proj", d, d)
    return t + [
        ("vace_patch_embedding.weight", (d, s.vace_in_dim, 1, 2, 2)),
        ("vace_patch_embedding.bias", (d,)),
    ]


def vace_config(s: VaceShape) -> dict:
    """config.json as the Wan2.1-VACE releases write it."""
    return {
        **wan_config(s.wan),
        "_class_name": "VaceWanModel",
        "model_type": "vace",
        "vace_layers": s.vace_layers,
        "vace_in_dim": s.vace_in_dim,
    }


_LAYOUTS = ("vace", "diffusers")


class WanVACE(Family):
    name = "wan-vace"
    title = "Wan VACE"
    diffusers_class = "WanVACETransformer3DModel"
    #: the release's class; a VACE release naming Wan's ``WanModel`` is told by its VACE blocks (`owns`)
    native_classes = ("VaceWanModel", "WanModel")
    names = NAMES
    native_marks = ("vace_blocks.0.self_attn.", *WAN.native_marks)
    diffusers_marks = ("vace_blocks.0.attn1.", *WAN.diffusers_marks)
    gguf_architecture = "wan"  # ComfyUI-GGUF reads "wan"; ComfyUI then tells VACE by vace_patch_embedding
    modulation_names = WAN.modulation_names
    lora_prefixes = WAN.lora_prefixes
    default_recipes = {
        "wan-vace": {
            "fp8_channel": "wan-vace-fp8",
            "torchao_fp8": "wan-vace-torchao-fp8",
            "torchao_int8": "wan-vace-torchao-int8",
            "nf4": "wan-vace-nf4",
            "comfy_fp8": "wan-vace-comfy-fp8",
            "comfy_int8": "wan-vace-comfy-int8",
            "comfy_nvfp4": "wan-vace-comfy-nvfp4",
            "comfy_mxfp8": "wan-vace-comfy-mxfp8",
            "gguf": "wan-vace-gguf-q8_0",
        },
        "wan-vace-diffusers": {
            "fp8_channel": "wan-vace-diffusers-fp8",
            "torchao_fp8": "wan-vace-diffusers-torchao-fp8",
            "torchao_int8": "wan-vace-diffusers-torchao-int8",
            "nf4": "wan-vace-diffusers-nf4",
            "comfy_fp8": "wan-vace-diffusers-comfy-fp8",
            "comfy_int8": "wan-vace-diffusers-comfy-int8",
            "comfy_nvfp4": "wan-vace-diffusers-comfy-nvfp4",
            "comfy_mxfp8": "wan-vace-diffusers-comfy-mxfp8",
            "gguf": "wan-vace-diffusers-gguf-q8_0",
        },
    }
    presets = {
        "tiny": VaceShape(WanShape(dim=128, ffn_dim=256, num_layers=2, num_heads=1), vace_blocks=2),
        # every Linear a multiple of 256 wide (GGML's K-quants)
        "small": VaceShape(WanShape(dim=256, ffn_dim=768, num_layers=4, num_heads=2), vace_blocks=2),
        # Wan2.1-VACE-1.3B (vace_layers 0, 2, ..., 28) and -14B (0, 5, ..., 35)
        "1.3b": VaceShape(WanShape(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12), vace_blocks=15),
        "14b": VaceShape(WanShape(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40), vace_blocks=8),
    }
    example_layouts = _LAYOUTS
    default_preset = "small"

    # --- recognizing it ------------------------------------------------------------------------------

    def naming(self, names) -> str | None:
        """Wan's namings, of a model with VACE blocks; None for any other."""
        names = list(names)
        return wan_naming(names) if any(n.startswith(VACE_MARKS) for n in names) else None

    def owns(self, config_class: str | None, names) -> bool:
        names = list(names)
        if config_class == "WanModel":  # a release naming Wan's class: its VACE blocks tell it
            return any(n.startswith(VACE_MARKS) for n in names)
        return super().owns(config_class, names)

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        found = []
        transformer = open_("transformer")
        if transformer is not None and self._is_diffusers(transformer):
            why = f"Wan VACE, diffusers layout ({self.diffusers_class} in transformer/)"
            found.append(self.layout(why, "wan-vace-diffusers"))
        root = open_(".")
        if root is not None:
            cls = (root.config or {}).get("_class_name")
            if self.naming(root.tensors) == "native":
                found.append(self.layout("Wan2.1 VACE, original names, one model at the root", "wan-vace"))
            elif cls == self.diffusers_class:
                why = f"Wan VACE, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, "wan-vace-diffusers"))
        return found

    # --- running it ----------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """Wan's (`Wan.diffusers_config`), and the VACE blocks' places (the config's ``vace_layers``, else
        ComfyUI's spacing) and the control channels, read off ``vace_patch_embedding``."""
        base = WAN.diffusers_config(config, tensors, where)
        blocks = 0
        while f"vace_blocks.{blocks}.after_proj.weight" in tensors:
            blocks += 1
        patch = tensors.get("vace_patch_embedding.weight")
        if patch is None or blocks == 0:
            raise InputError(
                f"{where}: no vace_patch_embedding.weight or vace_blocks.0.after_proj.weight: not a Wan VACE model"
            )
        layers = config.get("vace_layers") or comfyui_vace_layers(base["num_layers"], blocks)
        if len(layers) != blocks:
            raise InputError(
                f"{where / 'config.json'}: vace_layers {layers} names {len(layers)} blocks; the model has {blocks}"
            )
        return {
            **base,
            "_class_name": self.diffusers_class,
            "vace_layers": list(layers),
            "vace_in_channels": patch.shape[1],
        }

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-video"

    # --- examples ------------------------------------------------------------------------------------

    def _shape(self, preset: str, layout: str) -> VaceShape:
        if preset not in self.presets or layout not in _LAYOUTS:
            raise InputError(
                f"Wan VACE examples: preset {preset!r}, layout {layout!r}: presets {', '.join(self.presets)}, "
                f"layouts {', '.join(_LAYOUTS)}"
            )
        return self.presets[preset]

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """``vace``: the release's root (original names, ``VaceWanModel`` config); ``diffusers``: ``transformer/``
        with the names and shapes diffusers' own class has (built on meta)."""
        shape = self._shape(preset, layout)
        if layout == "vace":
            return [ExampleModel(".", vace_tensors(shape), vace_config(shape))]
        return [diffusers_example(self, vace_tensors(shape), vace_config(shape))]

    def example_files(self) -> dict[str, str]:
        return WAN.example_files()

    def example_lora(self, preset: str, layout: str, rank: int) -> list[tuple[str, tuple[int, ...], str]]:
        """Every Linear of the main blocks, as Wan LoRAs are written (they leave the VACE blocks alone)."""
        self._shape(preset, "vace")
        return WAN.example_lora(preset, "t2v", rank)  # its presets' Wan shapes are Wan's own


def diffusers_example(
    family: Family, native: list[tuple[str, tuple[int, ...]]], config: dict
) -> ExampleModel:
    """A diffusers ``transformer/`` of `family`'s class for an original model (`native` tensors, `config`): the
    class built on meta from the config the family derives, its state dict's names and shapes."""
    import torch

    from ..read.checkpoint import TensorInfo

    try:
        import diffusers
    except ImportError:
        raise InputError(
            f"{family.title} diffusers examples are built from diffusers' own class: pip install "
            "'dit-quantize[diffusers]'"
        ) from None
    infos = {n: TensorInfo(n, "BF16", shape, Path("example"), 0, 0) for n, shape in native}
    built = family.diffusers_config(config, infos, Path("example"))
    with torch.device("meta"):
        model = getattr(diffusers, family.diffusers_class).from_config(built)
    tensors = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    return ExampleModel("transformer", tensors, {**built, **_extra(model.config, built)})


def _extra(config, built: dict) -> dict:
    """What diffusers' config adds to the one we built (its defaults), so that config.json is the class's own."""
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in dict(config).items()
        if not k.startswith("_") and k not in built
    }


WAN_VACE = WanVACE()
