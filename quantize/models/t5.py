"""T5's encoder (transformers' `T5EncoderModel`; HunyuanVideo 1.5's byT5, Glyph-SDXL-v2's byt5-small with its
color and font tokens, is a diffusers pipeline's ``text_encoder_2/``): everything the tool knows of it.

umT5 is T5 with a relative attention bias in every block (`umt5`); T5 has one, in block 0, shared by the others.
Everything else is umT5's (`UMT5Family`, whose tables this family reads): transformers' names, which ComfyUI's
T5 (``comfy/text_encoders/t5.py``, the byT5 of CLIPLoader's ``hunyuan_video_15`` and ``hunyuan_image`` types, told
by block 0's ``k`` of 384 rows) holds as they are, and llama.cpp's ``t5encoder`` names in a GGUF file, which
ComfyUI-GGUF's CLIP loader maps back (its T5 key map).

Layouts (`T5.layouts`): ``t5``: a pipeline's ``text_encoder_2/`` (diffusers' HunyuanVideo 1.5, whose byT5 it is) or
such a folder itself (config.json ``architectures: ["T5EncoderModel"]``); ``t5-single``: one safetensors file in
those names, no config.json (Comfy-Org's ``byt5_small_glyphxl_fp16.safetensors``).

Formats: transformers' (`from_pretrained`) and GGUF, which ComfyUI-GGUF's DualCLIPLoader (GGUF) reads beside the
Qwen2.5-VL file. ComfyUI's own are refused at plan time (`PlanPolicy.unread_by`): ComfyUI takes the quantization
of a hunyuan_video_15 pair from its Qwen2.5-VL file alone, and reads a quantized byT5's weights without their scales.

The tokenizer: ComfyUI bundles byT5's (and T5's); a byte-level tokenizer has no pieces for ``tokenizer.ggml``: the
files hold none.

What stays high-precision, and why (the bundled recipes say it too): the shared embedding (a lookup table: byT5's
1510 byte and glyph tokens, T5-XXL's 32128), block 0's relative attention bias and the layer norms; every Linear of
the blocks is quantized.

>>> T5.native_name("encoder.block.3.layer.1.DenseReluDense.wo.weight")
'encoder.block.3.layer.1.DenseReluDense.wo.weight'
>>> T5.plan.gguf_names.native("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
'enc.blk.0.attn_rel_b.weight'
"""

from __future__ import annotations

from dataclasses import replace

from .family import CardWords, Detection, Folders, PlanPolicy
from .policy import Policy
from .umt5 import GGUF_NAMES, QUANTIZED, TARGETS, UMT5Family, nf4_without_wo

__all__ = ["T5", "T5Family", "CLASS"]

CLASS = "T5EncoderModel"

_ATTENTION = "layer.0.SelfAttention"


# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

_KEPT = (
    "the shared embedding (shared: a lookup table of every token's vector, byT5's 1510 byte, color and font tokens, "
    "where a quantization error reaches every token), block 0's relative attention bias (32 buckets x heads: plain "
    "parameters, added to every block's attention scores) and the layer norms"
)
_EXCEPTIONS = {"nf4": nf4_without_wo(CLASS)}
#: 4-bit weights compound through the blocks: the output's floor
_CHECKS = {"nf4": {"min_forward_sqnr_db": 15}}

T5_POLICY = Policy(
    what=f"T5 encoder ({CLASS}: HunyuanVideo 1.5's byT5, a diffusers pipeline's text_encoder_2/) in transformers' "
    "layout (the pipeline, or that folder itself)",
    components=("text_encoder_2",),
    targets=TARGETS,
    quantized=QUANTIZED,
    kept=_KEPT,
    exceptions=_EXCEPTIONS,
    checks=_CHECKS,
    copy_other_files=False,
)
T5_SINGLE_POLICY = replace(
    T5_POLICY,
    what="T5 encoder as one file given as SOURCE itself, in ComfyUI's names (Comfy-Org's byt5_small_glyphxl_fp16.safetensors, "
    "transformers' own)",
    components=(".",),
    note=f"A transformers-layout output of it is model.safetensors in transformers' names with the {CLASS} config.json "
    "read off its shapes (gated GELU, 128 as the relative attention's max distance, an epsilon of 1e-6: byT5's and "
    "T5 v1.1's).",
)


class T5Family(UMT5Family):
    name = "t5"
    title = "T5 encoder"
    model_type = "t5"
    aliases = None  # Wan's T5 names are its umT5's
    detection = Detection(
        CLASS,
        diffusers_marks=(f"encoder.block.0.{_ATTENTION}.",),
        # umT5's: a relative attention bias in a block past the first
        foreign_marks=(f"encoder.block.1.{_ATTENTION}.relative_attention_bias.",),
        library="transformers",
    )
    folders = Folders(
        "t5",
        release="t5-single",
        release_why="T5 encoder, one file in ComfyUI's names (Comfy-Org's byt5_small_glyphxl_fp16.safetensors)",
        encoder="text_encoder_2",
    )
    plan = PlanPolicy(
        root_stem="t5",
        gguf_architecture="t5encoder",
        gguf_names=GGUF_NAMES,
        plain_weights=(rf"encoder\.block\.\d+\.{_ATTENTION}\.relative_attention_bias\.",),
        unread_by=("comfyui",),
        unread_why=(
            "ComfyUI reads a byT5 only as the second file of its hunyuan_video_15 and hunyuan_image loaders, which "
            "take the quantization of the first (Qwen2.5-VL) file alone and would read a quantized byT5's weights "
            "without their scales (measured: -3 dB)"
        ),
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The shared embedding, the relative attention bias, the norms and the layers the recipe keeps stay in "
        "their original precision.",
        kept_tensors="every norm, the shared embedding and the relative attention bias",
        comfyui_gguf="put the file in `ComfyUI/models/text_encoders/` and load it as the second file of the "
        "**DualCLIPLoader (GGUF)** node (type `hunyuan_video_15`); ComfyUI bundles byT5's tokenizer",
    )
    policies = {"t5": T5_POLICY, "t5-single": T5_SINGLE_POLICY}


T5 = T5Family()
