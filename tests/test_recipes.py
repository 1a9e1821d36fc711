"""Recipes: validation errors name the field; types and components as a recipe spells them; bundled lookup.

How a plan applies a recipe (matching rules, every pattern must match): tests/test_plan.py.
"""

from __future__ import annotations

import pytest

from quantize.errors import InputError
from quantize.names import module_name as match_key
from quantize.recipes import bundled_recipes, dump_recipe, load_recipe, parse_recipe
from tests.helpers.recipes import MINIMAL


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
            "field 'format': unknown format 'int3' \\(known: comfy_fp8, comfy_int8, comfy_mxfp8, comfy_nvfp4, comfy_w4a4, "
            "comfy_w4a8, fp8_channel, gguf, nf4, torchao_fp8, torchao_int8\\)",
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


def test_local_file_first_then_bundled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_recipe("wan-fp8.yaml").origin == "bundled:wan-fp8.yaml"
    assert load_recipe("wan-fp8").origin == "bundled:wan-fp8.yaml"
    (tmp_path / "wan-fp8.yaml").write_text(MINIMAL)
    assert load_recipe("wan-fp8.yaml").origin == "wan-fp8.yaml"


def test_unknown_recipe_names_the_closest_bundled_ones():
    with pytest.raises(InputError) as e:
        load_recipe("wan-fp9.yaml")
    assert "did you mean wan-fp8.yaml" in str(e.value)
    assert f"quantize recipes lists the {len(bundled_recipes())} bundled ones" in str(e.value)


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
