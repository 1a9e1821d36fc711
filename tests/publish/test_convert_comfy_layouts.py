"""ComfyUI files in the newer layouts, end to end through the command line: NVFP4 mixed per layer with MXFP8 (one file,
each layer's marker its own), MXFP8, ConvRot int8, `types` keeping layers; streamed in tile-aligned row chunks to the
same bytes; proven by `verify`; run by our loader, each layer in its own layout's module.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantize.formats import ComfyOptions, format_for, get_format
from quantize.models import get_family
from tests.conftest import load_all, read_json, run_cli

native_name = get_family("wan").native_name


def _file(out: Path) -> Path:
    (path,) = out.glob("*.safetensors")
    return path


def _markers(path: Path) -> dict[str, dict]:
    with safe_open(path, "pt") as f:
        return {
            k.removesuffix(".comfy_quant"): json.loads(f.get_tensor(k).numpy().tobytes())
            for k in f.keys()
            if k.endswith(".comfy_quant")
        }


def _layout(marker: dict) -> str:
    return "int8_convrot" if marker.get("convrot") else marker["format"]


@pytest.fixture(scope="module")
def small_wan(tmp_path_factory) -> Path:
    """Wan's small preset (every width a multiple of 256, as ConvRot's groups and NVFP4's tiles want)."""
    from quantize.examples import write_example

    return write_example(tmp_path_factory.mktemp("wan-small") / "src", "small", "t2v")


def _check_layers(out: Path, src: Path, recipe_format: str) -> dict[str, str]:
    """Each marked layer's parts are its layout's encoding of the source weight, bit for bit; returns module ->
    layout."""
    path, source = _file(out), load_all(src)
    stored = load_file(path)
    layouts = {}
    for module, marker in _markers(path).items():
        options = ComfyOptions(_layout(marker))
        fmt = format_for(get_format(recipe_format), options)
        ours = fmt.encode(source[f"{module}.weight"], options)
        for part, value in ours.items():
            got = stored[f"{module}.{part}"]
            assert got.dtype == value.dtype and got.shape == value.shape, part
            assert torch.equal(got.reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), part
        layouts[module] = options.layout
    return layouts


