"""Kandinsky 5: its native names (the original release's, which ComfyUI reads), its two layouts (the release's
``model/<one file>`` and diffusers' ``transformer/``), its recipes and every format through the command line.

diffusers has no converter of Kandinsky 5's original names (no single-file loader), so the oracle of the name
table is ComfyUI's model code read directly: the state dict its ``Kandinsky5`` module builds
(``comfy/ldm/kandinsky5/model.py``) and its detection rule (``comfy/model_detection.py``, the 'Kandinsky 5' rule),
spelled in tests/oracles/comfyui_kandinsky5.py. ComfyUI itself is not needed (nor on PyPI).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.errors import InputError
from quantize.formats import FORMAT_INFO
from quantize.models import get_family, names_for, runnable_names
from quantize.models.examples import examples_of
from quantize.plan import make_plan
from quantize.read.checkpoint import open_component, read_tensor
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import load_all, read_json, run_cli
from tests.oracles.comfyui_kandinsky5 import built_by_comfyui, comfyui_detects, comfyui_state

K5 = get_family("kandinsky5")
FORMATS = [
    "fp8_channel",
    "torchao_fp8",
    "torchao_int8",
    "nf4",
    "comfy_fp8",
    "comfy_int8",
    "comfy_nvfp4",
    "comfy_mxfp8",
]
COMFY = [f for f in FORMATS if f.startswith("comfy_")]


TINY = dict(
    in_visual_dim=16, out_visual_dim=16, in_text_dim=3584, in_text_dim2=768, time_dim=64, patch_size=(1, 2, 2),
    model_dim=128, ff_dim=256, num_text_blocks=1, num_visual_blocks=2, axes_dims=(16, 24, 24), visual_cond=True,
)  # fmt: skip


# -- the name table -----------------------------------------------------------------------------------------


def test_every_tensor_of_diffusers_class_has_the_name_and_shape_comfyuis_module_builds_and_comes_back():
    import diffusers

    state = diffusers.Kandinsky5Transformer3DModel(**TINY).state_dict()
    rename = names_for("native", K5, FORMAT_INFO["comfy_fp8"], "here").renamer(list(state), "here")
    native = {rename(k): v for k, v in state.items()}
    assert len(native) == len(state)
    assert {k: tuple(v.shape) for k, v in native.items()} == comfyui_state(128, 256, 64, 1, 2, 4 * 33, 64)
    back = {K5.diffusers_name(k): v for k, v in native.items()}
    assert set(back) == set(state) and all(back[k] is state[k] for k in state)


def test_a_tensor_neither_naming_has_is_refused_naming_it():
    table = names_for("native", K5, FORMAT_INFO["comfy_int8"], "here")
    names = [
        "visual_transformer_blocks.0.self_attention.to_query.weight",
        "visual_transformer_blocks.0.lora.weight",
    ]
    with pytest.raises(
        InputError, match=r"^here: tensor 'visual_transformer_blocks.0.lora.weight' has no native"
    ):
        table.renamer(names, "here")
    with pytest.raises(
        InputError, match="tensor 'visual_transformer_blocks.0.lora.weight' has no counterpart"
    ):
        runnable_names(K5, names, Path("here"))
    with pytest.raises(InputError, match="neither Kandinsky 5's native names nor diffusers'"):
        table.renamer(["blocks.0.self_attn.q.weight"], "here")


# -- the sources, and GGUF refused ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The small example (every Linear a multiple of 256 wide) in both layouts, as `quantize example` writes them."""
    root = tmp_path_factory.mktemp("k5")
    for layout in ("original", "t2v"):
        run_cli(
            "example",
            root / layout,
            "--family",
            "kandinsky5",
            "--preset",
            "small",
            "--layout",
            layout,
            check=True,
        )
    return {"original": root / "original", "diffusers": root / "t2v"}


