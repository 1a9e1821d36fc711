"""The `quantize` command line: the only place that parses arguments, prints, or picks exit codes."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import statistics
import sys
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from .errors import InputError, QuantizeError

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
for _c in (out, err):
    if not _c.is_terminal:  # logs and pipes: wide lines rather than wrapped tables
        _c.width = max(_c.width, 160)
_state = {"debug": False}


# --- progress ----------------------------------------------------------------------------------


class _RichProgress:
    """A progress bar with bytes, items (tensors, files), rate and ETA, for a terminal."""

    def __init__(self, label: str, unit: str):
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=False),
            TextColumn("{task.fields[items]}/{task.fields[total_items]} " + unit),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        self._label = label
        self._task = None
        self._lock = threading.Lock()
        self._items = 0

    def start(self, total_bytes: int, total_items: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task(self._label, total=total_bytes, items=0, total_items=total_items)

    def advance(self, nbytes: int, items: int = 1) -> None:
        with self._lock:
            self._items += items
            self._bar.update(self._task, advance=nbytes, items=self._items)

    def note(self, text: str) -> None:
        pass

    def stop(self) -> None:
        self._bar.stop()


class _PlainProgress:
    """Plain progress lines (every 10% or 10 s), for logs and pipes."""

    def __init__(self, label: str, unit: str):
        self._label, self._unit = label, unit
        self._lock = threading.Lock()
        self._done = self._items = 0
        self._total = self._total_items = 0
        self._t0 = self._last_t = time.monotonic()
        self._last_pct = 0

    def start(self, total_bytes: int, total_items: int) -> None:
        self._total, self._total_items = total_bytes, total_items
        self._t0 = self._last_t = time.monotonic()
        err.print(f"{self._label}: {total_items} {self._unit}, {_gb(total_bytes)}")

    def advance(self, nbytes: int, items: int = 1) -> None:
        with self._lock:
            self._done += nbytes
            self._items += items
            now = time.monotonic()
            pct = 100 * self._done // max(1, self._total)
            if pct >= self._last_pct + 10 or now - self._last_t >= 10 or self._items == self._total_items:
                rate = self._done / max(now - self._t0, 1e-9)
                eta = (self._total - self._done) / rate if rate else 0
                err.print(
                    f"{self._label}: {pct:3d}%  {_gb(self._done)}/{_gb(self._total)}  "
                    f"{self._items}/{self._total_items} {self._unit}  {_gb(rate)}/s  ETA {eta:.0f}s"
                )
                self._last_pct, self._last_t = pct, now

    def note(self, text: str) -> None:
        err.print(f"{self._label}: {text}")

    def stop(self) -> None:
        pass


def _progress(label: str, unit: str = "tensors", on_start=None):
    """The progress display for this terminal or log; `on_start()` runs when the work starts (after the plan)."""
    progress = _RichProgress(label, unit) if err.is_terminal else _PlainProgress(label, unit)
    if on_start is not None:
        start = progress.start

        def started(total_bytes: int, total_items: int) -> None:
            on_start()
            start(total_bytes, total_items)

        progress.start = started
    return progress


def _gb(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale / 10:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


#: loggers of what importing diffusers pulls in, warning about optional kernels a CPU pass never uses
#: (torchao's CUDA libraries, bitsandbytes' kernels package, torch.compile's registrations)
_IMPORT_NOISE = ("torchao", "torch.utils._pytree", "bitsandbytes", "diffusers")


def _quiet_model_imports() -> None:
    """Before a forward pass imports diffusers: its libraries' import warnings hidden (shown with --debug)."""
    if not _state["debug"]:
        for name in _IMPORT_NOISE:
            logging.getLogger(name).setLevel(logging.ERROR)
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")  # diffusers sets its own level when imported


def _inputs_option(lead: str):
    """--inputs FILE: a forward pass's inputs captured from a pipeline (verify --forward, sensitivity)."""
    return click.option(
        "--inputs",
        type=click.Path(path_type=Path, exists=True, dir_okay=False),
        default=None,
        metavar="FILE",
        help=f"{lead} forward pass's inputs (latents, timestep, text embeddings) as safetensors "
        "[default: fixed random].",
    )


