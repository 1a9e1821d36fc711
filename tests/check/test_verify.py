"""`quantize verify`: a good checkpoint passes; every fault is caught with the right message and exit code."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.conftest import load_all, read_json, run_cli, wan_fp8_modules
from tests.helpers.verify import failures as _failures
from tests.helpers.verify import rehash as _rehash
from tests.helpers.verify import rewrite as _rewrite
from tests.helpers.verify import verify_json as _verify


@pytest.fixture(scope="module")
def converted(tmp_path_factory, wan_tiny) -> Path:
    out = tmp_path_factory.mktemp("verify") / "fp8"
    run_cli("convert", wan_tiny, out, "--recipe", "wan-fp8.yaml", "--max-shard-size", "100KB", check=True)
    return out


@pytest.fixture
def ckpt(converted, tmp_path) -> Path:
    """A fresh copy of the converted checkpoint, to damage."""
    copy = tmp_path / "ckpt"
    shutil.copytree(converted, copy)
    return copy


def _shards(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


def test_a_good_checkpoint_passes(converted, wan_tiny):
    code, report, _ = _verify(converted)
    assert code == 0 and report["ok"]
    assert {c["category"] for c in report["checks"]} == {"integrity"}
    code, report, _ = _verify(converted, "--source", wan_tiny)
    assert code == 0 and report["ok"], _failures(report)
    checks = {c["check"]: c["passed"] for c in report["checks"]}
    quantized = len(wan_fp8_modules(wan_tiny))
    assert checks["requantize"] == checks["weight SQNR"] == quantized
    assert checks["kept tensors"] == len(load_all(wan_tiny)) - quantized
    assert report["hashing"]["bytes"] == sum(
        p.stat().st_size for p in converted.rglob("*") if p.is_file() and p.name != "quantize_manifest.json"
    )


def test_table_output_and_exit_code(converted, wan_tiny):
    proc = run_cli("verify", converted, "--source", wan_tiny)
    assert proc.returncode == 0 and "verified" in proc.stdout and "requantize" in proc.stdout


def test_one_flipped_byte_in_any_shard_is_caught_and_named(ckpt):
    for shard in _shards(ckpt):
        raw = bytearray(shard.read_bytes())
        raw[len(raw) * 2 // 3] ^= 0x01
        shard.write_bytes(bytes(raw))
        code, report, _ = _verify(ckpt)
        assert code == 1
        assert any(f.startswith(f"{shard.name}: SHA-256") for f in _failures(report)["file sha256"])
        raw[len(raw) * 2 // 3] ^= 0x01
        shard.write_bytes(bytes(raw))
    assert _verify(ckpt)[0] == 0


def test_flipped_byte_in_the_table_output(ckpt):
    shard = _shards(ckpt)[0]
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x80
    shard.write_bytes(bytes(raw))
    proc = run_cli("verify", ckpt)
    assert (
        proc.returncode == 1
        and f"{shard.name}: SHA-256" in proc.stdout
        and "verification failed" in proc.stdout
    )


def test_truncated_shard(ckpt):
    shard = _shards(ckpt)[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    code, report, _ = _verify(ckpt)
    failures = _failures(report)
    assert code == 1
    assert any(f.startswith(f"{shard.name}:") and "truncated" in f for f in failures["file size"])
    assert any(shard.name in f and "truncated" in f for f in failures["headers and index"])


def test_missing_shard(ckpt):
    shard = _shards(ckpt)[0]
    shard.unlink()
    code, report, _ = _verify(ckpt)
    failures = _failures(report)
    assert code == 1
    assert failures["file size"] == [f"{shard.name}: listed in the manifest but missing"]
    assert any(
        f"names shard '{shard.name}', which does not exist" in f for f in failures["headers and index"]
    )


def test_unlisted_shard(ckpt):
    shutil.copy(_shards(ckpt)[0], ckpt / "extra.safetensors")
    code, report, _ = _verify(ckpt)
    assert code == 1 and _failures(report)["unlisted files"] == [
        "extra.safetensors: not in the manifest (a stray or substituted file)"
    ]


def test_extra_key(ckpt, wan_tiny):
    shard = _shards(ckpt)[0]
    _rewrite(shard, lambda t: t.update({"blocks.0.smuggled": torch.zeros(3)}))
    index = ckpt / "diffusion_pytorch_model.safetensors.index.json"
    data = read_json(index)
    data["weight_map"]["blocks.0.smuggled"] = shard.name
    index.write_text(json.dumps(data))
    _rehash(ckpt, shard, index)
    code, report, _ = _verify(ckpt)
    assert code == 1 and "tensor count" in _failures(report)
    code, report, _ = _verify(ckpt, "--source", wan_tiny)
    assert any("'blocks.0.smuggled' is not in the recipe's plan" in f for f in _failures(report)["keys"])


def test_missing_key(ckpt, wan_tiny):
    shard = _shards(ckpt)[-1]
    with safe_open(shard, framework="pt") as f:
        victim = next(k for k in f.keys() if k.endswith(".bias"))
    _rewrite(shard, lambda t: t.pop(victim))
    index = ckpt / "diffusion_pytorch_model.safetensors.index.json"
    data = read_json(index)
    del data["weight_map"][victim]
    index.write_text(json.dumps(data))
    _rehash(ckpt, shard, index)
    code, report, _ = _verify(ckpt)
    assert code == 1 and "tensor count" in _failures(report)
    code, report, _ = _verify(ckpt, "--source", wan_tiny)
    assert any(f"tensor {victim!r} is missing" in f for f in _failures(report)["keys"])


def test_wrong_dtype(ckpt):
    for shard in _shards(ckpt):
        with safe_open(shard, framework="pt") as f:
            scale = next((k for k in f.keys() if k.endswith(".weight_scale")), None)
        if scale:
            break
    _rewrite(shard, lambda t: t.update({scale: t[scale].to(torch.bfloat16)}))
    _rehash(ckpt, shard)
    code, report, _ = _verify(ckpt)
    assert code == 1
    assert any(
        f"tensor '{scale}' is BF16" in f and "fp8_channel requires F32" in f
        for f in _failures(report)["tensor layout"]
    )


def test_index_pointing_at_a_missing_file(ckpt):
    index = ckpt / "diffusion_pytorch_model.safetensors.index.json"
    data = read_json(index)
    key = next(iter(data["weight_map"]))
    data["weight_map"][key] = "diffusion_pytorch_model-00009-of-00009.safetensors"
    index.write_text(json.dumps(data))
    _rehash(ckpt, index)
    code, report, _ = _verify(ckpt)
    assert code == 1
    assert any(
        "names shard 'diffusion_pytorch_model-00009-of-00009.safetensors', which does not exist" in f
        for f in _failures(report)["headers and index"]
    )


def test_edited_manifest(ckpt, wan_tiny):
    manifest = read_json(ckpt / "quantize_manifest.json")
    key = next(iter(manifest["tensors"]))
    manifest["tensors"][key]["sqnr_db"] = 99.0  # a prettier figure than measured
    manifest["recipe"]["text"] = manifest["recipe"]["text"].replace("min_sqnr_db: 25", "min_sqnr_db: 5")
    (ckpt / "quantize_manifest.json").write_text(json.dumps(manifest))
    code, report, _ = _verify(ckpt, "--source", wan_tiny)
    failures = _failures(report)
    assert code == 1
    assert failures["recipe"] == [
        "quantize_manifest.json: the recipe text does not match its SHA-256 (edited manifest)"
    ]
    assert any(key.split("/", 1)[1] in f for f in failures["recorded error"])
    manifest["output_files"][0]["sha256"] = "0" * 64
    (ckpt / "quantize_manifest.json").write_text(json.dumps(manifest))
    assert _failures(_verify(ckpt)[1])["file sha256"]


def test_changed_source(converted, wan_tiny, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(wan_tiny, src)
    shard = sorted(src.glob("*.safetensors"))[0]
    _rewrite(shard, lambda t: t.update({k: t[k] + 1 for k in list(t)[:1]}))
    code, report, _ = _verify(converted, "--source", src)
    failures = _failures(report)
    assert code == 1
    assert any(
        f.startswith(str(shard)) and "not the source the checkpoint was made from" in f
        for f in failures["source sha256"]
    )


def test_threshold_exceeded(wan_tiny, tmp_path):
    recipe = tmp_path / "strict.yaml"
    recipe.write_text(
        "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\nchecks: {min_sqnr_db: 60, min_cosine: 0.999999}\n"
    )
    out = tmp_path / "out"
    run_cli("convert", wan_tiny, out, "-r", recipe, check=True)
    code, report, _ = _verify(out, "--source", wan_tiny)
    failures = _failures(report)
    assert code == 1 and len(failures["weight SQNR"]) == 2 and len(failures["weight cosine"]) == 2
    assert "below the recipe's min_sqnr_db 60" in failures["weight SQNR"][0]


def test_nf4_and_torchao_checkpoints_verify(make_wan, tmp_path):
    src = make_wan("t2v")
    for recipe in ("wan-nf4.yaml", "wan-torchao-fp8.yaml"):
        out = tmp_path / recipe
        run_cli("convert", src, out, "-r", recipe, check=True)
        code, report, _ = _verify(out, "--source", src)
        assert code == 0 and report["ok"], _failures(report)


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda c: shutil.rmtree(c), "checkpoint directory not found"),
        (lambda c: (c / "quantize_manifest.json").unlink(), "quantize_manifest.json: not found"),
        (lambda c: (c / "quantize_manifest.json").write_text("{"), "invalid manifest"),
    ],
)
def test_unusable_input_exits_2(ckpt, setup, message):
    setup(ckpt)
    proc = run_cli("verify", ckpt)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_forward_needs_a_source(converted):
    proc = run_cli("verify", converted, "--forward")
    assert proc.returncode == 2 and "give --source too" in proc.stderr


def _diffusers_source(tmp_path: Path) -> Path:
    from tests.diffusers_models import wan_of_width

    src = tmp_path / "Wan-Diffusers"
    wan_of_width(src / "transformer", width=64)
    return src


@pytest.mark.parametrize(
    "recipe", ["wan-diffusers-fp8.yaml", "wan-diffusers-nf4.yaml", "wan-diffusers-torchao-fp8.yaml"]
)
def test_forward_parity(tmp_path, recipe):
    import diffusers  # noqa: F401  (a dev dependency: missing is a failure, not a skip)

    src = _diffusers_source(tmp_path)
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", recipe, check=True)
    code, report, _ = _verify(out, "--source", src, "--forward")
    assert code == 0 and report["ok"], _failures(report)
    assert {c["check"]: c["passed"] for c in report["checks"]}["output SQNR"] == 1


def test_forward_threshold_exceeded(tmp_path):
    import diffusers  # noqa: F401  (a dev dependency: missing is a failure, not a skip)

    src = _diffusers_source(tmp_path)
    recipe = tmp_path / "strict.yaml"
    recipe.write_text(
        "format: nf4\ncomponents: [transformer]\ntargets: ['blocks\\.\\d+\\.ffn\\.net\\.2']\nchecks: {min_forward_sqnr_db: 90}\n"
    )
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", recipe, check=True)
    code, report, _ = _verify(out, "--source", src, "--forward")
    assert code == 1
    assert "WanTransformer3DModel forward output SQNR" in _failures(report)["output SQNR"][0]


@pytest.mark.parametrize("recipe", ["wan-fp8.yaml", "wan-comfy-int8.yaml", "wan-gguf-q8_0.yaml"])
def test_forward_runs_original_names_as_the_diffusers_class(wan_tiny, tmp_path, recipe):
    """A source with Wan's original names (config `WanModel`) runs as WanTransformer3DModel, renamed through the
    name table, for every naming of the output (source names, ComfyUI's and GGUF's native names)."""
    out = tmp_path / "out"
    run_cli("convert", wan_tiny, out, "-r", recipe, check=True)
    code, report, _ = _verify(out, "--source", wan_tiny, "--forward")
    assert code == 0 and report["ok"], _failures(report)
    assert {c["check"]: c["passed"] for c in report["checks"]}["output SQNR"] == 1


def test_forward_refuses_a_model_class_it_cannot_run(converted, wan_tiny, tmp_path):
    source = tmp_path / "src"
    shutil.copytree(wan_tiny, source)
    config = read_json(source / "config.json")
    (source / "config.json").write_text(json.dumps({**config, "_class_name": "FluxTransformer2DModel"}))
    proc = run_cli("verify", converted, "--source", source, "--forward")
    assert proc.returncode == 2 and "this config names 'FluxTransformer2DModel'" in proc.stderr


def test_forward_refuses_a_wan_variant_diffusers_does_not_implement(make_wan, tmp_path):
    source = make_wan("lingbot")
    out = tmp_path / "out"
    run_cli("convert", source, out, "-r", "lingbot-world-fp8.yaml", check=True)
    proc = run_cli("verify", out, "--source", source, "--forward")
    assert proc.returncode == 2 and "has no counterpart in diffusers' WanTransformer3DModel" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- the same faults, through the library (faster), and the ones the review found ---------------


def _lib_failures(ckpt: Path, source: Path | None = None) -> dict[str, list[str]]:
    from quantize.check.verify import verify

    report = verify(ckpt, source, workers=2)
    return {c.name: c.failures for c in report.checks.values() if not c.ok}


def _first_with(ckpt: Path, suffix: str) -> tuple[Path, str]:
    for shard in _shards(ckpt):
        with safe_open(shard, framework="pt") as f:
            key = next((k for k in f.keys() if k.endswith(suffix)), None)
        if key:
            return shard, key
    raise AssertionError(suffix)


def test_an_all_zero_weight_verifies(tmp_path, wan_tiny):
    src = tmp_path / "src"
    shutil.copytree(wan_tiny, src)
    shard, target = next(
        (shard, k)
        for shard in sorted(src.glob("*.safetensors"))
        for k in safe_open(shard, framework="pt").keys()
        if k.endswith(("self_attn.o.weight", "ffn.0.weight"))
    )
    _rewrite(shard, lambda t: t.update({target: torch.zeros_like(t[target])}))
    for recipe in ("wan-fp8.yaml", "wan-nf4.yaml"):
        out = tmp_path / recipe
        run_cli("convert", src, out, "-r", recipe, check=True)
        assert _lib_failures(out, src) == {}


def test_changed_quantized_bytes_fail_requantize_even_with_a_rehashed_manifest(ckpt, wan_tiny):
    shard, key = _first_with(ckpt, ".weight_scale")
    module = key.removesuffix(".weight_scale")
    _rewrite(
        shard,
        lambda t: t.update(
            {f"{module}.weight": (t[f"{module}.weight"].float() * 0.5).to(torch.float8_e4m3fn)}
        ),
    )
    _rehash(ckpt, shard)
    failures = _lib_failures(ckpt, wan_tiny)
    assert any(f"-> {module}.weight" in f and "does not reproduce" in f for f in failures["requantize"])
    assert "recorded error" in failures


def test_changed_kept_tensor_fails(ckpt, wan_tiny):
    shard, key = _first_with(ckpt, "norm3.bias")
    _rewrite(shard, lambda t: t.update({key: t[key] + 1}))
    _rehash(ckpt, shard)
    failures = _lib_failures(ckpt, wan_tiny)
    assert (
        failures.keys() == {"kept tensors"}
        and f"-> {key}: is not a bit-exact copy" in failures["kept tensors"][0]
    )


def test_nan_in_a_quantized_weight_fails_finite(ckpt, wan_tiny):
    shard, key = _first_with(ckpt, ".weight_scale")
    module = key.removesuffix(".weight_scale")

    def poison(t):
        w = t[f"{module}.weight"].view(torch.uint8).clone()
        w[0, 0] = 0x7F  # e4m3fn NaN
        t[f"{module}.weight"] = w.view(torch.float8_e4m3fn)

    _rewrite(shard, poison)
    _rehash(ckpt, shard)
    failures = _lib_failures(ckpt, wan_tiny)
    assert any(module in f for f in failures["weight finite"])


@pytest.mark.parametrize(
    "damage, parity",
    [
        # one bit of one 4-bit code: the hash, and requantizing the source, both catch it
        (
            "packed weight",
            {"requantize": "-> {tensor}: requantizing the source does not reproduce the stored bytes"},
        ),
        # the packed quant-state JSON made unparseable: the tensor cannot be decoded, a failed check, not a crash
        ("quant state", {"decode": "/{tensor}: cannot be read back: JSONDecodeError"}),
    ],
)
def test_a_flipped_byte_in_an_nf4_weight_fails_the_hash_and_parity(make_wan, tmp_path, damage, parity):
    src = make_wan("t2v")
    out = tmp_path / "nf4"
    run_cli("convert", src, out, "-r", "wan-nf4.yaml", check=True)
    shard = sorted(out.glob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    state = max(  # the last weight of the shard
        (k for k in header if k.endswith(".quant_state.bitsandbytes__nf4")),
        key=lambda k: header[k]["data_offsets"],
    )
    tensor = state.removesuffix(".quant_state.bitsandbytes__nf4")
    if damage == "packed weight":
        start, end = header[tensor]["data_offsets"]
        raw[8 + n + (start + end) // 2] ^= 0x10
    else:
        start, end = header[state]["data_offsets"]
        at = raw.index(b'"nested_offset": ', 8 + n + start) + len(b'"nested_offset": ')
        assert at < 8 + n + end
        raw[at] = ord("x")
    shard.write_bytes(bytes(raw))

    code, report, _ = _verify(out)
    assert code == 1 and _failures(report).keys() == {"file sha256"}
    (hashed,) = _failures(report)["file sha256"]
    assert hashed.startswith(f"{shard.name}: SHA-256") and "the file was changed or corrupted" in hashed

    code, report, stderr = _verify(out, "--source", src)
    failures = _failures(report)
    assert code == 1 and "Traceback" not in stderr
    assert failures.pop("file sha256") == [hashed]
    ((check, message),) = parity.items()
    (failure,) = failures.pop(check)
    assert message.format(tensor=tensor) in failure, failure
    if check == "requantize":  # the decoding changed too, so the manifest's error figures no longer hold
        assert failures.pop("recorded error") == [
            failure.split(": ")[0] + ": differs from the error figures the manifest records"
        ]
    assert failures == {}


def test_edited_recipe_yaml(ckpt):
    (ckpt / "recipe.yaml").write_text(
        (ckpt / "recipe.yaml").read_text().replace("min_sqnr_db: 25", "min_sqnr_db: 1")
    )
    failures = _lib_failures(ckpt)
    assert any(
        f.startswith("recipe.yaml: missing, or not the recipe the manifest records")
        for f in failures["recipe"]
    )


def test_duplicate_key_in_the_index(ckpt):
    index = ckpt / "diffusion_pytorch_model.safetensors.index.json"
    text = index.read_text()
    first = text.index('"weight_map": {') + len('"weight_map": {')
    key_line = text[first:].split("\n")[1]
    index.write_text(text[:first] + "\n" + key_line + text[first:])  # the first entry, twice
    _rehash(ckpt, index)
    failures = _lib_failures(ckpt)
    assert any("appears twice" in f for f in failures["headers and index"])


def test_missing_expert(make_wan, tmp_path):
    src = make_wan("a14b")
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", "wan2.2-a14b-fp8.yaml", check=True)
    shutil.rmtree(out / "low_noise_model")
    manifest = read_json(out / "quantize_manifest.json")
    manifest["components"] = [c for c in manifest["components"] if c["path"] != "low_noise_model"]
    manifest["output_files"] = [
        f for f in manifest["output_files"] if not f["path"].startswith("low_noise_model/")
    ]
    manifest["tensors"] = {
        k: v for k, v in manifest["tensors"].items() if not k.startswith("low_noise_model/")
    }
    (out / "quantize_manifest.json").write_text(json.dumps(manifest))
    assert any("but the recipe names" in f for f in _lib_failures(out)["components"])
    assert any("'low_noise_model' of the recipe is missing" in f for f in _lib_failures(out, src)["keys"])


def test_torchao_metadata_removed(make_wan, tmp_path):
    src = make_wan("t2v")
    out = tmp_path / "out"
    run_cli("convert", src, out, "-r", "wan-torchao-fp8.yaml", check=True)
    shards = sorted(out.glob("*.safetensors"))
    for shard in shards:
        with safe_open(shard, framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        save_file(tensors, shard, metadata={"format": "pt"})
    _rehash(out, *shards)
    assert any("lacks the torchao_fp8 entries" in f for f in _lib_failures(out, src)["shard metadata"])


def test_a_source_without_any_of_the_files_is_unusable(converted, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    proc = run_cli("verify", converted, "--source", tmp_path / "elsewhere")
    assert proc.returncode == 2 and "holds none of the" in proc.stderr
