"""SkyReels-V2 (Skywork's T2V, I2V and Diffusion-Forcing models on Wan2.1; diffusers' `SkyReelsV2Transformer3DModel`).

Layouts (`SkyReelsV2.layouts`): ``skyreels-v2`` (Skywork's release: shards at the root, Wan's original names, its
own config.json, which names Wan's ``WanModel`` class and adds ``inject_sample_info``) and ``skyreels-v2-diffusers``
(a diffusers ``transformer/``, or that folder itself).

Names: Wan's (`wan.NAMES`, shared) plus, in the models with ``inject_sample_info`` (the DF models), the fps
conditioning: ``fps_embedding`` (an Embedding of 2 rows) and ``fps_projection.0`` / ``.2`` (Linear, SiLU, Linear to
6 * dim), diffusers' ``fps_projection.net.0.proj`` / ``.net.2`` (diffusers' ``scripts/convert_skyreelsv2_to_diffusers.py``;
its single-file loader reuses ``convert_wan_transformer_to_diffusers``, which maps the rest). ComfyUI runs SkyReels-V2
as Wan (its detection has no SkyReels rule, and no fps layers): the fps layers of a DF model are carried, not run.

A model is SkyReels-V2's by its config (``inject_sample_info``, or diffusers' class) or, without one, by its fps
layers; a release without fps layers and without a config is a Wan, and is detected as one.

>>> SKYREELS_V2.native_name("fps_projection.net.2.weight")
'fps_projection.2.weight'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .base import BlockNames, ExampleModel, Family, ModelInputs, Renamer, SourceLayout, _renamed
from .wan import NAMES as WAN_NAMES
from .wan import ROOT_MODULES, WAN, WanShape, _linear, wan_config, wan_naming, wan_tensors
from .wan_vace import diffusers_example

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["SKYREELS_V2", "SkyReelsV2", "NAMES", "FPS_MARKS"]

#: what only SkyReels-V2's DF models have, in either naming
FPS_MARKS = ("fps_embedding.", "fps_projection.")

NAMES = BlockNames(
    root_modules={
        **ROOT_MODULES,
        "fps_embedding": "fps_embedding",
        "fps_projection.net.0.proj": "fps_projection.0",
        "fps_projection.net.2": "fps_projection.2",
    },
    root_tensors=dict(WAN_NAMES.root_tensors),
    blocks=WAN_NAMES.blocks,
)


# --- a forward pass's inputs -------------------------------------------------------------------------


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Wan's inputs; for a DF model (``inject_sample_info``) one timestep per latent frame, as diffusion forcing
    denoises each frame at its own noise level."""
    import torch

    inputs = WAN.inputs.random(config, g)
    if config.get("inject_sample_info"):
        frames = inputs["hidden_states"].shape[2] // config.get("patch_size", (1, 2, 2))[0]
        inputs["timestep"] = torch.randint(0, 1000, (1, frames), generator=g)
    return inputs


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    forcing = t["timestep"].dim() == 2
    extra = {"fps": [0]} if config.get("inject_sample_info") else {}  # the pipeline's fps 24 -> row 0
    return dict(t, enable_diffusion_forcing=forcing, **extra, return_dict=False)


_INPUTS = ModelInputs(
    keys=WAN.inputs.keys,
    shapes=WAN.inputs.shapes,
    random=_random,
    call=_call,
    accepts=WAN.inputs.accepts,
)


# --- examples --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkyReelsShape:
    wan: WanShape
    inject_sample_info: bool = True


