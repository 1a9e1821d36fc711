"""A newcomer's path: the layout of a download told apart, `--format` picking the bundled recipe for it,
`recipes --for`, and a bare `transformer/` folder converted as the component it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantize.errors import InputError
from quantize.plan import make_plan
from quantize.read.detect import DEFAULT_RECIPES, detect_layouts, recipe_for_format
from quantize.recipes import bundled_recipe, bundled_recipes, load_recipe
from tests.conftest import read_json, run_cli
from tests.diffusers_models import kandinsky5, wan


def _diffusers_wan(root: Path, experts: int = 1) -> Path:
    for i, rel in enumerate(("transformer", "transformer_2")[:experts]):
        wan(root / rel, seed=i)
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """One small source of every layout (the key), plus the bare folders."""
    from quantize.examples import write_example

    root = tmp_path_factory.mktemp("layouts")
    found = {
        layout: write_example(root / layout, "tiny", layout) for layout in ("t2v", "i2v", "a14b", "lingbot")
    }
    found["diffusers"] = _diffusers_wan(root / "diffusers")
    found["diffusers-a14b"] = _diffusers_wan(root / "diffusers-a14b", experts=2)
    found["kandinsky5"] = kandinsky5(root / "kandinsky5" / "transformer").parent
    found["bare-wan"] = found["diffusers"] / "transformer"
    found["bare-kandinsky5"] = found["kandinsky5"] / "transformer"
    return found


EXPECTED = {
    "t2v": ("wan", "Wan2.1/2.2 T2V, original names, one model at the root"),
    "i2v": ("wan", "Wan2.1/2.2 I2V, original names, one model at the root"),
    "a14b": ("wan2.2-a14b", "Wan2.2 A14B layout, original names, 2 experts"),
    "lingbot": ("lingbot-world", "LingBot-World layout, original names, 2 experts with camera layers"),
    "diffusers": ("wan-diffusers", "Wan, diffusers layout (WanTransformer3DModel in transformer/)"),
    "diffusers-a14b": (
        "wan2.2-a14b-diffusers",
        "Wan2.2 A14B, diffusers layout, 2 experts (transformer, transformer_2)",
    ),
    "kandinsky5": (
        "kandinsky5",
        "Kandinsky 5, diffusers layout (Kandinsky5Transformer3DModel in transformer/)",
    ),
    "bare-wan": ("wan-diffusers", "Wan, a bare WanTransformer3DModel folder (diffusers names)"),
    "bare-kandinsky5": (
        "kandinsky5",
        "Kandinsky 5, a bare Kandinsky5Transformer3DModel folder (diffusers names)",
    ),
}


@pytest.mark.parametrize("source", list(EXPECTED))
def test_each_layout_is_told_apart(source, sources):
    (layout,) = detect_layouts(sources[source])
    assert (layout.name, layout.why) == EXPECTED[source]


@pytest.mark.parametrize("source", list(EXPECTED))
def test_every_default_recipe_fits_its_layout(source, sources):
    """Each format's default for a layout is a bundled recipe of that format, and it plans on that layout."""
    name = EXPECTED[source][0]
    for fmt, recipe_name in DEFAULT_RECIPES[name].items():
        assert recipe_for_format(sources[source], fmt)[0] == recipe_name
        recipe = bundled_recipe(recipe_name).recipe
        assert recipe.format == fmt
        plan = make_plan(sources[source], recipe)
        assert plan.tensor_count > 0


def test_every_bundled_recipe_is_a_default_or_a_variant_of_one():
    """A new bundled recipe is either some layout's default or a named variant, never forgotten."""
    from quantize.recipes import bundled_recipes

    defaults = {r for table in DEFAULT_RECIPES.values() for r in table.values()}
    variants = {
        "wan-fp8-all", "wan-comfy-fp8-all", "wan-gguf-q6_k", "wan-gguf-q5_k_m", "wan-gguf-q4_k_m",
        "wan-diffusers-gguf-q4_k_m", "wan2.2-a14b-gguf-q4_k_m",
        "wan-comfy-int8-convrot", "wan-diffusers-comfy-int8-convrot", "wan2.2-a14b-comfy-int8-convrot",
    }  # fmt: skip
    names = {bundled_recipe(f).recipe.name for f in bundled_recipes()}
    assert names == defaults | variants


def test_format_picks_the_recipe_and_says_why_in_the_first_line(sources, tmp_path):
    proc = run_cli("convert", sources["a14b"], tmp_path / "out", "--format", "fp8_channel", check=True)
    assert (
        proc.stdout.splitlines()[0] == "recipe wan2.2-a14b-fp8: Wan2.2 A14B layout, original names, 2 experts"
    )
    manifest = read_json(tmp_path / "out" / "quantize_manifest.json")
    assert manifest["recipe"]["origin"] == "bundled:wan2.2-a14b-fp8.yaml"  # recorded as with --recipe
    plan = run_cli("plan", sources["kandinsky5"], "--format", "torchao_fp8", check=True)
    assert plan.stdout.splitlines()[0].startswith("recipe kandinsky5-torchao-fp8: Kandinsky 5")


