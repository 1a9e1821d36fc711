"""Benchmark `quantize verify` on a converted Wan2.1-1.3B-shaped checkpoint, beside `sha256sum` on the same files.

`make bench` runs::

    .venv/bin/python benchmarks/bench_verify.py --preset 1.3b --write docs/BENCHMARKS.md

The source checkpoint is the one `bench_convert.py` generates (reused); it is converted once with
wan-fp8.yaml into ``<data-dir>/wan-<preset>-fp8-verify/``. Each case is its own process, measured for
wall time and peak RSS (``os.wait4``), ``--runs`` times, interleaved:

* ``sha256sum`` (coreutils) over every file of the converted checkpoint: the hashing yardstick;
* ``quantize verify OUT``: integrity (hashes, headers, index, layout);
* ``quantize verify OUT --source SRC``: integrity, provenance (hashes the source too) and parity
  (reads every source tensor, requantizes it, compares and measures it).

The hashing rate is verify's own figure (bytes hashed / seconds spent hashing, from ``--json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import (  # noqa: E402
    REPO,
    display_command,
    ensure_checkpoint,
    gb,
    log,
    markdown_table,
    quantize_command,
    run_process,
    section_head,
    update_section,
    warm_page_cache,
)

START, END = "<!-- bench:verify:start -->", "<!-- bench:verify:end -->"


def converted(src: Path, data_dir: Path, preset: str) -> Path:
    out = data_dir / f"wan-{preset}-fp8-verify"
    if not (out / "quantize_manifest.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(
            [*quantize_command(), "convert", str(src), str(out), "--recipe", "wan-fp8.yaml"],
            check=True,
            capture_output=True,
        )
    return out


def files_of(path: Path) -> list[str]:
    return [str(p) for p in sorted(path.rglob("*")) if p.is_file() and p.name != "quantize_manifest.json"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=["tiny", "small", "1.3b"], default="1.3b")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    p.add_argument("--write", type=Path, metavar="MARKDOWN")
    args = p.parse_args(argv)
    data_dir = args.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    src = ensure_checkpoint(data_dir, args.preset)
    out = converted(src, data_dir, args.preset)
    out_bytes = sum(Path(f).stat().st_size for f in files_of(out))
    warm_page_cache(src)
    cases = {
        "sha256sum (coreutils), same files": (["sha256sum", *files_of(out)], None),
        "quantize verify OUT": ([*quantize_command(), "verify", str(out), "--json"], out_bytes),
        "quantize verify OUT --source SRC": (
            [*quantize_command(), "verify", str(out), "--source", str(src), "--json"],
            None,
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    rss: dict[str, int] = dict.fromkeys(cases, 0)
    rates: dict[str, list[float]] = {name: [] for name in cases}
    log_path = data_dir / "verify-run.log"
    for run in range(1, args.runs + 1):
        for name, (argv, _) in cases.items():
            wall, peak = run_process(argv, log_path)
            times[name].append(wall)
            rss[name] = max(rss[name], peak)
            if "verify" in name:
                report = json.loads(log_path.read_text())
                if not report["ok"]:
                    raise SystemExit(f"verify failed on the benchmark checkpoint: {report}")
                rates[name].append(report["hashing"]["gb_per_s"])
            log(f"run {run}/{args.runs} {name}: {wall:.2f} s, {gb(peak)} GB RSS")
    base = statistics.median(times["sha256sum (coreutils), same files"])
    columns = [
        "case",
        "runs",
        "time min / median / max (s)",
        "ratio to sha256sum",
        "peak RSS (GB)",
        "hashing GB/s",
    ]
    rows = []
    for name in cases:
        t = times[name]
        rate = (
            f"{statistics.median(rates[name]):.2f}"
            if rates[name]
            else f"{out_bytes / statistics.median(t) / 1e9:.2f}"
        )
        rows.append(
            [
                name,
                str(len(t)),
                f"{min(t):.2f} / {statistics.median(t):.2f} / {max(t):.2f}",
                f"{statistics.median(t) / base:.2f}",
                gb(rss[name]),
                rate,
            ]
        )
    table = markdown_table(rows, columns)
    print(table)
    if args.write:
        body = "\n".join(
            [
                *section_head(
                    "Verify: `quantize verify` beside `sha256sum`",
                    display_command([sys.executable, *sys.argv]),
                    data_dir,
                ),
                f"- Checkpoint: the Wan2.1-{args.preset}-shaped source of the convert benchmark, converted with wan-fp8.yaml "
                f"({gb(out_bytes)} GB in {len(files_of(out))} files)",
                "",
                table,
                "",
                "- hashing GB/s: for verify, its own figure (bytes hashed / seconds hashing, `--json`); for sha256sum, "
                "checkpoint bytes / wall time. Files are in the page cache; each run is a fresh process.",
                "- `--source` adds hashing the 2.84 GB source and reading, requantizing and comparing every tensor.",
            ]
        )
        update_section(args.write, body, (START, END))


if __name__ == "__main__":
    main()
