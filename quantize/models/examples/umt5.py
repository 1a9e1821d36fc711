"""umT5's example checkpoints: a pipeline's ``text_encoder/`` (transformers' `UMT5EncoderModel` folder) with its
``tokenizer/spiece.model`` beside it, and Comfy-Org's single file (ComfyUI's names, the tokenizer inside as
``spiece_model``).

The tokenizer is a small unigram SentencePiece model written here (`quantize.read.spiece.write_spiece`), with
umT5's special pieces and ids (pad 0, eos 1, unk 2) and fewer pieces than the embedding has rows, as umT5-XXL's
256300 pieces against its 256384 rows: sentencepiece loads it and tokenizes with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...read.spiece import write_spiece
from ..umt5 import CLASS, TOKENIZER_TENSOR, UMT5
from .base import ExampleModel, Examples, byte_fallback_pieces

__all__ = [
    "UMT5_EXAMPLES",
    "UMT5Shape",
    "umt5_tensors",
    "umt5_config",
    "example_tokenizer",
    "SINGLE_FILE_STEM",
]

#: Comfy-Org's file name for the repackaged encoder (split_files/text_encoders/umt5_xxl_fp16.safetensors)
SINGLE_FILE_STEM = "umt5_xxl_fp16"


@dataclass(frozen=True)
class UMT5Shape:
    d_model: int
    d_ff: int
    num_heads: int
    d_kv: int
    num_layers: int
    vocab_size: int
    buckets: int = 32


def umt5_tensors(s: UMT5Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `UMT5EncoderModel`'s state dict as transformers saves it (the tied
    ``encoder.embed_tokens`` left out, as ``save_pretrained`` leaves it)."""
    inner, t = s.num_heads * s.d_kv, [("shared.weight", (s.vocab_size, s.d_model))]
    for i in range(s.num_layers):
        a, f = f"encoder.block.{i}.layer.0.SelfAttention", f"encoder.block.{i}.layer.1"
        t += [(f"{a}.{m}.weight", (inner, s.d_model)) for m in "qkv"]
        t += [(f"{a}.o.weight", (s.d_model, inner))]
        t += [(f"{a}.relative_attention_bias.weight", (s.buckets, s.num_heads))]
        t += [(f"encoder.block.{i}.layer.0.layer_norm.weight", (s.d_model,))]
        t += [(f"{f}.DenseReluDense.wi_0.weight", (s.d_ff, s.d_model))]
        t += [(f"{f}.DenseReluDense.wi_1.weight", (s.d_ff, s.d_model))]
        t += [
            (f"{f}.DenseReluDense.wo.weight", (s.d_model, s.d_ff)),
            (f"{f}.layer_norm.weight", (s.d_model,)),
        ]
    return t + [("encoder.final_layer_norm.weight", (s.d_model,))]


def umt5_init(s: UMT5Shape) -> dict[str, tuple[float, float]]:
    """(mean, std) where T5's initialization differs from the examples' default (transformers'
    `UMT5PreTrainedModel._init_weights`): q by 1/sqrt(d_model * d_kv) (T5 does not scale its attention scores,
    so an unscaled q saturates every softmax), the embedding by 1, the norms near 1."""
    return {
        r"SelfAttention\.q\.weight$": (0.0, (s.d_model * s.d_kv) ** -0.5),
        r"^shared\.weight$": (0.0, 1.0),
        r"layer_norm\.weight$": (1.0, 0.1),
    }


def umt5_config(s: UMT5Shape) -> dict:
    """config.json as transformers writes a `UMT5EncoderModel`'s (umT5-XXL's fields, this shape's sizes)."""
    return {
        "architectures": [CLASS],
        "model_type": "umt5",
        "vocab_size": s.vocab_size,
        "d_model": s.d_model,
        "d_kv": s.d_kv,
        "d_ff": s.d_ff,
        "num_layers": s.num_layers,
        "num_decoder_layers": s.num_layers,
        "num_heads": s.num_heads,
        "relative_attention_num_buckets": s.buckets,
        "relative_attention_max_distance": 128,
        "feed_forward_proj": "gated-gelu",
        "dense_act_fn": "gelu_new",
        "is_gated_act": True,
        "layer_norm_epsilon": 1e-6,
        "is_encoder_decoder": False,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "dtype": "bfloat16",
    }


def example_tokenizer(vocab_size: int) -> bytes:
    """A unigram ``spiece.model`` with byte fallback, as umT5's: its specials (``<pad>``, ``</s>``, ``<unk>``) and
    `byte_fallback_pieces` to ``vocab_size - 64`` pieces (the embedding keeps 64 rows past the tokenizer's, as
    umT5-XXL's does)."""
    specials = [("<pad>", "CONTROL"), ("</s>", "CONTROL"), ("<unk>", "UNKNOWN")]
    return write_spiece(byte_fallback_pieces(specials, vocab_size - 64))


class UMT5Examples(Examples):
    family = UMT5
    presets = {
        "tiny": UMT5Shape(d_model=256, d_ff=512, num_heads=4, d_kv=64, num_layers=2, vocab_size=512),
        "small": UMT5Shape(d_model=512, d_ff=1280, num_heads=8, d_kv=64, num_layers=4, vocab_size=1024),
        # umT5-XXL (Wan's google/umt5-xxl encoder): 5.7B parameters, 11.4 GB in bf16
        "xxl": UMT5Shape(d_model=4096, d_ff=10240, num_heads=64, d_kv=64, num_layers=24, vocab_size=256384),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/`` (its tokenizer in ``tokenizer/``, `files`);
        ``single``: Comfy-Org's one file at the root, ComfyUI's names, the tokenizer inside, no config.json."""
        s = self.shape(preset, layout)
        if layout == "pipeline":
            return [
                ExampleModel("text_encoder", umt5_tensors(s), umt5_config(s), stem="model", init=umt5_init(s))
            ]
        tokenizer = {TOKENIZER_TENSOR: example_tokenizer(s.vocab_size)}
        return [
            ExampleModel(
                ".",
                umt5_tensors(s),
                None,
                SINGLE_FILE_STEM,
                fixed=tokenizer,
                init=umt5_init(s),
                one_file=True,
            )
        ]

    def files(self, layout: str) -> dict[str, str | bytes]:
        """A pipeline's tokenizer folder: ``spiece.model`` and transformers' config of it."""
        if layout != "pipeline":
            return {}
        vocab = self.presets[self.default_preset].vocab_size
        config = {"tokenizer_class": "T5Tokenizer", "model_max_length": 512, "extra_ids": 0}
        return {
            "tokenizer/spiece.model": example_tokenizer(vocab),
            "tokenizer/tokenizer_config.json": json.dumps(config) + "\n",
        }


UMT5_EXAMPLES = UMT5Examples()
