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
              dequantized model (streamed layer by layer, `forward`) on fixed random inputs, or on
              `inputs`, agree to the recipe's `min_forward_sqnr_db`.

Reads are streamed: files are hashed through one buffer per thread, tensors compared in row chunks.
A problem with the checkpoint is a failed check; only unusable input (no checkpoint, no or unreadable
manifest, no source directory) raises `InputError`.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..containers import get_container
from ..encode import ErrorStats, encode_and_measure, kept_rows
from ..errors import InputError, QuantizeError
from ..formats import Format, PartSpec, format_for, format_info, get_format, quantized_parts
from ..names import module_name, split_manifest_key
from ..plan import ComponentPlan, Plan, TensorPlan, make_plan, with_input_scales
from ..progress import NoProgress, Progress
from ..publish.manifest import ComponentEntry, Manifest, TensorEntry, read_manifest
from ..read.checkpoint import Component, TensorInfo, confined_path, read_rows, read_tensor
from ..read.files import MANIFEST_NAME, RECIPE_NAME
from ..read.hashing import sha256_file
from ..read.source import SourceFolder, local_source
from ..recipes import Checks, Recipe, parse_recipe
from ..run.forward import check_forward, require_known_models
from ..steps import Rebuilt, TensorStep, rebuild

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
    #: component -> the forward check's figures (`forward.check_forward`): class, output SQNR, threshold
    forward: dict[str, dict] = field(default_factory=dict)

    def record(self, category: str, name: str, ok: bool, failure: str = "") -> None:
        """One subject checked: a pass, or a failure with its one-line message."""
        check = self.checks.setdefault((category, name), CheckResult(category, name))
        if ok:
            check.passed += 1
        else:
            check.failures.append(failure)

    def fail(self, category: str, name: str, failure: str) -> None:
        self.record(category, name, False, failure)

    def mark(self, category: str, name: str) -> None:
        """Name a check that ran, with nothing to count (so that it shows, passed, when nothing failed)."""
        self.checks.setdefault((category, name), CheckResult(category, name))

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
            "forward": self.forward,
            "hashing": {
                "bytes": self.hashed_bytes,
                "seconds": round(self.hash_seconds, 3),
                "gb_per_s": round(self.hash_gbps, 3),
            },
        }


def verify(
    checkpoint: str | Path,
    source: str | Path | None = None,
    *,
    forward: bool = False,
    inputs: str | Path | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
    steps: Sequence[TensorStep] = (),
    step_files: Sequence[str | Path] = (),
) -> Report:
    """Run every check that the given inputs allow; see the module docstring.

    steps: the per-tensor steps the conversion applied (`convert(steps=...)`): parity and forward read the
    source through them, as the conversion did.
    inputs: a safetensors file of the forward pass's inputs (`forward.load_inputs`); fixed random ones if None.
    step_files: input files of the steps the manifest records (the LoRAs of `convert --lora`), when they are
    not at the path the manifest records (nor beside or inside the source): found by SHA-256; each recorded
    step is rebuilt from its record (`steps.rebuild`) and applied to the source as the conversion applied it.

    >>> # report = verify("Wan2.1-T2V-1.3B-fp8", source="Wan2.1-T2V-1.3B"); report.ok
    """
    given = _checked_inputs(Path(checkpoint), source, forward, inputs, steps, step_files)
    report = _run_checks(given, workers, progress or NoProgress())
    for rel in given.manifest.nested:  # a pipeline's text encoders, each a checkpoint of its own
        nested_source = None if given.source is None else confined_path(given.source, rel, MANIFEST_NAME)
        nested = verify(given.checkpoint / rel, nested_source, forward=forward, workers=workers)
        _merge(report, rel, nested)
    return report


def _merge(report: Report, rel: str, nested: Report) -> None:
    """`nested`'s checks (of the checkpoint in folder `rel`) into `report`, each named with its folder."""
    for c in nested.checks.values():
        name = f"{rel}/: {c.name}"
        report.checks[(c.category, name)] = CheckResult(
            c.category, name, c.passed, [f"{rel}/: {f}" for f in c.failures]
        )
    report.forward.update({rel if k == "." else f"{rel}/{k}": v for k, v in nested.forward.items()})
    report.hashed_bytes += nested.hashed_bytes
    report.hash_seconds += nested.hash_seconds


