"""`convert`: stream a source checkpoint through a recipe into a new, complete checkpoint directory.

Order of work (nothing is written before everything is validated):
  1. recipe validated, output location checked, plan made from headers alone;
  2. a temporary sibling directory ``.OUT.tmp-*`` is filled: shards (tensors converted in parallel,
     each written at its place), index, config.json, copied files, recipe.yaml, and the manifest
     last, with every file's SHA-256;
  3. the temporary directory is renamed to OUT; an old OUT (with ``overwrite``) is moved aside
     first and deleted only once the new one is in place.
Any failure or interrupt removes the temporary directory and leaves OUT as it was.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import safetensors
import torch

from . import __version__
from .checkpoint import CONFIG_NAME, INDEX_SUFFIX
from .errors import ConversionError, InputError, OutputExistsError
from .hashing import sha256_file
from .manifest import (
    MANIFEST_NAME,
    RECIPE_NAME,
    ComponentEntry,
    FileEntry,
    Manifest,
    RecipeEntry,
    TensorEntry,
)
from .plan import ComponentPlan, Plan, TensorPlan, make_plan
from .quantizer import ErrorStats, write_tensor
from .recipes import LoadedRecipe, dump_recipe, load_recipe, recipe_sha256
from .writer import ShardWriter

__all__ = ["convert", "Progress", "parse_size", "DEFAULT_MAX_SHARD_SIZE"]

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
SHARD_METADATA = {"format": "pt"}
_SKIP_DIRS = {".git", ".cache", ".huggingface"}
_NOT_COPIED = {"README.md", MANIFEST_NAME, RECIPE_NAME}  # the output's own files at the root


class Progress(Protocol):
    """What `convert` reports while it works; calls may come from several threads."""

    def start(self, total_bytes: int, total_tensors: int) -> None: ...
    def advance(self, nbytes: int, tensors: int = 1) -> None: ...
    def note(self, text: str) -> None: ...


class _NoProgress:
    def start(self, total_bytes: int, total_tensors: int) -> None: ...
    def advance(self, nbytes: int, tensors: int = 1) -> None: ...
    def note(self, text: str) -> None: ...


def parse_size(text: str | int) -> int:
    """'5GB' -> 5_000_000_000, '512MiB' -> 536_870_912, '1000' -> 1000."""
    if isinstance(text, int):
        return text
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }
    s = text.strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num) :]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise InputError(
            f"size {text!r}: expected a positive number with an optional unit such as 5GB or 512MiB"
        )
    return int(value * units[unit])


def convert(
    source: Path,
    out: Path,
    recipe: LoadedRecipe | str | Path,
    *,
    overwrite: bool = False,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Convert `source` into the checkpoint directory `out`; `recipe` is a loaded recipe, a file or a bundled name.

    >>> # manifest = convert("Wan2.1-T2V-1.3B", "Wan2.1-T2V-1.3B-fp8", "wan-fp8.yaml", workers=2)
    """
    loaded = recipe if isinstance(recipe, LoadedRecipe) else load_recipe(recipe)
    source, out = Path(source).absolute(), Path(out).absolute()
    progress = progress or _NoProgress()
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    _check_output_location(source, out, overwrite)
    plan = make_plan(source, loaded.recipe)
    for cp in plan.components:
        if cp.component.config and "quantization_config" in cp.component.config:
            raise InputError(
                f"{cp.component.config_path}: already has a quantization_config: the source is already quantized"
            )
    progress.start(plan.source_bytes, plan.tensor_count)
    with _staging_dir(out) as tmp:
        manifest = _write_checkpoint(plan, loaded, tmp, max_shard_size, workers, progress)
        _publish(tmp, out, overwrite)
    return manifest


