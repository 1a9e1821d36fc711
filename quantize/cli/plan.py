"""`quantize plan`: a dry run, what each tensor of SOURCE becomes under RECIPE, and the sizes."""

from __future__ import annotations

import click

from ._options import check_recipe_or_format, chosen_recipes, lora_options, outlined, recipe_options
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
    --format on a pipeline folder, its text encoders' too, as convert writes them beside the transformer). A Hub
    repo is planned on its outline: its configs, headers and tokenizers, none of its weights."""
    from ..containers import check_headers
    from ..plan import make_plan
    from ..read.files import DEFAULT_MAX_SHARD_SIZE
    from ..read.hub import is_repo_id, recipe_folders
    from ..read.source import local_source, nested_sources
    from ..recipes import load_recipe
    from ..steps.lora import open_loras

    check_recipe_or_format(recipe, fmt)
    given = None if recipe is None else load_recipe(recipe)
    folders = [] if given is None else recipe_folders(given.recipe)  # outlined at any depth
    with outlined(source, folders) as folder:
        chosen = chosen_recipes(source, recipe, fmt, folder=folder)
        loaded = given or load_recipe(chosen.recipe)
        encoders = {rel: load_recipe(name) for rel, name in chosen.nested.items()}
        beside = {rel: e.recipe for rel, e in encoders.items()}
        merge = open_loras(loras, lora_unmatched, loaded.recipe.components) if loras else None
        repo_id = source if is_repo_id(source) else None
        src = local_source(folder, loaded.recipe, repo_id, repo_id)
        plan = make_plan(src, loaded.recipe, steps=[merge] if merge else ())
        check_headers(plan, DEFAULT_MAX_SHARD_SIZE)
        print_plan(source, loaded.origin, plan, merge)
        for rel, nsrc in nested_sources(src, beside):
            nplan = make_plan(nsrc, encoders[rel].recipe)
            check_headers(nplan, DEFAULT_MAX_SHARD_SIZE)
            print_plan(f"{source.rstrip('/')}/{rel}", encoders[rel].origin, nplan, None)
