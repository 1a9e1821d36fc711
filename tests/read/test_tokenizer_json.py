"""A T5 tokenizer saved as a tokenizer.json alone (transformers 5's ``save_pretrained`` writes no spiece.model)
rebuilt as the SentencePiece model it was converted from (`read.spiece.spiece_from_tokenizer_json`).

The oracles: sentencepiece's own trainer makes the original models (unigram, with and without byte fallback, with
sentencepiece's ``nmt_nfkc`` character map and with the identity), transformers' real T5 tokenizer converts and
saves each, and sentencepiece's processor (what ComfyUI's `SPieceTokenizer` is) must tokenize with the rebuilt
model as it does with the original. What cannot be rebuilt faithfully is refused in one line naming the file.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sentencepiece

from quantize.errors import InputError
from quantize.read.spiece import read_spiece_bytes, spiece_from_tokenizer_json, tokenizer_model_bytes

CORPUS = [
    "The quick brown fox jumps over the lazy dog. A cat sat on a mat; zebras and yaks roam.",
    "Ｆｕｌｌ－ｗｉｄｔｈ letters and the ﬁ ligature normalize under NFKC. Numbers 12345 and 67890.",
    "Café, naïve, résumé: accents too. Über große Straßen. Ελληνικά λόγια. Русский текст.",
    "Tabs\tand  double  spaces   appear here. Another line with words words words.",
] * 50
#: what each must tokenize alike: NFKC's work, runs and ends of spaces, tabs, characters the model never saw
#: (bytes with byte fallback, the unknown piece without), text that spells a special or byte piece
SENTENCES = [
    "The quick brown fox",
    "  leading and   trailing  ",
    "Ｆｕｌｌ－ｗｉｄｔｈ ﬁne",
    "Café naïve",
    "emoji 🦊 and 中文 here",
    "tab\there\nnewline",
    "",
    "<0x41> </s> <pad> <extra_id_0>",
]
#: (byte fallback, sentencepiece's normalization rule, vocabulary size)
MODELS = {
    "nfkc-bytes": (True, "nmt_nfkc", 350),
    "nfkc": (False, "nmt_nfkc", 120),
    "identity": (True, "identity", 350),
}


def train(byte_fallback: bool, rule: str, vocab: int) -> bytes:
    """A unigram spiece.model as T5's are made: pad 0, eos 1, unk 2, no bos."""
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=out,
        model_type="unigram",
        vocab_size=vocab,
        hard_vocab_limit=False,
        byte_fallback=byte_fallback,
        normalization_rule_name=rule,
        character_coverage=0.98,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    return out.getvalue()


def saved_by_transformers(spiece: bytes, folder: Path, extra_ids: int = 0) -> Path:
    """transformers' T5 tokenizer of `spiece` saved into `folder`: its tokenizer.json, no spiece.model."""
    from transformers import AutoTokenizer

    source = folder / "source"
    source.mkdir(parents=True)
    (source / "spiece.model").write_bytes(spiece)
    (source / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": extra_ids})
    )
    AutoTokenizer.from_pretrained(source).save_pretrained(folder / "saved")
    assert not (folder / "saved" / "spiece.model").exists()
    return folder / "saved" / "tokenizer.json"


def encode(model: bytes) -> list[list[int]]:
    sp = sentencepiece.SentencePieceProcessor(model_proto=model, add_bos=False, add_eos=True)
    return [sp.encode(s) for s in SENTENCES]


@pytest.fixture(scope="module")
def originals() -> dict[str, bytes]:
    return {name: train(*args) for name, args in MODELS.items()}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("extra_ids", [0, 3])
def test_the_rebuilt_model_tokenizes_as_the_original(originals, tmp_path, name, extra_ids):
    """sentencepiece's processor gives the same ids with the model rebuilt from transformers' tokenizer.json as
    with the spiece.model it was made from, and the same special ids; the character map is the original's."""
    original = originals[name]
    path = saved_by_transformers(original, tmp_path, extra_ids)
    rebuilt = tokenizer_model_bytes(path)
    assert encode(rebuilt) == encode(original)
    ours, theirs = (sentencepiece.SentencePieceProcessor(model_proto=m) for m in (rebuilt, original))
    assert ours.get_piece_size() == theirs.get_piece_size() + extra_ids  # T5's sentinels follow the pieces
    for i in range(theirs.get_piece_size()):
        assert (ours.id_to_piece(i), ours.get_score(i)) == (theirs.id_to_piece(i), theirs.get_score(i))
        assert (ours.is_byte(i), ours.is_control(i), ours.is_unknown(i)) == (
            theirs.is_byte(i),
            theirs.is_control(i),
            theirs.is_unknown(i),
        )
    assert (ours.unk_id(), ours.eos_id(), ours.pad_id(), ours.bos_id()) == (2, 1, 0, -1)
    assert read_spiece_bytes(rebuilt).precompiled_charsmap == read_spiece_bytes(original).precompiled_charsmap


