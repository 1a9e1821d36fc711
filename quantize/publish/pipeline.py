"""One conversion run, once the output is claimed and the plan made: every component through its container,
then the copied files, recipe.yaml, the card and the manifest, into the staging directory.

plan (headers only) -> source (`TensorPlan.source`, steps applied) -> encode (`encode`, the format's numerics)
-> container (`containers`: the files of a component) -> publish (`converter`: manifest last, atomic rename).
Tensors are converted in parallel, each written at its place in its file; every finished file is hashed and
flushed to disk while the next one is converted.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import platform
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from .. import __version__
from ..containers import TensorWriter, WrittenFile, get_container, write_file
from ..encode import copy_unchanged, encode_and_measure, kept_rows
from ..errors import ConversionError, InputError
from ..formats import Format, format_info
from ..plan import ComponentPlan, Plan, TensorPlan
from ..progress import Progress
from ..read.files import CARD_NAME, MANIFEST_NAME, RECIPE_NAME
from ..read.hashing import FileHasher
from ..recipes import LoadedRecipe, dump_recipe
from ..steps import TensorStep
from .card import CardFacts, render_card
from .manifest import (
    CalibrationEntry,
    ComponentEntry,
    FileEntry,
    Manifest,
    RecipeEntry,
    TensorEntry,
)
from .output import NO_SPACE_ERRNOS, fsync_path

__all__ = ["write_checkpoint", "Provenance", "write_tensor", "io_problem"]


def io_problem(e: OSError, fallback: Path, doing: str) -> str:
    """An OSError as one line: the file, what failed, what was being done, and what to do about a full disk."""
    message = f"{e.filename or fallback}: {e.strerror or e} ({doing})"
    if e.errno in NO_SPACE_ERRNOS:
        message += ": free some space, or pick another disk, and run it again"
    return message


@dataclass
class _Work:
    """Shared state of one conversion: the converting pool, the file hasher, the files left to flush.

    Source files are hashed in the background (see `hashing`); each output file is hashed, and flushed
    to disk, as soon as it is complete, while the next one is converted and the source hashing ends.
    """

    pool: ThreadPoolExecutor
    hasher: FileHasher
    syncer: ThreadPoolExecutor  # fsync of finished files
    progress: Progress
    syncs: list[Future] = field(default_factory=list)

    def hash_later(self, path: Path, background: bool = False) -> Future:
        return self.hasher.submit(path, background)

    def sync_later(self, path: Path) -> None:
        self.syncs.append(self.syncer.submit(fsync_path, path))

    def synced(self) -> None:
        for f in self.syncs:
            f.result()

    def file_entries(self, root: Path, files: list[Path]) -> list[FileEntry]:
        futures = [
            (f, self.hash_later(f)) for f in sorted(set(files), key=lambda p: p.relative_to(root).as_posix())
        ]
        return [
            FileEntry(path=f.relative_to(root).as_posix(), size=f.stat().st_size, sha256=h.result())
            for f, h in futures
        ]


@dataclass(frozen=True)
class Provenance:
    """What the manifest and the card record beside the plan: where the recipe and the source came from, and
    what was done to the source."""

    loaded: LoadedRecipe  # the recipe, with where it was loaded from
    source_name: str  # the manifest's name for the source
    facts: CardFacts  # what the card says of the source model
    #: the plan's per-tensor steps, each recording itself in the manifest (`TensorStep.record`)
    steps: Sequence[TensorStep] = ()
    #: the record of the static input scales the plan holds (`convert --calibrate`)
    calibration: CalibrationEntry | None = None
    #: folders already written into the staging directory as checkpoints of their own (`Manifest.nested`)
    nested: Sequence[str] = ()


@dataclass(frozen=True)
class _Components:
    """What writing the components gave: the manifest's entries, and the model files the card names."""

    entries: list[ComponentEntry]
    tensors: dict[str, TensorEntry]
    model_files: list[str]


