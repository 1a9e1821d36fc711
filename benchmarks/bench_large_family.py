"""`make bench-large`, the newer families: a family's largest real shape converted, to show memory flat in model size.

    .venv/bin/python benchmarks/bench_large_family.py --family minimax-h3 --preset 33b --write docs/BENCHMARKS.md

The source is the family's example (`quantize example --family F --preset P --layout L`: its real key names and
widths, random bf16 weights, 1 GB shards), generated once under ``bench-data/`` in a child process. Where the disk
cannot hold it and one output (fp8: about 0.55 of the source), it is made with the same widths and as many of its
repeated blocks as fit (the last ones dropped, said in the section): what a conversion holds at a time is one
tensor's row chunks, so the peak does not depend on the block count, and a whole-width block is the largest
tensor there is. Each format (`--formats`, default fp8_channel, comfy_fp8 and gguf, a family refusing one at plan
time reported as such) is converted with `quantize convert SRC OUT --format F` in its own process: wall time,
peak RSS (``os.wait4``), GB/s of source bytes. The target: peak RSS under 1.5 GB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import (  # noqa: E402
    REPO,
    display_command,
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

RSS_TARGET = 1.5e9
SHARD_BYTES = 10**9
#: the largest output of the formats measured, as a share of the bf16 source (fp8 weights and kept tensors)
OUTPUT_SHARE = 0.55
FORMATS = ("fp8_channel", "comfy_fp8", "gguf")
COLUMNS = ["case", "time (s)", "peak RSS (GB)", "GB/s", "output (GB)"]
_BLOCK = re.compile(r"(.+?)\.(\d+)\.")


def markers(family: str) -> tuple[str, str]:
    return f"<!-- bench:large-{family}:start -->", f"<!-- bench:large-{family}:end -->"


def block_index(name: str, prefix: str) -> int | None:
    m = _BLOCK.match(name)
    return int(m[2]) if m and m[1] == prefix else None


def repeated_blocks(tensors: list[tuple[str, tuple[int, ...]]]) -> tuple[str, int]:
    """The list of repeated blocks holding most tensors (``blocks``, ``transformer_blocks``), and its length."""
    counts = Counter(m[1] for name, _ in tensors if (m := _BLOCK.match(name)))
    prefix = counts.most_common(1)[0][0]
    return prefix, 1 + max(i for name, _ in tensors if (i := block_index(name, prefix)) is not None)


def nbytes(tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    total = 0
    for _, shape in tensors:
        n = 2  # bf16
        for d in shape:
            n *= d
        total += n
    return total


def fitted(models, free: float) -> tuple[list, int, int]:
    """The example's models with the last repeated blocks dropped until the source and one output fit in `free`
    bytes (10% to spare); and (blocks kept, blocks of the real shape)."""
    from dataclasses import replace

    def size(ms) -> int:
        return sum(nbytes(m.tensors) for m in ms)

    prefix, full = repeated_blocks([t for m in models for t in m.tensors])
    keep = full
    while keep > 1 and size(models) * (1 + OUTPUT_SHARE) * 1.1 > free:
        keep -= 1
        models = [
            replace(
                m, tensors=[(n, s) for n, s in m.tensors if (i := block_index(n, prefix)) is None or i < keep]
            )
            for m in models
        ]
    return models, keep, full


def generate(data_dir: Path, family: str, preset: str, layout: str) -> None:
    """The source, written once (in this child process: the measured runs are forked from a small parent)."""
    import torch

    from quantize.examples import write_example
    from quantize.models.examples import examples_of

    path = data_dir / f"{family}-{preset}-{layout}-bf16"
    if (path / "example.json").is_file():
        log(f"reusing {path}")
        return
    shutil.rmtree(path, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    models, keep, full = fitted(examples_of(family).models(preset, layout), shutil.disk_usage(tmp).free)
    log(
        f"generating {path}: {keep} of {full} blocks, {nbytes([t for m in models for t in m.tensors]) / 1e9:.1f} GB"
    )
    write_example(
        tmp, preset, layout, family=family, dtype=torch.bfloat16, max_shard_size=SHARD_BYTES, models=models
    )  # the example's writer: its tokenizer and other files too
    info = {"family": family, "preset": preset, "layout": layout, "blocks": keep, "of_blocks": full}
    (tmp / "example.json").write_text(json.dumps(info, indent=2) + "\n")
    tmp.rename(path)


def as_release_pth(data_dir: Path, src: Path, family: str) -> Path:
    """The single-file example re-saved as the family's release stores it (`Family.aliases`: Wan's umT5 ``.pth`` in
    Wan's T5 names, the tokenizer in ``google/umt5-xxl/`` beside it), written once with ``torch.save`` as Wan's
    was (the tool writes no pickle; it reads this one with torch's weights-only loader)."""
    import torch
    from safetensors import safe_open

    from quantize.models import get_family

    folder = data_dir / f"{src.name}-release"
    pth = folder / "models_t5_umt5-xxl-enc-bf16.pth"
    if pth.is_file():
        log(f"reusing {pth}")
        return pth
    aliases = get_family(family).aliases
    tokenizer = get_family(family).plan.tokenizer
    (folder / "google" / "umt5-xxl").mkdir(parents=True, exist_ok=True)
    state = {}
    (single,) = src.glob("*.safetensors")
    with safe_open(single, "pt") as f:
        for k in f.keys():
            if k == tokenizer.tensor:
                (folder / "google" / "umt5-xxl" / "spiece.model").write_bytes(bytes(f.get_tensor(k).numpy()))
            else:
                state[aliases.names.native(k)] = f.get_tensor(k)
    tmp = pth.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.rename(pth)
    return pth


def convert(src: Path, scratch: Path, fmt: str, family: str) -> list[str]:
    """One measured conversion: its table row (a plan-time refusal is a row saying so, in the family's words when
    it has them, `Family.why_no`)."""
    from quantize.formats import format_info
    from quantize.models import get_family

    out = scratch / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = [*quantize_command(), "convert", str(src), str(out), "--format", fmt]
    probe = subprocess.run(
        [*quantize_command(), "plan", str(src), "--format", fmt], capture_output=True, text=True
    )
    if probe.returncode == 2:  # refused before anything is read: not a measurement
        reason = (
            get_family(family).why_no(format_info(fmt), format_info(fmt).names == "native")
            or (probe.stderr.strip().splitlines() or [""])[-1]
        )
        return [f"convert --format {fmt}", "refused at plan time", "-", "-", reason.removeprefix("error: ")]
    wall, peak = run_process(argv, scratch / f"{fmt}.log")
    out_bytes = sum(f.stat().st_size for f in out.rglob("*") if f.suffix in (".safetensors", ".gguf"))
    shutil.rmtree(out, ignore_errors=True)
    log(f"{fmt}: {wall:.1f} s, peak RSS {gb(peak)} GB")
    return [
        f"convert --format {fmt}",
        f"{wall:.1f}",
        gb(peak),
        f"{source_bytes(src) / wall / 1e9:.2f}",
        gb(out_bytes),
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="minimax-h3")
    p.add_argument("--preset", default="33b")
    p.add_argument("--layout", default=None, help="example layout (default: the family's first)")
    p.add_argument("--formats", nargs="+", default=list(FORMATS))
    p.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    p.add_argument("--write", type=Path, help="update this markdown file's section for the family")
    p.add_argument(
        "--section",
        default=None,
        help="the section's name (default: the family's; another preset's: its own)",
    )
    p.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--release-pth",
        action="store_true",
        help="convert the single-file example re-saved as the family's release .pth (umt5: Wan's)",
    )
    args = p.parse_args(argv)
    data_dir = args.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.layout is None:
        from quantize.models.examples import examples_of

        args.layout = examples_of(args.family).layouts[0]
    if args.generate:
        generate(data_dir, args.family, args.preset, args.layout)
        if args.release_pth:
            as_release_pth(
                data_dir, data_dir / f"{args.family}-{args.preset}-{args.layout}-bf16", args.family
            )
        return
    gen = [sys.executable, __file__, "--generate", "--data-dir", str(data_dir), "--family", args.family]
    gen += ["--release-pth"] if args.release_pth else []
    run_process([*gen, "--preset", args.preset, "--layout", args.layout], data_dir / "generate-family.log")
    example = data_dir / f"{args.family}-{args.preset}-{args.layout}-bf16"
    made = json.loads((example / "example.json").read_text())
    src = example
    if args.release_pth:
        src = data_dir / f"{example.name}-release" / "models_t5_umt5-xxl-enc-bf16.pth"
    warm_page_cache(src)
    scratch = data_dir / "scratch-large-family"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        rows = [convert(src, scratch, fmt, args.family) for fmt in args.formats]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    peaks = [float(r[2]) * 1e9 for r in rows if r[2] != "-"]
    whole = made["blocks"] == made["of_blocks"]
    shape = (
        "the whole shape" if whole else f"its widths with {made['blocks']} of its {made['of_blocks']} blocks"
    )
    verdict = "met" if peaks and max(peaks) <= RSS_TARGET else "NOT met"
    body = "\n".join(
        [
            f"## Convert at full width: {args.family} {args.preset}{' (its release .pth)' if args.release_pth else ''}"
            " (memory flat in model size)",
            "",
            f"Run {datetime.date.today().isoformat()} with `{display_command([sys.executable, *sys.argv])}`.",
            "",
            *(f"- {line}" for line in machine_lines(data_dir)),
            f"- Source: `quantize example --family {args.family} --preset {args.preset} --layout {args.layout}`, "
            f"{shape} (the disk's room decides), random bf16, 1 GB shards, {gb(source_bytes(src))} GB"
            + (
                f"; re-saved with torch.save as the release's `{src.name}` in its own names, given as SOURCE."
                if args.release_pth
                else "."
            ),
            "",
            markdown_table(rows, COLUMNS),
            "",
            f"Peak RSS target <= {RSS_TARGET / 1e9:.1f} GB: {verdict}"
            + (f" (highest {gb(max(peaks))} GB)." if peaks else "."),
        ]
    )
    print(body)
    if args.write:
        update_section(
            args.write, body, markers(args.section or args.family + ("-pth" if args.release_pth else ""))
        )


if __name__ == "__main__":
    main()
