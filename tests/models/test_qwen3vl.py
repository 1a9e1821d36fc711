"""Qwen3-VL (Qwen-Image 2.1's text encoder): its layouts, its names and every format it has, each read by its real
reader; what it refuses, and why.

The oracles:
- transformers' own `Qwen3VLForConditionalGeneration`: its parameters (the names its checkpoints store), its
  `from_pretrained` (the transformers-side formats) and its forward (the reference);
- ComfyUI's Qwen3-VL (``comfy/text_encoders/qwen3vl.py`` `Qwen3VL`, after ``comfy/sd.py``'s renaming), whose state
  dict tests/oracles/comfyui_qwen3vl.py spells from its source (``benchmarks/comfyui_encoders.py --family qwen3vl``
  loads our files in the real one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.models import family_of, get_family
from quantize.models.examples.qwen3vl import QWEN3VL_EXAMPLES, SINGLE_FILE_STEM, qwen3vl_config
from quantize.models.examples.qwen25vl import QWEN25VL_EXAMPLES
from quantize.recipes import load_recipe
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each
from tests.helpers.encoders import language_model_hidden_state as last_hidden_state
from tests.helpers.recipes import edited_recipe
from tests.helpers.verify import forward_sqnr
from tests.oracles.comfyui_qwen3vl import comfyui_name, comfyui_state

QWEN3 = get_family("qwen3vl")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY]
FOUR_BIT = ("nf4", "comfy_nvfp4")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3vl")
    for layout in QWEN3VL_EXAMPLES.layouts:
        run_cli("example", root / layout, "--family", "qwen3vl", "--layout", layout, check=True)
    return {layout: root / layout for layout in QWEN3VL_EXAMPLES.layouts}


@pytest.fixture(scope="module")
def reference(sources):
    from transformers import Qwen3VLForConditionalGeneration

    path = sources["pipeline"] / "text_encoder"
    model = Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


def test_the_example_is_transformers_own_class_and_comfyuis_qwen3vl():
    """The stored names are the class's own (transformers renames nothing of Qwen3-VL), shape for shape; ComfyUI's
    renaming of them is its Qwen3VL module's state, at the tiny preset and at the widths ComfyUI fixes."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    (model,) = QWEN3VL_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**fields))
    assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == dict(model.tensors)
    assert QWEN3.parameter_names([n for n, _ in model.tensors]) == {n: n for n, _ in model.tensors}
    for preset in ("tiny", "comfyui"):
        (single,) = QWEN3VL_EXAMPLES.models(preset, "single")
        state = comfyui_state(QWEN3VL_EXAMPLES.presets[preset])
        assert {comfyui_name(n): shape for n, shape in single.tensors} == state
        assert all(QWEN3.native_name(n) == n for n, _ in single.tensors)


def test_qwen25vl_and_qwen3vl_are_told_apart_by_class_and_by_names():
    """Both towers have a fused qkv under ``model.visual.``: DeepStack's mergers are Qwen3-VL's alone, and Qwen2.5-VL
    (asked first) takes none of its files; Qwen3-VL's language model alone is its text model's."""
    (three,) = QWEN3VL_EXAMPLES.models("tiny", "single")
    (two,) = QWEN25VL_EXAMPLES.models("tiny", "single")
    names3, names2 = [n for n, _ in three.tensors], [n for n, _ in two.tensors]
    assert family_of(None, names3) is QWEN3 and family_of(None, names2) is get_family("qwen25vl")
    assert family_of("Qwen3VLForConditionalGeneration", names3) is QWEN3
    assert not get_family("qwen25vl").owns(None, names3) and not QWEN3.owns(None, names2)
    prefix = "model.language_model."
    text = [n[len(prefix) :] for n in names3 if n.startswith(prefix)]
    assert family_of(None, text) is get_family("qwen3vl-text")
    assert family_of("Qwen3VLTextModel", text) is get_family("qwen3vl-text")


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("qwen3vl-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, sources, reference, fmt
):
    from transformers import Qwen3VLForConditionalGeneration

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], sources["pipeline"])
    model = load_quantized(
        Qwen3VLForConditionalGeneration, converted[fmt] / "text_encoder", dtype=torch.float32
    )
    ids, ref = reference
    floor = 12 if fmt in FOUR_BIT else 22
    assert reported > floor and sqnr(ref, last_hidden_state(model, ids)) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    from transformers import Qwen3VLForConditionalGeneration

    path = converted[fmt] / "text_encoder"
    model = Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert sqnr(ref, last_hidden_state(model, ids)) > (12 if fmt == "nf4" else 18)