# --- commands ----------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="dit-quantize")
def cli(debug: bool) -> None:
    """Offline quantization of video diffusion transformers into pre-quantized safetensors checkpoints."""
    _state["debug"] = debug


@cli.command("recipes")
@click.argument("name", required=False)
@click.option(
    "--for",
    "source",
    default=None,
    metavar="SOURCE",
    help="Only the recipes that fit this source folder (its layout detected, each recipe planned on it).",
)
def recipes_cmd(name: str | None, source: str | None) -> None:
    """List the bundled recipes, or print the YAML of one (to copy and edit)."""
    from .recipes import bundled_recipe, bundled_recipes

    if name and source is not None:
        raise InputError(
            "give a recipe NAME (to print it) or --for SOURCE (to list those that fit), not both"
        )
    if name:
        loaded = bundled_recipe(name)
        click.echo(bundled_recipes()[loaded.origin.removeprefix("bundled:")], nl=False)
        return
    if source is not None:
        _recipes_for(Path(source))
        return
    table = Table(title="Bundled recipes (quantize recipes NAME prints one)", title_justify="left")
    for col in ("recipe", "format", "components", "what it is for"):
        table.add_column(col)
    for file in bundled_recipes():
        r = bundled_recipe(file).recipe
        table.add_row(file, r.format, ", ".join(r.components), r.description.strip().splitlines()[0])
    out.print(table)


def _recipes_for(source: Path) -> None:
    from .detect import DEFAULT_RECIPES, detect_layouts
    from .plan import make_plan
    from .recipes import bundled_recipe, bundled_recipes

    layouts = detect_layouts(source)
    for lay in layouts:
        out.print(f"{escape(str(source))}: {lay.name} ({lay.why})")
    if not layouts:
        out.print(f"{escape(str(source))}: no known layout; trying every bundled recipe")
    defaults = {r: fmt for lay in layouts for fmt, r in DEFAULT_RECIPES[lay.name].items()}
    table = Table(
        title=f"Bundled recipes that fit {escape(str(source))} (each one planned on it)", title_justify="left"
    )
    for col in ("recipe", "format", "default for", "what it is for"):
        table.add_column(col)
    fits = 0
    for file in bundled_recipes():
        r = bundled_recipe(file).recipe
        try:
            make_plan(source, r)
        except QuantizeError:
            continue
        fits += 1
        default = f"--format {defaults[r.name]}" if r.name in defaults else ""
        table.add_row(file, r.format, default, r.description.strip().splitlines()[0])
    if not fits:
        raise InputError(
            f"{source}: no bundled recipe fits it: write one (quantize recipes NAME prints one to start from)"
        )
    out.print(table)


def _recipe_option(f):
    f = click.option(
        "--format",
        "fmt",
        default=None,
        metavar="FORMAT",
        help="Instead of --recipe: the bundled recipe of this format for SOURCE's detected layout "
        "(fp8_channel, torchao_fp8, nf4, comfy_fp8, comfy_int8, gguf); the first line names it and why.",
    )(f)
    return click.option(
        "--recipe",
        "-r",
        "recipe",
        default=None,
        help="Recipe: a YAML file, or a bundled recipe name (see `quantize recipes`, `quantize recipes --for SOURCE`).",
    )(f)


def _chosen_recipe(source: str, recipe: str | None, fmt: str | None) -> str:
    """--recipe as given, or the bundled recipe --format picks for SOURCE's layout (said in the first line)."""
    if (recipe is None) == (fmt is None):
        raise InputError("give --recipe RECIPE or --format FORMAT (one of them)")
    if recipe is not None:
        return recipe
    from .detect import recipe_for_format

    folder = Path(source)
    if folder.exists() and not folder.is_dir():
        raise InputError(
            f"{source}: not a folder: SOURCE is a model's folder (or a Hub repo id, with --recipe)"
        )
    if not folder.is_dir():
        raise InputError(
            f"{source}: no such folder; --format looks inside a local folder (for a Hub repo id, give --recipe: "
            "quantize recipes lists them)"
        )
    name, layout = recipe_for_format(folder, fmt)
    out.print(f"recipe {name}: {layout.why}")
    return name