def test_gguf_is_refused_at_plan_time_naming_why(sources, tmp_path):
    recipe = tmp_path / "k5-gguf.yaml"
    recipe.write_text(
        "format: gguf\ncomponents: [model]\ntype: Q8_0\ntargets: ['visual_transformer_blocks\\.\\d+\\.self_attention\\.to_query']\n"
    )
    for command in (
        ("plan", sources["original"], "--recipe", recipe),
        ("convert", sources["original"], tmp_path / "o", "--recipe", recipe),
    ):
        proc = run_cli(*command)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert f"{sources['original'] / 'model'}: Kandinsky 5 has no GGUF architecture" in line
        assert "ComfyUI-GGUF's loader reads only the architectures of its IMG_ARCH_LIST" in line
    assert not (tmp_path / "o").exists()
    proc = run_cli("convert", sources["original"], tmp_path / "o", "--format", "gguf")
    assert proc.returncode == 2 and "no bundled gguf recipe for kandinsky5-original" in proc.stderr


# -- examples -------------------------------------------------------------------------------------------------


def test_the_original_example_is_the_release_one_file_in_model_with_no_config(sources):
    assert sorted(p.name for p in (sources["original"] / "model").iterdir()) == [
        "kandinsky5lite_t2v_sft_5s.safetensors"
    ]
    state = {k: tuple(v.shape) for k, v in load_all(sources["original"] / "model").items()}
    assert state == built_by_comfyui(state)  # ComfyUI builds exactly this model from what it detects
    assert K5.naming(state) == "diffusers"  # one naming: the original's names are diffusers' own


@pytest.mark.parametrize("preset", ["tiny", "small", "lite"])
@pytest.mark.parametrize("layout", ["original", "t2v"])
def test_examples_have_the_dimensions_comfyui_fixes(preset, layout):
    """Its defaults: Qwen2.5-VL's 3584 and CLIP's 768, 16 latent channels with the image latent and mask concatenated
    (4 * 33 = 132 inputs), a (1, 2, 2) patch; its head width, from model_dim alone."""
    (model,) = examples_of(K5).models(preset, layout)
    state = dict(model.tensors)
    assert state == built_by_comfyui(state)
    assert (
        state["text_embeddings.in_layer.weight"][1] == 3584
        and state["pooled_text_embeddings.in_layer.weight"][1] == 768
    )
    assert (
        state["visual_embeddings.in_layer.weight"][1] == 132 and state["out_layer.out_layer.weight"][0] == 64
    )
    if preset == "lite":  # Kandinsky 5.0 T2V Lite, as ComfyUI's rule for model_dim 1792 has it
        assert comfyui_detects(state) == dict(model_dim=1792, axes_dims=(16, 24, 24), time_dim=512, ff_dim=7168,
                                              visual_embed_dim=132, num_text_blocks=2, num_visual_blocks=32)  # fmt: skip
    if layout == "original":
        assert model.component == "model" and model.config is None
    else:
        assert model.component == "transformer" and model.config["axes_dims"] == [16, 24, 24]


def test_the_config_read_off_an_original_file_builds_diffusers_class_with_every_tensor_in_place(sources):
    import diffusers

    comp = open_component(sources["original"], "model")
    config = K5.diffusers_config({}, comp.tensors, comp.dir)
    with torch.device("meta"):
        built = diffusers.Kandinsky5Transformer3DModel.from_config(config)
    assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == {
        k: t.shape for k, t in comp.tensors.items()
    }
    assert config == read_json(sources["diffusers"] / "transformer" / "config.json") | {
        "_class_name": config["_class_name"]
    }


def test_a_head_width_comfyui_does_not_build_is_named(tmp_path):
    from quantize.read.checkpoint import TensorInfo

    state = comfyui_state(128, 256, 64, 1, 2, 132, 32)
    infos = {n: TensorInfo(n, "BF16", s, Path("x"), 0, 0) for n, s in state.items()}
    with pytest.raises(
        InputError,
        match=r"query_norm.weight' is 32 wide; ComfyUI builds a Kandinsky 5 of model_dim 128 with a head of 64",
    ):
        K5.diffusers_config({}, infos, tmp_path)


