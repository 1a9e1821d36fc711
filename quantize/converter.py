"""`convert`: stream a source checkpoint through a recipe into a new, complete checkpoint directory.

Order of work (nothing is written before everything is validated):
  1. recipe validated, output location checked, plan made from headers alone;
  2. a temporary sibling directory is filled (see `output`): shards (tensors converted in parallel,
     each written at its place), index, config.json, copied files, recipe.yaml, and the manifest
     last, with every file's SHA-256;
  3. the temporary directory is renamed into place.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from . import __version__
from .card import CARD_NAME, CardFacts, pipeline_tag, render_card, source_card_metadata
from .checkpoint import CONFIG_NAME
from .errors import ConversionError, InputError
from .hashing import FileHasher
from .layout import (
    DEFAULT_MAX_SHARD_SIZE,
    SHARD_METADATA,
    group_by_size,
    index_json,
    index_name,
    parse_size,
    shard_names,
)
from .manifest import (
    MANIFEST_NAME,
    RECIPE_NAME,
    ComponentEntry,
    FileEntry,
    Manifest,
    RecipeEntry,
    TensorEntry,
)
from .output import (
    NO_SPACE_ERRNOS,
    claimed_output,
    fsync_path,
    publish,
    staging_dir,
    write_file,
)
from .plan import ComponentPlan, Plan, TensorPlan, make_plan
from .progress import NoProgress, Progress
from .quantizer import ErrorStats, write_tensor
from .recipes import LoadedRecipe, dump_recipe, load_recipe
from .writer import ShardWriter

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
    source_name: str | None = None,
    base_model: str | None = None,
    hasher: FileHasher | None = None,
) -> Manifest:
    """Convert `source` into the checkpoint directory `out`; `recipe` is a loaded recipe, a file or a bundled name.

    source_name: how the manifest and the model card name the source (default: its folder's name; a Hub
    repo id when it came from the Hub). base_model: the Hub repo id the card's metadata names as the base.
    hasher: a `FileHasher` already hashing the source's files (`layout.files_of_components` lists them); the caller
    closes it. Default: one of the conversion's own.

    >>> # manifest = convert("Wan2.1-T2V-1.3B", "Wan2.1-T2V-1.3B-fp8", "wan-fp8.yaml", workers=2)
    """
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    source, out = Path(source).absolute(), Path(out).absolute()
    max_bytes = parse_size(max_shard_size)
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    with claimed_output(source, out, overwrite):
        plan = make_plan(source, loaded.recipe)
        progress = progress or NoProgress()
        progress.start(plan.source_bytes, plan.tensor_count)
        with staging_dir(out) as tmp:
            facts = CardFacts(
                classes={cp.rel: (cp.component.config or {}).get("_class_name") for cp in plan.components},
                pipeline_tag=pipeline_tag([cp.component.config for cp in plan.components]),
                base_model=base_model,
                source_metadata=source_card_metadata(source),
            )
            try:
                manifest = _write_checkpoint(
                    plan, loaded, tmp, max_bytes, workers, progress, source_name or source.name, facts, hasher
                )
                publish(tmp, out, overwrite)
            except OSError as e:
                raise _output_error(_io_problem(e, out, "writing the output"), tmp, out) from None
            except ConversionError as e:
                raise _output_error(str(e), tmp, out) from None
    return manifest


def _io_problem(e: OSError, fallback: Path, doing: str) -> str:
    """An OSError as one line: the file, what failed, what was being done, and what to do about a full disk."""
    message = f"{e.filename or fallback}: {e.strerror or e} ({doing})"
    if e.errno in NO_SPACE_ERRNOS:
        message += ": free some space, or pick another disk, and run it again"
    return message


def _output_error(message: str, tmp: Path, out: Path) -> ConversionError:
    """A failed write, naming files where they would have been in OUT (the temporary directory is gone)."""
    return ConversionError(f"{message.replace(str(tmp), str(out))}; {out} is unchanged")


# --- writing -----------------------------------------------------------------------------------


@dataclass
class _Work:
    """Shared state of one conversion: the converting pool, the file hasher, the shards left to flush.

    Source files are hashed in the background (see `hashing`); each output shard is hashed, and flushed
    to disk, as soon as it is complete, while the next shard is converted and the source hashing ends.
    """

    pool: ThreadPoolExecutor
    hasher: FileHasher
    syncer: ThreadPoolExecutor  # fsync of finished shards
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


def _write_checkpoint(
    plan: Plan,
    loaded: LoadedRecipe,
    tmp: Path,
    max_bytes: int,
    workers: int,
    progress: Progress,
    source_name: str,
    facts: CardFacts,
    hasher: FileHasher | None,
) -> Manifest:
    saved_threads = torch.get_num_threads()
    own_hasher = hasher is None
    work = _Work(
        pool=ThreadPoolExecutor(
            workers, thread_name_prefix="quantize", initializer=torch.set_num_threads, initargs=(1,)
        ),
        hasher=FileHasher(min(2, workers)) if hasher is None else hasher,
        syncer=ThreadPoolExecutor(1, thread_name_prefix="fsync"),
        progress=progress,
    )
    try:
        source_files = [f for cp in plan.components for f in cp.component.own_files()] + list(plan.copied)
        for f in source_files:
            work.hash_later(f, background=True)  # hashed while the tensors are converted
        tensors: dict[str, TensorEntry] = {}
        components = []
        for cp in plan.components:
            entries, output_bytes = _write_component(cp, plan, tmp, max_bytes, work)
            tensors.update(entries)
            components.append(_component_entry(cp, output_bytes))
        _copy_files(plan, tmp, work)
        recipe_text = dump_recipe(plan.recipe)
        write_file(tmp / RECIPE_NAME, recipe_text)
        progress.note(f"hashing {len(source_files)} source files and the output")
        manifest = Manifest(
            tool={"name": "dit-quantize", "version": __version__},
            libraries=_library_versions(plan),
            format=plan.recipe.format,
            recipe=RecipeEntry(
                name=plan.recipe.name,
                origin=_origin(loaded),
                sha256=work.hash_later(tmp / RECIPE_NAME).result(),
                text=recipe_text,
            ),
            source={"name": source_name},
            source_files=work.file_entries(plan.source, source_files),
            components=components,
            tensors=dict(sorted(tensors.items())),
            output_files=[],
        )
        write_file(tmp / CARD_NAME, render_card(manifest, facts))  # from everything but the output hashes
        output_files = work.file_entries(tmp, [p for p in tmp.rglob("*") if p.is_file()])
        work.synced()
        manifest = manifest.model_copy(update={"output_files": output_files})
        write_file(tmp / MANIFEST_NAME, manifest.to_json())
        return manifest
    finally:
        for pool in (work.pool, work.syncer):
            pool.shutdown(wait=True, cancel_futures=True)
        if own_hasher:
            work.hasher.close()
        torch.set_num_threads(saved_threads)


def _library_versions(plan: Plan) -> dict[str, str]:
    names = ["torch", "safetensors", *plan.format.LIBRARIES]
    return {"python": platform.python_version(), **{name: metadata.version(name) for name in names}}


def _origin(loaded: LoadedRecipe) -> str:
    # A local recipe path is reduced to its file name: no local paths in a published manifest.
    return loaded.origin if loaded.origin.startswith("bundled:") else Path(loaded.origin).name


def _write_component(
    cp: ComponentPlan, plan: Plan, tmp: Path, max_bytes: int, work: _Work
) -> tuple[dict[str, TensorEntry], int]:
    """Shards, index and config.json of one component; returns its tensor entries and its tensor bytes."""
    comp = cp.component
    out_dir = tmp if cp.rel == "." else tmp / cp.rel
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = group_by_size(cp.tensors, lambda tp: tp.output_bytes, max_bytes)
    # the whole component's format metadata goes into every shard (diffusers merges the shards' metadata)
    metadata = {
        **SHARD_METADATA,
        **plan.format.checkpoint_metadata(
            [(t.name, t.info.shape if t.quantize else None) for t in cp.tensors]
        ),
    }
    names = shard_names(comp.stem, len(groups), with_index=comp.index_path is not None)
    entries: dict[str, TensorEntry] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for group, name in zip(groups, names, strict=True):
        results, data_bytes = _write_shard(out_dir / name, group, plan, metadata, work)
        total += data_bytes
        for tp, stats in results:
            if stats is not None:
                entries[f"{cp.rel}/{tp.name}"] = _tensor_entry(tp, plan, stats)
        weight_map.update({spec.name: name for tp in group for spec in tp.outputs})
        work.hash_later(out_dir / name)
        work.sync_later(out_dir / name)
    if len(groups) > 1 or comp.index_path is not None:
        write_file(out_dir / index_name(comp.stem), index_json(weight_map, total))
    config = dict(comp.config or {})
    config["quantization_config"] = plan.format.quantization_config(cp.kept_linears())
    write_file(out_dir / CONFIG_NAME, _json(config))
    return entries, total


def _json(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"


def _write_shard(
    path: Path, group: list[TensorPlan], plan: Plan, metadata: dict[str, str], work: _Work
) -> tuple[list[tuple[TensorPlan, ErrorStats | None]], int]:
    """Convert a group of tensors into one shard; returns each one's error figures and the shard's tensor bytes."""
    writer = ShardWriter(path, [spec for tp in group for spec in tp.outputs], metadata)
    futures = [work.pool.submit(_convert_one, tp, plan.format, writer, work.progress) for tp in group]
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
    data_bytes = writer.close(sync=False)  # flushed while the next shard is converted
    return [(tp, f.result()) for tp, f in zip(group, futures, strict=True)], data_bytes


def _convert_one(tp: TensorPlan, fmt, writer: ShardWriter, progress: Progress) -> ErrorStats | None:
    try:
        stats = write_tensor(tp, fmt, writer)
    except OSError as e:
        raise ConversionError(
            _io_problem(e, writer.path, f"converting {tp.name!r} from {tp.info.file}")
        ) from None
    progress.advance(tp.info.nbytes)
    return stats


def _tensor_entry(tp: TensorPlan, plan: Plan, stats: ErrorStats) -> TensorEntry:
    sqnr = stats.sqnr_db
    return TensorEntry(
        format=plan.recipe.format,
        shape=list(tp.info.shape),
        source_dtype=tp.info.dtype,
        pattern=tp.pattern or "",
        sqnr_db=None if sqnr is None else round(sqnr, 3),
        cosine=round(stats.cosine, 8),
        max_abs_error=stats.max_abs,
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
