"""Reading safetensors checkpoints: headers without data, components, and tensors one at a time.

A *component* is one model's weights: a directory holding either a single ``*.safetensors``
file or shards listed by a ``*.safetensors.index.json``, plus usually a ``config.json``.
Everything here validates what it reads and raises `InputError` naming the file at fault;
no path taken from an index is trusted to stay inside the checkpoint.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import dtypes
from ..errors import InputError
from .files import (
    CONFIG_NAME,
    INDEX_SUFFIX,
    MAX_HEADER_BYTES,
    PTH_SUFFIX,
    component_files,
    confined_path,
    no_duplicate_keys,
    read_json_object,
)

__all__ = [
    "TensorInfo",
    "SafetensorsHeader",
    "Component",
    "read_header",
    "open_component",
    "read_tensor",
    "join_pieces",
    "read_rows",
    "read_into",
    "copy_tensor_bytes",
    "confined_path",
    "tensor_bytes",
    "INDEX_SUFFIX",
    "CONFIG_NAME",
]


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype, shape and absolute byte range in that file."""

    name: str
    dtype: str  # safetensors dtype name, e.g. "BF16"
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute offset in `file`
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def rows(self, r0: int, r1: int) -> TensorInfo:
        """Rows [r0, r1) of the stored tensor as a tensor of their own: rows are contiguous, so one byte range (a
        0-d tensor is one row)."""
        row_bytes = self.nbytes // (self.shape[0] if self.shape else 1)
        start = self.start + r0 * row_bytes
        shape = (r1 - r0, *self.shape[1:])
        return TensorInfo(self.name, self.dtype, shape, self.file, start, start + (r1 - r0) * row_bytes)


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    data_start: int
    tensors: dict[str, TensorInfo]  # in file-offset order
    metadata: dict[str, str]


def read_header(path: Path) -> SafetensorsHeader:
    """Parse and validate a safetensors header without reading tensor data.

    >>> # header = read_header(Path("model.safetensors")); header.tensors["proj.weight"].shape
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise InputError(
                    f"{path}: not a safetensors file ({size} bytes, shorter than its 8-byte header length)"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise InputError(
                    f"{path}: header length {n} runs past the end of the file ({size} bytes): truncated or not safetensors"
                )
            raw = f.read(n)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        header = json.loads(raw, object_pairs_hook=no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path}: header is not valid JSON ({e})") from None
    except RecursionError:
        raise InputError(f"{path}: header is not valid JSON (nested too deeply)") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InputError(f"{path}: __metadata__ must map strings to strings")
    data_start = 8 + n
    infos = [_tensor_info(path, name, entry, data_start) for name, entry in header.items()]
    infos.sort(key=lambda t: (t.start, t.end))
    cursor = data_start
    for t in infos:
        if t.start != cursor:
            raise InputError(
                f"{path}: tensor {t.name!r} starts at byte {t.start - data_start} of the data, expected {cursor - data_start} (overlapping or holey offsets)"
            )
        cursor = t.end
    if cursor != size:
        raise InputError(
            f"{path}: tensor data ends at byte {cursor} but the file has {size} bytes: truncated or padded"
        )
    return SafetensorsHeader(path, data_start, {t.name: t for t in infos}, dict(metadata))


def read_pth_header(path: Path) -> SafetensorsHeader:
    """A ``.pth`` file's tensors as a header (`read.pth.read_pth`: their byte ranges in the file), no metadata.
    Imported here, for a ``.pth`` only: a safetensors reader (the loaders') never loads the weights-only unpickler."""
    from .pth import read_pth

    tensors = {
        name: TensorInfo(name, dtype, shape, path, a, b) for name, dtype, shape, a, b in read_pth(path)
    }
    return SafetensorsHeader(path, 0, tensors, {})


def _tensor_info(path: Path, name: str, entry: object, data_start: int) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise InputError(f"{path}: tensor {name!r} has a malformed header entry")
    dt = entry["dtype"]
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(dt, str):
        raise InputError(f"{path}: tensor {name!r} has a malformed dtype")
    try:
        row = dtypes.by_name(dt)
        if not row.safetensors:
            raise InputError(f"unsupported safetensors dtype {dt!r} (a GGML block type)")
    except InputError as e:
        raise InputError(f"{path}: tensor {name!r}: {e}") from None
    if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):  # not bool
        raise InputError(f"{path}: tensor {name!r} has a malformed shape {shape!r}")
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)
    ):
        raise InputError(f"{path}: tensor {name!r} has malformed data_offsets {offsets!r}")
    numel = math.prod(shape)
    begin, end = offsets
    if end - begin != numel * row.itemsize:
        raise InputError(
            f"{path}: tensor {name!r} spans {end - begin} bytes but {dt}{shape} needs {numel * row.itemsize}"
        )
    return TensorInfo(name, dt, tuple(shape), path, data_start + begin, data_start + end)


