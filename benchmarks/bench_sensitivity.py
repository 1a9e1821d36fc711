"""Benchmark the streamed forward pass: `quantize sensitivity` and `verify --forward`, beside running the model whole.

`make bench` runs::

    .venv/bin/python benchmarks/bench_sensitivity.py --preset 1.3b --write docs/BENCHMARKS.md

The source is the convert benchmark's (original Wan names, bf16, generated once and reused); it is converted
once with wan-fp8.yaml into ``<data-dir>/wan-<preset>-fp8-verify/`` (shared with bench_verify.py). Each case
is its own process, measured for wall time and peak RSS (``os.wait4``):

* the peer, *whole models* (this script's ``--whole`` mode): what a forward check costs without streaming:
  the source and the dequantized checkpoint each built as diffusers' ``WanTransformer3DModel`` in float32
  (on the meta device first, so no initial weights are made), every weight loaded, one forward pass of each on the same inputs (the source as ``verify`` reads it, the
  checkpoint decoded by its format); the output SQNR is checked equal to ``verify --forward``'s;
* ``quantize verify OUT --source SRC`` without and with ``--forward``: the difference is the streamed
  forward check (two passes);
* ``quantize sensitivity SRC --recipe R --json`` for fp8 and the Q4_K_M mix (two passes: the source with
  each layer's X·Q(W), then the recipe's model);
* ``quantize sensitivity SRC --recipe wan-gguf-q4_k_m.yaml --min-forward-sqnr D`` with D one dB above the
  recipe's figure: every rung of every layer measured, then the proposal's measured passes.

``--preset small`` checks the whole script in seconds.
"""

from __future__ import annotations

import argparse
import json
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
from bench_verify import converted  # noqa: E402

START, END = "<!-- bench:sensitivity:start -->", "<!-- bench:sensitivity:end -->"
FP8, GGUF = "wan-fp8.yaml", "wan-gguf-q4_k_m.yaml"


def whole_models(src: Path, out: Path) -> None:
    """The peer: both models whole in float32 (diffusers' class, every weight loaded), one pass of each."""
    import torch
    from diffusers import WanTransformer3DModel

    from loaders import parameters_on_meta
    from quantize.containers import get_container
    from quantize.formats import format_info
    from quantize.plan import make_plan
    from quantize.recipes import load_recipe
    from quantize.run.forward import forward_sqnr_db, load_inputs, runnable, source_weights, stored_weights

    plan = make_plan(src, load_recipe(str(out / "recipe.yaml")).recipe)
    fmt = plan.format
    (cp,) = plan.components
    run = runnable(cp)
    stored = get_container(format_info(fmt.NAME).container).open_stored(out, cp.rel)
    x = load_inputs(None, run.family, run.config)
    outputs = []
    models = []  # both held, as a whole-model check holds them
    for weights in (source_weights(run), stored_weights(run, stored, fmt)):
        with parameters_on_meta():  # no initial weights: each model holds only what is loaded into it
            model = WanTransformer3DModel.from_config(run.config).eval()
        model.load_state_dict({name: weights(name) for name in run.plans}, assign=True)
        models.append(model)
        with torch.no_grad():
            outputs.append(model(**run.inputs.call(run.config, x))[0].float())
    print(json.dumps({"forward_sqnr_db": forward_sqnr_db(*outputs)}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=["tiny", "small", "1.3b"], default="1.3b")
    p.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    p.add_argument("--write", type=Path, metavar="MARKDOWN")
    p.add_argument("--whole", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.whole:
        whole_models(*args.whole)
        return
    data_dir = args.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    src = ensure_checkpoint(data_dir, args.preset)
    out = converted(src, data_dir, args.preset)
    warm_page_cache(src)
    log_path = data_dir / "sensitivity-run.log"
    q = quantize_command()
    rows, results = [], {}

    def case(name: str, argv: list[str]) -> dict | None:
        wall, peak = run_process(argv, log_path)
        text = log_path.read_text()
        data = json.loads(text[text.index("{") :]) if "{" in text else None
        results[name] = (wall, peak, data)
        log(f"{name}: {wall:.1f} s, {gb(peak)} GB RSS")
        return data

    whole = case("whole models (peer)", [sys.executable, __file__, "--whole", str(src), str(out)])
    case("quantize verify OUT --source SRC", [*q, "verify", str(out), "--source", str(src), "--json"])
    forward = case(
        "quantize verify OUT --source SRC --forward",
        [*q, "verify", str(out), "--source", str(src), "--forward", "--json"],
    )
    if not forward["ok"]:
        raise SystemExit(f"verify --forward failed on the benchmark checkpoint: {forward}")
    fp8 = case(f"quantize sensitivity SRC -r {FP8}", [*q, "sensitivity", str(src), "-r", FP8, "--json"])
    mix = case(f"quantize sensitivity SRC -r {GGUF}", [*q, "sensitivity", str(src), "-r", GGUF, "--json"])
    target = round(mix["forward_sqnr_db"] + 1, 1)
    proposal = case(
        f"quantize sensitivity SRC -r {GGUF} --min-forward-sqnr {target}",
        [*q, "sensitivity", str(src), "-r", GGUF, "--min-forward-sqnr", str(target), "--json"],
    )["proposal"]
    base_wall, base_rss, _ = results["whole models (peer)"]
    for name, (wall, peak, _) in results.items():
        rows.append([name, f"{wall:.1f}", f"{wall / base_wall:.2f}", gb(peak), f"{peak / base_rss:.2f}"])
    table = markdown_table(rows, ["case", "time (s)", "time / peer", "peak RSS (GB)", "RSS / peer"])
    verify_only = results["quantize verify OUT --source SRC"][0]
    notes = [
        f"- forward SQNR of the fp8 checkpoint: {forward_check(forward):.2f} dB by `verify --forward`, "
        f"{whole['forward_sqnr_db']:.2f} dB by the whole models (the same passes, streamed or not)",
        f"- the forward check itself (two streamed passes): {results[list(results)[2]][0] - verify_only:.1f} s "
        "on top of `verify --source`",
        f"- sensitivity: forward SQNR {fp8['forward_sqnr_db']:.2f} dB (fp8), {mix['forward_sqnr_db']:.2f} dB "
        f"(Q4_K_M mix); the most sensitive layer under the mix: {mix['layers'][0]['module']} "
        f"({mix['layers'][0]['output_sqnr_db']:.2f} dB output SQNR)",
        f"- the proposal for {target} dB: {'reached' if proposal['reached'] else 'NOT reached'}, "
        f"{proposal['forward_sqnr_db']:.2f} dB with {len(proposal['raised'])} layers raised, "
        f"{gb(proposal['bytes'])} GB against the recipe's {gb(proposal['recipe_bytes'])} GB, "
        f"{proposal['passes']} measured passes after the first two",
    ]
    print(table, *notes, sep="\n")
    if args.write:
        body = "\n".join(
            [
                *section_head(
                    "Sensitivity and `verify --forward`: the streamed forward pass beside whole models",
                    display_command([sys.executable, *sys.argv]),
                    data_dir,
                ),
                f"- Source: the Wan2.1-{args.preset}-shaped checkpoint of the convert benchmark (original names, "
                "bf16); the checkpoint: it converted with wan-fp8.yaml. One run each; fixed random inputs.",
                "",
                table,
                "",
                *notes,
            ]
        )
        update_section(args.write, body, (START, END))


def forward_check(report: dict) -> float:
    """verify's forward SQNR, from its JSON report (one component)."""
    (figure,) = report["forward"].values()
    return figure["output_sqnr_db"]


if __name__ == "__main__":
    main()