def _one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


def test_format_refusals_are_one_line_listing_what_there_is(sources, tmp_path):
    line = _one_line_exit_2(run_cli("convert", sources["kandinsky5"], tmp_path / "o", "--format", "gguf"))
    assert "no bundled gguf recipe for kandinsky5" in line and "kandinsky5-torchao-fp8 (torchao_fp8)" in line
    # the family says why
    assert "(Kandinsky 5 has no GGUF architecture (ComfyUI-GGUF's loader reads only" in line
    line = _one_line_exit_2(run_cli("convert", sources["t2v"], tmp_path / "o", "--format", "fp9"))
    assert (
        "'fp9' is not a format (formats: comfy_fp8, comfy_int8, comfy_mxfp8, comfy_nvfp4, comfy_w4a4, comfy_w4a8, "
        "fp8_channel, gguf, nf4, torchao_fp8, torchao_int8)" in line
    )
    other = tmp_path / "other"
    other.mkdir()
    save_file({"encoder.layer.0.weight": torch.zeros(4, 4)}, other / "model.safetensors")
    line = _one_line_exit_2(run_cli("convert", other, tmp_path / "o", "--format", "fp8_channel"))
    assert "no known layout" in line and "--recipe" in line
    both = tmp_path / "both"  # original names at the root and a diffusers transformer/ beside them
    shutil.copytree(sources["t2v"], both)
    shutil.copytree(sources["bare-wan"], both / "transformer")
    line = _one_line_exit_2(run_cli("convert", both, tmp_path / "o", "--format", "fp8_channel"))
    assert (
        "holds more than one kind of model" in line
        and "wan-fp8 (wan)" in line
        and "wan-diffusers-fp8" in line
    )
    line = _one_line_exit_2(run_cli("convert", sources["t2v"], tmp_path / "o"))
    assert "give --recipe RECIPE or --format FORMAT" in line
    line = _one_line_exit_2(
        run_cli("convert", sources["t2v"], tmp_path / "o", "--recipe", "wan-fp8", "--format", "nf4")
    )
    assert "give --recipe RECIPE or --format FORMAT" in line
    assert not (tmp_path / "o").exists()


def test_recipes_for_lists_what_fits(sources):
    proc = run_cli("recipes", "--for", sources["a14b"], check=True)
    assert proc.stdout.splitlines()[0].endswith("wan2.2-a14b (Wan2.2 A14B layout, original names, 2 experts)")
    listed = [line.split("│")[1].strip() for line in proc.stdout.splitlines() if ".yaml" in line]
    assert listed == [
        "wan2.2-a14b-comfy-fp8.yaml",
        "wan2.2-a14b-comfy-int8-convrot.yaml",  # each width takes its own ConvRot group
        "wan2.2-a14b-comfy-int8.yaml",
        "wan2.2-a14b-comfy-mxfp8.yaml",
        "wan2.2-a14b-comfy-nvfp4.yaml",
        "wan2.2-a14b-comfy-w4a4.yaml",
        "wan2.2-a14b-comfy-w4a8.yaml",
        "wan2.2-a14b-fp8.yaml",
        "wan2.2-a14b-gguf-q8_0.yaml",
        "wan2.2-a14b-nf4.yaml",
        "wan2.2-a14b-torchao-fp8.yaml",
        "wan2.2-a14b-torchao-int8.yaml",
    ]
    assert "--format fp8_channel" in proc.stdout
    kandinsky = run_cli("recipes", "--for", sources["bare-kandinsky5"], check=True)
    listed = [line.split("│")[1].strip() for line in kandinsky.stdout.splitlines() if ".yaml" in line]
    # one component: the recipes of either Kandinsky 5 layout fit the bare folder
    assert listed == sorted(r for r in bundled_recipes() if r.startswith("kandinsky5-"))


def test_a_bare_component_folder_converts_as_that_component(sources, tmp_path):
    import diffusers
    from torchao.quantization import Float8Tensor

    bare = sources["bare-wan"]
    proc = run_cli("convert", bare, tmp_path / "out", "--format", "torchao_fp8", check=True)
    assert proc.stdout.splitlines()[0] == (
        "recipe wan-diffusers-torchao-fp8: Wan, a bare WanTransformer3DModel folder (diffusers names)"
    )
    out = tmp_path / "out"
    assert (out / "config.json").is_file() and not (out / "transformer").exists()
    model = diffusers.WanTransformer3DModel.from_pretrained(out, torch_dtype=torch.bfloat16)
    assert isinstance(model.blocks[0].attn1.to_q.weight, Float8Tensor)
    assert load_recipe(out / "recipe.yaml").recipe.components == ["."]  # what was done, as done
    assert run_cli("verify", out, "--source", bare).returncode == 0
    # the same recipe on the pipeline folder writes transformer/: both ways give the same model bytes
    run_cli(
        "convert",
        sources["diffusers"],
        tmp_path / "whole",
        "--recipe",
        "wan-diffusers-torchao-fp8",
        check=True,
    )
    for name in ("diffusion_pytorch_model.safetensors", "config.json"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / "transformer" / name).read_bytes()


