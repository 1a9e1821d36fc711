"""`quantize convert` end to end: real files in, real files out, checked as a user would check them."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantize.recipes import load_recipe
from tests.conftest import load_all, read_json, run_cli, wan_fp8_modules
from tests.helpers.convert import check_component
from tests.helpers.convert import file_hashes as _tree
from tests.helpers.convert import sha256_hex as _sha


def check_manifest(source: Path, out: Path) -> dict:
    m = read_json(out / "quantize_manifest.json")
    listed = {f["path"]: f for f in m["output_files"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {
        "quantize_manifest.json"
    }
    assert set(listed) == on_disk
    for rel, entry in listed.items():
        assert entry["size"] == (out / rel).stat().st_size and entry["sha256"] == _sha(out / rel), rel
    for entry in m["source_files"]:
        assert entry["sha256"] == _sha(source / entry["path"]), entry["path"]
    assert m["recipe"]["sha256"] == _sha(out / "recipe.yaml")
    assert (out / "recipe.yaml").read_text() == m["recipe"]["text"]
    for key, t in m["tensors"].items():
        assert t["sqnr_db"] > 25 and 0.99 < t["cosine"] <= 1.0 and t["max_abs_error"] > 0, key
    assert (
        "/" not in m["source"]["name"]
        and str(source.parent) not in (out / "quantize_manifest.json").read_text()
    )
    return m


def test_cli_convert_end_to_end(wan_tiny, tmp_path):
    out = tmp_path / "Wan2.1-T2V-tiny-fp8"
    proc = run_cli("convert", wan_tiny, out, "--recipe", "wan-fp8.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "quantized to fp8_channel" in proc.stdout
    layers = read_json(wan_tiny / "config.json")["num_layers"]
    quantized = {
        f"blocks.{i}.{a}.{p}" for i in range(layers) for a in ("self_attn", "cross_attn") for p in "qkvo"
    }
    quantized |= {f"blocks.{i}.ffn.0" for i in range(layers)}
    assert quantized == wan_fp8_modules(wan_tiny)
    check_component(wan_tiny, out, quantized)
    m = check_manifest(wan_tiny, out)
    assert {k.split("/", 1)[1] for k in m["tensors"]} == {q + ".weight" for q in quantized}
    assert m["format"] == "fp8_channel" and m["recipe"]["origin"] == "bundled:wan-fp8.yaml"
    # the files beside the DiT were copied, the source is untouched
    assert (out / "google/umt5-xxl/tokenizer_config.json").read_text() == (
        wan_tiny / "google/umt5-xxl/tokenizer_config.json"
    ).read_text()
    assert not list(tmp_path.glob(".*tmp*"))
    assert {p.name for p in out.glob("*.safetensors")} == {
        p.name for p in out.glob("diffusion_pytorch_model-*-of-*.safetensors")
    }


def test_output_is_identical_across_runs_and_worker_counts(wan_tiny, tmp_path):
    trees = []
    for workers in (1, 2, 3, 2):
        out = tmp_path / f"out-{len(trees)}"
        run_cli("convert", wan_tiny, out, "-r", "wan-fp8", "--workers", str(workers), check=True)
        trees.append(_tree(out))
    assert all(t == trees[0] for t in trees[1:])


def test_max_shard_size_is_respected(wan_tiny, tmp_path):
    out = tmp_path / "out"
    run_cli("convert", wan_tiny, out, "-r", "wan-fp8", "--max-shard-size", "40KB", check=True)
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) > 3
    assert [s.name for s in shards] == [
        f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
    ]
    for shard in shards:
        with safe_open(shard, framework="pt") as f:
            tensors = [f.get_tensor(k) for k in f.keys()]
        data_bytes = sum(t.numel() * t.element_size() for t in tensors)
        assert data_bytes <= 40_000 or len(tensors) == 1, shard.name
    index = read_json(out / "diffusion_pytorch_model.safetensors.index.json")
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in load_all(out).values()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp32_and_fp16_sources(make_wan, tmp_path, dtype):
    src = make_wan("t2v", dtype)
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", "wan-fp8", check=True)
    quantized = {
        k.split("/", 1)[1].removesuffix(".weight")
        for k in read_json(out / "quantize_manifest.json")["tensors"]
    }
    assert quantized == wan_fp8_modules(src)
    check_component(src, out, quantized)
    assert {t["source_dtype"] for t in read_json(out / "quantize_manifest.json")["tensors"].values()} == {
        "F32" if dtype == torch.float32 else "F16"
    }


def test_keep_dtype_casts_kept_tensors(make_wan, tmp_path):
    src = make_wan("t2v", torch.float32)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\nkeep_dtype: bfloat16\n")
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", recipe, check=True)
    check_component(src, out, {"blocks.0.ffn.0", "blocks.1.ffn.0"}, keep_cast=torch.bfloat16)
    assert not (out / "google").exists()  # copy_other_files defaults to false


def test_two_expert_layout_and_other_files(make_wan, tmp_path):
    src = make_wan("a14b")
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", "wan2.2-a14b-fp8.yaml", check=True)
    m = check_manifest(src, out)
    assert [c["path"] for c in m["components"]] == ["high_noise_model", "low_noise_model"]
    for comp in ("high_noise_model", "low_noise_model"):
        quantized = {
            k.split("/", 1)[1].removesuffix(".weight") for k in m["tensors"] if k.startswith(comp + "/")
        }
        assert quantized == wan_fp8_modules(src / comp)
        check_component(src / comp, out / comp, quantized)
    assert (out / "example.json").read_bytes() == (src / "example.json").read_bytes()
    assert (out / "google/umt5-xxl/tokenizer_config.json").is_file()
    copied = {e["path"] for e in m["source_files"]}
    assert {"example.json", "google/umt5-xxl/tokenizer_config.json", "high_noise_model/config.json"} <= copied


def test_existing_output_is_refused_without_overwrite(wan_tiny, tmp_path):
    out = tmp_path / "out"
    run_cli("convert", wan_tiny, out, "-r", "wan-fp8-all", check=True)
    before = _tree(out)
    proc = run_cli("convert", wan_tiny, out, "-r", "wan-fp8")
    assert proc.returncode == 2
    assert f"{out}: already exists; pass --overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert _tree(out) == before
    run_cli("convert", wan_tiny, out, "-r", "wan-fp8", "--overwrite", check=True)
    assert _tree(out) != before and read_json(out / "quantize_manifest.json")["recipe"]["name"] == "wan-fp8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_replaces_only_checkpoints_or_empty_directories(wan_tiny, tmp_path):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    proc = run_cli("convert", wan_tiny, out, "-r", "wan-fp8", "--overwrite")
    assert proc.returncode == 2 and "is not a checkpoint written by `quantize convert`" in proc.stderr
    assert (out / "thesis.tex").read_text() == "years of work"
    empty = tmp_path / "empty"
    empty.mkdir()
    run_cli("convert", wan_tiny, empty, "-r", "wan-fp8", "--overwrite", check=True)
    link = tmp_path / "link"
    link.symlink_to(empty)
    proc = run_cli("convert", wan_tiny, link, "-r", "wan-fp8", "--overwrite")
    assert proc.returncode == 2 and "is a symbolic link" in proc.stderr


def test_copied_file_never_replaces_a_converted_one(wan_tiny, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(wan_tiny, src)
    # a stray single-file checkpoint that is not in the index, named like the output's only shard
    (src / "diffusion_pytorch_model-00001-of-00001.safetensors").write_bytes(b"stale junk")
    proc = run_cli("convert", src, tmp_path / "out", "-r", "wan-fp8", "--max-shard-size", "1GB")
    assert proc.returncode == 2, proc.stderr
    assert "would overwrite the converted diffusion_pytorch_model-00001-of-00001.safetensors" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_failed_conversion_leaves_old_output_intact(wan_tiny, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(wan_tiny, src)
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", "wan-fp8", check=True)
    before = _tree(out)
    # poison a weight that is to be quantized, in the last shard that holds one
    targeted = re.compile(r"blocks\.\d+\.((self|cross)_attn\.[qkvo]|ffn\.0)\.weight")
    for last in sorted(src.glob("*.safetensors"), reverse=True):
        with safe_open(last, framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = f.metadata()
        victims = [k for k in tensors if targeted.fullmatch(k)]
        if victims:
            break
    victim = victims[-1]
    tensors[victim][0, 0] = float("nan")
    save_file(tensors, last, metadata=metadata)
    proc = run_cli("convert", src, out, "-r", "wan-fp8", "--overwrite")
    assert proc.returncode == 2, proc.stderr
    assert f"tensor '{victim}' holds NaN or Inf values" in proc.stderr and last.name in proc.stderr
    assert len(proc.stderr.strip().splitlines()[-1]) > 0 and "Traceback" not in proc.stderr
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_output_inside_source_is_refused(wan_tiny):
    proc = run_cli("convert", wan_tiny, wan_tiny / "fp8", "-r", "wan-fp8")
    assert proc.returncode == 2 and "must not be the source, inside it" in proc.stderr
    assert not (wan_tiny / "fp8").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["-r", "no-such-recipe.yaml"], "no such file, and no bundled recipe 'no-such-recipe.yaml'"),
        (["-r", "wan-diffusers-fp8.yaml"], "component folder 'transformer' named by the recipe is missing"),
        (["-r", "wan-fp8", "--max-shard-size", "lots"], "expected a positive number of bytes"),
        (["-r", "wan-fp8", "--max-shard-size", "inf"], "expected a positive number of bytes"),
        (["-r", "wan-fp8", "--max-shard-size", "0.1"], "expected a positive number of bytes"),
        (["-r", "wan-fp8", "--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_bad_input_is_one_line_exit_2(wan_tiny, tmp_path, args, message):
    proc = run_cli("convert", wan_tiny, tmp_path / "out", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_bad_recipe_file_through_cli(wan_tiny, tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("format: fp8_channel\ntarget: ['blocks\\.\\d+\\.ffn\\.0']\n")
    proc = run_cli("plan", wan_tiny, "-r", recipe)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"error: {recipe}: unknown key 'target'; did you mean 'targets'? (allowed: format, targets, name, description, components, ignore, keep_dtype, copy_other_files, checks, type, types)"
    )


def test_debug_shows_traceback_and_keeps_the_exit_code(wan_tiny, tmp_path):
    proc = run_cli("--debug", "convert", wan_tiny, tmp_path / "o", "-r", "nope.yaml")
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "InputError" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["convert", "a", "b"], "give --recipe RECIPE or --format FORMAT (one of them)"),
        (["convert", "a", "b", "-r", "wan-fp8", "--workers", "many"], "'many' is not a valid integer"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_plan_cli_shows_groups_patterns_and_totals(wan_tiny):
    proc = run_cli("plan", wan_tiny, "-r", "wan-fp8", check=True)
    assert "blocks.*.ffn.0.weight" in proc.stdout and "fp8_channel" in proc.stdout
    assert "blocks\\.\\d+\\.ffn\\.0" in proc.stdout
    assert "% of the source" in proc.stdout


def test_recipes_cli_lists_every_bundled_recipe():
    from quantize.recipes import bundled_recipes

    proc = run_cli("recipes", check=True)
    for name in bundled_recipes():
        assert name in proc.stdout
    shown = run_cli("recipes", "wan-fp8.yaml", check=True).stdout
    assert load_recipe("wan-fp8.yaml").recipe.targets[0] in shown


def test_inspect_cli(wan_tiny, tmp_path):
    out = tmp_path / "out"
    run_cli("convert", wan_tiny, out, "-r", "wan-fp8", check=True)
    import json

    summary = json.loads(run_cli("inspect", out, "--json", check=True).stdout)
    assert summary["format"] == "fp8_channel"
    assert summary["components"][0]["quantized"] == len(wan_fp8_modules(wan_tiny))
    assert "blocks.0.ffn.2" in summary["components"][0]["kept_linears"]
    assert math.isfinite(summary["min_sqnr_db"])
    assert run_cli("inspect", wan_tiny).returncode == 2


def test_python_api_takes_a_recipe_name(wan_tiny, tmp_path):
    from quantize import convert

    manifest = convert(wan_tiny, tmp_path / "out", "wan-fp8.yaml", workers=1)
    assert manifest.format == "fp8_channel"
    assert {k.split("/", 1)[1].removesuffix(".weight") for k in manifest.tensors} == wan_fp8_modules(wan_tiny)
    assert (tmp_path / "out" / "quantize_manifest.json").read_text() == manifest.to_json()


def test_copy_other_files_refuses_to_copy_an_unconverted_twin(tmp_path):
    """A two-expert diffusers repo with the one-expert recipe would ship transformer_2 in bf16: refused."""
    from quantize.examples import write_random_checkpoint
    from quantize.models.examples import examples_of

    src = tmp_path / "src"
    (model,) = examples_of("wan").models("tiny", "t2v")
    for comp in ("transformer", "transformer_2"):
        write_random_checkpoint(src / comp, model.tensors, config=model.config)
    (tmp_path / "r.yaml").write_text(
        "format: fp8_channel\ncomponents: [transformer]\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\ncopy_other_files: true\n"
    )
    proc = run_cli("plan", src, "-r", tmp_path / "r.yaml")
    assert proc.returncode == 2
    assert "transformer_2: holds another WanModel that the recipe does not convert" in proc.stderr