# -- the bundled recipes, on the small model -------------------------------------------------------------------

#: what every Kandinsky 5 recipe quantizes (the Kandinsky 5 FP8 work's split), written out again here
QUANTIZED = re.compile(
    r"(text|visual)_transformer_blocks\.\d+\.((self|cross)_attention\.(to_query|to_key|to_value|out_layer)|feed_forward\.in_layer)"
)


@pytest.mark.parametrize("layout", ["original", "diffusers"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_bundled_recipe_quantizes_the_attention_and_feed_forward_input(sources, layout, fmt):
    name = default_recipes()["kandinsky5" if layout == "diffusers" else "kandinsky5-original"][fmt]
    comp = "transformer" if layout == "diffusers" else "model"
    (cp,) = make_plan(sources[layout], load_recipe(name).recipe).components
    linears = {
        k.removesuffix(".weight")
        for k, t in cp.component.tensors.items()
        if k.endswith(".weight") and len(t.shape) == 2
    }
    quantized = {t.module: t for t in cp.tensors if t.quantize}
    assert cp.rel == comp and set(quantized) == {m for m in linears if QUANTIZED.fullmatch(m)}
    assert len(quantized) == 1 * 5 + 4 * 9  # 1 text block (4 + 1), 4 visual blocks (8 + 1)
    kept = linears - set(quantized)
    assert kept == {
        "time_embeddings.in_layer", "time_embeddings.out_layer", "text_embeddings.in_layer", "pooled_text_embeddings.in_layer",
        "visual_embeddings.in_layer", "out_layer.modulation.out_layer", "out_layer.out_layer",
        "text_transformer_blocks.0.text_modulation.out_layer", "text_transformer_blocks.0.feed_forward.out_layer",
        *(f"visual_transformer_blocks.{i}.{m}" for i in range(4) for m in ("visual_modulation.out_layer", "feed_forward.out_layer")),
    }  # fmt: skip
    if fmt == "comfy_nvfp4":  # MXFP8 for the text blocks and the first visual block, NVFP4 for the rest
        types = {m: t.options.type_name for m, t in quantized.items()}
        mxfp8 = {
            m for m in quantized if m.startswith(("text_transformer_blocks.", "visual_transformer_blocks.0."))
        }
        assert {m for m, t in types.items() if t == "mxfp8"} == mxfp8 and len(mxfp8) == 5 + 9
        assert {t for m, t in types.items() if m not in mxfp8} == {"nvfp4"}


# -- every format, through the command line --------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    """converted(layout, fmt) -> the output root of `quantize convert --format fmt`, made once each."""
    made: dict[tuple[str, str], Path] = {}

    def get(layout: str, fmt: str) -> Path:
        if (layout, fmt) not in made:
            out = tmp_path_factory.mktemp(f"k5-{layout}-{fmt}") / "out"
            run_cli("convert", sources[layout], out, "--format", fmt, check=True)
            made[layout, fmt] = out
        return made[layout, fmt]

    return get


def _component(out: Path, layout: str) -> Path:
    return out / ("model" if layout == "original" else "transformer")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_forward_and_loads_close_to_what_verify_reports(sources, converted, fmt):
    """The original layout's output: verify (with --forward, through diffusers' class), then our loader's eager
    reference in float32 computes verify's own figure, and its fast path in bf16 stays near it."""
    import diffusers

    from loaders import QuantizedLinear, load_quantized

    out = converted("original", fmt)
    proc = run_cli("verify", out, "--source", sources["original"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    comp = _component(out, "original")
    config = read_json(comp / "config.json")
    assert (
        config["_class_name"] == "Kandinsky5Transformer3DModel"
    )  # the release has none: read off its tensors
    source = open_component(sources["original"], "model")
    state = {k: read_tensor(i).float() for k, i in source.tensors.items()}
    cls = diffusers.Kandinsky5Transformer3DModel
    reference = cls.from_config({k: v for k, v in config.items() if k != "quantization_config"}).eval()
    reference.load_state_dict(state, strict=True)
    x = load_inputs(None, K5, reference.config)
    with torch.no_grad():
        want = reference(**K5.inputs.call(reference.config, x))[0]
        exact = load_quantized(cls, comp, dtype=torch.float32, compute="dequantize")
        assert any(isinstance(m, QuantizedLinear) for m in exact.modules())
        got = exact(**K5.inputs.call(reference.config, x))[0]
        assert round(forward_sqnr_db(want, got), 3) == reported
        fast = load_quantized(cls, comp, dtype=torch.bfloat16)
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        y = fast(**K5.inputs.call(reference.config, bf16))[0].float()
    assert reported - 6 < forward_sqnr_db(want, y) < reported + 1, reported


@pytest.mark.parametrize("fmt", COMFY)
def test_comfy_files_of_either_layout_hold_the_keys_comfyui_detects_and_its_markers(sources, converted, fmt):
    for layout in ("original", "diffusers"):
        comp = _component(converted(layout, fmt), layout)
        (path,) = comp.glob("*.safetensors")
        assert path.name == f"{comp.name}_{fmt}.safetensors"
        with safe_open(path, "pt") as f:
            stored = {k: f.get_tensor(k) for k in f.keys()}
        markers = {  # as comfy/ops.py reads them
            k.removesuffix(".comfy_quant"): json.loads(bytes(t.tolist()))
            for k, t in stored.items()
            if k.endswith(".comfy_quant")
        }
        source = load_all(sources[layout] / ("model" if layout == "original" else "transformer"))
        assert set(markers) == {
            m for m in (k.removesuffix(".weight") for k in source) if QUANTIZED.fullmatch(m)
        }
        assert {m["format"] for m in markers.values()} <= {
            "float8_e4m3fn",
            "int8_tensorwise",
            "nvfp4",
            "mxfp8",
        }
        # ComfyUI detects the source's model in the file, and builds the same one from it
        names = {k: tuple(v.shape) for k, v in stored.items()}
        assert comfyui_detects(names) == comfyui_detects({k: tuple(v.shape) for k, v in source.items()})
        kept = {k: v for k, v in stored.items() if k.rpartition(".")[0] not in markers}
        assert all(
            torch.equal(v, source[k]) for k, v in kept.items()
        )  # kept layers hold real values, bit for bit
        assert run_cli("verify", converted(layout, fmt), "--source", sources[layout]).returncode == 0


@pytest.mark.parametrize(
    "layout", ["diffusers"]
)  # the original layout's output keeps the release's file name
def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(sources, converted, layout):
    import diffusers

    comp = _component(converted(layout, "torchao_fp8"), layout)
    model = diffusers.Kandinsky5Transformer3DModel.from_pretrained(comp, torch_dtype=torch.bfloat16)
    x = load_inputs(None, K5, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        y = model(**K5.inputs.call(model.config, x))[0]
    assert y.shape == x["hidden_states"].shape[1:-1] + (16,) and torch.isfinite(y).all()  # [0]: the sample
    assert type(model.visual_transformer_blocks[0].self_attention.to_query.weight).__name__ == "Float8Tensor"


def test_sensitivity_runs_on_an_original_source_and_proposes_a_recipe(sources, tmp_path):
    proposal = tmp_path / "proposal.yaml"
    proc = run_cli(
        "sensitivity", sources["original"], "--recipe", "kandinsky5-original-comfy-nvfp4", "--min-forward-sqnr", "30",
        "--write-recipe", proposal, "--top", "3", check=True,
    )  # fmt: skip
    assert "forward SQNR of the recipe in model" in proc.stdout
    assert load_recipe(str(proposal)).recipe.format == "comfy_nvfp4"
    assert math.isfinite(
        float(re.search(r"forward SQNR of the recipe in model: ([-\d.]+) dB", proc.stdout)[1])
    )
