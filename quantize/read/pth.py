"""Reading a PyTorch ``.pth`` checkpoint (Wan's ``models_t5_umt5-xxl-enc-bf16.pth``) as safetensors are read: each
tensor's dtype, shape and byte range in the file, then its bytes straight from the file, one tensor at a time.

The file is opened once, only with ``torch.load(weights_only=True, mmap=True)``: torch's restricted unpickler, which
builds tensors and the plain containers of a state dict and refuses anything else (a class, a function, any code),
over a memory map of the file, which reads no tensor data. What it returns must be a flat mapping of names to
tensors; anything else is refused naming the key. Each tensor's place in the file is then read off the map (its
address less the map's start, the start checked against the zip's own directory), the map is dropped, and the
tensors are read as every other checkpoint's: `checkpoint.read_rows` from their byte ranges.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from .. import dtypes
from ..errors import InputError

__all__ = ["read_pth"]

#: a zip local file header: signature, version, flags, method, time, date, crc, sizes, name and extra lengths
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIGNATURE = 0x04034B50


def _records(path: Path) -> dict[str, tuple[int, int]]:
    """Each stored record of the zip -> (the offset of its first byte in the file, its size); `InputError` for a
    compressed record (torch writes them stored, which a memory map needs) or a file that is no zip."""
    offsets = {}
    try:
        with zipfile.ZipFile(path) as z, open(path, "rb") as f:
            for info in z.infolist():
                if info.compress_type != zipfile.ZIP_STORED:
                    raise InputError(
                        f"{path}: record {info.filename!r} is compressed: not a checkpoint torch.save wrote"
                    )
                f.seek(info.header_offset)
                fields = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
                if fields[0] != _LOCAL_SIGNATURE:
                    raise InputError(
                        f"{path}: record {info.filename!r} has no zip header: truncated or damaged"
                    )
                start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
                offsets[info.filename] = (start, info.file_size)
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{path}: not a PyTorch checkpoint torch.save wrote (no zip archive: {e})") from None
    return offsets


def _byteorder(path: Path, offsets: dict[str, tuple[int, int]]) -> None:
    """Refuse a checkpoint written on a big-endian machine (its ``byteorder`` record): its bytes are not what a
    little-endian tensor of its dtype holds."""
    record = next((name for name in offsets if name.endswith("/byteorder")), None)
    if record is None:
        return
    with open(path, "rb") as f:
        f.seek(offsets[record][0])
        order = f.read(len("little"))
    if order != b"little":
        raise InputError(
            f"{path}: written on a big-endian machine ({order!r}): only little-endian checkpoints are read"
        )


def _state_dict(path: Path) -> Mapping:
    """The checkpoint's object, through torch's weights-only unpickler over a memory map of the file (no tensor
    data read); `InputError` naming what it refused."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001  (the weights-only unpickler's refusal, or a damaged file)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        why = next((line for line in lines if "Unsupported" in line), lines[0] if lines else type(e).__name__)
        raise InputError(
            f"{path}: not read: torch's weights-only loader refused it ({why}): only a state dict of tensors is read"
        ) from None
    if not isinstance(state, Mapping):
        raise InputError(
            f"{path}: holds a {type(state).__name__}, not a state dict of tensors (name -> tensor)"
        )
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise InputError(
                f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor: only a state dict of tensors "
                "is read"
            )
    return state


def read_pth(path: Path) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """(name, safetensors dtype, shape, first byte, end byte) of each tensor of the ``.pth`` file at `path`, in its
    order; `InputError` naming the file and the entry for anything but a flat state dict of contiguous
    little-endian tensors."""
    path = Path(path)
    offsets = _records(path)
    _byteorder(path, offsets)
    # the storages, ``<archive>/data/<key>`` (``.data/`` holds torch's serialization id): offset -> size
    records = dict(at for name, at in offsets.items() if "/data/" in name and "/.data/" not in name)
    state = _state_dict(path)
    try:
        return _places(path, state, records)
    finally:
        del state  # the map closes with its last tensor


def _places(
    path: Path, state: Mapping, records: dict[int, int]
) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """Each tensor's byte range in the file: its storage's address less the map's start, which is the one address
    that puts every storage at the start of a data record of the zip."""
    tensors = {k: v for k, v in state.items() if v.numel()}
    storages = {v.untyped_storage().data_ptr() for v in tensors.values()}
    starts = sorted(records)
    lowest = min(storages, default=0)
    base = next((lowest - s for s in starts if all(p - (lowest - s) in records for p in storages)), None)
    if tensors and base is None:
        raise InputError(f"{path}: its tensors do not lie where its zip directory puts its records: damaged")
    out = []
    for name, t in state.items():
        row = dtypes.by_torch(t.dtype)
        nbytes = t.numel() * row.itemsize
        if not t.numel():
            out.append((name, row.name, tuple(t.shape), 0, 0))
            continue
        if not t.is_contiguous():
            raise InputError(f"{path}: tensor {name!r} is a strided view, not contiguous: save it contiguous")
        storage = t.untyped_storage().data_ptr() - base
        start = t.data_ptr() - base
        if start + nbytes > storage + records[storage]:
            raise InputError(f"{path}: tensor {name!r} runs past its record: truncated or damaged")
        out.append((name, row.name, tuple(t.shape), start, start + nbytes))
    return out
