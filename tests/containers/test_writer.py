"""The streaming writer produces exactly what safetensors itself writes, whatever order data arrives in."""

from __future__ import annotations

import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantize import dtypes
from quantize.containers.writer import ShardWriter, shard_layout
from quantize.plan import TensorSpec


def _mixed_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, d in enumerate(dtypes.DTYPES):
        if d.torch.is_floating_point:
            t = torch.randn(3, 5, generator=g).to(d.torch)
        elif d.torch == torch.bool:
            t = torch.rand(3, 5, generator=g) > 0.5
        else:
            t = torch.randint(0, 100, (3, 5), generator=g).to(d.torch)
        out[f"t{i:02d}.{d.name.lower()}"] = t
    out["scalar"] = torch.tensor(1.5)
    out["empty"] = torch.zeros(0, 4)
    out["odd"] = torch.ones(7, dtype=torch.float8_e4m3fn)  # 7 bytes: alignment comes from the layout order
    return out


def _specs(tensors):
    return [TensorSpec(k, dtypes.by_torch(v.dtype).name, tuple(v.shape)) for k, v in tensors.items()]


def test_dtype_table_matches_torch_and_safetensors_both_ways(tmp_path):
    for d in dtypes.DTYPES:
        assert dtypes.by_name(d.name) is d
        if not d.safetensors:  # GGML's block types: bytes in uint8 rows, never in a safetensors file
            assert d.block > 1 and d.torch == torch.uint8 and dtypes.by_ggml(d.ggml) is d
            assert dtypes.nbytes(d.name, (3, 2 * d.block)) == 6 * d.itemsize
            continue
        assert dtypes.by_torch(d.torch) is d
        assert torch.empty(0, dtype=d.torch).element_size() == d.itemsize
        save_file({"x": torch.zeros(2, dtype=d.torch)}, tmp_path / "x.safetensors")
        raw = (tmp_path / "x.safetensors").read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        assert f'"dtype":"{d.name}"'.encode() in raw[8 : 8 + n]


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_shard_is_byte_identical_to_safetensors_save_file(tmp_path, metadata):
    tensors = _mixed_tensors()
    save_file(tensors, tmp_path / "ref.safetensors", metadata=metadata)
    with ShardWriter(tmp_path / "ours.safetensors", _specs(tensors), metadata) as w:
        for name in reversed(list(tensors)):  # any order
            w.write(name, tensors[name])
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_rows_may_arrive_in_pieces_and_out_of_order(tmp_path):
    a = torch.randn(10, 4)
    b = torch.randn(6, 3).to(torch.bfloat16)
    with ShardWriter(tmp_path / "x.safetensors", _specs({"a": a, "b": b})) as w:
        w.write("a", a[7:], row_start=7)
        w.write("b", b)
        w.write("a", a[:3], row_start=0)
        w.write("a", a[3:7], row_start=3)
    back = load_file(tmp_path / "x.safetensors")
    assert torch.equal(back["a"], a) and torch.equal(back["b"], b)


def test_missing_bytes_fail_at_close(tmp_path):
    a = torch.randn(4, 4)
    w = ShardWriter(tmp_path / "x.safetensors", _specs({"a": a}))
    w.write("a", a[:2])
    with pytest.raises(ValueError, match="got 32 of 64 bytes"):
        w.close()


def test_never_overwrites_an_existing_file(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        ShardWriter(tmp_path / "x.safetensors", [TensorSpec("a", "F32", (1,))])
    assert (tmp_path / "x.safetensors").read_bytes() == b"precious"


def test_mismatched_tensor_is_refused(tmp_path):
    w = ShardWriter(tmp_path / "x.safetensors", [TensorSpec("a", "F32", (2, 2))])
    with pytest.raises(ValueError, match="planned F32"):
        w.write("a", torch.zeros(2, 2, dtype=torch.bfloat16))
    w.abort()


def test_layout_orders_by_dtype_rank_then_name():
    specs = [
        TensorSpec("b", "BF16", (1,)),
        TensorSpec("a", "F8_E4M3", (1,)),
        TensorSpec("c", "F32", (1,)),
        TensorSpec("a2", "F32", (1,)),
    ]
    assert [s.name for s in shard_layout(specs)] == ["a2", "c", "b", "a"]


def test_non_contiguous_tensors_are_written_correctly(tmp_path):
    # a transposed view: the writer makes it contiguous and must keep that copy alive while writing
    big = torch.randn(1024, 2048).t()
    small = torch.randn(64, 32).t()
    with ShardWriter(tmp_path / "x.safetensors", _specs({"big": big, "small": small})) as w:
        w.write("big", big)
        w.write("small", small)
    back = load_file(tmp_path / "x.safetensors")
    assert torch.equal(back["big"], big) and torch.equal(back["small"], small)


def test_late_tensors_go_last_and_the_header_is_finished_at_close(tmp_path):
    a = torch.randn(4, 4)
    blob = torch.tensor(list(b'{"nested_offset": 0.5}'), dtype=torch.uint8)
    specs = [
        TensorSpec("a", "F32", (4, 4)),
        TensorSpec("z.state", "U8", None),
        TensorSpec("b.state", "U8", None),
    ]
    w = ShardWriter(tmp_path / "x.safetensors", specs)
    w.write("z.state", blob)
    w.write("a", a)
    w.write("b.state", blob[:5])
    assert w.close() == 64 + len(blob) + 5
    back = load_file(tmp_path / "x.safetensors")
    assert (
        torch.equal(back["a"], a)
        and torch.equal(back["z.state"], blob)
        and torch.equal(back["b.state"], blob[:5])
    )
    raw = (tmp_path / "x.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0 and len(raw) == 8 + n + 64 + len(blob) + 5


def test_a_late_tensor_never_written_fails_at_close(tmp_path):
    w = ShardWriter(tmp_path / "x.safetensors", [TensorSpec("s", "U8", None)])
    with pytest.raises(ValueError, match="'s' was never written"):
        w.close()
