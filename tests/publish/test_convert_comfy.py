"""ComfyUI checkpoints end to end, through the command line: one file per model in Wan's native names, with
ComfyUI's markers, read back by the rules ComfyUI loads them with (DESIGN.md "Formats for where Wan users run
it"; ComfyUI itself is not on PyPI): the marker parse, the Wan detection keys, kept layers holding real values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from quantize.formats.comfy_fp8 import FORMAT as comfy_fp8
from quantize.formats.comfy_int8 import FORMAT as comfy_int8
from quantize.models import get_family
from tests.conftest import load_all, read_json, run_cli
from tests.diffusers_models import WAN_TINY
from tests.helpers.comfyui import comfyui_wan_config

wan_native_name = get_family("wan").native_name

LAYOUTS = {comfy_fp8.LAYOUT: comfy_fp8, comfy_int8.LAYOUT: comfy_int8}


def _file(out: Path, component: str = ".") -> Path:
    folder = out if component == "." else out / component
    (path,) = folder.glob("*.safetensors")
    return path


def _comfyui_reads(path: Path) -> dict:
    """The file as ComfyUI's loader sees it: per module, its marker's JSON (or None) and its tensors."""
    with safe_open(path, "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    markers = {
        k.removesuffix(".comfy_quant"): json.loads(t.numpy().tobytes())  # comfy/ops.py reads it this way
        for k, t in state.items()
        if k.endswith(".comfy_quant")
    }
    return {"state": state, "markers": markers}


def _check_comfy_file(path: Path, source_state: dict, fmt, rename=lambda n: n) -> dict:
    """Every source tensor under its native name: quantized ones bit-exact to the format with a marker, kept
    ones bit-exact (ComfyUI casts unmarked Linears, so they must hold real values); nothing else."""
    seen = _comfyui_reads(path)
    state, markers = seen["state"], seen["markers"]
    expected = set()
    for name, t in source_state.items():
        native = rename(name)
        module = native.removesuffix(".weight")
        if module in markers:
            assert markers[module] == {"format": fmt.LAYOUT}
            ours = fmt.encode(t)
            for part, value in ours.items():
                key = f"{module}.{part}"
                assert state[key].dtype == value.dtype and torch.equal(state[key], value), key
                expected.add(key)
        else:
            assert torch.equal(state[native], t) and state[native].dtype == t.dtype, native
            expected.add(native)
    assert set(state) == expected
    assert (
        state["patch_embedding.weight"].dim() == 5 and state["patch_embedding.weight"].dtype == torch.bfloat16
    )
    return seen


@pytest.mark.parametrize(
    "layout, recipe, fmt",
    [
        ("t2v", "wan-comfy-fp8", comfy_fp8),
        ("i2v", "wan-comfy-int8", comfy_int8),
        ("t2v", "wan-comfy-fp8-all", comfy_fp8),
    ],
)
def test_original_names_to_one_comfyui_file(make_wan, tmp_path, layout, recipe, fmt):
    src = make_wan(layout)
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", recipe, check=True)
    path = _file(out)
    assert path.name == f"diffusion_model_{fmt.NAME}.safetensors"
    seen = _check_comfy_file(path, load_all(src), fmt)
    config = read_json(src / "config.json")
    assert comfyui_wan_config(seen["state"]) == {
        k: config[k] for k in ("dim", "out_dim", "ffn_dim", "num_layers", "in_dim", "model_type")
    }
    quantized = set(seen["markers"])
    ffn2 = {f"blocks.{i}.ffn.2" for i in range(config["num_layers"])}
    if recipe.endswith("-all"):  # every block Linear, as Comfy's own releases
        assert ffn2 <= quantized
    else:  # the wan-fp8 split: ffn.2 kept
        assert not ffn2 & quantized
    if layout == "i2v":
        assert {"blocks.0.cross_attn.k_img", "blocks.1.cross_attn.v_img"} <= quantized
        assert "img_emb.proj.0.bias" in seen["state"] and "img_emb.proj.1" not in quantized
    assert not {m for m in quantized if not m.startswith("blocks.")}  # embeddings, head: kept

    # the checkpoint around the file: config.json, manifest, card; verify proves it, inspect reads it
    assert read_json(out / "config.json")["quantization_config"]["layout"] == fmt.LAYOUT
    manifest = read_json(out / "quantize_manifest.json")
    assert manifest["format"] == fmt.NAME and path.name in {f["path"] for f in manifest["output_files"]}
    card = (out / "README.md").read_text()
    assert "ComfyUI/models/diffusion_models/" in card and "Load Diffusion Model" in card and path.name in card
    # dit-quantize's loader runs it too, into the family's diffusers class
    assert 'load_quantized(WanTransformer3DModel, "path/to/this-checkpoint"' in card
    proc = run_cli("verify", out, "--source", src, "--json")
    assert proc.returncode == 0, proc.stdout
    checks = {(c["category"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    assert checks[("parity", "requantize")]["passed"] == len(quantized)
    proc = run_cli("inspect", out, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["format"] == fmt.NAME


def test_a_changed_byte_in_the_comfy_file_fails_verify(make_wan, tmp_path):
    src = make_wan("t2v")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", "wan-comfy-fp8", check=True)
    path = _file(out)
    with safe_open(path, "pt") as f:
        header_len = 8 + int.from_bytes(path.read_bytes()[:8], "little")
        key = "blocks.1.self_attn.q.weight"
        assert key in f.keys()
    header = json.loads(path.read_bytes()[8:header_len])
    start = header_len + header[key]["data_offsets"][0]
    data = bytearray(path.read_bytes())
    data[start + 3] ^= 0x01
    path.write_bytes(bytes(data))
    proc = run_cli("verify", out, "--source", src, "--json")
    assert proc.returncode == 1
    failed = {
        (c["category"], c["check"]): c["failures"] for c in json.loads(proc.stdout)["checks"] if not c["ok"]
    }
    # (a flipped low bit moves the error figures less than the manifest's rounding: "recorded error" may pass)
    assert set(failed) - {("parity", "recorded error")} == {
        ("integrity", "file sha256"),
        ("parity", "requantize"),
    }
    assert any("blocks.1.self_attn.q.weight" in f for f in failed[("parity", "requantize")])


@pytest.mark.parametrize("image_dim", [None, 64], ids=["t2v", "i2v"])
def test_diffusers_names_in_native_names_out(tmp_path, image_dim):
    """A diffusers Wan becomes a native-named ComfyUI file; diffusers' own converter maps it back onto the source."""
    import diffusers
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    src = tmp_path / "Wan-Diffusers"
    torch.manual_seed(0)
    kw = dict(image_dim=image_dim, added_kv_proj_dim=64) if image_dim else {}
    diffusers.WanTransformer3DModel(**{**WAN_TINY, **kw}).to(torch.bfloat16).save_pretrained(
        src / "transformer"
    )
    plan = run_cli("plan", src, "--recipe", "wan-diffusers-comfy-fp8", check=True).stdout
    assert "blocks.*.attn1.to_q.weight -> blocks.*.self_attn.q.weight" in plan  # the renaming, shown
    assert "scale_shift_table -> head.modulation" in plan
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", "wan-diffusers-comfy-fp8", check=True)
    path = _file(out, "transformer")
    assert path.name == "transformer_comfy_fp8.safetensors"
    source = load_all(src / "transformer")
    seen = _check_comfy_file(path, source, comfy_fp8, rename=wan_native_name)
    assert comfyui_wan_config(seen["state"])["model_type"] == ("i2v" if image_dim else "t2v")
    # diffusers' converter, given the file's tensors, names exactly the source's keys (and the quantized parts)
    back = convert_wan_transformer_to_diffusers(dict(seen["state"]))
    parts = re.compile(r"\.(weight_scale|comfy_quant)$")
    assert {k for k in back if not parts.search(k)} == set(source)
    assert {k.rsplit(".", 1)[0] for k in back if parts.search(k)} == {
        k.removesuffix(".weight")
        for k in source
        if re.fullmatch(
            r"blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)|ffn\.net\.0\.proj)\.weight",
            k,
        )
    }
    proc = run_cli("verify", out, "--source", src, "--forward")
    assert proc.returncode == 0, proc.stdout


