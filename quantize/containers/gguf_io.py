"""GGUF v3 files: the layout computed up front, tensor data written streaming at known offsets (read back by `read.gguf`).

A GGUF file is a header (magic ``GGUF``, version 3, tensor count, key-value count), the key-values, the
tensor infos (name, dims innermost first, GGML type id, offset from the data start), padding to the
alignment (32 unless ``general.alignment`` says otherwise), then each tensor's bytes, each padded to the
alignment. Everything but the data follows from names, shapes and types alone, so, as for safetensors
(`writer.ShardWriter`), the header is written first and each tensor's rows land at their place with
``os.pwrite``, from any thread, in any order; nothing is held in memory. For the same key-values and
tensors in the same order, the bytes are those gguf-py's `GGUFWriter` writes (tested), which holds every
tensor in RAM until it writes.

Type facts (block size, bytes a block, GGML type id) come from the one dtype table, `quantize.dtypes`, whose
GGML rows are those of the one GGML table, `quantize.ggml_types`.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import dtypes
from ..errors import InputError
from ..read.checkpoint import tensor_bytes
from ..read.gguf import ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, pad, read_gguf
from .writer import PlacedWrites

__all__ = [
    "GGUF_MAGIC",
    "GGUF_VERSION",
    "ALIGNMENT",
    "GGUFArray",
    "GGUFTensor",
    "header_bytes",
    "GGUFWriter",
    "read_gguf",
]

# GGUF's value types (gguf.constants.GGUFValueType)
_UINT8, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = 0, 4, 5, 6, 7, 8, 9


@dataclass(frozen=True)
class GGUFArray:
    """An array key-value: its element type (``"str"``, ``"int32"``, ``"float32"``, ``"uint8"``) and its values, as
    llama.cpp's tokenizer fields are (``tokenizer.ggml.tokens`` strings, ``scores`` float32, ``token_type`` int32,
    ``precompiled_charsmap`` uint8)."""

    kind: str
    values: tuple | bytes

    def data(self) -> bytes:
        if self.kind == "str":
            return struct.pack("<IQ", _STRING, len(self.values)) + b"".join(_string(v) for v in self.values)
        code, fmt = {"int32": (_INT32, "i"), "float32": (_FLOAT32, "f"), "uint8": (_UINT8, "B")}[self.kind]
        return struct.pack(f"<IQ{len(self.values)}{fmt}", code, len(self.values), *self.values)


#: a key-value's value: a string, a UINT32, a FLOAT32, a BOOL, or an array
Value = str | int | float | bool | GGUFArray


@dataclass(frozen=True)
class GGUFTensor:
    """A tensor to be written: name, dtype name from `dtypes` (F32, BF16, Q8_0, Q4_K...), logical shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)

    @property
    def ggml_type(self) -> int:
        row = dtypes.by_name(self.dtype)
        if row.ggml is None:
            raise InputError(
                f"tensor {self.name!r}: {self.dtype} has no GGML type: a GGUF file cannot hold it"
            )
        return row.ggml


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value) -> bytes:
    """A key-value's type and value: strings as STRING, ints as UINT32 (GGUF's file type, versions, llama.cpp's
    hyperparameters and token ids), floats as FLOAT32 (its epsilons), bools as BOOL, `GGUFArray`s as ARRAY."""
    if isinstance(value, str):
        return struct.pack("<I", _STRING) + _string(value)
    if isinstance(value, bool):
        return struct.pack("<IB", _BOOL, value)
    if isinstance(value, int):
        return struct.pack("<II", _UINT32, value)
    if isinstance(value, float):
        return struct.pack("<If", _FLOAT32, value)
    if isinstance(value, GGUFArray):
        return struct.pack("<I", _ARRAY) + value.data()
    raise TypeError(f"GGUF metadata value {value!r}: not a str, int, float, bool or GGUFArray")


def header_bytes(metadata: dict[str, Value], tensors: list[GGUFTensor]) -> tuple[bytes, list[int]]:
    """Everything before the tensor data (padded to the alignment), and each tensor's offset from the data start."""
    out = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata)))
    for key, value in metadata.items():
        out += _string(key) + _value(value)
    offsets, offset = [], 0
    for t in tensors:
        out += _string(t.name) + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", d) for d in reversed(t.shape))  # GGML's ne: innermost first
        out += struct.pack("<IQ", t.ggml_type, offset)
        offsets.append(offset)
        offset += pad(t.nbytes)
    out += b"\0" * (pad(len(out)) - len(out))
    return bytes(out), offsets


def written_size(metadata: dict[str, Value], tensors: list[GGUFTensor]) -> int:
    """The size of the file `GGUFWriter` writes for these key-values and tensors."""
    header, offsets = header_bytes(metadata, tensors)
    return len(header) + (offsets[-1] + pad(tensors[-1].nbytes) if tensors else 0)


class GGUFWriter(PlacedWrites):
    """One GGUF file being written; tensors (or row ranges of them) may arrive in any order, from any thread.

    Created exclusively (never overwriting), sized up front, and checked at `close` for every planned byte.
    The same calls as `writer.ShardWriter` (write, write_bytes, close, abort), so a container can hand it out.
    """

    def __init__(self, path: Path, tensors: Iterable[GGUFTensor], metadata: dict[str, Value]):
        self.path = Path(path)
        self.tensors = list(tensors)
        header, offsets = header_bytes(metadata, self.tensors)
        self._offsets = {t.name: (len(header) + off, t) for t, off in zip(self.tensors, offsets, strict=True)}
        if len(self._offsets) != len(self.tensors):
            raise ValueError(f"{self.path.name}: a tensor name is given twice")
        self._end = written_size(metadata, self.tensors)
        self._written = dict.fromkeys(self._offsets, 0)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._pwrite(memoryview(header), 0)
            os.ftruncate(self._fd, self._end)  # the padding between tensors stays zero
        except OSError as e:
            os.close(self._fd)
            raise OSError(e.errno, e.strerror, str(self.path)) from None

    def write(self, name: str, tensor: torch.Tensor, row_start: int = 0) -> None:
        """Rows ``[row_start, row_start + len(tensor))`` of `name`: values of its dtype, or for a block type the
        rows' bytes (uint8 [rows, row bytes], what its format encodes)."""
        _, spec = self._offsets[name]
        row = dtypes.by_name(spec.dtype)
        rows = spec.shape[0] if spec.shape else 1
        row_bytes = spec.nbytes // rows if rows else 0
        ok_dtype = tensor.dtype == (torch.uint8 if row.block > 1 else row.torch)
        if not ok_dtype or tensor.numel() * tensor.element_size() % max(1, row_bytes):
            raise ValueError(
                f"{self.path.name}: rows of {name!r} are {tensor.dtype}{list(tensor.shape)}, planned "
                f"{spec.dtype}{list(spec.shape)}"
            )
        contiguous = tensor.contiguous()
        self.write_bytes(name, tensor_bytes(contiguous), row_start * row_bytes)
        del contiguous

    def close(self, sync: bool = True) -> int:
        """Check every tensor was written whole and, with `sync`, flush; returns the tensor data bytes."""
        try:
            self._check_written_whole()
            if sync:
                os.fsync(self._fd)
            return sum(t.nbytes for t in self.tensors)
        finally:
            os.close(self._fd)


# --- reading ---------------------------------------------------------------------------------------
