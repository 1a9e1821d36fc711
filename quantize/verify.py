"""`verify`: prove a converted checkpoint before anyone spends GPU hours or bandwidth on it.

Checks, by category (each one a named check that passes or fails, failures naming the file or tensor):
  integrity   every file of the manifest is there with its size and SHA-256; no shard, index or
              config is missing from the manifest; headers parse, offsets lie in bounds; the index
              maps every key to the shard that holds it, no key twice; every quantized tensor has the
              parts its format requires, with their dtypes and shapes; config.json carries the
              format's quantization_config.
  provenance  (with a source) the source files hash to the manifest's SHA-256; recipe.yaml and the
              manifest's recipe hash alike.
  parity      (with a source) the stored keys are exactly the recipe's plan; each quantized tensor,
              decoded, is within the recipe's `checks` of its source (SQNR, cosine) and requantizing
              the source reproduces the stored bytes; each kept tensor is bit-exact or exactly the
              cast the recipe asked for.
  forward     (with a source and `forward=True`) one forward pass of the source model and of the
              dequantized model on fixed random inputs agree to the recipe's `min_forward_sqnr_db`.

Reads are streamed: files are hashed through one buffer per thread, tensors compared in row chunks.
A problem with the checkpoint is a failed check; only unusable input (no checkpoint, no or unreadable
manifest, no source directory) raises `InputError`.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import dtypes
from .checkpoint import CONFIG_NAME, INDEX_SUFFIX, Component, TensorInfo, open_component, read_rows
from .errors import InputError, QuantizeError
from .formats import Format, get_format, part_key
from .forward import check_forward, require_known_models
from .hashing import sha256_file
from .manifest import MANIFEST_NAME, RECIPE_NAME, ComponentEntry, Manifest, TensorEntry, read_manifest
from .plan import TensorPlan, make_plan
from .quantizer import ErrorStats, row_chunks
from .recipes import Recipe, parse_recipe

__all__ = ["verify", "Report", "CheckResult", "CATEGORIES"]

CATEGORIES = ("integrity", "provenance", "parity", "forward")


@dataclass
class CheckResult:
    """One named check: how many subjects passed, and a one-line message per failure."""

    category: str
    name: str
    passed: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class Report:
    checkpoint: str
    source: str | None
    checks: dict[tuple[str, str], CheckResult] = field(default_factory=dict)
    hashed_bytes: int = 0
    hash_seconds: float = 0.0

    def record(self, category: str, name: str, ok: bool, failure: str = "") -> None:
        check = self.checks.setdefault((category, name), CheckResult(category, name))
        if ok:
            check.passed += 1
        else:
            check.failures.append(failure)

    def fail(self, category: str, name: str, failure: str) -> None:
        self.record(category, name, False, failure)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    @property
    def hash_gbps(self) -> float:
        return self.hashed_bytes / self.hash_seconds / 1e9 if self.hash_seconds else 0.0

    def to_dict(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "source": self.source,
            "ok": self.ok,
            "checks": [
                {
                    "category": c.category,
                    "check": c.name,
                    "ok": c.ok,
                    "passed": c.passed,
                    "failures": c.failures,
                }
                for c in sorted(self.checks.values(), key=lambda c: (CATEGORIES.index(c.category), c.name))
            ],
            "hashing": {
                "bytes": self.hashed_bytes,
                "seconds": round(self.hash_seconds, 3),
                "gb_per_s": round(self.hash_gbps, 3),
            },
        }


class _NoProgress:
    def start(self, total_bytes: int, total_tensors: int) -> None: ...
    def advance(self, nbytes: int, tensors: int = 1) -> None: ...
    def note(self, text: str) -> None: ...


def verify(
    checkpoint: str | Path,
    source: str | Path | None = None,
    *,
    forward: bool = False,
    workers: int | None = None,
    progress=None,
) -> Report:
    """Run every check that the given inputs allow; see the module docstring.

    >>> # report = verify("Wan2.1-T2V-1.3B-fp8", source="Wan2.1-T2V-1.3B"); report.ok
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise InputError(f"{checkpoint}: checkpoint directory not found")
    manifest = read_manifest(checkpoint)
    if source is not None and not Path(source).is_dir():
        raise InputError(f"{source}: source directory not found")
    if forward and source is None:
        raise InputError("--forward compares against the source model: give --source too")
    if forward:
        require_known_models(Path(source), parse_recipe(manifest.recipe.text, f"{MANIFEST_NAME} recipe"))
    progress = progress or _NoProgress()
    # bytes: output files hashed; with a source, its files hashed and its tensors compared as well
    total = sum(f.size for f in manifest.output_files)
    items = len(manifest.output_files)
    if source is not None:
        total += sum(f.size for f in manifest.source_files) + sum(c.source_bytes for c in manifest.components)
        items += len(manifest.source_files) + sum(c.quantized + c.kept for c in manifest.components)
    progress.start(total, items)
    workers = (os.cpu_count() or 1) if workers is None else workers
    report = Report(str(checkpoint), None if source is None else str(source))
    fmt = _format(manifest, report)
    with _pool(workers) as pool:
        _check_files(checkpoint, manifest, report, pool, progress)
        components = {c.path: _open(checkpoint, c, report) for c in manifest.components}
        if fmt is not None:
            for entry in manifest.components:
                if components[entry.path] is not None:
                    _check_layout(components[entry.path], entry, manifest, fmt, report)
        if source is not None:
            source = Path(source)
            recipe = _check_provenance(source, manifest, report, pool, progress)
            if fmt is not None and recipe is not None:
                _check_parity(source, recipe, components, fmt, manifest, report, pool, progress)
                if forward:
                    check_forward(source, checkpoint, recipe, fmt, report)
    return report


