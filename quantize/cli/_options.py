"""Options several commands share: --recipe/--format, --lora/--lora-unmatched, --inputs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import click

from ..errors import InputError
from ..formats import FORMAT_INFO
from ..read.files import CHECKPOINT_SUFFIXES
from ._console import err, out

__all__ = [
    "recipe_options",
    "Chosen",
    "chosen_recipe",
    "chosen_recipes",
    "outlined",
    "lora_options",
    "inputs_option",
]


def recipe_options(f):
    """--recipe RECIPE or --format FORMAT (resolved by `chosen_recipe`)."""
    f = click.option(
        "--format",
        "fmt",
        default=None,
        metavar="FORMAT",
        help="Instead of --recipe: the bundled recipe of this format for SOURCE's detected layout "
        f"({', '.join(FORMAT_INFO)}); the first line names it and why.",
    )(f)
    return click.option(
        "--recipe",
        "-r",
        "recipe",
        default=None,
        help="Recipe: a YAML file, or a bundled recipe name (see `quantize recipes`, `quantize recipes --for SOURCE`).",
    )(f)


class Chosen(NamedTuple):
    """What --recipe or --format chose: the recipe, and the nested conversions beside it (a pipeline's text
    encoders' folder -> its bundled recipe of that format)."""

    recipe: str
    nested: dict[str, str]


def check_recipe_or_format(recipe: str | None, fmt: str | None) -> None:
    """One of --recipe and --format (a known one), before anything is read or fetched."""
    if (recipe is None) == (fmt is None):
        raise InputError("give --recipe RECIPE or --format FORMAT (one of them)")
    if fmt is not None:
        from ..read.detect import check_format

        check_format(fmt)


def chosen_recipe(source: str, recipe: str | None, fmt: str | None, *, to_stderr: bool = False) -> str:
    """--recipe as given, or the bundled recipe --format picks for SOURCE's layout (said in the first line; on
    stderr with `to_stderr`, where stdout is JSON)."""
    return chosen_recipes(source, recipe, fmt, to_stderr=to_stderr, encoders=False).recipe


def chosen_recipes(
    source: str,
    recipe: str | None,
    fmt: str | None,
    *,
    to_stderr: bool = False,
    encoders: bool = True,
    folder: Path | None = None,
) -> Chosen:
    """--recipe as given; or with --format, the bundled recipe of that format for SOURCE's layout and, on a
    pipeline (with `encoders`), each text encoder's beside it, each said in a line (on stderr with `to_stderr`,
    where stdout is JSON). An encoder without one is said to be copied as it is where the transformer's recipe
    copies the pipeline's other files, else left out. SOURCE is a local folder or file, or a Hub repo id, whose
    layout is read off its outline (`read.hub.outline`: configs and safetensors headers, no weights); `folder`:
    what `outlined(source)` gave, where the caller holds it open."""
    check_recipe_or_format(recipe, fmt)
    if recipe is not None:
        return Chosen(recipe, {})
    if folder is None:
        with outlined(source) as folder:
            return chosen_recipes(source, recipe, fmt, to_stderr=to_stderr, encoders=encoders, folder=folder)
    from ..models import get_family
    from ..read.detect import encoder_recipes, recipe_for_format
    from ..recipes import load_recipe

    say = (err if to_stderr else out).print
    name, layout = recipe_for_format(folder, fmt)
    found = encoder_recipes(folder, fmt) if encoders else {}
    say(f"recipe {name}: {layout.why}")
    copies = bool(found) and load_recipe(name).recipe.copy_other_files
    nested = {}
    for rel, (encoder, lay) in found.items():
        if encoder is None:
            why = get_family(lay.family).why_no(FORMAT_INFO[fmt])
            fate = "copied as it is" if copies else "left out"
            say(f"{rel}/: no bundled {fmt} recipe for {lay.why}{f' ({why})' if why else ''}: {fate}")
        else:
            say(f"{rel}/: recipe {encoder}: {lay.why}")
            nested[rel] = encoder
    return Chosen(name, nested)


@contextmanager
def outlined(source: str, folders: Sequence[str] = ()) -> Iterator[Path]:
    """The folder (or file) whose configs and headers stand for SOURCE (what --format detects the layout of,
    `recipes --for` and `plan` plan on): SOURCE itself, or a Hub repo id's outline (`read.hub.outline`, with the
    model `folders` a recipe names at any depth)."""
    from ..read.hub import is_repo_id, outline

    path = Path(source)
    if path.exists() and not path.is_dir() and not path.name.endswith(CHECKPOINT_SUFFIXES):
        raise InputError(
            f"{source}: not a folder or a checkpoint file ({', '.join(CHECKPOINT_SUFFIXES)}): SOURCE is a model's "
            "folder or file, or a Hub repo id"
        )
    if path.exists():
        yield path
    elif is_repo_id(source):
        with outline(source, folders=folders) as folder:
            yield folder
    else:
        raise InputError(f"{source}: no such folder or file, and not a Hub repo id (org/name)")


def lora_options(f):
    """--lora [COMPONENT=]FILE[:STRENGTH] (repeatable) and --lora-unmatched."""
    f = click.option(
        "--lora-unmatched",
        type=click.Choice(["error", "ignore"]),
        default="error",
        show_default=True,
        help="A LoRA key that matches no tensor: stop (error), or skip it and list it in the manifest and card "
        "(ignore; e.g. an I2V LoRA's k_img/v_img on a T2V model).",
    )(f)
    return click.option(
        "--lora",
        "loras",
        multiple=True,
        metavar="[COMPONENT=]FILE[:STRENGTH]",
        help="Merge a LoRA (safetensors) into the source before quantizing; repeatable, applied in order; "
        "strength 1.0 unless given; COMPONENT= for one component folder only (one expert of two, say).",
    )(f)


def inputs_option(lead: str):
    """--inputs FILE: a forward pass's inputs captured from a pipeline (verify --forward, sensitivity)."""
    return click.option(
        "--inputs",
        type=click.Path(path_type=Path, exists=True, dir_okay=False),
        default=None,
        metavar="FILE",
        help=f"{lead} forward pass's inputs (latents, timestep, text embeddings) as safetensors "
        "[default: fixed random].",
    )
