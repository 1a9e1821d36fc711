"""Qwen3-VL's text model alone (transformers' `Qwen3VLTextModel`: the language model of
`Qwen3VLForConditionalGeneration` without its vision tower or output head, 7.6B parameters in the 8B; a source users
hold for Qwen-Image 2.1's text encoder): everything the tool knows of it.

Layout (`QWEN3VL_TEXT.layouts`): ``qwen3vl-text``: a pipeline's ``text_encoder/`` or such a folder itself
(config.json ``architectures: ["Qwen3VLTextModel"]``, model_type ``qwen3_vl_text``: what
``Qwen3VLForConditionalGeneration(...).model.language_model.save_pretrained`` writes), in the names the class holds
and saves (``layers.N``, ``embed_tokens``, ``norm``: no prefix, no tower, no head).

Names: `NAMES` maps them to the whole Qwen3-VL's (``model.language_model.``, as its checkpoints and ComfyUI's file
hold them), but no runtime reads a file of them there: ComfyUI's formats are refused at plan time
(`qwen3vl.NO_COMFYUI_TEXT`: CLIPLoader tells a Qwen3-VL only by its tower), and GGUF for Qwen3-VL's reason
(`qwen3vl.NO_GGUF`). transformers' own formats (fp8_channel, torchao's, nf4) are written in the class's names.

What stays high-precision, and why (the bundled recipes say it too): the token embedding (151936 x 4096 in the 8B:
a lookup table, 0.62B parameters, where a quantization error reaches every token) and every norm (the attention's q
and k norms too); every Linear of the 36 layers is quantized.

>>> QWEN3VL_TEXT.native_name("layers.3.self_attn.k_norm.weight")
'model.language_model.layers.3.self_attn.k_norm.weight'
>>> QWEN3VL_TEXT.native_name("embed_tokens.weight")
'model.language_model.embed_tokens.weight'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .encoder import TextEncoder, complete_blocks, own_config, token_inputs
from .family import CardWords, Detection, Folders, ModelInputs, PlanPolicy
from .names import BlockNames, Blocks
from .policy import Policy
from .qwen3vl import LAYER, LAYER_QUANTIZED, NO_COMFYUI_TEXT, NO_GGUF
from .qwen25vl import LAYER_CHECKS, layer_targets

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = ["QWEN3VL_TEXT", "Qwen3VLTextFamily", "NAMES", "CLASS"]

CLASS = "Qwen3VLTextModel"
_LANGUAGE_MODEL = "model.language_model"

# --- names -------------------------------------------------------------------------------------------------

#: the class's names -> the whole Qwen3-VL's (its language model is ``model.language_model.``)
NAMES = BlockNames(
    root_modules={m: f"{_LANGUAGE_MODEL}.{m}" for m in ("embed_tokens", "norm")},
    root_tensors={},
    blocks=(Blocks("layers", f"{_LANGUAGE_MODEL}.layers", modules={m: m for m in LAYER}),),
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

QWEN3VL_TEXT_POLICY = Policy(
    what=f"Qwen3-VL's text model alone ({CLASS}: Qwen-Image 2.1's text encoder without its vision tower) in "
    "transformers' layout (a pipeline's text_encoder/, or that folder itself: layers.N, no vision tower, no output "
    "head)",
    components=("text_encoder",),
    targets=layer_targets("layers"),
    quantized=f"every Linear of the 36 layers {LAYER_QUANTIZED}",
    kept="the token embedding (embed_tokens: 151936 x 4096 in the 8B, 0.62B parameters, a lookup table where a "
    "quantization error reaches every token) and every norm",
    checks=LAYER_CHECKS,
    copy_other_files=False,
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(lambda config: config["vocab_size"], use_cache=False)


class Qwen3VLTextFamily(TextEncoder):
    name = "qwen3vl-text"
    title = "Qwen3-VL text model"
    names = NAMES
    detection = Detection(
        CLASS,
        # Qwen3's per-head q norm on an unbiased q projection, by the class's names (Gemma's has it too, with its
        # four layer norms, Gemma 3's family asked first; Qwen2.5's q projection has a bias and no norm)
        diffusers_marks=("layers.0.self_attn.q_norm.",),
        foreign_marks=("layers.0.pre_feedforward_layernorm.", "layers.0.self_attn.q_proj.bias"),
        library="transformers",
    )
    folders = Folders("qwen3vl-text")
    plan = PlanPolicy(
        root_stem="qwen3vl_text", no_gguf_why=NO_GGUF, unread_by=("comfyui",), unread_why=NO_COMFYUI_TEXT
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the norms and the layers the recipe keeps stay in their original precision.",
        kept_tensors="every norm and the token embedding",
    )
    policies = {"qwen3vl-text": QWEN3VL_TEXT_POLICY}

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """The folder's own config (`encoder.own_config`), all of whose layers the folder must hold
        (`encoder.complete_blocks`)."""
        config = own_config(self, config, where)
        complete_blocks(self, tensors, where, {"layers": config.get("num_hidden_layers") or 0})
        return config


QWEN3VL_TEXT = Qwen3VLTextFamily()
