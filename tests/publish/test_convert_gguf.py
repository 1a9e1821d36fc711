"""GGUF checkpoints end to end through the command line, read by the real clients: gguf-py's GGUFReader,
diffusers' `from_single_file` with `GGUFQuantizationConfig` (forward compared with the bf16 model), and the
rules ComfyUI(-GGUF) detects a Wan model by."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from quantize.ggml_types import ggml_type
from quantize.models import get_family
from tests.conftest import load_all, read_json, run_cli
from tests.diffusers_models import WAN_TINY
from tests.formats.references import ggml_quantize_chunk
from tests.helpers.comfyui import comfyui_wan_config

wan_native_name = get_family("wan").native_name

BLOCK_LINEAR = r"blocks\.\d+\.((self_attn|cross_attn)\.(q|k|v|o|k_img|v_img)|ffn\.(0|2))"


def _read(path: Path) -> tuple[dict, dict]:
    """Key-values and tensors (name -> (type name, torch shape, raw numpy)) as gguf-py's reader sees the file."""
    reader = gguf.GGUFReader(path)
    kv = {f.name: f.contents() for f in reader.fields.values() if f.name.startswith("general.")}
    tensors = {
        t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), np.array(t.data))
        for t in reader.tensors
    }
    return kv, tensors


def _reference_quantize(value, qtype: str) -> np.ndarray:
    """The reference quantizer's bytes for a whole source weight: gguf-py's for Q8_0 and the _0/_1 types, ggml's
    own for the K-quants (ours runs in torch, row chunk by row chunk)."""
    w = value.float().numpy()
    if ggml_type(qtype).k_quant:
        return ggml_quantize_chunk(w, qtype)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])


def _expected_type(module: str, recipe: dict) -> str:
    import re

    return next((t for p, t in recipe.get("types", {}).items() if re.fullmatch(p, module)), recipe["type"])


def _check_file(path: Path, source: dict, recipe: dict, rename=lambda n: n) -> dict:
    """Every source tensor in the file under its native name: quantized ones bit-exact in their type, kept
    2-D Linears as stored, everything else F32 (values exact)."""
    import re

    kv, tensors = _read(path)
    assert kv["general.architecture"] == "wan" and kv["general.quantization_version"] == 2
    assert set(tensors) == {rename(n) for n in source}
    for name, value in source.items():
        native = rename(name)
        kind, shape, raw = tensors[native]
        assert shape == tuple(value.shape), native
        module = name.removesuffix(".weight")
        if any(re.fullmatch(p, module) for p in recipe["targets"]):
            qtype = _expected_type(module, recipe)
            assert kind == qtype, native
            assert np.array_equal(raw.reshape(shape[0], -1), _reference_quantize(value, qtype)), native
        elif value.dim() == 2 and name.endswith(".weight"):
            assert kind == "BF16" and np.array_equal(
                raw.view(np.int16).reshape(shape), value.view(torch.int16).numpy()
            )
        else:
            assert kind == "F32" and np.array_equal(raw.reshape(shape), value.float().numpy()), native
    return tensors


