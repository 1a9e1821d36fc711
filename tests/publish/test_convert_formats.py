"""The CLI with a recipe of every format, on sharded sources with the original Wan names."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from quantize.formats import format_info, get_format, part_key
from quantize.recipes import load_recipe
from tests.conftest import load_all, read_json, run_cli


@pytest.mark.parametrize(
    "recipe, layout, dtype",
    [
        ("wan-torchao-fp8.yaml", "t2v", torch.bfloat16),
        ("wan-torchao-fp8.yaml", "i2v", torch.float32),
        ("wan-torchao-int8.yaml", "t2v", torch.float16),
        ("wan-torchao-int8.yaml", "i2v", torch.float32),
        ("wan-nf4.yaml", "t2v", torch.bfloat16),
        ("wan-nf4.yaml", "t2v", torch.float16),
        ("lingbot-world-nf4.yaml", "lingbot", torch.bfloat16),
    ],
)
def test_every_format_end_to_end(make_wan, tmp_path, recipe, layout, dtype):
    src = make_wan(layout, dtype, max_shard_size=200_000)
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "--recipe", recipe, "--max-shard-size", "60KB")
    assert proc.returncode == 0, proc.stderr
    fmt = get_format(load_recipe(recipe).recipe.format)
    manifest = read_json(out / "quantize_manifest.json")
    assert manifest["format"] == fmt.NAME and set(format_info(fmt.NAME).libraries) <= set(
        manifest["libraries"]
    )
    for comp in manifest["components"]:
        rel = comp["path"]
        src_dir, out_dir = (src, out) if rel == "." else (src / rel, out / rel)
        source, stored = load_all(src_dir), load_all(out_dir)
        quantized = {k.split("/", 1)[1] for k in manifest["tensors"] if k.startswith(rel + "/")}
        expected_keys = set()
        for name, w in source.items():
            if name in quantized:
                module = name.removesuffix(".weight")
                for part, want in fmt.encode(w).items():
                    key = part_key(module, part)
                    assert stored[key].dtype == want.dtype and torch.equal(stored[key], want), key
                    expected_keys.add(key)
            else:
                assert stored[name].dtype == w.dtype and torch.equal(stored[name], w), name
                expected_keys.add(name)
        assert set(stored) == expected_keys
        shards = sorted(out_dir.glob("*.safetensors"))
        assert len(shards) > 1
        index = read_json(out_dir / "diffusion_pytorch_model.safetensors.index.json")
        assert set(index["weight_map"]) == expected_keys
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in stored.values())
        assert comp["output_bytes"] == index["metadata"]["total_size"]
        if format_info(fmt.NAME).layout_library == "torchao":  # every shard: the whole model's metadata
            metas = []
            for shard in shards:
                with safe_open(shard, framework="pt") as f:
                    metas.append(f.metadata())
            assert all(m == metas[0] for m in metas)
            assert json.loads(metas[0]["tensor_names"]) == list(source)
            assert {n for n in source if json.loads(metas[0][n])["_type"] != "Tensor"} == quantized
    for entry in manifest["tensors"].values():
        assert entry["sqnr_db"] > load_recipe(recipe).recipe.checks.min_sqnr_db


def test_torchao_refuses_a_weight_scaled_mm_cannot_take(tmp_path):
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    save_file(
        {"blocks.0.ffn.0.weight": torch.randn(24, 64), "blocks.0.ffn.0.bias": torch.zeros(24)},
        src / "m.safetensors",
    )
    (tmp_path / "r.yaml").write_text("format: torchao_fp8\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n")
    proc = run_cli("plan", src, "-r", tmp_path / "r.yaml")
    assert proc.returncode == 2
    assert (
        "tensor 'blocks.0.ffn.0.weight' is [24, 64]; torchao_fp8 needs both dims to be multiples of 16"
        in proc.stderr
    )
