"""Gemma 3's example checkpoints: a pipeline's ``text_encoder/`` (transformers' `Gemma3ForConditionalGeneration`
folder, in the names google/gemma-3-12b-it stores) with its ``tokenizer/tokenizer.model`` beside it, and
Comfy-Org's single file (ComfyUI's names, the tokenizer inside as ``spiece_model``).

The tokenizer is a small SentencePiece model written here (`quantize.read.spiece.write_spiece`) with Gemma's
special pieces and ids (pad 0, eos 1, bos 2, unk 3) and byte fallback, as Gemma's; it is a unigram model where
Gemma's is BPE, which no runtime here tells apart: sentencepiece loads it and tokenizes with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...read.spiece import write_spiece
from ..gemma3 import CLASS, TOKENIZER_TENSOR
from ..gemma3 import GEMMA3 as FAMILY
from .base import ExampleModel, Examples, byte_fallback_pieces, linear

__all__ = [
    "GEMMA3_EXAMPLES",
    "Gemma3Shape",
    "gemma3_tensors",
    "gemma3_config",
    "example_tokenizer",
    "SINGLE_FILE_STEM",
]

#: Comfy-Org's file name for the repackaged encoder (LTX-2's split_files/text_encoders/gemma_3_12B_it.safetensors)
SINGLE_FILE_STEM = "gemma_3_12B_it"


@dataclass(frozen=True)
class Gemma3Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    vision_width: int
    vision_intermediate: int
    vision_layers: int
    patch: int
    image: int
    mm_tokens: int

    @property
    def vision_heads(self) -> int:
        """SigLIP's heads of 72 (what the family reads off a release's shapes)."""
        return max(1, self.vision_width // 72)


def gemma3_tensors(s: Gemma3Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Gemma3ForConditionalGeneration`'s tensors as google/gemma-3-12b-it stores them (the
    tied output head left out, as the checkpoint leaves it)."""
    v, w, t = "vision_tower.vision_model", s.vision_width, []
    t += [(f"{v}.embeddings.patch_embedding.weight", (w, 3, s.patch, s.patch))]
    t += [(f"{v}.embeddings.patch_embedding.bias", (w,))]
    t += [(f"{v}.embeddings.position_embedding.weight", ((s.image // s.patch) ** 2, w))]
    for i in range(s.vision_layers):
        b = f"{v}.encoder.layers.{i}"
        t += [(f"{b}.layer_norm1.weight", (w,)), (f"{b}.layer_norm1.bias", (w,))]
        for p in ("q", "k", "v", "out"):
            t += linear(f"{b}.self_attn.{p}_proj", w, w, True)
        t += [(f"{b}.layer_norm2.weight", (w,)), (f"{b}.layer_norm2.bias", (w,))]
        t += linear(f"{b}.mlp.fc1", s.vision_intermediate, w, True)
        t += linear(f"{b}.mlp.fc2", w, s.vision_intermediate, True)
    t += [(f"{v}.post_layernorm.weight", (w,)), (f"{v}.post_layernorm.bias", (w,))]
    t += [("multi_modal_projector.mm_input_projection_weight", (w, s.hidden))]
    t += [("multi_modal_projector.mm_soft_emb_norm.weight", (w,))]
    m, q, kv = "language_model.model", s.heads * s.head_dim, s.kv_heads * s.head_dim
    t += [(f"{m}.embed_tokens.weight", (s.vocab_size, s.hidden))]
    for i in range(s.layers):
        b = f"{m}.layers.{i}"
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
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            t += [(f"{b}.{norm}_layernorm.weight", (s.hidden,))]
    return t + [(f"{m}.norm.weight", (s.hidden,))]


#: SigLIP's LayerNorms scale by the weight (near 1), Gemma's RMSNorms by 1 + weight (stored near 0); the first
#: pattern found in a name gives its values
_INIT = {
    r"(layer_norm\d|vision_model\.post_layernorm)\.weight$": (1.0, 0.1),
    r"(layernorm|_norm|\.norm)\.weight$": (0.0, 0.1),
}


def gemma3_config(s: Gemma3Shape) -> dict:
    """config.json as google/gemma-3-12b-it's (its fields, this shape's sizes)."""
    return {
        "architectures": [CLASS],
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "query_pre_attn_scalar": s.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": s.vision_width,
            "intermediate_size": s.vision_intermediate,
            "num_hidden_layers": s.vision_layers,
            "num_attention_heads": s.vision_heads,
            "patch_size": s.patch,
            "image_size": s.image,
            "vision_use_head": False,
        },
        "mm_tokens_per_image": s.mm_tokens,
        "boi_token_index": 255_999,
        "eoi_token_index": 256_000,
        "image_token_index": 262_144,
        "dtype": "bfloat16",
    }


def example_tokenizer(vocab_size: int) -> bytes:
    """A ``tokenizer.model`` with byte fallback and Gemma's specials (``<pad>``, ``<eos>``, ``<bos>``, ``<unk>``):
    `byte_fallback_pieces` to `vocab_size` pieces at most."""
    specials = [("<pad>", "CONTROL"), ("<eos>", "CONTROL"), ("<bos>", "CONTROL"), ("<unk>", "UNKNOWN")]
    return write_spiece(byte_fallback_pieces(specials, vocab_size), unk_id=3, eos_id=1, pad_id=0, bos_id=2)


def _shape(hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, vision=(32, 64, 1, 8, 32, 4)):
    width, vi, vl, patch, image, tokens = vision
    return Gemma3Shape(
        hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, width, vi, vl, patch, image, tokens
    )


class Gemma3Examples(Examples):
    family = FAMILY
    presets = {
        "tiny": _shape(64, 128, 2, 2, 1, 32, 512),
        # what ComfyUI's Gemma 3 12B fixes (48 layers: it tells the 12B by its layer 47; heads of 256; the SigLIP
        # tower) at a small text width (its config takes that): benchmarks/comfyui_encoders.py --family gemma3
        "comfyui": _shape(256, 512, 48, 2, 1, 256, 512, (1152, 4304, 27, 14, 896, 256)),
        # Gemma 3 12B (google/gemma-3-12b-it, LTX-2's encoder): 12.2B parameters, 24.4 GB in bf16
        "12b": _shape(3840, 15360, 48, 16, 8, 256, 262208, (1152, 4304, 27, 14, 896, 256)),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/`` (its tokenizer in ``tokenizer/``, `files`);
        ``single``: Comfy-Org's one file at the root, ComfyUI's names, the tokenizer inside, no config.json."""
        s = self.shape(preset, layout)
        if layout == "pipeline":
            return [
                ExampleModel("text_encoder", gemma3_tensors(s), gemma3_config(s), stem="model", init=_INIT)
            ]
        native = [(FAMILY.native_name(n), shape) for n, shape in gemma3_tensors(s)]
        tokenizer = {TOKENIZER_TENSOR: example_tokenizer(s.vocab_size)}
        return [ExampleModel(".", native, None, SINGLE_FILE_STEM, fixed=tokenizer, init=_INIT, one_file=True)]

    def files(self, layout: str) -> dict[str, str | bytes]:
        """A pipeline's tokenizer folder: ``tokenizer.model`` and transformers' config of it."""
        if layout != "pipeline":
            return {}
        vocab = self.presets[self.default_preset].vocab_size
        config = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False}
        return {
            "tokenizer/tokenizer.model": example_tokenizer(vocab),
            "tokenizer/tokenizer_config.json": json.dumps(config) + "\n",
        }


GEMMA3_EXAMPLES = Gemma3Examples()