@dataclass
class Component:
    """One model's weights inside a checkpoint directory."""

    root: Path  # the checkpoint directory
    rel: str  # the component's subfolder, "." for the root
    shards: list[Path]
    tensors: dict[str, TensorInfo]  # in source order: shard by shard, by offset
    index_path: Path | None
    stem: str  # shard name stem, e.g. "diffusion_pytorch_model"
    config: dict | None
    metadata: dict[Path, dict[str, str]]  # each shard's __metadata__
    file: Path | None = None  # the one checkpoint file given as the source, or None: a folder's
    #: the other files of a model joined to this one (`read.source.with_beside`: its index, its config.json)
    joined_files: tuple[Path, ...] = ()

    @property
    def dir(self) -> Path:
        return self.root if self.rel == "." else self.root / self.rel

    @property
    def where(self) -> Path:
        """The component as a message names it: the one file given as the source, else its folder."""
        return self.dir if self.file is None else self.file

    @property
    def config_path(self) -> Path:
        return self.dir / CONFIG_NAME

    def renamed(self, names: dict[str, str]) -> Component:
        """This component with each tensor under its name in `names` (a release's other naming read as its
        family's own: `models.own_names`), in the same order, the same bytes."""
        tensors = {names[k]: dataclasses.replace(t, name=names[k]) for k, t in self.tensors.items()}
        return dataclasses.replace(self, tensors=tensors)

    def own_files(self) -> list[Path]:
        """The files this component is made of: shards, index, config (and a joined model's index and config)."""
        files = list(self.shards)
        if self.index_path is not None:
            files.append(self.index_path)
        if self.config is not None:
            files.append(self.config_path)
        return files + list(self.joined_files)


def open_component(root: Path, rel: str = ".", file: str | None = None) -> Component:
    """Find and validate one component's shards, index and config, reading headers only; with `file`, the one
    checkpoint file `root / file` (a ``.pth`` read as `read.pth` does)."""
    root = Path(root)
    # then every header is checked
    comp_dir, index_path, stem, shards, owner = component_files(root, rel, file)
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[Path, dict[str, str]] = {}
    for p in shards:
        shard_name = p.relative_to(comp_dir).as_posix()
        header = read_pth_header(p) if p.suffix == PTH_SUFFIX else read_header(p)
        metadata[p] = header.metadata
        for name, info in header.tensors.items():
            if name in tensors:
                raise InputError(
                    f"{comp_dir}: tensor {name!r} is in both {tensors[name].file.name} and {p.name}"
                )
            if owner is not None and owner.get(name) != shard_name:
                where = f"maps it to {owner[name]!r}" if name in owner else "does not list it"
                raise InputError(f"{index_path}: tensor {name!r} is in {shard_name} but the index {where}")
            tensors[name] = info
    if owner is not None:
        missing = sorted(set(owner) - set(tensors))
        if missing:
            raise InputError(f"{index_path}: tensor {missing[0]!r} is listed in the index but in no shard")
    if not tensors:
        raise InputError(f"{comp_dir}: the checkpoint holds no tensors")
    # a file given alone has no config.json: one beside it is its folder's model's (Wan's beside its umT5 .pth)
    config = None if file is not None else _read_config(comp_dir / CONFIG_NAME)
    given = None if file is None else root / file
    return Component(root, rel, shards, tensors, index_path, stem, config, metadata, given)


