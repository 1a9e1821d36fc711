"""Converting one tensor: read it from its shard, encode or cast it, write it to its output shard.

Row-separable formats are streamed in row chunks of about `CHUNK_BYTES` of float32, so a worker
holds one chunk at a time whatever the size of the weight. The error figures of the manifest are
accumulated over the same chunks (float32 within a chunk, float64 across), in a fixed order, so they
too are reproducible to the bit, whatever the number of workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import dtypes
from .checkpoint import copy_tensor_bytes, read_rows
from .errors import InputError
from .formats import Format, NonFiniteWeightError, part_key
from .plan import TensorPlan
from .writer import ShardWriter

__all__ = ["ErrorStats", "write_tensor", "row_chunks", "CHUNK_BYTES"]

# float32 bytes of one row chunk: small enough to stay in cache, large enough to amortize per-call costs
CHUNK_BYTES = 4 << 20


@dataclass
class ErrorStats:
    """Running sums for SQNR, cosine similarity and max abs error between a weight and its decoding."""

    signal: float = 0.0  # sum w^2
    noise: float = 0.0  # sum (w - dq)^2
    decoded: float = 0.0  # sum dq^2
    max_abs: float = 0.0

    def add(self, w: torch.Tensor, dq: torch.Tensor) -> None:
        """Accumulate one chunk. `dq` (float32) is overwritten: the sums are taken without temporaries.

        Sums are float32 per chunk, float64 across chunks, in a fixed order: reproducible to the bit.
        """
        if not w.numel():
            return
        w = w.float()
        self.signal += float(torch.linalg.vector_norm(w)) ** 2
        self.decoded += float(torch.linalg.vector_norm(dq)) ** 2
        err = dq.sub_(w)
        self.noise += float(torch.linalg.vector_norm(err)) ** 2
        lo, hi = torch.aminmax(err)
        chunk_max = max(-float(lo), float(hi)) if not bool(torch.isnan(lo) | torch.isnan(hi)) else math.nan
        self.max_abs = (
            math.nan if math.isnan(chunk_max) or math.isnan(self.max_abs) else max(self.max_abs, chunk_max)
        )

    @property
    def sqnr_db(self) -> float | None:
        """10·log10(signal / noise); None when the decoding is exact."""
        if self.noise == 0:
            return None
        if self.signal == 0:
            return -math.inf
        return 10 * math.log10(self.signal / self.noise)

    @property
    def cosine(self) -> float:
        """<w, dq> / (|w| |dq|), with <w, dq> = (|w|^2 + |dq|^2 - |w - dq|^2) / 2."""
        denom = math.sqrt(self.signal * self.decoded)
        if math.isnan(denom):
            return math.nan
        if denom == 0:
            return 1.0 if self.signal == self.decoded else 0.0
        value = (self.signal + self.decoded - self.noise) / (2 * denom)
        return value if math.isnan(value) else min(1.0, value)


def row_chunks(rows: int, row_elems: int, chunk_bytes: int | None = None) -> list[tuple[int, int]]:
    """Row ranges of about `chunk_bytes` (default `CHUNK_BYTES`) of float32 each."""
    step = max(1, (chunk_bytes or CHUNK_BYTES) // max(1, 4 * row_elems))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def write_tensor(tp: TensorPlan, fmt: Format, writer: ShardWriter) -> ErrorStats | None:
    """Convert one planned tensor into `writer`; returns error figures for a quantized one."""
    if tp.quantize:
        return _write_quantized(tp, fmt, writer)
    (spec,) = tp.outputs
    if spec.dtype == tp.info.dtype:
        copy_tensor_bytes(tp.info, lambda data, offset: writer.write_bytes(spec.name, data, offset))
        return None
    target = dtypes.by_name(spec.dtype).torch
    rows = tp.info.shape[0] if tp.info.shape else 1
    for r0, r1 in row_chunks(rows, tp.info.numel // max(1, rows)):
        writer.write(spec.name, read_rows(tp.info, r0, r1).to(target), row_start=r0)
    return None


def _encode(fmt: Format, tp: TensorPlan, w: torch.Tensor) -> dict[str, torch.Tensor]:
    try:
        return fmt.encode(w)
    except NonFiniteWeightError as e:
        raise InputError(f"{tp.info.file}: tensor {tp.name!r} {e}: refusing to quantize it") from None


def _write_quantized(tp: TensorPlan, fmt: Format, writer: ShardWriter) -> ErrorStats:
    """Row-separable formats: read, encode and write chunk by chunk. Others: encode the whole weight, then
    measure the error chunk by chunk, so that no float32 copy of the whole weight is ever made."""
    stats = ErrorStats()
    rows, cols = tp.info.shape
    ranges = row_chunks(rows, cols)
    if fmt.ROW_SEPARABLE:
        for r0, r1 in ranges:
            w = read_rows(tp.info, r0, r1).float()  # one float32 copy, for the encoding and the error figures
            parts = _encode(fmt, tp, w)
            _write_parts(tp, parts, writer, r0)
            stats.add(w, fmt.decode(parts, torch.float32))
        return stats
    w = read_rows(tp.info, 0, rows)
    parts = _encode(fmt, tp, w)
    _write_parts(tp, parts, writer, 0)
    for r0, r1 in ranges:
        stats.add(w[r0:r1], fmt.decode(parts, torch.float32, rows=(r0, r1)))
    return stats


def _write_parts(tp: TensorPlan, parts: dict[str, torch.Tensor], writer: ShardWriter, row_start: int) -> None:
    for part, t in parts.items():
        writer.write(part_key(tp.module, part), t, row_start=row_start)