def _lora_options(f):
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
        "strength 1.0 unless given; COMPONENT= for one component only (e.g. high_noise_model=high.safetensors).",
    )(f)


@cli.command("plan")
@click.argument("source")
@_recipe_option
@_lora_options
def plan_cmd(
    source: str, recipe: str | None, fmt: str | None, loras: tuple[str, ...], lora_unmatched: str
) -> None:
    """Dry run: what each tensor of SOURCE (a folder or a Hub repo id) becomes under RECIPE, and the sizes."""
    from .hub import recipe_files, resolve_source
    from .lora import open_loras
    from .plan import make_plan
    from .recipes import load_recipe

    loaded = load_recipe(_chosen_recipe(source, recipe, fmt))
    merge = open_loras(loras, lora_unmatched, loaded.recipe.components, Path(source)) if loras else None
    folder, _, _ = resolve_source(source, recipe_files(loaded.recipe))
    plan = make_plan(folder, loaded.recipe, steps=[merge] if merge else ())
    labels = {p: f"t{i}" for i, p in enumerate(plan.recipe.targets, 1)} | {
        p: f"i{i}" for i, p in enumerate(plan.recipe.ignore, 1)
    }
    table = Table(title=f"{source} with {loaded.origin}: what each tensor becomes", title_justify="left")
    for col, just in (
        ("component", "left"),
        ("tensors (* = every block)", "left"),
        ("n", "right"),
        ("dtype", "left"),
        ("becomes", "left"),
        ("by", "left"),
        ("before", "right"),
        ("after", "right"),
    ):
        table.add_column(col, justify=just)
    for rel, generic, n, dt, becomes, pattern, before, after in _plan_groups(plan):
        table.add_row(
            rel, escape(generic), str(n), dt, becomes, labels.get(pattern, ""), _gb(before), _gb(after)
        )
    table.add_section()
    table.add_row(
        "total", "", str(plan.tensor_count), "", "", "", _gb(plan.source_bytes), _gb(plan.output_bytes)
    )
    out.print(table)
    hits = Table(
        title="Recipe patterns (re.fullmatch on module names) and the tensors each decided",
        title_justify="left",
    )
    hits.add_column("by")
    hits.add_column("pattern")
    for cp in plan.components:
        hits.add_column(f"in {cp.rel}", justify="right")
    for p, label in labels.items():
        hits.add_row(label, escape(p), *(str(cp.pattern_matches[p]) for cp in plan.components))
    out.print(hits)
    if merge is not None:
        _print_loras(merge, [cp.rel for cp in plan.components])
    ratio = plan.output_bytes / max(1, plan.source_bytes)
    out.print(
        f"{_gb(plan.source_bytes)} -> {_gb(plan.output_bytes)} ({ratio:.0%} of the source) as {plan.recipe.format}"
    )


def _print_loras(merge, components: list[str]) -> None:
    table = Table(
        title="LoRAs merged before quantizing, in order: source tensors each one changes",
        title_justify="left",
    )
    for col in ("LoRA", "strength", "keys"):
        table.add_column(col, justify="left" if col == "LoRA" else "right")
    for rel in components:
        table.add_column(f"in {rel}", justify="right")
    table.add_column("keys skipped", justify="right")
    for lora, touched, ignored in zip(merge.loras, merge.touched, merge.ignored, strict=True):
        table.add_row(
            escape(str(lora.spec.path)),
            f"{lora.spec.strength:g}",
            str(lora.keys),
            *(str(touched[rel]) if rel in touched else "-" for rel in components),
            str(sum(len(keys) for keys in ignored.values())),
        )
    out.print(table)
    for lora, ignored in zip(merge.loras, merge.ignored, strict=True):
        for rel, keys in ignored.items():
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            out.print(f"{escape(lora.spec.path.name)}: skipped in {rel} (match no tensor): {escape(shown)}")


def _star_blocks(name: str) -> str:
    """``blocks.12.ffn.0.weight`` -> ``blocks.*.ffn.0.weight`` (any ``*blocks.N.`` segment)."""
    return re.sub(r"(?<=blocks)\.\d+\.", ".*.", name)


