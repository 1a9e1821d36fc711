"""Wan VACE's example checkpoints: the release's root (``VaceWanModel``: Wan's tensors, its VACE blocks, the
control patch embedding) and diffusers' ``transformer/``; ComfyUI's VACE block spacing."""

from __future__ import annotations

from dataclasses import dataclass

from ..wan_vace import WAN_VACE, comfyui_vace_layers
from .base import ExampleModel, Examples, LoraTensor, diffusers_example, linear
from .wan import WAN_EXAMPLES, WanShape, wan_block_tensors, wan_config, wan_lora, wan_tensors

__all__ = ["VACE_EXAMPLES", "VaceShape"]

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
            t += linear(f"{b}.before_proj", d, d)
        t += wan_block_tensors(s.wan, b) + linear(f"{b}.after_proj", d, d)
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


class VaceExamples(Examples):
    family = WAN_VACE
    presets = {
        "tiny": VaceShape(WanShape(dim=128, ffn_dim=256, num_layers=2, num_heads=1), vace_blocks=2),
        # every Linear a multiple of 256 wide (GGML's K-quants)
        "small": VaceShape(WanShape(dim=256, ffn_dim=768, num_layers=4, num_heads=2), vace_blocks=2),
        # Wan2.1-VACE-1.3B (vace_layers 0, 2, ..., 28) and -14B (0, 5, ..., 35)
        "1.3b": VaceShape(WanShape(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12), vace_blocks=15),
        "14b": VaceShape(WanShape(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40), vace_blocks=8),
    }
    layouts = ("vace", "diffusers")
    default_preset = "small"

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``vace``: the release's root (original names, ``VaceWanModel`` config); ``diffusers``: ``transformer/``
        with the names and shapes diffusers' own class has (built on meta)."""
        shape = self.shape(preset, layout)
        if layout == "vace":
            return [ExampleModel(".", vace_tensors(shape), vace_config(shape))]
        return [diffusers_example(self.family, vace_tensors(shape), vace_config(shape))]

    def files(self, layout: str) -> dict[str, str | bytes]:
        return WAN_EXAMPLES.files(layout)

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        """Every Linear of the main blocks, as Wan LoRAs are written (they leave the VACE blocks alone)."""
        return wan_lora(self.shape(preset, layout).wan, rank)


VACE_EXAMPLES = VaceExamples()
