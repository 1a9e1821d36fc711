"""How fast `quantize convert` says no, and how fast it stops: the costs behind docs/cli.md's "What happens when ...".

`make bench` runs::

    .venv/bin/python benchmarks/bench_faults.py --write docs/BENCHMARKS.md

On a Wan2.1-small-shaped source (generated, about 8 MB), each case its own process, ``--runs`` times:

* refusal of an existing OUT (no ``--overwrite``), beside ``python -c "import torch"``: the refusal comes
  before torch is imported, so it should cost a fraction of that import;
* SIGINT and SIGTERM sent to an nf4 conversion (one worker) once its first progress line is out: the time
  from the signal to the process's exit, with the temporary directory removed (checked);
* `FileHasher.close()` 0.2 s into hashing a 2 GB file, beside hashing the whole file: an interrupted
  conversion does not wait for a shard's hash.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import (  # noqa: E402
    REPO,
    display_command,
    log,
    markdown_table,
    quantize_command,
    section_head,
    update_section,
)

START, END = "<!-- bench:faults:start -->", "<!-- bench:faults:end -->"


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    return time.monotonic() - t0, proc


def refusal(src: Path, out: Path, runs: int) -> tuple[list[float], list[float]]:
    if not out.exists():
        subprocess.run([*quantize_command(), "convert", str(src), str(out), "-r", "wan-fp8"], check=True)
    refused, torch_import = [], []
    for _ in range(runs):
        wall, proc = timed([*quantize_command(), "convert", str(src), str(out), "-r", "wan-fp8"])
        if proc.returncode != 2 or "already exists" not in proc.stderr:
            raise SystemExit(f"expected a refusal, got {proc.returncode}: {proc.stderr}")
        refused.append(wall)
        torch_import.append(timed([sys.executable, "-c", "import torch"])[0])
    return refused, torch_import


def signal_to_exit(src: Path, out: Path, sig: signal.Signals, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        argv = [*quantize_command(), "convert", str(src), str(out), "-r", "wan-nf4", "--workers", "1"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            if line.startswith("convert:") and "%" in line:
                break
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.communicate()
        times.append(time.monotonic() - t0)
        left = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        if proc.returncode != 128 + sig or out.exists() or left:
            raise SystemExit(f"{sig.name}: exit {proc.returncode}, output {out.exists()}, left {left}")
    return times


def hasher_stop(scratch: Path, runs: int) -> tuple[list[float], list[float]]:
    from quantize.read.hashing import FileHasher, HashingStopped

    big = scratch / "hash-me.bin"
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    full, stop = [], []
    try:
        for _ in range(runs):
            with FileHasher() as hasher:
                t0 = time.monotonic()
                hasher.submit(big).result()
                full.append(time.monotonic() - t0)
            hasher = FileHasher()
            future = hasher.submit(big)
            time.sleep(0.2)
            t0 = time.monotonic()
            hasher.close()
            stop.append(time.monotonic() - t0)
            if not isinstance(future.exception(), HashingStopped):
                raise SystemExit("FileHasher.close() did not stop the running hash")
    finally:
        big.unlink()
    return full, stop


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    p.add_argument("--write", type=Path, metavar="MARKDOWN")
    args = p.parse_args(argv)
    scratch = args.data_dir.absolute() / "faults"
    scratch.mkdir(parents=True, exist_ok=True)
    src = scratch / "wan-small"
    if not (src / "config.json").is_file():
        shutil.rmtree(src, ignore_errors=True)
        subprocess.run([*quantize_command(), "example", str(src), "--preset", "small"], check=True)

    log("refusal of an existing output")
    refused, torch_import = refusal(src, scratch / "existing", args.runs)
    rows = [
        ["`convert` into an existing OUT: refused (exit 2)", spread(refused), ""],
        [
            '`python -c "import torch"` alone',
            spread(torch_import),
            f"{statistics.median(torch_import) / statistics.median(refused):.2f}x the refusal",
        ],
    ]
    for sig in (signal.SIGINT, signal.SIGTERM):
        log(f"{sig.name} mid-conversion")
        t = signal_to_exit(src, scratch / "interrupted", sig, args.runs)
        rows.append([f"{sig.name} mid-conversion → exit {128 + sig}, nothing left", spread(t), ""])
    log("FileHasher.close() mid-hash")
    full, stop = hasher_stop(scratch, args.runs)
    rows.append(["hash of a 2 GB file, to the end", spread(full), ""])
    rows.append(
        [
            "`FileHasher.close()` 0.2 s into it",
            spread(stop),
            f"{statistics.median(stop) / statistics.median(full):.4f} of the full hash",
        ]
    )
    columns = ["case", "seconds min / median / max", "ratio"]
    table = markdown_table(rows, columns)
    print(table)
    if args.write:
        body = "\n".join(
            [
                *section_head(
                    "Faults: how fast a conversion says no, and how fast it stops",
                    display_command([sys.executable, *sys.argv]),
                    args.data_dir.absolute(),
                ),
                f"- {args.runs} runs each; a Wan2.1-small-shaped bf16 source (8.4 MB); signals sent to an nf4 "
                "conversion on one worker after its first progress line",
                "",
                table,
                "",
                "The refusal happens before torch (and before a Hub download); the signal's time includes "
                "finishing the tensor in flight, stopping the hashing and removing the temporary directory.",
            ]
        )
        update_section(args.write, body, (START, END))


if __name__ == "__main__":
    main()
