"""Recipe texts the recipe and plan tests share, the bundled recipes `quantize recipes --for` lists, and a bundled
recipe changed as a user would edit its YAML."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

#: the smallest valid recipe: one format, one target (blocks' ffn.0), every other field its default
MINIMAL = "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n"


def edited_recipe(name: str, **changes) -> str:
    """The YAML of bundled recipe `name` with `changes` made to its fields (`format`, `type`, `targets`, ...), checked
    as any recipe is: what a user writes after ``quantize recipes NAME``."""
    from quantize.recipes import dump_recipe, load_recipe

    recipe = load_recipe(name).recipe
    return dump_recipe(type(recipe).model_validate(recipe.model_dump() | changes))


def listed_recipes(source: Path) -> list[str]:
    """The bundled recipes (file names) `quantize recipes --for SOURCE` lists as fitting it, sorted."""
    listed = run_cli("recipes", "--for", source, check=True).stdout
    return sorted(line.split("│")[1].strip() for line in listed.splitlines() if ".yaml" in line)
