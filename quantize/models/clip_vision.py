"""CLIP's vision tower (transformers' `CLIPVisionModel`: OpenCLIP ViT-H/14, the ``image_encoder/`` of diffusers' Wan
2.1 I2V and Wan Animate pipelines, 0.63B parameters, whose penultimate hidden state they read): everything the tool
knows of it.

Layouts (`CLIP_VISION.layouts`): ``clip-vision``: a pipeline's ``image_encoder/`` or such a folder itself
(config.json ``architectures: ["CLIPVisionModel"]``); ``clip-vision-single``: one safetensors file in the same
names, no config.json (Comfy-Org's ``clip_vision_h.safetensors``, which holds the ``visual_projection`` of CLIP's
joint space beside the tower: carried as stored, no part of the class).

Names: transformers' own, which ComfyUI's CLIP vision model (``comfy/clip_vision.py``) holds too; `NAMES` maps each
to itself, a table all the same, so a tensor it does not list is refused.

Formats: transformers' (`from_pretrained`, our loader) alone. ComfyUI's are refused at plan time: its Load CLIP
Vision node builds the tower with plain cast ops and takes no quantization from the file; GGUF too: ComfyUI-GGUF
reads a vision tower only as a Qwen2-VL's mmproj file.

What stays high-precision, and why (the bundled recipes say it too): the patch embedding (a convolution over the
pixels, 0.6M parameters), the class and position embeddings, the pre- and post-layer norms and every layer norm, the
projection; every Linear of the encoder layers is quantized, their biases kept.

>>> CLIP_VISION.native_name("vision_model.embeddings.class_embedding")
'vision_model.embeddings.class_embedding'
>>> CLIP_VISION.carried("visual_projection.weight")
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .clip_text import CLIPTower, quick_gelu, tensor_shape
from .encoder import TextEncoder
from .family import (
    CardWords,
    Detection,
    ModelInputs,
    count_blocks,
)

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = ["CLIP_VISION", "CLIPVisionFamily", "NAMES", "CLASS"]

CLASS = "CLIPVisionModel"

TOWER = CLIPTower(
    prefix="vision_model",
    layout="clip-vision",
    title="CLIP vision model",
    cls=CLASS,
    role="OpenCLIP ViT-H/14, a diffusers Wan 2.1 I2V or Wan Animate pipeline's image_encoder/, whose penultimate "
    "hidden state they read",
    kept="the patch embedding (a convolution over the pixels), the class and position embeddings, the pre- and "
    f"post-layer norms and every layer norm, and a file's visual_projection (CLIP's joint space, no part of {CLASS}, "
    "kept as stored)",
    nf4_forward_sqnr_db=15,
    encoder="image_encoder",
    file="clip_vision_h.safetensors",
    projection="visual_projection",
    loaders="ComfyUI's Load CLIP Vision node",
    # sic: transformers' pre_layrnorm
    root_modules=(
        "embeddings.patch_embedding",
        "embeddings.position_embedding",
        "pre_layrnorm",
        "post_layernorm",
    ),
    root_tensors=("embeddings.class_embedding",),
)
_TOWER = TOWER.prefix
NAMES = TOWER.names

_KEYS = ("pixel_values",)


def _pixels(config: dict) -> tuple[int, int, int, int]:
    size = config["image_size"]
    return (1, config.get("num_channels", 3), size, size)


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    # normalized pixels, as CLIPImageProcessor gives them
    return {"pixel_values": torch.randn(_pixels(config), generator=g)}


#: a pass of the tower: one image of the config's size, its last hidden state compared
INPUTS = ModelInputs(
    keys=lambda config: _KEYS,
    shapes=lambda config: {"pixel_values": ((None, *_pixels(config)[1:]),)},
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_KEYS,
)


class CLIPVisionFamily(TextEncoder):
    """An image encoder, found and built as a text encoder is (`TextEncoder`): a transformers class in a
    pipeline's folder, a bare folder or one release file; only its pass takes pixels."""

    name = TOWER.layout
    title = TOWER.title
    names = NAMES
    detection = Detection(
        CLASS,
        # CLIP's own (sic) pre-norm, which SigLIP's tower lacks; CLIP's whole model has a text tower beside
        diffusers_marks=(f"{_TOWER}.pre_layrnorm.", "pre_layrnorm."),
        foreign_marks=("text_model.",),
        library="transformers",
    )
    class_prefixes = TOWER.class_prefixes
    folders = TOWER.folders
    plan = TOWER.plan
    card = CardWords(
        pipeline_tag=None,
        weights="image encoder",
        kept="The patch, class and position embeddings, the norms, the projection and the layers the recipe keeps "
        "stay in their original precision.",
        kept_tensors="every norm and bias, the embeddings and the projection",
    )
    policies = TOWER.policies

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`CLIPVisionModel`'s config (transformers' `CLIPVisionConfig`) for a file that has none, read off the
        tensor shapes (the patch size and channels off the patch embedding, the image size off the positions);
        what they do not say is as ComfyUI's configs have it: 16 heads in the towers wider than 1024 (OpenCLIP's
        H, g and bigG), 64-wide heads in OpenAI's, the activation by width (`quick_gelu`), an epsilon of 1e-5."""
        if config:
            return dict(config)
        (hidden,) = tensor_shape(tensors, f"{_TOWER}.embeddings.class_embedding", where, self.title)
        _, channels, patch, _ = tensor_shape(
            tensors, f"{_TOWER}.embeddings.patch_embedding.weight", where, self.title
        )
        positions, _ = tensor_shape(
            tensors, f"{_TOWER}.embeddings.position_embedding.weight", where, self.title
        )
        inner, _ = tensor_shape(tensors, f"{_TOWER}.encoder.layers.0.mlp.fc1.weight", where, self.title)
        side = math.isqrt(positions - 1)
        if side * side != positions - 1:
            raise InputError(
                f"{where}: {positions} position embeddings are not a square grid of patches and the class token: "
                f"not a {self.title}"
            )
        return {
            "architectures": [CLASS],
            "model_type": "clip_vision_model",
            "hidden_size": hidden,
            "intermediate_size": inner,
            "projection_dim": TOWER.projection_dim(tensors, hidden),
            "num_hidden_layers": count_blocks(tensors, f"{_TOWER}.encoder.layers."),
            "num_attention_heads": 16 if hidden > 1024 else hidden // 64,
            "num_channels": channels,
            "image_size": side * patch,
            "patch_size": patch,
            "hidden_act": quick_gelu(hidden, 1024),
            "layer_norm_eps": 1e-5,
        }


CLIP_VISION = CLIPVisionFamily()