@contextmanager
def _pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    saved = torch.get_num_threads()
    pool = ThreadPoolExecutor(
        max(1, workers), thread_name_prefix="verify", initializer=torch.set_num_threads, initargs=(1,)
    )
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(saved)


def _format(manifest: Manifest, report: Report) -> Format | None:
    try:
        return get_format(manifest.format)
    except InputError as e:
        report.fail("integrity", "manifest", f"{MANIFEST_NAME}: {e}")
        return None


# --- integrity ---------------------------------------------------------------------------------


def _timed_sha256(path: Path) -> tuple[str, int, float]:
    t0 = time.perf_counter()
    digest = sha256_file(path)
    return digest, path.stat().st_size, time.perf_counter() - t0


def _check_files(
    checkpoint: Path, manifest: Manifest, report: Report, pool: ThreadPoolExecutor, progress
) -> None:
    """Every listed file present with its size and hash; no unlisted shard, index or config."""
    listed = {f.path for f in manifest.output_files}
    present = [f for f in manifest.output_files if _file_present(checkpoint, f.path, f.size, report)]
    t0 = time.perf_counter()
    futures = [(f, pool.submit(_timed_sha256, checkpoint / f.path)) for f in present]
    for entry, future in futures:
        digest, size, _ = future.result()
        report.hashed_bytes += size
        progress.advance(size)
        report.record(
            "integrity",
            "file sha256",
            digest == entry.sha256,
            f"{entry.path}: SHA-256 {digest[:12]}... differs from the manifest's {entry.sha256[:12]}...: the file was changed or corrupted",
        )
    report.hash_seconds = time.perf_counter() - t0
    for path in sorted(checkpoint.rglob("*")):
        rel = path.relative_to(checkpoint).as_posix()
        if path.is_file() and rel not in listed and rel != MANIFEST_NAME and _is_checkpoint_file(path):
            report.fail(
                "integrity", "unlisted files", f"{rel}: not in the manifest (a stray or substituted file)"
            )
    report.record("integrity", "unlisted files", True)


def _is_checkpoint_file(path: Path) -> bool:
    return path.name.endswith((".safetensors", INDEX_SUFFIX)) or path.name in (CONFIG_NAME, RECIPE_NAME)


def _file_present(root: Path, rel: str, size: int, report: Report) -> bool:
    path = root / rel
    if not path.is_file():
        report.fail("integrity", "file size", f"{rel}: listed in the manifest but missing")
        return False
    actual = path.stat().st_size
    report.record(
        "integrity",
        "file size",
        actual == size,
        f"{rel}: {actual} bytes, the manifest says {size}: truncated or changed",
    )
    return actual == size


def _open(root: Path, entry: ComponentEntry, report: Report) -> Component | None:
    """The component's headers and index, validated; a failure is recorded, not raised."""
    try:
        component = open_component(root, entry.path)
    except InputError as e:
        report.fail("integrity", "headers and index", str(e))
        return None
    report.record("integrity", "headers and index", True)
    return component


