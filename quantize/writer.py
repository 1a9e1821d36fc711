"""Streaming safetensors writer: the header is computed up front, tensor data lands at known offsets.

A shard is never held in memory. Its layout (which tensor lands where) follows from names, shapes
and dtypes alone, so the header is written first and every tensor's bytes, or any row range of
them, are written straight to their place with `os.pwrite`, from any thread, in any order. The
layout is the one `safetensors.torch.save_file` produces (descending dtype rank, then name; header
padded with spaces to 8 bytes), so a shard we write is byte-identical to one safetensors would write
from the same tensors, and every tensor is aligned to its item size.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import dtypes
from .checkpoint import tensor_bytes

__all__ = ["TensorSpec", "shard_layout", "header_bytes", "ShardWriter"]


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: name, safetensors dtype name, shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return dtypes.by_name(self.dtype).itemsize * math.prod(self.shape)


def shard_layout(specs: Iterable[TensorSpec]) -> list[TensorSpec]:
    """The order tensors take in a file: safetensors' own (dtype rank descending, then name)."""
    return sorted(specs, key=lambda s: (-dtypes.by_name(s.dtype).rank, s.name))


def header_bytes(layout: list[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length and JSON header of a file whose tensors follow `layout` in order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for spec in layout:
        header[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class ShardWriter:
    """One safetensors file being written; tensors (or row ranges of them) may arrive in any order.

    The file is created exclusively (never overwriting), sized up front, and checked at `close`
    for every planned byte having been written.

    >>> # with ShardWriter(path, [TensorSpec("w", "F32", (2, 3))]) as w: w.write("w", torch.zeros(2, 3))
    """

    def __init__(self, path: Path, specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.layout = shard_layout(specs)
        header = header_bytes(self.layout, metadata)
        self._offsets: dict[str, tuple[int, TensorSpec]] = {}
        pos = len(header)
        for spec in self.layout:
            self._offsets[spec.name] = (pos, spec)
            pos += spec.nbytes
        self.size = pos
        self._written = dict.fromkeys(self._offsets, 0)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._pwrite(memoryview(header), 0)
            os.ftruncate(self._fd, self.size)
        except BaseException:
            os.close(self._fd)
            raise

    def _pwrite(self, data: memoryview, offset: int) -> None:
        while len(data):
            n = os.pwrite(self._fd, data, offset)
            data, offset = data[n:], offset + n

    def write(self, name: str, tensor: torch.Tensor, row_start: int = 0) -> None:
        """Write `tensor` as rows ``[row_start, row_start + len(tensor))`` of the planned tensor `name`."""
        _, spec = self._offsets[name]
        dt = dtypes.by_torch(tensor.dtype).name
        rows, planned_rows = (tensor.shape[0] if tensor.dim() else 1), (spec.shape[0] if spec.shape else 1)
        if dt != spec.dtype or tuple(tensor.shape[1:]) != spec.shape[1:] or row_start + rows > planned_rows:
            raise ValueError(
                f"{self.path.name}: rows of {name!r} are {dt}{list(tensor.shape)} at row {row_start}, "
                f"planned {spec.dtype}{list(spec.shape)}"
            )
        contiguous = tensor.contiguous()  # kept alive here: the byte view below does not own it
        row_bytes = spec.nbytes // planned_rows if planned_rows else 0
        self.write_bytes(name, tensor_bytes(contiguous), row_start * row_bytes)
        del contiguous

    def write_bytes(self, name: str, data: memoryview, offset: int = 0) -> None:
        """Write raw bytes at `offset` within the planned tensor `name`."""
        start, spec = self._offsets[name]
        if offset + len(data) > spec.nbytes:
            raise ValueError(
                f"{self.path.name}: {len(data)} bytes at {offset} overrun tensor {name!r} ({spec.nbytes} bytes)"
            )
        self._pwrite(data, start + offset)
        with self._lock:
            self._written[name] += len(data)

    def close(self) -> None:
        """Flush the file to disk; every planned byte must have been written."""
        try:
            for name, (_, spec) in self._offsets.items():
                if self._written[name] != spec.nbytes:
                    raise ValueError(
                        f"{self.path.name}: tensor {name!r} got {self._written[name]} of {spec.nbytes} bytes"
                    )
            os.fsync(self._fd)
        finally:
            os.close(self._fd)

    def abort(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
