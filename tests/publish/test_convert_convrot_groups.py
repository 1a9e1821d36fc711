"""ConvRot's group per layer, end to end through the command line, on a diffusers Wan of width 96 (no multiple of
256: attention and ffn.0 take 96 inputs, ffn.2 192): each layer gets the largest group that divides its width (96:
16, 192: 64), its marker says so, `verify` re-quantizes it to the stored bytes and our loader reads the group back;
W4A4 (which also needs whole int4 groups of 64) keeps the 96-wide layers its recipe targets, and `quantize plan`
says why; a recipe whose `types` names W4A4 for such a layer is refused in one line, nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from quantize.formats import ComfyOptions, format_for, get_format
from quantize.models import get_family
from tests import diffusers_models as models
from tests.conftest import load_all, run_cli

native_name = get_family("wan").native_name
TARGETS = "targets: ['blocks\\.\\d+\\.attn1\\.to_q', 'blocks\\.\\d+\\.ffn\\.net\\.(0\\.proj|2)']\n"
#: what each targeted layer's input width fits: ConvRot's largest group (int8), W4A4's (also a multiple of 64)
INT8_GROUPS = {"self_attn.q": 16, "ffn.0": 16, "ffn.2": 64}
W4A4_GROUPS = {"ffn.2": 64}
W4A4_KEPT = (
    "has 96 inputs: convrot_w4a4 needs in_features a multiple of 64 and of a ConvRot group (256, 64, 16, 4)"
)


@pytest.fixture(scope="module")
def wan96(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wan96") / "src"
    models.wan_of_width(root / "transformer", width=96)
    return root


def _recipe(where: Path, text: str) -> Path:
    path = where / "recipe.yaml"
    path.write_text(text)
    return path


def _markers(out: Path) -> dict[str, dict]:
    (path,) = (out / "transformer").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        return {
            k.removesuffix(".comfy_quant"): json.loads(f.get_tensor(k).numpy().tobytes())
            for k in f.keys()
            if k.endswith(".comfy_quant")
        }


def _groups(markers: dict[str, dict]) -> dict[str, tuple[str, int]]:
    """block-less module name -> (marker format, group), the same in both blocks."""
    seen = {}
    for module, marker in markers.items():
        layer = module.split(".", 2)[2]
        got = (marker["format"], marker["convrot_groupsize"])
        assert seen.setdefault(layer, got) == got, module
    return seen


def _stored_is_our_encoding(out: Path, src: Path, markers: dict[str, dict]) -> None:
    """Each marked layer's parts are our encoding of the source weight in its fitted group, bit for bit."""
    (path,) = (out / "transformer").glob("*.safetensors")
    stored, source = load_file(path), {native_name(k): v for k, v in load_all(src / "transformer").items()}
    for module, marker in markers.items():
        layout = "int8_convrot" if marker.get("convrot") else marker["format"]
        options = ComfyOptions(layout, convrot_group=marker["convrot_groupsize"])
        fmt = format_for(get_format("comfy_int8"), options)
        for part, value in fmt.encode(source[f"{module}.weight"], options).items():
            assert torch.equal(stored[f"{module}.{part}"].view(torch.uint8), value.view(torch.uint8)), part


def _verify(out: Path, src: Path) -> dict:
    proc = run_cli("verify", out, "--source", src, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {(c["category"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    return checks[("parity", "requantize")]


def test_int8_convrot_takes_each_layers_largest_group_and_a_w4a4_layer_mixes_in(wan96, tmp_path):
    """comfy_int8 ConvRot with ffn.2 named W4A4 (`types`): one file, each marker its layer's group, verified by
    re-quantizing, loaded into the modules of each layer's layout with the group its marker gives."""
    import diffusers

    from loaders import ComfyW4a4Linear, Int8Linear, load_quantized

    recipe = _recipe(
        tmp_path,
        f"format: comfy_int8\ntype: int8_convrot\ncomponents: [transformer]\n{TARGETS}"
        "types: {'blocks\\.\\d+\\.ffn\\.net\\.2': convrot_w4a4}\n",
    )
    out = tmp_path / "out"
    run_cli("convert", wan96, out, "--recipe", recipe, check=True)
    markers = _markers(out)
    assert len(markers) == 6
    assert _groups(markers) == {
        "self_attn.q": ("int8_tensorwise", 16),
        "ffn.0": ("int8_tensorwise", 16),
        "ffn.2": ("convrot_w4a4", 64),
    }
    _stored_is_our_encoding(out, wan96, markers)
    assert _verify(out, wan96)["passed"] == 6

    model = load_quantized(diffusers.WanTransformer3DModel, out / "transformer", compute="kernel")
    layers = {
        native_name(f"{n}.weight").removesuffix(".weight").split(".", 2)[2]: m
        for n, m in model.named_modules()
        if isinstance(m, (Int8Linear, ComfyW4a4Linear))
    }
    assert {k: (type(m), m.options.group) for k, m in layers.items()} == {
        "self_attn.q": (Int8Linear, 16),
        "ffn.0": (Int8Linear, 16),
        "ffn.2": (ComfyW4a4Linear, 64),
    }
    # the int8 kernel rotates each call's input in the layer's own group: against its decoded reference
    q = layers["self_attn.q"]
    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(0))
    got, want = q(x), q.reference_forward(x)
    assert float((got - want).pow(2).sum() / want.pow(2).sum()) < 1e-4


def test_w4a4_keeps_the_layers_no_group_fits_and_plan_says_why(wan96, tmp_path):
    recipe = _recipe(tmp_path, f"format: comfy_w4a4\ncomponents: [transformer]\n{TARGETS}")
    plan = run_cli("plan", wan96, "--recipe", recipe, check=True).stdout
    for kept in (
        "attn1.to_q.weight -> blocks.*.self_attn.q.weight",
        "ffn.net.0.proj.weight -> blocks.*.ffn.0.weight",
    ):
        assert f"kept in transformer: blocks.*.{kept}: {W4A4_KEPT}" in plan, plan
    assert plan.count("kept in transformer:") == 2

    out = tmp_path / "out"
    run_cli("convert", wan96, out, "--recipe", recipe, check=True)
    markers = _markers(out)
    assert {k: v[1] for k, v in _groups(markers).items()} == W4A4_GROUPS
    _stored_is_our_encoding(out, wan96, markers)
    stored = load_file(next((out / "transformer").glob("*.safetensors")))
    source = load_all(wan96 / "transformer")
    assert torch.equal(
        stored["blocks.0.self_attn.q.weight"], source["blocks.0.attn1.to_q.weight"]
    )  # as stored
    assert _verify(out, wan96)["passed"] == 2


@pytest.mark.parametrize(
    "fmt, type_line",
    [("comfy_w4a4", ""), ("comfy_int8", "type: int8_convrot\n")],
    ids=["w4a4-recipe", "int8-recipe"],
)
def test_types_naming_w4a4_for_a_layer_no_group_fits_is_one_line_exit_2_nothing_written(
    wan96, tmp_path, fmt, type_line
):
    recipe = _recipe(
        tmp_path,
        f"format: {fmt}\n{type_line}components: [transformer]\n{TARGETS}"
        "types: {'blocks\\.0\\.attn1\\.to_q': convrot_w4a4}\n",
    )
    out = tmp_path / "out"
    proc = run_cli("convert", wan96, out, "--recipe", recipe)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert (
        "'blocks.0.attn1.to_q.weight'" in line
        and W4A4_KEPT in line
        and "add it to the recipe's ignore" in line
    )
    assert not out.exists()