@dataclass(frozen=True)
class _Inputs:
    """verify's arguments, checked and resolved."""

    checkpoint: Path
    manifest: Manifest
    recipe: Recipe | None  # None where the manifest's is not a valid recipe (a failed check)
    source: Path | None
    src: SourceFolder | None  # the source resolved under the recipe: the forward check and parity share it
    rebuilt: list[Rebuilt]  # the steps the manifest records, rebuilt
    steps: Sequence[TensorStep]  # the rebuilt steps', then the caller's
    forward: bool
    inputs: str | Path | None


def _checked_inputs(
    checkpoint: Path,
    source: str | Path | None,
    forward: bool,
    inputs: str | Path | None,
    steps: Sequence[TensorStep],
    step_files: Sequence[str | Path],
) -> _Inputs:
    """The arguments checked, in this order, and resolved: InputError for the first that is unusable."""
    if not checkpoint.is_dir():
        raise InputError(f"{checkpoint}: checkpoint directory not found")
    manifest = read_manifest(checkpoint)
    recipe = _manifest_recipe(manifest)
    _check_step_files(checkpoint, manifest, source, step_files)
    rebuilt: list[Rebuilt] = []
    src = None
    if source is not None:
        source = Path(source)
        rebuilt, src = _resolved_source(source, manifest, recipe, step_files)
        steps = [*(r.step for r in rebuilt), *steps]
    _check_forward_inputs(forward, inputs, source, src)
    return _Inputs(checkpoint, manifest, recipe, source, src, rebuilt, steps, forward, inputs)


def _check_step_files(
    checkpoint: Path, manifest: Manifest, source: str | Path | None, step_files: Sequence[str | Path]
) -> None:
    """`step_files` only for a checkpoint whose manifest records steps, and only with a source."""
    if step_files and not manifest.steps:
        raise InputError(
            f"{checkpoint}: was converted without LoRAs, so `step_files` has nothing to re-apply",
            parameters=("step_files",),
        )
    if step_files and source is None:
        raise InputError(
            "`step_files` re-applies LoRAs to the source: give `source` too",
            parameters=("step_files", "source"),
        )


def _resolved_source(
    source: Path, manifest: Manifest, recipe: Recipe | None, step_files: Sequence[str | Path]
) -> tuple[list[Rebuilt], SourceFolder | None]:
    """The recorded steps rebuilt for `source`, and the source resolved under the recipe (None without one)."""
    _require_source(source, manifest)
    files = [Path(p) for p in step_files]
    named = None if recipe is None else recipe.components
    rebuilt = [rebuild(record, source, files, named) for record in manifest.steps]
    # resolved once: the forward check and the parity plan share it
    return rebuilt, None if recipe is None else local_source(source, recipe)


def _check_forward_inputs(
    forward: bool, inputs: str | Path | None, source: Path | None, src: SourceFolder | None
) -> None:
    """`forward` only with a source whose models can run (on `inputs`); `inputs` only with `forward`."""
    if forward:
        if source is None:
            raise InputError(
                "`forward` compares against the source model: give `source` too",
                parameters=("forward", "source"),
            )
        if src is not None:
            require_known_models(src, None if inputs is None else Path(inputs))
    elif inputs is not None:
        raise InputError(
            "`inputs` are the forward pass's: give `forward` too", parameters=("inputs", "forward")
        )


