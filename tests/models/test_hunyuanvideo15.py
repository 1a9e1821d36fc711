"""HunyuanVideo 1.5: its three namings (diffusers', ComfyUI's native names with q/k/v fused, the release's with them
apart), its two layouts (one ``transformer/<variant>/`` of the release, diffusers' ``transformer/``), its recipes
and the formats through the command line, on the tiny example.

Oracles: diffusers' own converters. The installed package maps HunyuanVideo 1 only
(``single_file_utils.convert_hunyuan_video_transformer_to_diffusers``), whose names 1.5 keeps for the double
blocks, the text refiner, the patch embedding and the final layer (fused q/k/v and the final adaLN's swapped halves
included); the names 1.5 adds (``time_in``, ``byt5_in``, ``vision_in``, ``cond_type_embedding``) and the release's
separate q/k/v are spelled from diffusers' ``scripts/convert_hunyuan_video1_5_to_diffusers.py``, which is not
installed, in tests/oracles/diffusers_scripts.py. ComfyUI's detection (``comfy/model_detection.py``'s 'Hunyuan
Video' branch and ``supported_models.HunyuanVideo15``) and the state dict its ``HunyuanVideo`` module builds
(``comfy/ldm/hunyuan_video/model.py``, Flux's double blocks) are spelled in tests/oracles/comfyui_hunyuanvideo15.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.formats import FORMAT_INFO
from quantize.models import family_of, get_family, name_table
from quantize.models.examples import examples_of
from quantize.plan import make_plan
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import load_all, run_cli
from tests.oracles.comfyui_hunyuanvideo15 import comfyui_detects, comfyui_names, comfyui_process
from tests.oracles.diffusers_scripts import HV15_SCRIPT_QKV, hv15_to_diffusers

HV = get_family("hunyuanvideo15")
FORMATS = [
    "fp8_channel",
    "torchao_fp8",
    "torchao_int8",
    "nf4",
    "comfy_fp8",
    "comfy_int8",
    "comfy_nvfp4",
    "comfy_mxfp8",
    "gguf",
]
LAYOUTS = {"release": "hunyuanvideo15", "diffusers": "hunyuanvideo15-diffusers"}

# -- fixtures -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The tiny example in both layouts, as `quantize example` writes them."""
    root = tmp_path_factory.mktemp("hv15")
    for layout in LAYOUTS:
        run_cli(
            "example", root / layout, "--family", HV.name, "--preset", "tiny", "--layout", layout, check=True
        )
    return dict(root=root, **{layout: root / layout for layout in LAYOUTS})


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    """converted(layout, fmt) -> the output root of `quantize convert --format fmt`, made once each."""
    made: dict[tuple[str, str], Path] = {}

    def get(layout: str, fmt: str) -> Path:
        if (layout, fmt) not in made:
            out = tmp_path_factory.mktemp(f"hv15-{layout}-{fmt}") / "out"
            run_cli("convert", sources[layout], out, "--format", fmt, "--workers", "2", check=True)
            made[layout, fmt] = out
        return made[layout, fmt]

    return get


def _component(out: Path, layout: str) -> Path:
    return out / "transformer" if layout == "diffusers" else out


