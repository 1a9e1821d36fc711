"""Each family's hand-made rule (what its bundled recipes keep) against what `quantize sensitivity` measures.

    .venv/bin/python benchmarks/family_rules.py [--families F,F] [--format nf4] [--write docs/BENCHMARKS.md]

For each family: its example (`quantize example --family F`, the family's default preset and first layout: its real
names, random bf16 weights), the bundled recipe of `--format` for that layout (the hand rule: the layers it keeps,
written in its description), and a recipe of the same format quantizing EVERY Linear of the model (the rule
dropped). `quantize sensitivity --json` measures both; on the second, `--min-forward-sqnr` set to the hand recipe's
own forward SQNR asks which layers the measurement would keep to do as well. Reported: how many layers each keeps,
how many of the measurement's picks the hand rule keeps too, and where the hand-kept layers rank by their own
output SQNR (rank 1: the most sensitive).

The weights are random: a trained model's outliers (adaLN and embedding weights, the first and last blocks) are
what the hand rules guard against, and a random-weight model shows only what its structure does (a layer whose
output feeds many others, a modulation that scales the residual stream). The figures say what the measurement
proposes on the structure alone, not that a rule is wrong; the tool's answer for a real model is the same command on
its weights.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import REPO, display_command, log, machine_lines, markdown_table, update_section  # noqa: E402

MARKERS = ("<!-- bench:family-rules:start -->", "<!-- bench:family-rules:end -->")
COLUMNS = [
    "family (recipe)",
    "Linears",
    "hand rule keeps",
    "forward SQNR: hand / all quantized (dB)",
    "measurement keeps (to reach the hand figure)",
    "of them hand-kept",
    "hand-kept layers' median rank",
]


class Refused(Exception):
    """`quantize` said no (exit 2), in its one line."""


def quantize(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [str(REPO / ".venv" / "bin" / "quantize"), *map(str, args)], capture_output=True, text=True
    )
    if p.returncode == 2:
        raise Refused(p.stderr.strip())
    if p.returncode:
        raise SystemExit(
            f"quantize {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()[-600:]}"
        )
    return p


def sensitivity(src: Path, recipe: str | Path, *extra: str) -> dict:
    return json.loads(quantize("sensitivity", src, "-r", recipe, "--json", "--top", "0", *extra).stdout)


def general(module: str) -> str:
    """The module's name as a pattern for every block of its kind (block numbers as ``\\d+``)."""
    return re.sub(r"\\\.\d+\\\.", r"\\.\\d+\\.", re.escape(module).replace(r"\.", "\\."))


def everything_recipe(hand_text: str, modules: list[str], unfit: set[str]) -> str:
    """The hand recipe's format, type and components, its targets every Linear (`modules`) but the kinds the format
    cannot take (`unfit`: every block's alike)."""
    keep = [line for line in hand_text.splitlines() if re.match(r"(format|type|components):", line)]
    patterns = sorted({general(m) for m in modules} - {general(m) for m in unfit})
    return "\n".join([*keep, "targets:", *(f"  - '{p}'" for p in patterns), ""])


def measure_everything(src: Path, hand_text: str, linears: list[str], recipe: Path, target: str):
    """The all-Linears recipe measured with a proposal for `target` dB; a Linear the format refuses (a width it
    cannot encode, named in the refusal) is left out and the run repeated: (report, the Linears left out)."""
    unfit: set[str] = set()
    while True:
        recipe.write_text(everything_recipe(hand_text, linears, unfit))
        try:
            return sensitivity(src, recipe, "--min-forward-sqnr", target), unfit
        except Refused as e:
            found = re.search(r"tensor '([^']+)\.weight' is \[", str(e))
            if found is None or found[1] in unfit:
                raise SystemExit(f"{src}: {e}") from None
            unfit.add(found[1])


def runnable_linears(src: Path, recipe: str, family: str) -> list[str]:
    """The Linear layers of the model a forward pass runs (a release's carried parts, LTX-2's VAE and connectors,
    are no part of it), by their names in the source."""
    from quantize.models import get_family
    from quantize.plan import make_plan
    from quantize.recipes import load_recipe

    fam = get_family(family)
    plan = make_plan(src, load_recipe(recipe).recipe)
    return [
        t.module
        for cp in plan.components
        for t in cp.tensors
        if t.is_linear_weight and not (fam.carried(t.name) or fam.plain_weight(t.name))
    ]


def measure(family: str, fmt: str, work: Path) -> list[str]:
    from quantize.read.detect import recipe_for_format
    from quantize.recipes import bundled_text

    src = work / family
    quantize("example", src, "--family", family)
    name, _ = recipe_for_format(src, fmt)
    hand_text = bundled_text(name)
    log(f"{family}: {name}")
    hand = sensitivity(src, name)
    linears = runnable_linears(src, name, family)
    quantized = {lay["module"] for lay in hand["layers"]}
    kept = [m for m in linears if m not in quantized]
    target = f"{hand['forward_sqnr_db']:.3f}"
    everything, unfit = measure_everything(src, hand_text, linears, work / f"{family}-all.yaml", target)
    left_out = {general(m) for m in unfit}
    linears = [m for m in linears if general(m) not in left_out]
    kept = [m for m in kept if general(m) not in left_out]
    order = [lay["module"] for lay in everything["layers"]]  # most sensitive first
    raised = [r["module"] for r in everything["proposal"]["raised"]]
    ranks = [order.index(m) + 1 for m in kept if m in order]
    median = f"{statistics.median(ranks):.0f} of {len(order)}" if ranks else "-"
    reached = "" if everything["proposal"]["reached"] else " (not reached)"
    return [
        f"{family} ({name})",
        str(len(linears)),
        str(len(kept)),
        f"{hand['forward_sqnr_db']:.2f} / {everything['forward_sqnr_db']:.2f}",
        f"{len(raised)}{reached}",
        f"{sum(m in set(kept) for m in raised)}",
        median,
    ]


def main(argv: list[str] | None = None) -> None:
    from quantize.models import FAMILIES

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default=None, help="comma-separated (default: every family)")
    p.add_argument("--format", default="nf4")
    p.add_argument("--write", type=Path)
    args = p.parse_args(argv)
    families = args.families.split(",") if args.families else [f.name for f in FAMILIES]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(f, args.format, Path(tmp)) for f in families]
    body = "\n".join(
        [
            "## Each family's hand rule against `quantize sensitivity` (random weights)",
            "",
            f"Run {datetime.date.today().isoformat()} with `{display_command([sys.executable, *sys.argv])}`.",
            "",
            *(f"- {line}" for line in machine_lines(Path(tempfile.gettempdir()))),
            "",
            f"Per family: its example, the bundled {args.format} recipe (the hand rule) and the same format on every "
            "Linear; the measurement's proposal is the smallest set of layers kept that brings the all-quantized "
            "model up to the hand recipe's own forward SQNR; Linears: those the format takes (nf4 refuses inputs "
            "not a multiple of 64 wide). Random weights: what the structure alone says, not a trained model's "
            "outliers (see the script's header).",
            "",
            markdown_table(rows, COLUMNS),
        ]
    )
    print(body)
    if args.write:
        update_section(args.write, body, MARKERS)


if __name__ == "__main__":
    main()
