"""Bundled recipes derived from each family's policy and each format's facts (`quantize.recipes.derive`).

What holds: every name the recipe files of stop 49 had still resolves; the printed YAML of every bundled recipe
parses back to it; a worked example in ``recipes/`` is its derived recipe; ``recipes/`` stays small; a format's
facts (block scaling, sensitive type, checks) reach every layout's recipe the same way.
"""

from __future__ import annotations

import pytest

from quantize.errors import InputError
from quantize.formats import FORMAT_INFO
from quantize.models import FAMILIES, Policy
from quantize.recipes import (
    bundled_names,
    bundled_recipe,
    bundled_text,
    curated_recipes,
    default_recipes,
    derived_names,
    derived_recipe,
    layout_formats,
    layout_policies,
    parse_recipe,
)
from tests.conftest import run_cli

#: the bundled recipes of stop 49 (237 YAML files, one per name): each still resolves, derived or curated
STOP_49 = {
    "clip-text": "fp8 nf4 torchao-fp8 torchao-int8",
    "clip-text-single": "fp8 nf4 torchao-fp8 torchao-int8",
    "clip-vision": "fp8 nf4 torchao-fp8 torchao-int8",
    "clip-vision-single": "fp8 nf4 torchao-fp8 torchao-int8",
    "gemma3": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 nf4 torchao-fp8 torchao-int8",
    "gemma3-single": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 nf4 torchao-fp8 torchao-int8",
    "hunyuanvideo15": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "hunyuanvideo15-diffusers": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 "
    "torchao-int8",
    "kandinsky5": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 nf4 torchao-fp8 torchao-int8",
    "kandinsky5-original": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 nf4 torchao-fp8 torchao-int8",
    "lingbot-world": "fp8 nf4",
    "ltx2": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "ltx2-diffusers": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "minimax-h3": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 nf4 torchao-fp8 torchao-int8",
    "minimax-h3-diffusers": "fp8 nf4 torchao-fp8 torchao-int8",
    "qwen25vl": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "qwen25vl-single": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "qwen25vl-text": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "skyreels-v2": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "skyreels-v2-diffusers": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 "
    "torchao-int8",
    "t5": "fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "t5-single": "fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "umt5": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "umt5-single": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "wan": "comfy-fp8 comfy-fp8-all comfy-int8 comfy-int8-convrot comfy-mxfp8 comfy-nvfp4 fp8 fp8-all gguf-q4_k_m "
    "gguf-q5_k_m gguf-q6_k gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "wan-animate": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "wan-animate-diffusers": "fp8 nf4 torchao-fp8 torchao-int8",
    "wan-diffusers": "comfy-fp8 comfy-int8 comfy-int8-convrot comfy-mxfp8 comfy-nvfp4 fp8 gguf-q4_k_m gguf-q8_0 nf4 "
    "torchao-fp8 torchao-int8",
    "wan-vace": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "wan-vace-diffusers": "comfy-fp8 comfy-int8 comfy-mxfp8 comfy-nvfp4 fp8 gguf-q8_0 nf4 torchao-fp8 torchao-int8",
    "wan2.2-a14b": "comfy-fp8 comfy-int8 comfy-int8-convrot comfy-mxfp8 comfy-nvfp4 fp8 gguf-q4_k_m gguf-q8_0",
    "wan2.2-a14b-diffusers": "fp8",
}
STOP_49_NAMES = sorted(f"{layout}-{suffix}.yaml" for layout, s in STOP_49.items() for suffix in s.split())


def test_stop_49_had_237_names_and_each_still_resolves():
    assert len(STOP_49_NAMES) == 237
    assert set(STOP_49_NAMES) <= set(bundled_names())
    for name in STOP_49_NAMES:
        assert bundled_recipe(name).recipe.name == name.removesuffix(".yaml")


def test_recipes_folder_keeps_only_what_is_not_derived():
    curated = curated_recipes()
    assert len(curated) <= 40
    derived = {f"{n}.yaml" for n in derived_names()}
    examples = set(curated) & derived
    assert examples, "at least one worked example (wan-fp8.yaml, which the README's first command uses)"
    assert "wan-fp8.yaml" in examples


