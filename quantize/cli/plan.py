"""`quantize plan`: a dry run, what each tensor of SOURCE becomes under RECIPE, and the sizes."""

from __future__ import annotations

import click

from ._options import chosen_encoder_recipes, chosen_recipe, lora_options, recipe_options
from ._render import print_plan

__all__ = ["plan_cmd"]


@click.command("plan")
@click.argument("source")
@recipe_options
@lora_options
def plan_cmd(
    source: str, recipe: str | None, fmt: str | None, loras: tuple[str, ...], lora_unmatched: str
) -> None:
    """Dry run: what each tensor of SOURCE (a folder or a Hub repo id) becomes under RECIPE, and the sizes (with
    --format on a pipeline folder, its text encoders' too, as convert writes them beside the transformer)."""
    from ..containers import check_headers
    from ..plan import make_plan
    from ..read.files import DEFAULT_MAX_SHARD_SIZE
    from ..read.source import open_source
    from ..recipes import load_recipe
    from ..steps.lora import open_loras

    loaded = load_recipe(chosen_recipe(source, recipe, fmt))
    nested = chosen_encoder_recipes(source, recipe, fmt, loaded.recipe.copy_other_files)
    merge = open_loras(loras, lora_unmatched, loaded.recipe.components) if loras else None
    plan = make_plan(open_source(source, loaded.recipe), loaded.recipe, steps=[merge] if merge else ())
    check_headers(plan, DEFAULT_MAX_SHARD_SIZE)
    print_plan(source, loaded.origin, plan, merge)
    for rel, name in nested.items():
        encoder = load_recipe(name)
        where = f"{source.rstrip('/')}/{rel}"
        nplan = make_plan(open_source(where, encoder.recipe), encoder.recipe)
        check_headers(nplan, DEFAULT_MAX_SHARD_SIZE)
        print_plan(where, encoder.origin, nplan, None)
