"""Wan Animate's example checkpoints: the release's root (``WanAnimateModel``: Wan's I2V, the pose patch embedding,
the motion encoder, the face adapter and encoder) and diffusers' ``transformer/``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..wan_animate import (
    _CONVS,
    FACE_EVERY,
    FACE_HEADS,
    FACE_HIDDEN,
    MOTION_CHANNEL_SIZES,
    MOTION_DIM,
    MOTION_STYLE_DIM,
    WAN_ANIMATE,
)
from .base import ExampleModel, Examples, LoraTensor, diffusers_example, linear
from .wan import WAN_EXAMPLES, WanShape, wan_config, wan_lora, wan_tensors

__all__ = ["ANIMATE_EXAMPLES", "AnimateShape"]


@dataclass(frozen=True)
class AnimateShape:
    """An example Animate: its Wan (an I2V: in_dim 36 = 16 noise + 16 reference latents + 4 mask, image_dim 1280,
    text_dim 4096, freq_dim 256, 128-wide heads), with `num_layers` a multiple of 5 (a face adapter block every 5).
    The face encoder has ComfyUI's fixed sizes whatever the preset, and so has the motion encoder but for the
    ``test`` preset's: `motion_channels` at each feature-map size (its 512 x 512 input and 7 blocks as ever)."""

    wan: WanShape
    motion_channels: Mapping[str, int] = field(default_factory=lambda: dict(MOTION_CHANNEL_SIZES))

    @property
    def face_blocks(self) -> int:
        return self.wan.num_layers // FACE_EVERY


