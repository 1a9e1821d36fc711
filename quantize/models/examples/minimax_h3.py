"""MiniMax-H3's example checkpoints: the release's one file at the root (original names, no config.json) and
diffusers' ``transformer/``. Only names and shapes: `quantize example` writes them one tensor at a time, so the 33B
one never is in memory."""

from __future__ import annotations

from dataclasses import dataclass

from ..minimax_h3 import MINIMAX_H3, PATCH
from .base import ExampleModel, Examples, diffusers_example, linear

__all__ = ["MINIMAX_H3_EXAMPLES", "MiniMaxH3Shape", "minimax_h3_tensors", "RELEASE_FILE_STEM"]


@dataclass(frozen=True)
class MiniMaxH3Shape:
    """The dimensions of an example MiniMax-H3 DiT (`MiniMaxH3Transformer3DModel`'s config names). The defaults are
    the release's widths that its VAEs and text encoder fix (see the module's docstring)."""

    hidden_size: int
    num_attention_heads: int
    attention_head_dim: int
    ffn_dim: int
    num_layers: int
    num_refiner_layers: int
    time_embed_hidden_dim: int
    time_embed_dim: int
    rope_freq_dim: int
    in_channels: int = 24
    audio_in_channels: int = 32
    text_dim: int = 5120
    freq_dim: int = 256

    def config(self) -> dict:
        """`MiniMaxH3Transformer3DModel`'s config.json for this shape (the rest: the class's defaults)."""
        return {
            "_class_name": MINIMAX_H3.diffusers_class,
            "num_attention_heads": self.num_attention_heads,
            "attention_head_dim": self.attention_head_dim,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_refiner_layers": self.num_refiner_layers,
            "ffn_dim": self.ffn_dim,
            "in_channels": self.in_channels,
            "audio_in_channels": self.audio_in_channels,
            "patch_size": list(PATCH),
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "time_embed_hidden_dim": self.time_embed_hidden_dim,
            "time_embed_dim": self.time_embed_dim,
            "rope_freq_dim": self.rope_freq_dim,
        }


def _block(prefix: str, s: MiniMaxH3Shape, adaln: bool) -> list[tuple[str, tuple[int, ...]]]:
    d, inner = s.hidden_size, s.num_attention_heads * s.attention_head_dim
    t = [(f"{prefix}.norm1.weight", (d,)), (f"{prefix}.norm2.weight", (d,))]
    t += linear(f"{prefix}.attn.qkv_proj", 3 * inner, d, bias=False)
    t += [(f"{prefix}.attn.q_norm.weight", (s.attention_head_dim,))]
    t += [(f"{prefix}.attn.k_norm.weight", (s.attention_head_dim,))]
    t += linear(f"{prefix}.attn.out_proj", d, inner, bias=False)
    t += linear(f"{prefix}.mlp.fc1", 2 * s.ffn_dim, d, bias=False)
    t += linear(f"{prefix}.mlp.fc2", d, s.ffn_dim, bias=False)
    if adaln:  # six modulation vectors for each of the three modalities
        t += linear(f"{prefix}.adaln_proj.linear", 6 * 3 * d, s.time_embed_dim)
    return t


def minimax_h3_tensors(s: MiniMaxH3Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the release's file (``MiniMaxH3Model`` of ComfyUI's ``comfy/ldm/minimax/model.py``, its
    full time embedder), in module order."""
    d, video = s.hidden_size, s.in_channels * PATCH[0] * PATCH[1] * PATCH[2]
    t = linear("video_patch_proj", d, video) + linear("audio_patch_proj", d, s.audio_in_channels)
    t += linear("condition_proj", d, s.text_dim)
    t += linear("time_embedder.proj_in", s.time_embed_hidden_dim, s.freq_dim)
    t += linear("time_embedder.proj_out", s.time_embed_dim, s.time_embed_hidden_dim)
    t += [("rope.inv_freq", (s.rope_freq_dim,))]
    for i in range(s.num_refiner_layers):
        t += _block(f"token_refiner.blocks.{i}", s, adaln=False)
    t += [("token_refiner.final_norm.weight", (d,))]
    for i in range(s.num_layers):
        t += _block(f"blocks.{i}", s, adaln=True)
    t += [("final_layer.norm.weight", (d,))] + linear(
        "final_layer.adaln_proj.linear", 2 * d, s.time_embed_dim
    )
    return (
        t
        + linear("final_layer.video_out", video, d)
        + linear("final_layer.audio_out", s.audio_in_channels, d)
    )


#: example layouts: ``original`` the release's one file; ``diffusers`` diffusers' ``transformer/``
#: what the example's one file is called (the bf16 single file's name, so that it reads as released)
RELEASE_FILE_STEM = "minimax_h3_bf16"


class MiniMaxH3Examples(Examples):
    family = MINIMAX_H3
    presets = {
        # heads narrower than the hidden size (3 x 32 = 96 < 128), as the release's (56 x 128 = 7168 > 5376) differ
        "tiny": MiniMaxH3Shape(
            hidden_size=128,
            num_attention_heads=3,
            attention_head_dim=32,
            ffn_dim=256,
            num_layers=2,
            num_refiner_layers=1,
            time_embed_hidden_dim=128,
            time_embed_dim=64,
            rope_freq_dim=4,
        ),
        # every Linear of the blocks a multiple of 128 wide
        "small": MiniMaxH3Shape(
            hidden_size=256,
            num_attention_heads=6,
            attention_head_dim=64,
            ffn_dim=768,
            num_layers=4,
            num_refiner_layers=2,
            time_embed_hidden_dim=256,
            time_embed_dim=128,
            rope_freq_dim=8,
        ),
        # MiniMax-H3 33B (MiniMaxH3Transformer3DModel's defaults, ComfyUI's MiniMaxH3Model's): for benchmarks
        "33b": MiniMaxH3Shape(
            hidden_size=5376,
            num_attention_heads=56,
            attention_head_dim=128,
            ffn_dim=14336,
            num_layers=50,
            num_refiner_layers=2,
            time_embed_hidden_dim=5376,
            time_embed_dim=2688,
            rope_freq_dim=16,
        ),
    }
    layouts = ("original", "diffusers")
    # the smallest whose every Linear each bundled recipe takes (nf4 needs inputs a multiple of 64 wide: tiny's
    # attention output is 96)
    default_preset = "small"

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``original``: the release's one file at the root (original names, no config.json); ``diffusers``:
        ``transformer/`` with the names and shapes diffusers' own class has (built on meta)."""
        native = minimax_h3_tensors(self.shape(preset, layout))
        if layout == "original":
            return [ExampleModel(".", native, None, RELEASE_FILE_STEM)]
        return [diffusers_example(self.family, native, {})]


MINIMAX_H3_EXAMPLES = MiniMaxH3Examples()
