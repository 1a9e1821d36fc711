"""float8_e4m3fn arithmetic shared by the two FP8 formats (they differ in how the scale is chosen)."""

from __future__ import annotations

import functools
import sys

import torch

__all__ = ["FP8_DTYPE", "FP8_MAX", "quantize_rows", "dequantize_rows", "row_absmax"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
_VALUES = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()  # bit pattern -> value


@functools.cache
def _values_on(device: torch.device) -> torch.Tensor:
    return _VALUES.to(device)


def row_absmax(w: torch.Tensor) -> torch.Tensor:
    """max |w| of each row, [rows, 1], in w's dtype: max(row max, -row min), without a |w| temporary.
    Equal to ``w.abs().amax(dim=1, keepdim=True)`` (NaN propagates the same way). Not `torch.aminmax`:
    along a dim it is an order of magnitude slower on the CPU than amax and amin apart."""
    return torch.maximum(w.amax(dim=1, keepdim=True), w.amin(dim=1, keepdim=True).neg_())


def quantize_rows(w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 scale) of float32 rows `w` for their chosen scales [rows, 1] (the formats differ
    only in how they choose them): a scale of 0 becomes 1 (exact zeros), q = e4m3(clamp(w / scale, ±448)),
    rounded to nearest even by the cast. The e4m3 quantizer for per-row scales: fp8_channel (its weights and
    per-token activations) and torchao_fp8 use it (comfy_fp8 follows comfy-kitchen: times the reciprocal)."""
    scale = torch.where(scale == 0, 1.0, scale)
    return torch.div(w, scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def dequantize_rows(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, rows: tuple[int, int] | None = None
) -> torch.Tensor:
    """q.float() * scale (one scale per row), cast to `dtype`; only `rows` [r0, r1) if given.

    The float8 values come from a lookup table: exact, and several times faster on the CPU than torch's
    float8 -> float32 cast. On the CPU, two at a time (a 64K-entry table of value pairs, gathered as
    8-byte items), which halves the cost again.
    """
    if rows is not None:
        q, scale = q[rows[0] : rows[1]], scale[rows[0] : rows[1]]
    if q.device.type == "cpu" and q.is_contiguous() and q.shape[-1] % 2 == 0:
        pairs = q.view(torch.uint16).reshape(-1).int()
        values = _pair_values().index_select(0, pairs).view(torch.float32).view(q.shape)
    else:
        table = _VALUES if q.device.type == "cpu" else _values_on(q.device)
        values = table.index_select(0, q.reshape(-1).view(torch.uint8).int()).view(q.shape)
    return values.mul_(scale).to(dtype)


@functools.cache
def _pair_values() -> torch.Tensor:
    """For each uint16 view of two adjacent float8 values, both values as float32, packed in one int64."""
    halves = torch.arange(1 << 16, dtype=torch.int32).view(-1, 1).view(torch.uint8)  # the uint16's 2 bytes
    first, second = (
        (0, 1) if sys.byteorder == "little" else (2, 3)
    )  # little-endian int32: bytes 0, 1 = uint16
    pairs = torch.stack([_VALUES[halves[:, first].int()], _VALUES[halves[:, second].int()]], dim=1)
    return pairs.contiguous().view(torch.int64).view(-1)