def skyreels_tensors(s: SkyReelsShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of Skywork's ``WanModel``: Wan's, and with ``inject_sample_info`` the fps layers."""
    d = s.wan.dim
    t = wan_tensors(s.wan)
    if s.inject_sample_info:
        t += [("fps_embedding.weight", (2, d))]
        t += _linear("fps_projection.0", d, d) + _linear("fps_projection.2", 6 * d, d)
    return t


def skyreels_config(s: SkyReelsShape) -> dict:
    """config.json as Skywork's releases write it (Wan's, with its own ``inject_sample_info``)."""
    return {**wan_config(s.wan), "inject_sample_info": s.inject_sample_info}


_LAYOUTS = ("df", "t2v", "diffusers")


class SkyReelsV2(Family):
    name = "skyreels-v2"
    title = "SkyReels-V2"
    diffusers_class = "SkyReelsV2Transformer3DModel"
    #: Skywork's config.json names Wan's class: the model is SkyReels-V2's when it has fps layers (`owns`)
    native_classes = ("WanModel",)
    names = NAMES
    native_marks = WAN.native_marks
    diffusers_marks = WAN.diffusers_marks
    gguf_architecture = "wan"  # ComfyUI-GGUF reads "wan"; ComfyUI runs it as Wan
    modulation_names = WAN.modulation_names
    lora_prefixes = WAN.lora_prefixes
    #: the fps Embedding (2 rows): a lookup table, never a Linear (a recipe that targets it is refused by name)
    plain_weights = ("fps_embedding.",)
    default_recipes = {
        "skyreels-v2": {
            "fp8_channel": "skyreels-v2-fp8",
            "torchao_fp8": "skyreels-v2-torchao-fp8",
            "torchao_int8": "skyreels-v2-torchao-int8",
            "nf4": "skyreels-v2-nf4",
            "comfy_fp8": "skyreels-v2-comfy-fp8",
            "comfy_int8": "skyreels-v2-comfy-int8",
            "comfy_nvfp4": "skyreels-v2-comfy-nvfp4",
            "comfy_mxfp8": "skyreels-v2-comfy-mxfp8",
            "gguf": "skyreels-v2-gguf-q8_0",
        },
        "skyreels-v2-diffusers": {
            "fp8_channel": "skyreels-v2-diffusers-fp8",
            "torchao_fp8": "skyreels-v2-diffusers-torchao-fp8",
            "torchao_int8": "skyreels-v2-diffusers-torchao-int8",
            "nf4": "skyreels-v2-diffusers-nf4",
            "comfy_fp8": "skyreels-v2-diffusers-comfy-fp8",
            "comfy_int8": "skyreels-v2-diffusers-comfy-int8",
            "comfy_nvfp4": "skyreels-v2-diffusers-comfy-nvfp4",
            "comfy_mxfp8": "skyreels-v2-diffusers-comfy-mxfp8",
            "gguf": "skyreels-v2-diffusers-gguf-q8_0",
        },
    }
    presets = {name: SkyReelsShape(shape) for name, shape in WAN.presets.items() if name != "5b"}
    example_layouts = _LAYOUTS
    default_preset = "small"

    # --- recognizing it ------------------------------------------------------------------------------

    def naming(self, names) -> str | None:
        """Wan's namings, of a model with fps layers; None for any other (without them, names alone say Wan)."""
        names = list(names)
        return wan_naming(names) if any(n.startswith(FPS_MARKS) for n in names) else None

    def owns(self, config_class: str | None, names) -> bool:
        names = list(names)
        if config_class == "WanModel":  # Skywork's release names Wan's class: its fps layers tell it
            return any(n.startswith(FPS_MARKS) for n in names)
        return super().owns(config_class, names)

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        found = []
        transformer = open_("transformer")
        if transformer is not None and self._is_diffusers(transformer):
            why = f"SkyReels-V2, diffusers layout ({self.diffusers_class} in transformer/)"
            found.append(self.layout(why, "skyreels-v2-diffusers"))
        root = open_(".")
        if root is not None:
            config = root.config or {}
            if wan_naming(root.tensors) == "native" and (
                "inject_sample_info" in config or self.naming(root.tensors) == "native"
            ):
                why = "SkyReels-V2, Skywork's release (original Wan names, one model at the root)"
                found.append(self.layout(why, "skyreels-v2"))
            elif config.get("_class_name") == self.diffusers_class:
                why = f"SkyReels-V2, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, "skyreels-v2-diffusers"))
        return found

    # --- names ---------------------------------------------------------------------------------------

    def _native_renamer(self, names: Sequence[str], where: str) -> Renamer:
        """`Family._native_renamer`, and a diffusers model of its class without fps layers (a T2V or I2V one):
        its names are Wan's."""
        if self.naming(names) is None and wan_naming(names) == "diffusers":
            lacking = (
                f"has no native {self.title} name (not a {self.diffusers_class} tensor of Skywork's release): "
                f"this format writes native {self.title} names"
            )
            return _renamed(names, self.native_name, where, lacking).__getitem__
        return super()._native_renamer(names, where)

    # --- running it ----------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """Wan's (`Wan.diffusers_config`), and ``inject_sample_info`` (the config's, else whether it has fps layers)."""
        base = WAN.diffusers_config(config, tensors, where)
        inject = bool(config.get("inject_sample_info", "fps_embedding.weight" in tensors))
        return {**base, "_class_name": self.diffusers_class, "inject_sample_info": inject}

    def pipeline_tag(self, config: dict) -> str | None:
        return WAN.pipeline_tag({**config, "_class_name": WAN.diffusers_class}) or "text-to-video"

    # --- examples ------------------------------------------------------------------------------------

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """``df``: Skywork's Diffusion-Forcing release (fps layers); ``t2v``: its T2V release (none);
        ``diffusers``: a DF model as diffusers' class has it, in ``transformer/``."""
        if preset not in self.presets or layout not in _LAYOUTS:
            raise InputError(
                f"SkyReels-V2 examples: preset {preset!r}, layout {layout!r}: presets {', '.join(self.presets)}, "
                f"layouts {', '.join(_LAYOUTS)}"
            )
        shape = self.presets[preset]
        if layout == "t2v":
            shape = SkyReelsShape(shape.wan, inject_sample_info=False)
        tensors, config = skyreels_tensors(shape), skyreels_config(shape)
        if layout == "diffusers":
            return [diffusers_example(self, tensors, config)]
        return [ExampleModel(".", tensors, config)]

    def example_files(self) -> dict[str, str]:
        return WAN.example_files()

    def example_lora(self, preset: str, layout: str, rank: int) -> list[tuple[str, tuple[int, ...], str]]:
        return WAN.example_lora(preset, "t2v", rank)


SKYREELS_V2 = SkyReelsV2()