def _legacy(doc: dict) -> dict:
    """The tokenizer.json transformers 4's converter wrote of the same model (Wan's and google/umt5-xxl's era):
    the character map, then runs of spaces made one, in the normalizer; Metaspace's older spelling."""
    charsmap = doc["normalizer"]["precompiled_charsmap"]
    return {
        **doc,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Precompiled", "precompiled_charsmap": charsmap},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
            ],
        },
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True},
    }


def test_transformers_other_spellings_of_the_same_model_rebuild_it_alike(originals, tmp_path):
    """transformers 4's spelling, and transformers 5's generic one (`SpmConverter.build_tokenizer_from_spm_proto`,
    a real tokenizers object), rebuild the model transformers 5's T5 tokenizer does, byte for byte."""
    from sentencepiece import sentencepiece_model_pb2
    from transformers.convert_slow_tokenizer import SpmConverter

    original = originals["nfkc-bytes"]
    path = saved_by_transformers(original, tmp_path)
    doc = json.loads(path.read_text())
    rebuilt = spiece_from_tokenizer_json(path.read_bytes(), "t5")
    assert spiece_from_tokenizer_json(json.dumps(_legacy(doc)).encode(), "t4") == rebuilt
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(original)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    generic = json.loads(SpmConverter.build_tokenizer_from_spm_proto(proto, vocab).to_str())
    generic["added_tokens"] = doc[
        "added_tokens"
    ]  # the specials transformers adds when it saves the tokenizer
    assert spiece_from_tokenizer_json(json.dumps(generic).encode(), "generic") == rebuilt
    assert encode(rebuilt) == encode(original)


def _bpe_tokenizer_json(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2, "<unk>": 3}, [("a", "b")], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _edited(path: Path, edit) -> Path:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


REFUSED = {
    "a BPE model": (lambda p, folder: _bpe_tokenizer_json(folder), "its model is a 'BPE' one"),
    "a lowercasing normalizer": (
        lambda p, folder: _edited(p, lambda d: d.update(normalizer={"type": "Lowercase"})),
        'its normalizer step {"type": "Lowercase"} has no SentencePiece equivalent',
    ),
    "no unknown piece": (
        lambda p, folder: _edited(p, lambda d: d["model"].update(unk_id=None)),
        "its model has no unknown piece",
    ),
    "a byte-level pre-tokenizer": (
        lambda p, folder: _edited(p, lambda d: d.update(pre_tokenizer={"type": "ByteLevel"})),
        "its pre-tokenizer step",
    ),
    "no Metaspace": (
        lambda p, folder: _edited(p, lambda d: d.update(pre_tokenizer={"type": "WhitespaceSplit"})),
        "it does not write a space as ▁",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_sentencepiece_cannot_reproduce_is_refused_in_one_line_naming_the_file(
    originals, tmp_path, case
):
    make, why = REFUSED[case]
    path = make(saved_by_transformers(originals["nfkc"], tmp_path), tmp_path)
    with pytest.raises(InputError) as e:
        tokenizer_model_bytes(path)
    line = str(e.value)
    assert line.startswith(f"{path}: ") and "\n" not in line, line
    assert why in line and "cannot reproduce faithfully" in line, line


@pytest.mark.parametrize("data", [b"{not json", b"[]", b'{"model": {"type": "Unigram", "vocab": []}}'])
def test_a_file_that_is_no_tokenizer_json_is_one_line_naming_it(tmp_path, data):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(data)
    with pytest.raises(InputError, match=rf"^{path}: not a tokenizer\.json \(") as e:
        tokenizer_model_bytes(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "data", [b"\x0a\x05\x0a\x01a\x18\x01", b"\x0a\x07\x0a\x03<u>\x18\x07"], ids=["no unknown piece", "type 7"]
)
def test_a_model_sentencepiece_would_not_load_is_no_model(tmp_path, data):
    """Bytes that parse as a protobuf message but that sentencepiece's processor refuses to load are refused too
    (ComfyUI would fail loading the file they went into)."""
    with pytest.raises(RuntimeError):
        sentencepiece.SentencePieceProcessor(model_proto=data)
    path = tmp_path / "spiece.model"
    path.write_bytes(data)
    with pytest.raises(InputError, match=rf"^{path}: not a SentencePiece model \("):
        tokenizer_model_bytes(path)
