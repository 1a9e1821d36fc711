"""Gemma 3 (transformers' `Gemma3ForConditionalGeneration`; Gemma 3 12B is LTX-2's text encoder): everything the
tool knows of it.

Layouts (`GEMMA3.layouts`): ``gemma3``: a transformers folder, a pipeline's ``text_encoder/`` (a diffusers LTX-2
pipeline's) or such a folder itself (config.json ``architectures: ["Gemma3ForConditionalGeneration"]``), in the
names its checkpoints store (google/gemma-3-12b-it's: ``language_model.model.layers.N``,
``vision_tower.vision_model.``, ``multi_modal_projector.``); ``gemma3-single``: one safetensors file in ComfyUI's
names, no config.json (Comfy-Org's repackaged ``gemma_3_12B_it.safetensors``), which holds its tokenizer as the
tensor ``spiece_model``.

Names: ComfyUI's Gemma 3 (``comfy/text_encoders/llama.py`` `Gemma3_12B`, which CLIPLoader picks by
``model.layers.47.self_attn.q_norm.weight``) holds the language model as ``model.`` and the SigLIP tower as
``vision_model.``; `NAMES` maps the stored names to those. transformers 5's class holds them under other names
again (``model.language_model.``, ``model.vision_tower.``: `CLASS_PREFIXES`, its loader's renaming, which a test
holds to transformers' own): a forward pass and the loader fill the class through them, and the formats
transformers loads are written in them, as its quantizers match their modules by those names.

The tokenizer (`Tokenizer`): ComfyUI builds Gemma 3's from the file's ``spiece_model`` tensor (the bytes of
sentencepiece's ``tokenizer.model``; there is no bundled one), made from the pipeline's ``tokenizer/`` (or the
folder's own ``tokenizer.model``).

GGUF: refused at plan time: ComfyUI-GGUF's CLIP loader reads only the architectures of its TXT_ARCH_LIST, which
has no Gemma 3.

What stays high-precision, and why (the bundled recipes say it too): the token embedding (262208 x 3840 in the
12B: a lookup table, tied to the output head, 8% of the weights), the SigLIP vision tower and the projector (3% of
the weights, run only for image prompts, which LTX-2 does not give), and every norm; every Linear of the 48
language-model layers is quantized.

>>> GEMMA3.native_name("language_model.model.layers.3.self_attn.q_proj.weight")
'model.layers.3.self_attn.q_proj.weight'
>>> GEMMA3.native_name("vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias")
'vision_model.encoder.layers.0.mlp.fc1.bias'
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .encoder import TextEncoder, token_inputs
from .family import (
    CardWords,
    Carried,
    Detection,
    Folders,
    ModelInputs,
    PlanPolicy,
    Tokenizer,
    count_blocks,
)
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = [
    "GEMMA3",
    "Gemma3Family",
    "NAMES",
    "CLASS",
    "CLASS_PREFIXES",
    "TOKENIZER_TENSOR",
    "LAYER",
    "LAYER_QUANTIZED",
    "LAYER_CHECKS",
    "layer_targets",
]

CLASS = "Gemma3ForConditionalGeneration"
#: ComfyUI's key for the tokenizer in a text encoder's file (comfy/sd.py: ``spiece_model``)
TOKENIZER_TENSOR = "spiece_model"

# --- names -------------------------------------------------------------------------------------------------

_TEXT, _VISION = "language_model.model", "vision_tower.vision_model"
#: a language-model layer's modules (the same in both namings)
_LAYER = (
    *(f"self_attn.{p}_proj" for p in "qkvo"),
    "self_attn.q_norm",
    "self_attn.k_norm",
    *(f"mlp.{p}_proj" for p in ("gate", "up", "down")),
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
#: a SigLIP encoder layer's modules (the same in both namings)
_VISION_LAYER = (
    "layer_norm1",
    "layer_norm2",
    *(f"self_attn.{p}_proj" for p in ("q", "k", "v", "out")),
    "mlp.fc1",
    "mlp.fc2",
)
_VISION_ROOT = ("embeddings.patch_embedding", "embeddings.position_embedding", "post_layernorm")
_PROJECTOR = "multi_modal_projector"

#: the names Gemma 3's checkpoints store -> ComfyUI's (``comfy/text_encoders/llama.py``, ``comfy/clip_model.py``)
NAMES = BlockNames(
    root_modules={
        f"{_TEXT}.embed_tokens": "model.embed_tokens",
        f"{_TEXT}.norm": "model.norm",
        f"{_PROJECTOR}.mm_soft_emb_norm": f"{_PROJECTOR}.mm_soft_emb_norm",
        **{f"{_VISION}.{m}": f"vision_model.{m}" for m in _VISION_ROOT},
    },
    root_tensors={
        f"{_PROJECTOR}.mm_input_projection_weight": f"{_PROJECTOR}.mm_input_projection_weight",
        TOKENIZER_TENSOR: TOKENIZER_TENSOR,
    },
    blocks=(
        Blocks(f"{_TEXT}.layers", "model.layers", modules={m: m for m in _LAYER}),
        Blocks(
            f"{_VISION}.encoder.layers", "vision_model.encoder.layers", modules={m: m for m in _VISION_LAYER}
        ),
    ),
)

#: stored prefix -> the prefix transformers 5's class holds it under (its ``conversion_mapping`` for gemma3, a
#: ``llava`` model, with SigLIP's ``vision_model.`` dropped; the longer prefix first)
CLASS_PREFIXES = (
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
    ("vision_tower.vision_model.", "model.vision_tower."),
    ("vision_tower.", "model.vision_tower."),
    (f"{_PROJECTOR}.", f"model.{_PROJECTOR}."),
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------


def _targets(layers: str) -> tuple[str, ...]:
    """Every Linear of the language model's layers under `layers` (a regex): attention and gated MLP."""
    return (rf"{layers}\.\d+\.self_attn\.(q|k|v|o)_proj", rf"{layers}\.\d+\.mlp\.(gate|up|down)_proj")


