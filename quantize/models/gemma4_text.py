"""Gemma 4's text model alone (transformers' `Gemma4TextModel`: the language model of `Gemma4ForConditionalGeneration`,
Gemma 4 E2B's, E4B's or 31B's, without its vision and audio towers or its output head): everything the tool knows
of it.

Layout (`GEMMA4_TEXT.layouts`): ``gemma4-text``: a pipeline's ``text_encoder/`` or such a folder itself
(config.json ``architectures: ["Gemma4TextModel"]``, model_type ``gemma4_text``: what
``Gemma4ForConditionalGeneration(...).model.language_model.save_pretrained`` writes), in the names the class holds
and saves (``layers.N``, ``embed_tokens``, ``norm``, the per-layer embeddings: no prefix).

Names: ComfyUI's Gemma 4 (``comfy/text_encoders/gemma4.py`` `Gemma4Transformer`, which CLIPLoader picks by its
layer count: 35 layers E2B, 42 E4B, 60 31B) holds the language model as ``model.`` (`NAMES`); a file of the text
model alone lacks the towers' keys, which only image and audio prompts run. Its tokenizer is the file's
``tokenizer_json`` tensor, tokenizers' ``tokenizer.json`` from the pipeline's ``tokenizer/`` (or the folder's own),
as Gemma 4 12B's (`gemma4`).

What is Gemma 4's own, and how it is kept: each layer's ``layer_scalar`` is carried as stored; the global layers'
heads are their own size; the last layers of E2B and E4B share the keys and values of earlier ones and have no
k_proj, v_proj or k_norm (a recipe's targets match the projections a layer has); the per-layer embeddings (PLE:
``embed_tokens_per_layer``, a table of every token's vector for every layer, 262144 x 10752 in E4B, and the small
projections that feed it into each layer) stay high-precision; a mixture-of-experts layer's experts (26B-A4B:
3-D tensors no runtime here quantizes as Linear layers, and ComfyUI has no such Gemma 4) are kept too.

GGUF: refused at plan time, for Gemma 4's reason: ComfyUI-GGUF's CLIP loader has no Gemma 4.

What stays high-precision, and why (the bundled recipes say it too): the token embedding and the per-layer
embeddings (lookup tables, where a quantization error reaches every token), the per-layer input projections and
gates (under 1% of a layer's weights, adding each token's own signal to every layer), the experts of an MoE layer,
the layer scalars and every norm; every attention and MLP Linear of the layers is quantized.

>>> GEMMA4_TEXT.native_name("layers.3.self_attn.q_norm.weight")
'model.layers.3.self_attn.q_norm.weight'
>>> GEMMA4_TEXT.native_name("embed_tokens_per_layer.weight")
'model.embed_tokens_per_layer.weight'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .encoder import TextEncoder, own_config, token_inputs
from .family import CardWords, Carried, Detection, Folders, ModelInputs, PlanPolicy, SourceLayout
from .gemma3 import layer_targets
from .gemma4 import GEMMA4, LAYER, LAYER_CHECKS, LAYER_QUANTIZED, LAYER_TENSORS, TOKENIZER_TENSOR, check_found
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    from ..read.checkpoint import Component, TensorInfo

__all__ = ["GEMMA4_TEXT", "Gemma4TextFamily", "NAMES", "CLASS"]

CLASS = "Gemma4TextModel"

# --- names -------------------------------------------------------------------------------------------------

#: a layer's per-layer-embedding modules (E2B's and E4B's), as the class and ComfyUI name them
_PER_LAYER = ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")
_PER_LAYER_ROOT = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")

#: the class's names -> ComfyUI's (its language model is ``model.``); the tokenizer keeps its name
NAMES = BlockNames(
    root_modules={m: f"model.{m}" for m in ("embed_tokens", "norm", *_PER_LAYER_ROOT)},
    root_tensors={TOKENIZER_TENSOR: TOKENIZER_TENSOR},
    blocks=(
        Blocks(
            "layers", "model.layers", modules={m: m for m in (*LAYER, *_PER_LAYER)}, tensors=LAYER_TENSORS
        ),
    ),
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

GEMMA4_TEXT_POLICY = Policy(
    what=f"Gemma 4's text model alone ({CLASS}, E2B's, E4B's or 31B's language model) in transformers' layout (a "
    "pipeline's text_encoder/, or that folder itself: layers.N, no towers, no output head)",
    components=("text_encoder",),
    targets=layer_targets("layers"),
    quantized=LAYER_QUANTIZED,
    kept="the token embedding and the per-layer embeddings (embed_tokens, embed_tokens_per_layer: lookup tables "
    "of every token's vector, where a quantization error reaches every token), the per-layer input projections "
    "and gates (under 1% of a layer's weights, adding each token's own signal to every layer), a mixture-of-"
    "experts layer's router and experts (3-D expert weights no runtime here quantizes as Linear layers), each "
    "layer's layer_scalar and every norm",
    checks=LAYER_CHECKS,
    copy_other_files=False,
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(lambda config: config["vocab_size"], use_cache=False)


class Gemma4TextFamily(TextEncoder):
    name = "gemma4-text"
    title = "Gemma 4 text model"
    names = NAMES
    detection = Detection(
        CLASS,
        # ComfyUI's names (asked after Gemma 4 12B's: a ComfyUI file with the 12B's embedders is that family's),
        # or the class's own
        native_marks=("model.layers.0.",),
        diffusers_marks=("layers.0.",),
        # every Gemma 4 layer's scalar (Gemma 3's and Qwen's layers have none)
        own_marks=("layers.0.layer_scalar", "model.layers.0.layer_scalar"),
        # a whole multimodal Gemma 4's language model, towers, embedders and projections
        foreign_marks=(
            "model.language_model.",
            "language_model.",
            "vision_model.",
            "model.vision_embedder.",
            "model.embed_vision.",
            "model.vision_tower.",
            "audio_model.",
            "multi_modal_projector.",
            "audio_projector.",
        ),
        library="transformers",
    )
    folders = Folders("gemma4-text")
    plan = PlanPolicy(
        root_stem="gemma4_text",
        no_gguf_why=GEMMA4.plan.no_gguf_why,
        carried=Carried(tensors=(TOKENIZER_TENSOR,)),
        # Gemma 4's tokenizer, where Gemma 4's is looked for; its vocabulary is the class's embedding
        tokenizer=dataclasses.replace(GEMMA4.plan.tokenizer, vocab_tensor="embed_tokens.weight"),
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token and per-layer embeddings, the per-layer projections, the layer scalars, the norms and the "
        "layers the recipe keeps stay in their original precision.",
        kept_tensors="every norm and layer scalar, the token and per-layer embeddings and the per-layer projections",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node "
        "(its tokenizer is in the file, as `tokenizer_json`); it has no vision or audio tower (text prompts only)",
    )
    policies = {"gemma4-text": GEMMA4_TEXT_POLICY}

    # --- recognizing it ------------------------------------------------------------------------------------

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """A text encoder's layouts (`TextEncoder.layouts`), of a model whose layers are whole (`check_found`)."""
        return check_found(self, super().layouts(folder, open_, registered), open_, "")

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """The folder's own config (`encoder.own_config`)."""
        return own_config(self, config, where)


GEMMA4_TEXT = Gemma4TextFamily()
