"""`convert --calibrate INPUTS`: static input scales (ComfyUI's ``input_scale``) for the FP8 and NVFP4 layers of a ComfyUI
file, from the amax of each layer's input in a streamed forward pass of the source; recorded in the manifest, proven
by `verify`, used by the loader's kernel; refused in one line where no layer of the recipe has one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantize.formats import ComfyOptions, get_format
from quantize.models import get_family
from tests.conftest import read_json, run_cli, skip_without_kernel

wan = get_family("wan")

#: every Linear of the blocks; NVFP4 but for one FP8 attention, the MXFP8 down projections and one int8 layer
RECIPE = """\
format: comfy_nvfp4
components: [transformer]
targets: ['blocks\\.\\d+\\.(attn[12]\\.(to_q|to_k|to_v|to_out\\.0)|ffn\\.net\\.(0\\.proj|2))']
types:
  'blocks\\.0\\.attn1\\..*': float8_e4m3fn
  'blocks\\.\\d+\\.ffn\\.net\\.2': mxfp8
  'blocks\\.1\\.attn2\\.to_q': int8_tensorwise
"""
SCALED = ("float8_e4m3fn", "nvfp4")
RANGE = {"float8_e4m3fn": 448.0, "nvfp4": 448.0 * 6}


def _inputs(path: Path, seed: int, timesteps: list[int]) -> Path:
    """A pass's inputs for `wan_of_width(width=64)`, one sample per timestep, stored in bf16 as a pipeline has them."""
    g = torch.Generator().manual_seed(seed)
    n = len(timesteps)
    save_file(
        {
            "hidden_states": torch.randn(n, 4, 2, 8, 8, generator=g).to(torch.bfloat16),
            "timestep": torch.tensor(timesteps),
            "encoder_hidden_states": torch.randn(n, 8, 64, generator=g).to(torch.bfloat16),
        },
        str(path),
    )
    return path


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> tuple[Path, Path, Path, Path, str]:
    """(source, calibration inputs, recipe, checkpoint converted with --calibrate, convert's stdout)."""
    from tests.diffusers_models import wan_of_width

    root = tmp_path_factory.mktemp("calibrate")
    src = root / "Wan-Diffusers"
    wan_of_width(src / "transformer", width=64)
    inputs = _inputs(root / "cal.safetensors", 1, [900, 100])
    recipe = root / "mixed.yaml"
    recipe.write_text(RECIPE)
    out = root / "out"
    proc = run_cli("convert", src, out, "-r", recipe, "--calibrate", inputs, check=True)
    return src, inputs, recipe, out, proc.stdout


def _file(out: Path) -> Path:
    (path,) = out.glob("*/*.safetensors")
    return path


def _markers(path: Path) -> dict[str, str]:
    with safe_open(path, "pt") as f:
        return {
            k.removesuffix(".comfy_quant"): json.loads(f.get_tensor(k).numpy().tobytes())["format"]
            for k in f.keys()
            if k.endswith(".comfy_quant")
        }