def _verify(out: Path, src: Path) -> dict:
    proc = run_cli("verify", out, "--source", src, "--forward", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_an_nvfp4_file_mixed_with_mxfp8_layers(small_wan, tmp_path):
    out = tmp_path / "out"
    run_cli("convert", small_wan, out, "--recipe", "wan-comfy-nvfp4", check=True)
    layouts = _check_layers(out, small_wan, "comfy_nvfp4")
    mxfp8 = {m for m, layout in layouts.items() if layout == "mxfp8"}
    assert mxfp8 == {m for m in layouts if m.startswith("blocks.0.") or m.endswith(".ffn.2")}
    assert set(layouts.values()) == {"nvfp4", "mxfp8"}
    # the header's `_quantization_metadata` (ComfyUI's QUANTIZATION.md), which ComfyUI's `convert_old_quants`
    # turns into the layers' markers: the very markers the file holds
    with safe_open(_file(out), "pt") as f:
        documented = json.loads(f.metadata()["_quantization_metadata"])
    assert documented == {"format_version": "1.0", "layers": _markers(_file(out))}
    manifest = read_json(out / "quantize_manifest.json")
    types = {k.removeprefix("./").removesuffix(".weight"): t["type"] for k, t in manifest["tensors"].items()}
    assert types == layouts
    assert read_json(out / "config.json")["quantization_config"]["layout"] == "nvfp4"
    report = _verify(out, small_wan)
    checks = {(c["category"], c["check"]): c for c in report["checks"]}
    assert checks[("parity", "requantize")]["passed"] == len(layouts)

    # our loader: every layer in the module of its own layout, the forward as verify's
    import diffusers

    from loaders import MXFP8Linear, NVFP4Linear, load_quantized

    model = load_quantized(diffusers.WanTransformer3DModel, out, dtype=torch.float32, compute="dequantize")
    kinds = {
        native_name(f"{n}.weight").removesuffix(".weight"): type(m)
        for n, m in model.named_modules()
        if isinstance(m, (MXFP8Linear, NVFP4Linear))
    }
    assert {m for m in layouts if kinds[m] is MXFP8Linear} == mxfp8
    assert {m for m in layouts if kinds[m] is NVFP4Linear} == set(layouts) - mxfp8


def test_mxfp8_and_convrot_files_verify_and_load(small_wan, tmp_path):
    import diffusers

    from loaders import Int8Linear, load_quantized

    for recipe, fmt, layout in (
        ("wan-comfy-mxfp8", "comfy_mxfp8", "mxfp8"),
        ("wan-comfy-int8-convrot", "comfy_int8", "int8_convrot"),
    ):
        out = tmp_path / recipe
        run_cli("convert", small_wan, out, "--recipe", recipe, check=True)
        assert set(_check_layers(out, small_wan, fmt).values()) == {layout}
        _verify(out, small_wan)
    # ConvRot's int8 kernel (activations rotated, quantized per row, torch._int_mm) against its decoded reference
    model = load_quantized(
        diffusers.WanTransformer3DModel, tmp_path / "wan-comfy-int8-convrot", compute="kernel"
    )
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert layers and all(m.options == ComfyOptions("int8_convrot", convrot_group=256) for m in layers)
    x = torch.randn(9, layers[0].in_features, generator=torch.Generator().manual_seed(0))
    got, want = layers[0](x), layers[0].reference_forward(x)
    assert float((got - want).pow(2).sum() / want.pow(2).sum()) < 1e-4  # int8 activations: 40+ dB


def test_types_may_keep_layers(small_wan, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "format: comfy_nvfp4\n"
        "targets: ['blocks\\.\\d+\\.ffn\\.(0|2)']\n"
        "types: {'blocks\\.1\\..*': kept, 'blocks\\.\\d+\\.ffn\\.2': int8_tensorwise}\n"
    )
    out = tmp_path / "out"
    run_cli("convert", small_wan, out, "--recipe", recipe, check=True)
    layouts = _check_layers(out, small_wan, "comfy_nvfp4")
    assert not {m for m in layouts if m.startswith("blocks.1.")}
    assert {layouts[m] for m in layouts if m.endswith("ffn.2")} == {"int8_tensorwise"}
    stored, source = load_file(_file(out)), load_all(small_wan)
    assert torch.equal(stored["blocks.1.ffn.0.weight"], source["blocks.1.ffn.0.weight"])  # kept as stored
    _verify(out, small_wan)


@pytest.mark.parametrize(
    "recipe, fmt", [("wan-comfy-nvfp4", "comfy_nvfp4"), ("wan-comfy-mxfp8", "comfy_mxfp8")]
)
def test_streamed_in_tile_aligned_row_chunks_to_the_same_bytes(recipe, fmt, small_wan, tmp_path, monkeypatch):
    """Chunks of 128 rows (one scale tile; the ffn weights are 768 rows): the same file as one chunk a weight."""
    import quantize.encode as chunking
    from quantize import convert

    convert(small_wan, tmp_path / "whole", recipe, workers=1)
    rows: list[int] = []
    formats = {get_format("comfy_nvfp4"), get_format("comfy_mxfp8")}
    for f in formats:
        encode = f.encode
        monkeypatch.setattr(
            f, "encode", lambda w, *a, _e=encode, **kw: rows.append(w.shape[0]) or _e(w, *a, **kw)
        )
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 100 * 256 * 4)  # 100 rows of 256: rounded to a tile
    convert(small_wan, tmp_path / "chunked", recipe, workers=2)
    assert set(rows) == {128}  # every weight here is whole tiles of rows: 256 or 768
    assert _file(tmp_path / "chunked").read_bytes() == _file(tmp_path / "whole").read_bytes()


def test_a_layer_in_a_layout_we_do_not_read_is_refused_naming_it(small_wan, tmp_path):
    import diffusers

    from loaders import load_quantized
    from quantize.errors import InputError

    out = tmp_path / "out"
    run_cli("convert", small_wan, out, "--recipe", "wan-comfy-mxfp8", check=True)
    path = _file(out)
    state = load_file(path)
    marker = b'{"format": "asym_w4a8_int8", "group_size": 32, "convrot_groupsize": 256}'  # ComfyUI reads it, we do not
    state["blocks.1.ffn.0.comfy_quant"] = torch.tensor(list(marker), dtype=torch.uint8)
    save_file(state, path)
    with pytest.raises(InputError, match=re.escape("'blocks.1.ffn.0' is stored as") + ".*group_size 32"):
        load_quantized(diffusers.WanTransformer3DModel, out)