@pytest.mark.parametrize("fmt", COMFY)
def test_a_comfy_file_holds_comfyuis_names_and_its_markers(converted, fmt):
    """The stored names, which ComfyUI renames to its module's (its detection's DeepStack mark among them), each
    quantized Linear of the language model with its marker, the tower kept."""
    (path,) = (converted[fmt] / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        marker = json.loads(
            bytes(f.get_tensor("model.language_model.layers.1.mlp.down_proj.comfy_quant").numpy())
        )
    parts = ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale")
    expected = comfyui_state(QWEN3VL_EXAMPLES.presets["tiny"])
    assert {comfyui_name(k) for k in keys if k.rsplit(".", 1)[-1] not in parts} == set(expected)
    assert marker["format"] and "model.visual.deepstack_merger_list.0.norm.weight" in keys
    assert not any(k.startswith("model.visual.") and k.endswith("comfy_quant") for k in keys)


def test_the_single_file_converts_with_a_config_read_off_its_shapes(sources, reference, tmp_path):
    """Comfy-Org's single file (the same model as the pipeline's): its config read off its shapes is the release's
    config.json (the DeepStack layers by the tower's depth), and transformers loads a transformers-side output."""
    from transformers import Qwen3VLForConditionalGeneration

    out = tmp_path / "out"
    run_cli("convert", sources["single"], out, "--format", "fp8_channel", check=True)
    reported = forward_sqnr(out, sources["single"])
    derived = read_json(out / "config.json")
    given = qwen3vl_config(QWEN3VL_EXAMPLES.presets["tiny"])
    assert {k: v for k, v in derived.items() if k != "quantization_config"} == {
        k: v for k, v in given.items() if k != "dtype"
    }
    model = Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert reported > 22 and sqnr(ref, last_hidden_state(model, ids)) > 18


def test_the_towers_mlp_no_32_block_divides_is_padded_or_refused_per_layer(sources, tmp_path):
    """The 8B's tower MLP is 4304 wide (the tiny one 80): a recipe quantizing it in comfy_mxfp8 pads as
    comfy-kitchen's layout pads and converts; in nf4 it is refused at plan time, naming the tensor and the width."""
    tower = r"model\.visual\.blocks\.\d+\.mlp\.linear_fc2"
    for name, ok in (("qwen3vl-comfy-mxfp8", True), ("qwen3vl-nf4", False)):
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(edited_recipe(name, targets=[*load_recipe(name).recipe.targets, tower]))
        proc = run_cli("convert", sources["pipeline"], tmp_path / name, "--recipe", recipe)
        if ok:
            assert proc.returncode == 0, proc.stderr
            continue
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "'model.visual.blocks.0.mlp.linear_fc2.weight' is [64, 80]; nf4 needs in_features" in line
        assert not (tmp_path / name).exists()


def test_gguf_is_refused_naming_what_comfyui_gguf_does_with_it(sources, tmp_path):
    for layout in ("pipeline", "single"):
        proc = run_cli("convert", sources[layout], tmp_path / layout, "--format", "gguf")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "Qwen3-VL has no GGUF architecture (ComfyUI-GGUF's CLIP loader maps a qwen3vl file's" in line
        assert not (tmp_path / layout).exists()


def _bad_single(sources, tmp_path, edit) -> Path:
    """A copy of the single file, `edit(tensors)` -> tensors to write instead (None: cut its last 1000 bytes)."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    src, dst = sources["single"] / f"{SINGLE_FILE_STEM}.safetensors", bad / f"{SINGLE_FILE_STEM}.safetensors"
    if edit is None:
        dst.write_bytes(src.read_bytes()[:-1000])
    else:
        save_file(edit(load_file(src)), dst)
    return bad


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (None, "but the file has"),
        (
            lambda t: {
                k: v for k, v in t.items() if k != "model.language_model.layers.1.mlp.down_proj.weight"
            },
            "no tensor 'model.language_model.layers.1.mlp.down_proj.weight', which block 0 has: a partial Qwen3-VL",
        ),
        (
            lambda t: {k: v for k, v in t.items() if not k.startswith("model.visual.blocks.23.")},
            "a Qwen3-VL tower of 23 blocks and 3 DeepStack mergers",
        ),
    ],
    ids=["truncated", "missing-layer-tensor", "missing-tower-block"],
)
def test_a_broken_single_file_is_one_line_and_nothing_is_written(sources, tmp_path, edit, said):
    bad = _bad_single(sources, tmp_path, edit)
    for fmt in ("comfy_fp8", "torchao_fp8"):
        proc = run_cli("convert", bad, tmp_path / "out", "--format", fmt)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert said in line and str(bad) in line, line
        assert not (tmp_path / "out").exists()


def test_an_encoder_config_no_family_knows_is_one_line_naming_its_class(sources, tmp_path):
    bare = tmp_path / "text_encoder"
    shutil.copytree(sources["pipeline"] / "text_encoder", bare)
    config = read_json(bare / "config.json")
    (bare / "config.json").write_text(
        json.dumps({**config, "architectures": ["Qwen9VLForConditionalGeneration"]})
    )
    proc = run_cli("convert", bare, tmp_path / "out", "--format", "comfy_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{bare}: no known layout" in line
    assert "config.json names Qwen9VLForConditionalGeneration, which no family is" in line
    assert not (tmp_path / "out").exists()
