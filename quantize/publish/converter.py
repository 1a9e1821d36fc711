"""`convert`: stream a source checkpoint through a recipe into a new, complete checkpoint directory.

Order of work (nothing is written before everything is validated):
  1. the recipe is validated; OUT is claimed (one conversion at a time, leftovers of a killed run cleaned
     up) and checked; all before anything is downloaded or torch is imported, so a refusal is immediate;
  2. SOURCE is resolved (a folder, or a Hub repo id: only the files the recipe needs are fetched) and its
     files start hashing in the background;
  3. the plan is made from headers alone;
  4. a temporary sibling directory is filled (`pipeline`): the components' files, copied files,
     recipe.yaml, the card, and the manifest last, with every file's SHA-256;
  5. the temporary directory is renamed into place.

This module imports no torch: step 1 answers in a fraction of a second.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConversionError, InputError
from ..progress import NoProgress, Progress
from ..read.files import DEFAULT_MAX_SHARD_SIZE, parse_size
from ..recipes import LoadedRecipe, load_recipe
from .output import check_output_location, claimed_output, publish, staging_dir

if TYPE_CHECKING:
    from ..steps import TensorStep
    from .manifest import Manifest

__all__ = ["convert", "Progress", "parse_size", "DEFAULT_MAX_SHARD_SIZE"]


def convert(
    source: str | Path,
    out: str | Path,
    recipe: LoadedRecipe | str | Path,
    *,
    overwrite: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    workers: int | None = None,
    progress: Progress | None = None,
    base_model: str | None = None,
    steps: Sequence[TensorStep] = (),
    on_recovery: Callable[[str], None] | None = None,
    calibrate: str | Path | None = None,
    on_pass: Callable[[str], None] | None = None,
) -> Manifest:
    """Convert `source` (a folder, or a Hub repo id) into the checkpoint directory `out`; `recipe` is a loaded
    recipe, a file or a bundled name.

    base_model: the Hub repo id the card's metadata names as the base (default: `source` when it is a repo id).
    steps: per-tensor steps applied to the source values on the way in, in order (`steps.TensorStep`), such
        as the LoRAs merged before quantizing (`lora.open_loras`); each records itself in the manifest.
    on_recovery: told, one line each, what was cleaned up after a conversion into `out` that was killed.
    calibrate: a safetensors file of forward-pass inputs (`run.forward.load_inputs`): static input scales from the
        source's streamed forward on it, for each layer whose format stores one (`run.calibrate`), with the forward
        SQNRs they give against dynamic scales, recorded in the manifest's `calibration`; each forward pass is told
        to `on_pass` (default: `progress.note`).

    >>> # manifest = convert("Wan2.1-T2V-1.3B", "Wan2.1-T2V-1.3B-fp8", "wan-fp8.yaml", workers=2)
    >>> # manifest = convert("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "out", "wan-diffusers-fp8.yaml")
    >>> # manifest = convert("Wan2.1-T2V-1.3B", "out", "wan-fp8", steps=[open_loras(["style.safetensors:0.8"])])
    """
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    max_bytes = parse_size(max_shard_size, "max_shard_size")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise InputError(f"`workers` must be at least 1, got {workers}", parameters=("workers",))
    out = Path(out).absolute()
    with claimed_output(Path(source), out, overwrite, report=on_recovery):
        from ..read.hashing import FileHasher
        from ..read.source import open_source

        src = open_source(source, loaded.recipe, absolute=True)
        check_output_location(src.folder, out, overwrite)  # a Hub source resolves to its cached folder
        with FileHasher(min(2, workers)) as hasher:
            for f in src.files():
                hasher.submit(f, background=True)  # while torch is imported, a core has nothing else to do
            return _convert(
                src, out, loaded, overwrite, max_bytes, workers, progress or NoProgress(),
                base_model or src.repo_id, steps, hasher, None if calibrate is None else Path(calibrate), on_pass,
            )  # fmt: skip


def _convert(
    src, out, loaded, overwrite, max_bytes, workers, progress, base_model, steps, hasher, calibrate, on_pass
):
    from ..plan import make_plan
    from .card import CardFacts, pipeline_tag, source_card_metadata
    from .pipeline import Provenance, io_problem, write_checkpoint

    for step in steps:
        for f in step.inputs:
            hasher.submit(f, background=True)
    if calibrate is not None:
        from ..run.forward import require_known_models

        require_known_models(src, calibrate)  # headers only: a model we cannot run, inputs it does not take
        hasher.submit(calibrate, background=True)
    plan = make_plan(src, loaded.recipe, steps=steps)
    calibration = None
    if calibrate is not None:
        plan, calibration = _calibrated(plan, calibrate, hasher, on_pass or progress.note, workers)
    progress.start(plan.source_bytes, plan.tensor_count)
    facts = CardFacts(
        classes={cp.rel: (cp.component.config or {}).get("_class_name") for cp in plan.components},
        pipeline_tag=pipeline_tag([cp.component.config for cp in plan.components]),
        base_model=base_model,
        source_metadata=source_card_metadata(src.folder),
        family=next((cp.family for cp in plan.components if cp.family is not None), None),
    )
    with staging_dir(out) as tmp:
        try:
            provenance = Provenance(loaded, src.name, facts, steps, calibration)
            manifest = write_checkpoint(plan, tmp, max_bytes, workers, progress, hasher, provenance)
            publish(tmp, out, overwrite)
        except OSError as e:
            raise _output_error(io_problem(e, out, "writing the output"), tmp, out) from None
        except ConversionError as e:
            raise _output_error(str(e), tmp, out) from None
    return manifest


def _calibrated(plan, inputs: Path, hasher, on_pass, workers):
    """`plan` with the static input scales of a calibration pass on `inputs`, and the manifest's record of them."""
    import math

    from ..run.calibrate import calibrate
    from .manifest import CalibrationEntry, ForwardFigures, InputScaleEntry, InputsEntry

    plan, found = calibrate(plan, inputs, on_pass=on_pass, workers=workers)
    scales = {cp.manifest_key(tp): tp.options.input_scale for cp in plan.components for tp in cp.quantized()}

    def db(x: float) -> float | None:
        return None if math.isinf(x) else round(x, 3)

    entry = CalibrationEntry(
        inputs=InputsEntry(
            file=inputs.name, size=inputs.stat().st_size, sha256=hasher.submit(inputs).result()
        ),
        tensors={
            key: InputScaleEntry(input_amax=found.amax[key], input_scale=scales[key]) for key in found.scaled
        },
        forward={
            rel: ForwardFigures(dynamic_sqnr_db=db(dynamic), static_sqnr_db=db(static))
            for rel, (dynamic, static) in found.forward_sqnr_db.items()
        },
    )
    return plan, entry


def _output_error(message: str, tmp: Path, out: Path) -> ConversionError:
    """A failed write, naming files where they would have been in OUT (the temporary directory is gone)."""
    return ConversionError(f"{message.replace(str(tmp), str(out))}; {out} is unchanged")