def _check_output_location(source: Path, out: Path, overwrite: bool) -> None:
    real_source, real_out = source.resolve(), out.resolve()
    if real_out == real_source or real_source in real_out.parents or real_out in real_source.parents:
        raise InputError(f"{out}: the output must not be the source, inside it, or contain it")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise InputError(f"{out}: exists and is not a directory")
        if not overwrite:
            raise OutputExistsError(
                f"{out}: already exists; pass --overwrite to replace it (the old checkpoint stays until the new one is complete)"
            )
    parent = out.parent
    if not parent.is_dir():
        raise InputError(f"{parent}: the output's parent directory does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{parent}: not writable, cannot create the output there")


@contextmanager
def _staging_dir(out: Path) -> Iterator[Path]:
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tmp.exists():  # published: renamed away
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputExistsError(f"{out}: appeared while converting; the new checkpoint was discarded")
        old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    _fsync_dir(out.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- writing -----------------------------------------------------------------------------------


@dataclass
class _Work:
    """Shared state of one conversion: the pools and the hashes they produce."""

    pool: ThreadPoolExecutor
    hasher: ThreadPoolExecutor
    progress: Progress
    hashes: dict[Path, Future]  # absolute path -> Future[str]

    def hash_later(self, path: Path) -> None:
        if path not in self.hashes:
            self.hashes[path] = self.hasher.submit(sha256_file, path)


def _write_checkpoint(
    plan: Plan, loaded: LoadedRecipe, tmp: Path, max_shard_size: int, workers: int, progress: Progress
) -> Manifest:
    saved_threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(
        workers, thread_name_prefix="quantize", initializer=torch.set_num_threads, initargs=(1,)
    )
    hasher = ThreadPoolExecutor(1, thread_name_prefix="sha256")
    work = _Work(pool, hasher, progress, {})
    try:
        for cp in plan.components:
            for f in cp.component.own_files():
                work.hash_later(f)
        tensors: dict[str, TensorEntry] = {}
        components = []
        for cp in plan.components:
            tensors.update(_write_component(cp, plan, tmp, max_shard_size, work))
            components.append(_component_entry(cp))
        copied = _copy_other_files(plan, tmp, work) if plan.recipe.copy_other_files else []
        (tmp / RECIPE_NAME).write_text(dump_recipe(plan.recipe))
        source_files = [*(f for cp in plan.components for f in cp.component.own_files()), *copied]
        manifest = Manifest(
            tool={"name": "dit-quantize", "version": __version__},
            libraries=_library_versions(),
            format=plan.recipe.format,
            recipe=RecipeEntry(
                name=plan.recipe.name,
                origin=_origin(loaded),
                sha256=recipe_sha256(plan.recipe),
                text=dump_recipe(plan.recipe),
            ),
            source={"name": plan.source.name},
            source_files=_file_entries(plan.source, source_files, work),
            components=components,
            tensors=dict(sorted(tensors.items())),
            output_files=_file_entries(tmp, _all_files(tmp), work),
        )
        (tmp / MANIFEST_NAME).write_text(manifest.to_json())
        return manifest
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        hasher.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        hasher.shutdown(wait=True)
        torch.set_num_threads(saved_threads)


def _origin(loaded: LoadedRecipe) -> str:
    # A local recipe path is reduced to its file name: no local paths in a published manifest.
    return loaded.origin if loaded.origin.startswith("bundled:") else Path(loaded.origin).name


def _library_versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
    }