def _plan_groups(plan) -> list[tuple]:
    """Tensors grouped by name with block numbers starred, then by what they become."""
    groups: dict[tuple, list] = defaultdict(list)
    for cp in plan.components:
        for tp in cp.tensors:
            generic = _star_blocks(tp.name)
            if tp.output_name != tp.name:  # the format's name table renames it (native Wan names, say)
                generic += f" -> {_star_blocks(tp.output_name)}"
            kept_as = tp.outputs[0].dtype
            becomes = (
                " ".join(filter(None, (plan.recipe.format, tp.qtype)))  # gguf Q4_K
                if tp.quantize
                else ("keep" if kept_as == tp.info.dtype else f"keep as {kept_as}")
            )
            groups[(cp.rel, generic, tp.info.dtype, becomes, tp.pattern or "")].append(tp)
    rows = []
    for (rel, generic, dt, becomes, pattern), tps in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1])
    ):
        rows.append(
            (
                rel,
                generic,
                len(tps),
                dt,
                becomes,
                pattern,
                sum(t.info.nbytes for t in tps),
                sum(t.output_bytes for t in tps),
            )
        )
    return rows


@cli.command("convert")
@click.argument("source")
@click.argument("output", type=click.Path(path_type=Path))
@_recipe_option
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
@_lora_options
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
) -> None:
    """Convert the safetensors checkpoint SOURCE (a folder or a Hub repo id) into OUTPUT following RECIPE."""
    from .converter import convert
    from .layout import parse_size
    from .process import tune_for_streaming

    max_bytes = parse_size(max_shard_size, "--max-shard-size")
    t0 = time.monotonic()
    recipe = _chosen_recipe(source, recipe, fmt)
    progress = _progress("convert", on_start=tune_for_streaming)  # started once torch is imported and planned
    try:
        manifest = convert(
            source,
            output,
            recipe,
            overwrite=overwrite,
            max_shard_size=max_bytes,
            workers=workers,
            progress=progress,
            base_model=base_model,
            loras=loras,
            lora_unmatched=lora_unmatched,
            on_recovery=_report_recovery,
        )
    finally:
        progress.stop()
    elapsed = time.monotonic() - t0
    src = sum(c.source_bytes for c in manifest.components)
    dst = sum(c.output_bytes for c in manifest.components)
    sqnrs = [t.sqnr_db for t in manifest.tensors.values() if t.sqnr_db is not None]
    quantized = sum(c.quantized for c in manifest.components)
    kept = sum(c.kept for c in manifest.components)
    out.print(
        f"wrote {output}: {quantized} tensors quantized to {manifest.format}, {kept} kept; {_gb(src)} -> {_gb(dst)} in {elapsed:.1f}s ({_gb(src / max(elapsed, 1e-9))}/s)"
    )
    _print_merged_loras(manifest)
    if sqnrs:
        out.print(f"weight SQNR: min {min(sqnrs):.1f} dB, median {statistics.median(sqnrs):.1f} dB")


def _report_recovery(step: str) -> None:
    err.print(f"convert: {escape(step)}, left by a conversion that was killed")


