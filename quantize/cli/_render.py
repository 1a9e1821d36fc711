"""What the commands print: the tables of a plan, a conversion, a verify report, a checkpoint, a sensitivity
measurement, an upload, and the JSON summaries of `inspect --json` and `sensitivity --json`."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ._console import gb, out

__all__ = [
    "print_table",
    "print_plan",
    "print_converted",
    "print_verify",
    "inspect_summary",
    "print_inspect",
    "print_upload_files",
    "sensitivity_json",
    "print_sensitivity",
]


def print_table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A left-titled table of text cells, every column left-justified."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    out.print(table)


# --- plan, convert, inspect ----------------------------------------------------------------------


def print_plan(source: str, origin: str, plan, merge) -> None:
    """`quantize plan`: what each tensor becomes, the tensors each pattern decided, the LoRAs, the sizes."""
    labels = {p: f"t{i}" for i, p in enumerate(plan.recipe.targets, 1)} | {
        p: f"i{i}" for i, p in enumerate(plan.recipe.ignore, 1)
    }
    table = Table(title=f"{source} with {origin}: what each tensor becomes", title_justify="left")
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
    reasons = []  # (component, tensors, why a target's tensors are kept all the same)
    for rel, generic, n, dt, becomes, pattern, before, after, reason in _plan_groups(plan):
        table.add_row(
            rel, escape(generic), str(n), dt, becomes, labels.get(pattern, ""), gb(before), gb(after)
        )
        if reason is not None:
            reasons.append((rel, generic, reason))
    table.add_section()
    table.add_row(
        "total", "", str(plan.tensor_count), "", "", "", gb(plan.source_bytes), gb(plan.output_bytes)
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
    for rel, generic, reason in reasons:
        out.print(f"kept in {rel}: {escape(generic)}: {escape(reason)}")
    if merge is not None:
        _print_loras(merge, [cp.rel for cp in plan.components])
    ratio = plan.output_bytes / max(1, plan.source_bytes)
    out.print(
        f"{gb(plan.source_bytes)} -> {gb(plan.output_bytes)} ({ratio:.0%} of the source) as {plan.recipe.format}"
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
            if tp.output_name != tp.name:  # the format's name table renames it (native names, say)
                generic += f" -> {_star_blocks(tp.output_name)}"
            kept_as = tp.outputs[0].dtype
            becomes = (
                " ".join(filter(None, (plan.recipe.format, tp.qtype)))  # gguf Q4_K
                if tp.quantize
                else ("keep" if kept_as == tp.info.dtype else f"keep as {kept_as}")
            )
            groups[(cp.rel, generic, tp.info.dtype, becomes, tp.pattern or "", tp.reason)].append(tp)
    rows = []
    for (rel, generic, dt, becomes, pattern, reason), tps in sorted(
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
                reason,
            )
        )
    return rows


def print_converted(output: Path, manifest, elapsed: float) -> None:
    """`quantize convert`'s last lines: what was written, how fast, the LoRAs merged, the weight SQNR."""
    src = sum(c.source_bytes for c in manifest.components)
    dst = sum(c.output_bytes for c in manifest.components)
    sqnrs = [t.sqnr_db for t in manifest.tensors.values() if t.sqnr_db is not None]
    quantized = sum(c.quantized for c in manifest.components)
    kept = sum(c.kept for c in manifest.components)
    types = Counter(t.type for t in manifest.tensors.values() if t.type)
    by_type = f" ({', '.join(f'{n} {t}' for t, n in types.most_common())})" if len(types) > 1 else ""
    out.print(
        f"wrote {output}: {quantized} tensors quantized to {manifest.format}{by_type}, {kept} kept; {gb(src)} -> {gb(dst)} in {elapsed:.1f}s ({gb(src / max(elapsed, 1e-9))}/s)"
    )
    _print_steps(manifest)
    if sqnrs:
        out.print(f"weight SQNR: min {min(sqnrs):.1f} dB, median {statistics.median(sqnrs):.1f} dB")
    _print_calibration(manifest)


def _print_calibration(manifest) -> None:
    """`convert --calibrate`: how many layers took a static input scale, and the forward SQNR with them against
    dynamic scales, per component."""
    cal = manifest.calibration
    if cal is None:
        return
    out.print(
        f"input scales: {len(cal.tensors)} layers, from the amax of their inputs on {escape(cal.inputs.file)}"
    )
    smoothed = [e.smoothing for e in cal.tensors.values() if e.smoothing is not None]
    if smoothed:
        out.print(
            f"smoothing: {len(smoothed)} NVFP4 layers hold a pre_quant_scale (AWQ's rule, measured better than "
            "plain NVFP4 on those inputs)"
        )
    for rel, f in cal.forward.items():
        plain = cal.unsmoothed_static_sqnr_db
        without = f"; without smoothing, static scales {_db_text(plain[rel])}" if rel in plain else ""
        out.print(
            f"forward SQNR of {escape(rel)} on {escape(cal.inputs.file)}, inputs quantized: static scales "
            f"{_db_text(f.static_sqnr_db)}, dynamic {_db_text(f.dynamic_sqnr_db)}{without}"
        )


