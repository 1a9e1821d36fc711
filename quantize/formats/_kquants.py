"""GGML's K-quants (Q6_K, Q5_K, Q4_K) decoded in torch, value for value as gguf-py decodes them.

The error figures decode every weight a conversion writes; gguf-py's numpy decoding splits each block into
fresh arrays and widens every field on its own. This reads the fields of whole row chunks in place and does
gguf-py's float32 arithmetic in its order (``d · sc`` and ``dmin · m`` per sub-block, then ``d·sc · q - dmin·m``;
Q6_K: ``d · scale`` then ``· q``), so the values are the same bits (tested on random bytes, every field value).
Encoding stays with ggml's own quantizer.

Super-blocks of 256 values: Q4_K (144 bytes) ``d, dmin`` (float16), 12 bytes of 6-bit scales and mins,
128 bytes of 4-bit values; Q5_K (176 bytes) the same with 32 bytes of fifth bits before the values; Q6_K
(210 bytes) 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, ``d`` (float16).
"""

from __future__ import annotations

import functools

import torch

from ..ggml_types import ggml_type

__all__ = ["dequantize"]


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two-byte little-endian float16 fields [..., 2] as float32 [..., 1]."""
    return b.contiguous().view(torch.float16).float()


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins of Q4_K / Q5_K's 12 packed bytes [n, 12], as uint8 [n, 8] each."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


_NIBBLES = (0, 4)
_CRUMBS = (0, 2, 4, 6)
_BITS = tuple(range(8))


@functools.cache
def _shifts(shifts: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The shifts as a uint8 tensor [1, 1, k, 1] on `device` (made once per device: the layer's own, when a
    loader decodes it on the GPU)."""
    return torch.tensor(shifts, dtype=torch.uint8, device=device).view(1, 1, len(shifts), 1)


def _fields(packed: torch.Tensor, n: int, width: int, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """Bytes [n, groups · width] -> [n, groups · len(shifts), width]: for each group of `width` bytes, the
    field at each shift in turn (gguf-py's order)."""
    return ((packed.reshape(n, -1, 1, width) >> _shifts(shifts, packed.device)) & mask).reshape(n, -1, width)


def dequantize(q: torch.Tensor, qtype: str) -> torch.Tensor:
    """float32 rows [rows, cols] of K-quant bytes `q` (uint8 [rows, cols / 256 · the type's bytes a block])."""
    rows = q.shape[0]
    b = q.reshape(-1, ggml_type(qtype).type_size)
    n = b.shape[0]
    if qtype == "Q6_K":
        ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
        d = (_f16(d) * scales.view(torch.int8).float()).reshape(n, 16, 1)
        low = _fields(ql, n, 64, _NIBBLES, 0x0F).reshape(n, -1, 32)
        values = low.bitwise_or_(_fields(qh, n, 32, _CRUMBS, 3) << 4).view(torch.int8).sub_(32)
        values = values.float().reshape(n, 16, 16)
        return (d * values).reshape(rows, -1)
    d, dmin, scales = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16]
    sc, mn = _scale_min(scales)
    d = (d * sc.float()).reshape(n, 8, 1)
    dm = (dmin * mn.float()).reshape(n, 8, 1)
    if qtype == "Q4_K":
        values = _fields(b[:, 16:], n, 32, _NIBBLES, 0x0F)
    else:  # Q5_K
        values = _fields(b[:, 48:], n, 32, _NIBBLES, 0x0F).bitwise_or_(
            _fields(b[:, 16:48], n, 32, _BITS, 1) << 4
        )
    return (d * values.float()).sub_(dm).reshape(rows, -1)
