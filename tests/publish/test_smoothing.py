"""`convert --calibrate` smooths NVFP4 layers (ComfyUI's ``pre_quant_scale``, AWQ's rule with its exponent chosen per
layer on the calibration inputs) where it measures better than plain NVFP4: written as powers of two, recorded in the
manifest with both figures, re-quantized by `verify`, run by the loader as ComfyUI runs it.

The source is a diffusers Wan (dim 64, two blocks) with salient input channels: four channels of each block's
self-attention and FFN modulation scaled by 30, so the inputs of ``self_attn.q/k/v`` and ``ffn.0`` hold activation
outliers (a few channels far above the rest), as real DiTs' do.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from quantize.formats import ComfyOptions, get_format
from quantize.formats.base import UnsupportedShapeError
from quantize.models import get_family
from tests.conftest import read_json, run_cli

wan = get_family("wan")
NVFP4 = get_format("comfy_nvfp4")
RECIPE = "wan-diffusers-comfy-nvfp4"
#: the layers whose inputs carry the planted outliers (block 1: the recipe's NVFP4 block)
OUTLIERS = ("blocks.1.self_attn.q", "blocks.1.self_attn.k", "blocks.1.self_attn.v", "blocks.1.ffn.0")
#: the issue's target: forward SQNR with static scales, smoothed against plain NVFP4
MIN_GAIN_DB = 1.0


def salient_wan(root: Path) -> tuple[Path, Path]:
    """(the Wan with salient input channels, its calibration inputs: two samples in bf16)."""
    from tests.diffusers_models import wan_of_width

    src = root / "Wan-salient"
    wan_of_width(src / "transformer", width=64)
    file = src / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(file)
    g = torch.Generator().manual_seed(2)
    for block in range(2):
        table = tensors[f"blocks.{block}.scale_shift_table"].float()
        for row in (1, 4):  # scale_msa (self-attention's q/k/v input), c_scale (the FFN's input)
            table[0, row, torch.randperm(64, generator=g)[:4]] = 30.0
        tensors[f"blocks.{block}.scale_shift_table"] = table.to(torch.bfloat16)
    save_file(tensors, str(file), metadata={"format": "pt"})
    g = torch.Generator().manual_seed(1)
    inputs = root / "cal.safetensors"
    save_file(
        {
            "hidden_states": torch.randn(2, 4, 2, 8, 8, generator=g).to(torch.bfloat16),
            "timestep": torch.tensor([900, 100]),
            "encoder_hidden_states": torch.randn(2, 8, 64, generator=g).to(torch.bfloat16),
        },
        str(inputs),
    )
    return src, inputs


@pytest.fixture(scope="module")
def smoothed(tmp_path_factory) -> tuple[Path, Path, Path, str]:
    """(source, calibration inputs, checkpoint converted with --calibrate, convert's stdout)."""
    root = tmp_path_factory.mktemp("smoothing")
    src, inputs = salient_wan(root)
    out = root / "out"
    proc = run_cli("convert", src, out, "-r", RECIPE, "--calibrate", inputs, check=True)
    return src, inputs, out, proc.stdout


def _file(out: Path) -> Path:
    (path,) = out.glob("*/*.safetensors")
    return path


def _smoothing(out: Path) -> dict[str, dict]:
    """Native module name -> the manifest's smoothing record, for the smoothed layers."""
    tensors = read_json(out / "quantize_manifest.json")["calibration"]["tensors"]
    return {
        k.removeprefix("transformer/").removesuffix(".weight"): e["smoothing"]
        for k, e in tensors.items()
        if "smoothing" in e
    }


def test_the_outlier_layers_are_smoothed_and_the_forward_gains(smoothed):
    _, _, out, stdout = smoothed
    records = _smoothing(out)
    assert set(OUTLIERS) <= set(records)
    stored = load_file(_file(out))
    manifest = read_json(out / "quantize_manifest.json")
    nvfp4 = [k.removesuffix(".comfy_quant") for k, t in stored.items() if k.endswith(".comfy_quant")
             and json.loads(t.numpy().tobytes())["format"] == "nvfp4"]  # fmt: skip
    plain = [m for m in nvfp4 if m not in records]
    assert plain  # a layer it does not help (blocks.1.self_attn.o here) gets none
    assert manifest["schema_version"] == 4  # smoothing's fields: a reader of version 3 is told to upgrade
    for module in plain:
        assert f"{module}.pre_quant_scale" not in stored
    for module, record in records.items():
        p = stored[f"{module}.pre_quant_scale"]
        in_features = manifest["tensors"][f"transformer/{module}.weight"]["shape"][1]
        assert p.dtype == torch.float32 and p.shape == (in_features,)
        mantissa, exponent = torch.frexp(p)
        assert bool((mantissa == 0.5).all()), module  # powers of two: x · p and W / p are exact
        assert (int(exponent.min()) - 1, int(exponent.max()) - 1) == (
            record["min_exponent"],
            record["max_exponent"],
        )
        assert 0 < record["alpha"] <= 1
        assert record["smoothed_sqnr_db"] >= record["plain_sqnr_db"] + 0.1, module
    for module in OUTLIERS:  # the planted outliers: the largest |x| channels get the smallest p
        assert records[module]["smoothed_sqnr_db"] > records[module]["plain_sqnr_db"] + 3, module
    cal = manifest["calibration"]
    static = cal["forward"]["transformer"]["static_sqnr_db"]
    unsmoothed = cal["unsmoothed_static_sqnr_db"]["transformer"]
    assert static >= unsmoothed + MIN_GAIN_DB, (static, unsmoothed)  # the target
    assert f"smoothing: {len(records)} NVFP4 layers hold a pre_quant_scale" in stdout
    assert f"without smoothing, static scales {unsmoothed:.2f} dB" in stdout
    card = (out / "README.md").read_text()
    assert "### Smoothing" in card and f"{unsmoothed:.2f} dB without smoothing" in card
    row = f"| `transformer/{OUTLIERS[0]}.weight` | {records[OUTLIERS[0]]['alpha']:.2f} |"
    assert row in card


def test_the_stored_weight_is_comfy_kitchens_nvfp4_of_w_over_p(smoothed):
    """The reference: ``TensorCoreNVFP4Layout.quantize(w.float() / p)``, bit for bit; ``input_scale`` is the amax of
    the smoothed input over the range."""
    from comfy_kitchen.tensor import TensorCoreNVFP4Layout

    src, _, out, _ = smoothed
    stored = load_file(_file(out))
    source = load_file(src / "transformer" / "diffusion_pytorch_model.safetensors")
    for module in OUTLIERS:
        p = stored[f"{module}.pre_quant_scale"]
        w = source[wan.diffusers_name(f"{module}.weight")]
        q, params = TensorCoreNVFP4Layout.quantize(w.float() / p)
        assert torch.equal(stored[f"{module}.weight"], q), module
        assert torch.equal(
            stored[f"{module}.weight_scale"].view(torch.uint8), params.block_scale.view(torch.uint8)
        )
        assert torch.equal(stored[f"{module}.weight_scale_2"], params.scale)


def test_verify_requantizes_with_the_stored_scale_and_catches_a_changed_one(smoothed, tmp_path):
    from tests.helpers.verify import failures, rehash, rewrite, verify_json

    src, inputs, out, _ = smoothed
    code, report, _ = verify_json(out, "--source", src, "--forward", "--inputs", inputs)
    assert code == 0 and report["ok"], failures(report)
    recorded = read_json(out / "quantize_manifest.json")["calibration"]["forward"]["transformer"]
    assert report["forward"]["transformer"]["inputs_quantized"] == recorded
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    path = _file(bad)
    module = OUTLIERS[0]

    def doubled(tensors: dict) -> None:  # one channel's factor doubled: still a power of two
        p = tensors[f"{module}.pre_quant_scale"].clone()
        p[0] *= 2
        tensors[f"{module}.pre_quant_scale"] = p

    rewrite(path, doubled)
    rehash(bad, path)
    code, report, _ = verify_json(bad, "--source", src)
    assert code == 1, failures(report)
    (failure,) = failures(report)["requantize"]  # (and the figures the weight had with the recorded scale)
    assert failure.endswith(
        f"{wan.diffusers_name(module + '.weight')}: requantizing the source does not reproduce the stored bytes"
    )


def test_the_loader_computes_what_comfyui_computes(smoothed):
    """ComfyUI's Linear multiplies the input by ``pre_quant_scale`` (in its dtype) and multiplies by the stored
    W / p; the loader's decoded path multiplies x by the decoded W / p times p: the same products, bit for bit."""
    from diffusers import WanTransformer3DModel

    from loaders import load_quantized
    from loaders.modules import ComfyNVFP4Linear

    _, _, out, _ = smoothed
    model = load_quantized(WanTransformer3DModel, out / "transformer")
    layers = {wan.native_name(f"{n}.weight").removesuffix(".weight"): m
              for n, m in model.named_modules() if isinstance(m, ComfyNVFP4Linear)}  # fmt: skip
    g = torch.Generator().manual_seed(0)
    for module in OUTLIERS:
        m = layers[module]
        parts = m.stored()
        assert m.options.pre_quant_scale == tuple(parts["pre_quant_scale"].tolist())
        x = (torch.randn(2, 5, m.in_features, generator=g) * 3).to(torch.bfloat16)
        stored_weight = NVFP4.decoded(
            parts, (m.out_features, m.in_features), x.dtype, options=ComfyOptions("nvfp4")
        )
        want = F.linear(x * parts["pre_quant_scale"].to(x.dtype), stored_weight, m.bias.to(x.dtype))
        assert torch.equal(m(x), want), module


def test_the_options_and_the_format():
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(40, 48, generator=g), torch.randn(10, 48, generator=g) * 4
    p = tuple(2.0 ** int(e) for e in torch.randint(-2, 3, (48,), generator=g))
    options = NVFP4.smoothed(NVFP4.calibrated(ComfyOptions("nvfp4"), 20.0), p)
    parts = NVFP4.encode(w, options)
    assert (
        list(parts)[-1] == "pre_quant_scale" and list(NVFP4.parts((40, 48), options))[-1] == "pre_quant_scale"
    )
    plain = NVFP4.encode(w / torch.tensor(p), NVFP4.calibrated(ComfyOptions("nvfp4"), 20.0))
    for part in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
        assert torch.equal(
            parts[part].reshape(-1).view(torch.uint8), plain[part].reshape(-1).view(torch.uint8)
        ), part
    # decode gives W's basis: the stored W / p times p, exactly
    decoded = NVFP4.decoded(parts, (40, 48), torch.float32, options=options)
    assert torch.equal(decoded, NVFP4.decoded(plain, (40, 48), torch.float32) * torch.tensor(p))
    # read back from the parts, as a loader and verify read them
    dtypes = {"weight": "U8", "weight_scale": "F8_E4M3", "weight_scale_2": "F32", "comfy_quant": "U8",
              "input_scale": "F32", "pre_quant_scale": "F32"}  # fmt: skip
    assert NVFP4.stored_options(dtypes.get, parts.__getitem__) == options
    # the input as ComfyUI quantizes it: x · p with the static scale (comfy-kitchen's quantize), back in x's basis
    from comfy_kitchen.tensor import TensorCoreNVFP4Layout

    q, params = TensorCoreNVFP4Layout.quantize(x * torch.tensor(p), scale=torch.tensor(options.input_scale))
    want = TensorCoreNVFP4Layout.dequantize(q, params)[:10, :48] / torch.tensor(p)
    assert torch.equal(NVFP4.quantized_input(x, options), want)
    # what the options refuse
    with pytest.raises(ValueError, match="a float8_e4m3fn layer has no pre_quant_scale"):
        ComfyOptions("float8_e4m3fn", pre_quant_scale=(1.0,))
    with pytest.raises(ValueError, match="positive finite float32"):
        ComfyOptions("nvfp4", pre_quant_scale=(1.0, math.inf))
    with pytest.raises(UnsupportedShapeError, match="has 48 inputs and a pre_quant_scale of 2 values"):
        NVFP4.parts((40, 48), ComfyOptions("nvfp4", pre_quant_scale=(1.0, 2.0)))
    assert get_format("comfy_fp8").smoothed(ComfyOptions("float8_e4m3fn"), p) is None


def test_a_calibration_file_without_a_layers_input_is_one_line(smoothed, tmp_path):
    src, inputs, _, _ = smoothed
    path = tmp_path / "cal.safetensors"
    save_file({k: v for k, v in load_file(inputs).items() if k != "encoder_hidden_states"}, str(path))
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "-r", RECIPE, "--calibrate", path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{path}: no tensor 'encoder_hidden_states'" in proc.stderr
    assert not out.exists()


def test_inputs_that_never_reach_a_quantized_layer_are_one_line(smoothed, tmp_path, monkeypatch):
    """As if the calibration inputs never reached ``blocks.1.ffn.0`` (a branch they do not take)."""
    from quantize.run import forward

    src, inputs, _, _ = smoothed
    unhooked = forward.StreamedModel.forward

    def skipping(self, x, weights, linear_hooks=None):
        hooks = {k: v for k, v in (linear_hooks or {}).items() if k != "blocks.1.ffn.net.0.proj"}
        return unhooked(self, x, weights, hooks)

    monkeypatch.setattr(forward.StreamedModel, "forward", skipping)
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "-r", RECIPE, "--calibrate", inputs)
    said = [line for line in proc.stderr.splitlines() if not line.startswith("pass: ")]  # after a pass's note
    assert proc.returncode == 2 and len(said) == 1, proc.stderr
    assert "forward never called the quantized Linear 'blocks.1.ffn.net.0.proj'" in said[0]
    assert str(inputs) in said[0] and not out.exists()


