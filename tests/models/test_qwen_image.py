"""Qwen-Image and Qwen-Image 2.1: their names (ComfyUI's are diffusers' own), their layouts (diffusers'
``transformer/`` and, for Qwen-Image, Comfy-Org's single file), the recipes, the formats each converts to and the ones
refused, diffusers' ``from_pretrained`` on the torchao outputs, and bad input.

The oracles: ComfyUI's module (``comfy/ldm/qwen_image/model.py``) and its detection rule (``comfy/model_detection.py``,
the 'Qwen Image' branch) spelled in `comfyui_state` and `comfyui_detects`; diffusers' single-file loader's mapping of
a Comfy-Org file (``SINGLE_FILE_LOADABLE_CLASSES``). ComfyUI itself is not needed (nor on PyPI).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantize.errors import InputError
from quantize.models import get_family
from quantize.models.examples import examples_of
from quantize.plan import make_plan
from quantize.read.checkpoint import TensorInfo, open_component
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import load_inputs
from tests.conftest import load_all, read_json, run_cli

QI = get_family("qwen-image")
QI21 = get_family("qwen-image-21")
LAYOUT = {"diffusers": "qwen-image", "release": "qwen-image-release", "21": "qwen-image-21"}


# -- the oracles: ComfyUI's module and detection rule --------------------------------------------------------------


def comfyui_state(layers: int, dim: int, head: int, in_channels=64, joint=3584, out=16, patch=2) -> dict:
    """Name -> shape of every tensor ComfyUI's ``QwenImageTransformer2DModel`` builds (comfy/ldm/qwen_image/model.py:
    its Attention with bias, FeedForward of 4 x dim with a tanh GELU's ``net.0.proj`` and ``net.2``, LastLayer)."""

    def linear(name, o, i):
        return {f"{name}.weight": (o, i), f"{name}.bias": (o,)}

    s = {**linear("time_text_embed.timestep_embedder.linear_1", dim, 256)}
    s |= linear("time_text_embed.timestep_embedder.linear_2", dim, dim)
    s |= {"txt_norm.weight": (joint,)} | linear("img_in", dim, in_channels) | linear("txt_in", dim, joint)
    for i in range(layers):
        b = f"transformer_blocks.{i}"
        s |= linear(f"{b}.img_mod.1", 6 * dim, dim) | linear(f"{b}.txt_mod.1", 6 * dim, dim)
        s |= {f"{b}.attn.{n}.weight": (head,) for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")}
        for n in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            s |= linear(f"{b}.attn.{n}", dim, dim)
        for m in ("img_mlp", "txt_mlp"):
            s |= linear(f"{b}.{m}.net.0.proj", 4 * dim, dim) | linear(f"{b}.{m}.net.2", dim, 4 * dim)
    return s | linear("norm_out.linear", 2 * dim, dim) | linear("proj_out", patch * patch * out, dim)


def comfyui_detects(shapes: dict) -> dict | None:
    """ComfyUI's 'Qwen Image' detection (after the Mage-Flow rule, which takes a 2560-wide txt_norm and 128 outputs)."""
    if "txt_norm.weight" not in shapes:
        return None
    if shapes["txt_norm.weight"][0] == 2560 and shapes.get("proj_out.weight", (0,))[0] == 128:
        return None
    layers = 0
    while any(k.startswith(f"transformer_blocks.{layers}.") for k in shapes):
        layers += 1
    return {"image_model": "qwen_image", "in_channels": shapes["img_in.weight"][1], "num_layers": layers}


# -- the names -----------------------------------------------------------------------------------------------------


def test_every_tensor_of_diffusers_class_is_named_and_shaped_as_comfyuis_module_builds_it_and_read_back():
    import diffusers
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

    config = examples_of(QI).presets["tiny"].config()
    state = diffusers.QwenImageTransformer2DModel.from_config(config).state_dict()
    native = {QI.native_name(k): tuple(v.shape) for k, v in state.items()}
    assert native == comfyui_state(2, 128, 128)  # the names are the same, tensor by tensor
    assert all(QI.diffusers_name(k) == k for k in native)
    # diffusers' single-file loader reads a Comfy-Org file as it is
    mapping = SINGLE_FILE_LOADABLE_CLASSES["QwenImageTransformer2DModel"]["checkpoint_mapping_fn"]
    assert set(mapping(dict(state))) == set(state)
    assert QI.native_name("transformer_blocks.0.ff.net.0.proj.weight") is None  # not Qwen-Image's


def test_qwen_image_21s_table_holds_every_tensor_of_its_class_and_the_two_families_are_told_apart():
    import diffusers

    from quantize.models import family_of

    config = examples_of(QI21).presets["tiny"].config()
    state = diffusers.QwenImage21Transformer2DModel.from_config(config).state_dict()
    assert all(QI21.native_name(k) == k and QI21.diffusers_name(k) == k for k in state)
    assert family_of(None, list(state)) is QI21
    qi = diffusers.QwenImageTransformer2DModel.from_config(examples_of(QI).presets["tiny"].config())
    assert family_of(None, list(qi.state_dict())) is QI
    assert comfyui_detects({k: tuple(v.shape) for k, v in state.items()}) is None  # ComfyUI has no 2.1


# -- the sources, examples and the config read off a release --------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qi")
    for name, family, layout in (
        ("diffusers", "qwen-image", "diffusers"),
        ("release", "qwen-image", "release"),
        ("21", "qwen-image-21", "diffusers"),
    ):
        run_cli("example", root / name, "--family", family, "--layout", layout, check=True)
    return {name: root / name for name in ("diffusers", "release", "21")}


def test_the_release_is_one_file_comfyui_detects_and_its_config_is_the_diffusers_examples(sources):
    assert sorted(p.name for p in sources["release"].iterdir()) == [
        "example.json",
        "qwen_image_bf16.safetensors",
    ]
    comp = open_component(sources["release"], ".")
    shapes = {k: tuple(v.shape) for k, v in comp.tensors.items()}
    assert comfyui_detects(shapes) == {"image_model": "qwen_image", "in_channels": 64, "num_layers": 2}
    config = QI.diffusers_config({}, comp.tensors, comp.dir)
    assert config == read_json(sources["diffusers"] / "transformer" / "config.json")


@pytest.mark.parametrize("preset", ["comfyui", "20b"])
def test_the_examples_comfyui_loads_have_the_widths_it_builds(preset):
    (model,) = examples_of(QI).models(preset, "release")
    blocks = 2 if preset == "comfyui" else 60
    assert dict(model.tensors) == comfyui_state(blocks, 3072, 128)  # ComfyUI's defaults: 24 heads of 128


def test_a_release_of_a_head_width_comfyui_does_not_build_is_refused_naming_the_tensor():
    infos = {"transformer_blocks.0.attn.norm_q.weight": TensorInfo("n", "BF16", (64,), Path("x"), 0, 0)}
    with pytest.raises(
        InputError, match=r"tensor 'transformer_blocks.0.attn.norm_q.weight' is 64 wide; ComfyUI"
    ):
        QI.diffusers_config({}, infos, Path("x"))


# -- recipes --------------------------------------------------------------------------------------------------------

#: what each recipe quantizes, written out again: the blocks' attention, the feed-forward inputs and (Qwen-Image) the
#: modulation; the down projections where a format scales blocks of inputs
_QI_ROW = r"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_[qkv]_proj|to_add_out)|(img|txt)_mlp\.net\.0\.proj|(img|txt)_mod\.1)"
_QI_BLOCK = _QI_ROW[:-1] + r"|(img|txt)_mlp\.net\.2)"
_21_ROW = r"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0)|img_mlp\.(proj|gate_layer))"
_21_BLOCK = _21_ROW[:-1] + r"|img_mlp\.out)"


@pytest.mark.parametrize(
    ("source", "fmt", "pattern"),
    [
        ("diffusers", "fp8_channel", _QI_ROW),
        ("diffusers", "nf4", _QI_BLOCK),
        ("release", "comfy_fp8", _QI_ROW),
        ("release", "comfy_nvfp4", _QI_BLOCK),
        ("release", "gguf", _QI_BLOCK),
        ("21", "torchao_int8", _21_ROW),
        ("21", "nf4", _21_BLOCK),
    ],
)
def test_each_bundled_recipe_quantizes_the_blocks_and_keeps_embeddings_and_final_layer(
    sources, source, fmt, pattern
):
    recipe = load_recipe(default_recipes()[LAYOUT[source]][fmt]).recipe
    (cp,) = make_plan(sources[source], recipe).components
    linears = {k.removesuffix(".weight") for k, t in cp.component.tensors.items() if k.endswith(".weight") and len(t.shape) == 2}  # fmt: skip
    quantized = {t.module: t for t in cp.tensors if t.quantize}
    assert set(quantized) == {m for m in linears if re.fullmatch(pattern, m)}
    kept = {m for m in linears - set(quantized) if not m.startswith("transformer_blocks.")}
    common = {"img_in", "norm_out.linear", "proj_out", "time_text_embed.timestep_embedder.linear_1",
              "time_text_embed.timestep_embedder.linear_2"}  # fmt: skip
    assert kept == common | (
        {"txt_in"} if source != "21" else {"txt_in.in_layer", "txt_in.out_layer", "modulation.1"}
    )
    if fmt == "comfy_nvfp4":  # MXFP8 for block 0, the down projections and the modulation; NVFP4 for the rest
        types = {m: t.options.type_name for m, t in quantized.items()}
        sensitive = re.compile(r"transformer_blocks\.(0\..*|\d+\.((img|txt)_mlp\.net\.2|(img|txt)_mod\.1))")
        assert {m for m, t in types.items() if t == "mxfp8"} == {
            m for m in quantized if sensitive.fullmatch(m)
        }
        assert set(types.values()) == {"mxfp8", "nvfp4"}


# -- what Qwen-Image 2.1 is refused -----------------------------------------------------------------------------------


def _one_error(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_nvfp4", "gguf"])
def test_qwen_image_21_has_no_comfyui_or_gguf_file_and_is_refused_at_plan_time_naming_comfyui(
    sources, fmt, tmp_path
):
    line = _one_error(run_cli("convert", sources["21"], tmp_path / "o", "--format", fmt))
    assert f"no bundled {fmt} recipe for qwen-image-21" in line
    assert "ComfyUI (siliconflow/ComfyUI 187eda8e) has no Qwen-Image 2.1 model" in line
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"format: {fmt}\ncomponents: [transformer]\ntargets: ['transformer_blocks\\.\\d+\\.attn\\.to_q']\n"
        + ("type: Q8_0\n" if fmt == "gguf" else "")
    )
    line = _one_error(run_cli("convert", sources["21"], tmp_path / "o", "--recipe", recipe))
    assert "ComfyUI (siliconflow/ComfyUI 187eda8e) has no Qwen-Image 2.1 model" in line
    assert ("no GGUF architecture" in line) == (fmt == "gguf")
    assert not (tmp_path / "o").exists()


# -- conversions: verify --forward, ComfyUI's file, diffusers' from_pretrained ----------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(source: str, fmt: str) -> Path:
        if (source, fmt) not in made:
            out = tmp_path_factory.mktemp(f"qi-{source}-{fmt}") / "out"
            run_cli("convert", sources[source], out, "--format", fmt, check=True)
            made[source, fmt] = out
        return made[source, fmt]

    return get


@pytest.mark.parametrize(("source", "fmt"), [("release", "comfy_nvfp4"), ("release", "gguf"), ("21", "nf4")])
def test_outputs_verify_with_a_forward_pass_of_diffusers_class(sources, converted, source, fmt):
    out = converted(source, fmt)
    proc = run_cli("verify", out, "--source", sources[source], "--forward", "--json", check=True)
    (sqnr,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    assert sqnr > 15


def test_the_comfy_file_holds_what_comfyui_detects_its_markers_and_the_rest_as_stored(sources, converted):
    out = converted("release", "comfy_fp8")
    stored, source = load_all(out), load_all(sources["release"])
    markers = {k.removesuffix(".comfy_quant") for k in stored if k.endswith(".comfy_quant")}
    assert markers == {m.removesuffix(".weight") for m in source if re.fullmatch(_QI_ROW + r"\.weight", m)}
    shapes = {k: tuple(v.shape) for k, v in stored.items()}
    assert comfyui_detects(shapes) == comfyui_detects({k: tuple(v.shape) for k, v in source.items()})
    kept = {k: v for k, v in stored.items() if k.rpartition(".")[0] not in markers}
    assert kept and all(torch.equal(v, source[k]) for k, v in kept.items())


@pytest.mark.parametrize("source", ["diffusers", "21"])
def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(sources, converted, source):
    import diffusers

    family = QI if source == "diffusers" else QI21
    cls = getattr(diffusers, family.diffusers_class)
    model = cls.from_pretrained(converted(source, "torchao_fp8") / "transformer", torch_dtype=torch.bfloat16)
    x = load_inputs(None, family, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        (y,) = model(**family.inputs.call(model.config, x))
    assert y.shape[-1] == (16 * 4 if source == "diffusers" else 64) and torch.isfinite(y).all()
    assert type(model.transformer_blocks[0].attn.to_q.weight).__name__ == "Float8Tensor"


def test_the_2511_edits_marker_is_carried_into_every_file_and_sets_zero_cond_t(sources, tmp_path):
    """Comfy-Org's Qwen-Image-Edit-2511 file holds ``__index_timestep_zero__`` (empty): ComfyUI's mark of the edit
    model's reference method, diffusers' ``zero_cond_t``; no part of diffusers' class, carried as stored."""
    src = tmp_path / "edit-2511"
    src.mkdir()
    state = load_all(sources["release"]) | {"__index_timestep_zero__": torch.tensor([])}
    save_file(state, src / "qwen_image_edit_2511_bf16.safetensors")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--format", "comfy_fp8", check=True)
    assert load_all(out)["__index_timestep_zero__"].numel() == 0
    assert read_json(out / "config.json")["zero_cond_t"] is True
    assert QI.carried("__index_timestep_zero__")


# -- bad input: one line, exit 2, nothing written ---------------------------------------------------------------------


def _broken(sources, tmp_path: Path, source: str, edit: str) -> tuple[Path, str]:
    bad = tmp_path / "bad"
    if source == "release":
        bad.mkdir()
        (path,) = sources["release"].glob("*.safetensors")
        target, lacking = bad / path.name, "transformer_blocks.1.attn.to_k.weight"
    else:
        (bad / "transformer").mkdir(parents=True)
        for f in (sources[source] / "transformer").iterdir():
            (bad / "transformer" / f.name).write_bytes(f.read_bytes())
        target = bad / "transformer" / "diffusion_pytorch_model.safetensors"
        path, lacking = target, "transformer_blocks.1.img_mlp.out.weight"
    if edit == "truncated":
        target.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif edit == "missing":
        with safe_open(path, "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys() if k != lacking}
        save_file(state, target)
    else:  # a config.json naming a class no family is
        config = bad / "transformer" / "config.json"
        config.write_text(
            config.read_text().replace("QwenImage21Transformer2DModel", "QwenImage3Transformer2DModel")
        )
    said = {
        "truncated": f"{target}: tensor data ends at byte",
        "missing": f"no tensor {lacking!r}, which block 0 has: a partial Qwen-Image",
        "unknown": "names QwenImage3Transformer2DModel, which no family is",
    }[edit]
    return bad, said


@pytest.mark.parametrize(
    ("source", "edit"),
    [
        ("release", "truncated"),
        ("release", "missing"),
        ("21", "truncated"),
        ("21", "missing"),
        ("21", "unknown"),
    ],
)
@pytest.mark.parametrize("fmt", ["comfy_fp8", "torchao_fp8"])
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(sources, tmp_path, source, edit, fmt):
    if source == "21" and fmt == "comfy_fp8":
        fmt = "nf4"
    bad, said = _broken(sources, tmp_path, source, edit)
    line = _one_error(run_cli("convert", bad, tmp_path / "out", "--format", fmt))
    assert said in line and str(bad) in line, line
    assert not (tmp_path / "out").exists()


def test_a_mage_flow_file_is_no_qwen_image_release(tmp_path):
    """ComfyUI tells Mage-Flow (a 2560-wide txt_norm, 128 outputs) before Qwen-Image and runs it as another model."""
    from quantize.read.detect import detect_layouts

    names = {
        "txt_norm.weight": (2560,),
        "proj_out.weight": (128, 64),
        "transformer_blocks.0.txt_mod.1.weight": (8, 4),
    }
    save_file({k: torch.zeros(s) for k, s in names.items()}, tmp_path / "mage_flow.safetensors")
    assert not [lay for lay in detect_layouts(tmp_path) if lay.family == "qwen-image"]
    save_file(
        {k: torch.zeros(s) for k, s in (names | {"txt_norm.weight": (3584,)}).items()},
        tmp_path / "mage_flow.safetensors",
    )
    assert [lay.name for lay in detect_layouts(tmp_path)] == ["qwen-image-release"]
