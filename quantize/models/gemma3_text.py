"""Gemma 3's text model alone (transformers' `Gemma3TextModel`: the language model of `Gemma3ForConditionalGeneration`
without the SigLIP tower, the projector or the output head; a source users hold for LTX-2's text encoder):
everything the tool knows of it.

Layout (`GEMMA3_TEXT.layouts`): ``gemma3-text``: a pipeline's ``text_encoder/`` or such a folder itself (config.json
``architectures: ["Gemma3TextModel"]``, model_type ``gemma3_text``: what
``Gemma3ForConditionalGeneration(...).model.language_model.save_pretrained`` writes), in the names the class holds
and saves (``layers.N``, ``embed_tokens``, ``norm``: no prefix).

Names: ComfyUI's Gemma 3 (``comfy/text_encoders/llama.py`` `Gemma3_12B`, which CLIPLoader type ``ltxv`` picks by
``model.layers.47.self_attn.q_norm.weight``) holds the language model as ``model.`` (`NAMES`); a file of the text
model alone lacks the tower's ``vision_model.`` keys, which only image prompts run (LTX-2 gives none). Its tokenizer
is the file's ``spiece_model`` tensor, made from the pipeline's ``tokenizer/tokenizer.model`` (or the folder's own
``tokenizer.model``), as Gemma 3's (`gemma3`).

GGUF: refused at plan time, for Gemma 3's reason: ComfyUI-GGUF's CLIP loader has no Gemma 3.

What stays high-precision, and why (the bundled recipes say it too): the token embedding (262208 x 3840 in the 12B:
a lookup table, 1.0B parameters, where a quantization error reaches every token) and every norm (Gemma's RMSNorms
scale by 1 + weight); every Linear of the 48 layers is quantized.

>>> GEMMA3_TEXT.native_name("layers.3.self_attn.q_norm.weight")
'model.layers.3.self_attn.q_norm.weight'
>>> GEMMA3_TEXT.native_name("embed_tokens.weight")
'model.embed_tokens.weight'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .encoder import TextEncoder, own_config, token_inputs
from .family import CardWords, Carried, Detection, Folders, ModelInputs, PlanPolicy
from .gemma3 import GEMMA3, LAYER, LAYER_CHECKS, LAYER_QUANTIZED, TOKENIZER_TENSOR, layer_targets
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = ["GEMMA3_TEXT", "Gemma3TextFamily", "NAMES", "CLASS"]

CLASS = "Gemma3TextModel"

# --- names -------------------------------------------------------------------------------------------------

#: the class's names -> ComfyUI's (its language model is ``model.``, as in Comfy-Org's Gemma 3 file); the tokenizer
#: keeps its name
NAMES = BlockNames(
    root_modules={"embed_tokens": "model.embed_tokens", "norm": "model.norm"},
    root_tensors={TOKENIZER_TENSOR: TOKENIZER_TENSOR},
    blocks=(Blocks("layers", "model.layers", modules={m: m for m in LAYER}),),
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

GEMMA3_TEXT_POLICY = Policy(
    what=f"Gemma 3's text model alone ({CLASS}, LTX-2's text encoder without the vision tower) in transformers' "
    "layout (a pipeline's text_encoder/, or that folder itself: layers.N, no vision tower, no output head)",
    components=("text_encoder",),
    targets=layer_targets("layers"),
    quantized=LAYER_QUANTIZED,
    kept="the token embedding (embed_tokens: a lookup table of every token's vector, 262208 x 3840 in the 12B, "
    "where a quantization error reaches every token) and every norm (Gemma's RMSNorms scale by 1 + weight)",
    checks=LAYER_CHECKS,
    copy_other_files=False,
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(lambda config: config["vocab_size"], use_cache=False)


class Gemma3TextFamily(TextEncoder):
    name = "gemma3-text"
    title = "Gemma 3 text model"
    names = NAMES
    detection = Detection(
        CLASS,
        # ComfyUI's names, as the whole Gemma 3's (asked first: a file of ComfyUI's names is that family's), or the
        # class's own
        native_marks=("model.layers.0.",),
        diffusers_marks=("layers.0.",),
        # Gemma's four layer norms (Qwen's language models have two)
        own_marks=tuple(f"{p}layers.0.pre_feedforward_layernorm." for p in ("", "model.")),
        # Qwen's biased projections; Gemma 4's layer scalars; the whole Gemma 3's tower and language model
        foreign_marks=(
            "layers.0.self_attn.q_proj.bias",
            "model.layers.0.self_attn.q_proj.bias",
            "layers.0.layer_scalar",
            "model.layers.0.layer_scalar",
            "language_model.",
            "model.language_model.",
            "vision_tower.",
            "vision_model.",
        ),
        library="transformers",
    )
    folders = Folders("gemma3-text")
    plan = PlanPolicy(
        root_stem="gemma3_text",
        no_gguf_why=GEMMA3.plan.no_gguf_why,
        carried=Carried(tensors=(TOKENIZER_TENSOR,)),
        # Gemma 3's tokenizer, where Gemma 3's is looked for; its vocabulary is the class's embedding
        tokenizer=dataclasses.replace(GEMMA3.plan.tokenizer, vocab_tensor="embed_tokens.weight"),
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the norms and the layers the recipe keeps stay in their original precision.",
        kept_tensors="every norm and the token embedding",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node, "
        "type `ltxv` (or with the LTX-2 text projection in **DualCLIPLoader**; its tokenizer is in the file, as "
        "`spiece_model`); it has no vision tower (text prompts only)",
    )
    policies = {"gemma3-text": GEMMA3_TEXT_POLICY}

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """The folder's own config (`encoder.own_config`)."""
        return own_config(self, config, where)


GEMMA3_TEXT = Gemma3TextFamily()
