"""`convert`: stream a source checkpoint through a recipe into a new, complete checkpoint directory.

Order of work (nothing is written before everything is validated), each stage entered once and handed what it
needs:
  1. the recipe is validated; OUT is claimed (one conversion at a time, leftovers of a killed run cleaned
     up) and checked (`output`); all before anything is downloaded or torch is imported, so a refusal is immediate;
  2. SOURCE is opened, once (`read.source`: a folder, or a Hub repo id of which only the files the recipe needs
     are fetched), and its files, the steps' and the calibration inputs start hashing in the background;
  3. the plan is made from headers alone, once (`plan`);
  4. with `calibrate`, the plan's static input scales are filled from a forward pass (`run.calibrate`);
  5. a temporary sibling directory is filled (`pipeline`): the components' files, copied files,
     recipe.yaml, the card (`card`, its facts from the plan and the source), and the manifest last, with every
     file's SHA-256;
  6. the temporary directory is renamed into place (`output`).

This module imports no torch: step 1 answers in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
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
    nested: Mapping[str, LoadedRecipe | str | Path] | None = None,
) -> Manifest:
    """Convert `source` (a folder, or a Hub repo id) into the checkpoint directory `out`; `recipe` is a loaded
    recipe, a file or a bundled name.

    base_model: the Hub repo id the card's metadata names as the base (default: `source` when it is a repo id).
    steps: per-tensor steps applied to the source values on the way in, in order (`steps.TensorStep`), such
        as the LoRAs merged before quantizing (`lora.open_loras`); each records itself in the manifest.
    on_recovery: told, one line each, what was cleaned up after a conversion into `out` that was killed.
    calibrate: a safetensors file of forward-pass inputs (`run.forward.load_inputs`): static input scales from the
        source's streamed forward on it, for each layer whose format stores one (`run.calibrate`), and a
        ``pre_quant_scale`` for each NVFP4 layer it measures better on (smoothing), with the forward SQNRs they
        give against dynamic scales, recorded in the manifest's `calibration`; each forward pass is told to
        `on_pass` (default: `progress.note`).
    nested: folder of SOURCE (local or from the Hub) -> the recipe converting it into OUT's folder of that name, a
        checkpoint of its own (its manifest, recipe.yaml and card), listed in OUT's manifest (`Manifest.nested`)
        and not copied: a pipeline's text encoders beside its transformer (`read.detect.encoder_recipes`), so that
        OUT is the whole pipeline diffusers loads.

    >>> # manifest = convert("Wan2.1-T2V-1.3B", "Wan2.1-T2V-1.3B-fp8", "wan-fp8.yaml", workers=2)
    >>> # manifest = convert("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "out", "wan-diffusers-fp8.yaml")
    >>> # manifest = convert("Wan2.1-T2V-1.3B", "out", "wan-fp8", steps=[open_loras(["style.safetensors:0.8"])])
    """
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    beside = {rel: r if isinstance(r, LoadedRecipe) else load_recipe(r) for rel, r in (nested or {}).items()}
    max_bytes = parse_size(max_shard_size, "max_shard_size")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise InputError(f"`workers` must be at least 1, got {workers}", parameters=("workers",))
    out = Path(out).absolute()
    inputs = None if calibrate is None else Path(calibrate)
    with claimed_output(Path(source), out, overwrite, report=on_recovery):
        from ..read.hashing import FileHasher
        from ..read.hub import recipe_files
        from ..read.source import nested_sources, open_source

        recipes = {rel: r.recipe for rel, r in beside.items()}
        # the one time SOURCE is opened (from the Hub: what the recipe and the nested ones read)
        src = open_source(source, loaded.recipe, recipe_files(loaded.recipe, recipes), absolute=True)
        check_output_location(src.path, out, overwrite)  # a Hub source resolves to its cached folder
        nested = [(rel, nsrc, beside[rel]) for rel, nsrc in nested_sources(src, recipes)]
        # what the conversion reads of the folder besides the components' headers, read now
        card_metadata, files = src.card_metadata(), src.files()
        files += [f for step in steps for f in step.inputs]
        with FileHasher(min(2, workers)) as hasher:
            for f in files:
                hasher.submit(f, background=True)  # while torch is imported, a core has nothing else to do
            if inputs is not None:
                from ..run.forward import require_known_models

                # headers only: a model we cannot run, inputs it does not take
                require_known_models(src, inputs)
                hasher.submit(inputs, background=True)
            return _convert(
                src, out, loaded, overwrite, max_bytes, workers, progress or NoProgress(),
                base_model or src.repo_id, card_metadata, steps, hasher, inputs, on_pass, nested,
            )  # fmt: skip


def _convert(
    src, out, loaded, overwrite, max_bytes, workers, progress, base_model, card_metadata, steps, hasher, inputs,
    on_pass, nested_sources,
):  # fmt: skip
    """Plan `src` once, fill the plan's input scales from `inputs` (the calibration step), and write the checkpoint
    into a staging directory published as `out`, the nested ones first, each into its folder."""
    from ..containers import check_headers
    from ..plan import make_plan
    from .card import CardFacts
    from .pipeline import Provenance, io_problem, write_checkpoint

    plan = make_plan(src, loaded.recipe, steps=steps)
    nested = [(rel, nsrc, make_plan(nsrc, nloaded.recipe), nloaded) for rel, nsrc, nloaded in nested_sources]
    for p in (plan, *(p for _, _, p, _ in nested)):
        check_headers(p, max_bytes)
    if nested:  # their folders are checkpoints of their own, not copies
        inside = tuple(nsrc.folder for _, nsrc, _, _ in nested)
        kept = tuple(f for f in plan.copied if not any(f.is_relative_to(d) for d in inside))
        plan = dataclasses.replace(plan, copied=kept)
    calibration = None
    if inputs is not None:
        from ..run.calibrate import calibrate

        plan, found = calibrate(plan, inputs, on_pass=on_pass or progress.note, workers=workers)
        calibration = _calibration_entry(found, inputs, hasher.submit(inputs).result())
    plans = [plan, *(p for _, _, p, _ in nested)]
    progress.start(sum(p.source_bytes for p in plans), sum(p.tensor_count for p in plans))
    facts = CardFacts.of(plan, base_model, card_metadata)
    with staging_dir(out) as tmp:
        try:
            for rel, nsrc, nplan, nloaded in nested:
                (tmp / rel).mkdir(parents=True)
                nfacts = CardFacts.of(nplan, base_model, card_metadata)
                provenance = Provenance(nloaded, nsrc.name, nfacts)
                write_checkpoint(nplan, tmp / rel, max_bytes, workers, progress, hasher, provenance)
            provenance = Provenance(loaded, src.name, facts, steps, calibration, [rel for rel, *_ in nested])
            manifest = write_checkpoint(plan, tmp, max_bytes, workers, progress, hasher, provenance)
            publish(tmp, out, overwrite)
        except OSError as e:
            raise _output_error(io_problem(e, out, "writing the output"), tmp, out) from None
        except ConversionError as e:
            raise _output_error(str(e), tmp, out) from None
    return manifest


def _calibration_entry(found, inputs: Path, sha256: str):
    """The manifest's record of a calibration (`run.calibrate.Calibration`) on the file `inputs`."""
    import math

    from .manifest import CalibrationEntry, ForwardFigures, InputScaleEntry, InputsEntry, SmoothingEntry

    def db(x: float) -> float | None:
        return None if math.isinf(x) else round(x, 3)

    def smoothing(key: str) -> SmoothingEntry | None:
        chosen = found.smoothing.get(key)
        if chosen is None:
            return None
        exponents = [math.frexp(p)[1] - 1 for p in chosen.scale]  # each p a power of two
        return SmoothingEntry(
            alpha=chosen.alpha,
            min_exponent=min(exponents),
            max_exponent=max(exponents),
            plain_sqnr_db=db(chosen.plain_sqnr_db),
            smoothed_sqnr_db=db(chosen.smoothed_sqnr_db),
        )

    return CalibrationEntry(
        inputs=InputsEntry(file=inputs.name, size=inputs.stat().st_size, sha256=sha256),
        tensors={
            key: InputScaleEntry(input_amax=found.amax[key], input_scale=scale, smoothing=smoothing(key))
            for key, scale in found.scales.items()
        },
        forward={
            rel: ForwardFigures(dynamic_sqnr_db=db(dynamic), static_sqnr_db=db(static))
            for rel, (dynamic, static) in found.forward_sqnr_db.items()
        },
        unsmoothed_static_sqnr_db={rel: db(v) for rel, v in found.unsmoothed_sqnr_db.items()},
    )


def _output_error(message: str, tmp: Path, out: Path) -> ConversionError:
    """A failed write, naming files where they would have been in OUT (the temporary directory is gone)."""
    return ConversionError(f"{message.replace(str(tmp), str(out))}; {out} is unchanged")
