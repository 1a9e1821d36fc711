"""SkyReels-V2's example checkpoints: Skywork's Diffusion-Forcing release (fps layers), its T2V release (none) and
a DF model in diffusers' ``transformer/``."""

from __future__ import annotations

from dataclasses import dataclass

from ..skyreels_v2 import SKYREELS_V2
from .base import ExampleModel, Examples, LoraTensor, diffusers_example, linear
from .wan import WAN_EXAMPLES, WanShape, wan_config, wan_lora, wan_tensors

__all__ = ["SKYREELS_EXAMPLES", "SkyReelsShape"]


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
        t += linear("fps_projection.0", d, d) + linear("fps_projection.2", 6 * d, d)
    return t


def skyreels_config(s: SkyReelsShape) -> dict:
    """config.json as Skywork's releases write it (Wan's, with its own ``inject_sample_info``)."""
    return {**wan_config(s.wan), "inject_sample_info": s.inject_sample_info}


class SkyReelsExamples(Examples):
    family = SKYREELS_V2
    presets = {name: SkyReelsShape(shape) for name, shape in WAN_EXAMPLES.presets.items() if name != "5b"}
    layouts = ("df", "t2v", "diffusers")
    default_preset = "small"

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``df``: Skywork's Diffusion-Forcing release (fps layers); ``t2v``: its T2V release (none);
        ``diffusers``: a DF model as diffusers' class has it, in ``transformer/``."""
        shape = self.shape(preset, layout)
        if layout == "t2v":
            shape = SkyReelsShape(shape.wan, inject_sample_info=False)
        tensors, config = skyreels_tensors(shape), skyreels_config(shape)
        if layout == "diffusers":
            return [diffusers_example(self.family, tensors, config)]
        return [ExampleModel(".", tensors, config)]

    def files(self, layout: str) -> dict[str, str | bytes]:
        return WAN_EXAMPLES.files(layout)

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        return wan_lora(self.shape(preset, layout).wan, rank)


SKYREELS_EXAMPLES = SkyReelsExamples()