def test_two_experts_one_file_each(make_wan, tmp_path):
    src = make_wan("a14b")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", "wan2.2-a14b-comfy-fp8", check=True)
    for expert in ("high_noise_model", "low_noise_model"):
        path = _file(out, expert)
        assert path.name == f"{expert}_comfy_fp8.safetensors"
        _check_comfy_file(path, load_all(src / expert), comfy_fp8)
        assert read_json(out / expert / "config.json")["quantization_config"]["quant_method"] == "comfy_fp8"
    assert run_cli("verify", out, "--source", src).returncode == 0
    proc = run_cli("upload", out, "someone/Wan-A14B-comfy", "--dry-run")
    assert proc.returncode == 0 and "high_noise_model_comfy_fp8.safetensors" in proc.stdout


def test_a_family_without_native_names_is_refused_at_plan_time_naming_both(tmp_path, monkeypatch):
    from tests import diffusers_models as models

    monkeypatch.setattr(get_family("kandinsky5"), "names", None)  # as a family without a native table is
    src = tmp_path / "K5"
    models.kandinsky5(src / "transformer")
    recipe = tmp_path / "k5-comfy.yaml"
    recipe.write_text(
        "format: comfy_fp8\ncomponents: [transformer]\ntargets: ['visual_transformer_blocks\\.\\d+\\.self_attention\\.to_query']\n"
    )
    for command in (
        ("plan", src, "--recipe", recipe),
        ("convert", src, tmp_path / "out", "--recipe", recipe),
    ):
        proc = run_cli(*command)
        assert proc.returncode == 2
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(
            f"error: {src / 'transformer'}: comfy_fp8 writes a model's native names, and Kandinsky 5 has none"
        )
    assert not (tmp_path / "out").exists()