def _native_of(diffusers_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A diffusers state dict under our native name table: renamed, and the stacked tensors stacked by row."""
    table = name_table(HV, "native", FORMAT_INFO["comfy_fp8"])
    stacks = table.stacker(list(diffusers_state), "here")
    stacked = {n for stack in stacks.values() for n, _, _ in stack}
    rename = table.renamer(list(diffusers_state), "here")
    native = {rename(k): v for k, v in diffusers_state.items() if k not in stacked}
    for out, stack in stacks.items():
        native[out] = torch.cat([diffusers_state[n].chunk(parts)[part] for n, part, parts in stack])
    return native


# -- the name tables ------------------------------------------------------------------------------------------


def test_native_names_round_trip_through_diffusers_own_converters(sources):
    """diffusers' state -> our native names (q/k/v stacked, the final adaLN's halves swapped) -> diffusers' own
    conversion back: every tensor where it was, bit for bit."""
    state = load_all(sources["diffusers"] / "transformer")
    native = _native_of(state)
    back = hv15_to_diffusers(dict(native))
    assert set(back) == set(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    assert native["double_blocks.0.img_attn_qkv.weight"].shape == (3 * 128, 128)
    # and read back through the same table (what the loader and a forward pass cut a native file into)
    assert {HV.diffusers_name(k) for k in native} - {None} | {
        n for k in native if (s := HV.names.native_stack(k)) for n, _, _ in s
    } == set(state)


def test_the_release_names_are_the_native_ones_with_q_k_v_apart_as_diffusers_script_maps_them(sources):
    release = load_all(sources["release"])
    state = load_all(sources["diffusers"] / "transformer")
    for name in release:
        m = re.fullmatch(r"double_blocks\.(\d+)\.((?:img|txt)_attn_[qkv])\.(weight|bias)", name)
        if m:
            assert HV.diffusers_name(name) == f"transformer_blocks.{m[1]}.{HV15_SCRIPT_QKV[m[2]]}.{m[3]}"
    # the release converted to native names stacks q, k, v; the rest keeps its name
    stacks = name_table(HV, "native", FORMAT_INFO["comfy_fp8"]).stacker(list(release), "here")
    assert set(stacks) == {f"double_blocks.{i}.{s}_attn_qkv.{p}" for i in range(2) for s in ("img", "txt")
                           for p in ("weight", "bias")}  # fmt: skip
    native = {k: v for k, v in release.items() if not any(k in (n for n, _, _ in s) for s in stacks.values())}
    native |= {out: torch.cat([release[n] for n, _, _ in s]) for out, s in stacks.items()}
    assert {k: v.shape for k, v in native.items()} == {k: v.shape for k, v in _native_of(state).items()}
    back = hv15_to_diffusers(native)
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}


def test_native_files_are_what_comfyui_detects_as_hunyuanvideo15_and_builds(sources):
    shapes = {
        k: tuple(v.shape) for k, v in _native_of(load_all(sources["diffusers"] / "transformer")).items()
    }
    assert comfyui_detects(shapes) == {
        "in_channels": 65, "patch_size": [1, 1, 1], "out_channels": 32, "hidden_size": 128, "num_heads": 1,
        "depth": 2, "depth_single_blocks": 0, "context_in_dim": 3584, "byt5": True, "meanflow": False,
        "use_cond_type_embedding": True, "vision_in_dim": 1152, "model": "HunyuanVideo15",
    }  # fmt: skip
    assert {comfyui_process(k) for k in shapes} == comfyui_names(2)


def test_comfyuis_names_with_q_k_v_fused_are_native_names_too(sources):
    """The release stores q, k and v apart; ComfyUI's names (our native output) fuse them: both are the native
    naming (the family contract holds the release's and diffusers' examples to the rest of detection)."""
    native = _native_of(load_all(sources["diffusers"] / "transformer"))
    assert HV.naming(native) == "native" and family_of(None, native) is HV


@pytest.mark.parametrize("preset", ["tiny", "small", "8.3b"])
def test_examples_have_the_dimensions_comfyui_fixes(preset):
    (model,) = examples_of(HV).models(preset, "release")
    state = dict(model.tensors)
    found = comfyui_detects(state)
    assert found["model"] == "HunyuanVideo15" and found["hidden_size"] == 128 * found["num_heads"]
    assert found["context_in_dim"] == 3584 and state["byt5_in.fc1.weight"] == (2048, 1472)
    assert state["double_blocks.0.img_attn_q_norm.weight"] == (128,)  # 16 + 56 + 56
    assert model.config["_class_name"] == "HunyuanVideo_1_5_DiffusionTransformer" and model.component == "."
    if preset == "8.3b":
        assert (found["hidden_size"], found["depth"]) == (2048, 54)
        assert 8.2e9 < sum(torch.Size(s).numel() for s in state.values()) < 8.4e9


# -- the bundled recipes ---------------------------------------------------------------------------------------


def _quantized_rule(layout: str, fmt: str) -> re.Pattern:
    down = fmt in (
        "nf4",
        "comfy_nvfp4",
        "comfy_mxfp8",
        "gguf",
    )  # the 8-bit ones keep the FFN down projections
    if layout == "release":
        return re.compile(
            rf"double_blocks\.\d+\.(img|txt)_(attn_(q|k|v|proj)|mlp\.fc{'[12]' if down else '1'})"
        )
    ffn = r"net\.(0\.proj|2)" if down else r"net\.0\.proj"
    return re.compile(
        rf"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
        rf"|(ff|ff_context)\.{ffn})"
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_bundled_recipe_quantizes_the_double_blocks_and_keeps_embeddings_modulation_and_final_layer(
    sources, layout, fmt
):
    (cp,) = make_plan(sources[layout], load_recipe(default_recipes()[LAYOUTS[layout]][fmt]).recipe).components
    linears = {k.removesuffix(".weight") for k, t in cp.component.tensors.items() if k.endswith(".weight")
               and len(t.shape) == 2 and not HV.plain_weight(k)}  # fmt: skip
    rule = _quantized_rule(layout, fmt)
    quantized = {m for t in cp.tensors if t.quantize for m in t.source_modules}
    assert quantized == {m for m in linears if rule.fullmatch(m)}
    kept = linears - quantized
    in_blocks = {m for m in kept if m.startswith(("transformer_blocks.", "double_blocks."))}
    modulation_or_down = re.compile(
        r"(transformer|double)_blocks\.\d+\.(img_mod\.linear|txt_mod\.linear|norm1\.linear|norm1_context\.linear"
        r"|(img|txt)_mlp\.fc2|(ff|ff_context)\.net\.2)"
    )
    assert in_blocks and all(modulation_or_down.fullmatch(m) for m in in_blocks)
    outside = {m.split(".")[0] for m in kept - in_blocks}
    assert outside == (
        {"time_in", "txt_in", "byt5_in", "vision_in", "final_layer"}
        if layout == "release"
        else {
            "time_embed",
            "context_embedder",
            "context_embedder_2",
            "image_embedder",
            "norm_out",
            "proj_out",
        }
    )
    if fmt == "comfy_nvfp4":  # MXFP8 for the first double block and every FFN down projection
        for t in cp.tensors:
            if t.quantize:
                down = any(re.search(r"(fc2|net\.2)$", m) or re.match(r"(transformer|double)_blocks\.0\.", m)
                           for m in t.source_modules)  # fmt: skip
                assert t.options.type_name == ("mxfp8" if down else "nvfp4"), t.source_modules


# -- every format, through the command line ----------------------------------------------------------------------

#: what runs through verify --forward (every diffusers-side format of the diffusers layout, a ComfyUI file and
#: the GGUF of each layout)
FORWARD = [
    ("diffusers", f) for f in ("fp8_channel", "torchao_fp8", "torchao_int8", "nf4", "comfy_nvfp4", "gguf")
]
FORWARD += [("release", f) for f in ("comfy_int8", "gguf")]  # its diffusers-side formats: below
#: the formats that keep the source's names: a release converted to one keeps q, k and v apart (its third naming)
DIFFUSERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]


@pytest.mark.parametrize(("layout", "fmt"), FORWARD)
def test_outputs_verify_with_a_forward_through_diffusers_class(sources, converted, layout, fmt):
    out = converted(layout, fmt)
    proc = run_cli("verify", out, "--source", sources[layout], "--forward", "--json", check=True)
    (sqnr,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    assert sqnr > 20


@pytest.mark.parametrize("fmt", ["fp8_channel", "torchao_int8", "nf4", "comfy_nvfp4", "gguf"])
def test_our_loader_runs_the_diffusers_layouts_outputs(sources, converted, fmt):
    import diffusers

    from loaders import QuantizedLinear, load_quantized

    model = load_quantized(
        diffusers.HunyuanVideo15Transformer3DModel, _component(converted("diffusers", fmt), "diffusers")
    )
    assert any(isinstance(m, QuantizedLinear) for m in model.modules())
    x = load_inputs(None, HV, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        y = model(**HV.inputs.call(model.config, x))[0]
    assert y.shape == (1, 32, 2, 4, 4) and torch.isfinite(y).all()


@pytest.fixture(scope="module")
def reference(sources):
    """The release's bf16 weights in float32 as diffusers' class, through diffusers' own conversion (its q, k, v
    stacked as the native names have them, then `hv15_to_diffusers`), and its output on the family's inputs."""
    import diffusers

    from quantize.read.checkpoint import open_component

    release = load_all(sources["release"])
    qkv = re.compile(r"(double_blocks\.\d+\.(?:img|txt)_attn_)([qkv])\.(weight|bias)")
    native = {k: v for k, v in release.items() if not qkv.fullmatch(k)}
    for k in release:
        if (m := qkv.fullmatch(k)) and m[2] == "q":
            native[f"{m[1]}qkv.{m[3]}"] = torch.cat([release[f"{m[1]}{x}.{m[3]}"] for x in "qkv"])
    comp = open_component(sources["release"], ".")
    config = HV.diffusers_config(comp.config, comp.tensors, comp.dir)
    model = diffusers.HunyuanVideo15Transformer3DModel.from_config(config).eval()
    model.load_state_dict({k: v.float() for k, v in hv15_to_diffusers(native).items()}, strict=True)
    x = load_inputs(None, HV, model.config)
    with torch.no_grad():
        want = model(**HV.inputs.call(model.config, x))[0]
    return model, x, want


