"""Reading checkpoints: headers only, validated, with every error naming the file at fault."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from quantize.errors import InputError
from quantize.read.checkpoint import open_component, read_header, read_rows, read_tensor


def _write(path, tensors, **kw):
    save_file(tensors, path, **kw)
    return path


def test_header_and_tensor_reads(tmp_path):
    w = torch.randn(6, 4).to(torch.bfloat16)
    p = _write(tmp_path / "m.safetensors", {"w": w, "s": torch.tensor(3.0)}, metadata={"format": "pt"})
    h = read_header(p)
    assert h.metadata == {"format": "pt"}
    assert h.tensors["w"].shape == (6, 4) and h.tensors["w"].dtype == "BF16"
    assert torch.equal(read_tensor(h.tensors["w"]), w)
    assert torch.equal(read_rows(h.tensors["w"], 2, 5), w[2:5])
    assert read_tensor(h.tensors["s"]).item() == 3.0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda raw: raw[:5], "shorter than its 8-byte header length"),
        (lambda raw: struct.pack("<Q", 10**6) + raw[8:], "runs past the end of the file"),
        (lambda raw: raw[:8] + b"x" + raw[9:], "not valid JSON"),
        (lambda raw: raw[:-3], "truncated"),
        (lambda raw: raw + b"xx", "truncated or padded"),
    ],
)
def test_corrupt_files_are_named(tmp_path, mutate, message):
    p = _write(tmp_path / "m.safetensors", {"w": torch.randn(4, 4)})
    p.write_bytes(mutate(p.read_bytes()))
    with pytest.raises(InputError, match=message) as e:
        read_header(p)
    assert str(p) in str(e.value)


def test_offsets_out_of_bounds(tmp_path):
    p = tmp_path / "m.safetensors"
    header = json.dumps(
        {
            "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "v": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(24))
    with pytest.raises(InputError, match="'v' starts at byte 16"):
        read_header(p)


def test_component_from_index(tmp_path):
    _write(tmp_path / "m-00001-of-00002.safetensors", {"a": torch.zeros(2)})
    _write(tmp_path / "m-00002-of-00002.safetensors", {"b": torch.zeros(3)})
    (tmp_path / "m.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "m-00001-of-00002.safetensors", "b": "m-00002-of-00002.safetensors"}})
    )
    (tmp_path / "config.json").write_text('{"dim": 2}')
    c = open_component(tmp_path)
    assert list(c.tensors) == ["a", "b"] and c.stem == "m" and c.config == {"dim": 2}
    assert {p.name for p in c.own_files()} == {
        "m-00001-of-00002.safetensors",
        "m-00002-of-00002.safetensors",
        "m.safetensors.index.json",
        "config.json",
    }


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd"])
def test_index_paths_are_confined(tmp_path, shard):
    _write(tmp_path / "a.safetensors", {"a": torch.zeros(2)})
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(InputError, match="leaves the checkpoint directory"):
        open_component(tmp_path)


def test_index_naming_missing_shard(tmp_path):
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(InputError, match="names shard 'gone.safetensors', which does not exist"):
        open_component(tmp_path)


def test_key_in_two_shards(tmp_path):
    _write(tmp_path / "m-00001-of-00002.safetensors", {"x": torch.zeros(2)})
    _write(tmp_path / "m-00002-of-00002.safetensors", {"x": torch.zeros(2)})
    with pytest.raises(
        InputError, match="'x' is in both m-00001-of-00002.safetensors and m-00002-of-00002.safetensors"
    ):
        open_component(tmp_path)


def test_complete_shard_set_without_index(tmp_path):
    _write(tmp_path / "m-00001-of-00002.safetensors", {"x": torch.zeros(2)})
    _write(tmp_path / "m-00002-of-00002.safetensors", {"y": torch.zeros(2)})
    c = open_component(tmp_path)
    assert c.stem == "m" and list(c.tensors) == ["x", "y"] and c.index_path is None


def test_stray_files_without_index_are_ambiguous(tmp_path):
    _write(tmp_path / "diffusion_pytorch_model.safetensors", {"x": torch.zeros(2)})
    _write(tmp_path / "my_lora.safetensors", {"lora": torch.zeros(2)})
    with pytest.raises(
        InputError, match="several safetensors files and no .*index.json.*my_lora.safetensors"
    ):
        open_component(tmp_path)


def test_index_with_shards_in_a_subfolder(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "x.safetensors", {"x": torch.zeros(2)})
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "sub/x.safetensors"}}))
    assert list(open_component(tmp_path).tensors) == ["x"]


def test_tensor_missing_from_index(tmp_path):
    _write(tmp_path / "a.safetensors", {"x": torch.zeros(2), "y": torch.zeros(1)})
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors"}}))
    with pytest.raises(InputError, match="tensor 'y' is in a.safetensors but the index does not list it"):
        open_component(tmp_path)


def test_no_safetensors(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0")
    with pytest.raises(InputError, match="no \\*.safetensors files"):
        open_component(tmp_path)


def test_a_ggml_block_type_in_a_safetensors_header_is_refused(tmp_path):
    import json
    import struct

    from quantize.read.checkpoint import read_header

    header = json.dumps({"w": {"dtype": "Q8_0", "shape": [1, 32], "data_offsets": [0, 34]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 34)
    with pytest.raises(
        InputError, match=r"tensor 'w': unsupported safetensors dtype 'Q8_0' \(a GGML block type\)"
    ):
        read_header(path)


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16, torch.float32])
def test_rows_read_through_a_map_and_cast_equal_rows_read_then_cast(tmp_path, stored):
    """`read_rows(..., dtype)` casts straight from the page cache: the same values as reading, then casting, at
    any offset (the header's length puts tensors off the map's 4 KB grid) and for any row range."""
    w = torch.randn(37, 1000, generator=torch.Generator().manual_seed(0)).mul_(3).to(stored)
    p = _write(tmp_path / "m.safetensors", {"a": torch.ones(3), "w": w})
    info = read_header(p).tensors["w"]
    assert info.start % 4096
    for r0, r1 in [(0, 37), (5, 6), (11, 30), (36, 37)]:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            ours = read_rows(info, r0, r1, dtype)
            assert ours.dtype == dtype and torch.equal(ours, w[r0:r1].to(dtype))
            ours.add_(1)  # fresh memory: writing to it changes neither the file nor the next read
    assert torch.equal(read_rows(info, 0, 37, torch.float32), w.float())


def test_a_shard_truncated_after_planning_is_one_clean_error_when_mapped(tmp_path):
    p = _write(tmp_path / "m.safetensors", {"w": torch.randn(64, 64).to(torch.bfloat16)})
    info = read_header(p).tensors["w"]
    with open(p, "r+b") as f:
        f.truncate(info.start + 100)
    with pytest.raises(InputError, match=r"m\.safetensors: unexpected end of file .*truncated shard"):
        read_rows(info, 0, 64, torch.float32)


def test_a_file_system_that_cannot_map_files_is_read_instead(tmp_path, monkeypatch):
    import errno
    import mmap

    import quantize.read.checkpoint as checkpoint

    def refuse(*args, **kwargs):
        raise OSError(errno.ENODEV, "No such device")

    w = torch.randn(9, 40).to(torch.bfloat16)
    info = read_header(_write(tmp_path / "m.safetensors", {"w": w})).tensors["w"]
    monkeypatch.setattr(checkpoint.mmap, "mmap", refuse)
    assert torch.equal(read_rows(info, 2, 7, torch.float32), w[2:7].float())
    assert mmap.mmap is refuse  # the same module object: the map really was refused