@cli.command("verify")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--source",
    default=None,
    help="The source checkpoint (a folder or a Hub repo id): adds provenance and parity checks.",
)
@click.option(
    "--forward", is_flag=True, help="Also compare one forward pass of the source and the quantized model."
)
@_inputs_option("With --forward: the")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--workers", type=int, default=None, help="Threads hashing and comparing [default: all cores].")
@click.option(
    "--lora",
    "loras",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    metavar="FILE",
    help="A LoRA the checkpoint was made with, when it is not where the manifest says (found by SHA-256).",
)
def verify_cmd(
    checkpoint: Path,
    source: str | None,
    forward: bool,
    inputs: Path | None,
    as_json: bool,
    workers: int | None,
    loras: tuple[Path, ...],
) -> int:
    """Prove CHECKPOINT: hashes and layout; with --source, provenance and per-tensor parity. Exit 1 if a check fails."""
    if forward:
        _quiet_model_imports()
    from .process import tune_for_streaming
    from .verify import verify

    tune_for_streaming()
    if source is not None:
        from .hub import resolve_source
        from .manifest import read_manifest

        listed = {f.path for f in read_manifest(checkpoint).source_files}
        source, _, _ = resolve_source(source, lambda files: sorted(listed & set(files)))

    progress = _progress("verify", "files and tensors") if not as_json else None
    try:
        report = verify(
            checkpoint,
            source,
            forward=forward,
            inputs=inputs,
            workers=workers,
            progress=progress,
            loras=loras,
        )
    finally:
        if progress is not None:
            progress.stop()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return 0 if report.ok else 1
    table = Table(title=f"verify {escape(str(checkpoint))}", title_justify="left")
    for col, just in (
        ("category", "left"),
        ("check", "left"),
        ("passed", "right"),
        ("failed", "right"),
        ("", "left"),
    ):
        table.add_column(col, justify=just)
    for row in report.to_dict()["checks"]:
        mark = "[green]ok[/]" if row["ok"] else "[red]FAILED[/]"
        table.add_row(row["category"], row["check"], str(row["passed"]), str(len(row["failures"])), mark)
    out.print(table)
    failures = [f for c in report.checks.values() for f in c.failures]
    for failure in failures[:20]:
        out.print(f"[red]x[/] {escape(failure)}", soft_wrap=True)
    if len(failures) > 20:
        out.print(f"... and {len(failures) - 20} more (--json lists them all)")
    for rel, figure in report.forward.items():
        out.print(
            f"forward in {escape(rel)}: {figure['model']} output SQNR {_db_text(figure['output_sqnr_db'])} "
            f"(min_forward_sqnr_db {figure['min_forward_sqnr_db']})"
        )
    hashing = f"hashed {_gb(report.hashed_bytes)} at {_gb(report.hash_gbps * 1e9)}/s"
    if report.ok:
        scope = (
            "integrity"
            if source is None
            else "integrity, provenance and parity" + (", forward" if forward else "")
        )
        out.print(f"[green]verified[/] {escape(str(checkpoint))}: {scope} checks passed ({hashing})")
        return 0
    out.print(
        f"[red]verification failed[/]: {len(failures)} problem(s) in {escape(str(checkpoint))} ({hashing})"
    )
    return 1


