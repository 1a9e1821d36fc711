"""CLIP vision model's example checkpoints: a pipeline's ``image_encoder/`` (transformers' `CLIPVisionModel` folder,
as diffusers' Wan 2.1 I2V pipelines hold OpenCLIP ViT-H/14's) and Comfy-Org's single file (the same names, the
projection of CLIP's joint space beside, no config.json).
"""

from __future__ import annotations

from ..clip_vision import CLASS, CLIP_VISION
from .base import ExampleModel, Examples
from .clip_text import CLIPShape, clip_layers, clip_models

__all__ = ["CLIP_VISION_EXAMPLES", "clip_vision_tensors", "clip_vision_config"]

#: Comfy-Org's file name for Wan's image encoder (split_files/clip_vision/clip_vision_h.safetensors)
SINGLE_FILE_STEM = "clip_vision_h"


def clip_vision_tensors(s: CLIPShape, projection: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `CLIPVisionModel`'s state dict (with ComfyUI's ``visual_projection`` where
    `projection`)."""
    patches = (s.image // s.patch) ** 2
    t = [
        ("vision_model.embeddings.class_embedding", (s.hidden,)),
        ("vision_model.embeddings.patch_embedding.weight", (s.hidden, s.channels, s.patch, s.patch)),
        ("vision_model.embeddings.position_embedding.weight", (patches + 1, s.hidden)),
        ("vision_model.pre_layrnorm.weight", (s.hidden,)),
        ("vision_model.pre_layrnorm.bias", (s.hidden,)),
        *clip_layers("vision_model.encoder.layers", s),
        ("vision_model.post_layernorm.weight", (s.hidden,)),
        ("vision_model.post_layernorm.bias", (s.hidden,)),
    ]
    return t + [("visual_projection.weight", (s.projection, s.hidden))] if projection else t


def clip_vision_config(s: CLIPShape) -> dict:
    """config.json as transformers writes a `CLIPVisionModel`'s (diffusers' Wan 2.1 I2V image_encoder's fields,
    this shape's sizes)."""
    return {
        "architectures": [CLASS],
        "model_type": "clip_vision_model",
        "hidden_size": s.hidden,
        "intermediate_size": s.inner,
        "projection_dim": s.projection,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_channels": s.channels,
        "image_size": s.image,
        "patch_size": s.patch,
        "hidden_act": s.act,
        "layer_norm_eps": 1e-5,
        "dtype": "bfloat16",
    }


class CLIPVisionExamples(Examples):
    family = CLIP_VISION
    presets = {
        "tiny": CLIPShape(hidden=128, inner=512, heads=2, layers=2, projection=64, image=28, patch=14),
        # OpenCLIP ViT-H/14 (laion2B; Wan 2.1 I2V's and Animate's image_encoder): 0.63B parameters
        "vit-h": CLIPShape(hidden=1280, inner=5120, heads=16, layers=32, projection=1024, act="gelu"),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        s = self.shape(preset, layout)
        return clip_models(
            s, layout, "image_encoder", clip_vision_tensors, clip_vision_config(s), SINGLE_FILE_STEM
        )


CLIP_VISION_EXAMPLES = CLIPVisionExamples()