def _run_checks(given: _Inputs, workers: int | None, progress: Progress) -> Report:
    """Every check the inputs allow, into one report."""
    manifest = given.manifest
    progress.start(*_work_size(manifest, given.source is not None))
    workers = (os.cpu_count() or 1) if workers is None else workers
    report = Report(str(given.checkpoint), None if given.source is None else str(given.source))
    fmt = _format(manifest, report)
    with _pool(workers) as pool:
        _check_files(given.checkpoint, manifest, report, pool, progress)
        _check_recipe(given.checkpoint, manifest, given.recipe, report)
        components = {c.path: _open(given.checkpoint, c, fmt, report) for c in manifest.components}
        # manifest keys ("<component>/<tensor>") whose stored parts do not fit the format: parity skips them
        damaged: set[str] = set()
        if fmt is not None:
            for entry in manifest.components:
                if components[entry.path] is not None:
                    damaged |= _check_layout(components[entry.path], entry, manifest, fmt, report)
        if given.source is not None:
            _check_against_source(given, components, damaged, fmt, report, pool, progress)
    return report


def _check_against_source(
    given: _Inputs,
    components: dict[str, Component | None],
    damaged: set[str],
    fmt: Format | None,
    report: Report,
    pool: ThreadPoolExecutor,
    progress: Progress,
) -> None:
    """Provenance, then (with a format and a recipe) parity, the rebuilt steps' checks and the forward check."""
    _check_provenance(given.source, given.manifest, report, pool, progress)
    for r in given.rebuilt:
        for check, ok, failure in r.provenance(sha256_file):
            report.record("provenance", check, ok, failure)
    if fmt is None or given.recipe is None:
        return
    plan = _check_parity(
        given.src, given.recipe, given.steps, components, damaged, fmt, given.manifest, report, pool, progress
    )
    for r in given.rebuilt if plan is not None else ():
        for category, check, ok, failure in r.after_plan():
            report.record(category, check, ok, failure)
    if given.forward:
        _check_forward_pass(plan, given, fmt, report)


def _check_forward_pass(plan: Plan | None, given: _Inputs, fmt: Format, report: Report) -> None:
    """One forward pass of the source and of the checkpoint, where the earlier checks leave them comparable."""
    if plan is None or not report.ok:
        report.fail(
            "forward", "output SQNR", "skipped: earlier checks failed, the models would not be comparable"
        )
        return
    inputs = None if given.inputs is None else Path(given.inputs)
    check_forward(plan, given.checkpoint, given.recipe, fmt, report, inputs)


def _manifest_recipe(manifest: Manifest) -> Recipe | None:
    try:
        return parse_recipe(manifest.recipe.text, f"{MANIFEST_NAME} recipe")
    except InputError:
        return None  # reported by _check_recipe


def _require_source(source: Path, manifest: Manifest) -> None:
    """A source directory that holds none of the files the checkpoint was made from is the wrong input."""
    folder = source.parent if source.is_file() else source  # a file given as the source: listed in its folder
    if not folder.is_dir():
        raise InputError(f"{source}: source directory not found")
    paths = [confined_path(folder, f.path, MANIFEST_NAME) for f in manifest.source_files]
    if paths and not any(p.is_file() for p in paths):
        raise InputError(
            f"{source}: holds none of the {len(paths)} source files the manifest lists: is this the right source?"
        )


def _work_size(manifest: Manifest, with_source: bool) -> tuple[int, int]:
    """Bytes and items the progress bar counts: output files hashed; source files hashed and tensors compared."""
    total = sum(f.size for f in manifest.output_files)
    items = len(manifest.output_files)
    if with_source:
        total += sum(f.size for f in manifest.source_files) + sum(c.source_bytes for c in manifest.components)
        items += len(manifest.source_files) + sum(c.quantized + c.kept for c in manifest.components)
    return total, items


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


def _sha256_and_size(path: Path) -> tuple[str, int]:
    return sha256_file(path), path.stat().st_size