def _write_component(
    cp: ComponentPlan, plan: Plan, tmp: Path, max_shard_size: int, work: _Work
) -> dict[str, TensorEntry]:
    comp = cp.component
    out_dir = tmp if cp.rel == "." else tmp / cp.rel
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = _assign_shards(cp.tensors, max_shard_size)
    names = _shard_names(comp.stem, len(groups), with_index=comp.index_path is not None)
    entries: dict[str, TensorEntry] = {}
    weight_map: dict[str, str] = {}
    for group, name in zip(groups, names, strict=True):
        path = out_dir / name
        for tp, stats in _write_shard(path, group, plan, work):
            if stats is not None:
                entries[f"{cp.rel}/{tp.name}"] = _tensor_entry(tp, plan, stats)
        weight_map.update({spec.name: name for tp in group for spec in tp.outputs})
        work.hash_later(path)
    if len(groups) > 1 or comp.index_path is not None:
        total = sum(tp.output_bytes for tp in cp.tensors)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / f"{comp.stem}{INDEX_SUFFIX}").write_text(json.dumps(index, indent=2) + "\n")
    config = dict(comp.config or {})
    config["quantization_config"] = plan.format.quantization_config(cp.kept_linears())
    (out_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return entries


def _assign_shards(tensors: tuple[TensorPlan, ...], max_bytes: int) -> list[list[TensorPlan]]:
    """Source order, a new shard whenever the next tensor would push this one past `max_bytes`."""
    groups: list[list[TensorPlan]] = [[]]
    size = 0
    for tp in tensors:
        if groups[-1] and size + tp.output_bytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tp)
        size += tp.output_bytes
    return groups


def _shard_names(stem: str, n: int, with_index: bool) -> list[str]:
    if n == 1 and not with_index:
        return [f"{stem}.safetensors"]
    return [f"{stem}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def _write_shard(
    path: Path, group: list[TensorPlan], plan: Plan, work: _Work
) -> list[tuple[TensorPlan, ErrorStats | None]]:
    writer = ShardWriter(path, [spec for tp in group for spec in tp.outputs], SHARD_METADATA)
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
    try:
        writer.close()
    except OSError as e:
        raise ConversionError(f"{path}: cannot write: {e.strerror or e}") from None
    return [(tp, f.result()) for tp, f in zip(group, futures, strict=True)]


def _convert_one(tp: TensorPlan, fmt, writer: ShardWriter, progress: Progress) -> ErrorStats | None:
    try:
        stats = write_tensor(tp, fmt, writer)
    except OSError as e:
        raise ConversionError(f"{writer.path.name}: writing {tp.name!r} failed: {e.strerror or e}") from None
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


def _component_entry(cp: ComponentPlan) -> ComponentEntry:
    quantized = sum(1 for _ in cp.quantized())
    return ComponentEntry(
        path=cp.rel,
        quantized=quantized,
        kept=len(cp.tensors) - quantized,
        kept_linears=sorted(cp.kept_linears()),
        source_bytes=cp.source_bytes,
        output_bytes=cp.output_bytes,
    )


# --- other files, hashes -----------------------------------------------------------------------


def _copy_other_files(plan: Plan, tmp: Path, work: _Work) -> list[Path]:
    """Copy (hard-link where possible) every source file that no converted component owns."""
    owned = {f.absolute() for cp in plan.components for f in cp.component.own_files()}
    copied = []
    for path in _all_files(plan.source, skip_dirs=_SKIP_DIRS):
        rel = path.relative_to(plan.source)
        if path.absolute() in owned or (len(rel.parts) == 1 and rel.name in _NOT_COPIED):
            continue
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(path.resolve(), dest)
        work.progress.note(f"copied {rel.as_posix()}")
        copied.append(path)
    return copied


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        try:
            shutil.copyfile(src, dest)
        except OSError as e:
            raise ConversionError(f"{dest}: cannot copy {src}: {e.strerror or e}") from None


def _all_files(root: Path, skip_dirs: set[str] = frozenset()) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        files.extend(Path(dirpath) / f for f in sorted(filenames))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _file_entries(root: Path, files: list[Path], work: _Work) -> list[FileEntry]:
    entries = []
    for f in sorted(set(files), key=lambda p: p.relative_to(root).as_posix()):
        work.hash_later(f)
        entries.append(
            FileEntry(
                path=f.relative_to(root).as_posix(), size=f.stat().st_size, sha256=work.hashes[f].result()
            )
        )
    return entries