def inspect_summary(checkpoint: Path, m) -> dict:
    """`quantize inspect --json`: a converted checkpoint's manifest, summed up."""
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
    if m.steps:
        summary["steps"] = m.steps  # as recorded: each names its kind (the LoRAs merged, say)
        # the LoRAs merged, as `inspect --json` has always listed them
        summary["loras"] = [lora for step in m.steps if step["step"] == "lora" for lora in step["loras"]]
    if m.calibration is not None:  # `convert --calibrate`: the static input scales, as recorded
        summary["calibration"] = m.calibration.model_dump(mode="json")
    return summary


def print_inspect(checkpoint: Path, m, summary: dict) -> None:
    """`quantize inspect`: the summary as a first line, a table of components, files, LoRAs and SQNR."""
    sqnrs = [t.sqnr_db for t in m.tensors.values() if t.sqnr_db is not None]
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
            gb(c.source_bytes),
            gb(c.output_bytes),
            escape(_summarize_names(c.kept_linears)),
        )
    out.print(table)
    out.print(f"{summary['files']} files, {gb(summary['bytes'])}")
    _print_steps(m)
    if sqnrs:
        out.print(f"weight SQNR: min {min(sqnrs):.1f} dB, median {statistics.median(sqnrs):.1f} dB")
    _print_calibration(m)


def _print_steps(manifest) -> None:
    """What each recorded step did (the LoRAs merged), a line each."""
    from ..steps import summary_lines

    for line in summary_lines(manifest.steps):
        out.print(escape(line))


def _summarize_names(names: list[str]) -> str:
    groups: dict[str, int] = defaultdict(int)
    for n in names:
        groups[_star_blocks(n)] += 1
    return ", ".join(f"{g} ×{k}" if k > 1 else g for g, k in groups.items()) or "-"


# --- verify, upload ------------------------------------------------------------------------------


def print_verify(checkpoint: Path, report, source: str | None, forward: bool) -> None:
    """`quantize verify`: a table of the checks, the first failures, the forward figures, the verdict."""
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
        if "inputs_quantized" in figure:  # static input scales (`convert --calibrate`)
            q = figure["inputs_quantized"]
            out.print(
                f"forward in {escape(rel)}, inputs quantized: static scales {_db_text(q['static_sqnr_db'])}, "
                f"dynamic {_db_text(q['dynamic_sqnr_db'])}"
            )
    hashing = f"hashed {gb(report.hashed_bytes)} at {gb(report.hash_gbps * 1e9)}/s"
    if report.ok:
        scope = (
            "integrity"
            if source is None
            else "integrity, provenance and parity" + (", forward" if forward else "")
        )
        out.print(f"[green]verified[/] {escape(str(checkpoint))}: {scope} checks passed ({hashing})")
        return
    out.print(
        f"[red]verification failed[/]: {len(failures)} problem(s) in {escape(str(checkpoint))} ({hashing})"
    )


def print_upload_files(checkpoint: Path, repo_id: str, revision: str | None, files) -> None:
    """`quantize upload`: the files it sends, with sizes."""
    table = Table(
        title=f"{escape(str(checkpoint))} -> {escape(repo_id)}" + (f" @ {revision}" if revision else "")
    )
    table.add_column("file")
    table.add_column("size", justify="right")
    for f in files:
        table.add_row(escape(f.path), gb(f.size))
    table.add_section()
    table.add_row(f"{len(files)} files", gb(sum(f.size for f in files)))
    out.print(table)


# --- sensitivity ---------------------------------------------------------------------------------


def _db(value: float | None) -> float | None:
    """A figure for JSON: infinite (exact) becomes null."""
    return None if value is None or math.isinf(value) else round(value, 3)


def _db_text(value: float | None) -> str:
    return "exact" if value is None or math.isinf(value) else f"{value:.2f} dB"


def sensitivity_json(measured, proposal, written: Path | None) -> dict:
    """`quantize sensitivity --json`: every layer's figures, the forward SQNR, and the proposal if any."""
    from ..run.sensitivity import files_size

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
        "bytes": files_size(measured.plan),  # on disk, headers and padding included
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


def print_sensitivity(measured, proposal, written, top: int, origin: str, elapsed: float) -> None:
    """`quantize sensitivity`: the most sensitive layers first, the forward SQNR, and the proposal if any."""
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
            gb(lay.bytes[0]),
        )
    out.print(table)
    if len(shown) < len(layers):
        out.print(f"... and {len(layers) - len(shown)} more (--top 0 or --json lists them all)")
    component_bytes = {cp.rel: cp.output_bytes for cp in measured.plan.components}
    for rel, db in measured.forward_sqnr_db.items():
        out.print(
            f"forward SQNR of the recipe in {escape(rel)}: {_db_text(db)} ({gb(component_bytes[rel])} of tensors)"
        )
    if proposal is None:
        out.print(f"measured in {elapsed:.1f}s")
        return
    raised = ", ".join(f"{escape(m)} -> {t}" for m, t in proposal.raised[:8])
    more = f" and {len(proposal.raised) - 8} more" if len(proposal.raised) > 8 else ""
    change = proposal.bytes / max(1, proposal.base_bytes) - 1
    figure = f"forward SQNR {_db_text(proposal.worst_forward_sqnr_db)}"
    sizes = f"{gb(proposal.bytes)} against the recipe's {gb(proposal.base_bytes)} ({change:+.1%})"
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
