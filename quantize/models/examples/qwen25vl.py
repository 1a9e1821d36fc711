"""Qwen2.5-VL's example checkpoints: a pipeline's ``text_encoder/`` (transformers'
`Qwen2_5_VLForConditionalGeneration` folder, in the names Qwen/Qwen2.5-VL-7B-Instruct stores) and Comfy-Org's
single file (the same names, no config.json). ComfyUI bundles Qwen2.5's tokenizer: neither holds one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..qwen25vl import QWEN25VL as FAMILY
from .base import ExampleModel, Examples, linear

__all__ = ["QWEN25VL_EXAMPLES", "Qwen25VLShape", "qwen25vl_tensors", "qwen25vl_config", "SINGLE_FILE_STEM"]

#: Comfy-Org's file name for the repackaged encoder (split_files/text_encoders/qwen_2.5_vl_7b.safetensors)
SINGLE_FILE_STEM = "qwen_2.5_vl_7b"


@dataclass(frozen=True)
class Qwen25VLShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    vision_width: int
    vision_intermediate: int
    vision_depth: int
    head_dim: int = 128  # Qwen2.5-VL's, by which the family reads the heads off the shapes
    patch: int = 14
    temporal_patch: int = 2
    merge: int = 2

    @property
    def vision_heads(self) -> int:
        return max(1, self.vision_width // 80)


def qwen25vl_tensors(s: Qwen25VLShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Qwen2_5_VLForConditionalGeneration`'s tensors as Qwen/Qwen2.5-VL-7B-Instruct stores
    them (the output head stored, untied, as the 7B's)."""
    w, t = s.vision_width, []
    t += [("visual.patch_embed.proj.weight", (w, 3, s.temporal_patch, s.patch, s.patch))]
    for i in range(s.vision_depth):
        b = f"visual.blocks.{i}"
        t += [(f"{b}.norm1.weight", (w,)), (f"{b}.norm2.weight", (w,))]
        t += linear(f"{b}.attn.qkv", 3 * w, w, True) + linear(f"{b}.attn.proj", w, w, True)
        t += linear(f"{b}.mlp.gate_proj", s.vision_intermediate, w, True)
        t += linear(f"{b}.mlp.up_proj", s.vision_intermediate, w, True)
        t += linear(f"{b}.mlp.down_proj", w, s.vision_intermediate, True)
    merged = w * s.merge**2
    t += [("visual.merger.ln_q.weight", (w,))]
    t += linear("visual.merger.mlp.0", merged, merged, True) + linear(
        "visual.merger.mlp.2", s.hidden, merged, True
    )
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    t += [("model.embed_tokens.weight", (s.vocab_size, s.hidden))]
    for i in range(s.layers):
        b = f"model.layers.{i}"
        t += linear(f"{b}.self_attn.q_proj", q, s.hidden, True)
        t += linear(f"{b}.self_attn.k_proj", kv, s.hidden, True)
        t += linear(f"{b}.self_attn.v_proj", kv, s.hidden, True)
        t += linear(f"{b}.self_attn.o_proj", s.hidden, q, False)
        t += linear(f"{b}.mlp.gate_proj", s.intermediate, s.hidden, False)
        t += linear(f"{b}.mlp.up_proj", s.intermediate, s.hidden, False)
        t += linear(f"{b}.mlp.down_proj", s.hidden, s.intermediate, False)
        t += [
            (f"{b}.input_layernorm.weight", (s.hidden,)),
            (f"{b}.post_attention_layernorm.weight", (s.hidden,)),
        ]
    return t + [("model.norm.weight", (s.hidden,)), ("lm_head.weight", (s.vocab_size, s.hidden))]


#: RMSNorms scale by their weight (near 1); biases small; token vectors of unit scale (Qwen does not scale its
#: embedding up, as Gemma does)
_INIT = {
    r"(norm\d?|layernorm|ln_q)\.weight$": (1.0, 0.1),
    r"\.bias$": (0.0, 0.02),
    r"embed_tokens\.weight$": (0.0, 1.0),
}


def qwen25vl_config(s: Qwen25VLShape) -> dict:
    """config.json as Qwen/Qwen2.5-VL-7B-Instruct's, written out (its fields, this shape's sizes; a full-attention
    block every eighth of the tower's, the last where it has fewer): what the family's config of a release, read off
    its shapes, is held to."""
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "text_config": {
            "model_type": "qwen2_5_vl_text",
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "max_position_embeddings": 128_000,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "qwen2_5_vl",
            "depth": s.vision_depth,
            "hidden_size": s.vision_width,
            "intermediate_size": s.vision_intermediate,
            "num_heads": s.vision_heads,
            "out_hidden_size": s.hidden,
            "hidden_act": "silu",
            "patch_size": s.patch,
            "temporal_patch_size": s.temporal_patch,
            "spatial_merge_size": s.merge,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31] if s.vision_depth == 32 else [s.vision_depth - 1],
        },
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


class Qwen25VLExamples(Examples):
    family = FAMILY
    presets = {
        # transformers' text attention takes its head size as the width over the heads: 128 here too
        "tiny": Qwen25VLShape(128, 256, 2, 1, 1, 512, 32, 64, 2),
        # what ComfyUI's Qwen25_7BVLI fixes (heads of 128, k_proj's 512 rows that it tells the 7B by, the tower
        # 1280 wide and 32 deep, the tokenizer's 152064 ids) at a small text width: comfyui_encoders.py
        "comfyui": Qwen25VLShape(512, 1024, 2, 4, 4, 152064, 1280, 3420, 32),
        # the same with 4 layers: ComfyUI's HunyuanVideo 1.5 and HunyuanImage encoders read the hidden state 3
        # from the last (comfyui_encoders.py --family t5, byT5's first file)
        "comfyui-4": Qwen25VLShape(512, 1024, 4, 4, 4, 152064, 1280, 3420, 32),
        # Qwen2.5-VL-7B (Qwen/Qwen2.5-VL-7B-Instruct): 8.3B parameters, 16.6 GB in bf16
        "7b": Qwen25VLShape(3584, 18944, 28, 28, 4, 152064, 1280, 3420, 32),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/``; ``single``: Comfy-Org's one file at the
        root, no config.json."""
        s = self.shape(preset, layout)
        if layout == "pipeline":
            return [
                ExampleModel(
                    "text_encoder", qwen25vl_tensors(s), qwen25vl_config(s), stem="model", init=_INIT
                )
            ]
        return [ExampleModel(".", qwen25vl_tensors(s), None, SINGLE_FILE_STEM, init=_INIT, one_file=True)]


QWEN25VL_EXAMPLES = Qwen25VLExamples()
