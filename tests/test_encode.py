"""`quantize.encode`: the row chunks a weight is streamed in (on a format's row block), and that streaming changes
nothing: a weight larger than a chunk is encoded chunk by chunk to the same bytes and error figures, and a kept
tensor is cast chunk by chunk to the same file."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from quantize.encode import row_chunks
from quantize.formats.fp8_channel import FORMAT as fp8
from tests.conftest import load_all
from tests.helpers.convert import check_component, file_hashes


def test_chunks_fall_on_the_formats_row_block():
    assert row_chunks(300, 512, chunk_bytes=4 * 512 * 100, block=128) == [(0, 128), (128, 256), (256, 300)]
    assert row_chunks(300, 512, chunk_bytes=4 * 512 * 200, block=128) == [(0, 128), (128, 256), (256, 300)]
    assert row_chunks(10, 4, chunk_bytes=48) == [(0, 3), (3, 6), (6, 9), (9, 10)]


def _chunk_spies(monkeypatch, chunk_bytes: int) -> tuple[list[tuple[int, int, list]], list[int]]:
    """Set the converter's row-chunk size to `chunk_bytes`; record each `row_chunks(rows, row_elems)` it asks
    for, with the ranges it got, and the rows of each weight (chunk) that it hands fp8_channel to encode."""
    import quantize.encode as chunking  # the module that holds CHUNK_BYTES and row_chunks, and reads them

    splits: list[tuple[int, int, list]] = []
    encoded: list[int] = []
    row_chunks, encode = chunking.row_chunks, fp8.encode

    def split(rows, row_elems, *args, **kwargs):
        ranges = row_chunks(rows, row_elems, *args, **kwargs)
        splits.append((rows, row_elems, ranges))  # list.append: safe from the worker threads
        return ranges

    def encode_spy(w, *args, **kw):
        encoded.append(w.shape[0])
        return encode(w, *args, **kw)

    monkeypatch.setattr(chunking, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(chunking, "row_chunks", split)
    monkeypatch.setattr(fp8, "encode", encode_spy)
    return splits, encoded


def _chunk_rows(rows: int, step: int) -> list[int]:
    return [min(step, rows - r) for r in range(0, rows, step)]


def test_weights_larger_than_a_chunk_are_streamed_in_rows_bit_exactly(wan_tiny, tmp_path, monkeypatch):
    """Force many row chunks per weight: the output and the error figures must not change."""
    from quantize import convert

    whole = convert(wan_tiny, tmp_path / "whole", "wan-fp8", workers=1)
    src = load_all(wan_tiny)
    shapes = [src[k.split("/", 1)[1]].shape for k in whole.tensors]  # the quantized weights'
    chunk_bytes = 3 * 64 * 4  # three rows of the tiny model's weights
    splits, encoded = _chunk_spies(monkeypatch, chunk_bytes)
    chunked = convert(wan_tiny, tmp_path / "chunked", "wan-fp8", workers=2)
    # each weight went through fp8_channel in chunks of `step` rows (the last one shorter): many chunks each
    chunking = [(rows, max(1, chunk_bytes // (4 * cols))) for rows, cols in shapes]  # rows, rows a chunk
    assert all(rows > step for rows, step in chunking)
    assert sorted(encoded) == sorted(n for rows, step in chunking for n in _chunk_rows(rows, step))
    assert all(len(ranges) > 1 for rows, cols, ranges in splits if (rows, cols) in shapes)
    check_component(
        wan_tiny, tmp_path / "chunked", {k.split("/", 1)[1].removesuffix(".weight") for k in whole.tensors}
    )
    # byte for byte, but for the error figures: float32 sums a chunk, so other chunkings round them otherwise
    chunked_tree, whole_tree = file_hashes(tmp_path / "chunked"), file_hashes(tmp_path / "whole")
    assert chunked_tree.pop("quantize_manifest.json") and whole_tree.pop("quantize_manifest.json")
    assert chunked_tree == whole_tree

    def without_figures(manifest):
        data = manifest.model_dump(mode="json")
        for entry in data["tensors"].values():
            del entry["sqnr_db"], entry["cosine"]
        return data

    assert without_figures(chunked) == without_figures(whole)
    for key, entry in whole.tensors.items():
        other = chunked.tensors[key]
        assert other.max_abs_error == entry.max_abs_error
        assert other.sqnr_db == pytest.approx(entry.sqnr_db, abs=1e-3) and other.cosine == pytest.approx(
            entry.cosine, abs=1e-7
        )


def test_keep_dtype_cast_of_chunked_and_scalar_tensors(tmp_path, monkeypatch):
    from quantize import convert

    src = tmp_path / "src"
    src.mkdir()
    tensors = {
        "proj.weight": torch.randn(40, 16),
        "table": torch.randn(30, 8),
        "step": torch.tensor(0.1234567),
    }
    save_file(tensors, src / "model.safetensors")
    (tmp_path / "r.yaml").write_text("format: fp8_channel\ntargets: [proj]\nkeep_dtype: bfloat16\n")
    convert(src, tmp_path / "whole", tmp_path / "r.yaml")
    splits, encoded = _chunk_spies(monkeypatch, 4 * 8 * 7)  # seven rows of `table` a chunk
    convert(src, tmp_path / "out", tmp_path / "r.yaml")
    assert encoded == _chunk_rows(40, 3)  # proj.weight, 16 float32 a row: 13 chunks of three rows, then one
    cast = [ranges for rows, cols, ranges in splits if (rows, cols) == (30, 8)]
    assert cast == [[(0, 7), (7, 14), (14, 21), (21, 28), (28, 30)]]  # table, cast in five chunks
    got = load_all(tmp_path / "out")
    assert torch.equal(got["table"], tensors["table"].to(torch.bfloat16))
    assert got["step"].shape == () and torch.equal(got["step"], tensors["step"].to(torch.bfloat16))
    # as the unchunked conversion wrote it
    assert file_hashes(tmp_path / "out") == file_hashes(tmp_path / "whole")