@pytest.mark.parametrize("name", sorted(set(curated_recipes()) & {f"{n}.yaml" for n in derived_names()}))
def test_a_worked_example_is_its_derived_recipe(name):
    """A file of recipes/ named as a derived recipe is that recipe, word for word, to copy."""
    layout, fmt = derived_names()[name.removesuffix(".yaml")]
    assert parse_recipe(curated_recipes()[name]) == derived_recipe(layout, fmt)


def test_every_printed_recipe_parses_back_to_itself():
    for name in bundled_names():
        assert parse_recipe(bundled_text(name), name) == bundled_recipe(name).recipe, name


def test_recipes_cli_prints_a_derived_recipe_that_converts_as_the_name_does(tmp_path):
    text = run_cli("recipes", "wan2.2-a14b-nf4", check=True).stdout
    assert parse_recipe(text) == bundled_recipe("wan2.2-a14b-nf4").recipe
    assert text.startswith("name: wan2.2-a14b-nf4\ndescription: |\n")


@pytest.mark.parametrize("layout", sorted(layout_policies()))
def test_a_layout_has_every_format_its_family_and_policy_allow(layout):
    family, policy = layout_policies()[layout]
    for fmt, why in layout_formats(layout).items():
        info = FORMAT_INFO[fmt]
        if why is None:
            recipe = derived_recipe(layout, fmt)
            assert recipe.name == f"{layout}-{info.recipe_suffix}"
            assert recipe.format == fmt and recipe.description.startswith(policy.what)
            assert default_recipes()[layout][fmt] == recipe.name
        else:
            assert why == (family.why_no(info) or policy.refusal(fmt, info.names))
            with pytest.raises(InputError, match=f"layout {layout} has no bundled {fmt} recipe"):
                derived_recipe(layout, fmt)


@pytest.mark.parametrize("layout", sorted(layout_policies()))
def test_the_format_facts_reach_every_layout_alike(layout):
    """Block-scaled formats take the block targets, NVFP4 stores the sensitive layers as MXFP8, GGUF gets Q8_0,
    diffusers-layout outputs copy the pipeline's other files where the policy says, checks start at the format's."""
    family, policy = layout_policies()[layout]
    for fmt in default_recipes()[layout]:
        info, recipe = FORMAT_INFO[fmt], derived_recipe(layout, fmt)
        assert tuple(recipe.targets) == policy.targets_for(fmt, info.block_scaled)
        if fmt not in policy.exceptions and info.block_scaled and policy.block_targets:
            assert tuple(recipe.targets) == policy.block_targets
        assert recipe.types == (
            dict.fromkeys(policy.sensitive, info.sensitive_type) if info.sensitive_type else {}
        )
        assert recipe.type == info.recipe_type
        assert recipe.copy_other_files == (policy.copy_other_files and info.diffusers_layout)
        assert recipe.components == list(policy.components or ["."])
        checks = recipe.checks.model_dump(exclude_none=True)
        expected = (
            dict(info.checks) | dict(family.recipe_checks.get(fmt, {})) | dict(policy.checks.get(fmt, {}))
        )
        assert checks == expected


def test_every_family_declares_its_layouts_once():
    declared = [layout for f in FAMILIES for layout in f.policies]
    assert len(declared) == len(set(declared)) == len(layout_policies())
    assert all(isinstance(p, Policy) for f in FAMILIES for p in f.policies.values())


def test_a_new_format_fact_changes_every_layout_at_once(monkeypatch):
    """The format decides its checks for every layout: nothing per recipe to edit."""
    import dataclasses

    from quantize.recipes import derive

    info = dataclasses.replace(
        FORMAT_INFO["fp8_channel"], checks=(("min_sqnr_db", 31.0), ("min_cosine", 0.9))
    )
    monkeypatch.setitem(FORMAT_INFO, "fp8_channel", info)
    derive.derived_recipe.cache_clear()
    try:
        for layout, by_format in default_recipes().items():
            if "fp8_channel" in by_format:
                assert derived_recipe(layout, "fp8_channel").checks.min_sqnr_db == 31.0
    finally:
        derive.derived_recipe.cache_clear()


def test_an_unknown_name_suggests_the_closest():
    with pytest.raises(InputError, match="did you mean wan2.2-a14b-nf4.yaml"):
        bundled_recipe("wan2.2-a14b-nf5")
