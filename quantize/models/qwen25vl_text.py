"""Qwen2.5-VL's text model alone (transformers' `Qwen2_5_VLTextModel`: the text encoder of a diffusers HunyuanVideo
1.5 pipeline, 7.1B parameters in the 7B): everything the tool knows of it.

Layout (`QWEN25VL_TEXT.layouts`): ``qwen25vl-text``: a pipeline's ``text_encoder/`` (diffusers' HunyuanVideo 1.5
pipeline, whose conversion script saves Qwen2.5-VL-7B-Instruct's ``language_model`` alone) or such a folder itself
(config.json ``architectures: ["Qwen2_5_VLTextModel"]``), in the names the class holds and saves (``layers.N``,
``embed_tokens``, ``norm``: no prefix, no vision tower, no output head).

Names: ComfyUI's Qwen2.5-VL (``comfy/text_encoders/llama.py`` `Qwen25_7BVLI`, read by CLIPLoader type ``qwen_image``
and DualCLIPLoader type ``hunyuan_video_15``) holds the language model as ``model.`` (`NAMES`); a file of the text
model alone lacks the tower's ``visual.`` keys, which only image prompts run. A GGUF file holds llama.cpp's
``qwen2vl`` names (`GGUF_NAMES`: ``blk.N.attn_q``, ``token_embd``, ``output_norm``), which ComfyUI-GGUF's CLIP loader
maps back (its ``LLAMA_SD_MAP``); its ``qwen2vl.*`` hyperparameters are llama.cpp's converter's
(`qwen25vl.text_key_values`). ComfyUI and ComfyUI-GGUF bundle Qwen2.5's tokenizer: neither file holds one.

What stays high-precision, and why (the bundled recipes say it too): the token embedding (152064 x 3584 in the 7B:
a lookup table, 0.55B parameters, where a quantization error reaches every token) and every norm; every Linear of the
28 layers is quantized (their q, k and v biases kept).

>>> QWEN25VL_TEXT.native_name("layers.3.self_attn.k_proj.bias")
'model.layers.3.self_attn.k_proj.bias'
>>> QWEN25VL_TEXT.plan.gguf_names.native("layers.3.self_attn.o_proj.weight")
'blk.3.attn_output.weight'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .encoder import TextEncoder, own_config, token_inputs
from .family import (
    CardWords,
    Detection,
    Folders,
    ModelInputs,
    PlanPolicy,
)
from .names import BlockNames, Blocks
from .policy import Policy
from .qwen25vl import LAYER_CHECKS, LAYER_GGUF, LAYER_QUANTIZED, layer_targets, text_key_values

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = ["QWEN25VL_TEXT", "Qwen25VLTextFamily", "NAMES", "GGUF_NAMES", "CLASS"]

CLASS = "Qwen2_5_VLTextModel"

# --- names -------------------------------------------------------------------------------------------------

_ROOT = {"embed_tokens": "token_embd", "norm": "output_norm"}

#: the class's names -> ComfyUI's (its language model is ``model.``, as in Qwen2.5-VL's own checkpoints)
NAMES = BlockNames(
    root_modules={m: f"model.{m}" for m in _ROOT},
    root_tensors={},
    blocks=(Blocks("layers", "model.layers", modules={m: m for m in LAYER_GGUF}),),
)
#: the class's names -> llama.cpp's ``qwen2vl`` names, what a GGUF file holds
GGUF_NAMES = BlockNames(
    root_modules=_ROOT, root_tensors={}, blocks=(Blocks("layers", "blk", modules=LAYER_GGUF),)
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

QWEN25VL_TEXT_POLICY = Policy(
    what=f"Qwen2.5-VL's text model alone ({CLASS}: a diffusers HunyuanVideo 1.5 pipeline's text encoder) in "
    "transformers' layout (a pipeline's text_encoder/, or that folder itself: layers.N, no vision tower, no output "
    "head)",
    components=("text_encoder",),
    targets=layer_targets("layers"),
    quantized=f"every Linear of the 28 layers {LAYER_QUANTIZED}",
    kept="the token embedding (embed_tokens: 152064 x 3584 in the 7B, 0.55B parameters, a lookup table where a "
    "quantization error reaches every token) and every norm",
    checks=LAYER_CHECKS,
    copy_other_files=False,
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(lambda config: config["vocab_size"], use_cache=False)


class Qwen25VLTextFamily(TextEncoder):
    name = "qwen25vl-text"
    title = "Qwen2.5-VL text model"
    names = NAMES
    detection = Detection(
        CLASS,
        # Qwen's biased q projection, by the class's names or ComfyUI's (Gemma's has no bias; a file of the whole
        # Qwen2.5-VL, its tower's fused qkv beside it, is that family's, asked first)
        native_marks=("model.layers.0.self_attn.q_proj.bias",),
        diffusers_marks=("layers.0.self_attn.q_proj.bias",),
        library="transformers",
    )
    folders = Folders("qwen25vl-text")
    plan = PlanPolicy(root_stem="qwen25vl_text", gguf_architecture="qwen2vl", gguf_names=GGUF_NAMES)
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the norms and the layers the recipe keeps stay in their original precision.",
        kept_tensors="every norm and bias and the token embedding",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it as the first file of "
        "**DualCLIPLoader** (type `hunyuan_video_15`, byT5 the second) or with **Load CLIP** (type `qwen_image`); "
        "ComfyUI bundles its tokenizer, and it has no vision tower (text prompts only)",
        comfyui_gguf="put the file in `ComfyUI/models/text_encoders/` and load it with the **DualCLIPLoader (GGUF)** "
        "node (type `hunyuan_video_15`) or **CLIPLoader (GGUF)** (type `qwen_image`); ComfyUI bundles its "
        "tokenizer, and no mmproj file is needed for text prompts",
    )
    policies = {"qwen25vl-text": QWEN25VL_TEXT_POLICY}

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """The folder's own config (`encoder.own_config`)."""
        return own_config(self, config, where)

    def gguf_key_values(
        self, config: dict, tensors: Mapping[str, TensorInfo]
    ) -> dict[str, str | int | float | tuple[int, ...]]:
        return text_key_values(self.plan.gguf_architecture, config)


QWEN25VL_TEXT = Qwen25VLTextFamily()