def _motion_encoder_tensors(channels: Mapping[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    """The release's motion encoder (``wan/modules/animate/motion_encoder.py``): LIA's EncoderApp, fc and direction;
    `channels` at each feature-map size, from the 512 x 512 input down to 4 x 4."""
    sizes = [512 >> i for i in range(len(channels))]
    first = channels[str(sizes[0])]
    t: list[tuple[str, tuple[int, ...]]] = [
        (f"{_CONVS}.0.0.weight", (first, 3, 1, 1)),
        (f"{_CONVS}.0.1.bias", (1, first, 1, 1)),
    ]
    for i in range(1, len(sizes)):
        cin, cout = channels[str(sizes[i - 1])], channels[str(sizes[i])]
        c = f"{_CONVS}.{i}"
        t += [
            (f"{c}.conv1.0.weight", (cin, cin, 3, 3)),
            (f"{c}.conv1.1.bias", (1, cin, 1, 1)),
            (f"{c}.conv2.0.kernel", (4, 4)),
            (f"{c}.conv2.1.weight", (cout, cin, 3, 3)),
            (f"{c}.conv2.2.bias", (1, cout, 1, 1)),
            (f"{c}.skip.0.kernel", (4, 4)),
            (f"{c}.skip.1.weight", (cout, cin, 1, 1)),
        ]
    last = channels[str(sizes[-1])]
    t += [(f"{_CONVS}.{len(sizes)}.weight", (MOTION_STYLE_DIM, last, 4, 4))]
    for j in range(4):
        t += linear(f"motion_encoder.enc.fc.{j}", MOTION_STYLE_DIM, MOTION_STYLE_DIM)
    t += linear("motion_encoder.enc.fc.4", MOTION_DIM, MOTION_STYLE_DIM)
    return t + [("motion_encoder.dec.direction.weight", (MOTION_STYLE_DIM, MOTION_DIM))]


def animate_tensors(s: AnimateShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original ``WanAnimateModel`` (``wan/modules/animate/model_animate.py``), in its
    module order: Wan's I2V, the pose patch embedding, the motion encoder, the face adapter, the face encoder."""
    d, heads = s.wan.dim, s.wan.num_heads
    t = wan_tensors(s.wan)
    t[2:2] = [("pose_patch_embedding.weight", (d, 16, 1, 2, 2)), ("pose_patch_embedding.bias", (d,))]
    t += _motion_encoder_tensors(s.motion_channels)
    for i in range(s.face_blocks):
        b = f"face_adapter.fuser_blocks.{i}"
        t += (
            linear(f"{b}.linear1_kv", 2 * d, d)
            + linear(f"{b}.linear1_q", d, d)
            + linear(f"{b}.linear2", d, d)
        )
        t += [(f"{b}.q_norm.weight", (d // heads,)), (f"{b}.k_norm.weight", (d // heads,))]
    f = "face_encoder"
    t += [(f"{f}.conv1_local.conv.weight", (FACE_HEADS * FACE_HIDDEN, MOTION_STYLE_DIM, 3))]
    t += [(f"{f}.conv1_local.conv.bias", (FACE_HEADS * FACE_HIDDEN,))]
    for c in ("conv2", "conv3"):
        t += [(f"{f}.{c}.conv.weight", (FACE_HIDDEN, FACE_HIDDEN, 3)), (f"{f}.{c}.conv.bias", (FACE_HIDDEN,))]
    t += linear(f"{f}.out_proj", d, FACE_HIDDEN) + [(f"{f}.padding_tokens", (1, 1, 1, d))]
    return t


def animate_config(s: AnimateShape) -> dict:
    """config.json as the release writes it (``WanAnimateModel``'s registered arguments)."""
    base = wan_config(s.wan)
    return {
        "_class_name": "WanAnimateModel",
        "_diffusers_version": "0.35.1",
        "patch_size": [1, 2, 2],
        **{k: v for k, v in base.items() if not k.startswith("_") and k != "model_type"},
        "text_dim": s.wan.text_dim,
        "window_size": [-1, -1],
        "qk_norm": True,
        "cross_attn_norm": True,
        "motion_encoder_dim": MOTION_STYLE_DIM,
        "use_context_parallel": False,
        "use_img_emb": True,
    }


def _preset(dim: int, ffn_dim: int, num_layers: int, num_heads: int) -> AnimateShape:
    return AnimateShape(
        WanShape(
            dim=dim, ffn_dim=ffn_dim, num_layers=num_layers, num_heads=num_heads, in_dim=36, image_dim=1280
        )
    )


class AnimateExamples(Examples):
    family = WAN_ANIMATE
    presets = {
        "tiny": _preset(dim=128, ffn_dim=256, num_layers=5, num_heads=1),
        # tiny's DiT with a motion encoder 8 channels wide (ComfyUI builds it at its fixed widths and cannot load
        # this one): what a test runs forward passes of, at 1/40 of the full encoder's 19 GMAC a face frame
        "test": replace(
            _preset(dim=128, ffn_dim=256, num_layers=5, num_heads=1),
            motion_channels=dict.fromkeys(MOTION_CHANNEL_SIZES, 8),
        ),
        # every Linear width a multiple of 256 (GGML's K-quants)
        "small": _preset(dim=256, ffn_dim=768, num_layers=5, num_heads=2),
        # Wan2.2-Animate-14B
        "14b": _preset(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40),
    }
    layouts = ("animate", "diffusers")
    default_preset = "small"

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``animate``: the release's root (original names, ``WanAnimateModel`` config); ``diffusers``:
        ``transformer/`` with the names and shapes diffusers' own class has (built on meta)."""
        shape = self.shape(preset, layout)
        if layout == "animate":
            return [ExampleModel(".", animate_tensors(shape), animate_config(shape))]
        return [diffusers_example(self.family, animate_tensors(shape), animate_config(shape))]

    def files(self, layout: str) -> dict[str, str | bytes]:
        return WAN_EXAMPLES.files(layout)

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        """Every Linear of the main blocks, as Wan LoRAs are written (`wan_lora`); an I2V's, so with k_img and
        v_img."""
        return wan_lora(self.shape(preset, layout).wan, rank)


ANIMATE_EXAMPLES = AnimateExamples()