def _read_config(path: Path) -> dict | None:
    if not path.is_file():
        return None
    return read_json_object(path)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy, writable byte view of a contiguous CPU tensor."""
    if not t.is_contiguous():
        raise ValueError("tensor must be contiguous")
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def _pread_into(fd: int, buf: memoryview, offset: int, path: Path) -> None:
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            raise InputError(f"{path}: unexpected end of file at byte {offset + done}: truncated shard")
        done += n


def read_rows(
    info: TensorInfo, row_start: int, row_end: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Rows ``[row_start, row_end)`` of a tensor (along dim 0; a 0-d tensor is one row), in fresh memory; cast
    to `dtype` if given, straight from the page cache through a short-lived memory map (one copy, not two)."""
    row = dtypes.by_name(info.dtype)
    rows = info.shape[0] if info.shape else 1
    row_bytes = info.nbytes // rows if rows else 0
    # a block type's rows come as their bytes (uint8 [rows, row bytes]), what its format encodes and decodes
    inner = info.shape[1:] if row.block == 1 else (row_bytes,)
    shape = (row_end - row_start, *inner)
    offset, nbytes = info.start + row_start * row_bytes, (row_end - row_start) * row_bytes
    out = None
    if dtype is not None and row.block == 1 and nbytes:
        out = _cast_mapped(info.file, offset, nbytes, row.torch, shape, dtype)
    if out is None:
        out = torch.empty(shape, dtype=row.torch)
        fd = os.open(info.file, os.O_RDONLY)
        try:
            _pread_into(fd, tensor_bytes(out), offset, info.file)
        finally:
            os.close(fd)
        if dtype is not None:
            out = out.to(dtype)
    return out if info.shape else out.reshape(())


def _cast_mapped(
    path: Path, offset: int, nbytes: int, stored: torch.dtype, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor | None:
    """Bytes [offset, offset + nbytes) of `path` as `stored` values of `shape`, cast to `dtype` into fresh memory;
    None where the file cannot be mapped.

    The map is private and lives for the one cast: its pages are the page cache's own (nothing copied into a
    buffer first), never written, and gone from the process's RSS once it is closed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if os.fstat(fd).st_size < offset + nbytes:  # a map past the end would fault (SIGBUS), not raise
            raise InputError(f"{path}: unexpected end of file before byte {offset + nbytes}: truncated shard")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        flags, prot = mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE
        m = mmap.mmap(fd, offset + nbytes - start, flags=flags, prot=prot, offset=start)
    except OSError:  # a file system that cannot map files: the caller reads them
        return None
    finally:
        os.close(fd)
    try:
        stored_values = torch.frombuffer(m, dtype=stored, count=math.prod(shape), offset=offset - start)
        out = stored_values.view(shape).to(dtype, copy=True)
        del stored_values  # the map cannot close while a tensor still points into it
    finally:
        m.close()
    return out


def join_pieces(values: list[torch.Tensor], dim: int, ndim: int) -> torch.Tensor:
    """A tensor of `ndim` dims from its equal pieces along `dim`, in order (a `models.Split` read backwards):
    stacked where they lost that dim (a Conv3d's temporal taps), else concatenated (a fused qkv's thirds)."""
    return torch.stack(values, dim) if values[0].dim() < ndim else torch.cat(values, dim)


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """The whole tensor, read from disk into fresh memory (no memory map kept)."""
    return read_rows(info, 0, info.shape[0] if info.shape else 1)


def read_into(info: TensorInfo, out: torch.Tensor) -> torch.Tensor:
    """Read a tensor's stored bytes into `out`: a contiguous CPU tensor of its dtype and shape (pinned, say); a
    block type's as its rows' bytes (`dtypes.held_shape`)."""
    if out.dtype != dtypes.by_name(info.dtype).torch or tuple(out.shape) != dtypes.held_shape(
        info.dtype, info.shape
    ):
        raise ValueError(
            f"{info.name}: cannot read {info.dtype}{list(info.shape)} into {out.dtype}{list(out.shape)}"
        )
    fd = os.open(info.file, os.O_RDONLY)
    try:
        _pread_into(fd, tensor_bytes(out), info.start, info.file)
    finally:
        os.close(fd)
    return out


def copy_tensor_bytes(info: TensorInfo, write, chunk_bytes: int = 8 << 20) -> None:
    """Stream a tensor's stored bytes, bit-exact, as `write(chunk: memoryview, offset_in_tensor)` calls."""
    buf = bytearray(min(chunk_bytes, max(info.nbytes, 1)))
    view = memoryview(buf)
    fd = os.open(info.file, os.O_RDONLY)
    try:
        pos = info.start
        while pos < info.end:
            n = min(len(buf), info.end - pos)
            _pread_into(fd, view[:n], pos, info.file)
            write(view[:n], pos - info.start)
            pos += n
    finally:
        os.close(fd)