@pytest.mark.parametrize("fmt", DIFFUSERS_SIDE)
def test_our_loader_runs_the_release_in_a_diffusers_side_format_and_computes_what_verify_forward_reports(
    sources, converted, reference, fmt
):
    """The release converted to a format of source names keeps its q, k, v apart: our loader puts each into its
    diffusers Linear (the fused refiner q/k/v and final modulation cut by rows), and its forward, every quantized
    layer decoded in float32, is the figure `verify --forward` reports against the release's."""
    import diffusers

    from loaders import QuantizedLinear, load_quantized

    out = converted("release", fmt)
    config = json.loads((out / "config.json").read_text())  # the release's, as for every source-named format
    assert (
        config["_class_name"] == "HunyuanVideo_1_5_DiffusionTransformer" and "quantization_config" in config
    )
    stored = {k.split(".")[2] for k in load_all(out) if k.startswith("double_blocks.0.img_attn_")}
    assert "img_attn_q" in stored and "img_attn_qkv" not in stored  # the release's names, q, k, v apart
    proc = run_cli("verify", out, "--source", sources["release"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    model, x, want = reference
    with torch.no_grad():
        loaded = load_quantized(
            diffusers.HunyuanVideo15Transformer3DModel, out, dtype=torch.float32, compute="dequantize"
        )
        got = loaded(**HV.inputs.call(model.config, x))[0]
    block = loaded.transformer_blocks[1]
    assert all(isinstance(getattr(block.attn, m), QuantizedLinear) for m in ("to_q", "to_k", "add_v_proj"))
    assert not isinstance(loaded.norm_out.linear, QuantizedLinear)
    sqnr = forward_sqnr_db(want, got)
    print(f"{fmt}: forward SQNR {sqnr:.3f} dB (verify --forward: {reported} dB)")
    assert sqnr > 15 and round(sqnr, 3) == reported


def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(converted):
    import diffusers

    comp = converted("diffusers", "torchao_fp8") / "transformer"
    model = diffusers.HunyuanVideo15Transformer3DModel.from_pretrained(comp, torch_dtype=torch.bfloat16)
    assert type(model.transformer_blocks[0].attn.to_q.weight).__name__ == "Float8Tensor"
    x = load_inputs(None, HV, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        y = model(**HV.inputs.call(model.config, x))[0]
    assert y.shape == (1, 32, 2, 4, 4) and torch.isfinite(y).all()


def test_the_release_in_torchao_is_not_for_diffusers_from_pretrained_and_its_card_says_our_loader(converted):
    """Its config.json is the release's and its tensors keep the release's names, which diffusers' from_pretrained
    never renames: it fails (on the release's config) rather than loading a model, and the card offers no
    from_pretrained, only our loader, which builds the diffusers class from that config (`diffusers_config`)."""
    import diffusers

    out = converted("release", "torchao_fp8")
    card = (out / "README.md").read_text()
    assert "from_pretrained" not in card and "load_quantized(HunyuanVideo15Transformer3DModel" in card
    default = torch.get_default_dtype()
    try:
        with pytest.raises((TypeError, ValueError, RuntimeError)):
            diffusers.HunyuanVideo15Transformer3DModel.from_pretrained(out, torch_dtype=torch.bfloat16)
    finally:  # diffusers leaves torch_dtype as the default dtype when building the model fails
        torch.set_default_dtype(default)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_comfy_and_gguf_files_hold_what_comfyui_detects(sources, converted, layout):
    import gguf

    (path,) = _component(converted(layout, "comfy_fp8"), layout).glob("*.safetensors")
    with safe_open(path, "pt") as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    weights = {k: v for k, v in stored.items() if not k.endswith((".comfy_quant", ".weight_scale"))}
    assert comfyui_detects(weights)["model"] == "HunyuanVideo15"
    assert {comfyui_process(k) for k in weights} == comfyui_names(2)
    assert json.loads(
        bytes(safe_open(path, "pt").get_tensor("double_blocks.1.txt_attn_qkv.comfy_quant").tolist())
    )
    (path,) = _component(converted(layout, "gguf"), layout).glob("*.gguf")
    reader = gguf.GGUFReader(path)
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "hyvid"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert {comfyui_process(k) for k in types} == comfyui_names(2)
    assert (
        types["double_blocks.0.img_attn_qkv.weight"] == "Q8_0"
        and types["cond_type_embedding.weight"] == "F32"
    )


# -- refusals, in one line ------------------------------------------------------------------------------------------


def _rewritten(src: Path, dst: Path, change) -> Path:
    from safetensors.torch import save_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_all(src)
    change(tensors)
    save_file(tensors, dst / "diffusion_pytorch_model.safetensors")
    return dst


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_a_release_lacking_one_of_q_k_v_is_refused_for_native_names(sources, tmp_path):
    bad = _rewritten(sources["release"], tmp_path / "bad", lambda t: t.pop("double_blocks.1.txt_attn_k.bias"))
    line = _one_error_line(run_cli("plan", bad, "--format", "comfy_fp8"))
    assert "tensor 'double_blocks.1.txt_attn_k.bias' is missing" in line and "txt_attn_qkv.bias" in line


def test_a_tensor_diffusers_class_lacks_is_refused_by_a_forward_pass(sources, tmp_path):
    def extra(t):
        t["guidance_in.mlp.0.weight"] = torch.zeros(128, 256, dtype=torch.bfloat16)

    bad = _rewritten(sources["release"], tmp_path / "bad", extra)
    line = _one_error_line(run_cli("sensitivity", bad, "--format", "comfy_fp8"))
    assert (
        "tensor 'guidance_in.mlp.0.weight' has no counterpart in diffusers' HunyuanVideo15Transformer3DModel"
        in line
    )


def test_a_recipe_splitting_a_fused_qkv_is_refused(sources, tmp_path):
    recipe = tmp_path / "split.yaml"
    recipe.write_text("format: comfy_fp8\ntargets: ['double_blocks\\.\\d+\\.img_attn_q']\n")
    line = _one_error_line(run_cli("plan", sources["release"], "--recipe", recipe))
    assert "stacked into 'double_blocks.0.img_attn_qkv.weight'" in line and "treat them alike" in line


# -- sensitivity ------------------------------------------------------------------------------------------------------


def test_sensitivity_runs_on_the_release_and_proposes_a_recipe(sources, tmp_path):
    proposal = tmp_path / "proposal.yaml"
    proc = run_cli(
        "sensitivity", sources["release"], "--recipe", "hunyuanvideo15-comfy-nvfp4", "--min-forward-sqnr", "30",
        "--write-recipe", proposal, "--top", "3", check=True,
    )  # fmt: skip
    assert re.search(r"forward SQNR of the recipe in \.: [\d.]+ dB", proc.stdout), proc.stdout
    assert load_recipe(str(proposal)).recipe.format == "comfy_nvfp4"
