"""The streaming GGUF writer and reader against gguf-py's own GGUFWriter and GGUFReader."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
import torch

from quantize.containers.gguf_io import GGUFTensor, GGUFWriter, read_gguf
from quantize.errors import InputError

META = {"general.architecture": "wan", "general.quantization_version": 2, "general.file_type": 7}


def _tensors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    return {
        "blocks.0.q.weight": ("Q8_0", (8, 64), gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)),
        "blocks.0.q.bias": ("F32", (8,), rng.standard_normal(8).astype(np.float32)),
        "head.head.weight": (
            "BF16",
            (4, 32),
            torch.randn(4, 32).to(torch.bfloat16).view(torch.int16).numpy(),
        ),
        "patch_embedding.weight": (
            "F32",
            (4, 2, 1, 2, 2),
            rng.standard_normal((4, 2, 1, 2, 2)).astype(np.float32),
        ),
        "head.modulation": ("F32", (1, 2, 4), rng.standard_normal((1, 2, 4)).astype(np.float32)),
    }


def _reference(path, tensors):
    ref = gguf.GGUFWriter(path, "wan")
    ref.add_quantization_version(2)
    ref.add_file_type(7)
    for name, (dtype, _, data) in tensors.items():
        ref.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[dtype])
    ref.write_header_to_file()
    ref.write_kv_data_to_file()
    ref.write_tensors_to_file()
    ref.close()


def _as_torch(dtype, data):
    t = torch.from_numpy(np.ascontiguousarray(data))
    return t.view(torch.bfloat16) if dtype == "BF16" else t


def test_our_streamed_file_is_byte_for_byte_gguf_pys(tmp_path):
    tensors = _tensors()
    _reference(tmp_path / "ref.gguf", tensors)
    specs = [GGUFTensor(name, dtype, shape) for name, (dtype, shape, _) in tensors.items()]
    writer = GGUFWriter(tmp_path / "ours.gguf", specs, META)
    for name, (dtype, _, data) in reversed(list(tensors.items())):  # any order, rows in pieces
        t = _as_torch(dtype, data)
        writer.write(name, t[2:], row_start=2)
        writer.write(name, t[:2])
    assert writer.close() == sum(s.nbytes for s in specs)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()


def test_the_reader_agrees_with_gguf_pys(tmp_path):
    tensors = _tensors()
    _reference(tmp_path / "ref.gguf", tensors)
    metadata, infos = read_gguf(tmp_path / "ref.gguf")
    assert metadata == META
    theirs = gguf.GGUFReader(tmp_path / "ref.gguf")
    for t in theirs.tensors:
        info = infos[t.name]
        assert (info.dtype, info.shape) == (tensors[t.name][0], tensors[t.name][1])
        assert info.start == t.data_offset and info.nbytes == t.n_bytes
        raw = (tmp_path / "ref.gguf").read_bytes()[info.start : info.end]
        assert raw == np.ascontiguousarray(tensors[t.name][2]).tobytes()


def test_a_short_write_and_a_wrong_dtype_are_caught(tmp_path):
    spec = GGUFTensor("w", "F32", (4, 8))
    writer = GGUFWriter(tmp_path / "x.gguf", [spec], META)
    with pytest.raises(ValueError, match="rows of 'w' are torch.float16"):
        writer.write("w", torch.zeros(2, 8, dtype=torch.float16))
    writer.write("w", torch.zeros(2, 8))
    with pytest.raises(ValueError, match="tensor 'w' got 64 of 128 bytes"):
        writer.close()
    with pytest.raises(FileExistsError):
        GGUFWriter(tmp_path / "x.gguf", [spec], META)  # never overwrites


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b"GGUX" + b[4:], "not a GGUF file"),
        (lambda b: b[:4] + struct.pack("<I", 2) + b[8:], "GGUF version 2"),
        (lambda b: b[:40], "runs past the end"),
        (lambda b: b[:-64], "misaligned or past the end"),
    ],
)
def test_damaged_files_are_one_clean_error(tmp_path, damage, message):
    _reference(tmp_path / "ref.gguf", _tensors())
    path = tmp_path / "bad.gguf"
    path.write_bytes(damage((tmp_path / "ref.gguf").read_bytes()))
    with pytest.raises(InputError, match=message):
        read_gguf(path)


@pytest.mark.parametrize("alignment", [0, 12])
def test_a_bad_alignment_is_one_clean_error(tmp_path, alignment):
    from quantize.containers.gguf_io import header_bytes

    header, _ = header_bytes({**META, "general.alignment": alignment}, [GGUFTensor("w", "F32", (8,))])
    path = tmp_path / "x.gguf"
    path.write_bytes(header + b"\0" * 32)
    with pytest.raises(InputError, match=f"general.alignment is {alignment}"):
        read_gguf(path)


def test_every_kind_of_key_value_is_written_as_gguf_pys(tmp_path):
    """A text encoder's key-values as llama.cpp's converter writes them through gguf-py: strings, UINT32 ids and
    sizes, a FLOAT32 epsilon, BOOL flags, and arrays of strings (tokens), FLOAT32 (scores), INT32 (token types)
    and UINT8 (the normalizer's character map)."""
    from quantize.containers.gguf_io import GGUFArray

    tokens, scores, types = ["<pad>", "</s>", "▁a", "[PAD3]"], [0.0, 0.0, -1.5, -10000.0], [3, 3, 1, 5]
    charsmap = bytes(range(7))
    ref = gguf.GGUFWriter(tmp_path / "ref.gguf", "t5encoder")
    ref.add_quantization_version(2)
    ref.add_uint32("t5encoder.block_count", 2)
    ref.add_float32("t5encoder.attention.layer_norm_epsilon", 1e-6)
    ref.add_tokenizer_model("t5")
    ref.add_token_list(tokens)
    ref.add_token_scores(scores)
    ref.add_token_types(types)
    ref.add_add_space_prefix(True)
    ref.add_remove_extra_whitespaces(False)
    ref.add_precompiled_charsmap(charsmap)
    data = np.zeros(32, dtype=np.float32)
    ref.add_tensor("token_embd.weight", data)
    ref.write_header_to_file()
    ref.write_kv_data_to_file()
    ref.write_tensors_to_file()
    ref.close()
    meta = {
        "general.architecture": "t5encoder",
        "general.quantization_version": 2,
        "t5encoder.block_count": 2,
        "t5encoder.attention.layer_norm_epsilon": 1e-6,
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": GGUFArray("str", tuple(tokens)),
        "tokenizer.ggml.scores": GGUFArray("float32", tuple(scores)),
        "tokenizer.ggml.token_type": GGUFArray("int32", tuple(types)),
        "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.remove_extra_whitespaces": False,
        "tokenizer.ggml.precompiled_charsmap": GGUFArray("uint8", charsmap),
    }
    writer = GGUFWriter(tmp_path / "ours.gguf", [GGUFTensor("token_embd.weight", "F32", (32,))], meta)
    writer.write("token_embd.weight", torch.from_numpy(data))
    writer.close()
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()
