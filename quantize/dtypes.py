"""The one dtype table: safetensors name, torch dtype, item size, and safetensors' layout rank.

`rank` is the position in safetensors' own dtype enum; within a file, safetensors lays tensors
out by descending rank, then by name, which keeps every tensor aligned to its item size.

A *block* type stores `block` values of a row in `itemsize` bytes (GGML's quantized types: 32 or 256
values a block); every safetensors dtype is a block of one. Byte counts come from `nbytes` alone, so a
part of a quantized weight may be of either kind. GGML's facts (type ids, block sizes, bytes a block) are
read from its one table, `quantize.ggml_types`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import InputError
from .ggml_types import GGML_TYPES

__all__ = [
    "DType",
    "DTYPES",
    "by_name",
    "by_torch",
    "by_ggml",
    "nbytes",
    "held_shape",
    "FLOAT_SOURCE_DTYPES",
    "FLOAT_DTYPES",
]


@dataclass(frozen=True)
class DType:
    name: str  # as spelled in a safetensors header (GGML's name for its block types)
    torch: torch.dtype  # a block type's bytes are held as uint8 rows
    itemsize: int  # bytes of one block
    rank: int  # safetensors' enum order; higher ranks are laid out first (-1: not a safetensors dtype)
    block: int = 1  # values a block holds along a row
    ggml: int | None = None  # GGML's type id, where a GGUF file can hold it

    @property
    def safetensors(self) -> bool:
        return self.rank >= 0


_GGML_IDS = {t.name: t.id for t in GGML_TYPES}

DTYPES: tuple[DType, ...] = (
    DType("BOOL", torch.bool, 1, 0),
    DType("U8", torch.uint8, 1, 4),
    DType("I8", torch.int8, 1, 5),
    DType("F8_E5M2", torch.float8_e5m2, 1, 6),
    DType("F8_E4M3", torch.float8_e4m3fn, 1, 7),
    DType("I16", torch.int16, 2, 9),
    DType("U16", torch.uint16, 2, 10),
    DType("F16", torch.float16, 2, 11, ggml=_GGML_IDS["F16"]),
    DType("BF16", torch.bfloat16, 2, 12, ggml=_GGML_IDS["BF16"]),
    DType("I32", torch.int32, 4, 13),
    DType("U32", torch.uint32, 4, 14),
    DType("F32", torch.float32, 4, 15, ggml=_GGML_IDS["F32"]),
    DType("F64", torch.float64, 8, 17),
    DType("I64", torch.int64, 8, 18),
    DType("U64", torch.uint64, 8, 19),
    # GGML's quantized block types, their bytes held as uint8 rows: bytes a block, values a block, type id
    *(
        DType(t.name, torch.uint8, t.type_size, -1, block=t.block, ggml=t.id)
        for t in GGML_TYPES
        if t.quantized
    ),
)

_BY_NAME = {d.name: d for d in DTYPES}
_BY_TORCH = {d.torch: d for d in DTYPES if d.block == 1}
_BY_GGML = {d.ggml: d for d in DTYPES if d.ggml is not None}

#: Source dtypes a weight may be quantized from.
FLOAT_SOURCE_DTYPES = frozenset({"F32", "F16", "BF16"})
#: High-precision floats (what a source's weights are; F8 means a quantized checkpoint).
FLOAT_DTYPES = FLOAT_SOURCE_DTYPES | {"F64"}


def by_name(name: str) -> DType:
    """The table row for a safetensors dtype name such as ``"BF16"``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        known = ", ".join(sorted(_BY_NAME))
        raise InputError(f"unsupported safetensors dtype {name!r} (known: {known})") from None


def nbytes(name: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of dtype `name` and `shape` (rows of a block type must be whole blocks)."""
    row = by_name(name)
    if row.block > 1 and (not shape or shape[-1] % row.block):
        raise InputError(
            f"{name} stores rows in blocks of {row.block} values; a row of shape {list(shape)} is not"
        )
    return row.itemsize * math.prod(shape) // row.block


def held_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tensor of dtype `name` and logical `shape` has in memory: `shape` itself, or for a block type
    its rows as their bytes (uint8 [rows, row bytes]), what its format encodes and decodes."""
    row = by_name(name)
    if row.block == 1:
        return tuple(shape)
    return (*shape[:-1], nbytes(name, (shape[-1],)))


def by_ggml(type_id: int) -> DType:
    """The table row for a GGML type id (a GGUF tensor info's type)."""
    try:
        return _BY_GGML[type_id]
    except KeyError:
        raise InputError(f"unsupported GGML type {type_id} (known: {sorted(_BY_GGML)})") from None


def by_torch(dtype: torch.dtype) -> DType:
    """The table row for a torch dtype."""
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise InputError(f"torch dtype {dtype} has no safetensors equivalent") from None
