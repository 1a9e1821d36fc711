"""The one table of facts about the formats (`FORMAT_INFO`), plain data: what a recipe check, the card and `inspect`
read without torch, and what `base.Format` reads its options class from."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .options import (
    ComfyFp8Options,
    ComfyInt8Options,
    ComfyMxfp8Options,
    ComfyNvfp4Options,
    ComfyW4a4Options,
    ComfyW4a8Options,
    FormatOptions,
    GgufOptions,
    NoOptions,
)

__all__ = ["FormatInfo", "FORMAT_INFO", "format_info"]


@dataclass(frozen=True)
class FormatInfo:
    """What is known of a format besides its numerics."""

    name: str
    module: str  # the module of this package that defines it
    quant_method: str  # config.json quantization_config.quant_method: how a reader recognizes it
    libraries: tuple[str, ...]  # packages whose numerics it follows (their versions go into the manifest)
    container: str  # how a component's tensors become files (`quantize.containers`)
    names: (
        str  # the role of names its output keys take (`models.ROLES`): "source" (as stored), "native", "gguf"
    )
    words: str  # what the model card calls it
    tag: str  # the Hub tag of its kind (fp8, nf4)
    layout_library: str  # the library whose on-disk layout it is (a Hub tag too)
    diffusers_needs: str | None  # what diffusers' from_pretrained needs to load it; None: it does not
    card_note: str | None = None  # one more sentence for the card's "How to load"
    #: what runs it, as the card's "How to load" shows: loaders (ours), comfyui
    runs_in: tuple[str, ...] = ("loaders",)
    #: its output is laid out as diffusers models (from_pretrained folders), not one file for another runner
    diffusers_layout: bool = True
    #: the class of its per-tensor options (`formats.options`): what a recipe's `type` / `types` may name
    #: (`options.TYPES`; none for a format with one encoding) and what `parts`, `encode` and `decode` take
    options: type[FormatOptions] = NoOptions
    #: it decides itself what kept tensors are stored as (gguf: F32 for all but Linear weights): no `keep_dtype`
    fixes_kept_dtypes: bool = False
    #: how its file holds a text encoder's tokenizer (`models.family.Tokenizer`), for the runtimes that read it
    #: from there: "tensor" (ComfyUI's: the tokenizer file's bytes), "key_values" (GGUF's); None: it does not
    tokenizer: str | None = None
    #: what its bundled recipes are named after the layout (``wan`` + ``comfy-fp8``: ``wan-comfy-fp8``)
    recipe_suffix: str = ""
    #: the type its bundled recipes give every quantized tensor (gguf's Q8_0); None: the format's one encoding
    recipe_type: str | None = None
    #: the thresholds `verify` holds its bundled recipes' tensors to (a recipe's `checks`)
    checks: tuple[tuple[str, float], ...] = ()
    #: it scales each block of a row's inputs, not the row (nf4, MXFP8, NVFP4, GGUF, W4A8), or rotates a row's inputs
    #: in groups before one scale (W4A4's ConvRot spreads an outlier over its group): the layers whose inputs hold
    #: outliers a plain per-row or per-tensor scale spreads over a whole row are quantized too (`Policy.block_targets`)
    block_scaled: bool = False
    #: the type its bundled recipes store a layout's most sensitive layers in (`Policy.sensitive`): NVFP4's MXFP8
    sensitive_type: str | None = None


FORMAT_INFO: dict[str, FormatInfo] = {
    info.name: info
    for info in (
        FormatInfo(
            name="fp8_channel",
            module="fp8_channel",
            quant_method="compressed-tensors",
            libraries=(),
            container="sharded_safetensors",
            names="source",
            words="FP8 (e4m3, one scale per output channel)",
            tag="fp8",
            layout_library="compressed-tensors",
            diffusers_needs=None,
            card_note="The weights are in the compressed-tensors `float-quantized` layout; its decompressor reads them.",
            recipe_suffix="fp8",
            checks=(("min_sqnr_db", 25), ("min_cosine", 0.998)),
        ),
        FormatInfo(
            name="torchao_fp8",
            module="torchao_fp8",
            quant_method="torchao",
            libraries=("torchao",),
            container="sharded_safetensors",
            names="source",
            words="TorchAO Float8 (PerRow weights, dynamic PerRow activations)",
            tag="fp8",
            layout_library="torchao",
            diffusers_needs="torchao",
            recipe_suffix="torchao-fp8",
            checks=(("min_sqnr_db", 25), ("min_cosine", 0.998)),
        ),
        FormatInfo(
            name="nf4",
            module="nf4",
            quant_method="bitsandbytes",
            libraries=("bitsandbytes",),
            container="sharded_safetensors",
            names="source",
            words="NF4 (bitsandbytes 4-bit, blocksize 64, double quantization)",
            tag="nf4",
            layout_library="bitsandbytes",
            diffusers_needs="bitsandbytes (and a GPU: its quantizer refuses to start without one)",
            recipe_suffix="nf4",
            checks=(("min_sqnr_db", 17), ("min_cosine", 0.99)),
            block_scaled=True,
        ),
        FormatInfo(
            name="comfy_fp8",
            module="comfy_fp8",
            quant_method="comfy_fp8",
            libraries=(),
            container="single_safetensors",
            names="native",
            tokenizer="tensor",
            words="ComfyUI FP8 scaled (e4m3, one scale per tensor, `comfy_quant` markers)",
            tag="fp8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyFp8Options,
            recipe_suffix="comfy-fp8",
            checks=(("min_sqnr_db", 20), ("min_cosine", 0.995)),
        ),
        FormatInfo(
            name="comfy_int8",
            module="comfy_int8",
            quant_method="comfy_int8",
            libraries=(),
            container="single_safetensors",
            names="native",
            tokenizer="tensor",
            words="ComfyUI INT8 (one scale per output row, `comfy_quant` markers)",
            tag="int8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyInt8Options,
            recipe_suffix="comfy-int8",
            checks=(("min_sqnr_db", 30), ("min_cosine", 0.999)),
        ),
        FormatInfo(
            name="comfy_nvfp4",
            module="comfy_nvfp4",
            quant_method="comfy_nvfp4",
            libraries=(),
            container="single_safetensors",
            names="native",
            tokenizer="tensor",
            words="ComfyUI NVFP4 (E2M1 values, an E4M3 scale per 16 and one FP32 scale per tensor, `comfy_quant` markers)",
            tag="nvfp4",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyNvfp4Options,
            recipe_suffix="comfy-nvfp4",
            checks=(("min_sqnr_db", 16), ("min_cosine", 0.98)),
            block_scaled=True,
            sensitive_type="mxfp8",
        ),
        FormatInfo(
            name="comfy_mxfp8",
            module="comfy_mxfp8",
            quant_method="comfy_mxfp8",
            libraries=(),
            container="single_safetensors",
            names="native",
            tokenizer="tensor",
            words="ComfyUI MXFP8 (E4M3 values, an E8M0 scale per 32, `comfy_quant` markers)",
            tag="mxfp8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyMxfp8Options,
            recipe_suffix="comfy-mxfp8",
            checks=(("min_sqnr_db", 25), ("min_cosine", 0.998)),
            block_scaled=True,
        ),
        FormatInfo(
            name="comfy_w4a8",
            module="comfy_w4a8",
            quant_method="comfy_w4a8",
            libraries=(),
            container="single_safetensors",
            names="native",
            tokenizer="tensor",
            words="ComfyUI W4A8 (4-bit codes of a 16-level codebook, an FP8 scale per 16 inputs and an FP32 one per "
            "row, ConvRot-rotated; int8 activations, `comfy_quant` markers)",
            tag="w4a8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyW4a8Options,
            recipe_suffix="comfy-w4a8",
            checks=(("min_sqnr_db", 19), ("min_cosine", 0.99)),
            block_scaled=True,
            # no sensitive_type: its bundled recipes are 4-bit throughout (the file the budget compares
            # with NF4's at no more bytes; int8 for a policy's `sensitive` layers, a third of a Wan block's weights
            # in its ffn.2, would make it a quarter larger); `quantize sensitivity --max-size` raises the layers
            # that measure worst to int8 ConvRot instead (`_comfy._RAISED`), within the budget given
        ),
        FormatInfo(
            name="comfy_w4a4",
            module="comfy_w4a4",
            quant_method="comfy_w4a4",
            libraries=(),
            container="single_safetensors",
            names="native",
            tokenizer="tensor",
            words="ComfyUI W4A4 (signed int4 with one FP32 scale per row, ConvRot-rotated; int4 activations, "
            "`comfy_quant` markers)",
            tag="w4a4",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyW4a4Options,
            recipe_suffix="comfy-w4a4",
            # its weights measure 4-6 dB below NVFP4's and W4A8's (16.9 against 22.7 dB on a gaussian): the forward
            # floor 3 dB below the default 20 (the families' examples: 19.5 to 29.6 dB where no family lowers it)
            checks=(("min_sqnr_db", 12), ("min_cosine", 0.97), ("min_forward_sqnr_db", 17)),
            # a 4-bit file for 12-16 GB cards holds the feed-forward's output layer in 4 bits too (about a third of a
            # Wan block): its inputs' outliers are what ConvRot's rotation spreads
            block_scaled=True,
        ),
        FormatInfo(
            name="torchao_int8",
            module="torchao_int8",
            quant_method="torchao",
            libraries=("torchao",),
            container="sharded_safetensors",
            names="source",
            words="TorchAO INT8 (per-row int8 weights, dynamic per-row int8 activations)",
            tag="int8",
            layout_library="torchao",
            diffusers_needs="torchao",
            recipe_suffix="torchao-int8",
            checks=(("min_sqnr_db", 25), ("min_cosine", 0.998)),
        ),
        FormatInfo(
            name="gguf",
            module="gguf",
            quant_method="gguf",
            libraries=("gguf",),
            container="gguf_file",
            names="gguf",
            tokenizer="key_values",
            words="GGUF (GGML block types, one file per model)",
            tag="gguf",
            layout_library="gguf",
            diffusers_needs=None,
            runs_in=("comfyui-gguf", "diffusers-gguf", "loaders"),
            diffusers_layout=False,
            options=GgufOptions,
            fixes_kept_dtypes=True,
            recipe_suffix="gguf-q8_0",
            recipe_type="Q8_0",
            checks=(("min_sqnr_db", 35), ("min_cosine", 0.9995)),
            block_scaled=True,
        ),
    )
}


def format_info(name: str) -> FormatInfo:
    """The table row of format `name`; the error lists the known names."""
    try:
        return FORMAT_INFO[name]
    except KeyError:
        raise InputError(f"unknown format {name!r} (known: {', '.join(sorted(FORMAT_INFO))})") from None