def _check_files(
    checkpoint: Path, manifest: Manifest, report: Report, pool: ThreadPoolExecutor, progress
) -> None:
    """Every listed file present with its size and hash; nothing unlisted beside them."""
    present = []
    for entry in manifest.output_files:
        try:
            path = confined_path(checkpoint, entry.path, MANIFEST_NAME)
        except InputError as e:
            report.fail("integrity", "file size", str(e))
            continue
        if _file_present(path, entry.path, entry.size, report):
            present.append((entry, path))
    t0 = time.perf_counter()
    futures = [(entry, pool.submit(_sha256_and_size, path)) for entry, path in present]
    for entry, future in futures:
        digest, size = future.result()
        report.hashed_bytes += size
        progress.advance(size)
        ok = digest == entry.sha256
        report.record(
            "integrity",
            "file sha256",
            ok,
            ""
            if ok
            else (
                f"{entry.path}: SHA-256 {digest[:12]}... differs from the manifest's {entry.sha256[:12]}...: "
                "the file was changed or corrupted"
            ),
        )
    report.hash_seconds = time.perf_counter() - t0
    listed = {f.path for f in manifest.output_files} | {MANIFEST_NAME}
    report.mark("integrity", "unlisted files")
    for path in sorted(checkpoint.rglob("*")):
        rel = path.relative_to(checkpoint).as_posix()
        if path.is_file() and rel not in listed:
            report.fail(
                "integrity", "unlisted files", f"{rel}: not in the manifest (a stray or substituted file)"
            )


def _file_present(path: Path, rel: str, size: int, report: Report) -> bool:
    if not path.is_file():
        report.fail("integrity", "file size", f"{rel}: listed in the manifest but missing")
        return False
    actual = path.stat().st_size
    ok = actual == size
    report.record(
        "integrity",
        "file size",
        ok,
        "" if ok else f"{rel}: {actual} bytes, the manifest says {size}: truncated or changed",
    )
    return ok


def _check_recipe(checkpoint: Path, manifest: Manifest, recipe: Recipe | None, report: Report) -> None:
    """The manifest's recipe text, its hash and recipe.yaml agree, and name the components that are there."""
    text_ok = hashlib.sha256(manifest.recipe.text.encode()).hexdigest() == manifest.recipe.sha256
    report.record(
        "integrity",
        "recipe",
        text_ok,
        "" if text_ok else f"{MANIFEST_NAME}: the recipe text does not match its SHA-256 (edited manifest)",
    )
    path = checkpoint / RECIPE_NAME
    file_ok = path.is_file() and sha256_file(path) == manifest.recipe.sha256
    report.record(
        "integrity",
        "recipe",
        file_ok,
        ""
        if file_ok
        else f"{RECIPE_NAME}: missing, or not the recipe the manifest records (its SHA-256 differs)",
    )
    if recipe is None:
        report.fail("integrity", "recipe", f"{MANIFEST_NAME}: the recorded recipe is not a valid recipe")
        return
    stored = [c.path for c in manifest.components]
    ok = stored == recipe.components
    report.record(
        "integrity",
        "components",
        ok,
        "" if ok else f"{MANIFEST_NAME}: components {stored} but the recipe names {recipe.components}",
    )


def _open(root: Path, entry: ComponentEntry, fmt: Format | None, report: Report) -> Component | None:
    """The component as its format's container stored it, validated; a failure is recorded, not raised."""
    if fmt is None:
        return None
    try:
        component = get_container(format_info(fmt.NAME).container).open_stored(root, entry.path)
    except InputError as e:
        report.fail("integrity", "headers and index", str(e))
        return None
    report.record("integrity", "headers and index", True)
    return component


def _check_layout(
    component: Component, entry: ComponentEntry, manifest: Manifest, fmt: Format, report: Report
) -> set[str]:
    """Each quantized tensor's parts have its format's dtypes and shapes; the key count adds up; shard metadata
    and config.json are the format's. Returns the manifest keys of the tensors whose parts do not fit (parity
    skips them)."""
    expected_parts = 0
    damaged = set()
    for key, t in manifest.tensors.items():
        rel, name = split_manifest_key(key, [c.path for c in manifest.components])
        if rel != entry.path:
            continue
        parts = _recorded_parts(manifest, key, name, t, fmt, report)
        if parts is None:
            damaged.add(key)
            continue
        expected_parts += len(parts)
        if not _parts_fit(component, parts, fmt, report):
            damaged.add(key)
    _check_tensor_count(component, expected_parts + entry.kept, report)
    _check_shard_metadata(component, report)
    _check_config(component, entry, fmt, report)
    return damaged