_QUANTIZED = (
    "every Linear of the language model's layers (the attention's q, k, v, o projections and the gated MLP's gate, "
    "up and down projections)"
)
_KEPT = (
    "the token embedding (embed_tokens: a lookup table of every token's vector, tied to the output head, 8% of "
    "Gemma 3 12B's weights, where a quantization error reaches every token), the SigLIP vision tower and the "
    "multimodal projector (3% of the weights, run only for image prompts, which LTX-2 does not give; its patch "
    "embedding a convolution) and every norm (Gemma's RMSNorms scale by 1 + weight)"
)
#: 4-bit weights compound through the layers: the output's floor
_CHECKS = {
    "nf4": {"min_forward_sqnr_db": 12},
    "comfy_nvfp4": {"min_forward_sqnr_db": 12},
    "comfy_w4a8": {"min_forward_sqnr_db": 12},
    "comfy_w4a4": {"min_forward_sqnr_db": 10},
}

#: what Gemma 3's text model alone (`gemma3_text`) shares: a layer's modules, its targets, in words, the floors
LAYER, layer_targets, LAYER_QUANTIZED, LAYER_CHECKS = _LAYER, _targets, _QUANTIZED, _CHECKS

GEMMA3_POLICY = Policy(
    what=f"Gemma 3 text encoder ({CLASS}, LTX-2's) in transformers' layout (a pipeline's text_encoder/, or that "
    "folder itself, in the names google/gemma-3-12b-it stores)",
    components=("text_encoder",),
    targets=_targets(r"language_model\.model\.layers"),
    quantized=_QUANTIZED,
    kept=_KEPT,
    checks=_CHECKS,
    copy_other_files=False,
)
GEMMA3_SINGLE_POLICY = Policy(
    what="Gemma 3 text encoder as one file given as SOURCE itself, in ComfyUI's names with its tokenizer "
    "(Comfy-Org's gemma_3_12B_it.safetensors, LTX-2's: model.layers.N, vision_model.; no config.json)",
    components=(".",),
    targets=_targets(r"model\.layers"),
    quantized=_QUANTIZED,
    kept=_KEPT,
    checks=_CHECKS,
    copy_other_files=False,
    note=f"A transformers-layout output of it is written in the names the class holds (model.language_model., "
    f"model.vision_tower.) with {CLASS}'s config read off its shapes (what they do not say Gemma 3 12B's) as "
    "config.json, spiece_model (no part of the class) left out.",
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(
    lambda config: config["text_config"]["vocab_size"], module="model.language_model", use_cache=False
)

# --- config, from a release's tensor shapes ------------------------------------------------------------------

#: what Gemma 3 12B's config.json says and the shapes do not (google/gemma-3-12b-it)
_TEXT_DEFAULTS = {
    "model_type": "gemma3_text",
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "sliding_window": 1024,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "max_position_embeddings": 131_072,
}
_VISION_DEFAULTS = {
    "model_type": "siglip_vision_model",
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}
#: SigLIP so400m's head size (1152 wide, 16 heads): a tower's heads are its width over this
_VISION_HEAD_DIM = 72


class Gemma3Family(TextEncoder):
    name = "gemma3"
    title = "Gemma 3"
    names = NAMES
    detection = Detection(
        CLASS,
        native_marks=("model.layers.0.",),
        # as its checkpoints store it, or as the class holds it (a checkpoint of transformers' formats)
        diffusers_marks=(f"{_TEXT}.layers.0.", "model.language_model.layers.0."),
        # q and k normed, and no bias on them (Qwen 3's have the norms too, but not the four layer norms)
        own_marks=tuple(
            f"{p}.layers.0.pre_feedforward_layernorm." for p in ("model", _TEXT, "model.language_model")
        ),
        # Qwen's biased projections; Gemma 4's layer scalars (its layers are Gemma 3's otherwise)
        foreign_marks=(
            "model.layers.0.self_attn.q_proj.bias",
            *(f"{p}.layers.0.layer_scalar" for p in ("model", _TEXT, "model.language_model")),
        ),
        library="transformers",
    )
    class_prefixes = CLASS_PREFIXES
    tied_linears = {"lm_head": "model.language_model.embed_tokens.weight"}
    folders = Folders(
        "gemma3",
        release="gemma3-single",
        release_why="Gemma 3, one file in ComfyUI's names with its tokenizer (Comfy-Org's gemma_3_12B_it*.safetensors)",
    )
    plan = PlanPolicy(
        root_stem="gemma3",
        no_gguf_why=(
            "ComfyUI-GGUF's CLIP loader reads only the text architectures of its TXT_ARCH_LIST (t5, t5encoder, "
            "llama, qwen2vl, qwen3, qwen3vl), none of them Gemma 3"
        ),
        plain_weights=(rf"{_PROJECTOR}\.mm_input_projection_weight$",),
        carried=Carried(tensors=(TOKENIZER_TENSOR,)),
        tokenizer=Tokenizer(
            tensor=TOKENIZER_TENSOR,
            files=("tokenizer.model", "../tokenizer/tokenizer.model"),
            gguf_model="llama",
            vocab_tensor=f"{_TEXT}.embed_tokens.weight",
        ),
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the vision tower and its projector, the norms and the layers the recipe keeps "
        "stay in their original precision.",
        kept_tensors="every norm, the token embedding, the SigLIP vision tower and the multimodal projector",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node, "
        "type `ltxv` (or with the LTX-2 text projection in **DualCLIPLoader**; its tokenizer is in the file, as "
        "`spiece_model`)",
    )
    policies = {"gemma3": GEMMA3_POLICY, "gemma3-single": GEMMA3_SINGLE_POLICY}

    # --- recognizing it ------------------------------------------------------------------------------------

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`Gemma3ForConditionalGeneration`'s config for a file that has none, read off the tensor shapes (either
        naming); what they do not say is Gemma 3 12B's (its rope, sliding window of 1024, SigLIP's head size)."""
        if config:
            return dict(config)

        def shape(stored: str) -> tuple[int, ...]:
            name = stored if stored in tensors else self.native_name(stored)
            if name not in tensors:
                raise InputError(
                    f"{where}: no tensor {stored!r} (ComfyUI's {name!r}): not a {self.title} encoder"
                )
            return tuple(tensors[name].shape)

        native = self.naming(tensors) == "native"
        layer = f"{_TEXT}.layers.0"
        vocab, hidden = shape(f"{_TEXT}.embed_tokens.weight")
        head_dim = shape(f"{layer}.self_attn.q_norm.weight")[0]
        text = {
            **copy.deepcopy(_TEXT_DEFAULTS),
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": shape(f"{layer}.mlp.gate_proj.weight")[0],
            "num_hidden_layers": count_blocks(tensors, "model.layers." if native else f"{_TEXT}.layers."),
            "num_attention_heads": shape(f"{layer}.self_attn.q_proj.weight")[0] // head_dim,
            "num_key_value_heads": shape(f"{layer}.self_attn.k_proj.weight")[0] // head_dim,
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,
        }
        width, _, patch, _ = shape(f"{_VISION}.embeddings.patch_embedding.weight")
        positions = shape(f"{_VISION}.embeddings.position_embedding.weight")[0]
        vision = {
            **_VISION_DEFAULTS,
            "hidden_size": width,
            "intermediate_size": shape(f"{_VISION}.encoder.layers.0.mlp.fc1.weight")[0],
            "num_hidden_layers": count_blocks(
                tensors, "vision_model.encoder.layers." if native else f"{_VISION}.encoder.layers."
            ),
            "num_attention_heads": max(1, width // _VISION_HEAD_DIM),
            "patch_size": patch,
            "image_size": math.isqrt(positions) * patch,
        }
        return {
            "architectures": [CLASS],
            "model_type": "gemma3",
            "text_config": text,
            "vision_config": vision,
            "mm_tokens_per_image": 256,
            "boi_token_index": 255_999,
            "eoi_token_index": 256_000,
            "image_token_index": 262_144,
        }


GEMMA3 = Gemma3Family()