def _plain_amax(src: Path, inputs: Path) -> dict[str, torch.Tensor]:
    """An ordinary forward of the diffusers model (float32) on the inputs: each Linear's input amax per input
    channel (float32 [in]: a smoothed layer's amax is that of x · pre_quant_scale), by its native module name, from
    torch forward hooks."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(src / "transformer", torch_dtype=torch.float32).eval()
    seen: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args):
            a = args[0].reshape(-1, args[0].shape[-1]).abs().amax(0)
            seen[name] = a if name not in seen else torch.maximum(seen[name], a)

        return record

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(hook(wan.native_name(f"{name}.weight").removesuffix(".weight")))
    x = {k: v.float() if v.is_floating_point() else v for k, v in load_file(inputs).items()}
    with torch.no_grad():
        model(**x, return_dict=False)
    return seen


def test_each_fp8_and_nvfp4_layer_stores_its_inputs_amax_over_the_range(calibrated):
    src, inputs, _, out, stdout = calibrated
    path = _file(out)
    markers = _markers(path)
    assert set(markers.values()) == {"float8_e4m3fn", "nvfp4", "mxfp8", "int8_tensorwise"}
    stored = load_file(path)
    amax = _plain_amax(src, inputs)
    manifest = read_json(out / "quantize_manifest.json")
    recorded = manifest["calibration"]["tensors"]
    scaled = {m for m, layout in markers.items() if layout in SCALED}
    assert {k.removeprefix("transformer/").removesuffix(".weight") for k in recorded} == scaled
    for module, layout in markers.items():
        key = f"{module}.input_scale"
        if layout not in SCALED:  # ComfyUI quantizes no input of these with a static scale
            assert key not in stored
            continue
        scale = stored[key]
        # the NVFP4 layers `calibrate` smoothed (test_smoothing.py)
        smoothing = stored.get(f"{module}.pre_quant_scale")
        top = (amax[module] if smoothing is None else amax[module] * smoothing).amax()
        want = top / RANGE[layout]
        assert scale.dtype == torch.float32 and scale.shape == () and torch.equal(scale, want), module
        entry = recorded[f"transformer/{module}.weight"]
        assert ("smoothing" in entry) == (smoothing is not None)
        entry.pop("smoothing", None)
        assert entry == {"input_amax": float(top), "input_scale": float(want)}
    # the manifest records the inputs and the figures; convert prints them
    cal = manifest["calibration"]
    smoothed = any(k.endswith(".pre_quant_scale") for k in stored)  # some NVFP4 layers smoothed: version 4
    assert manifest["schema_version"] == (4 if smoothed else 3) and cal["statistic"] == "amax"
    assert cal["inputs"] == {
        "file": "cal.safetensors",
        "size": inputs.stat().st_size,
        "sha256": hashlib.sha256(inputs.read_bytes()).hexdigest(),
    }
    figures = cal["forward"]["transformer"]
    assert set(figures) == {"dynamic_sqnr_db", "static_sqnr_db"} and all(v > 10 for v in figures.values())
    assert f"input scales: {len(scaled)} layers, from the amax of their inputs on cal.safetensors" in stdout
    assert (
        f"inputs quantized: static scales {figures['static_sqnr_db']:.2f} dB, dynamic "
        f"{figures['dynamic_sqnr_db']:.2f} dB" in stdout
    )
    assert "## Static input scales" in (out / "README.md").read_text()
    assert f"input scales: {len(scaled)} layers" in run_cli("inspect", out, check=True).stdout


def test_verify_rederives_the_scales_and_catches_a_changed_one(calibrated, tmp_path):
    from tests.helpers.verify import failures, rehash, rewrite, verify_json

    src, inputs, _, out, _ = calibrated
    code, report, _ = verify_json(out, "--source", src, "--forward", "--inputs", inputs)
    assert code == 0 and report["ok"], failures(report)
    quantized = report["forward"]["transformer"]["inputs_quantized"]
    recorded = read_json(out / "quantize_manifest.json")["calibration"]["forward"]["transformer"]
    assert quantized == recorded  # the same passes as convert's, on the same inputs: the same figures
    # one input_scale a bit off: its requantize check fails, naming it
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    path = _file(bad)
    module = next(m for m, layout in _markers(path).items() if layout == "nvfp4")

    def nudge(tensors: dict) -> None:
        tensors[f"{module}.input_scale"] = (tensors[f"{module}.input_scale"].view(torch.int32) + 1).view(
            torch.float32
        )

    rewrite(path, nudge)
    rehash(bad, path)
    code, report, _ = verify_json(bad, "--source", src)
    assert code == 1 and list(failures(report)) == ["requantize"]
    (failure,) = failures(report)["requantize"]
    assert failure.endswith(
        f"{wan.diffusers_name(module + '.weight')}: requantizing the source does not reproduce the stored bytes"
    )
    # a manifest whose recorded amax does not make its recorded scale
    manifest = read_json(out / "quantize_manifest.json")
    key = f"transformer/{module}.weight"
    manifest["calibration"]["tensors"][key]["input_amax"] *= 2
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    (edited / "quantize_manifest.json").write_text(json.dumps(manifest, indent=2))
    code, report, _ = verify_json(edited)
    assert code == 1 and any(
        f"tensor {key!r}: the calibration records the input scale" in f for f in failures(report)["manifest"]
    )


def test_the_loader_quantizes_each_fp8_input_with_the_stored_scale(calibrated):
    """comfy-kitchen's `TensorCoreFP8Layout` quantize of the input with that scale, then its scaled matmul: bit for bit
    (compute="kernel": on the CPU too); an input beyond the calibrated amax is clamped, as ComfyUI clamps it."""
    from comfy_kitchen.tensor import QuantizedTensor, TensorCoreFP8Layout
    from diffusers import WanTransformer3DModel

    from loaders import load_quantized
    from loaders.modules import ComfyFP8Linear

    _, _, _, out, _ = calibrated
    model = load_quantized(WanTransformer3DModel, out / "transformer", compute="kernel")
    fp8 = {n: m for n, m in model.named_modules() if isinstance(m, ComfyFP8Linear)}
    recorded = read_json(out / "quantize_manifest.json")["calibration"]["tensors"]
    assert fp8
    for name, m in fp8.items():
        native = wan.native_name(f"{name}.weight")
        scale = m.stored()["input_scale"]
        assert m.options == ComfyOptions("float8_e4m3fn", recorded[f"transformer/{native}"]["input_scale"])
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(2, 7, m.in_features, generator=g) * 0.2 * scale * 448).to(torch.bfloat16)
        x[0, 0, 0] = 4 * scale * 448  # beyond the calibrated amax
        skip_without_kernel(m, x)
        assert m.uses_fast_path(x)
        parts = m.stored()
        weight = QuantizedTensor(
            parts["weight"],
            "TensorCoreFP8Layout",
            TensorCoreFP8Layout.Params(
                scale=parts["weight_scale"], orig_dtype=x.dtype, orig_shape=tuple(parts["weight"].shape)
            ),
        )
        x2d = x.reshape(-1, x.shape[-1])
        want = F.linear(
            QuantizedTensor.from_float(x2d, "TensorCoreFP8Layout", scale=scale), weight, m.bias.to(x.dtype)
        )
        got = m(x)
        assert torch.equal(got.reshape(-1, m.out_features), want), name
        dynamic = F.linear(QuantizedTensor.from_float(x2d, "TensorCoreFP8Layout"), weight, m.bias.to(x.dtype))
        assert not torch.equal(want, dynamic)  # the stored scale, not the call's


def test_the_fp8_kernel_with_a_static_scale_is_comfy_kitchens(tmp_path):
    """`from_weight` with the options of a static scale: the part and its use, on a layer of its own."""
    from comfy_kitchen.tensor import QuantizedTensor, TensorCoreFP8Layout

    from loaders.modules import ComfyFP8Linear

    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g).to(torch.bfloat16)
    options = get_format("comfy_fp8").calibrated(ComfyOptions("float8_e4m3fn"), 2.5)
    m = ComfyFP8Linear.from_weight(w, b, options=options, compute="kernel")
    assert set(m.state_dict()) == {"weight", "weight_scale", "comfy_quant", "input_scale", "bias"}
    scale = m.state_dict()["input_scale"]
    assert torch.equal(scale, torch.tensor(2.5) / 448)
    x = (torch.randn(3, 5, 64, generator=g) * 2).to(torch.bfloat16)
    skip_without_kernel(m, x)
    weight = QuantizedTensor(
        m.stored()["weight"],
        "TensorCoreFP8Layout",
        TensorCoreFP8Layout.Params(scale=m.stored()["weight_scale"], orig_dtype=x.dtype, orig_shape=(48, 64)),
    )
    want = F.linear(
        QuantizedTensor.from_float(x.reshape(-1, 64), "TensorCoreFP8Layout", scale=scale), weight, b
    )
    assert torch.equal(m(x).reshape(-1, 48), want)
    assert torch.equal(
        ComfyFP8Linear.from_weight(w, b, options=options)(x), F.linear(x, m.dequantize(x.dtype), b)
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("no such file", "does not exist"),
        ("not safetensors", "cannot read the inputs as safetensors"),
        ("another model's inputs", "tensor 'latents' is not an input of this model"),
        ("comfy_int8", "comfy_int8 stores no static input scale for any layer of this recipe"),
        ("fp8_channel", "fp8_channel stores no static input scale for any layer of this recipe"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(calibrated, tmp_path, case, message):
    src, inputs, recipe, _, _ = calibrated
    path = tmp_path / "inputs.safetensors"
    if case == "not safetensors":
        path.write_bytes(b"\x00" * 64)
    elif case == "another model's inputs":
        save_file({**load_file(inputs), "latents": torch.zeros(1)}, str(path))
    elif case in ("comfy_int8", "fp8_channel"):
        shutil.copy(inputs, path)
        recipe = {"comfy_int8": "wan-diffusers-comfy-int8", "fp8_channel": "wan-diffusers-fp8"}[case]
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "-r", recipe, "--calibrate", path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    if case in ("comfy_int8", "fp8_channel"):
        assert "drop --calibrate or pick such a recipe" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["inputs.safetensors"] if case != "no such file" else []
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_fp8_kernel_with_a_static_scale_on_cuda_keeps_to_its_emulation(dtype):
    """The stored scale moves with the module, `_scaled_mm` takes it on the GPU, and the product is the
    activations quantized with that scale times the weight (loaders/emulation.py's bound): the static scale, not
    the call's dynamic one."""
    from loaders.modules import ComfyFP8Linear

    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(64, 96 + 32, generator=g), torch.randn(64, generator=g).to(dtype)
    options = get_format("comfy_fp8").calibrated(ComfyOptions("float8_e4m3fn"), 3.0)
    m = ComfyFP8Linear.from_weight(w, b, options=options, compute="kernel").to("cuda")
    x = (torch.randn(2, 24, 128, generator=g) * 2).to(dtype).cuda()
    assert m.uses_fast_path(x) and m.stored()["input_scale"].is_cuda
    emulation = m.emulate(x)
    emulation.check(m(x).cpu(), "ComfyFP8Linear with input_scale on cuda")
    dynamic = ComfyFP8Linear.from_weight(w, b, compute="kernel").to("cuda")
    assert emulation.excess(dynamic(x).cpu()) > 1  # the call's own scale computes something else


@pytest.mark.parametrize(
    "name, layout, kitchen",
    [
        ("comfy_fp8", "float8_e4m3fn", "TensorCoreFP8Layout"),
        ("comfy_nvfp4", "nvfp4", "TensorCoreNVFP4Layout"),
    ],
)
def test_the_forwards_quantized_inputs_are_comfy_kitchens(name, layout, kitchen):
    """What `convert --calibrate` measures with: a Linear's float32 input through comfy-kitchen's layout with the static
    scale (``quantize(x, scale=...)``: an input beyond it clamped) or without (dynamic), dequantized, bit for bit."""
    import comfy_kitchen.tensor as ck

    fmt = get_format(name)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 64, generator=g) * 3
    options = fmt.calibrated(ComfyOptions(layout), 5.0)  # below the input's amax: some of it clamps
    cls = getattr(ck, kitchen)
    for static, scale in ((True, torch.tensor(options.input_scale)), (False, None)):
        q, params = cls.quantize(x, **({} if scale is None else {"scale": scale}))
        want = cls.dequantize(q, params)
        got = fmt.quantized_input(x, options, static)
        assert torch.equal(got, want[:40, :64]), static
    assert get_format("comfy_mxfp8").quantized_input(x, ComfyOptions("mxfp8")) is None