def _recorded_parts(
    manifest: Manifest, key: str, name: str, t: TensorEntry, fmt: Format, report: Report
) -> dict[str, tuple[str, PartSpec]] | None:
    """The parts the manifest's entry for tensor `key` makes in `fmt` (`formats.quantized_parts`); None, and a
    failed check, where the format cannot hold what the manifest records."""
    try:
        options = fmt.options_type.from_type(t.type)  # the manifest names them (gguf: the GGML type)
        options = format_for(fmt, options).fitted(options, tuple(t.shape))  # as the plan fitted them
        parts = quantized_parts(fmt, module_name(name), tuple(t.shape), options)
    except ValueError as e:
        report.fail(
            "integrity",
            "manifest",
            f"{MANIFEST_NAME}: tensor {key!r} has shape {t.shape}, which {fmt.NAME} cannot hold ({e})",
        )
        return None
    try:  # a static input scale (`convert --calibrate`) is one more part
        calibrated = _recorded_input_scale(manifest, key, fmt, options)
    except ValueError as e:
        report.fail("integrity", "manifest", f"{MANIFEST_NAME}: tensor {key!r}: {e}")
        return None
    if calibrated is not options:
        parts = quantized_parts(fmt, module_name(name), tuple(t.shape), calibrated)
    return parts


def _parts_fit(
    component: Component, parts: dict[str, tuple[str, PartSpec]], fmt: Format, report: Report
) -> bool:
    """Each of `parts` is stored with its dtype and shape (one check each); whether all are."""
    all_fit = True
    for full, (dt, shape) in parts.values():
        info = component.tensors.get(full)
        fits = (
            info is not None
            and info.dtype == dt
            and (info.shape == shape if shape is not None else len(info.shape) == 1)
        )
        if not fits:
            all_fit = False
            found = "missing" if info is None else f"{info.dtype}{list(info.shape)}"
            wanted = f"{dt}{list(shape) if shape is not None else '[n]'}"
            where = component.dir if info is None else info.file.name
            report.fail(
                "integrity",
                "tensor layout",
                f"{where}: tensor {full!r} is {found}, {fmt.NAME} requires {wanted}",
            )
        else:
            report.record("integrity", "tensor layout", True)
    return all_fit


def _check_tensor_count(component: Component, expected: int, report: Report) -> None:
    """The component stores as many tensors as the manifest accounts for."""
    ok = len(component.tensors) == expected
    report.record(
        "integrity",
        "tensor count",
        ok,
        ""
        if ok
        else (
            f"{component.dir}: {len(component.tensors)} tensors stored, the manifest accounts for {expected} "
            "(a key was added or removed; --source names it)"
        ),
    )


def _check_shard_metadata(component: Component, report: Report) -> None:
    """Every shard of the component carries the same __metadata__."""
    metadata = list(component.metadata.values())
    ok = all(m == metadata[0] for m in metadata)
    report.record(
        "integrity", "shard metadata", ok, "" if ok else f"{component.dir}: the shards' __metadata__ differ"
    )


def _check_config(component: Component, entry: ComponentEntry, fmt: Format, report: Report) -> None:
    """config.json is the one the format's container writes for this component, quantization_config included."""
    config = component.config or {}
    source_config = {k: v for k, v in config.items() if k != "quantization_config"}
    container = get_container(format_info(fmt.NAME).container)
    ok = config == container.component_config(fmt, source_config, entry.kept_linears)
    report.record(
        "integrity",
        "config",
        ok,
        ""
        if ok
        else f"{component.config_path}: quantization_config is not the one {fmt.NAME} writes for this checkpoint",
    )


