"""`make bench-large`: the converter on a Wan2.1-14B-shaped checkpoint, to show memory flat in model size.

    .venv/bin/python benchmarks/bench_large.py --write docs/BENCHMARKS.md

The source (dim 5120, ffn 13824, 40 blocks, random bf16 weights, 1 GB shards, about 28.6 GB) is
generated once under ``bench-data/`` when the disk has room for it and one converted output; each
format is converted ``--runs`` times in its own process (wall time, peak RSS from ``os.wait4``). No
read-and-write baseline here: its copy would need another 28 GB; the 1.3B section has the ratios.
``--recipes R ...`` measures only those (the ones not bundled are skipped); with ``--write``, their rows replace
or join the section's, whose other rows stay as the earlier run measured them (its header kept beside them).

With ``--forward``, the streamed forward pass on the same source instead, into its own section:
``quantize sensitivity SRC --recipe wan-fp8.yaml --max-size 19GB`` (the source pass with each layer's
X·Q(W) at every rung, the recipe's model, then the proposal's) and ``quantize verify OUT --source SRC --forward`` on a wan-fp8.yaml conversion.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import (  # noqa: E402
    REPO,
    display_command,
    ensure_checkpoint,
    gb,
    log,
    machine_lines,
    markdown_table,
    quantize_command,
    run_process,
    source_bytes,
    update_section,
    warm_page_cache,
)

START, END = "<!-- bench:large:start -->", "<!-- bench:large:end -->"
#: a budget above wan-fp8.yaml's 17.4 GB: the proposal path (every rung measured, then a measured proposal)
BUDGET = "19GB"
FORWARD_MARKS = "<!-- bench:large-forward:start -->", "<!-- bench:large-forward:end -->"
PRESET = "14b"
RSS_TARGET = 1.5e9
SOURCE_GB = 28.7  # the 14B preset in bf16
# every format: memory must stay flat for each (GGUF and ComfyUI write one file per model)
RECIPES = (
    "wan-fp8.yaml",
    "wan-torchao-fp8.yaml",
    "wan-nf4.yaml",
    "wan-comfy-fp8.yaml",
    "wan-comfy-int8.yaml",
    "wan-gguf-q8_0.yaml",
    "wan-gguf-q4_k_m.yaml",
    "wan-comfy-nvfp4.yaml",
    "wan-comfy-mxfp8.yaml",
    "wan-comfy-int8-convrot.yaml",
    "wan-torchao-int8.yaml",
)
COLUMNS = ["case", "time min / median / max (s)", "peak RSS (GB)", "GB/s", "output (GB)"]
TITLE = "## Convert at 14B scale (memory flat in model size)"


def enough_disk(data_dir: Path, have_source: bool) -> bool:
    """Room for the source (unless it is there) and the largest output (fp8: about 0.55 of it), with 10% to spare."""
    need = (0 if have_source else SOURCE_GB) + 0.55 * SOURCE_GB
    return shutil.disk_usage(data_dir).free / 1e9 > need * 1.1


def bundled(recipe: str) -> bool:
    """Whether `recipe` is bundled (derived or a curated file)."""
    from quantize.recipes import bundled_names

    return recipe in bundled_names()


def earlier_run(doc: Path | None) -> tuple[dict[str, list[str]], list[str]]:
    """The rows of the section's table, by case, and its header (from its first "Run" line to the table)."""
    text = doc.read_text() if doc is not None and doc.exists() else ""
    start, end = text.find(START), text.find(END)
    if not 0 <= start < end:
        return {}, []
    lines = text[start:end].splitlines()
    rows = {}
    for line in lines:
        if line.startswith("| convert "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells
    first = next((i for i, line in enumerate(lines) if line.startswith("Run ")), None)
    table = next((i for i, line in enumerate(lines) if line.startswith("| case")), None)
    head = lines[first:table] if first is not None and table is not None else []
    while head and not head[-1].strip():
        head.pop()
    return rows, head


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    p.add_argument("--write", type=Path, help="update this markdown file's large-model section")
    p.add_argument("--forward", action="store_true", help="measure sensitivity and verify --forward instead")
    p.add_argument(
        "--recipes",
        nargs="+",
        metavar="RECIPE",
        help="only these (default: every format's); --write keeps the section's other rows",
    )
    p.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.generate:
        ensure_checkpoint(args.data_dir, PRESET)
        return
    data_dir = args.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    have = (data_dir / f"wan-{PRESET}-bf16" / "example.json").is_file()
    if not enough_disk(data_dir, have):
        free = shutil.disk_usage(data_dir).free / 1e9
        raise SystemExit(
            f"bench-large: {free:.0f} GB free in {data_dir}, not enough for the 14B-shaped source and an output"
        )
    # generated in a child process: the measured conversions are forked from this one, and a child's peak RSS
    # (ru_maxrss) counts what it inherited before exec, so this process must stay small
    gen = [sys.executable, __file__, "--generate", "--data-dir", str(data_dir)]
    run_process(gen, data_dir / "generate-large.log")
    src = data_dir / f"wan-{PRESET}-bf16"
    if args.forward:
        forward_cases(src, data_dir, args.write)
        return
    warm_page_cache(src)
    scratch = data_dir / "scratch-large"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    recipes = [r for r in (args.recipes or RECIPES) if bundled(r)]
    skipped = sorted(set(args.recipes or RECIPES) - set(recipes))
    if skipped:
        log(f"not bundled, skipped: {', '.join(skipped)}")
    rows, peaks = [], []
    try:
        for recipe in recipes:
            out = scratch / "out"
            walls, rss = [], []
            for run in range(args.runs):
                shutil.rmtree(out, ignore_errors=True)
                wall, peak = run_process(
                    [*quantize_command(), "convert", str(src), str(out), "--recipe", recipe],
                    scratch / "run.log",
                )
                out_bytes = sum(
                    f.stat().st_size for f in out.rglob("*") if f.suffix in (".safetensors", ".gguf")
                )
                walls.append(wall)
                rss.append(peak)
                log(f"run {run + 1}/{args.runs} {recipe}: {wall:.1f} s, peak RSS {gb(peak)} GB")
            shutil.rmtree(out, ignore_errors=True)
            peaks.append(max(rss))
            rows.append(
                [
                    f"convert --recipe {recipe}",
                    f"{min(walls):.1f} / {statistics.median(walls):.1f} / {max(walls):.1f}",
                    gb(max(rss)),
                    f"{source_bytes(src) / statistics.median(walls) / 1e9:.2f}",
                    gb(out_bytes),
                ]
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    run_line = (
        f"Run {datetime.date.today().isoformat()} with `{display_command([sys.executable, *sys.argv])}`"
    )
    measured = {row[0] for row in rows}
    old_rows, old_head = earlier_run(args.write) if args.recipes else ({}, [])
    kept = {name: row for name, row in old_rows.items() if name not in measured}
    if kept:  # a partial run: its rows in the table's order, the earlier run's others as they were
        order = [f"convert --recipe {r}" for r in RECIPES]
        by_name = {**kept, **{row[0]: row for row in rows}}
        rows = [by_name[n] for n in order if n in by_name] + [r for n, r in by_name.items() if n not in order]
        peaks += [float(row[2]) * 1e9 for row in kept.values()]
        names = sorted(measured, key=order.index)
        run_line += f": the rows of {', '.join(n.removeprefix('convert --recipe ') for n in names)}"
        old_head = ["", "The other rows: " + old_head[0].removeprefix("The other rows: "), *old_head[1:]]
    else:
        old_head = []
    verdict = "met" if max(peaks) <= RSS_TARGET else "NOT met"
    body = "\n".join(
        [
            TITLE,
            "",
            f"{run_line}.",
            "",
            *(f"- {line}" for line in machine_lines(data_dir)),
            f"- Source: Wan2.1-14B-shaped (dim 5120, ffn 13824, 40 blocks), random bf16, 1 GB shards, "
            f"{gb(source_bytes(src))} GB; page cache partly warm (the machine has less RAM than twice the source). "
            f"{args.runs} run(s) each.",
            *old_head,
            "",
            markdown_table(rows, COLUMNS),
            "",
            f"Peak RSS target at 14B scale <= {RSS_TARGET / 1e9:.1f} GB: {verdict} (highest {gb(max(peaks))} GB; "
            "the 1.3B section above: the same code, a tenth of the model).",
        ]
    )
    print(body)
    if args.write:
        update_section(args.write, body, (START, END))


def forward_cases(src: Path, data_dir: Path, write: Path | None) -> None:
    """sensitivity and verify --forward at 14B scale, one run each: memory is one layer, not the model."""
    scratch = data_dir / "scratch-large"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    out, log_path = scratch / "out", scratch / "run.log"
    q = quantize_command()
    cases = {
        f"sensitivity --recipe wan-fp8.yaml --max-size {BUDGET}": [
            *q,
            "sensitivity",
            str(src),
            "--recipe",
            "wan-fp8.yaml",
            "--max-size",
            BUDGET,
            "--json",
        ],
        "convert --recipe wan-fp8.yaml (for verify)": [
            *q,
            "convert",
            str(src),
            str(out),
            "--recipe",
            "wan-fp8.yaml",
        ],
        "verify OUT --source SRC --forward": [
            *q,
            "verify",
            str(out),
            "--source",
            str(src),
            "--forward",
            "--json",
        ],
    }
    rows, peaks, figures = [], [], []
    try:
        for name, argv in cases.items():
            warm_page_cache(src)
            wall, peak = run_process(argv, log_path)
            text = log_path.read_text()
            if "--json" in argv:
                report = json.loads(text[text.index("{") :])
                if "layers" in report:
                    figures.append(report["forward_sqnr_db"])
                    proposal = report["proposal"]
                else:
                    figures.append(next(iter(report["forward"].values()))["output_sqnr_db"])
            log(f"{name}: {wall:.1f} s, peak RSS {gb(peak)} GB")
            peaks.append(peak)
            rows.append([name, f"{wall:.1f}", gb(peak)])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    verdict = "met" if max(peaks) <= RSS_TARGET else "NOT met"
    body = "\n".join(
        [
            "## The streamed forward pass at 14B scale (`sensitivity`, `verify --forward`)",
            "",
            f"Run {datetime.date.today().isoformat()} with `{display_command([sys.executable, *sys.argv])}`.",
            "",
            *(f"- {line}" for line in machine_lines(data_dir)),
            f"- Source: the 14B-shaped checkpoint above ({gb(source_bytes(src))} GB bf16); fixed random inputs; "
            "one run each. Whole, the model would be 57 GB in float32 (two copies for a forward check).",
            "",
            markdown_table(rows, ["case", "time (s)", "peak RSS (GB)"]),
            "",
            f"- forward SQNR of wan-fp8.yaml: {figures[0]:.2f} dB (sensitivity), {figures[1]:.2f} dB (verify "
            "--forward on the converted checkpoint): the same passes",
            f"- the proposal within {BUDGET}: {proposal['forward_sqnr_db']:.2f} dB with {len(proposal['raised'])} "
            f"layers kept, {gb(proposal['bytes'])} GB of tensors against the recipe's {gb(proposal['recipe_bytes'])} GB",
            f"- Peak RSS target at 14B scale <= {RSS_TARGET / 1e9:.1f} GB: {verdict} (highest {gb(max(peaks))} GB).",
        ]
    )
    print(body)
    if write:
        update_section(write, body, FORWARD_MARKS)


if __name__ == "__main__":
    main()