def write_checkpoint(
    plan: Plan,
    tmp: Path,
    max_bytes: int,
    workers: int,
    progress: Progress,
    hasher: FileHasher,
    provenance: Provenance,
) -> Manifest:
    """Fill the staging directory `tmp` with the whole checkpoint of `plan`; returns its manifest.
    `hasher` may already be hashing the source's files (each file is hashed once)."""
    with _working(workers, hasher, progress) as work:
        source_files = [f for cp in plan.components for f in cp.component.own_files()] + list(plan.copied)
        for f in source_files:
            work.hash_later(f, background=True)  # hashed while the tensors are converted
        written = _write_components(plan, tmp, max_bytes, work)
        _copy_files(plan, tmp, work)
        recipe_text = dump_recipe(plan.recipe)
        write_file(tmp / RECIPE_NAME, recipe_text)
        progress.note(f"hashing {len(source_files)} source files and the output")
        manifest = _manifest(plan, provenance, written, source_files, recipe_text, tmp, work)
        card = render_card(manifest, dataclasses.replace(provenance.facts, model_files=written.model_files))
        write_file(tmp / CARD_NAME, card)  # from everything but the output hashes
        return _write_manifest(manifest, tmp, work)


@contextmanager
def _working(workers: int, hasher: FileHasher, progress: Progress) -> Iterator[_Work]:
    """The conversion's pools, shut down on the way out, and torch's thread count put back."""
    saved_threads = torch.get_num_threads()
    work = _Work(
        pool=ThreadPoolExecutor(
            workers, thread_name_prefix="quantize", initializer=torch.set_num_threads, initargs=(1,)
        ),
        hasher=hasher,
        syncer=ThreadPoolExecutor(1, thread_name_prefix="fsync"),
        progress=progress,
    )
    try:
        yield work
    finally:
        for pool in (work.pool, work.syncer):
            pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(saved_threads)


def _write_components(plan: Plan, tmp: Path, max_bytes: int, work: _Work) -> _Components:
    """Every component's files, one component after another."""
    tensors: dict[str, TensorEntry] = {}
    entries, model_files = [], []
    for cp in plan.components:
        component_tensors, written = _write_component(cp, plan, tmp, max_bytes, work)
        tensors.update(component_tensors)
        entries.append(_component_entry(cp, sum(w.data_bytes for w in written)))
        model_files += [(Path(cp.rel) / w.file.name).as_posix() for w in written]
    return _Components(entries, tensors, model_files)


def _manifest(
    plan: Plan,
    provenance: Provenance,
    written: _Components,
    source_files: list[Path],
    recipe_text: str,
    tmp: Path,
    work: _Work,
) -> Manifest:
    """The manifest of everything but the output files (listed once the card is written)."""
    return Manifest(
        tool={"name": "dit-quantize", "version": __version__},
        libraries=_library_versions(plan),
        format=plan.recipe.format,
        recipe=RecipeEntry(
            name=plan.recipe.name,
            origin=_origin(provenance.loaded),
            sha256=work.hash_later(tmp / RECIPE_NAME).result(),
            text=recipe_text,
        ),
        source={"name": provenance.source_name},
        source_files=work.file_entries(plan.source, source_files),
        components=written.entries,
        tensors=dict(sorted(written.tensors.items())),
        output_files=[],
        steps=[
            r
            for step in provenance.steps
            if (r := step.record(lambda p: work.hash_later(p).result())) is not None
        ],
        calibration=provenance.calibration,
        nested=list(provenance.nested),
    )


