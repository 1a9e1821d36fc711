"""Kandinsky 6's example checkpoints: diffusers' ``transformer/`` of `Kandinsky6Transformer3DModel` (its own class
built on meta), with the switches the released checkpoints set."""

from __future__ import annotations

from dataclasses import dataclass

from ..kandinsky6 import KANDINSKY6
from .base import ExampleModel, Examples

__all__ = ["KANDINSKY6_EXAMPLES", "Kandinsky6Shape"]


@dataclass(frozen=True)
class Kandinsky6Shape:
    """The dimensions of an example Kandinsky 6 DiT: the video branch's, the audio branch's (`*_a`), and the class's
    defaults for the rest (Qwen2.5-VL's 3584 and CLIP's 768 text widths, 16 video and 20 audio latent channels,
    the image latent and its mask concatenated to the noise). The audio branch's head is the video's (`axes_dims`):
    the cross-modal attentions rotate one by the other's RoPE (``ca_rope``)."""

    model_dim: int
    ff_dim: int
    time_dim: int
    num_text_blocks: int
    num_visual_blocks: int
    model_dim_a: int
    ff_dim_a: int
    time_dim_a: int
    axes_dims: tuple[int, int, int] = (16, 24, 24)
    #: the frame types of image conditioning (a generated frame, the reference image's)
    visual_token_type_num_embeddings: int = 2

    def config(self) -> dict:
        """`Kandinsky6Transformer3DModel`'s config.json for this shape, with the four switches every released
        checkpoint sets (the class's docstring: text_token_padding, ca_rope, cross_gates, fix_modulation)."""
        return {
            "_class_name": KANDINSKY6.diffusers_class,
            "model_dim": self.model_dim,
            "ff_dim": self.ff_dim,
            "time_dim": self.time_dim,
            "num_text_blocks": self.num_text_blocks,
            "num_visual_blocks": self.num_visual_blocks,
            "axes_dims": list(self.axes_dims),
            "model_dim_a": self.model_dim_a,
            "ff_dim_a": self.ff_dim_a,
            "time_dim_a": self.time_dim_a,
            "text_token_padding": True,
            "ca_rope": True,
            "cross_gates": True,
            "fix_modulation": True,
            "visual_token_type_num_embeddings": self.visual_token_type_num_embeddings,
        }


class Kandinsky6Examples(Examples):
    family = KANDINSKY6
    presets = {
        # a head of 64; the audio branch half as wide as the video's
        "tiny": Kandinsky6Shape(
            model_dim=128,
            ff_dim=256,
            time_dim=64,
            num_text_blocks=1,
            num_visual_blocks=2,
            model_dim_a=64,
            ff_dim_a=128,
            time_dim_a=32,
        ),  # fmt: skip
        # every Linear of the blocks a multiple of 256 wide
        "small": Kandinsky6Shape(
            model_dim=256,
            ff_dim=1024,
            time_dim=128,
            num_text_blocks=1,
            num_visual_blocks=4,
            model_dim_a=256,
            ff_dim_a=512,
            time_dim_a=128,
        ),  # fmt: skip
    }
    layouts = ("ti2va",)

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``ti2va``: a diffusers ``transformer/`` with the names and shapes diffusers' own class has (built on
        meta), and the config.json it saves (its defaults written out)."""
        shape: Kandinsky6Shape = self.shape(preset, layout)
        import torch

        from .base import _diffusers, _extra

        config = shape.config()
        with torch.device("meta"):
            model = getattr(_diffusers(self.family), self.family.diffusers_class).from_config(config)
        tensors = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
        return [ExampleModel("transformer", tensors, {**config, **_extra(model.config, config)})]


KANDINSKY6_EXAMPLES = Kandinsky6Examples()