def _recorded_input_scale(manifest: Manifest, key: str, fmt: Format, options):
    """`options` with the static input scale the manifest's calibration records for tensor `key` (re-derived from
    its recorded amax: `Format.calibrated`), or as they are; ValueError where the record is not what the format
    makes of that amax."""
    entry = None if manifest.calibration is None else manifest.calibration.tensors.get(key)
    if entry is None:
        return options
    calibrated = format_for(fmt, options).calibrated(options, entry.input_amax)
    if calibrated is None:
        raise ValueError(f"its {options.type_name} layout has no input scale, the calibration records one")
    if calibrated.input_scale != entry.input_scale:
        raise ValueError(
            f"the calibration records the input scale {entry.input_scale!r}, its amax makes {calibrated.input_scale!r}"
        )
    if entry.smoothing is not None:  # a pre_quant_scale of one value per input (the values are the file's)
        width = manifest.tensors[key].shape[-1]
        calibrated = format_for(fmt, options).smoothed(calibrated, (1.0,) * width)
        if calibrated is None:
            raise ValueError(
                f"its {options.type_name} layout has no pre_quant_scale, the calibration records one"
            )
    return calibrated


def _stored_smoothing(
    manifest: Manifest, components: dict[str, Component | None], fmt: Format
) -> dict[str, tuple[float, ...]]:
    """The ``pre_quant_scale`` each Linear the calibration records as smoothed stores (by manifest key), read from
    the checkpoint: the plan re-encodes the source with it (what the calibration chose is a record, as the amax
    is; the weight is re-quantized with it bit for bit). A layer whose part is missing or no [in] float32 tensor
    of powers of two is left out: its keys and layout checks name it."""
    found = {}
    if manifest.calibration is None:
        return found
    names = [c.path for c in manifest.components]
    for key, entry in manifest.calibration.tensors.items():
        if entry.smoothing is None:
            continue
        rel, name = split_manifest_key(key, names)
        stored = components.get(rel)
        recorded = manifest.tensors[key]
        try:  # a record the format cannot hold fails the integrity checks (`_recorded_parts`)
            options = _recorded_input_scale(manifest, key, fmt, fmt.options_type.from_type(recorded.type))
            parts = quantized_parts(fmt, module_name(name), tuple(recorded.shape), options)
        except ValueError:
            continue
        full, spec = parts["pre_quant_scale"]
        info = None if stored is None else stored.tensors.get(full)
        if info is None or info.dtype != spec[0] or tuple(info.shape) != spec[1]:
            continue
        values = read_tensor(info)
        mantissa, _ = torch.frexp(values)
        if bool(torch.all((mantissa == 0.5) & torch.isfinite(values))):
            found[key] = tuple(values.tolist())
    return found


# --- provenance --------------------------------------------------------------------------------


def _check_provenance(
    source: Path, manifest: Manifest, report: Report, pool: ThreadPoolExecutor, progress
) -> None:
    """The source is the one the checkpoint was made from (a file given as the source: listed in its folder)."""
    present, folder = [], source.parent if source.is_file() else source
    for entry in manifest.source_files:
        path = confined_path(folder, entry.path, MANIFEST_NAME)
        if path.is_file():
            present.append((entry, path))
        else:
            report.fail("provenance", "source sha256", f"{path}: missing from the source")
    futures = [(entry, path, pool.submit(sha256_file, path)) for entry, path in present]
    for entry, path, future in futures:
        ok = future.result() == entry.sha256
        progress.advance(entry.size)
        report.record(
            "provenance",
            "source sha256",
            ok,
            ""
            if ok
            else (
                f"{path}: SHA-256 differs from the manifest's: this is not the source the checkpoint was made from"
            ),
        )


# --- parity ------------------------------------------------------------------------------------


