"""`quantize sensitivity`: how much each quantized Linear hurts the output, and the recipe that raises the
most sensitive ones."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import click
from rich.markup import escape

from ..errors import InputError
from ._console import err, quiet_model_imports
from ._options import chosen_recipe, inputs_option, lora_options, recipe_options
from ._render import print_sensitivity, sensitivity_json

__all__ = ["sensitivity_cmd"]


@click.command("sensitivity")
@click.argument("source")
@recipe_options
@inputs_option("The")
@click.option(
    "--min-forward-sqnr",
    type=float,
    default=None,
    metavar="DB",
    help="Propose the smallest raise of the most sensitive layers whose measured forward SQNR reaches DB.",
)
@click.option(
    "--max-size",
    default=None,
    metavar="SIZE",
    help="Propose the best measured forward SQNR whose files fit SIZE on disk (e.g. 11GB for a 12 GB GPU).",
)
@click.option(
    "--write-recipe",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write the proposed recipe to FILE (with --min-forward-sqnr or --max-size).",
)
@click.option("--overwrite", is_flag=True, help="Replace the --write-recipe FILE if it exists.")
@click.option("--top", type=int, default=25, show_default=True, help="Layers shown in the table (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print every layer and the figures as JSON.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Threads encoding each weight's row chunks [default: all cores]. The figures are the same for any value.",
)
@lora_options
def sensitivity_cmd(
    source: str,
    recipe: str | None,
    fmt: str | None,
    inputs: Path | None,
    min_forward_sqnr: float | None,
    max_size: str | None,
    write_recipe: Path | None,
    overwrite: bool,
    top: int,
    as_json: bool,
    workers: int | None,
    loras: tuple[str, ...],
    lora_unmatched: str,
) -> int:
    """Measure how much each quantized Linear of SOURCE hurts the output under RECIPE (one streamed forward pass),
    and with --min-forward-sqnr or --max-size propose the recipe that raises the most sensitive ones.

    \b
    A Wan2.1 14B that fits a 12 GB card: one ComfyUI file, W4A8 but for the layers that hurt most (int8, ConvRot),
    the best forward SQNR measured within 11 GB on disk, then converted and proved:
      quantize sensitivity ./Wan2.1-T2V-14B --recipe wan-comfy-w4a8 --max-size 11GB --write-recipe wan-12gb.yaml
      quantize convert ./Wan2.1-T2V-14B ./Wan2.1-T2V-14B-12gb --recipe wan-12gb.yaml
      quantize verify ./Wan2.1-T2V-14B-12gb --source ./Wan2.1-T2V-14B --forward
    """
    from ..plan import make_plan
    from ..read.files import parse_size
    from ..read.source import open_source
    from ..recipes import dump_recipe, load_recipe, parse_recipe
    from ..run.sensitivity import measure, propose
    from ..steps.lora import open_loras

    if min_forward_sqnr is not None and max_size is not None:
        raise InputError("give --min-forward-sqnr or --max-size, not both")
    proposing = min_forward_sqnr is not None or max_size is not None
    if write_recipe is not None and not proposing:
        raise InputError("--write-recipe writes a proposal: give --min-forward-sqnr DB or --max-size SIZE")
    if write_recipe is not None and write_recipe.exists() and not overwrite:
        raise InputError(f"{write_recipe}: exists; pass --overwrite to replace it")
    if write_recipe is not None and not write_recipe.absolute().parent.is_dir():
        raise InputError(f"{write_recipe}: its folder does not exist; create it first")
    if min_forward_sqnr is not None and not math.isfinite(min_forward_sqnr):
        raise InputError(f"--min-forward-sqnr {min_forward_sqnr}: give a finite figure in dB, such as 30")
    max_bytes = parse_size(max_size, "--max-size") if max_size is not None else None
    loaded = load_recipe(chosen_recipe(source, recipe, fmt, to_stderr=as_json))

    def steps() -> list:  # the LoRAs merged into the source (a fresh merge for each plan)
        return [open_loras(loras, lora_unmatched, loaded.recipe.components)] if loras else []

    steps()  # a bad LoRA fails before anything is fetched
    src = open_source(source, loaded.recipe)
    from ..process import tune_for_streaming
    from ..run.forward import require_known_models

    quiet_model_imports()
    require_known_models(src, inputs)
    tune_for_streaming()
    plan = make_plan(src, loaded.recipe, steps=steps())
    t0 = time.monotonic()
    measured = measure(
        plan,
        inputs=inputs,
        all_rungs=proposing,
        on_pass=lambda text: err.print(f"pass: {escape(text)}"),
        workers=workers,
    )
    proposal = (
        propose(measured, min_forward_sqnr_db=min_forward_sqnr, max_bytes=max_bytes) if proposing else None
    )
    elapsed = time.monotonic() - t0
    written = None
    if proposal is not None and proposal.reached and write_recipe is not None:
        text = dump_recipe(proposal.recipe)
        make_plan(src, parse_recipe(text, str(write_recipe)), steps=steps())  # valid, and plans here
        _write_text_atomically(write_recipe, text)
        written = write_recipe
    if as_json:
        click.echo(json.dumps(sensitivity_json(measured, proposal, written), indent=2))
    else:
        print_sensitivity(measured, proposal, written, top, loaded.origin, elapsed)
    if proposal is not None and not proposal.reached:
        return 1
    return 0


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write the recipe: {e}") from None
