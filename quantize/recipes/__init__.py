"""Recipes: which Linears of which components become which format.

`schema` validates a recipe (YAML, unknown keys refused at every level); `derive` makes the bundled recipe of each
(layout, format) from the family's policy and the format's facts; `bundled` finds one by name, derived or one of
the curated files of ``recipes/``.

>>> r = parse_recipe("format: fp8_channel\\ntargets: ['blocks\\\\.\\\\d+\\\\.ffn\\\\.0']\\n")
>>> r.components, r.keep_dtype
(['.'], 'source')
"""

from .bundled import (
    bundled_names,
    bundled_recipe,
    bundled_recipes,
    bundled_text,
    curated_recipes,
    load_recipe,
)
from .derive import default_recipes, derived_names, derived_recipe, layout_formats, layout_policies
from .schema import Checks, LoadedRecipe, Recipe, dump_recipe, parse_recipe, recipe_yaml

__all__ = [
    "Recipe",
    "Checks",
    "LoadedRecipe",
    "parse_recipe",
    "load_recipe",
    "dump_recipe",
    "recipe_yaml",
    "bundled_names",
    "bundled_recipe",
    "bundled_recipes",
    "bundled_text",
    "curated_recipes",
    "default_recipes",
    "derived_names",
    "derived_recipe",
    "layout_formats",
    "layout_policies",
]
