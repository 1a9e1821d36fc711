"""What a conversion wrote, checked as a user would check it: files by hash, an fp8_channel component tensor by
tensor against the format's own encoding."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open

from quantize.formats.fp8_channel import FORMAT as fp8
from tests.conftest import load_all, read_json


def sha256_hex(path: Path) -> str:
    """The SHA-256 of the file at `path`, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """Every file under `root` (its path relative to `root`) and its SHA-256: two trees compare byte for byte."""
    return {p.relative_to(root).as_posix(): sha256_hex(p) for p in sorted(root.rglob("*")) if p.is_file()}


def check_component(
    src_dir: Path, out_dir: Path, quantized: set[str], keep_cast: torch.dtype | None = None
) -> None:
    """Every source tensor is in the output: quantized ones bit-exact to fp8_channel, kept ones bit-exact."""
    src, got = load_all(src_dir), load_all(out_dir)
    expected_keys = set()
    for name, w in src.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in quantized:
            ref = fp8.encode(w)
            q, s = got[f"{module}.weight"], got[f"{module}.weight_scale"]
            assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape, name
            assert s.dtype == torch.float32 and s.shape == (w.shape[0], 1), name
            assert torch.equal(q.view(torch.uint8), ref["weight"].view(torch.uint8)), name
            assert torch.equal(s, ref["weight_scale"]), name
            expected_keys |= {f"{module}.weight", f"{module}.weight_scale"}
        else:
            want = w.to(keep_cast) if keep_cast is not None and w.is_floating_point() else w
            assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
            expected_keys.add(name)
    assert set(got) == expected_keys

    index_files = list(out_dir.glob("*.safetensors.index.json"))
    if index_files:
        weight_map = read_json(index_files[0])["weight_map"]
        assert set(weight_map) == expected_keys
        for key, shard in weight_map.items():
            with safe_open(out_dir / shard, framework="pt") as f:
                assert key in f.keys()
    config = read_json(out_dir / "config.json")
    source_config = read_json(src_dir / "config.json")
    assert {k: v for k, v in config.items() if k != "quantization_config"} == source_config
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    kept_linears = {
        n.removesuffix(".weight") for n, w in src.items() if n.endswith(".weight") and w.dim() == 2
    } - quantized
    assert set(qc["ignore"]) == kept_linears
