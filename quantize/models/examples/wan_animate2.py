"""Wan-Animate-2's example checkpoints: the release (Wan-AI's ``wan_animate_2_bf16.safetensors``: Wan2.1's I2V, each
block in its in-context wrapper, no config.json) and diffusers' ``transformer/``."""

from __future__ import annotations

import re

from ..wan_animate2 import RELEASE_FILE, RELEASE_NAMES, WAN_ANIMATE2, WRAPPER
from .base import ExampleModel, Examples, LoraTensor, diffusers_example
from .wan import WanShape, wan_lora, wan_tensors

__all__ = ["ANIMATE2_EXAMPLES", "release_tensors"]

_BLOCK = re.compile(r"(blocks\.\d+\.)")


def release_tensors(s: WanShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the release (``WanAnimate2Transformer``): Wan's I2V in module order, each block's
    tensors inside its wrapper (``blocks.N.block.*``)."""
    return [(_BLOCK.sub(rf"\g<1>{WRAPPER}", n, count=1), shape) for n, shape in wan_tensors(s)]


def _preset(dim: int, ffn_dim: int, num_layers: int) -> WanShape:
    """An I2V Wan (in_dim 36, image_dim 1280, text_dim 4096, freq_dim 256) with 128-wide heads, as ComfyUI
    builds it."""
    return WanShape(
        dim=dim, ffn_dim=ffn_dim, num_layers=num_layers, num_heads=dim // 128, in_dim=36, image_dim=1280
    )


class Animate2Examples(Examples):
    family = WAN_ANIMATE2
    presets = {
        "tiny": _preset(dim=128, ffn_dim=256, num_layers=2),
        # every Linear width a multiple of 256 (GGML's K-quants)
        "small": _preset(dim=256, ffn_dim=768, num_layers=3),
        # Wan2.2-Animate-2-14B (Wan2.1 I2V 14B's widths)
        "14b": _preset(dim=5120, ffn_dim=13824, num_layers=40),
    }
    layouts = ("release", "diffusers")
    default_preset = "small"

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``release``: the one file at the root, no config.json; ``diffusers``: ``transformer/`` with the names
        and shapes diffusers' own class has (built on meta from the config read off the release)."""
        tensors = release_tensors(self.shape(preset, layout))
        if layout == "release":
            return [
                ExampleModel(
                    ".", tensors, None, stem=RELEASE_FILE.removesuffix(".safetensors"), one_file=True
                )
            ]
        own = [(RELEASE_NAMES.diffusers(n), shape) for n, shape in tensors]
        return [diffusers_example(self.family, own, {})]

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        """Every Linear of the blocks, in Wan's names, as Wan2.1 I2V LoRAs (which Animate-2 takes) are written."""
        return wan_lora(self.shape(preset, layout), rank)


ANIMATE2_EXAMPLES = Animate2Examples()
