"""Gemma 4 12B unified's example checkpoints: a pipeline's ``text_encoder/`` (transformers'
`Gemma4UnifiedForConditionalGeneration` folder, in the names its ``save_pretrained`` writes) with its
``tokenizer/tokenizer.json`` beside it, and Comfy-Org's single file (ComfyUI's names, the tokenizer inside as
``tokenizer_json``).

The tokenizer is a small tokenizers BPE model written here (`example_tokenizer_json`) with Gemma's special tokens
and ids (pad 0, eos 1, bos 2, unk 3), byte fallback and ``▁`` for spaces, as Gemma's ``tokenizer.json``: tokenizers
loads it (ComfyUI's `Tokenizer.from_str`) and tokenizes with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..gemma4 import CLASS, TEXT_DEFAULTS, TOKENIZER_TENSOR
from ..gemma4 import GEMMA4 as FAMILY
from .base import ExampleModel, Examples, byte_fallback_pieces, linear

__all__ = [
    "GEMMA4_EXAMPLES",
    "Gemma4Shape",
    "gemma4_tensors",
    "gemma4_config",
    "language_model_tensors",
    "text_config",
    "example_tokenizer_json",
    "tokenizer_files",
    "init",
    "SINGLE_FILE_STEM",
]

#: the repackaged encoder's file name (as Comfy-Org names Gemma 3's gemma_3_12B_it.safetensors)
SINGLE_FILE_STEM = "gemma_4_12B_it"
#: Gemma's special tokens, in id order (pad 0, eos 1, bos 2, unk 3)
_SPECIALS = [("<pad>", "CONTROL"), ("<eos>", "CONTROL"), ("<bos>", "CONTROL"), ("<unk>", "UNKNOWN")]


@dataclass(frozen=True)
class Gemma4Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    #: the global layers' (every sixth, and the last)
    global_head_dim: int
    global_kv_heads: int
    #: whether a global layer's value is its key (no v_proj)
    k_eq_v: bool
    vocab_size: int
    #: the vision embedder: its width, merged patch size (16 x 3 in the 12B) and position table's rows
    vision_width: int = 64
    patch: int = 12
    posemb: int = 16
    audio: int = 32
    #: the text towers of E2B and E4B: each layer's per-layer-embedding width (0: none, as the 12B), and how many
    #: last layers share the keys and values of earlier ones
    per_layer: int = 0
    kv_shared: int = 0
    #: every how many layers one is global (6: transformers' and ComfyUI's 5:1 pattern); the last always is
    pattern: int = 6

    def is_global(self, i: int) -> bool:
        """Whether layer `i` is a global one (every `pattern`-th, and the last)."""
        return (i + 1) % self.pattern == 0 or i == self.layers - 1


def language_model_tensors(s: Gemma4Shape, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    """A Gemma 4 language model's tensors under `prefix` (``model.language_model.``; the text model alone's: ""),
    in the class's module order: each layer's scalar, attention (a global layer's heads its own size, no v_proj
    where its value is its key, no k_proj, v_proj or k_norm where it shares an earlier layer's), gated MLP, four
    norms and, with per-layer embeddings, their gate, projection and norm (and the root's table and projection)."""
    t = [(f"{prefix}embed_tokens.weight", (s.vocab_size, s.hidden))]
    for i in range(s.layers):
        b, wide, shared = f"{prefix}layers.{i}", s.is_global(i), i >= s.layers - s.kv_shared
        head, kv = (s.global_head_dim, s.global_kv_heads) if wide else (s.head_dim, s.kv_heads)
        t += [(f"{b}.layer_scalar", (1,))]
        t += linear(f"{b}.self_attn.q_proj", s.heads * head, s.hidden, False)
        t += [(f"{b}.self_attn.q_norm.weight", (head,))]
        if not shared:
            t += [(f"{b}.self_attn.k_norm.weight", (head,))]
            t += linear(f"{b}.self_attn.k_proj", kv * head, s.hidden, False)
            if not (wide and s.k_eq_v):
                t += linear(f"{b}.self_attn.v_proj", kv * head, s.hidden, False)
        t += linear(f"{b}.self_attn.o_proj", s.hidden, s.heads * head, False)
        t += linear(f"{b}.mlp.gate_proj", s.intermediate, s.hidden, False)
        t += linear(f"{b}.mlp.up_proj", s.intermediate, s.hidden, False)
        t += linear(f"{b}.mlp.down_proj", s.hidden, s.intermediate, False)
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            t += [(f"{b}.{norm}_layernorm.weight", (s.hidden,))]
        if s.per_layer:
            t += linear(f"{b}.per_layer_input_gate", s.per_layer, s.hidden, False)
            t += linear(f"{b}.per_layer_projection", s.hidden, s.per_layer, False)
            t += [(f"{b}.post_per_layer_input_norm.weight", (s.hidden,))]
    t += [(f"{prefix}norm.weight", (s.hidden,))]
    if s.per_layer:
        t += [(f"{prefix}embed_tokens_per_layer.weight", (s.vocab_size, s.layers * s.per_layer))]
        t += linear(f"{prefix}per_layer_model_projection", s.layers * s.per_layer, s.hidden, False)
        t += [(f"{prefix}per_layer_projection_norm.weight", (s.per_layer,))]
    return t


def gemma4_tensors(s: Gemma4Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Gemma4UnifiedForConditionalGeneration`'s tensors as its ``save_pretrained`` stores them
    (the tied output head left out, as the checkpoint leaves it)."""
    v, w, patch_dim = "model.vision_embedder", s.vision_width, s.patch * s.patch * 3
    t = language_model_tensors(s, "model.language_model.")
    t += [(f"{v}.pos_embedding", (s.posemb, 2, w))]
    t += [(f"{v}.patch_ln1.weight", (patch_dim,)), (f"{v}.patch_ln1.bias", (patch_dim,))]
    t += linear(f"{v}.patch_dense", w, patch_dim, True)
    for ln in ("patch_ln2", "pos_norm"):
        t += [(f"{v}.{ln}.weight", (w,)), (f"{v}.{ln}.bias", (w,))]
    t += linear("model.embed_vision.embedding_projection", s.hidden, w, False)
    return t + linear("model.embed_audio.embedding_projection", s.hidden, s.audio, False)


#: Gemma 4's RMSNorms and the embedder's LayerNorms scale by the weight (near 1), and so does each layer's scalar;
#: the first pattern found in a name gives its values (`_init`: the query and key norms' first)
_INIT = {
    r"(layernorm|_norm|\.norm|patch_ln\d)\.weight$": (1.0, 0.1),
    r"layer_scalar$": (1.0, 0.05),
    r"(patch_ln\d|pos_norm|patch_dense)\.bias$": (0.0, 0.02),
    r"pos_embedding$": (0.0, 0.02),
}


def text_config(s: Gemma4Shape) -> dict:
    """A Gemma 4 text config of this shape's sizes, with Gemma 4 12B's other fields."""
    return {
        **TEXT_DEFAULTS,
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "global_head_dim": s.global_head_dim,
        "num_global_key_value_heads": s.global_kv_heads,
        "attention_k_eq_v": s.k_eq_v,
        "layer_types": ["full_attention" if s.is_global(i) else "sliding_attention" for i in range(s.layers)],
    }


def gemma4_config(s: Gemma4Shape) -> dict:
    """config.json of `Gemma4UnifiedForConditionalGeneration` (its fields, this shape's sizes)."""
    return {
        "architectures": [CLASS],
        "model_type": "gemma4_unified",
        "text_config": {
            "model_type": "gemma4_unified_text",
            **text_config(s),
            "max_position_embeddings": 262_144,
        },
        "vision_config": {
            "model_type": "gemma4_unified_vision",
            "patch_size": s.patch // 3,
            "pooling_kernel_size": 3,
            "mm_embed_dim": s.vision_width,
            "mm_posemb_size": s.posemb,
            "output_proj_dims": s.vision_width,
        },
        "audio_config": {"model_type": "gemma4_unified_audio", "audio_embed_dim": s.audio},
        "dtype": "bfloat16",
    }


def example_tokenizer_json(vocab_size: int) -> bytes:
    """A tokenizers ``tokenizer.json`` as Gemma's: a BPE model of `byte_fallback_pieces` (to `vocab_size` pieces
    at most; each two-character piece the merge of its characters), Gemma's specials as added tokens, spaces
    normalized to ``▁``, ``<bos>`` prepended by its post-processor (which ComfyUI's encode leaves out: it adds its
    own start token)."""
    pieces = [p for p, _, _ in byte_fallback_pieces(_SPECIALS, vocab_size)]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [
        [p[0], p[1:]]
        for p in pieces[len(_SPECIALS) + 256 :]
        if len(p) == 2 and p[0] in vocab and p[1:] in vocab
    ]
    added = [
        {"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, (p, _) in enumerate(_SPECIALS)
    ]  # fmt: skip
    bos = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return (json.dumps(data, ensure_ascii=False, indent=1) + "\n").encode()


def tokenizer_files(vocab_size: int, where: str) -> dict[str, str | bytes]:
    """Gemma 4's tokenizer files in folder `where` (``tokenizer/``, or "" beside the model): ``tokenizer.json``
    and transformers' config of it."""
    config = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False}
    return {
        f"{where}tokenizer.json": example_tokenizer_json(vocab_size),
        f"{where}tokenizer_config.json": json.dumps(config) + "\n",
    }


def init(s: Gemma4Shape) -> dict[str, tuple[float, float]]:
    """`_INIT`, after the query and key norms' scale: Gemma 4's attention has no 1/sqrt(head size) (its scaling is
    1, its q and k RMS-normed), so a trained model's norms keep the logits small; head_dim^-1/4 each keeps a
    random model's near unit variance, where a quantization error moves them as it moves a trained one's."""
    return {r"self_attn\.(q|k)_norm\.weight$": (s.head_dim**-0.25, 0.02), **_INIT}


class Gemma4Examples(Examples):
    family = FAMILY
    presets = {
        # two layers: a sliding one and the last, global (heads twice as wide, its value its key)
        "tiny": Gemma4Shape(64, 128, 2, 2, 1, 32, 64, 1, True, 512),
        # what ComfyUI's Gemma 4 12B fixes (48 layers: it tells the 12B by its layer 47 and layer 5's missing
        # v_proj; heads of 256 and 512, one global key head; the vision embedder's 3840 x 6912 patches and the
        # 640-sample audio frames) at a small text width (its config takes that): benchmarks/comfyui_encoders.py
        # --family gemma4
        "comfyui": Gemma4Shape(256, 512, 48, 2, 1, 256, 512, 1, True, 512, 3840, 48, 1120, 640),
        # Gemma 4 12B (LTX-2.5's encoder): 11.9B parameters, 23.9 GB in bf16
        "12b": Gemma4Shape(3840, 15360, 48, 16, 8, 256, 512, 1, True, 262144, 3840, 48, 1120, 640),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/`` (its tokenizer in ``tokenizer/``, `files`);
        ``single``: Comfy-Org's one file at the root, ComfyUI's names, the tokenizer inside, no config.json."""
        s = self.shape(preset, layout)
        if layout == "pipeline":
            return [
                ExampleModel("text_encoder", gemma4_tensors(s), gemma4_config(s), stem="model", init=init(s))
            ]
        native = [(FAMILY.native_name(n), shape) for n, shape in gemma4_tensors(s)]
        tokenizer = {TOKENIZER_TENSOR: example_tokenizer_json(s.vocab_size)}
        return [
            ExampleModel(".", native, None, SINGLE_FILE_STEM, fixed=tokenizer, init=init(s), one_file=True)
        ]

    def files(self, layout: str) -> dict[str, str | bytes]:
        """A pipeline's tokenizer folder: ``tokenizer.json`` and transformers' config of it."""
        if layout != "pipeline":
            return {}
        return tokenizer_files(self.presets[self.default_preset].vocab_size, "tokenizer/")


GEMMA4_EXAMPLES = Gemma4Examples()
