"""Qwen-Image's and Qwen-Image 2.1's example checkpoints: diffusers' ``transformer/`` (the class built on meta from
its config) and, for Qwen-Image, Comfy-Org's single file (the same names, one file at the root, no config.json)."""

from __future__ import annotations

from dataclasses import dataclass

from ..qwen_image import COMFYUI_WIDTHS, QWEN_IMAGE, QWEN_IMAGE_21
from .base import ExampleModel, Examples

__all__ = [
    "QWEN_IMAGE_EXAMPLES",
    "QWEN_IMAGE_21_EXAMPLES",
    "QwenImageShape",
    "QwenImage21Shape",
    "RELEASE_FILE_STEM",
]

#: what Comfy-Org calls the single file (split_files/diffusion_models/ of Comfy-Org/Qwen-Image_ComfyUI)
RELEASE_FILE_STEM = "qwen_image_bf16"


@dataclass(frozen=True)
class QwenImageShape:
    """An example Qwen-Image's dimensions: heads of 128 (ComfyUI's rope axes), Qwen2.5-VL's 3584-wide text, 16 latent
    channels in 2 x 2 patches (64 in), as ComfyUI builds it; the width (heads) and blocks vary."""

    num_layers: int
    num_attention_heads: int

    def config(self) -> dict:
        """`QwenImageTransformer2DModel`'s config.json for this shape."""
        w = COMFYUI_WIDTHS
        return {
            "_class_name": QWEN_IMAGE.diffusers_class,
            "patch_size": w["patch_size"],
            "in_channels": w["out_channels"] * w["patch_size"] ** 2,
            "out_channels": w["out_channels"],
            "num_layers": self.num_layers,
            "attention_head_dim": w["attention_head_dim"],
            "num_attention_heads": self.num_attention_heads,
            "joint_attention_dim": w["joint_attention_dim"],
            "guidance_embeds": False,
            "axes_dims_rope": list(w["axes_dims_rope"]),
            "zero_cond_t": False,
            "use_additional_t_cond": False,
            "use_layer3d_rope": False,
        }


@dataclass(frozen=True)
class QwenImage21Shape:
    """An example Qwen-Image 2.1's dimensions: the class's defaults (heads of 128, Qwen3-VL 8B's 4096-wide text, 64
    unpatched latent channels, a SwiGLU 3 x wide) but for the width (heads) and blocks."""

    num_layers: int
    num_attention_heads: int

    def config(self) -> dict:
        """`QwenImage21Transformer2DModel`'s config.json for this shape."""
        return {
            "_class_name": QWEN_IMAGE_21.diffusers_class,
            "patch_size": 1,
            "in_channels": 64,
            "out_channels": 64,
            "num_layers": self.num_layers,
            "attention_head_dim": 128,
            "num_attention_heads": self.num_attention_heads,
            "context_in_dim": 4096,
            "mlp_ratio": 3,
            "axes_dims_rope": [16, 56, 56],
            "eps": 1e-6,
            "causal_condition": True,
        }


def _built(family, config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the family's diffusers class built on meta from `config`, in module order."""
    import torch

    from .base import _diffusers

    with torch.device("meta"):
        model = getattr(_diffusers(family), family.diffusers_class).from_config(config)
    return [(n, tuple(t.shape)) for n, t in model.state_dict().items()]


class QwenImageExamples(Examples):
    family = QWEN_IMAGE
    presets = {
        "tiny": QwenImageShape(num_layers=2, num_attention_heads=1),
        # every Linear of the blocks a multiple of 256 wide
        "small": QwenImageShape(num_layers=3, num_attention_heads=2),
        # the 20B's widths (what ComfyUI builds whatever the file holds) with two blocks (one past the first, which
        # the NVFP4 recipes keep in MXFP8): what ComfyUI loads
        "comfyui": QwenImageShape(num_layers=2, num_attention_heads=24),
        # Qwen-Image 20B (the class's defaults, which ComfyUI builds): for benchmarks
        "20b": QwenImageShape(num_layers=60, num_attention_heads=24),
    }
    layouts = ("diffusers", "release")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``diffusers``: ``transformer/`` with the names and shapes diffusers' own class has; ``release``:
        Comfy-Org's one file of the same tensors at the root, no config.json."""
        config = self.shape(preset, layout).config()
        tensors = _built(self.family, config)
        if layout == "release":
            return [ExampleModel(".", tensors, None, RELEASE_FILE_STEM, one_file=True)]
        return [ExampleModel("transformer", tensors, config)]


class QwenImage21Examples(Examples):
    family = QWEN_IMAGE_21
    presets = {
        "tiny": QwenImage21Shape(num_layers=2, num_attention_heads=1),
        "small": QwenImage21Shape(num_layers=3, num_attention_heads=2),
        # the class's defaults: for benchmarks
        "full": QwenImage21Shape(num_layers=32, num_attention_heads=32),
    }
    layouts = ("diffusers",)

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``transformer/`` with the names and shapes diffusers' own class has (built on meta)."""
        config = self.shape(preset, layout).config()
        return [ExampleModel("transformer", _built(self.family, config), config)]


QWEN_IMAGE_EXAMPLES = QwenImageExamples()
QWEN_IMAGE_21_EXAMPLES = QwenImage21Examples()
