"""CLIP text model's example checkpoints: a pipeline's ``text_encoder_2/`` (transformers' `CLIPTextModel` folder, as
diffusers' Kandinsky 5 and HunyuanVideo pipelines hold CLIP ViT-L/14's) and Comfy-Org's single file (the same
names, the projection of CLIP's joint space beside, no config.json). The tokenizer stays in a pipeline's
``tokenizer_2/``; ComfyUI bundles CLIP's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..clip_text import CLASS, CLIP_TEXT, LAYER_MODULES
from .base import ExampleModel, Examples

__all__ = [
    "CLIP_TEXT_EXAMPLES",
    "CLIPShape",
    "clip_layers",
    "clip_text_tensors",
    "clip_text_config",
    "clip_init",
    "clip_models",
]

#: Comfy-Org's file name for CLIP ViT-L/14's text tower (split_files/text_encoders/clip_l.safetensors)
SINGLE_FILE_STEM = "clip_l"


@dataclass(frozen=True)
class CLIPShape:
    """A CLIP tower's sizes: its width, MLP width, heads, layers, projection; a text tower's vocabulary and
    positions, a vision tower's image side, patch and channels."""

    hidden: int
    inner: int
    heads: int
    layers: int
    projection: int
    vocab: int = 49408
    positions: int = 77
    image: int = 224
    patch: int = 14
    channels: int = 3
    act: str = "quick_gelu"


def clip_init(s: CLIPShape) -> dict[str, tuple[float, float]]:
    """(mean, std) of each tensor as transformers' `CLIPPreTrainedModel._init_weights` draws it (the attention's
    input projections and fc2 scaled down by the depth, the embeddings at 0.02, the class embedding by the width),
    the norms near 1 and the biases small but not zero: a random model whose residual stream stays as a trained
    one's does, so that a quantization error does not compound as it would through an unscaled one."""
    depth = (s.hidden**-0.5) * ((2 * s.layers) ** -0.5)
    return {
        r"(layer_norm\d?|layrnorm|layernorm)\.weight$": (1.0, 0.1),
        r"\.bias$": (0.0, 0.02),
        r"self_attn\.(q|k|v)_proj\.weight$": (0.0, depth),
        r"self_attn\.out_proj\.weight$": (0.0, s.hidden**-0.5),
        r"mlp\.fc1\.weight$": (0.0, (2 * s.hidden) ** -0.5),
        r"mlp\.fc2\.weight$": (0.0, depth),
        r"(token|position|patch)_embedding\.weight$": (0.0, 0.02),
        r"class_embedding$": (0.0, s.hidden**-0.5),
        r"(text|visual)_projection\.weight$": (0.0, s.hidden**-0.5),
    }


def clip_layers(prefix: str, s: CLIPShape) -> list[tuple[str, tuple[int, ...]]]:
    """An encoder's layers as transformers saves them (`CLIPEncoderLayer`, biased Linears, LayerNorms)."""
    shapes = {
        "self_attn.q_proj": (s.hidden, s.hidden),
        "self_attn.k_proj": (s.hidden, s.hidden),
        "self_attn.v_proj": (s.hidden, s.hidden),
        "self_attn.out_proj": (s.hidden, s.hidden),
        "layer_norm1": (s.hidden,),
        "mlp.fc1": (s.inner, s.hidden),
        "mlp.fc2": (s.hidden, s.inner),
        "layer_norm2": (s.hidden,),
    }
    t = []
    for i in range(s.layers):
        for m in LAYER_MODULES:
            t += [(f"{prefix}.{i}.{m}.weight", shapes[m]), (f"{prefix}.{i}.{m}.bias", (shapes[m][0],))]
    return t


def clip_text_tensors(s: CLIPShape, projection: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `CLIPTextModel`'s state dict (with ComfyUI's ``text_projection`` where `projection`)."""
    t = [
        ("text_model.embeddings.token_embedding.weight", (s.vocab, s.hidden)),
        ("text_model.embeddings.position_embedding.weight", (s.positions, s.hidden)),
        *clip_layers("text_model.encoder.layers", s),
        ("text_model.final_layer_norm.weight", (s.hidden,)),
        ("text_model.final_layer_norm.bias", (s.hidden,)),
    ]
    return t + [("text_projection.weight", (s.projection, s.hidden))] if projection else t


def clip_text_config(s: CLIPShape) -> dict:
    """config.json as transformers writes a `CLIPTextModel`'s (openai/clip-vit-large-patch14's fields, this shape's
    sizes)."""
    return {
        "architectures": [CLASS],
        "model_type": "clip_text_model",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.inner,
        "projection_dim": s.projection,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "max_position_embeddings": s.positions,
        "hidden_act": s.act,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "dtype": "bfloat16",
    }


def clip_models(
    s: CLIPShape,
    layout: str,
    component: str,
    tensors: Callable[..., list[tuple[str, tuple[int, ...]]]],
    config: dict,
    stem: str,
) -> list[ExampleModel]:
    """A tower's example: ``pipeline``, transformers' folder in `component` with its `config`; ``single``,
    Comfy-Org's one file at the root named `stem`, its projection beside (`tensors(s, projection=True)`), no
    config.json."""
    if layout == "pipeline":
        return [ExampleModel(component, tensors(s), config, "model", init=clip_init(s))]
    return [ExampleModel(".", tensors(s, projection=True), None, stem, init=clip_init(s), one_file=True)]


class CLIPTextExamples(Examples):
    family = CLIP_TEXT
    presets = {
        "tiny": CLIPShape(hidden=128, inner=512, heads=2, layers=2, projection=128, vocab=1000),
        # CLIP ViT-L/14's text tower (openai/clip-vit-large-patch14; Kandinsky 5's and HunyuanVideo's
        # text_encoder_2): 0.12B parameters
        "clip-l": CLIPShape(hidden=768, inner=3072, heads=12, layers=12, projection=768),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        s = self.shape(preset, layout)
        return clip_models(
            s, layout, "text_encoder_2", clip_text_tensors, clip_text_config(s), SINGLE_FILE_STEM
        )


CLIP_TEXT_EXAMPLES = CLIPTextExamples()
