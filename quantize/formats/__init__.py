"""The on-disk formats, each defined once, and the one table of facts about them.

A format's module defines one `Format` subclass (`base`: every hook declared there, with its default)
and its one instance ``FORMAT``: its numerics and part names (`parts`, `encode`, `decode`) and how it declares
itself (`quantization_config`, `checkpoint_metadata`); everything else about it (the library whose
layout it is, how the card names it, which container holds it, which names its keys follow, the class of its
per-tensor options) is a row of `FORMAT_INFO`. That table is plain data: reading it (a recipe check, the
card, `inspect`) imports no torch; the module is imported on first `get_format`.

>>> get_format("fp8_channel").NAME, format_info("nf4").container
('fp8_channel', 'sharded_safetensors')
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..errors import InputError
from ..names import part_key
from .base import Format, NonFiniteWeightError, PartSpec, UnsupportedShapeError
from .options import (
    KEPT,
    NO_OPTIONS,
    ComfyFp8Options,
    ComfyInt8Options,
    ComfyMxfp8Options,
    ComfyNvfp4Options,
    ComfyOptions,
    FormatOptions,
    GgufOptions,
    NoOptions,
)

__all__ = [
    "FORMATS",
    "FORMAT_INFO",
    "FormatInfo",
    "format_info",
    "get_format",
    "format_of_config",
    "quantized_parts",
    "Format",
    "FormatOptions",
    "NoOptions",
    "NO_OPTIONS",
    "GgufOptions",
    "ComfyOptions",
    "KEPT",
    "format_for",
    "PartSpec",
    "NonFiniteWeightError",
    "UnsupportedShapeError",
    "part_key",
]


@dataclass(frozen=True)
class FormatInfo:
    """What is known of a format besides its numerics."""

    name: str
    module: str  # the module of this package that defines it
    quant_method: str  # config.json quantization_config.quant_method: how a reader recognizes it
    libraries: tuple[str, ...]  # packages whose numerics it follows (their versions go into the manifest)
    container: str  # how a component's tensors become files (`quantize.containers`)
    names: str  # the role of names its output keys take (`models.ROLES`): "source" (as stored), "native"
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
        ),
        FormatInfo(
            name="comfy_fp8",
            module="comfy_fp8",
            quant_method="comfy_fp8",
            libraries=(),
            container="single_safetensors",
            names="native",
            words="ComfyUI FP8 scaled (e4m3, one scale per tensor, `comfy_quant` markers)",
            tag="fp8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyFp8Options,
        ),
        FormatInfo(
            name="comfy_int8",
            module="comfy_int8",
            quant_method="comfy_int8",
            libraries=(),
            container="single_safetensors",
            names="native",
            words="ComfyUI INT8 (one scale per output row, `comfy_quant` markers)",
            tag="int8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyInt8Options,
        ),
        FormatInfo(
            name="comfy_nvfp4",
            module="comfy_nvfp4",
            quant_method="comfy_nvfp4",
            libraries=(),
            container="single_safetensors",
            names="native",
            words="ComfyUI NVFP4 (E2M1 values, an E4M3 scale per 16 and one FP32 scale per tensor, `comfy_quant` markers)",
            tag="nvfp4",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyNvfp4Options,
        ),
        FormatInfo(
            name="comfy_mxfp8",
            module="comfy_mxfp8",
            quant_method="comfy_mxfp8",
            libraries=(),
            container="single_safetensors",
            names="native",
            words="ComfyUI MXFP8 (E4M3 values, an E8M0 scale per 32, `comfy_quant` markers)",
            tag="mxfp8",
            layout_library="comfyui",
            diffusers_needs=None,
            runs_in=("comfyui", "loaders"),
            diffusers_layout=False,
            options=ComfyMxfp8Options,
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
        ),
        FormatInfo(
            name="gguf",
            module="gguf",
            quant_method="gguf",
            libraries=("gguf",),
            container="gguf_file",
            names="native",
            words="GGUF (GGML block types, one file per model)",
            tag="gguf",
            layout_library="gguf",
            diffusers_needs=None,
            runs_in=("comfyui-gguf", "diffusers-gguf", "loaders"),
            diffusers_layout=False,
            options=GgufOptions,
            fixes_kept_dtypes=True,
        ),
    )
}


def format_info(name: str) -> FormatInfo:
    """The table row of format `name`; the error lists the known names."""
    try:
        return FORMAT_INFO[name]
    except KeyError:
        raise InputError(f"unknown format {name!r} (known: {', '.join(sorted(FORMAT_INFO))})") from None


class _Formats(Mapping[str, Format]):
    """Name -> the format's one instance (its module's ``FORMAT``), each module imported when first looked up:
    the names alone (what a recipe is checked against) come without importing torch."""

    def __getitem__(self, name: str) -> Format:
        module = importlib.import_module(f"{__name__}.{FORMAT_INFO[name].module}")
        fmt = module.FORMAT
        if not isinstance(fmt, Format) or fmt.NAME != name or not isinstance(fmt.ROW_SEPARABLE, bool):
            raise TypeError(f"{module.__name__}.FORMAT must be the Format instance named {name!r}")
        return fmt

    def __contains__(self, name: object) -> bool:
        return name in FORMAT_INFO

    def __iter__(self) -> Iterator[str]:
        return iter(FORMAT_INFO)

    def __len__(self) -> int:
        return len(FORMAT_INFO)


FORMATS: Mapping[str, Format] = _Formats()


def get_format(name: str) -> Format:
    """The format registered under `name` (its module's ``FORMAT``); the error lists the known names."""
    return FORMATS[format_info(name).name]


def format_of_config(quantization_config: dict, where: str) -> Format:
    """The format whose `quantization_config` this is (config.json of a converted checkpoint, at `where`)."""
    method = quantization_config.get("quant_method") if isinstance(quantization_config, dict) else None
    candidates = [get_format(i.name) for i in FORMAT_INFO.values() if i.quant_method == method]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        known = ", ".join(f"{i.quant_method} ({i.name})" for i in FORMAT_INFO.values())
        raise InputError(f"{where}: quantization_config.quant_method is {method!r}; known: {known}")

    # formats sharing a quant_method (torchao's) are told apart by the config class of quant_type["default"]
    def config_type(config: object) -> object:
        default = config.get("quant_type") if isinstance(config, dict) else None
        default = default.get("default") if isinstance(default, dict) else None
        return default.get("_type") if isinstance(default, dict) else None

    kind = config_type(quantization_config)
    for fmt in candidates:
        if config_type(fmt.quantization_config([])) == kind:
            return fmt
    known = ", ".join(f"{config_type(f.quantization_config([]))} ({f.NAME})" for f in candidates)
    raise InputError(
        f"{where}: quantization_config.quant_type.default._type is {kind!r} for quant_method {method!r}; "
        f"known: {known}"
    )


def format_for(fmt: Format, options: FormatOptions) -> Format:
    """The format that encodes a tensor planned by a `fmt` recipe with `options`: `fmt` itself, or, for a layer of a
    mixed ComfyUI file, the format of its layout (`FormatOptions.format_name`)."""
    name = options.format_name
    return fmt if name is None or name == fmt.NAME else get_format(name)


def quantized_parts(
    fmt: Format, module: str, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS
) -> dict[str, tuple[str, PartSpec]]:
    """Part name -> (output key, (dtype, shape)) of a weight of `shape` stored by `fmt` with `options` (gguf's
    GGML type; none for a format with one encoding) under the module name `module` (already in the output's
    names): the one rule the plan, verify and the loaders share. `UnsupportedShapeError` if the format cannot
    hold the shape."""
    parts = format_for(fmt, options).parts(shape, options)
    return {part: (part_key(module, part), spec) for part, spec in parts.items()}