@cli.command("sensitivity")
@click.argument("source")
@_recipe_option
@_inputs_option("The")
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
    help="Propose the best measured forward SQNR whose tensors fit SIZE (e.g. 11GB for a 12 GB GPU).",
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
@_lora_options
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
    and with --min-forward-sqnr or --max-size propose the recipe that raises the most sensitive ones."""
    from .hub import recipe_files, resolve_source
    from .layout import parse_size
    from .lora import open_loras
    from .plan import make_plan
    from .recipes import dump_recipe, load_recipe, parse_recipe
    from .sensitivity import measure, propose

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
    loaded = load_recipe(_chosen_recipe(source, recipe, fmt))

    def steps() -> list:  # the LoRAs merged into the source (a fresh merge for each plan)
        return [open_loras(loras, lora_unmatched, loaded.recipe.components, Path(source))] if loras else []

    steps()  # a bad LoRA fails before anything is fetched
    folder, _, _ = resolve_source(source, recipe_files(loaded.recipe))
    from .forward import require_known_models
    from .process import tune_for_streaming

    _quiet_model_imports()
    require_known_models(folder, loaded.recipe, inputs)
    tune_for_streaming()
    plan = make_plan(folder, loaded.recipe, steps=steps())
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
        make_plan(folder, parse_recipe(text, str(write_recipe)), steps=steps())  # valid, and plans here
        _write_text_atomically(write_recipe, text)
        written = write_recipe
    if as_json:
        click.echo(json.dumps(_sensitivity_json(measured, proposal, written), indent=2))
    else:
        _print_sensitivity(measured, proposal, written, top, loaded.origin, elapsed)
    if proposal is not None and not proposal.reached:
        return 1
    return 0


def _db(value: float | None) -> float | None:
    """A figure for JSON: infinite (exact) becomes null."""
    return None if value is None or math.isinf(value) else round(value, 3)


def _sensitivity_json(measured, proposal, written: Path | None) -> dict:
    fmt = measured.plan.format
    data = {
        "recipe": measured.plan.recipe.name,
        "format": fmt.NAME,
        "layers": [
            {
                "module": lay.module,
                "component": lay.component,
                "type": lay.rungs[0].label(fmt),
                "output_sqnr_db": _db(lay.output_sqnr_db(0)),
                "weight_sqnr_db": _db(lay.weight_sqnr[0]),
                "bytes": lay.bytes[0],
            }
            for lay in measured.sorted_layers()
        ],
        "forward_sqnr_db": _db(measured.worst_forward_sqnr_db),
        "components": {rel: {"forward_sqnr_db": _db(db)} for rel, db in measured.forward_sqnr_db.items()},
        "bytes": measured.plan.output_bytes,
    }
    if proposal is not None:
        data["proposal"] = {
            "reached": proposal.reached,
            "forward_sqnr_db": _db(proposal.worst_forward_sqnr_db),
            "bytes": proposal.bytes,
            "recipe_bytes": proposal.base_bytes,
            "raised": [{"module": m, "type": t} for m, t in proposal.raised],
            "passes": proposal.passes,
            "recipe_file": None if written is None else str(written),
        }
    return data


def _print_sensitivity(measured, proposal, written, top: int, origin: str, elapsed: float) -> None:
    fmt = measured.plan.format
    layers = measured.sorted_layers()
    shown = layers if top <= 0 else layers[:top]
    table = Table(
        title=f"Sensitivity under {escape(origin)}: each quantized Linear's output SQNR (X·Q(W) against X·W), "
        "most sensitive first",
        title_justify="left",
    )
    for col, just in (
        ("module", "left"),
        ("component", "left"),
        ("type", "left"),
        ("output SQNR", "right"),
        ("weight SQNR", "right"),
        ("bytes", "right"),
    ):
        table.add_column(col, justify=just)
    for lay in shown:
        table.add_row(
            escape(lay.module),
            lay.component,
            lay.rungs[0].label(fmt),
            _db_text(lay.output_sqnr_db(0)),
            _db_text(lay.weight_sqnr[0]),
            _gb(lay.bytes[0]),
        )
    out.print(table)
    if len(shown) < len(layers):
        out.print(f"... and {len(layers) - len(shown)} more (--top 0 or --json lists them all)")
    component_bytes = {cp.rel: cp.output_bytes for cp in measured.plan.components}
    for rel, db in measured.forward_sqnr_db.items():
        out.print(
            f"forward SQNR of the recipe in {escape(rel)}: {_db_text(db)} ({_gb(component_bytes[rel])} of tensors)"
        )
    if proposal is None:
        out.print(f"measured in {elapsed:.1f}s")
        return
    raised = ", ".join(f"{escape(m)} -> {t}" for m, t in proposal.raised[:8])
    more = f" and {len(proposal.raised) - 8} more" if len(proposal.raised) > 8 else ""
    change = proposal.bytes / max(1, proposal.base_bytes) - 1
    figure = f"forward SQNR {_db_text(proposal.worst_forward_sqnr_db)}"
    sizes = f"{_gb(proposal.bytes)} against the recipe's {_gb(proposal.base_bytes)} ({change:+.1%})"
    if not proposal.reached:
        out.print(
            f"[red]not reached[/]: {figure} with {len(proposal.raised)} layer(s) raised; {sizes}"
            + ("" if proposal.raised else ": the recipe alone does not fit --max-size")
        )
        return
    out.print(f"proposal: {len(proposal.raised)} layer(s) raised ({raised}{more}); {figure}; {sizes}")
    if written is not None:
        out.print(
            f"wrote {escape(str(written))}: convert with --recipe {escape(str(written))}, then "
            "verify --forward proves its min_forward_sqnr_db"
        )
    out.print(f"measured in {elapsed:.1f}s ({proposal.passes + 2} passes)")


def _db_text(value: float | None) -> str:
    return "exact" if value is None or math.isinf(value) else f"{value:.2f} dB"


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write the recipe: {e}") from None


@cli.command("upload")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("repo_id")
@click.option(
    "--private", is_flag=True, help="Create the repo private (an existing repo keeps its visibility)."
)
@click.option("--revision", default=None, help="Branch to upload to (created if needed) [default: main].")
@click.option("--message", default=None, help="Commit message.")
@click.option("--dry-run", is_flag=True, help="List what would be sent, with sizes; send nothing.")
def upload_cmd(
    checkpoint: Path, repo_id: str, private: bool, revision: str | None, message: str | None, dry_run: bool
) -> None:
    """Publish CHECKPOINT to the Hugging Face Hub as REPO_ID, after verify's integrity checks pass."""
    from .hub import check_repo_id, has_token, upload, upload_files
    from .verify import verify

    check_repo_id(repo_id)
    if not dry_run and not has_token():
        raise InputError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (nothing was sent)")
    progress = _progress("verify", "files and tensors")
    try:
        report = verify(checkpoint, progress=progress)
    finally:
        progress.stop()
    if not report.ok:
        failures = [f for c in report.checks.values() for f in c.failures]
        raise InputError(
            f"{checkpoint}: fails verify's integrity checks ({len(failures)} problem(s), first: {failures[0]}); "
            f"nothing was sent: run `quantize verify {checkpoint}`"
        )
    files = upload_files(checkpoint)
    table = Table(
        title=f"{escape(str(checkpoint))} -> {escape(repo_id)}" + (f" @ {revision}" if revision else "")
    )
    table.add_column("file")
    table.add_column("size", justify="right")
    for f in files:
        table.add_row(escape(f.path), _gb(f.size))
    total = sum(f.size for f in files)
    table.add_section()
    table.add_row(f"{len(files)} files", _gb(total))
    out.print(table)
    if dry_run:
        out.print("dry run: verified, nothing was sent")
        return
    url = upload(checkpoint, repo_id, private=private, revision=revision, message=message)
    out.print(f"uploaded {len(files)} files ({_gb(total)}) to {escape(repo_id)}: {escape(url)}")