def _write_manifest(manifest: Manifest, tmp: Path, work: _Work) -> Manifest:
    """`manifest` with every file of `tmp` listed (hashed, and flushed to disk), written last; returns it."""
    output_files = work.file_entries(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    work.synced()
    manifest = manifest.model_copy(update={"output_files": output_files})
    write_file(tmp / MANIFEST_NAME, manifest.to_json())
    return manifest


def _library_versions(plan: Plan) -> dict[str, str]:
    names = ["torch", "safetensors", *format_info(plan.recipe.format).libraries]
    return {"python": platform.python_version(), **{name: metadata.version(name) for name in names}}


def _origin(loaded: LoadedRecipe) -> str:
    # A local recipe path is reduced to its file name: no local paths in a published manifest.
    return loaded.origin if loaded.origin.startswith("bundled:") else Path(loaded.origin).name


def _write_component(
    cp: ComponentPlan, plan: Plan, tmp: Path, max_bytes: int, work: _Work
) -> tuple[dict[str, TensorEntry], list[WrittenFile]]:
    """The files of one component, as its container lays them out; returns its tensor entries and its files."""
    container, fmt = get_container(plan.container), plan.format
    out_dir = tmp if cp.rel == "." else tmp / cp.rel
    out_dir.mkdir(parents=True, exist_ok=True)
    entries: dict[str, TensorEntry] = {}
    written = []
    for file in container.planned_files(cp, fmt, max_bytes):
        path = out_dir / file.name
        results, data_bytes = _write_file(container.open_file(path, file, cp, fmt), file.tensors, fmt, work)
        written.append(WrittenFile(file, data_bytes))
        for tp, stats in results:
            if stats is not None:
                entries[cp.manifest_key(tp)] = _tensor_entry(tp, plan, stats)
        work.hash_later(path)
        work.sync_later(path)
    container.finish(out_dir, cp, fmt, written)
    return entries, written


def _write_file(writer: TensorWriter, tensors: tuple[TensorPlan, ...], fmt: Format, work: _Work):
    """Convert the tensors of one file into `writer`; returns each one's error figures and the file's tensor bytes."""
    futures = [work.pool.submit(_convert_one, tp, fmt, writer, work.progress) for tp in tensors]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f.exception() for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            raise failed
    except BaseException:
        for f in futures:
            f.cancel()
        wait(futures)  # tensors already running finish: nothing may write after the file is closed
        writer.abort()
        raise
    data_bytes = writer.close(sync=False)  # flushed while the next file is converted
    return [(tp, f.result()) for tp, f in zip(tensors, futures, strict=True)], data_bytes


def _convert_one(tp: TensorPlan, fmt: Format, writer: TensorWriter, progress: Progress):
    try:
        stats = write_tensor(tp, fmt, writer)
    except OSError as e:
        raise ConversionError(
            io_problem(e, writer.path, f"converting {tp.name!r} from {tp.info.file}")
        ) from None
    progress.advance(tp.info.nbytes)
    return stats


def write_tensor(tp: TensorPlan, fmt: Format, writer: TensorWriter):
    """Convert one planned tensor into `writer`; returns the error figures (`encode.ErrorStats`) of a quantized one."""
    if tp.quantize:
        keys = dict(zip(tp.parts, (spec.name for spec in tp.outputs), strict=True))

        def write(parts: dict[str, torch.Tensor], rows: tuple[int, int] | None) -> dict[str, torch.Tensor]:
            for part, t in parts.items():
                writer.write(keys[part], t, row_start=rows[0] if rows else 0)
            return parts

        return encode_and_measure(tp, fmt, write)
    spec = tp.output()
    if not copy_unchanged(tp, lambda data, offset: writer.write_bytes(spec.name, data, offset)):
        for r0, _, rows in kept_rows(tp):
            writer.write(spec.name, rows, row_start=r0)
    return None


def _tensor_entry(tp: TensorPlan, plan: Plan, stats) -> TensorEntry:
    sqnr = stats.sqnr_db
    return TensorEntry(
        format=plan.recipe.format,
        shape=list(tp.info.shape),
        source_dtype=tp.info.dtype,
        pattern=tp.pattern or "",
        sqnr_db=None if sqnr is None else round(sqnr, 3),
        cosine=round(stats.cosine, 8),
        max_abs_error=stats.max_abs,
        type=tp.qtype,
    )


def _component_entry(cp: ComponentPlan, output_bytes: int) -> ComponentEntry:
    quantized = sum(1 for _ in cp.quantized())
    return ComponentEntry(
        path=cp.rel,
        quantized=quantized,
        kept=len(cp.tensors) - quantized,
        kept_linears=sorted(cp.kept_linears()),
        source_bytes=cp.source_bytes,
        output_bytes=output_bytes,
    )


# --- other files -------------------------------------------------------------------------------

_NO_HARD_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


def _copy_files(plan: Plan, tmp: Path, work: _Work) -> None:
    """Hard-link (or copy) each file of `plan.copied`; never over a file the conversion wrote."""
    for path in plan.copied:
        rel = path.relative_to(plan.source)
        dest = tmp / rel
        if dest.exists():
            raise InputError(
                f"{path}: would overwrite the converted {rel.as_posix()}; move it out of the source"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path.resolve(), dest)
        except OSError as e:
            if e.errno not in _NO_HARD_LINK:
                raise
            with open(path, "rb") as src, open(dest, "xb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        work.progress.note(f"copied {rel.as_posix()}")
