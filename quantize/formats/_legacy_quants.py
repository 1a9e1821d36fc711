"""GGML's legacy block types (Q4_0, Q4_1, Q5_0, Q5_1) decoded in torch, value for value as gguf-py's.

Reference: gguf-py's ``gguf.quants.dequantize(rows, GGMLQuantizationType.<type>)`` (each type's
``dequantize_blocks``). gguf-py splits each block into fresh numpy arrays and widens every field on its own;
this reads the fields of whole row chunks in place, on whatever device the bytes are, and does gguf-py's
float32 arithmetic in its order, so the values are the same bits (tested on random bytes and real encodings):
the _0 types ``d · (q - 8)`` (Q4_0) or ``d · (q - 16)`` (Q5_0), the offset taken in int8 before widening;
the _1 types ``(d · q) + m``. Each product is exact in float32 (an 11-bit significand times at most 5 bits),
so a value rounds once at most (the _1 types' sum), on any device.

Blocks of 32 values: ``d`` and ``m`` float16 (little-endian); for the 5-bit types ``qh``, 4 bytes, one
little-endian uint32 whose bit j is value j's fifth bit; then ``qs``, 16 bytes, byte i's low nibble value i
and its high nibble value i + 16. Q4_0 (18 bytes) ``d, qs``; Q4_1 (20) ``d, m, qs``; Q5_0 (22) ``d, qh, qs``;
Q5_1 (24) ``d, m, qh, qs``.
"""

from __future__ import annotations

import torch

from ..ggml_types import ggml_type

__all__ = ["TYPES", "dequantize"]

#: The types decoded here.
TYPES: tuple[str, ...] = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")
_QS_BYTES = 16  # two 4-bit values a byte, the last field of every block
_QH_BYTES = 4  # the fifth bits of the 5-bit types, one uint32


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two-byte little-endian float16 fields [n, 2] as float32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """The 16 packed bytes of each block [n, 16] as its 32 four-bit values, uint8 [n, 32]: the low nibbles
    (values 0-15), then the high ones (16-31), gguf-py's order."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 4 bytes of fifth bits of each block [n, 4] (a little-endian uint32, bit j for value j) as uint8
    [n, 32] of 0 and 1."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(2) >> shifts) & 1).reshape(qh.shape[0], 32)


def dequantize(q: torch.Tensor, type_name: str) -> torch.Tensor:
    """float32 rows [rows, cols] of Q4_0 / Q4_1 / Q5_0 / Q5_1 bytes `q` (uint8 [rows, cols / 32 · the type's
    bytes a block]), on `q`'s device."""
    if type_name not in TYPES:
        raise ValueError(f"{type_name} is not one of {', '.join(TYPES)}")
    t = ggml_type(type_name)
    rows, row_bytes = q.shape
    if q.dtype != torch.uint8 or row_bytes % t.type_size:
        raise ValueError(
            f"{type_name} rows are uint8 in blocks of {t.type_size} bytes; got {q.dtype} {list(q.shape)}"
        )
    cols = row_bytes // t.type_size * t.block
    b = q.reshape(-1, t.type_size)
    scaled_min = type_name.endswith("_1")  # d and m; the _0 types d alone
    d = _f16(b[:, 0:2])
    values = _nibbles(b[:, t.type_size - _QS_BYTES :])
    if type_name.startswith("Q5"):
        start = 4 if scaled_min else 2
        values |= _fifth_bits(b[:, start : start + _QH_BYTES]) << 4
    if scaled_min:
        return (d * values.float()).add_(_f16(b[:, 2:4])).reshape(rows, cols)
    offset = 16 if type_name == "Q5_0" else 8  # the value of a zero: half the 5- or 4-bit range
    return (d * values.view(torch.int8).sub_(offset).float()).reshape(rows, cols)
