"""`quantize recipes`: the bundled recipes, one's YAML, or those that fit a source folder."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ..errors import InputError, QuantizeError
from ._console import out
from ._render import print_table

__all__ = ["recipes_cmd"]


@click.command("recipes")
@click.argument("name", required=False)
@click.option(
    "--for",
    "source",
    default=None,
    metavar="SOURCE",
    help="Only the recipes that fit this source folder or file, or Hub repo id (its layout detected, each recipe "
    "planned on it; a repo's configs and safetensors headers are read, not its weights).",
)
def recipes_cmd(name: str | None, source: str | None) -> None:
    """List the bundled recipes, or print the YAML of one (to copy and edit)."""
    from ..recipes import bundled_names, bundled_recipe, bundled_text

    if name and source is not None:
        raise InputError(
            "give a recipe NAME (to print it) or --for SOURCE (to list those that fit), not both"
        )
    if name:
        click.echo(bundled_text(name), nl=False)
        return
    if source is not None:
        from ._options import outlined

        with outlined(source) as folder:
            _recipes_for(folder, source)
        return
    rows = []
    for file in bundled_names():
        r = bundled_recipe(file).recipe
        rows.append((file, r.format, ", ".join(r.components), r.description.strip().splitlines()[0]))
    print_table(
        "Bundled recipes (quantize recipes NAME prints one)",
        ("recipe", "format", "components", "what it is for"),
        rows,
    )


def _recipes_for(folder: Path, source: str) -> None:
    """The bundled recipes that plan on `folder` (SOURCE, or a Hub repo's outline), named as `source`."""
    from ..plan import make_plan
    from ..read.detect import DEFAULT_RECIPES, detect_layouts, unknown_class
    from ..recipes import bundled_names, bundled_recipe

    layouts = detect_layouts(folder)
    for lay in layouts:
        out.print(f"{escape(source)}: {lay.name} ({lay.why})")
    if not layouts:
        named = unknown_class(folder)
        out.print(f"{escape(source)}: no known layout{escape(named)}; trying every bundled recipe")
    defaults = {r: fmt for lay in layouts for fmt, r in DEFAULT_RECIPES[lay.name].items()}
    rows = []
    for file in bundled_names():
        r = bundled_recipe(file).recipe
        try:
            make_plan(folder, r)
        except QuantizeError:
            continue
        default = f"--format {defaults[r.name]}" if r.name in defaults else ""
        rows.append((file, r.format, default, r.description.strip().splitlines()[0]))
    if not rows:
        raise InputError(
            f"{source}: no bundled recipe fits it: write one (quantize recipes NAME prints one to start from)"
        )
    print_table(
        f"Bundled recipes that fit {escape(source)} (each one planned on it)",
        ("recipe", "format", "default for", "what it is for"),
        rows,
    )