@pytest.mark.parametrize(
    "layout, recipe, file_type",
    [("t2v", "wan-gguf-q4_k_m", 15), ("i2v", "wan-gguf-q8_0", 7), ("t2v", "wan-gguf-q6_k", 18)],
)
def test_original_names_to_one_gguf_file(make_wan, tmp_path, layout, recipe, file_type):
    src = make_wan(layout, preset="small")
    out = tmp_path / "out"
    plan = run_cli("plan", src, "--recipe", recipe, check=True).stdout
    run_cli("convert", src, out, "--recipe", recipe, check=True)
    path = out / "diffusion_model.gguf"
    spec = read_json(out / "quantize_manifest.json")
    recipe_dict = __import__("yaml").safe_load(spec["recipe"]["text"])
    tensors = _check_file(path, load_all(src), recipe_dict)
    kv, _ = _read(path)
    assert kv["general.file_type"] == file_type
    if "types" in recipe_dict:
        assert "gguf Q6_K" in plan and "gguf Q4_K" in plan
        assert tensors["blocks.0.ffn.2.weight"][0] == "Q6_K" and tensors["blocks.0.ffn.0.weight"][0] == "Q4_K"
    assert {t["type"] for t in spec["tensors"].values()} == {
        _expected_type(k.split("/")[1][:-7], recipe_dict) for k in spec["tensors"]
    }
    # ComfyUI's Wan detection on the file's shapes (the tensors' values are GGML blocks there)
    config = read_json(src / "config.json")
    state = {name: torch.empty(shape, device="meta") for name, (_, shape, _) in tensors.items()}
    assert comfyui_wan_config(state) == {
        k: config[k] for k in ("dim", "out_dim", "ffn_dim", "num_layers", "in_dim", "model_type")
    }
    assert state["patch_embedding.weight"].dim() == 5 and tensors["patch_embedding.weight"][0] == "F32"
    card = (out / "README.md").read_text()
    assert "Unet Loader (GGUF)" in card and "from_single_file" in card and "diffusion_model.gguf" in card
    proc = run_cli("verify", out, "--source", src, "--json")
    assert proc.returncode == 0, proc.stdout
    checks = {(c["category"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    assert checks[("parity", "requantize")]["passed"] == len(spec["tensors"])
    assert json.loads(run_cli("inspect", out, "--json", check=True).stdout)["format"] == "gguf"


def test_a_changed_block_fails_verify_naming_the_tensor(make_wan, tmp_path):
    src = make_wan("t2v", preset="small")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", "wan-gguf-q8_0", check=True)
    path = out / "diffusion_model.gguf"
    (t,) = [t for t in gguf.GGUFReader(path).tensors if t.name == "blocks.1.self_attn.q.weight"]
    data = bytearray(path.read_bytes())
    data[t.data_offset + 40] ^= 0x10  # a quantized value in the second block of the first row
    path.write_bytes(bytes(data))
    proc = run_cli("verify", out, "--source", src, "--json")
    assert proc.returncode == 1
    failed = {
        (c["category"], c["check"]): c["failures"] for c in json.loads(proc.stdout)["checks"] if not c["ok"]
    }
    assert ("integrity", "file sha256") in failed and ("parity", "requantize") in failed
    assert any("blocks.1.self_attn.q.weight" in f for f in failed[("parity", "requantize")])


def test_a_width_the_type_cannot_hold_is_refused_at_plan_time(make_wan, tmp_path):
    src = make_wan("t2v")  # dim 64: not whole 256-value blocks
    proc = run_cli("plan", src, "--recipe", "wan-gguf-q4_k_m")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert (
        "tensor 'blocks.0." in line
        and "Q4_K stores rows in blocks of 256" in line
        and "multiple of 256" in line
    )


@pytest.mark.parametrize(
    "recipe, min_sqnr", [("wan-diffusers-gguf-q8_0", 42), ("wan-diffusers-gguf-q4_k_m", 30)]
)
def test_diffusers_loads_the_file_and_its_forward_stays_close(tmp_path, recipe, min_sqnr):
    import diffusers

    torch.manual_seed(0)
    config = {
        **WAN_TINY,
        "attention_head_dim": 128,
        "num_attention_heads": 2,
        "ffn_dim": 512,
        "text_dim": 256,
    }
    model = diffusers.WanTransformer3DModel(**config).to(torch.bfloat16)
    src = tmp_path / "Wan-Diffusers"
    model.save_pretrained(src / "transformer")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", recipe, check=True)
    path = out / "transformer" / "transformer.gguf"
    _check_file(
        path,
        load_all(src / "transformer"),
        __import__("yaml").safe_load((out / "recipe.yaml").read_text()),
        wan_native_name,
    )
    loaded = diffusers.WanTransformer3DModel.from_single_file(
        str(path),
        config=str(src),
        subfolder="transformer",
        quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.bfloat16),
        torch_dtype=torch.bfloat16,
    )
    g = torch.Generator().manual_seed(0)
    inputs = dict(
        hidden_states=torch.randn(1, 16, 2, 8, 8, generator=g).to(torch.bfloat16),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, 256, generator=g).to(torch.bfloat16),
        return_dict=False,
    )
    with torch.no_grad():
        want, got = model(**inputs)[0].float(), loaded(**inputs)[0].float()
    sqnr = float(10 * torch.log10(want.pow(2).sum() / (want - got).pow(2).sum()))
    print(f"{recipe}: forward SQNR {sqnr:.1f} dB")
    assert min_sqnr < sqnr < 80  # quantized for real, and close
    assert run_cli("verify", out, "--source", src, "--forward").returncode == 0


def test_two_experts_one_gguf_file_each(make_wan, tmp_path):
    src = make_wan("a14b", preset="small")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", "wan2.2-a14b-gguf-q4_k_m", check=True)
    recipe = __import__("yaml").safe_load((out / "recipe.yaml").read_text())
    for expert in ("high_noise_model", "low_noise_model"):
        _check_file(out / expert / f"{expert}.gguf", load_all(src / expert), recipe)
    assert run_cli("verify", out, "--source", src).returncode == 0
