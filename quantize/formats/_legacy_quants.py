"""GGML's legacy block types (Q4_0, Q4_1, Q5_0, Q5_1) decoded in torch, value for value as gguf-py's.

Reference: gguf-py's ``gguf.quants.dequantize(rows, GGMLQuantizationType.<type>)`` (each type's
``dequantize_blocks``), whose float32 arithmetic this does in its order, so the values are the same bits
(tested on random bytes and real encodings): the _0 types ``d · (q - 8)`` (Q4_0) or ``d · (q - 16)`` (Q5_0),
the offset taken on the integers; the _1 types ``(d · q) + m``. Each product is exact in float32 (an 11-bit
significand times at most 5 bits), so a value rounds once at most (the _1 types' sum), on any device.

Blocks of 32 values: ``d`` and ``m`` float16 (little-endian); for the 5-bit types ``qh``, 4 bytes, one
little-endian uint32 whose bit j is value j's fifth bit; then ``qs``, 16 bytes, byte i's low nibble value i
and its high nibble value i + 16. Q4_0 (18 bytes) ``d, qs``; Q4_1 (20) ``d, m, qs``; Q5_0 (22) ``d, qh, qs``;
Q5_1 (24) ``d, m, qh, qs``.

gguf-py splits each block into fresh numpy arrays; this writes each value once into the float32 result, the
fields read in place with whole-tensor ops on the bytes' own device (on the CPU by chunks of blocks that stay
in cache), and spreads the fifth bits with integer multiplies rather than a shift per bit. On the CPU most of
either's time is the first touch of the fresh float32 result.
"""

from __future__ import annotations

import torch

from ..ggml_types import ggml_type

__all__ = ["TYPES", "dequantize"]

#: The types decoded here.
TYPES: tuple[str, ...] = ("Q4_0", "Q4_1", "Q5_0", "Q5_1")
_QS_BYTES = 16  # two 4-bit values a byte, the last field of every block
_QH_BYTES = 4  # the fifth bits of the 5-bit types, one uint32
_CPU_CHUNK = 16384  # blocks decoded at a time on the CPU: 2 MB of float32, cache-sized
_SPREAD4 = 0x00204081  # times a 4-bit x: x's bit k at bit 8k (the four copies, 7 bits apart, never overlap)
_LOW_BITS = 0x0101010101010101  # bit 0 of each byte of an int64


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two-byte little-endian float16 fields [n, 2] as float32 [n, 1, 1]."""
    return b.contiguous().view(torch.float16).float().unsqueeze(2)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """The 16 packed bytes of each block [n, 16] as its 32 four-bit values, uint8 [n, 2, 16]: the low
    nibbles (values 0-15), then the high ones (16-31), gguf-py's order."""
    qs = qs.contiguous()  # ops on a contiguous copy are several times faster than on the strided field
    values = torch.empty(qs.shape[0], 2, _QS_BYTES, dtype=torch.uint8, device=qs.device)
    torch.bitwise_and(qs, 0x0F, out=values[:, 0])
    torch.bitwise_right_shift(qs, 4, out=values[:, 1])
    return values


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 4 bytes of fifth bits of each block [n, 4] (a little-endian uint32, bit j for value j) as uint8
    [n, 2, 16] of 0 and 16: each byte widened to an int64 whose byte k is its bit k (each nibble spread by
    one multiply, no overflow), read as 8 bytes (little-endian, as gguf-py reads the uint32)."""
    x = qh.long()
    spread = (x & 0x0F).bitwise_or_((x >> 4) << 32).mul_(_SPREAD4).bitwise_and_(_LOW_BITS)
    return spread.bitwise_left_shift_(4).view(torch.uint8).view(qh.shape[0], 2, _QS_BYTES)


def _decode_blocks(b: torch.Tensor, type_name: str, out: torch.Tensor) -> None:
    """Decode blocks `b` (uint8 [n, the type's bytes a block]) into float32 `out` [n, 2, 16]."""
    scaled_min = type_name.endswith("_1")  # d and m; the _0 types d alone
    values = _nibbles(b[:, b.shape[1] - _QS_BYTES :])
    if type_name.startswith("Q5"):
        start = 4 if scaled_min else 2
        values |= _fifth_bits(b[:, start : start + _QH_BYTES])
    if not scaled_min:  # the value of a zero: half the 5- or 4-bit range, taken off in int8 as gguf-py does
        values = values.view(torch.int8).sub_(16 if type_name == "Q5_0" else 8)
    out.copy_(values).mul_(_f16(b[:, 0:2]))
    if scaled_min:
        out.add_(_f16(b[:, 2:4]))


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
    n = b.shape[0]
    out = torch.empty(n, 2, _QS_BYTES, dtype=torch.float32, device=q.device)
    chunk = _CPU_CHUNK if q.device.type == "cpu" else max(n, 1)  # elsewhere the whole tensor at once
    for start in range(0, n, chunk):
        _decode_blocks(b[start : start + chunk], type_name, out[start : start + chunk])
    return out.view(rows, cols)
