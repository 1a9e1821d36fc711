"""The on-disk formats, each defined once; this table is the only way to look one up.

>>> get_format("fp8_channel").NAME
'fp8_channel'
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

from ..errors import InputError
from .base import Format, NonFiniteWeightError, PartSpec, UnsupportedShapeError, part_key

__all__ = [
    "FORMATS",
    "get_format",
    "format_of_config",
    "Format",
    "PartSpec",
    "NonFiniteWeightError",
    "UnsupportedShapeError",
    "part_key",
]

#: format name -> module of this package defining it (its `NAME`)
_MODULES = {"fp8_channel": "fp8_channel", "torchao_fp8": "torchao_fp8", "nf4": "nf4"}


class _Formats(Mapping[str, ModuleType]):
    """Name -> format module, each imported when first looked up: the names alone (what a recipe is
    checked against) come without importing torch."""

    def __getitem__(self, name: str) -> ModuleType:
        return importlib.import_module(f"{__name__}.{_MODULES[name]}")

    def __contains__(self, name: object) -> bool:
        return name in _MODULES

    def __iter__(self) -> Iterator[str]:
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)


FORMATS: Mapping[str, ModuleType] = _Formats()


def get_format(name: str) -> Format:
    """The format module registered under `name`; the error lists the known names."""
    try:
        return FORMATS[name]  # type: ignore[return-value]
    except KeyError:
        raise InputError(f"unknown format {name!r} (known: {', '.join(sorted(FORMATS))})") from None


def format_of_config(quantization_config: dict, where: str) -> Format:
    """The format whose `quantization_config` this is (config.json of a converted checkpoint, at `where`)."""
    method = quantization_config.get("quant_method") if isinstance(quantization_config, dict) else None
    for fmt in FORMATS.values():
        if fmt.QUANT_METHOD == method:
            return fmt  # type: ignore[return-value]
    known = ", ".join(f"{f.QUANT_METHOD} ({f.NAME})" for f in FORMATS.values())
    raise InputError(f"{where}: quantization_config.quant_method is {method!r}; known: {known}")