@cli.command("inspect")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect_cmd(checkpoint: Path, as_json: bool) -> None:
    """Format, components, sizes and kept layers of a converted CHECKPOINT (from its manifest)."""
    from .manifest import read_manifest

    m = read_manifest(checkpoint)
    sqnrs = [t.sqnr_db for t in m.tensors.values() if t.sqnr_db is not None]
    summary = {
        "checkpoint": str(checkpoint),
        "format": m.format,
        "recipe": m.recipe.name or m.recipe.origin,
        "source": m.source.get("name"),
        "made_with": f"{m.tool['name']} {m.tool['version']}",
        "components": [c.model_dump() for c in m.components],
        "files": len(m.output_files),
        "bytes": sum(f.size for f in m.output_files),
        "min_sqnr_db": min(sqnrs) if sqnrs else None,
        "median_sqnr_db": statistics.median(sqnrs) if sqnrs else None,
    }
    if m.loras:
        summary["loras"] = [lora.model_dump() for lora in m.loras]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    out.print(
        f"[bold]{escape(str(checkpoint))}[/]: {m.format}, recipe {escape(str(summary['recipe']))}, from {escape(str(summary['source']))}, made with {summary['made_with']}"
    )
    table = Table(title_justify="left")
    for col, just in (
        ("component", "left"),
        ("quantized", "right"),
        ("kept", "right"),
        ("source", "right"),
        ("output", "right"),
        ("kept Linears", "left"),
    ):
        table.add_column(col, justify=just)
    for c in m.components:
        table.add_row(
            c.path,
            str(c.quantized),
            str(c.kept),
            _gb(c.source_bytes),
            _gb(c.output_bytes),
            escape(_summarize_names(c.kept_linears)),
        )
    out.print(table)
    out.print(f"{summary['files']} files, {_gb(summary['bytes'])}")
    _print_merged_loras(m)
    if sqnrs:
        out.print(f"weight SQNR: min {min(sqnrs):.1f} dB, median {statistics.median(sqnrs):.1f} dB")


def _print_merged_loras(manifest) -> None:
    for lora in manifest.loras:
        skipped = sum(len(keys) for keys in lora.ignored.values())
        out.print(
            f"merged LoRA {escape(lora.file)} (strength {lora.strength:g}) into {sum(lora.tensors.values())} tensors"
            + (f", skipped {skipped} keys that match no tensor" if skipped else "")
        )