def test_our_loader_runs_a_comfy_checkpoint_of_original_names(make_wan, tmp_path):
    """The original release's names and config, converted to ComfyUI's file, into diffusers' class: the config made
    the class's, every quantized layer an int8 module, the kept tensors as stored."""
    import diffusers

    from loaders import Int8Linear, load_quantized

    src = make_wan("t2v")
    run_cli("convert", src, tmp_path / "out", "--recipe", "wan-comfy-int8", check=True)
    model = load_quantized(diffusers.WanTransformer3DModel, tmp_path / "out")
    (path,) = (tmp_path / "out").glob("*.safetensors")
    stored = load_file(path)
    wan = get_family("wan")
    int8 = {name for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert int8 and {wan.native_name(f"{n}.weight") for n in int8} == {
        k for k in stored if k.endswith(".weight") and stored[k].dtype == torch.int8
    }
    for key, value in model.state_dict().items():
        module, _, part = key.rpartition(".")
        native = (
            f"{wan.native_name(module + '.weight')[: -len('.weight')]}.{part}"
            if module in int8
            else wan.native_name(key)
        )
        assert torch.equal(value, stored[native]), key


@pytest.mark.parametrize("recipe, fmt", [("wan-comfy-fp8", comfy_fp8), ("wan-comfy-int8", comfy_int8)])
def test_weights_are_streamed_in_row_chunks_bit_exactly(recipe, fmt, wan_tiny, tmp_path, monkeypatch):
    """Many row chunks a weight (comfy_fp8's scale from a first pass over them): the same bytes, manifest included,
    as one chunk a weight; the scale and the marker written once; no weight encoded whole."""
    import quantize.encode as chunking
    from quantize import convert

    whole = convert(wan_tiny, tmp_path / "whole", recipe, workers=1)
    encoded: list[int] = []
    encode = fmt.encode
    monkeypatch.setattr(fmt, "encode", lambda w, *a, **kw: encoded.append(w.shape[0]) or encode(w, *a, **kw))
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 3 * 64 * 4)  # three rows of the tiny model's 64-wide weights
    chunked = convert(wan_tiny, tmp_path / "chunked", recipe, workers=2)
    assert max(encoded) <= 3 and len(encoded) > 3 * len(whole.tensors)
    files = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*") if p.is_file())
    for rel in (
        f for f in files if f.name != "quantize_manifest.json"
    ):  # the files themselves, byte for byte
        assert (tmp_path / "chunked" / rel).read_bytes() == (tmp_path / "whole" / rel).read_bytes(), rel
    for (
        key,
        entry,
    ) in whole.tensors.items():  # the error figures are summed chunk by chunk: to the last digits
        other = chunked.tensors[key]
        assert other.max_abs_error == entry.max_abs_error
        assert other.sqnr_db == pytest.approx(entry.sqnr_db, abs=1e-3)
        assert other.cosine == pytest.approx(entry.cosine, abs=1e-7)
    assert run_cli("verify", tmp_path / "chunked", "--source", wan_tiny).returncode == 0
    # the streamed file, read as ComfyUI reads it, against comfy-kitchen's own quantizer on the whole weight
    from comfy_kitchen.backends.eager import quantization as ck
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout
    from comfy_kitchen.tensor.int8 import TensorWiseINT8Layout

    stored, source = _comfyui_reads(_file(tmp_path / "chunked")), load_all(wan_tiny)
    assert len(stored["markers"]) == len(whole.tensors)
    for module in stored["markers"]:
        w, q, scale = (
            source[f"{module}.weight"].float(),
            *(stored["state"][f"{module}.{p}"] for p in ("weight", "weight_scale")),
        )
        if fmt is comfy_fp8:
            ref_scale, layout = w.abs().amax() / 448.0, TensorCoreFP8Layout
            ref_q = ck.quantize_per_tensor_fp8(w, ref_scale)
        else:
            (ref_q, ref_scale), layout = ck.quantize_int8_rowwise(w), TensorWiseINT8Layout
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(scale, ref_scale), (
            module
        )
        params = layout.Params(scale=scale, orig_dtype=torch.float32, orig_shape=tuple(w.shape))
        assert torch.equal(
            QuantizedTensor(q, layout.__name__, params).dequantize(),
            fmt.decode({"weight": q, "weight_scale": scale}),
        )