def _check_parity(
    source: SourceFolder,
    recipe: Recipe,
    steps: Sequence[TensorStep],
    components: dict[str, Component | None],
    damaged: set[str],
    fmt: Format,
    manifest: Manifest,
    report: Report,
    pool: ThreadPoolExecutor,
    progress,
) -> Plan | None:
    """The stored keys are the recipe's plan for this source, and every tensor is what the plan says."""
    try:
        plan = make_plan(source, recipe, steps=steps)
        if manifest.calibration is not None:  # the static input scales, re-derived from the amaxes recorded
            amax = {key: e.input_amax for key, e in manifest.calibration.tensors.items()}
            plan = with_input_scales(plan, amax, _stored_smoothing(manifest, components, fmt))
    except QuantizeError as e:
        report.fail("parity", "keys", f"the recipe no longer applies to {source.folder}: {e}")
        return None
    report.mark("parity", "keys")
    for cp in plan.components:
        stored = components.get(cp.rel)
        if stored is None:
            if cp.rel not in components:
                report.fail(
                    "parity", "keys", f"component {cp.rel!r} of the recipe is missing from the checkpoint"
                )
            continue
        _check_keys(cp, stored, report)
        _check_format_metadata(cp, stored, fmt, report)
        futures = [
            pool.submit(
                _check_tensor,
                cp.rel,
                tp,
                stored,
                fmt,
                recipe,
                manifest.tensors.get(cp.manifest_key(tp)),
                progress,
            )
            for tp in cp.tensors
            if all(spec.name in stored.tensors for spec in tp.outputs) and cp.manifest_key(tp) not in damaged
        ]
        for future in futures:
            for category, name, ok, failure in future.result():
                report.record(category, name, ok, failure)
    return plan


def _check_keys(cp: ComponentPlan, stored: Component, report: Report) -> None:
    """The component stores exactly the keys its plan makes."""
    expected = {spec.name for tp in cp.tensors for spec in tp.outputs}
    for key in sorted(expected - set(stored.tensors)):
        report.fail("parity", "keys", f"{stored.dir}: tensor {key!r} is missing")
    for key in sorted(set(stored.tensors) - expected):
        report.fail("parity", "keys", f"{stored.dir}: tensor {key!r} is not in the recipe's plan (extra key)")


def _check_format_metadata(cp: ComponentPlan, stored: Component, fmt: Format, report: Report) -> None:
    """Every file's metadata is what the plan writes (the container says what that is: torchao's tensor JSON in
    a shard's ``__metadata__``, a GGUF file's key-values)."""
    container = get_container(format_info(fmt.NAME).container)
    for check, ok, failure in container.stored_metadata(cp, fmt, stored):
        report.record("parity", check, ok, failure)


Result = tuple[str, str, bool, str]


def _check_tensor(
    rel: str,
    tp: TensorPlan,
    stored: Component,
    fmt: Format,
    recipe: Recipe,
    entry: TensorEntry | None,
    progress,
) -> list[Result]:
    try:
        results = (
            _check_quantized(rel, tp, stored, fmt, recipe, entry)
            if tp.quantize
            else [_check_kept(rel, tp, stored)]
        )
    except Exception as e:  # damaged data that no earlier check caught: a failed check, not a crash
        results = [
            ("parity", "decode", False, f"{rel}/{tp.name}: cannot be read back: {type(e).__name__}: {e}")
        ]
    progress.advance(tp.info.nbytes)
    return results


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _same_part(part: str, fmt: Format, mine: torch.Tensor, stored: torch.Tensor) -> bool:
    """Bit-exact, except a format's code tables, which some libraries compute a last bit differently per CPU."""
    if part in fmt.CODE_TABLES:
        return (
            mine.shape == stored.shape
            and mine.dtype == stored.dtype
            and torch.allclose(mine, stored, rtol=1e-6, atol=0)
        )
    return _same(mine, stored)


def _db(x: float | None) -> str:
    return "exact" if x is None else f"{x:.2f} dB"


def _check_quantized(
    rel: str, tp: TensorPlan, stored: Component, fmt: Format, recipe: Recipe, entry: TensorEntry | None
) -> list[Result]:
    """Requantizing the source reproduces the stored parts, whose error figures pass the recipe's checks and
    are the ones the manifest records."""
    infos = {part: stored.tensors[spec.name] for part, spec in zip(tp.parts, tp.outputs, strict=True)}
    stats, identical = _requantized(tp, fmt, infos)
    shard = infos[next(iter(infos))].file.name
    where = f"{rel}/{shard} -> {tp.name}"
    return [
        (
            "parity",
            "requantize",
            identical,
            "" if identical else f"{where}: requantizing the source does not reproduce the stored bytes",
        ),
        *_check_figures(where, stats, recipe.checks, entry),
    ]