def _summarize_names(names: list[str]) -> str:
    groups: dict[str, int] = defaultdict(int)
    for n in names:
        groups[_star_blocks(n)] += 1
    return ", ".join(f"{g} ×{k}" if k > 1 else g for g, k in groups.items()) or "-"


@cli.command("example")
@click.argument("output", type=click.Path(path_type=Path))
@click.option(
    "--preset",
    type=click.Choice(["tiny", "small", "1.3b", "14b"]),
    default="small",
    show_default=True,
    help="Model size.",
)
@click.option(
    "--layout",
    type=click.Choice(["t2v", "i2v", "a14b", "lingbot"]),
    default="t2v",
    show_default=True,
    help="Folder layout and extra layers.",
)
@click.option(
    "--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True
)
@click.option("--max-shard-size", default="1GB", show_default=True)
@click.option(
    "--lora",
    "lora",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write a random-weight LoRA (rank 16, every block Linear) for this model to this file.",
)
def example_cmd(
    output: Path, preset: str, layout: str, dtype: str, max_shard_size: str, lora: Path | None
) -> None:
    """Write a random-weight checkpoint with the original Wan key names, to try the tool on."""
    import torch

    from .errors import OutputExistsError
    from .layout import parse_size
    from .synthetic import write_wan_example, write_wan_lora

    for path in (output, lora):
        if path is not None and path.exists():
            raise OutputExistsError(f"{path}: already exists; remove it or pick another path")
    write_wan_example(
        output,
        preset,
        layout,
        dtype=getattr(torch, dtype),
        max_shard_size=parse_size(max_shard_size, "--max-shard-size"),
    )
    out.print(f"wrote a {preset} Wan-shaped {layout} checkpoint ({dtype}, random weights) to {output}")
    if lora is not None:
        write_wan_lora(lora, preset, layout)
        out.print(f"wrote a rank-16 LoRA for it (every block Linear, random weights) to {lora}")


# --- entry point -------------------------------------------------------------------------------


class Interrupted(BaseException):
    """SIGINT or SIGTERM: unwinds like KeyboardInterrupt (every cleanup runs), exits 128 + the signal number.

    Not a KeyboardInterrupt, which click would turn into an anonymous Abort."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame):
    _ignore_stop_signals()  # the first signal stops the run; more must not cut short the cleanup it starts
    raise Interrupted(signum)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, DESIGN.md's exit codes, tracebacks only with --debug."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        _run(argv)
    except Interrupted as e:  # one that came in while an error was being reported
        sys.exit(128 + e.signum)


def _run(argv: list[str] | None) -> None:
    try:
        code = cli.main(args=argv, prog_name="quantize", standalone_mode=False)
    except QuantizeError as e:
        _fail(e, f"{e}", e.exit_code)
    except click.ClickException as e:  # bad usage: missing argument, bad option value
        _fail(
            e,
            f"{e.format_message()} (see quantize --help)",
            2 if isinstance(e, click.UsageError) else e.exit_code,
        )
    except (Interrupted, KeyboardInterrupt, click.Abort) as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        _fail(
            e,
            f"interrupted by {signal.Signals(signum).name}: stopped; nothing partial was left behind",
            128 + signum,
        )
    except Exception as e:  # a bug, or an environment problem we did not foresee
        _fail(e, f"{type(e).__name__}: {e} (run with --debug for the traceback)", 1)
    _exit(code if isinstance(code, int) else 0)


def _exit(code: int) -> None:
    _ignore_stop_signals()  # the work is over: a late signal must not change the exit code
    sys.exit(code)


def _ignore_stop_signals() -> None:
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _fail(e: BaseException, message: str, code: int) -> None:
    _ignore_stop_signals()
    from .hub import scrub

    if _state["debug"]:
        err.print(scrub("".join(traceback.format_exception(e))), markup=False, highlight=False)
    one_line = " ".join(message.split())  # a library's message may span lines (YAML's, the OS's)
    err.print(f"[red]error:[/] {escape(scrub(one_line))}", soft_wrap=True)
    _exit(code)


if __name__ == "__main__":
    main()
