"""Reading GGUF v3 files: the key-values and each tensor's place (dtype name, logical shape, byte range), validated.

A GGUF file is a header (magic ``GGUF``, version 3, tensor count, key-value count), the key-values, the
tensor infos (name, dims innermost first, GGML type id, offset from the data start), padding to the
alignment (32 unless ``general.alignment`` says otherwise), then each tensor's bytes, each padded to the
alignment. `read_gguf` gives the tensors as `TensorInfo`s, as the safetensors reader does, so a GGUF
component is read (`read_rows`, a memory map) like any other: a block type's rows as their bytes.
The writer is `containers.gguf_io`.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .. import dtypes
from ..errors import InputError
from .checkpoint import CONFIG_NAME, Component, TensorInfo
from .files import read_json_object

__all__ = [
    "GGUF_MAGIC",
    "GGUF_VERSION",
    "ALIGNMENT",
    "read_gguf",
    "key_values_of",
    "open_gguf_component",
    "pad",
]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32  # GGUF's default `general.alignment`

# GGUF's value types (gguf.constants.GGUFValueType)
_STRING = 8
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_ARRAY = 9


def pad(n: int, align: int = ALIGNMENT) -> int:
    """`n` rounded up to a multiple of `align`."""
    return (n + align - 1) // align * align


class _Cursor:
    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise InputError(f"{self.path}: GGUF header runs past the end of the file: truncated or not GGUF")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise InputError(f"{self.path}: GGUF string runs past the end of the file")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise InputError(f"{self.path}: a GGUF string is not UTF-8") from None

    def value(self, vtype: int, depth: int = 0):
        if vtype == _STRING:
            return self.string()
        if vtype in _SCALARS:
            return self.take("<" + _SCALARS[vtype])
        if vtype == _ARRAY and depth < 4:
            item_type, n = self.take("<IQ")
            return [self.value(item_type, depth + 1) for _ in range(n)]
        raise InputError(f"{self.path}: unknown GGUF value type {vtype}")


_MAX_HEADER = 256 << 20


def read_gguf(path: Path) -> tuple[dict[str, object], dict[str, TensorInfo]]:
    """The key-values and the tensors (absolute byte ranges, logical shapes, dtype names) of a GGUF v3 file,
    validated: offsets aligned, in bounds, not overlapping; every byte range the size its type and shape need."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(min(size, _MAX_HEADER))
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    c = _Cursor(data, path)
    n_tensors, metadata = _key_values(c)
    align = metadata.get("general.alignment", ALIGNMENT)
    if type(align) is not int or align <= 0 or align % 8:
        raise InputError(f"{path}: general.alignment is {align!r}, not a positive multiple of 8")
    raw = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        if n_dims > 8:
            raise InputError(f"{path}: tensor {name!r} has {n_dims} dims")
        ne = [c.take("<Q") for _ in range(n_dims)]
        type_id, offset = c.take("<IQ")
        raw.append((name, tuple(reversed(ne)), type_id, offset))
    data_start = pad(c.pos, align)
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, shape, type_id, offset in raw:
        try:
            dt = dtypes.by_ggml(type_id)
            n = dtypes.nbytes(dt.name, shape)
        except InputError as e:
            raise InputError(f"{path}: tensor {name!r}: {e}") from None
        start = data_start + offset
        if offset % align or start + n > size:
            raise InputError(
                f"{path}: tensor {name!r} at offset {offset} ({n} bytes) is misaligned or past the end"
            )
        if name in tensors:
            raise InputError(f"{path}: tensor {name!r} is listed twice")
        tensors[name] = TensorInfo(name, dt.name, shape, path, start, start + n)
        spans.append((start, start + n, name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise InputError(f"{path}: tensors {a!r} and {b!r} overlap")
    return metadata, tensors


def _key_values(c: _Cursor) -> tuple[int, dict[str, object]]:
    """The tensor count and the key-values of the GGUF header `c` starts at (moved past them)."""
    if c.take("<4s") != GGUF_MAGIC:
        raise InputError(f"{c.path}: not a GGUF file (no GGUF magic)")
    version, n_tensors, n_kv = c.take("<IQQ")
    if version != GGUF_VERSION:
        raise InputError(f"{c.path}: GGUF version {version}; only version {GGUF_VERSION} is read")
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.take("<I"))
    return n_tensors, metadata


def key_values_of(header: bytes, where: Path) -> dict[str, object]:
    """The key-values of a GGUF header given as bytes (`where` names it in errors), read as `read_gguf` reads a
    file's: what a written header is compared by."""
    return _key_values(_Cursor(header, Path(where)))[1]


def open_gguf_component(root: Path, rel: str = ".") -> Component:
    """A component stored as one GGUF file: the folder's one ``*.gguf`` model file, with its companions (a file
    named ``<type>-<the model file's name>`` whose ``general.type`` is that type: a vision tower's ``mmproj-``, as
    `containers.gguf_file` writes it), whose tensors join the model's; and the folder's config.json (None where
    there is none). Any other ``*.gguf`` there is refused. Headers only."""
    folder = Path(root) if rel == "." else Path(root) / rel
    headers = {p: read_gguf(p) for p in sorted(folder.glob("*.gguf"))}

    def kind(p: Path) -> str:
        return str(headers[p][0].get("general.type", "model"))

    models = [p for p in headers if kind(p) == "model"]
    if len(models) != 1:
        what = "no *.gguf model file" if not models else f"{len(models)} *.gguf model files"
        named = f" ({', '.join(p.name for p in models)})" if models else ""
        raise InputError(
            f"{folder}: {what}{named}: a GGUF component is one file (and its companions: mmproj)"
        )
    (path,) = models
    companions = [p for p in headers if p != path and p.name == f"{kind(p)}-{path.name}"]
    strays = [p.name for p in headers if p != path and p not in companions]
    if strays:
        raise InputError(
            f"{folder}: {', '.join(strays)} beside {path.name}: a GGUF component is one model file and its "
            f"companions (mmproj-{path.name}); move the others out"
        )
    tensors = dict(headers[path][1])
    if not tensors:
        raise InputError(f"{path}: the GGUF file holds no tensors")
    for companion in companions:
        for key, info in headers[companion][1].items():
            if key in tensors:
                raise InputError(f"{companion}: tensor {key!r} is in {path.name} too: one tensor, one file")
            tensors[key] = info
    files = [path, *companions]
    config = read_json_object(folder / CONFIG_NAME) if (folder / CONFIG_NAME).is_file() else None
    return Component(Path(root), rel, files, tensors, None, path.stem, config, {f: {} for f in files})