def test_a_two_component_recipe_on_one_component_says_where_to_point(sources, tmp_path):
    bare = sources["diffusers-a14b"] / "transformer"
    line = _one_line_exit_2(run_cli("convert", bare, tmp_path / "o", "--recipe", "wan2.2-a14b-diffusers-fp8"))
    assert line.endswith(
        "is one model's folder (WanTransformer3DModel), and the recipe converts 2 (transformer, transformer_2): "
        f"point at {sources['diffusers-a14b']}, not at one of them"
    )
    with pytest.raises(InputError, match="is one model's folder"):
        make_plan(bare, load_recipe("wan2.2-a14b-diffusers-fp8").recipe)


def test_a_model_at_the_root_is_not_a_bare_folder(sources):
    """Wan's own releases keep their model (config class WanModel) at the root: a recipe for other folders
    is told which folder is missing, not that SOURCE is one component."""
    for recipe, missing in (("wan2.2-a14b-fp8", "high_noise_model"), ("wan-diffusers-fp8", "transformer")):
        line = _one_line_exit_2(run_cli("plan", sources["t2v"], "--recipe", recipe))
        assert f"component folder {missing!r} named by the recipe is missing" in line


def test_detection_agrees_with_the_conversion_on_odd_folders(sources, tmp_path):
    # diffusers names but no config.json: no bare model folder for either
    noconfig = tmp_path / "noconfig"
    shutil.copytree(sources["bare-wan"], noconfig)
    (noconfig / "config.json").unlink()
    assert detect_layouts(noconfig) == []
    # loose LoRAs beside a pipeline's transformer/: the pipeline is still found
    loose = tmp_path / "loose"
    shutil.copytree(sources["diffusers"], loose)
    for name in ("a.safetensors", "b.safetensors"):
        save_file({"x.lora_down.weight": torch.zeros(1, 1)}, loose / name)
    assert [lay.name for lay in detect_layouts(loose)] == ["wan-diffusers"]
    # the model type says TI2V
    ti2v = tmp_path / "ti2v"
    shutil.copytree(sources["t2v"], ti2v)
    config = read_json(ti2v / "config.json")
    (ti2v / "config.json").write_text(json.dumps({**config, "model_type": "ti2v"}))
    assert detect_layouts(ti2v)[0].why.startswith("Wan2.1/2.2 TI2V,")


def test_format_on_a_file_or_a_typo_says_so(sources, tmp_path):
    file = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(1)}, file)
    # a checkpoint file is a source (its one model): this one is of no family
    assert "no known layout" in _one_line_exit_2(run_cli("convert", file, tmp_path / "o", "--format", "nf4"))
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    line = _one_line_exit_2(run_cli("convert", notes, tmp_path / "o", "--format", "nf4"))
    assert "not a folder or a checkpoint file" in line
    typo = _one_line_exit_2(run_cli("convert", tmp_path / "typo", tmp_path / "o", "--format", "nf4"))
    assert "no such folder" in typo
    both = _one_line_exit_2(run_cli("recipes", "wan-fp8", "--for", sources["t2v"]))
    assert "not both" in both


def test_a_lora_for_the_component_a_bare_folder_is(sources, tmp_path):
    from tests.helpers.lora import make_lora, write_lora

    bare = sources["bare-wan"]
    made = make_lora(bare.parent, seed=1, rel="transformer", diffs=False)
    lora = write_lora(made, tmp_path / "l.safetensors")
    run_cli(
        "convert",
        bare,
        tmp_path / "out",
        "--format",
        "fp8_channel",
        "--lora",
        f"transformer={lora}",
        check=True,
    )
    manifest = read_json(tmp_path / "out" / "quantize_manifest.json")
    (record,) = manifest["steps"]
    assert record["loras"][0]["component"] == "." and record["loras"][0]["tensors"] == {".": len(made.terms)}
    assert manifest["source"]["name"] == "diffusers/transformer"  # what the card calls the model


def test_a_truncated_release_is_named_as_truncated_not_as_of_no_known_layout(sources, tmp_path):
    """A release cut short (a download that stopped halfway) has headers that promise more than the file holds:
    `--format` says so, naming the file, instead of sending the user after an unknown layout."""
    src = tmp_path / "cut"
    shutil.copytree(sources["t2v"], src)
    (shard,) = sorted(src.glob("*.safetensors"))[:1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--format", "fp8_channel"))
    assert shard.name in line and "truncated" in line and "no known layout" not in line
    assert not (tmp_path / "o").exists()
