"""`quantize convert`: SOURCE into OUTPUT following RECIPE, with progress and a summary."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.markup import escape

from ._console import err, progress_display, quiet_model_imports
from ._options import chosen_recipes, lora_options, recipe_options
from ._render import print_converted

__all__ = ["convert_cmd"]


@click.command("convert")
@click.argument("source")
@click.argument("output", type=click.Path(path_type=Path))
@recipe_options
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace OUTPUT if it exists (the old one stays until the new one is complete).",
)
@click.option(
    "--max-shard-size",
    default="5GB",
    show_default=True,
    help="Largest output shard (tensor bytes), e.g. 5GB, 500MB, 2GiB.",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Threads converting tensors in parallel [default: all cores]. Output is identical for any value.",
)
@click.option(
    "--base-model",
    default=None,
    help="Hub repo id the model card names as the base model [default: SOURCE when it is a repo id].",
)
@click.option(
    "--calibrate",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    metavar="INPUTS",
    help="Static activation scales (ComfyUI's input_scale) for the FP8 and NVFP4 layers, from the amax of each "
    "one's input in a streamed forward pass of the source on INPUTS (captured inputs, as --inputs takes them), "
    "and for the NVFP4 layers a per-input-channel smoothing (ComfyUI's pre_quant_scale, AWQ's rule) where it "
    "measures better on those inputs; prints the forward SQNR with them against dynamic scales.",
)
@lora_options
def convert_cmd(
    source: str,
    output: Path,
    recipe: str | None,
    fmt: str | None,
    overwrite: bool,
    max_shard_size: str,
    workers: int | None,
    base_model: str | None,
    loras: tuple[str, ...],
    lora_unmatched: str,
    calibrate: Path | None,
) -> None:
    """Convert the safetensors checkpoint SOURCE (a folder or a Hub repo id) into OUTPUT following RECIPE."""
    from ..process import tune_for_streaming
    from ..publish.converter import convert
    from ..read.files import parse_size
    from ..recipes import load_recipe

    max_bytes = parse_size(max_shard_size, "--max-shard-size")
    t0 = time.monotonic()
    chosen = chosen_recipes(source, recipe, fmt)  # with --format on a pipeline, its text encoders' too
    loaded = load_recipe(chosen.recipe)
    # every LoRA file read and checked (headers) before OUT is claimed: a bad one is refused before any work
    steps = []
    if loras:
        from ..steps.lora import open_loras

        steps = [open_loras(loras, lora_unmatched, loaded.recipe.components)]
    if calibrate is not None:
        quiet_model_imports()
    # started once torch is imported and planned
    progress = progress_display("convert", on_start=tune_for_streaming)
    try:
        manifest = convert(
            source,
            output,
            loaded,
            overwrite=overwrite,
            max_shard_size=max_bytes,
            workers=workers,
            progress=progress,
            base_model=base_model,
            steps=steps,
            on_recovery=_report_recovery,
            calibrate=calibrate,
            on_pass=None if calibrate is None else (lambda text: err.print(f"pass: {escape(text)}")),
            nested=chosen.nested,
        )
    finally:
        progress.stop()
    print_converted(output, manifest, time.monotonic() - t0)


def _report_recovery(step: str) -> None:
    err.print(f"convert: {escape(step)}, left by a conversion that was killed")