def _check_layout(
    component: Component, entry: ComponentEntry, manifest: Manifest, fmt: Format, report: Report
) -> None:
    """Each quantized tensor's parts have the dtypes and shapes of its format; the key count adds up; config.json."""
    stored = component.tensors
    prefix = f"{entry.path}/"
    expected_parts = 0
    for key, t in manifest.tensors.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        module = name.removesuffix(".weight")
        for part, (dt, shape) in fmt.parts(tuple(t.shape)).items():
            expected_parts += 1
            full = part_key(module, part)
            info = stored.get(full)
            if info is None:
                report.fail(
                    "integrity",
                    "tensor layout",
                    f"{entry.path}: tensor {full!r} of quantized {name!r} is missing",
                )
                continue
            want_shape = (info.shape[0],) if shape is None and len(info.shape) == 1 else shape
            report.record(
                "integrity",
                "tensor layout",
                info.dtype == dt and info.shape == want_shape,
                f"{info.file.name}: tensor {full!r} is {info.dtype}{list(info.shape)}, {fmt.NAME} requires "
                f"{dt}{list(shape) if shape is not None else '[n]'}",
            )
    expected = expected_parts + entry.kept
    report.record(
        "integrity",
        "tensor count",
        len(stored) == expected,
        f"{component.dir}: {len(stored)} tensors stored, the manifest accounts for {expected} "
        "(a key was added or removed; --source names it)",
    )
    config = component.config or {}
    report.record(
        "integrity",
        "config",
        config.get("quantization_config") == fmt.quantization_config(entry.kept_linears),
        f"{component.config_path}: quantization_config is not the one {fmt.NAME} writes for this checkpoint",
    )


# --- provenance --------------------------------------------------------------------------------


def _check_provenance(
    source: Path, manifest: Manifest, report: Report, pool: ThreadPoolExecutor, progress
) -> Recipe | None:
    """The source is the one the checkpoint was made from; returns the recipe as used, when it can be trusted."""
    present = [f for f in manifest.source_files if (source / f.path).is_file()]
    for f in manifest.source_files:
        if f not in present:
            report.fail("provenance", "source sha256", f"{source / f.path}: missing from the source")
    futures = [(f, pool.submit(sha256_file, source / f.path)) for f in present]
    for entry, future in futures:
        digest = future.result()
        progress.advance(entry.size)
        report.record(
            "provenance",
            "source sha256",
            digest == entry.sha256,
            f"{source / entry.path}: SHA-256 differs from the manifest's: this is not the source the checkpoint was made from",
        )
    text = manifest.recipe.text
    ok = hashlib.sha256(text.encode()).hexdigest() == manifest.recipe.sha256
    report.record(
        "provenance",
        "recipe",
        ok,
        f"{MANIFEST_NAME}: the recipe text does not match its SHA-256 (edited manifest)",
    )
    try:
        return parse_recipe(text, f"{MANIFEST_NAME} recipe")
    except InputError as e:
        report.fail("provenance", "recipe", str(e))
        return None


# --- parity ------------------------------------------------------------------------------------


def _check_parity(
    source: Path,
    recipe: Recipe,
    components: dict[str, Component | None],
    fmt: Format,
    manifest: Manifest,
    report: Report,
    pool: ThreadPoolExecutor,
    progress,
) -> None:
    try:
        plan = make_plan(source, recipe)
    except QuantizeError as e:
        report.fail("parity", "plan", f"the recipe no longer applies to {source}: {e}")
        return
    for cp in plan.components:
        stored = components.get(cp.rel)
        if stored is None:
            continue
        expected = {spec.name for tp in cp.tensors for spec in tp.outputs}
        for key in sorted(expected - set(stored.tensors)):
            report.fail("parity", "keys", f"{stored.dir}: tensor {key!r} is missing")
        for key in sorted(set(stored.tensors) - expected):
            report.fail(
                "parity", "keys", f"{stored.dir}: tensor {key!r} is not in the recipe's plan (extra key)"
            )
        report.record("parity", "keys", True)
        futures = [
            pool.submit(
                _check_tensor, tp, stored, fmt, recipe, manifest.tensors.get(f"{cp.rel}/{tp.name}"), progress
            )
            for tp in cp.tensors
            if all(spec.name in stored.tensors for spec in tp.outputs)
        ]
        for future in futures:
            for category, name, ok, failure in future.result():
                report.record(category, name, ok, failure)