def _requantized(tp: TensorPlan, fmt: Format, infos: dict[str, TensorInfo]) -> tuple[ErrorStats, bool]:
    """The source encoded again and compared, chunk by chunk, with the stored parts `infos`: the error figures
    of the stored parts, and whether every encoded part is the stored one."""
    identical = True

    def compare(parts: dict[str, torch.Tensor], rows: tuple[int, int] | None) -> dict[str, torch.Tensor]:
        """Requantized parts against the stored ones (the same rows); the stored ones are what is measured."""
        nonlocal identical
        mine = {  # a row chunk's parts (their rows from r0: a padded format's last chunk has more), or the
            # weight's whole parts (`WEIGHT_PARTS`)
            part: read_tensor(infos[part])
            if rows is None
            else read_rows(infos[part], rows[0], rows[0] + len(t))
            for part, t in parts.items()
        }
        identical &= all(
            _same_part(part, format_for(fmt, tp.options), t, mine[part]) for part, t in parts.items()
        )
        return mine

    stats = encode_and_measure(tp, fmt, compare)
    return stats, identical


def _check_figures(where: str, stats: ErrorStats, checks: Checks, entry: TensorEntry | None) -> list[Result]:
    """The decoded weight is finite, within the recipe's `checks`, and has the figures the manifest records."""
    sqnr, cosine = stats.sqnr_db, stats.cosine
    finite = math.isfinite(stats.max_abs) and math.isfinite(cosine)
    results: list[Result] = [
        ("parity", "weight finite", finite, "" if finite else f"{where}: decodes to NaN or Inf")
    ]
    if checks.min_sqnr_db is not None:
        ok = sqnr is None or sqnr >= checks.min_sqnr_db
        results.append(
            (
                "parity",
                "weight SQNR",
                ok,
                ""
                if ok
                else f"{where}: SQNR {_db(sqnr)} below the recipe's min_sqnr_db {checks.min_sqnr_db}",
            )
        )
    if checks.min_cosine is not None:
        ok = cosine >= checks.min_cosine
        results.append(
            (
                "parity",
                "weight cosine",
                ok,
                ""
                if ok
                else f"{where}: cosine {cosine:.6f} below the recipe's min_cosine {checks.min_cosine}",
            )
        )
    ok = entry is not None and _close_figures(entry, sqnr, cosine, stats.max_abs)
    results.append(
        (
            "parity",
            "recorded error",
            ok,
            "" if ok else f"{where}: differs from the error figures the manifest records",
        )
    )
    return results


def _close_figures(entry: TensorEntry, sqnr: float | None, cosine: float, max_abs: float) -> bool:
    """The manifest's figures, as measured now: equal on this machine, within float32-summation noise elsewhere."""
    if (entry.sqnr_db is None) != (sqnr is None):
        return False
    if sqnr is not None and not abs(entry.sqnr_db - sqnr) <= 0.01:
        return False
    return abs(entry.cosine - cosine) <= 1e-6 and abs(entry.max_abs_error - max_abs) <= 1e-5 * max(
        1.0, abs(max_abs)
    )


def _check_kept(rel: str, tp: TensorPlan, stored: Component) -> Result:
    spec = tp.output()
    info = stored.tensors[spec.name]
    where = f"{rel}/{info.file.name} -> {spec.name}"
    if info.dtype != spec.dtype or info.shape != tp.info.shape:
        return (
            "parity",
            "kept tensors",
            False,
            f"{where}: is {info.dtype}{list(info.shape)}, expected {spec.dtype}{list(tp.info.shape)}",
        )
    ok = all(_same(rows, read_rows(info, r0, r1)) for r0, r1, rows in kept_rows(tp))
    what = "bit-exact copy" if spec.dtype == tp.info.dtype else f"exact cast to {spec.dtype}"
    return ("parity", "kept tensors", ok, "" if ok else f"{where}: is not a {what} of the source")
