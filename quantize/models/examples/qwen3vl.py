"""Qwen3-VL's example checkpoints: a pipeline's ``text_encoder/`` (transformers' `Qwen3VLForConditionalGeneration`
folder, in the names Qwen/Qwen3-VL-8B-Instruct stores: a diffusers QwenImage21Pipeline's) and Comfy-Org's single
file (the same names, no config.json). ComfyUI bundles the tokenizer: neither holds one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..qwen3vl import QWEN3VL as FAMILY
from .base import ExampleModel, Examples, linear

__all__ = [
    "QWEN3VL_EXAMPLES",
    "Qwen3VLShape",
    "qwen3vl_tensors",
    "qwen3vl_config",
    "SINGLE_FILE_STEM",
    "INIT",
]

#: Comfy-Org's file name for the repackaged encoder (ComfyUI's blueprints name ``qwen3vl_8b_fp8_scaled``)
SINGLE_FILE_STEM = "qwen3vl_8b"


@dataclass(frozen=True)
class Qwen3VLShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    vision_width: int
    vision_intermediate: int
    vision_depth: int
    #: the tower's blocks DeepStack's mergers read (a merger each): the 8B's; the family knows them by the depth
    deepstack: tuple[int, ...] = (8, 16, 24)
    head_dim: int = 128  # Qwen3-VL's (ComfyUI fixes it)
    patch: int = 16
    temporal_patch: int = 2
    merge: int = 2
    #: the tower's learned position table (48 x 48 in the released models; ComfyUI fixes 2304)
    positions: int = 2304


def qwen3vl_tensors(s: Qwen3VLShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Qwen3VLForConditionalGeneration`'s tensors as Qwen/Qwen3-VL-8B-Instruct stores them (the
    names the class holds; the output head stored, untied, as the 8B's)."""
    w, v, t = s.vision_width, "model.visual", []
    t += [
        (f"{v}.patch_embed.proj.weight", (w, 3, s.temporal_patch, s.patch, s.patch)),
        (f"{v}.patch_embed.proj.bias", (w,)),
        (f"{v}.pos_embed.weight", (s.positions, w)),
    ]
    for i in range(s.vision_depth):
        b = f"{v}.blocks.{i}"
        t += [(f"{b}.{n}.{x}", (w,)) for n in ("norm1", "norm2") for x in ("weight", "bias")]
        t += linear(f"{b}.attn.qkv", 3 * w, w) + linear(f"{b}.attn.proj", w, w)
        t += linear(f"{b}.mlp.linear_fc1", s.vision_intermediate, w)
        t += linear(f"{b}.mlp.linear_fc2", w, s.vision_intermediate)
    merged = w * s.merge**2
    # the merger normalizes each patch before merging (its norm w wide); DeepStack's after (merged wide)
    mergers = [(f"{v}.merger", w)] + [
        (f"{v}.deepstack_merger_list.{i}", merged) for i in range(len(s.deepstack))
    ]
    for m, norm in mergers:
        t += [(f"{m}.norm.weight", (norm,)), (f"{m}.norm.bias", (norm,))]
        t += linear(f"{m}.linear_fc1", merged, merged) + linear(f"{m}.linear_fc2", s.hidden, merged)
    q, kv, lm = s.heads * s.head_dim, s.kv_heads * s.head_dim, "model.language_model"
    t += [(f"{lm}.embed_tokens.weight", (s.vocab_size, s.hidden))]
    for i in range(s.layers):
        b = f"{lm}.layers.{i}"
        t += linear(f"{b}.self_attn.q_proj", q, s.hidden, False)
        t += linear(f"{b}.self_attn.k_proj", kv, s.hidden, False)
        t += linear(f"{b}.self_attn.v_proj", kv, s.hidden, False)
        t += linear(f"{b}.self_attn.o_proj", s.hidden, q, False)
        t += [
            (f"{b}.self_attn.q_norm.weight", (s.head_dim,)),
            (f"{b}.self_attn.k_norm.weight", (s.head_dim,)),
        ]
        t += linear(f"{b}.mlp.gate_proj", s.intermediate, s.hidden, False)
        t += linear(f"{b}.mlp.up_proj", s.intermediate, s.hidden, False)
        t += linear(f"{b}.mlp.down_proj", s.hidden, s.intermediate, False)
        t += [
            (f"{b}.input_layernorm.weight", (s.hidden,)),
            (f"{b}.post_attention_layernorm.weight", (s.hidden,)),
        ]
    return t + [(f"{lm}.norm.weight", (s.hidden,)), ("lm_head.weight", (s.vocab_size, s.hidden))]


#: RMSNorms and LayerNorms scale by their weight (near 1); biases small; token vectors of unit scale (Qwen does not
#: scale its embedding up, as Gemma does)
INIT = {
    r"(norm\d?|layernorm|q_norm|k_norm)\.weight$": (1.0, 0.1),
    r"\.bias$": (0.0, 0.02),
    r"embed_tokens\.weight$": (0.0, 1.0),
}


def qwen3vl_config(s: Qwen3VLShape) -> dict:
    """config.json as Qwen/Qwen3-VL-8B-Instruct's, written out (its fields, as transformers 4.57 wrote them, this
    shape's sizes): what the family's config of a release, read off its shapes, is held to."""
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 5_000_000,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
            "max_position_embeddings": 262_144,
            "attention_bias": False,
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "hidden_act": "gelu_pytorch_tanh",
            "num_heads": 16,
            "in_channels": 3,
            "depth": s.vision_depth,
            "hidden_size": s.vision_width,
            "intermediate_size": s.vision_intermediate,
            "out_hidden_size": s.hidden,
            "patch_size": s.patch,
            "temporal_patch_size": s.temporal_patch,
            "spatial_merge_size": s.merge,
            "num_position_embeddings": s.positions,
            "deepstack_visual_indexes": list(s.deepstack),
        },
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


class Qwen3VLExamples(Examples):
    family = FAMILY
    presets = {
        # the 4B's tower depth (24 blocks, DeepStack at 5, 11, 17: the family reads the layers off the depth) at a
        # small width, its MLP 80 wide: a multiple of 16 and not of 32, as the 8B's 4304
        "tiny": Qwen3VLShape(128, 256, 2, 2, 1, 512, 64, 80, 24, (5, 11, 17), head_dim=64, positions=16),
        # what ComfyUI's Qwen3VL fixes (heads of 128; the 8B's tower, 1152 wide, 27 deep, its MLP 4304, 2304
        # positions; the tokenizer's 151936 ids) at a small text width: comfyui_encoders.py --family qwen3vl
        "comfyui": Qwen3VLShape(512, 1024, 2, 4, 2, 151936, 1152, 4304, 27),
        # Qwen3-VL-8B (Qwen/Qwen3-VL-8B-Instruct): 8.8B parameters, 17.5 GB in bf16
        "8b": Qwen3VLShape(4096, 12288, 36, 32, 8, 151936, 1152, 4304, 27),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/``; ``single``: Comfy-Org's one file at the
        root, no config.json."""
        s = self.shape(preset, layout)
        if layout == "pipeline":
            return [
                ExampleModel("text_encoder", qwen3vl_tensors(s), qwen3vl_config(s), stem="model", init=INIT)
            ]
        return [ExampleModel(".", qwen3vl_tensors(s), None, SINGLE_FILE_STEM, init=INIT, one_file=True)]


QWEN3VL_EXAMPLES = Qwen3VLExamples()
