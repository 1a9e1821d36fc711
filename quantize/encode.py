"""Encoding one planned tensor, and measuring what it costs: the loop convert and verify share.

A quantized weight is read through its `TensorSource` and encoded by its format; row-separable formats
are streamed in row chunks of about `CHUNK_BYTES` of float32, so a worker holds one chunk at a time
whatever the size of the weight; other formats are encoded whole, then measured chunk by chunk, so that
no float32 copy of the whole weight is ever made. `encode_and_measure` hands each encoding to its caller
(convert writes it; verify compares it with what is stored and returns the stored parts) and measures the
error of the parts the caller returns. The error figures are accumulated over the same chunks (float32
within a chunk, float64 across), in a fixed order, so they too are reproducible to the bit, whatever the
number of workers.

A kept tensor is either its stored bytes (`copy_unchanged`) or its rows cast to the output dtype
(`kept_rows`).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from . import dtypes
from .errors import InputError
from .formats import Format, NonFiniteWeightError, format_for
from .plan import TensorPlan

__all__ = [
    "ErrorStats",
    "encode_and_measure",
    "kept_rows",
    "copy_unchanged",
    "row_chunks",
    "CHUNK_BYTES",
    "TakeParts",
    "SeenChunk",
    "ChunkPool",
]

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


def row_chunks(
    rows: int, row_elems: int, chunk_bytes: int | None = None, block: int = 1
) -> list[tuple[int, int]]:
    """Row ranges of about `chunk_bytes` (default `CHUNK_BYTES`) of float32 each, each starting on a multiple of
    `block` rows (a format's `ROW_BLOCK`)."""
    step = max(1, (chunk_bytes or CHUNK_BYTES) // max(1, 4 * row_elems))
    step = max(block, step - step % block)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


#: What a caller does with a fresh encoding: ``take(parts, rows)`` gets the parts of the weight's rows
#: `rows` = (r0, r1) (row-separable formats; each part's rows from r0 on: r0..r1, and on a padded format's last
#: chunk its padding rows too), or of the whole weight (`rows` None),
#: and returns the parts whose decoding is measured (the same ones, or those stored).
TakeParts = Callable[[dict[str, torch.Tensor], "tuple[int, int] | None"], dict[str, torch.Tensor]]


#: What a caller does with each chunk's decoding: ``seen(r0, r1, w, decoded)``, the source rows r0..r1 in
#: float32 and their decoding, both read-only and valid only during the call (`quantize sensitivity`).
SeenChunk = Callable[[int, int, torch.Tensor, torch.Tensor], None]


def encode_and_measure(
    tp: TensorPlan,
    fmt: Format,
    take: TakeParts,
    seen: SeenChunk | None = None,
    pool: ChunkPool | None = None,
) -> ErrorStats:
    """Encode the quantized tensor `tp` with `fmt`, hand each encoding to `take`, and measure the error of the
    decoding of what `take` returns against the source values; `seen`, when given, is shown each row chunk's
    source values and decoding (in row order) before they are measured.

    A row-separable format's whole-weight parts (`WEIGHT_PARTS`: a per-tensor scale, a marker, a static input
    scale where the options give one) are handed to `take` once, whole (`rows` None), with the first chunk; a
    format that decides them from the whole weight first sees every row chunk once (`weight_options`), so no
    weight is ever held whole in float32. With a `pool`, row chunks are read and encoded on its threads (at most
    `pool.ahead` ahead), and still taken, decoded and measured in row order: the same results. `fmt` is the recipe's format; the tensor is encoded by
    the one of its options (`format_for`: a mixed ComfyUI file's other layouts)."""
    stats = ErrorStats()
    fmt = format_for(fmt, tp.options)
    rows, cols = tp.info.shape
    ranges = row_chunks(rows, cols, block=fmt.ROW_BLOCK)
    if fmt.ROW_SEPARABLE:
        decided = _weight_options(fmt, tp, ranges)
        whole_names = fmt.WEIGHT_PARTS
        whole: dict[str, torch.Tensor] | None = None

        def encoded(r0: int, r1: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            w = tp.source.read_rows(r0, r1, torch.float32)  # one float32 copy, for encoding and figures
            return w, _encode(fmt, tp, w, decided)

        for (r0, r1), (w, parts) in zip(ranges, _in_order(encoded, ranges, pool), strict=True):
            if whole_names:
                weight_parts = {name: parts.pop(name) for name in whole_names if name in parts}
                if whole is None:
                    whole = take(weight_parts, None)
            measured = take(parts, (r0, r1))
            decoded = fmt.decoded(
                {**measured, **(whole or {})}, (r1 - r0, cols), torch.float32, options=tp.options
            )
            if seen is not None:
                seen(r0, r1, w, decoded)
            stats.add(w, decoded)
        return stats
    w = tp.source.read()
    measured = take(_encode(fmt, tp, w, {}), None)
    for r0, r1 in ranges:
        decoded = fmt.decoded(measured, (rows, cols), torch.float32, rows=(r0, r1), options=tp.options)
        if seen is not None:
            seen(r0, r1, w[r0:r1].float(), decoded)
        stats.add(w[r0:r1], decoded)
    return stats


@dataclass(frozen=True)
class ChunkPool:
    """Threads that read and encode a weight's row chunks ahead of the one being taken: at most `ahead` chunks
    (about 4 MB of float32 each, and their encoding) wait at a time."""

    executor: Executor
    ahead: int

    @classmethod
    def of(cls, executor: Executor, workers: int) -> ChunkPool:
        """Two chunks a thread: each thread has the next one to start when it finishes one."""
        return cls(executor, 2 * max(1, workers))


def _in_order(work: Callable, ranges: list[tuple[int, int]], pool: ChunkPool | None) -> Iterator:
    """work(r0, r1) for each range, in order: computed here, or on `pool` at most `pool.ahead` ranges ahead."""
    if pool is None:
        yield from (work(r0, r1) for r0, r1 in ranges)
        return
    pending: deque[Future] = deque()
    todo = iter(ranges)
    try:
        for r in itertools.islice(todo, pool.ahead):
            pending.append(pool.executor.submit(work, *r))
        while pending:
            result = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.executor.submit(work, *nxt))
            yield result
    finally:
        for f in pending:
            f.cancel()


def _weight_options(fmt: Format, tp: TensorPlan, ranges: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """What the format decides from the whole weight before encoding any chunk (a first streamed pass, which a
    format that decides nothing never reads)."""
    with _named(tp):
        return fmt.weight_options(
            (tp.source.read_rows(r0, r1, torch.float32) for r0, r1 in ranges), tp.options, tp.info.shape
        )


def _encode(
    fmt: Format, tp: TensorPlan, w: torch.Tensor, whole: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    with _named(tp):
        return fmt.encode(w, tp.options, **whole)


@contextmanager
def _named(tp: TensorPlan) -> Iterator[None]:
    """A weight the format cannot encode (NaN, Inf) as one error naming the tensor and its file."""
    try:
        yield
    except NonFiniteWeightError as e:
        raise InputError(f"{tp.info.file}: tensor {tp.name!r} {e}: refusing to quantize it") from None


def kept_rows(tp: TensorPlan) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(r0, r1, rows [r0, r1)) of the kept tensor `tp` as the output holds it: the source's values (every step
    applied), cast to the output dtype, in row chunks."""
    (spec,) = tp.outputs
    target = dtypes.by_name(spec.dtype).torch
    rows = tp.source.rows
    for r0, r1 in row_chunks(rows, tp.info.numel // max(1, rows)):
        yield r0, r1, tp.source.read_rows(r0, r1, target)


def copy_unchanged(tp: TensorPlan, write: Callable[[memoryview, int], None]) -> bool:
    """Stream a kept tensor's stored bytes to `write(chunk, offset)` when the output holds them unchanged (same
    dtype, no step changes it); returns False, writing nothing, when it must go through `kept_rows`."""
    if tp.output().dtype != tp.info.dtype or tp.source.changed:
        return False
    tp.source.copy_bytes(write)
    return True
