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

from ..errors import InputError
from ..names import part_key
from .base import Format, NonFiniteWeightError, PartSpec, UnfittedShapeError, UnsupportedShapeError
from .info import FORMAT_INFO, FormatInfo, format_info
from .options import (
    KEPT,
    NO_OPTIONS,
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
    "UnfittedShapeError",
    "part_key",
]


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
