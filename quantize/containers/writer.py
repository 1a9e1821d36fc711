"""Streaming safetensors writer: the layout is computed up front, tensor data lands at known offsets.

A shard is never held in memory. Its layout (which tensor lands where) follows from names, shapes
and dtypes alone, so every tensor's bytes, or any row range of them, are written straight to their
place with `os.pwrite`, from any thread, in any order. The layout is the one
`safetensors.torch.save_file` produces (descending dtype rank, then name; header padded with spaces
to 8 bytes), so a shard we write is byte-identical to one safetensors would write from the same
tensors, and every tensor is aligned to its item size.

One exception: a *late* tensor (``shape=None``) is a small 1-D U8 blob whose length is known only
once it is encoded (bitsandbytes' packed quant-state JSON carries a float). Late tensors go after all
the others, in name order, and the header, written at `close`, is padded with spaces to the room
reserved for it. Shards without late tensors are unaffected.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path

import torch

from .. import dtypes
from ..plan import LATE_MAX_BYTES, TensorSpec
from ..read.checkpoint import tensor_bytes

__all__ = ["shard_layout", "header_bytes", "ShardWriter", "PlacedWrites", "pwrite_all"]


def shard_layout(specs: Iterable[TensorSpec]) -> list[TensorSpec]:
    """The order tensors take in a file: safetensors' own (dtype rank descending, then name); late ones last."""
    return sorted(specs, key=lambda s: (s.late, -dtypes.by_name(s.dtype).rank, s.name))


def header_bytes(
    layout: list[TensorSpec], metadata: dict[str, str] | None = None, sizes: dict[str, int] | None = None
) -> bytes:
    """The 8-byte length and JSON header of a file whose tensors follow `layout`; `sizes` gives late tensors' bytes."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for spec in layout:
        n = (sizes or {}).get(spec.name, spec.nbytes)
        shape = [n] if spec.late else list(spec.shape)
        header[spec.name] = {"dtype": spec.dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def pwrite_all(fd: int, data: memoryview, offset: int, path: Path) -> None:
    """Write all of `data` at `offset` of the open file `fd`; errors name `path` (a full disk too)."""
    while len(data):
        try:
            n = os.pwrite(fd, data, offset)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(path)) from None
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        data, offset = data[n:], offset + n


class PlacedWrites:
    """What both streaming writers (`ShardWriter`, `gguf_file.GGUFWriter`) share: tensors placed at known
    offsets of an open file (`_offsets`: name -> (start, planned spec)), written as bytes from any thread, and
    counted so that `close` can tell a tensor that was not written whole."""

    path: Path
    _fd: int
    _offsets: dict
    _written: dict[str, int]
    _lock: threading.Lock

    def _pwrite(self, data: memoryview, offset: int) -> None:
        pwrite_all(self._fd, data, offset, self.path)

    def write_bytes(self, name: str, data: memoryview, offset: int = 0) -> None:
        """Write raw bytes at `offset` within the planned tensor `name`."""
        start, spec = self._offsets[name]
        if not len(data):  # an empty row range writes nothing, wherever it starts
            return
        if offset + len(data) > spec.nbytes:
            raise ValueError(
                f"{self.path.name}: {len(data)} bytes at {offset} overrun tensor {name!r} ({spec.nbytes} bytes)"
            )
        self._pwrite(data, start + offset)
        with self._lock:
            self._written[name] += len(data)

    def _check_written_whole(self) -> None:
        for name, (_, spec) in self._offsets.items():
            if self._written[name] != spec.nbytes:
                raise ValueError(
                    f"{self.path.name}: tensor {name!r} got {self._written[name]} of {spec.nbytes} bytes"
                )

    def abort(self) -> None:
        os.close(self._fd)


class ShardWriter(PlacedWrites):
    """One safetensors file being written; tensors (or row ranges of them) may arrive in any order.

    The file is created exclusively (never overwriting), sized up front, and checked at `close`
    for every planned byte having been written.

    >>> # with ShardWriter(path, [TensorSpec("w", "F32", (2, 3))]) as w: w.write("w", torch.zeros(2, 3))
    """

    def __init__(self, path: Path, specs: Iterable[TensorSpec], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.layout = shard_layout(specs)
        self._metadata = metadata
        if any(s.late and s.dtype != "U8" for s in self.layout):
            raise ValueError("late tensors must be U8 blobs")
        header = header_bytes(
            self.layout, metadata
        )  # late tensors at their most: room enough for the real header
        self._header_room = len(header)
        self._offsets: dict[str, tuple[int, TensorSpec]] = {}
        pos = len(header)
        for spec in self.layout:
            if not spec.late:
                self._offsets[spec.name] = (pos, spec)
                pos += spec.nbytes
        self._fixed_end = pos
        self._late: dict[str, bytes] = {}
        self._late_names = {s.name for s in self.layout if s.late}
        self._written = dict.fromkeys(self._offsets, 0)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if not self._late_names:
                self._pwrite(memoryview(header), 0)
            try:
                os.ftruncate(self._fd, self._fixed_end)
            except OSError as e:
                raise self._named(e) from None
        except BaseException:
            os.close(self._fd)
            raise

    def _named(self, e: OSError) -> OSError:
        """`e` naming this file (os.pwrite, ftruncate and fsync errors name none)."""
        return OSError(e.errno, e.strerror, str(self.path))

    def write(self, name: str, tensor: torch.Tensor, row_start: int = 0) -> None:
        """Write `tensor` as rows ``[row_start, row_start + len(tensor))`` of the planned tensor `name`."""
        if name in self._late_names:
            return self._write_late(name, tensor)
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

    def _write_late(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.dtype != torch.uint8 or tensor.dim() != 1 or tensor.numel() > LATE_MAX_BYTES:
            raise ValueError(
                f"{self.path.name}: late tensor {name!r} must be 1-D uint8 of at most {LATE_MAX_BYTES} bytes"
            )
        with self._lock:
            self._late[name] = bytes(tensor_bytes(tensor.contiguous()))

    def close(self, sync: bool = True) -> int:
        """Finish the file (late tensors, header) and, with `sync`, flush it to disk; returns its tensor data
        bytes. A caller passing ``sync=False`` flushes it later (`output.fsync_path`), before publishing it."""
        try:
            self._check_written_whole()
            missing = sorted(self._late_names - set(self._late))
            if missing:
                raise ValueError(f"{self.path.name}: tensor {missing[0]!r} was never written")
            data_bytes = self._fixed_end - self._header_room
            if self._late_names:
                data_bytes += self._finish_late()
            if sync:
                try:
                    os.fsync(self._fd)
                except OSError as e:
                    raise self._named(e) from None
            return data_bytes
        finally:
            os.close(self._fd)

    def _finish_late(self) -> int:
        pos = self._fixed_end
        for name in sorted(self._late_names):
            self._pwrite(memoryview(self._late[name]), pos)
            pos += len(self._late[name])
        sizes = {name: len(blob) for name, blob in self._late.items()}
        header = header_bytes(self.layout, self._metadata, sizes)
        room = self._header_room - 8
        raw = header[8:].rstrip(b" ")
        raw += b" " * (room - len(raw))  # JSON allows trailing spaces; safetensors pads with them too
        self._pwrite(memoryview(struct.pack("<Q", room) + raw), 0)
        return sum(sizes.values())

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
