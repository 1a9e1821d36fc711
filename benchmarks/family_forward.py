#!/usr/bin/env python3
"""The forward SQNR of every format on every family: one table, derived from the registries.

    .venv/bin/python benchmarks/family_forward.py [--families F,F] [--formats F,F] [--write docs/BENCHMARKS.md]

For each family with examples (`models.examples.EXAMPLES`, in `models.FAMILIES`' order): its example at the
family's default preset, in each of its example layouts (`--layouts all`) or its first one (default), random bf16
weights initialized as the class initializes them; for each format (`formats.FORMAT_INFO`): ``quantize convert SRC
OUT --format F``, then ``quantize verify OUT --source SRC --forward --json``: the output SQNR (dB) of one forward
pass of the quantized model against the bf16 one (each component's, the lowest shown for a pipeline). A plan-time
refusal (exit 2) is shown as ``refused`` with its reason in the notes below the table: the family says which runtime
has no such file. A model no forward here runs (a Wan variant only ComfyUI runs) shows ``no forward`` where its
parity (`verify --source`) passes, the reason in the notes.

Runs in one process (click's runner: torch is imported once), about 1 s a cell on 2 cores. The weights are random:
the figures compare the formats on one family's structure, not on a trained model's outliers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import machine_lines, markdown_table, update_section  # noqa: E402

MARKERS = ("<!-- bench:family-forward:start -->", "<!-- bench:family-forward:end -->")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default=None, help="comma-separated family names (default: every one)")
    p.add_argument("--formats", default=None, help="comma-separated formats (default: every one)")
    p.add_argument("--layouts", choices=("first", "all"), default="first")
    p.add_argument("--write", type=Path, default=None, help="update this Markdown file's section")
    return p.parse_args()


def run(args: list[str]) -> tuple[int, str]:
    """`quantize ARGS` in this process (torch imported once): (exit code, stdout and stderr)."""
    import contextlib
    import io

    from quantize.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            main(args)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, buffer.getvalue()


def lowest_sqnr(report: dict) -> float | None:
    """The lowest forward output SQNR of a verify report's components, or None where none ran."""
    figures = [c["output_sqnr_db"] for c in (report.get("forward") or {}).values() if "output_sqnr_db" in c]
    return min(figures) if figures else None


def reason(text: str, src: Path) -> str:
    """An error's last line as a note: without the ``error:`` and the temporary folder it names, nor the list of
    the layout's other recipes (the table shows them)."""
    line = text.strip().splitlines()[-1] if text.strip() else "exit 2"
    line = line.removeprefix("error: ").replace(f"{src.parent}/", "")
    return line.split("; for this layout there are:")[0]


def cell(src: Path, out: Path, fmt: str) -> tuple[str, str | None]:
    """The table cell of one conversion and its note (a refusal's reason, a failure's line)."""
    code, text = run(["convert", str(src), str(out), "--format", fmt])
    if code == 2:
        return "refused", reason(text, src)
    if code != 0:
        return "FAILED", f"convert exit {code}: {text.strip().splitlines()[-1] if text.strip() else ''}"
    code, text = run(["verify", str(out), "--source", str(src), "--forward", "--json"])
    if code == 2:  # no forward runs it (a Wan variant only ComfyUI runs): its parity alone
        why = reason(text, src)
        code, text = run(["verify", str(out), "--source", str(src)])
        return ("no forward", why) if code == 0 else ("FAILED", f"verify exit {code}: {why}")
    try:
        report = json.loads(text[text.index("{") :])
    except ValueError:
        return "FAILED", f"verify exit {code}: {text.strip().splitlines()[-1] if text.strip() else ''}"
    sqnr = lowest_sqnr(report)
    if sqnr is None:
        return "no forward", None
    return (f"{sqnr:.1f}" if report.get("ok") else f"{sqnr:.1f} (verify failed)"), None


def main() -> int:
    args = parse_args()
    from quantize.formats.info import FORMAT_INFO
    from quantize.models import FAMILIES
    from quantize.models.examples import EXAMPLES

    families = [f.name for f in FAMILIES if f.name in EXAMPLES]
    if args.families:
        families = [f for f in families if f in args.families.split(",")]
    formats = list(FORMAT_INFO) if not args.formats else args.formats.split(",")
    rows, notes, failed = [], {}, 0
    with tempfile.TemporaryDirectory(prefix="family-forward-") as tmp:
        for name in families:
            examples = EXAMPLES[name]
            layouts = examples.layouts if args.layouts == "all" else examples.layouts[:1]
            for layout in layouts:
                src = Path(tmp) / f"{name}-{layout}"
                code, text = run(["example", str(src), "--family", name, "--layout", layout])
                if code != 0:
                    print(f"{name}/{layout}: example failed: {text.strip()}", file=sys.stderr)
                    failed += 1
                    continue
                row = [f"{name} ({layout}, {examples.default_preset})"]
                for fmt in formats:
                    value, note = cell(src, Path(tmp) / f"{name}-{layout}-{fmt}", fmt)
                    failed += value == "FAILED"
                    if note:
                        notes.setdefault(note, []).append(f"{name}/{layout} {fmt}")
                    row.append(value)
                    print(f"{name}/{layout} {fmt}: {value}" + (f" ({note})" if note else ""), flush=True)
                rows.append(row)
    body = "\n".join(
        [
            "### Forward SQNR (dB) of each format on each family",
            "",
            f"`.venv/bin/python benchmarks/family_forward.py{' --layouts all' if args.layouts == 'all' else ''}`, "
            f"{datetime.date.today().isoformat()}: each family's example at its default preset (random weights), "
            "`quantize convert --format F`, then `quantize verify --source --forward`: the output SQNR of one "
            "forward pass against bf16 (a pipeline's lowest component).",
            "",
            *[f"- {line}" for line in machine_lines(Path(tempfile.gettempdir()))],
            "",
            markdown_table(rows, ["family (layout, preset)", *formats]),
            "",
            "Refusals, models no forward runs, and failures, each with the cells it covers:",
            "",
            *[f"- {why} ({', '.join(cells)})" for why, cells in notes.items()],
        ]
    )
    print(body)
    if args.write:
        update_section(args.write, body, MARKERS)
        print(f"wrote the {MARKERS[0]} section of {args.write}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