def test_the_kernels_operands_are_the_input_times_p_and_the_stored_weight():
    """Blackwell's path (`fast_forward`, held to `emulate`): the input multiplied by ``pre_quant_scale`` in its dtype,
    then NVFP4 with the static scale, against the stored W / p; its product is the forward's Q(x · p) / p · (Q · p)ᵀ."""
    from loaders.modules import ComfyNVFP4Linear

    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(32, 64, generator=g), (torch.randn(6, 64, generator=g) * 2).to(torch.bfloat16)
    p = tuple(2.0 ** int(e) for e in torch.randint(-2, 3, (64,), generator=g))
    options = NVFP4.smoothed(NVFP4.calibrated(ComfyOptions("nvfp4"), 24.0), p)
    m = ComfyNVFP4Linear.from_weight(w, None, options=options)
    a, b = m.kernel_operands(x)
    scale = torch.tensor(options.input_scale)
    smoothed = NVFP4.encode((x * torch.tensor(p).to(x.dtype)).float(), scale=scale)
    assert torch.equal(a, NVFP4.decoded(smoothed, (6, 64), torch.float64))
    plain = NVFP4.encode(w / torch.tensor(p), scale=NVFP4.weight_options([w], options)["scale"])
    assert torch.equal(b, NVFP4.decoded(plain, (32, 64), torch.float64))
    forward = NVFP4.quantized_input(x.float(), options).double() @ m.dequantize(torch.float64).T
    assert torch.allclose(a @ b.T, forward, rtol=1e-12, atol=0)
