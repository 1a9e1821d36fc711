"""SentencePiece models read and written without sentencepiece, against sentencepiece's own protobuf module and
processor."""

from __future__ import annotations

import pytest
from sentencepiece import SentencePieceProcessor
from sentencepiece import sentencepiece_model_pb2 as model

from quantize.errors import InputError
from quantize.models.examples.umt5 import example_tokenizer
from quantize.read.spiece import PIECE_TYPES, read_spiece, read_spiece_bytes, write_spiece


def test_what_we_write_is_what_sentencepiece_parses_and_loads():
    data = example_tokenizer(512)
    proto = model.ModelProto()
    proto.ParseFromString(data)
    ours = read_spiece_bytes(data)
    assert [(p.piece, p.score, p.type) for p in ours.pieces] == [
        (p.piece, p.score, p.type) for p in proto.pieces
    ]
    t = proto.trainer_spec
    assert (t.unk_id, t.bos_id, t.eos_id, t.pad_id, t.byte_fallback) == (2, -1, 1, 0, True)
    assert (ours.unk_id, ours.bos_id, ours.eos_id, ours.pad_id) == (2, -1, 1, 0)
    sp = SentencePieceProcessor(model_proto=data, add_eos=True)
    assert sp.encode("ab c") == [sp.piece_to_id(p) for p in ("▁a", "b", "▁c")] + [1]
    assert sp.encode("é")[1:-1] == [sp.piece_to_id(f"<0x{b:02X}>") for b in "é".encode()]  # byte fallback


def test_a_model_sentencepiece_serialized_is_read_field_for_field():
    """Every field we read, set otherwise than its default in a proto sentencepiece serializes."""
    proto = model.ModelProto()
    for piece, score, type_ in (("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("▁x", -2.25, 1)):
        proto.pieces.add(piece=piece, score=score, type=type_)
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id = 0, 1
    proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = 2, -1
    proto.normalizer_spec.name = "nmt_nfkc"
    proto.normalizer_spec.precompiled_charsmap = b"\x01\x02\x03"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    ours = read_spiece_bytes(proto.SerializeToString())
    assert [p.piece for p in ours.pieces] == ["<unk>", "<s>", "</s>", "▁x"] and ours.pieces[3].score == -2.25
    assert (ours.unk_id, ours.bos_id, ours.eos_id, ours.pad_id) == (0, 1, 2, -1)
    assert ours.precompiled_charsmap == b"\x01\x02\x03"
    assert not ours.add_dummy_prefix and not ours.remove_extra_whitespaces


def test_the_defaults_are_the_protos():
    ours = read_spiece_bytes(write_spiece([("<unk>", 0.0, PIECE_TYPES["UNKNOWN"])], byte_fallback=False))
    assert ours.add_dummy_prefix and ours.remove_extra_whitespaces and ours.precompiled_charsmap == b""


@pytest.mark.parametrize("data", [b"\x0a\xff", b"\x12\x05ab", b"", b"\x0a\x02\x0a"])
def test_what_is_not_a_model_is_one_line_naming_the_file(tmp_path, data):
    path = tmp_path / "spiece.model"
    path.write_bytes(data)
    with pytest.raises(InputError, match=rf"^{path}: not a SentencePiece model"):
        read_spiece(path)
