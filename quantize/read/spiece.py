"""SentencePiece model files (``spiece.model``, a T5 / umT5 tokenizer), read and written without sentencepiece.

A ``.model`` file is one serialized ``ModelProto`` (sentencepiece's ``sentencepiece_model.proto``): its pieces
(field 1: piece, score, type), its ``TrainerSpec`` (field 2: the model type, the unk / bos / eos / pad ids) and
its ``NormalizerSpec`` (field 3: the precompiled character map, ``add_dummy_prefix``,
``remove_extra_whitespaces``). What a runtime needs of it lives here, read off the protobuf wire format:

- ComfyUI reads a text encoder's tokenizer as these bytes, the tensor ``spiece_model`` of its file;
- a GGUF file holds it as ``tokenizer.ggml.*`` key-values, which llama.cpp's converter makes from the same
  fields (`SentencePieceModel`), and ComfyUI-GGUF turns back into a ``ModelProto`` for ComfyUI.

`write_spiece` writes a model of given pieces (the examples' tokenizers); sentencepiece's own processor loads
it (tested). No torch.

>>> m = read_spiece_bytes(write_spiece([("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2), ("▁a", -1.0, 1)]))
>>> [p.piece for p in m.pieces], m.eos_id, m.pad_id, m.add_dummy_prefix
(['<pad>', '</s>', '<unk>', '▁a'], 1, 0, True)
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

__all__ = ["Piece", "SentencePieceModel", "read_spiece", "read_spiece_bytes", "write_spiece", "PIECE_TYPES"]

#: sentencepiece's ``SentencePiece.Type`` (the same numbers as GGUF's token types)
PIECE_TYPES = {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6}
_UNIGRAM = 1  # TrainerSpec.model_type

# wire types
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(frozen=True)
class Piece:
    piece: str
    score: float
    type: int = PIECE_TYPES["NORMAL"]


@dataclass(frozen=True)
class SentencePieceModel:
    """What a runtime reads of a ``ModelProto``; the defaults are the proto's own."""

    pieces: tuple[Piece, ...]
    model_type: int = _UNIGRAM
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    precompiled_charsmap: bytes = b""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("a varint runs past the end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterable[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a message: an int for varints and fixed-width fields, bytes for the
    length-delimited ones."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _LEN:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ValueError(f"field {number} runs past the end")
            value, pos = data[pos : pos + size], pos + size
        elif wire == _I32:
            value, pos = struct.unpack_from("<I", data, pos)[0], pos + 4
        elif wire == _I64:
            value, pos = struct.unpack_from("<Q", data, pos)[0], pos + 8
        else:
            raise ValueError(f"field {number} has wire type {wire}")
        yield number, wire, value


def _int32(value: int) -> int:
    """A varint-encoded int32 (negative ones take ten bytes, two's complement over 64 bits)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _piece(data: bytes) -> Piece:
    piece, score, type_ = "", 0.0, PIECE_TYPES["NORMAL"]
    for number, wire, value in _fields(data):
        if number == 1 and wire == _LEN:
            piece = value.decode("utf-8")
        elif number == 2 and wire == _I32:
            score = struct.unpack("<f", struct.pack("<I", value))[0]
        elif number == 3 and wire == _VARINT:
            type_ = value
    return Piece(piece, score, type_)


def read_spiece_bytes(data: bytes, where: str = "spiece.model") -> SentencePieceModel:
    """The model a serialized ``ModelProto`` holds; `InputError` naming `where` when it is not one."""
    pieces, trainer, normalizer = [], {}, {}
    try:
        for number, wire, value in _fields(bytes(data)):
            if number == 1 and wire == _LEN:
                pieces.append(_piece(value))
            elif number == 2 and wire == _LEN:
                trainer = {n: v for n, w, v in _fields(value) if w == _VARINT}
            elif number == 3 and wire == _LEN:
                normalizer = {n: (v, w) for n, w, v in _fields(value)}
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise InputError(f"{where}: not a SentencePiece model ({e})") from None
    if not pieces:
        raise InputError(f"{where}: not a SentencePiece model (it holds no pieces)")

    def flag(number: int) -> bool:
        value, wire = normalizer.get(number, (1, _VARINT))
        return bool(value) if wire == _VARINT else True

    charsmap = normalizer.get(2, (b"", _LEN))
    return SentencePieceModel(
        pieces=tuple(pieces),
        model_type=trainer.get(3, _UNIGRAM),
        unk_id=_int32(trainer.get(40, 0)),
        bos_id=_int32(trainer.get(41, 1)),
        eos_id=_int32(trainer.get(42, 2)),
        pad_id=_int32(trainer.get(43, (1 << 64) - 1)),
        add_dummy_prefix=flag(3),
        remove_extra_whitespaces=flag(4),
        precompiled_charsmap=charsmap[0] if charsmap[1] == _LEN else b"",
    )


@functools.lru_cache(maxsize=4)
def _read_cached(path: Path, size: int, mtime_ns: int) -> SentencePieceModel:
    return read_spiece_bytes(path.read_bytes(), str(path))


def read_spiece(path: Path) -> SentencePieceModel:
    """The model of a ``.model`` file (read once while the file is unchanged)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(f"{path}: cannot read the tokenizer ({e.strerror or e})") from None
    return _read_cached(path, st.st_size, st.st_mtime_ns)


# --- writing -----------------------------------------------------------------------------------------------


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, _LEN) + _encode_varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _key(number, _VARINT) + _encode_varint(value)


def write_spiece(
    pieces: Iterable[tuple[str, float, int]],
    *,
    unk_id: int = 2,
    eos_id: int = 1,
    pad_id: int = 0,
    bos_id: int = -1,
    byte_fallback: bool = True,
) -> bytes:
    """A serialized unigram ``ModelProto`` of `pieces` ((piece, score, type) in id order), with T5's special ids
    by default (pad 0, eos 1, unk 2, no bos), umT5's byte fallback (`pieces` must then hold the 256 BYTE pieces
    ``<0x00>`` .. ``<0xFF>``) and an identity normalizer that adds a dummy prefix and removes extra whitespace, as
    T5's does. Each special id's piece is named in the ``TrainerSpec`` where it is not the proto's default
    (Gemma's ``<bos>``, not ``<s>``): sentencepiece finds the special pieces by those names."""
    pieces, out = list(pieces), bytearray()
    for piece, score, type_ in pieces:
        body = _len_field(1, piece.encode("utf-8"))
        body += _key(2, _I32) + struct.pack("<f", score) + _varint_field(3, type_)
        out += _len_field(1, body)
    trainer = _varint_field(3, _UNIGRAM) + _varint_field(4, len(pieces)) + _varint_field(35, byte_fallback)
    specials = ((40, unk_id, "<unk>"), (41, bos_id, "<s>"), (42, eos_id, "</s>"), (43, pad_id, "<pad>"))
    trainer += b"".join(_varint_field(n, v) for n, v, _ in specials)
    trainer += b"".join(
        _len_field(n + 5, pieces[v][0].encode("utf-8"))
        for n, v, default in specials
        if 0 <= v < len(pieces) and pieces[v][0] != default
    )
    out += _len_field(2, trainer)
    normalizer = _len_field(1, b"identity") + _varint_field(3, 1) + _varint_field(4, 1) + _varint_field(5, 1)
    out += _len_field(3, normalizer)
    return bytes(out)