Result = tuple[str, str, bool, str]


def _check_tensor(
    tp: TensorPlan, stored: Component, fmt: Format, recipe: Recipe, entry: TensorEntry | None, progress
) -> list[Result]:
    results = _check_quantized(tp, stored, fmt, recipe, entry) if tp.quantize else [_check_kept(tp, stored)]
    progress.advance(tp.info.nbytes)
    return results


def _same_rows(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
    )


def _check_quantized(
    tp: TensorPlan, stored: Component, fmt: Format, recipe: Recipe, entry: TensorEntry | None
) -> list[Result]:
    infos = {spec.name: stored.tensors[spec.name] for spec in tp.outputs}
    rows, cols = tp.info.shape
    stats, identical = ErrorStats(), True
    if fmt.ROW_SEPARABLE:
        for r0, r1 in row_chunks(rows, cols):
            w = read_rows(tp.info, r0, r1)
            mine = {
                part: read_rows(infos[part_key(tp.module, part)], r0, r1) for part in fmt.parts(tp.info.shape)
            }
            identical &= all(_same_rows(t, mine[part]) for part, t in fmt.encode(w).items())
            stats.add(w, fmt.decode(mine, torch.float32))
    else:
        w = read_rows(tp.info, 0, rows)
        mine = {part: _read_all(infos[part_key(tp.module, part)]) for part in fmt.parts(tp.info.shape)}
        identical = all(_same_rows(t, mine[part]) for part, t in fmt.encode(w).items())
        for r0, r1 in row_chunks(rows, cols):
            stats.add(w[r0:r1], fmt.decode(mine, torch.float32, rows=(r0, r1)))
    where = f"{tp.info.file.name} -> {tp.name}"
    results: list[Result] = [
        (
            "parity",
            "requantize",
            identical,
            f"{where}: requantizing the source does not reproduce the stored bytes",
        )
    ]
    checks = recipe.checks
    sqnr = stats.sqnr_db
    if checks.min_sqnr_db is not None:
        ok = sqnr is None or sqnr >= checks.min_sqnr_db
        results.append(
            (
                "parity",
                "weight SQNR",
                ok,
                f"{tp.name}: SQNR {sqnr:.2f} dB below the recipe's min_sqnr_db {checks.min_sqnr_db}",
            )
        )
    if checks.min_cosine is not None:
        ok = stats.cosine >= checks.min_cosine
        results.append(
            (
                "parity",
                "weight cosine",
                ok,
                f"{tp.name}: cosine {stats.cosine:.6f} below the recipe's min_cosine {checks.min_cosine}",
            )
        )
    results.append(
        ("parity", "weight finite", math.isfinite(stats.max_abs), f"{tp.name}: decodes to NaN or Inf")
    )
    measured = (None if sqnr is None else round(sqnr, 3), round(stats.cosine, 8), stats.max_abs)
    recorded = entry is not None and (entry.sqnr_db, entry.cosine, entry.max_abs_error) == measured
    message = (
        f"{MANIFEST_NAME}: the error figures of {tp.name!r} are not the ones measured now (edited manifest?)"
    )
    results.append(("parity", "recorded error", recorded, message))
    return results


def _read_all(info: TensorInfo) -> torch.Tensor:
    return read_rows(info, 0, info.shape[0] if info.shape else 1)


def _check_kept(tp: TensorPlan, stored: Component) -> Result:
    (spec,) = tp.outputs
    info = stored.tensors[spec.name]
    what = "bit-exact copy" if spec.dtype == tp.info.dtype else f"exact cast to {spec.dtype}"
    if info.dtype != spec.dtype or info.shape != tp.info.shape:
        return (
            "parity",
            "kept tensors",
            False,
            f"{info.file.name}: tensor {spec.name!r} is {info.dtype}{list(info.shape)}, expected {spec.dtype}{list(tp.info.shape)}",
        )
    target = dtypes.by_name(spec.dtype).torch
    rows = tp.info.shape[0] if tp.info.shape else 1
    ok = all(
        _same_rows(read_rows(tp.info, r0, r1).to(target), read_rows(info, r0, r1))
        for r0, r1 in row_chunks(rows, max(1, tp.info.numel // max(1, rows)))
    )
    return (
        "parity",
        "kept tensors",
        ok,
        f"{info.file.name}: tensor {spec.name!r} is not a {what} of the source",
    )
