"""Kandinsky 5's example checkpoints: diffusers' ``transformer/`` (its own class built on meta) and the original
release's ``model/`` (one file of the original names, no config.json)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kandinsky5 import KANDINSKY5, ORIGINAL_FOLDER, comfyui_axes_dims
from .base import ExampleModel, Examples, linear

__all__ = ["KANDINSKY5_EXAMPLES", "Kandinsky5Shape", "kandinsky5_tensors", "ORIGINAL_FILE_STEM"]


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


def _attention(prefix: str, d: int, head: int) -> list[tuple[str, tuple[int, ...]]]:
    t = (
        linear(f"{prefix}.to_query", d, d)
        + linear(f"{prefix}.to_key", d, d)
        + linear(f"{prefix}.to_value", d, d)
    )
    t += [(f"{prefix}.query_norm.weight", (head,)), (f"{prefix}.key_norm.weight", (head,))]
    return t + linear(f"{prefix}.out_layer", d, d)


def kandinsky5_tensors(s: Kandinsky5Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original Kandinsky 5 DiT (``kandinsky/models/dit.py``, as ComfyUI's
    ``comfy/ldm/kandinsky5/model.py`` builds it), in module order."""
    d, t, ff, head = s.model_dim, s.time_dim, s.ff_dim, sum(s.axes)
    patch = math.prod(s.patch_size)
    visual = (2 * s.in_visual_dim + 1 if s.visual_cond else s.in_visual_dim) * patch
    out = linear("time_embeddings.in_layer", t, d) + linear("time_embeddings.out_layer", t, t)
    out += linear("text_embeddings.in_layer", d, s.in_text_dim) + [
        ("text_embeddings.norm.weight", (d,)),
        ("text_embeddings.norm.bias", (d,)),
    ]
    out += linear("pooled_text_embeddings.in_layer", t, s.in_text_dim2) + [
        ("pooled_text_embeddings.norm.weight", (t,)),
        ("pooled_text_embeddings.norm.bias", (t,)),
    ]
    out += linear("visual_embeddings.in_layer", d, visual)

    def feed_forward(b: str) -> list[tuple[str, tuple[int, ...]]]:
        return linear(f"{b}.feed_forward.in_layer", ff, d, False) + linear(
            f"{b}.feed_forward.out_layer", d, ff, False
        )

    for i in range(s.num_text_blocks):
        b = f"text_transformer_blocks.{i}"
        out += linear(f"{b}.text_modulation.out_layer", 6 * d, t)
        out += _attention(f"{b}.self_attention", d, head) + feed_forward(b)
    for i in range(s.num_visual_blocks):
        b = f"visual_transformer_blocks.{i}"
        out += linear(f"{b}.visual_modulation.out_layer", 9 * d, t)
        out += _attention(f"{b}.self_attention", d, head) + _attention(f"{b}.cross_attention", d, head)
        out += feed_forward(b)
    out += linear("out_layer.modulation.out_layer", 2 * d, t)
    return out + linear("out_layer.out_layer", patch * s.out_visual_dim, d)


#: example layouts: ``t2v`` diffusers' ``transformer/``; ``original`` the release's ``model/<one file>``
#: what the example's one file is called in ``model/`` (the Lite T2V release's name, so that it reads as released)
ORIGINAL_FILE_STEM = "kandinsky5lite_t2v_sft_5s"


class Kandinsky5Examples(Examples):
    family = KANDINSKY5
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
    layouts = ("t2v", "original")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``t2v``: a diffusers ``transformer/`` with the names and shapes diffusers' own class has (built on meta);
        ``original``: the release's ``model/`` holding one file of the original names, no config.json."""
        shape: Kandinsky5Shape = self.shape(preset, layout)
        if layout == "original":
            return [ExampleModel(ORIGINAL_FOLDER, kandinsky5_tensors(shape), None, ORIGINAL_FILE_STEM)]
        import torch

        from .base import _diffusers

        config = shape.config()
        with torch.device("meta"):
            model = getattr(_diffusers(self.family), self.family.diffusers_class).from_config(config)
        tensors = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
        return [ExampleModel("transformer", tensors, config)]


KANDINSKY5_EXAMPLES = Kandinsky5Examples()
