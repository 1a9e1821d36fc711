"""umT5 (transformers' `UMT5EncoderModel`; umT5-XXL is the text encoder of Wan 2.1/2.2, SkyReels-V2, VACE and
Animate): everything the tool knows of it.

Layouts (`UMT5.layouts`): ``umt5``: a transformers folder, a pipeline's ``text_encoder/`` (a diffusers Wan
pipeline's) or such a folder itself (config.json ``architectures: ["UMT5EncoderModel"]``); ``umt5-single``: one
safetensors file of the encoder in ComfyUI's names, no config.json (Comfy-Org's repackaged
``umt5_xxl_fp16.safetensors``), which holds its tokenizer as the tensor ``spiece_model``; Wan's own
``models_t5_umt5-xxl-enc-bf16.pth`` (given as SOURCE itself: `read.pth` reads it with torch's weights-only loader) in
Wan's T5 names (`WAN_NAMES`, `UMT5.aliases`), read under transformers' names, so that it is a ``umt5-single`` file;
its tokenizer is the release's ``google/umt5-xxl/spiece.model`` beside it.

Names: ComfyUI's text-encoder loader (``comfy/text_encoders/t5.py``, CLIPLoader type ``wan``) reads transformers'
own names, so `NAMES` maps each name to itself; it is still a table, so a tensor it does not list is refused. A
GGUF file holds llama.cpp's ``t5encoder`` names (`GGUF_NAMES`: ``enc.blk.N.attn_q``, ``token_embd``), which
ComfyUI-GGUF's CLIP loader maps back (its T5 key map), as city96's ``umt5-xxl-encoder-*.gguf`` files do.

The tokenizer (`Tokenizer`): ComfyUI builds umT5's tokenizer from the file's ``spiece_model`` tensor (the bytes of
sentencepiece's ``spiece.model``; there is no bundled one), ComfyUI-GGUF from the ``tokenizer.ggml.*`` key-values;
both are made from the pipeline's ``tokenizer/spiece.model`` (or one beside the model), else from the SentencePiece
model rebuilt from its ``tokenizer.json`` (transformers 5 saves a T5 tokenizer as that file alone).

What stays high-precision, and why (the bundled recipes say it too): the shared embedding (``shared``, 256384 x 4096
in umT5-XXL: a lookup table, a fifth of the parameters, that ComfyUI and the loaders use as a plain embedding) and
each layer's relative attention bias (32 buckets x 64 heads: plain parameters, F32 in GGUF as llama.cpp keeps them),
the layer norms; every Linear of the 24 blocks is quantized.

>>> UMT5.native_name("encoder.block.3.layer.1.DenseReluDense.wi_0.weight")
'encoder.block.3.layer.1.DenseReluDense.wi_0.weight'
>>> UMT5.plan.gguf_names.native("encoder.block.3.layer.0.SelfAttention.relative_attention_bias.weight")
'enc.blk.3.attn_rel_b.weight'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .encoder import TextEncoder, token_inputs
from .family import (
    Aliases,
    CardWords,
    Carried,
    Detection,
    Folders,
    ModelInputs,
    PlanPolicy,
    Tokenizer,
    count_blocks,
    shape_reader,
)
from .names import BlockNames, Blocks
from .policy import FormatTargets, Policy

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = [
    "UMT5",
    "UMT5Family",
    "NAMES",
    "GGUF_NAMES",
    "WAN_NAMES",
    "CLASS",
    "TOKENIZER_TENSOR",
    "TARGETS",
    "NF4_TARGETS",
    "QUANTIZED",
    "nf4_without_wo",
]

CLASS = "UMT5EncoderModel"
#: ComfyUI's key for the tokenizer in a text encoder's file (comfy/text_encoders/wan.py: ``spiece_model``)
TOKENIZER_TENSOR = "spiece_model"

# --- names -------------------------------------------------------------------------------------------------

_ATTENTION = "layer.0.SelfAttention"
_FFN = "layer.1.DenseReluDense"
#: transformers' module in a block -> llama.cpp's (gguf-py's MODEL_TENSORS[T5ENCODER], tensor_mapping.py)
_BLOCK = {
    f"{_ATTENTION}.q": "attn_q",
    f"{_ATTENTION}.k": "attn_k",
    f"{_ATTENTION}.v": "attn_v",
    f"{_ATTENTION}.o": "attn_o",
    f"{_ATTENTION}.relative_attention_bias": "attn_rel_b",
    "layer.0.layer_norm": "attn_norm",
    f"{_FFN}.wi_0": "ffn_gate",
    f"{_FFN}.wi_1": "ffn_up",
    f"{_FFN}.wo": "ffn_down",
    "layer.1.layer_norm": "ffn_norm",
}
_ROOT = {"shared": "token_embd", "encoder.final_layer_norm": "enc.output_norm"}

#: transformers' names -> ComfyUI's: the same (the tied ``encoder.embed_tokens`` too: ComfyUI ignores it)
NAMES = BlockNames(
    root_modules={m: m for m in (*_ROOT, "encoder.embed_tokens")},
    root_tensors={TOKENIZER_TENSOR: TOKENIZER_TENSOR},
    blocks=(Blocks("encoder.block", "encoder.block", modules={m: m for m in _BLOCK}),),
)
#: transformers' names -> llama.cpp's ``t5encoder`` names, what a GGUF file holds
GGUF_NAMES = BlockNames(
    root_modules=_ROOT, root_tensors={}, blocks=(Blocks("encoder.block", "enc.blk", modules=_BLOCK),)
)

#: transformers' names -> Wan's own (``wan/modules/t5.py`` `T5Encoder`, what ``models_t5_umt5-xxl-enc-bf16.pth``
#: stores): the gated FFN's gate (GELU'd) ``gate.0`` is wi_0, ``fc1`` wi_1, ``fc2`` wo; ``pos_embedding.embedding``
#: each block's relative attention bias, as an Embedding of the same buckets x heads
WAN_NAMES = BlockNames(
    root_modules={"shared": "token_embedding", "encoder.final_layer_norm": "norm"},
    root_tensors={},
    blocks=(
        Blocks(
            "encoder.block",
            "blocks",
            modules={
                **{f"{_ATTENTION}.{m}": f"attn.{m}" for m in "qkvo"},
                f"{_ATTENTION}.relative_attention_bias": "pos_embedding.embedding",
                "layer.0.layer_norm": "norm1",
                f"{_FFN}.wi_0": "ffn.gate.0",
                f"{_FFN}.wi_1": "ffn.fc1",
                f"{_FFN}.wo": "ffn.fc2",
                "layer.1.layer_norm": "norm2",
            },
        ),
    ),
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

#: every Linear of the encoder blocks, T5's and umT5's alike: the attention's q, k, v, o, the gated FFN's
#: wi_0, wi_1, wo
TARGETS = (
    r"encoder\.block\.\d+\.layer\.0\.SelfAttention\.(q|k|v|o)",
    r"encoder\.block\.\d+\.layer\.1\.DenseReluDense\.(wi_0|wi_1|wo)",
)
#: nf4's: wo left out (`nf4_without_wo`)
NF4_TARGETS = (TARGETS[0], r"encoder\.block\.\d+\.layer\.1\.DenseReluDense\.(wi_0|wi_1)")
QUANTIZED = (
    "every Linear of the encoder blocks (the attention's q, k, v, o and the gated FFN's wi_0, wi_1, wo)"
)


def nf4_without_wo(cls: str) -> FormatTargets:
    """nf4's targets of a T5 encoder of class `cls`: transformers keeps its wo in float32 and will not load it
    quantized."""
    return FormatTargets(
        NF4_TARGETS,
        f"wo excepted: transformers keeps T5's wo in float32 ({cls}._keep_in_fp32_modules: its outputs overflow "
        "float16) and its bitsandbytes loader will not load it quantized",
    )


_KEPT = (
    "the shared embedding (shared: a lookup table of every token's vector, a fifth of umT5-XXL's weights, that "
    "every runtime uses as a plain embedding, where a quantization error reaches every token), each block's "
    "relative attention bias (32 buckets x heads: plain parameters, added to every attention score) and the layer "
    "norms"
)
_EXCEPTIONS = {"nf4": nf4_without_wo(CLASS)}
#: 4-bit weights compound through the blocks: the output's floor
_CHECKS = {
    "nf4": {"min_forward_sqnr_db": 15},
    "comfy_nvfp4": {"min_forward_sqnr_db": 12},
    "comfy_w4a8": {"min_forward_sqnr_db": 12},
    "comfy_w4a4": {"min_forward_sqnr_db": 12},
}

UMT5_POLICY = Policy(
    what=f"umT5 text encoder ({CLASS}) in transformers' layout (a pipeline's text_encoder/, or that folder itself)",
    components=("text_encoder",),
    targets=TARGETS,
    quantized=QUANTIZED,
    kept=_KEPT,
    exceptions=_EXCEPTIONS,
    checks=_CHECKS,
    copy_other_files=False,
)
UMT5_SINGLE_POLICY = replace(
    UMT5_POLICY,
    what="umT5 text encoder as one file given as SOURCE itself: Comfy-Org's umt5_xxl_fp16.safetensors (ComfyUI's names, transformers' "
    "own, its tokenizer inside as spiece_model) or Wan's models_t5_umt5-xxl-enc-bf16.pth (Wan's T5 names, read as "
    "transformers')",
    components=(".",),
    note=f"A transformers-layout output of it is model.safetensors in transformers' names with the {CLASS} config.json "
    "read off its shapes, spiece_model (no part of the class) left out.",
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(lambda config: config["vocab_size"])


class UMT5Family(TextEncoder):
    name = "umt5"
    title = "umT5"
    names = NAMES
    detection = Detection(
        CLASS,
        diffusers_marks=(f"encoder.block.0.{_ATTENTION}.",),
        # T5's encoder has a relative attention bias in its first block only, umT5's in every one
        own_marks=(f"encoder.block.1.{_ATTENTION}.relative_attention_bias.",),
        library="transformers",
    )
    aliases = Aliases(
        marks=("blocks.0.pos_embedding.embedding.",),
        names=WAN_NAMES,
        what="Wan's T5 names (its models_t5_umt5-xxl-enc-bf16.pth)",
    )
    folders = Folders(
        "umt5",
        release="umt5-single",
        release_why="umT5, one file in ComfyUI's names with its tokenizer (Comfy-Org's umt5_xxl_*.safetensors)",
    )
    plan = PlanPolicy(
        root_stem="umt5",
        gguf_architecture="t5encoder",
        gguf_names=GGUF_NAMES,
        plain_weights=(rf"encoder\.block\.\d+\.{_ATTENTION}\.relative_attention_bias\.",),
        carried=Carried(tensors=(TOKENIZER_TENSOR,)),
        tokenizer=Tokenizer(
            tensor=TOKENIZER_TENSOR,
            # beside it; a diffusers pipeline's tokenizer/; Wan's release (google/umt5-xxl/ beside the .pth); else
            # the tokenizer.json transformers 5 saves alone, the model rebuilt from it (`read.spiece`)
            files=(
                "spiece.model",
                "../tokenizer/spiece.model",
                "google/umt5-xxl/spiece.model",
                "tokenizer.json",
                "../tokenizer/tokenizer.json",
            ),
            gguf_model="t5",
            vocab_tensor="shared.weight",
        ),
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The shared embedding, the relative attention biases, the norms and the layers the recipe keeps stay "
        "in their original precision.",
        kept_tensors="every norm, the shared embedding and the relative attention biases",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node, "
        "type `wan` (its tokenizer is in the file, as `spiece_model`)",
        comfyui_gguf="put the file in `ComfyUI/models/text_encoders/` and load it with the **CLIPLoader (GGUF)** "
        "node, type `wan` (its tokenizer is in the file's `tokenizer.ggml` key-values)",
    )
    policies = {"umt5": UMT5_POLICY, "umt5-single": UMT5_SINGLE_POLICY}

    # --- recognizing it ------------------------------------------------------------------------------------

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    #: transformers' ``model_type`` of its config
    model_type = "umt5"

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`UMT5EncoderModel`'s config (transformers' `UMT5Config`) for a file that has none, read off the tensor
        shapes; what they do not say is umT5-XXL's (gated GELU, 128 as the relative attention's max distance, an
        epsilon of 1e-6)."""
        if config:
            return dict(config)

        shape = shape_reader(tensors, where, f"a {self.title} encoder")

        vocab, d_model = shape("shared.weight")
        buckets, heads = shape(f"encoder.block.0.{_ATTENTION}.relative_attention_bias.weight")
        inner = shape(f"encoder.block.0.{_ATTENTION}.q.weight")[0]
        layers = count_blocks(tensors, "encoder.block.")
        return {
            "architectures": [self.diffusers_class],
            "model_type": self.model_type,
            "vocab_size": vocab,
            "d_model": d_model,
            "d_kv": inner // heads,
            "d_ff": shape(f"encoder.block.0.{_FFN}.wi_0.weight")[0],
            "num_layers": layers,
            "num_decoder_layers": layers,
            "num_heads": heads,
            "relative_attention_num_buckets": buckets,
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
        }

    def build_model(self, config: dict):
        """transformers' `UMT5EncoderModel` (`TextEncoder.build_model`), the encoder's ``embed_tokens`` made
        ``shared`` itself, as the checkpoints store one of them."""
        model = super().build_model(config)
        model.encoder.embed_tokens = model.shared
        return model

    def gguf_key_values(
        self, config: dict, tensors: Mapping[str, TensorInfo]
    ) -> dict[str, str | int | float]:
        """llama.cpp's ``t5encoder`` hyperparameters (``convert_hf_to_gguf.py``'s T5EncoderModel): 512 tokens of
        context, as transformers' T5 default, and the rest from the config (derived for a single file)."""
        c = self.diffusers_config(config, tensors, Path("."))
        arch = self.plan.gguf_architecture
        return {
            f"{arch}.context_length": c.get("n_positions", 512),
            f"{arch}.embedding_length": c["d_model"],
            f"{arch}.feed_forward_length": c["d_ff"],
            f"{arch}.block_count": c["num_layers"],
            f"{arch}.attention.head_count": c["num_heads"],
            f"{arch}.attention.key_length": c["d_kv"],
            f"{arch}.attention.value_length": c["d_kv"],
            f"{arch}.attention.layer_norm_epsilon": float(c["layer_norm_epsilon"]),
            f"{arch}.attention.relative_buckets_count": c["relative_attention_num_buckets"],
            f"{arch}.attention.layer_norm_rms_epsilon": float(c["layer_norm_epsilon"]),
        }


UMT5 = UMT5Family()
