"""Options several commands share: --recipe/--format, --lora/--lora-unmatched, --inputs."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from ..formats import FORMAT_INFO
from ..read.files import CHECKPOINT_SUFFIXES
from ._console import err, out

__all__ = ["recipe_options", "chosen_recipe", "chosen_encoder_recipes", "lora_options", "inputs_option"]


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


def chosen_recipe(source: str, recipe: str | None, fmt: str | None, *, to_stderr: bool = False) -> str:
    """--recipe as given, or the bundled recipe --format picks for SOURCE's layout (said in the first line; on
    stderr with `to_stderr`, where stdout is JSON)."""
    if (recipe is None) == (fmt is None):
        raise InputError("give --recipe RECIPE or --format FORMAT (one of them)")
    if recipe is not None:
        return recipe
    from ..read.detect import recipe_for_format

    folder = Path(source)
    if folder.exists() and not folder.is_dir() and not folder.name.endswith(CHECKPOINT_SUFFIXES):
        raise InputError(
            f"{source}: not a folder or a checkpoint file ({', '.join(CHECKPOINT_SUFFIXES)}): SOURCE is a model's "
            "folder or file (or a Hub repo id, with --recipe)"
        )
    if not folder.exists():
        raise InputError(
            f"{source}: no such folder or file; --format looks at a local one (for a Hub repo id, give --recipe: "
            "quantize recipes lists them)"
        )
    name, layout = recipe_for_format(folder, fmt)
    (err if to_stderr else out).print(f"recipe {name}: {layout.why}")
    return name


def chosen_encoder_recipes(source: str, recipe: str | None, fmt: str | None, copies: bool) -> dict[str, str]:
    """With --format on a local pipeline folder: each text encoder's folder -> the bundled recipe of that format
    for it (said a line each; an encoder without one is said to be copied as it is where the transformer's recipe
    copies the pipeline's other files, `copies`, else left out)."""
    if recipe is not None or fmt is None:
        return {}
    from ..models import get_family
    from ..read.detect import encoder_recipes

    chosen = {}
    for rel, (name, layout) in encoder_recipes(Path(source), fmt).items():
        if name is None:
            why = get_family(layout.family).why_no(fmt)
            fate = "copied as it is" if copies else "left out"
            out.print(f"{rel}/: no bundled {fmt} recipe for {layout.why}{f' ({why})' if why else ''}: {fate}")
        else:
            out.print(f"{rel}/: recipe {name}: {layout.why}")
            chosen[rel] = name
    return chosen


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
