"""Recipes: validation errors name the field; matching rules; every pattern must match; bundled lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantize.errors import InputError
from quantize.names import module_name as match_key
from quantize.plan import make_plan
from quantize.recipes import bundled_recipes, dump_recipe, load_recipe, parse_recipe

MINIMAL = "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n"


def test_minimal_recipe_gets_every_default():
    r = parse_recipe(MINIMAL)
    assert r.components == ["."] and r.ignore == [] and r.keep_dtype == "source"
    assert r.copy_other_files is False and r.checks.min_sqnr_db is None and r.name is None


def test_dump_round_trips():
    r = parse_recipe(MINIMAL + "ignore: [x]\nkeep_dtype: bfloat16\nchecks: {min_sqnr_db: 20}\n")
    assert parse_recipe(dump_recipe(r)) == r


@pytest.mark.parametrize(
    "text, message",
    [
        (MINIMAL + "colour: red\n", "unknown key 'colour'"),
        (MINIMAL + "checks: {min_snr: 3}\n", "unknown key 'checks.min_snr'"),
        ("targets: [a]\n", "missing required field 'format'"),
        ("format: fp8_channel\n", "missing required field 'targets'"),
        (
            "format: int3\ntargets: [a]\n",
            "field 'format': unknown format 'int3' \\(known: comfy_fp8, comfy_int8, comfy_mxfp8, comfy_nvfp4, fp8_channel, "
            "gguf, nf4, torchao_fp8, torchao_int8\\)",
        ),
        ("format: fp8_channel\ntargets: []\n", "field 'targets' must list at least one entry"),
        (
            "format: fp8_channel\ntargets: ['blocks\\.(']\n",
            "field 'targets.*': bad regular expression 'blocks\\\\.\\('",
        ),
        (MINIMAL + "ignore: ['[a-']\n", "field 'ignore.*': bad regular expression"),
        (MINIMAL + "keep_dtype: float8\n", "field 'keep_dtype'"),
        (MINIMAL + "components: ['../elsewhere']\n", "component '../elsewhere' must be a subfolder"),
        (MINIMAL + "components: ['/abs']\n", "must be a subfolder"),
        ("format: [oops\n", "not valid YAML"),
        ("- just\n- a list\n", "a recipe is a YAML mapping"),
    ],
)
def test_invalid_recipes_are_one_line_errors_naming_the_field(text, message):
    with pytest.raises(InputError, match=message) as e:
        parse_recipe(text, "my.yaml")
    assert str(e.value).startswith("my.yaml: ") and "\n" not in str(e.value)


def test_match_key_strips_only_weight():
    assert match_key("blocks.0.ffn.0.weight") == "blocks.0.ffn.0"
    assert match_key("blocks.0.ffn.0.bias") == "blocks.0.ffn.0.bias"
    assert match_key("scale_shift_table") == "scale_shift_table"


def _plan(source, text):
    return make_plan(source, parse_recipe(text))


def _quantized(plan):
    return {t.name for cp in plan.components for t in cp.tensors if t.quantize}


def test_fullmatch_not_search(wan_tiny):
    # 'ffn\.0' alone would be found by re.search in every block; fullmatch needs the whole name
    with pytest.raises(InputError, match="pattern 'ffn\\\\.0' matches no module"):
        _plan(wan_tiny, "format: fp8_channel\ntargets: ['ffn\\.0']\n")
    plan = _plan(wan_tiny, "format: fp8_channel\ntargets: ['.*ffn\\.0']\n")
    assert _quantized(plan) == {"blocks.0.ffn.0.weight", "blocks.1.ffn.0.weight"}


def test_ignore_wins(wan_tiny):
    plan = _plan(
        wan_tiny,
        "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.(0|2)']\nignore: ['blocks\\.1\\.ffn\\.2']\n",
    )
    assert _quantized(plan) == {"blocks.0.ffn.0.weight", "blocks.1.ffn.0.weight", "blocks.0.ffn.2.weight"}
    (cp,) = plan.components
    assert cp.pattern_matches["blocks\\.1\\.ffn\\.2"] == 1
    assert "blocks.1.ffn.2" in cp.kept_linears()


def test_ignore_pattern_matching_nothing_is_an_error(wan_tiny):
    with pytest.raises(InputError, match="ignore pattern 'head\\\\.proj' matches no module in component '.'"):
        _plan(wan_tiny, MINIMAL + "ignore: ['head\\.proj']\n")


@pytest.mark.parametrize(
    "target, tensor",
    [
        ("blocks\\.0\\.ffn\\.0\\.bias", "blocks.0.ffn.0.bias"),  # a bias
        ("blocks\\.0\\.norm3", "blocks.0.norm3.weight"),  # a norm (1-D)
        ("blocks\\.\\d+\\.modulation", "blocks.0.modulation"),  # a modulation table
        ("patch_embedding", "patch_embedding.weight"),  # a 5-D convolution
        ("blocks\\.0\\..*", "blocks.0.cross_attn.k.bias"),  # too broad: the first non-Linear it hits
    ],
)
def test_target_hitting_a_non_linear_tensor_is_named(wan_tiny, target, tensor):
    with pytest.raises(InputError, match=f"hits tensor '{tensor}'") as e:
        _plan(wan_tiny, f"format: fp8_channel\ntargets: ['{target}']\n")
    assert "not a 2-D Linear weight" in str(e.value)


def test_broad_target_is_fine_when_ignore_removes_the_non_linears(wan_tiny):
    plan = _plan(
        wan_tiny,
        "format: fp8_channel\ntargets: ['blocks\\.0\\..*']\nignore: ['.*\\.bias', '.*norm.*', '.*modulation']\n",
    )
    assert "blocks.0.self_attn.q.weight" in _quantized(plan)
    assert all(n.startswith("blocks.0.") for n in _quantized(plan))


def test_plan_reads_headers_only(wan_tiny):
    """Bytes read while planning (from /proc/self/io) stay far below the tensor data of the checkpoint."""
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("needs /proc/self/io")

    def rchar() -> int:
        return int(next(line for line in io.read_text().splitlines() if line.startswith("rchar:")).split()[1])

    data = sum(p.stat().st_size for p in wan_tiny.glob("*.safetensors"))
    before = rchar()
    plan = _plan(wan_tiny, MINIMAL)
    read = rchar() - before
    assert plan.output_bytes < plan.source_bytes
    assert read < data / 10, f"planning read {read} bytes of a {data}-byte checkpoint"


def test_missing_component_folder(wan_tiny):
    with pytest.raises(
        InputError, match="component folder 'transformer' named by the recipe is missing.*point at its parent"
    ):
        _plan(wan_tiny, MINIMAL + "components: [transformer]\n")


def test_local_file_first_then_bundled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_recipe("wan-fp8.yaml").origin == "bundled:wan-fp8.yaml"
    assert load_recipe("wan-fp8").origin == "bundled:wan-fp8.yaml"
    (tmp_path / "wan-fp8.yaml").write_text(MINIMAL)
    assert load_recipe("wan-fp8.yaml").origin == "wan-fp8.yaml"


def test_unknown_recipe_lists_the_bundled_ones():
    with pytest.raises(InputError) as e:
        load_recipe("wan-fp9.yaml")
    for name in bundled_recipes():
        assert name in str(e.value)


def test_every_bundled_recipe_is_valid_and_described():
    names = set(bundled_recipes())
    assert {
        "wan-fp8.yaml",
        "wan-fp8-all.yaml",
        "wan-diffusers-fp8.yaml",
        "wan2.2-a14b-fp8.yaml",
        "lingbot-world-fp8.yaml",
        "wan-comfy-fp8.yaml",
        "wan-comfy-fp8-all.yaml",
        "wan-comfy-int8.yaml",
        "wan-diffusers-comfy-fp8.yaml",
        "wan-diffusers-comfy-int8.yaml",
        "wan2.2-a14b-comfy-fp8.yaml",
        "wan2.2-a14b-comfy-int8.yaml",
        "wan-gguf-q8_0.yaml",
        "wan-gguf-q6_k.yaml",
        "wan-gguf-q5_k_m.yaml",
        "wan-gguf-q4_k_m.yaml",
        "wan-diffusers-gguf-q8_0.yaml",
        "wan-diffusers-gguf-q4_k_m.yaml",
        "wan2.2-a14b-gguf-q8_0.yaml",
        "wan2.2-a14b-gguf-q4_k_m.yaml",
    } <= names
    for name in names:
        r = load_recipe(name).recipe
        assert r.name == name.removesuffix(".yaml") and r.description
        assert r.checks.min_sqnr_db is not None


def test_overlapping_patterns_each_count_their_matches(wan_tiny):
    plan = _plan(
        wan_tiny, "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0', 'blocks\\.0\\.ffn\\.0']\n"
    )
    (cp,) = plan.components
    assert cp.pattern_matches == {"blocks\\.\\d+\\.ffn\\.0": 2, "blocks\\.0\\.ffn\\.0": 1}
    assert {t.pattern for t in cp.quantized()} == {"blocks\\.\\d+\\.ffn\\.0"}  # the first match decides


def test_a_recipe_that_quantizes_nothing_is_refused(wan_tiny):
    with pytest.raises(InputError, match="nothing would be quantized"):
        _plan(wan_tiny, MINIMAL + "ignore: ['blocks\\..*']\n")


def test_same_pattern_in_targets_and_ignore(wan_tiny):
    with pytest.raises(InputError, match="pattern 'blocks.*ffn.*0' is in both targets and ignore"):
        parse_recipe(MINIMAL + "ignore: ['blocks\\.\\d+\\.ffn\\.0']\n")


@pytest.mark.parametrize(
    "components, normalized",
    [(["a/", "./b"], ["a", "b"]), (["./"], ["."])],
)
def test_component_spellings_are_normalized(components, normalized):
    r = parse_recipe(MINIMAL + f"components: {components}\n")
    assert r.components == normalized


@pytest.mark.parametrize(
    "components, message",
    [
        (["high", "high/"], "listed twice"),
        (["a", "a/b"], "'a/b' lies inside component 'a'"),
        ([".", "x"], "inside component '.'"),
    ],
)
def test_duplicate_or_nested_components_are_refused(components, message):
    with pytest.raises(InputError, match=message):
        parse_recipe(MINIMAL + f"components: {components}\n")


def test_empty_ignore_is_an_empty_list():
    assert parse_recipe(MINIMAL + "ignore:\n").ignore == []


def test_unmatched_pattern_suggests_the_closest_module(wan_tiny):
    with pytest.raises(InputError, match="closest module name: 'blocks.[01].ffn.0'"):
        _plan(wan_tiny, "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.fnn\\.0']\n")


def test_recipes_command_never_reads_local_files(tmp_path):
    from tests.conftest import run_cli

    (tmp_path / "wan-fp8.yaml").write_text("")  # as `quantize recipes wan-fp8.yaml > wan-fp8.yaml` leaves it
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        shown = run_cli("recipes", "wan-fp8.yaml")
        listing = run_cli("recipes")
    finally:
        os.chdir(cwd)
    assert shown.returncode == 0 and "format: fp8_channel" in shown.stdout
    assert listing.returncode == 0 and "wan-fp8.yaml" in listing.stdout


@pytest.mark.parametrize("shape", [(0, 16), (16, 0)])
@pytest.mark.parametrize("fmt", ["fp8_channel", "comfy_fp8", "comfy_int8"])
def test_an_empty_weight_is_refused_at_plan_time_naming_it(tmp_path, shape, fmt):
    import torch
    from safetensors.torch import save_file

    tensors = {"blocks.0.ffn.0.weight": torch.zeros(shape), "head.modulation": torch.ones(1, 2, 16)}
    save_file(tensors, tmp_path / "m.safetensors")  # Wan-like names: the comfy formats' name table takes them
    with pytest.raises(InputError, match=r"tensor 'blocks.0.ffn.0.weight' F32\[.*\] is empty"):
        _plan(tmp_path, f"format: {fmt}\ntargets: ['blocks\\.0\\.ffn\\.0']\n")


@pytest.mark.parametrize(
    "text, message",
    [
        (MINIMAL + "type: Q8_0\n", "format fp8_channel has one encoding: 'type' and 'types' are for gguf"),
        ("format: gguf\ntargets: [a]\n", "format gguf needs 'type', one of Q8_0"),
        ("format: gguf\ntype: Q3_K\ntargets: [a]\n", "type: unknown gguf type 'Q3_K'"),
        (
            "format: gguf\ntype: Q4_K\ntypes: {'a': Q9}\ntargets: [a]\n",
            r"types\['a'\]: unknown gguf type 'Q9'",
        ),
        ("format: comfy_fp8\ntype: nvfp4\ntargets: [a]\n", "type: unknown comfy_fp8 type 'nvfp4'"),
        (
            "format: comfy_nvfp4\ntypes: {'a': Q4_K}\ntargets: [a]\n",
            r"types\['a'\]: unknown comfy_nvfp4 type 'Q4_K' \(known: nvfp4, mxfp8, float8_e4m3fn",
        ),
        (
            "format: gguf\ntype: Q4_K\ntypes: {'a(': Q6_K}\ntargets: [a]\n",
            "bad regular expression 'a\\(' in types",
        ),
    ],
)
def test_types_are_for_formats_that_have_them(text, message):
    with pytest.raises(InputError, match=message):
        parse_recipe(text, "my.yaml")


def test_a_types_pattern_must_match_and_the_first_match_decides(tmp_path):
    from quantize.examples import write_example

    src = write_example(tmp_path / "w", "small", "t2v")
    base = "format: gguf\ntype: Q4_K\ntargets: ['blocks\\.\\d+\\.ffn\\.(0|2)']\n"
    plan = _plan(src, base + "types: {'blocks\\.0\\.ffn\\.2': Q8_0, 'blocks\\.\\d+\\.ffn\\.2': Q6_K}\n")
    types = {t.name: t.qtype for t in plan.components[0].quantized()}
    assert types == {
        **{f"blocks.{i}.ffn.0.weight": "Q4_K" for i in range(4)},
        **{f"blocks.{i}.ffn.2.weight": "Q6_K" for i in range(1, 4)},
        "blocks.0.ffn.2.weight": "Q8_0",
    }
    with pytest.raises(InputError, match=r"recipe types pattern 'blocks\\\.9.* matches no module"):
        _plan(src, base + "types: {'blocks\\.9\\.ffn\\.2': Q6_K}\n")
    import yaml

    assert not {"type", "types"} & set(yaml.safe_load(dump_recipe(parse_recipe(MINIMAL))))  # as it always was
