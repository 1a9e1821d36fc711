"""SentencePiece model files (``spiece.model``, a T5 / umT5 tokenizer), read and written without sentencepiece.

A ``.model`` file is one serialized ``ModelProto`` (sentencepiece's ``sentencepiece_model.proto``): its pieces
(field 1: piece, score, type), its ``TrainerSpec`` (field 2: the model type, the unk / bos / eos / pad ids) and
its ``NormalizerSpec`` (field 3: the precompiled character map, ``add_dummy_prefix``,
``remove_extra_whitespaces``). What a runtime needs of it lives here, read off the protobuf wire format:

- ComfyUI reads a text encoder's tokenizer as these bytes, the tensor ``spiece_model`` of its file;
- a GGUF file holds it as ``tokenizer.ggml.*`` key-values, which llama.cpp's converter makes from the same
  fields (`SentencePieceModel`), and ComfyUI-GGUF turns back into a ``ModelProto`` for ComfyUI.

`write_spiece` writes a model of given pieces (the examples' tokenizers); sentencepiece's own processor loads
it (tested). `spiece_from_tokenizer_json` rebuilds the model a ``tokenizer.json`` was converted from (transformers
5 saves a T5 tokenizer as that file alone), or refuses one it cannot rebuild faithfully; `tokenizer_model_bytes`
gives the model bytes of either file, checked. No torch.

>>> m = read_spiece_bytes(write_spiece([("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2), ("▁a", -1.0, 1)]))
>>> [p.piece for p in m.pieces], m.eos_id, m.pad_id, m.add_dummy_prefix
(['<pad>', '</s>', '<unk>', '▁a'], 1, 0, True)
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

__all__ = [
    "Piece",
    "SentencePieceModel",
    "read_spiece",
    "read_spiece_bytes",
    "write_spiece",
    "spiece_from_tokenizer_json",
    "tokenizer_model_bytes",
    "PIECE_TYPES",
]

#: sentencepiece's ``SentencePiece.Type`` (the same numbers as GGUF's token types)
PIECE_TYPES = {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6}
_TYPE_NUMBERS = frozenset(PIECE_TYPES.values())
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
    _check_pieces(pieces, where)

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


def _check_pieces(pieces: list[Piece], where: str) -> None:
    """What sentencepiece's processor checks of the pieces when it loads a model (`ModelInterface`): each piece's
    type one it knows, no piece empty or twice, one unknown piece; `InputError` naming `where` otherwise (bytes
    that merely parse as a protobuf message are no tokenizer a runtime loads)."""
    why, seen, unknown = None, set(), 0
    for i, p in enumerate(pieces):
        if p.type not in _TYPE_NUMBERS:
            why = f"piece {i} has type {p.type}, which is none of sentencepiece's"
        elif not p.piece:
            why = f"piece {i} is empty"
        elif p.piece in seen:
            why = f"piece {p.piece!r} appears twice"
        if why is not None:
            break
        seen.add(p.piece)
        unknown += p.type == PIECE_TYPES["UNKNOWN"]
    else:
        if unknown != 1:
            why = f"it has {unknown} unknown pieces, sentencepiece needs one"
    if why is not None:
        raise InputError(f"{where}: not a SentencePiece model ({why})")


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
    add_dummy_prefix: bool = True,
    remove_extra_whitespaces: bool = True,
    precompiled_charsmap: bytes = b"",
) -> bytes:
    """A serialized unigram ``ModelProto`` of `pieces` ((piece, score, type) in id order), with T5's special ids
    by default (pad 0, eos 1, unk 2, no bos), umT5's byte fallback (`pieces` must then hold the 256 BYTE pieces
    ``<0x00>`` .. ``<0xFF>``) and a normalizer that adds a dummy prefix and removes extra whitespace, as T5's does:
    the identity, or the character map `precompiled_charsmap` (what sentencepiece's own ``nmt_nfkc`` compiles to).
    Each special id's piece is named in the ``TrainerSpec`` where it is not the proto's default (Gemma's ``<bos>``,
    not ``<s>``): sentencepiece finds the special pieces by those names."""
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
    # a map's name says nothing at run time (sentencepiece applies the map); "user_defined" is its name for a
    # map it did not compile from one of its own rules
    name = b"user_defined" if precompiled_charsmap else b"identity"
    normalizer = _len_field(1, name)
    if precompiled_charsmap:
        normalizer += _len_field(2, bytes(precompiled_charsmap))
    normalizer += _varint_field(3, add_dummy_prefix) + _varint_field(4, remove_extra_whitespaces)
    normalizer += _varint_field(5, 1)
    out += _len_field(3, normalizer)
    return bytes(out)


# --- a tokenizer.json's unigram model, as the SentencePiece model it was converted from -------------------------

_META = "▁"  # what SentencePiece writes a space as
_BYTE_PIECES = tuple(f"<0x{b:02X}>" for b in range(256))
#: the normalizer steps of transformers' converters of a SentencePiece model, each with the fact it stands for:
#: runs of spaces made one and the ends stripped (``remove_extra_whitespaces``), spaces written as ``▁``, Metaspace's
#: skipped dummy prefix put back (sentencepiece adds one to a text that starts with ``▁`` too: no fact of its own)
_NORMALIZER_STEPS = {
    ("Replace", '{"Regex": " {2,}"}', " "): "collapse",
    ("Replace", '{"Regex": " {2,}"}', _META): "collapse",
    ("Replace", '{"Regex": "\\\\A +| +\\\\z"}', ""): "collapse",
    ("Replace", '{"String": " "}', _META): "escape",
    ("Replace", '{"Regex": "\\\\A' + _META + '"}', _META * 2): "",
}
_REBUILD_HINT = "put the spiece.model it was made from beside it instead"


def _refused(where: str, why: str) -> InputError:
    return InputError(
        f"{where}: {why}, which a SentencePiece model (what ComfyUI and ComfyUI-GGUF read) cannot reproduce "
        f"faithfully: {_REBUILD_HINT}"
    )


def _steps(node: object, key: str, where: str) -> list[dict]:
    """A normalizer's or pre-tokenizer's steps in order, its Sequences flattened (`key`: a Sequence's list)."""
    if node is None:
        return []
    if not isinstance(node, dict) or not isinstance(node.get("type"), str):
        raise InputError(f"{where}: not a tokenizer.json (a {key[:-1]} without a type)")
    if node["type"] == "Sequence":
        return [step for child in node.get(key) or [] for step in _steps(child, key, where)]
    return [node]


def _step_words(step: dict) -> str:
    return json.dumps(step, ensure_ascii=False)[:120]


def _special_name(value: object) -> str | None:
    """A special token as a tokenizer_config.json names it: a string, or an AddedToken's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def spiece_from_tokenizer_json(data: bytes, where: str, config: Mapping | None = None) -> bytes:
    """The serialized unigram ``ModelProto`` (`write_spiece`) that the Hugging Face ``tokenizer.json`` `data` was
    converted from, by transformers' converters of a ``spiece.model`` (T5's and umT5's: transformers 5 saves a
    T5 tokenizer as a tokenizer.json alone), so that sentencepiece's processor tokenizes as that model did:

    - its pieces and scores in id order: the model's ``unk_id`` the unknown piece, an added special token a
      control piece (never matched in text), any other added token a user-defined one;
    - byte fallback where the model has it, or where its vocabulary holds the 256 byte pieces ``<0x00>`` ..
      ``<0xFF>`` (those pieces then BYTE): transformers' converter keeps the pieces but drops sentencepiece's
      flag (`SpmConverter` warns so), and a model with byte pieces is one that fell back to them;
    - the normalizer's precompiled character map (what sentencepiece's ``nmt_nfkc`` compiles to), the dummy
      prefix (Metaspace's ``prepend_scheme``, or ``add_prefix_space``) and the removal of extra whitespace (a
      WhitespaceSplit, or the normalizer's collapsing of spaces);
    - the eos, bos and pad pieces that `config` (the ``tokenizer_config.json`` beside it) names, else its
      post-processor's (T5's appended ``</s>``), else sentencepiece's defaults, where they are control pieces.

    `InputError` in one line naming `where` for a file that is no tokenizer.json, and for one whose model (a BPE
    or WordPiece one), normalizer or pre-tokenizer steps SentencePiece has no equivalent of."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{where}: not a tokenizer.json ({e})") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict):
        raise InputError(f"{where}: not a tokenizer.json (it holds no model)")
    if model.get("type") != "Unigram":
        raise _refused(where, f"its model is a {model.get('type')!r} one, not a Unigram one")
    vocab = model.get("vocab")
    if not isinstance(vocab, list) or not vocab:
        raise InputError(f"{where}: not a tokenizer.json (its Unigram model has no vocab)")
    pieces: list[list] = []
    for i, entry in enumerate(vocab):
        ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
        if not ok or isinstance(entry[1], bool) or not isinstance(entry[1], (int, float)):
            raise InputError(f"{where}: not a tokenizer.json (vocab entry {i} is no [piece, score])")
        pieces.append([entry[0], float(entry[1]), PIECE_TYPES["NORMAL"]])
    unk = model.get("unk_id")
    if isinstance(unk, bool) or not isinstance(unk, int) or not 0 <= unk < len(pieces):
        raise _refused(where, "its model has no unknown piece (unk_id: null), which sentencepiece requires")
    pieces[unk][2] = PIECE_TYPES["UNKNOWN"]

    beyond: dict[int, tuple[str, int]] = {}
    for token in doc.get("added_tokens") or []:
        token = token if isinstance(token, dict) else {}
        id_, content = token.get("id"), token.get("content")
        if isinstance(id_, bool) or not isinstance(id_, int) or id_ < 0 or not isinstance(content, str):
            raise InputError(f"{where}: not a tokenizer.json (an added token without an id and content)")
        type_ = PIECE_TYPES["CONTROL"] if token.get("special") else PIECE_TYPES["USER_DEFINED"]
        if id_ >= len(pieces):
            beyond[id_] = (content, type_)
        elif pieces[id_][0] != content:
            raise _refused(
                where, f"its added token {content!r} has id {id_}, the model's piece {pieces[id_][0]!r}"
            )
        elif id_ != unk:
            pieces[id_][2] = type_
    for id_ in sorted(beyond):  # added past the model's vocabulary: pieces of their own, in id order
        if id_ != len(pieces):
            raise _refused(
                where,
                f"its added token {beyond[id_][0]!r} has id {id_}, past a gap after id {len(pieces) - 1}",
            )
        pieces.append([beyond[id_][0], 0.0, beyond[id_][1]])
    index: dict[str, int] = {}
    for i, (piece, _, _) in enumerate(pieces):
        if not piece or piece in index:
            raise _refused(where, f"piece {i} ({piece!r}) is empty or appears twice")
        index[piece] = i

    has_bytes = all(b in index for b in _BYTE_PIECES)
    byte_fallback = bool(model.get("byte_fallback")) or has_bytes
    if byte_fallback:
        if not has_bytes:
            raise _refused(
                where, "its model falls back to bytes without the 256 byte pieces <0x00> .. <0xFF>"
            )
        for b in _BYTE_PIECES:
            if pieces[index[b]][2] != PIECE_TYPES["NORMAL"]:
                raise _refused(where, f"its byte piece {b!r} is an added token")
            pieces[index[b]][2] = PIECE_TYPES["BYTE"]

    charsmap, facts = b"", set()
    for i, step in enumerate(_steps(doc.get("normalizer"), "normalizers", where)):
        kind = step["type"]
        if kind == "Precompiled" and i == 0:
            try:
                charsmap = base64.b64decode(step.get("precompiled_charsmap") or "", validate=True)
            except (binascii.Error, TypeError, ValueError) as e:
                raise InputError(f"{where}: not a tokenizer.json (its precompiled_charsmap: {e})") from None
        elif kind == "Strip" and step.get("strip_right", True):
            facts.add("collapse")
        elif kind == "Prepend" and step.get("prepend") == _META:
            facts.add("dummy")
        else:
            key = (kind, json.dumps(step.get("pattern"), ensure_ascii=False), step.get("content"))
            if key not in _NORMALIZER_STEPS:
                raise _refused(
                    where, f"its normalizer step {_step_words(step)} has no SentencePiece equivalent"
                )
            facts.add(_NORMALIZER_STEPS[key])
    for step in _steps(doc.get("pre_tokenizer"), "pretokenizers", where):
        if step["type"] == "WhitespaceSplit":
            facts.add("collapse")
        elif step["type"] == "Metaspace" and step.get("replacement", _META) == _META:
            scheme = step.get("prepend_scheme")
            if scheme is None:  # tokenizers' older spelling
                scheme = "always" if step.get("add_prefix_space", True) else "never"
            if scheme not in ("always", "first", "never"):
                raise _refused(where, f"its Metaspace pre-tokenizer prepends {scheme!r}")
            facts |= {"escape", "dummy"} if scheme != "never" else {"escape"}
        else:
            raise _refused(
                where, f"its pre-tokenizer step {_step_words(step)} has no SentencePiece equivalent"
            )
    if "escape" not in facts:
        raise _refused(
            where, "it does not write a space as ▁ (no Metaspace pre-tokenizer), as SentencePiece does"
        )

    config = config or {}
    post = doc.get("post_processor") if isinstance(doc.get("post_processor"), dict) else {}
    template = post.get("single") if post.get("type") == "TemplateProcessing" else None
    template = [t.get("SpecialToken", {}).get("id") for t in template or [] if isinstance(t, dict)]

    def special(key: str, default: str, placed: str | None) -> int:
        name = _special_name(config.get(key)) or placed or default
        i = index.get(name, -1)
        return i if i >= 0 and pieces[i][2] == PIECE_TYPES["CONTROL"] else -1

    eos = special("eos_token", "</s>", template[-1] if template else None)
    bos = special("bos_token", "<s>", template[0] if template else None)
    pad_name = (doc.get("padding") or {}).get("pad_token") if isinstance(doc.get("padding"), dict) else None
    pad = special("pad_token", "<pad>", pad_name)
    return write_spiece(
        [(p, s, t) for p, s, t in pieces],
        unk_id=unk,
        eos_id=eos,
        pad_id=pad,
        bos_id=bos,
        byte_fallback=byte_fallback,
        add_dummy_prefix="dummy" in facts,
        remove_extra_whitespaces="collapse" in facts,
        precompiled_charsmap=charsmap,
    )


#: the file transformers saves a tokenizer's settings in, beside its tokenizer.json (the special tokens' names)
TOKENIZER_CONFIG = "tokenizer_config.json"


@functools.lru_cache(maxsize=4)
def _rebuilt(path: Path, stamp: tuple) -> bytes:
    config, beside = None, path.parent / TOKENIZER_CONFIG
    if beside.is_file():
        try:
            config = json.loads(beside.read_bytes())
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{beside}: not JSON ({e})") from None
        config = config if isinstance(config, dict) else None
    data = spiece_from_tokenizer_json(path.read_bytes(), str(path), config)
    read_spiece_bytes(data, str(path))  # as sentencepiece checks it
    return data


def tokenizer_model_bytes(path: Path) -> bytes | None:
    """The SentencePiece model of the tokenizer file `path`, checked as sentencepiece's processor loads it
    (`InputError` naming the file otherwise): None for a ``.model`` file, whose own bytes are the model; for a
    ``tokenizer.json`` the model rebuilt from it (`spiece_from_tokenizer_json`, with the tokenizer_config.json
    beside it), made once while the files are unchanged."""
    path = Path(path)
    if path.suffix != ".json":
        read_spiece(path)
        return None
    stamps = []
    for p in (path, path.parent / TOKENIZER_CONFIG):
        try:
            st = p.stat()
            stamps.append((st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            stamps.append(None)
        except OSError as e:
            raise InputError(f"{p}: cannot read the tokenizer ({e.strerror or e})") from None
    try:
        return _rebuilt(path, tuple(stamps))
    except OSError as e:
        raise InputError(f"{path}: cannot read the tokenizer ({e.strerror or e})") from None
