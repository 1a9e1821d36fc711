"""Benchmark `loaders.load_quantized` on a Wan2.1-1.3B-shaped diffusers checkpoint, in every format it loads.

`make bench` runs::

    .venv/bin/python benchmarks/bench_load.py --write docs/BENCHMARKS.md

The source (diffusers `WanTransformer3DModel` with the 1.3B config, random bf16 weights, 1 GB shards)
is generated once under ``bench-data/``, and converted once per format with its bundled recipe
(``wan-diffusers-fp8``, ``-torchao-fp8``, ``-nf4``, ``-comfy-fp8``, ``-comfy-int8``, ``-gguf-q8_0``,
``-gguf-q4_k_m``) into ``bench-data/wan-<preset>-diffusers-<format>/``, kept while the recipe its manifest
records is the bundled one. Each case is its own process (peak RSS from ``os.wait4``), ``--runs`` times,
interleaved, page cache warm (the case's files are read just before it starts).

The host modes, on the fp8_channel checkpoint (always measured):

* ``read``: pread every byte of the checkpoint's shards into one reused buffer: the I/O yardstick;
* ``mmap``: ``load_quantized(WanTransformer3DModel, ckpt, host="mmap")``, then one byte of every page of
  every tensor touched (what the first forward would fault in): load time, and load + touch;
* ``pageable``: ``load_quantized(..., host="pageable")``: every tensor read into its own memory.

The formats (``--formats`` picks some), against the bf16 source as the peer:

* ``bf16``: ``WanTransformer3DModel.from_pretrained(src, torch_dtype=torch.bfloat16)``;
* each format: ``load_quantized(WanTransformer3DModel, ckpt, host="pageable", dtype=torch.bfloat16)`` (every
  tensor resident after the load, so the load's peak is the whole model's), then two CPU forward steps of the
  transformer (a 512-token latent, 64 text tokens; the first pays one-time set-up, the second is the step
  time), whose output is compared with the bf16 source's.

Times are measured inside the process, after the imports (torch, diffusers), which every case pays
alike. Memory is judged as (peak RSS - RSS after the imports) / the checkpoint's tensor bytes, against
``RSS_TARGET`` per format after the load. ``--preset tiny --runs 1`` checks the whole script in a few minutes
(a miniature source and its conversions; point ``--data-dir`` elsewhere and do not ``--write`` the docs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import (  # noqa: E402
    REPO,
    display_command,
    gb,
    log,
    markdown_table,
    quantize_command,
    run_process,
    section_head,
    update_section,
)

START, END = "<!-- bench:load:start -->", "<!-- bench:load:end -->"
SHARD_BYTES = 10**9
RSS_TARGET = 1.3  # peak RSS above the post-import baseline, per byte kept resident
WAN_1_3B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
#: the same model in miniature (every width a multiple of 256, as Q4_K needs): checks the script in seconds
WAN_TINY = {**WAN_1_3B, "num_attention_heads": 2, "ffn_dim": 512, "num_layers": 2, "text_dim": 256}
PRESETS = {"1.3b": WAN_1_3B, "tiny": WAN_TINY}
PRESET_TITLES = {"1.3b": "Wan2.1-1.3B", "tiny": "tiny Wan2.1"}
HOST_CASES = ("read", "mmap", "pageable")
#: --formats key -> (the format as the table names it, the bundled recipe that writes it)
FORMATS = {
    "fp8": ("fp8_channel", "wan-diffusers-fp8"),
    "torchao-fp8": ("torchao_fp8", "wan-diffusers-torchao-fp8"),
    "nf4": ("nf4", "wan-diffusers-nf4"),
    "comfy-fp8": ("comfy_fp8", "wan-diffusers-comfy-fp8"),
    "comfy-int8": ("comfy_int8", "wan-diffusers-comfy-int8"),
    "gguf-q8_0": ("gguf Q8_0", "wan-diffusers-gguf-q8_0"),
    "gguf-q4_k_m": ("gguf Q4_K_M", "wan-diffusers-gguf-q4_k_m"),
}
PEER = "bf16"
#: one transformer step: a 2x32x32 latent (512 tokens after the 1x2x2 patches; a bf16 step takes a few
#: seconds on 2 cores), 64 text tokens
LATENT = (1, 16, 2, 32, 32)
TEXT_TOKENS = 64
TIMESTEP = 500
#: the first step pays one-time set-up (kernel probes, oneDNN primitives, an mmap's page faults); the second
#: is the step time, taken unless the first ran past STEP_BUDGET_S (then the first is the step time)
STEPS = 2
STEP_BUDGET_S = 60.0


def ensure_source(data_dir: Path, preset: str = "1.3b") -> Path:
    """A diffusers-layout Wan bf16 checkpoint of `preset`'s shape (``transformer/``), generated once."""
    root = data_dir / f"wan-{preset}-diffusers-bf16"
    if (root / "transformer" / "config.json").is_file():
        log(f"reusing {root}")
        return root
    import torch
    from diffusers import WanTransformer3DModel

    from quantize.examples import write_random_checkpoint

    tmp = root.with_name(f".{root.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.device("meta"):
        model = WanTransformer3DModel(**PRESETS[preset])
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    config = {**dict(model.config), "_class_name": "WanTransformer3DModel"}
    config = json.loads(json.dumps(config, default=list))
    log(f"generating {root} ({len(shapes)} tensors, random bf16)")
    write_random_checkpoint(tmp / "transformer", shapes, max_shard_size=SHARD_BYTES, config=config)
    os.rename(tmp, root)
    return root


def _converted_with(out: Path, recipe: str) -> bool:
    """Whether `out` is a finished conversion with the bundled `recipe` as it is now."""
    from quantize.recipes import bundled_recipe, dump_recipe

    manifest = out / "quantize_manifest.json"
    if not manifest.is_file():
        return False
    stored = json.loads(manifest.read_text()).get("recipe") or {}
    return stored.get("text") == dump_recipe(bundled_recipe(recipe).recipe)


def ensure_converted(src: Path, data_dir: Path, fmt: str = "fp8") -> Path:
    """`src` converted with `fmt`'s bundled recipe, once (a finished folder is renamed into place)."""
    recipe = FORMATS[fmt][1]
    out = data_dir / src.name.replace("-bf16", "-" + recipe.removeprefix("wan-diffusers-"))
    if not _converted_with(out, recipe):
        shutil.rmtree(out, ignore_errors=True)
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"converting {src} -> {out} ({recipe})")
        t0 = time.perf_counter()
        argv = [*quantize_command(), "convert", str(src), str(tmp), "--recipe", f"{recipe}.yaml"]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(
                f"conversion failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-3000:]}"
            )
        os.rename(tmp, out)
        log(f"converted in {time.perf_counter() - t0:.0f} s")
    return out / "transformer"


def model_files(component: Path) -> list[Path]:
    return sorted([*component.glob("*.safetensors"), *component.glob("*.gguf")])


def tensor_bytes(component: Path) -> int:
    """The bytes of every tensor the component's files hold (from their headers)."""
    from loaders.materialize import open_model_files

    return sum(info.nbytes for info in open_model_files(component).tensors.values())


def warm(component: Path) -> None:
    """Read the component's files, so the case after starts with them in the page cache."""
    buf = bytearray(8 << 20)
    for path in model_files(component):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def run_case(case: str, checkpoint: Path) -> dict:
    """One host-mode measurement, in this process; returns what it timed."""
    import torch
    from diffusers import WanTransformer3DModel

    import loaders

    shards = sorted(checkpoint.glob("*.safetensors"))
    baseline = _rss()
    t0 = time.perf_counter()
    if case == "read":
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        for shard in shards:
            with open(shard, "rb", buffering=0) as f:
                while f.readinto(view):
                    pass
        return {"seconds": time.perf_counter() - t0, "baseline_rss": baseline}
    model = loaders.load_quantized(WanTransformer3DModel, checkpoint, host=case)
    loaded = time.perf_counter() - t0
    result = {"seconds": loaded, "baseline_rss": baseline}
    if case == "mmap":
        page = os.sysconf("SC_PAGE_SIZE")
        total = 0
        for t in model.state_dict().values():
            flat = t.reshape(-1).view(torch.uint8) if t.numel() else t
            total += int(flat[::page].sum()) if flat.numel() else 0
        result["touched_seconds"] = time.perf_counter() - t0
    result["tensor_bytes"] = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return result


def run_steps(checkpoint: Path, peer: bool, output: Path) -> dict:
    """Load `checkpoint` (the bf16 source with diffusers when `peer`, else with load_quantized), then run
    `STEPS` forward steps (one if it ran past `STEP_BUDGET_S`); the last step's output is saved to `output`.
    Each step's wall and CPU seconds (all threads) are kept."""
    import torch
    from diffusers import WanTransformer3DModel

    import loaders

    text_dim = json.loads((checkpoint / "config.json").read_text())["text_dim"]
    g = torch.Generator().manual_seed(0)
    latent = torch.randn(LATENT, generator=g).to(torch.bfloat16)
    text = torch.randn(1, TEXT_TOKENS, text_dim, generator=g).to(torch.bfloat16)
    timestep = torch.tensor([TIMESTEP])
    baseline = _rss()
    t0 = time.perf_counter()
    if peer:
        model = WanTransformer3DModel.from_pretrained(checkpoint, torch_dtype=torch.bfloat16)
    else:
        model = loaders.load_quantized(
            WanTransformer3DModel, checkpoint, host="pageable", dtype=torch.bfloat16
        )
    result = {
        "seconds": time.perf_counter() - t0,
        "baseline_rss": baseline,
        "load_peak_rss": _peak_rss(),
        "loaded_rss": _rss(),
        "steps": [],
    }
    result["cpu_steps"] = []
    with torch.inference_mode():
        for _ in range(STEPS):
            t, cpu = time.perf_counter(), time.process_time()
            out = model(latent, timestep, text, return_dict=False)[0]
            result["steps"].append(time.perf_counter() - t)
            result["cpu_steps"].append(time.process_time() - cpu)
            if result["steps"][-1] > STEP_BUDGET_S:
                break
    torch.save(out.float(), output)
    return result


def measure(argv_tail: list[str], scratch: Path, name: str) -> dict:
    log_path = scratch / f"{name}.log"
    wall, peak = run_process([sys.executable, __file__, *argv_tail], log_path)
    lines = [ln for ln in log_path.read_text().splitlines() if ln.startswith("{")]
    return {**json.loads(lines[-1]), "peak_rss": peak, "wall": wall}


def cosine(a: Path, b: Path) -> float:
    import torch

    x, y = torch.load(a).flatten().double(), torch.load(b).flatten().double()
    return float(torch.nn.functional.cosine_similarity(x, y, dim=0))


# --- the report --------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def host_table(samples: dict[str, list[dict]], ckpt_bytes: int) -> tuple[str, float]:
    """The host-mode rows, and their worst RSS ratio."""
    read_s = statistics.median(s["seconds"] for s in samples["read"])

    def per_byte(case: str) -> float:
        peak = max(s["peak_rss"] for s in samples[case])
        return (peak - min(s["baseline_rss"] for s in samples[case])) / ckpt_bytes

    def row(label: str, seconds: list[float], case: str) -> list[str]:
        peak = max(s["peak_rss"] for s in samples[case])
        return [
            label,
            spread(seconds),
            f"{statistics.median(seconds) / read_s:.2f}x",
            f"{gb(peak)} GB",
            f"{per_byte(case):.2f}" if case != "read" else "-",
        ]

    rows = [
        row("read the shards (pread, 8 MB buffer)", [s["seconds"] for s in samples["read"]], "read"),
        row('load_quantized(host="mmap")', [s["seconds"] for s in samples["mmap"]], "mmap"),
        row("... + touch every page (first use)", [s["touched_seconds"] for s in samples["mmap"]], "mmap"),
        row('load_quantized(host="pageable")', [s["seconds"] for s in samples["pageable"]], "pageable"),
    ]
    columns = [
        "case",
        "seconds min / median / max",
        "vs read",
        "peak RSS",
        "RSS above imports / checkpoint byte",
    ]
    return markdown_table(rows, columns), max(per_byte(c) for c in ("mmap", "pageable"))


MEMORY_COLUMNS = [
    "format (recipe)",
    "checkpoint tensors (GB)",
    "load s, min / median / max",
    "peak RSS above imports after the load (GB)",
    "the same / checkpoint tensor bytes",
    f"RSS target after the load (<= {RSS_TARGET}x)",
    "peak RSS above imports, load + steps (GB)",
    "the same / checkpoint tensor bytes",
]
STEP_COLUMNS = [
    "format (recipe)",
    "first step s (median)",
    "step s, min / median / max",
    "step CPU s, all threads (median)",
    "step / bf16 step (fastest runs)",
    "step / bf16 step (medians)",
    "output cosine to bf16 (worst)",
]


def step_times(runs: list[dict]) -> list[float]:
    """The step time of each run: its last step (the second, or the first when that ran past the budget)."""
    return [s["steps"][-1] for s in runs]


def memory(runs: list[dict], nbytes: int) -> dict:
    base = min(s["baseline_rss"] for s in runs)
    load_peak = max(s["load_peak_rss"] for s in runs) - base
    run_peak = max(s["peak_rss"] for s in runs) - base
    return {
        "load": load_peak,
        "run": run_peak,
        "load_ratio": load_peak / nbytes,
        "run_ratio": run_peak / nbytes,
    }


def label_of(key: str) -> str:
    if key == PEER:
        return "bf16 source, diffusers `from_pretrained` (the peer)"
    name, recipe = FORMATS[key]
    return f"{name} ({recipe})"


def format_tables(results: dict[str, list[dict]], nbytes: dict[str, int]) -> tuple[str, str, list[str]]:
    """The memory and the step tables (the bf16 peer first), and one RSS verdict line per format."""
    peer = step_times(results[PEER])
    mem_rows, step_rows, verdicts = [], [], []
    for key, runs in results.items():
        m = memory(runs, nbytes[key])
        met = m["load_ratio"] <= RSS_TARGET
        if key == PEER:
            target = "- (peer)"
        else:
            target = "met" if met else "**NOT met**"
            above = m["run_ratio"] > RSS_TARGET
            verdicts.append(
                f"{FORMATS[key][0]}: {'met' if met else 'NOT met'} after the load ({m['load_ratio']:.2f}x of "
                f"{gb(nbytes[key])} GB); with the steps {m['run_ratio']:.2f}x"
                + (f", above {RSS_TARGET}x: the steps' working memory, see below" if above else "")
            )
        mem_rows.append(
            [
                label_of(key),
                gb(nbytes[key]),
                spread([s["seconds"] for s in runs]),
                gb(m["load"]),
                f"{m['load_ratio']:.2f}",
                target,
                gb(m["run"]),
                f"{m['run_ratio']:.2f}",
            ]
        )
        times = step_times(runs)
        single = any(len(s["steps"]) == 1 for s in runs)
        cos = [s["cosine"] for s in runs if s.get("cosine") is not None]
        step_rows.append(
            [
                label_of(key),
                f"{statistics.median(s['steps'][0] for s in runs):.2f}",
                spread(times) + (" (first step: one step only)" if single else ""),
                f"{statistics.median(s['cpu_steps'][-1] for s in runs):.2f}",
                f"{min(times) / min(peer):.2f}x",
                f"{statistics.median(times) / statistics.median(peer):.2f}x",
                f"{min(cos):.5f}" if cos else "1 (itself)",
            ]
        )
    return markdown_table(mem_rows, MEMORY_COLUMNS), markdown_table(step_rows, STEP_COLUMNS), verdicts


def loadavg(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def one_core_note(results: dict[str, list[dict]]) -> list[str]:
    """A line naming the formats whose step kept about one core busy, where there are such."""
    if (os.cpu_count() or 1) < 2:
        return []
    one = [
        label_of(key)
        for key, runs in results.items()
        if statistics.median(s["cpu_steps"][-1] / s["steps"][-1] for s in runs) < 1.3
    ]
    if not one:
        return []
    return [f"Steps that kept about one core busy (CPU s / wall s under 1.3): {', '.join(one)}.", ""]


def report(
    samples: dict[str, list[dict]],
    results: dict[str, list[dict]],
    checkpoint: Path,
    source: Path,
    nbytes: dict[str, int],
    command: str,
    args: argparse.Namespace,
) -> str:
    data_dir, runs, preset = args.data_dir, args.runs, args.preset
    ckpt_bytes = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    tensors = samples["pageable"][0]["tensor_bytes"]
    table, worst = host_table(samples, ckpt_bytes)
    verdict = "met" if worst <= RSS_TARGET else "NOT met"
    mem_table, step_table, verdicts = format_tables(results, nbytes)
    tokens = LATENT[2] * (LATENT[3] // 2) * (LATENT[4] // 2)
    lines = [
        *section_head("Loading (`loaders.load_quantized`)", command, data_dir),
        f"- Source: {PRESET_TITLES[preset]}-shaped diffusers `WanTransformer3DModel`, random bf16 weights, "
        f"{gb(nbytes[PEER])} GB of tensors in {len(model_files(source))} shard(s); converted once per format "
        "with its bundled recipe (cached under the data dir). Page cache warm (each case's files read just "
        f"before it); each case its own process; {runs} run(s) each, interleaved.",
        f"- Load average (1 / 5 / 15 min) at the start {loadavg(args.load_start)}, at the end "
        f"{loadavg(args.load_end)}: the cores are shared with other jobs, so compare the fastest runs.",
        "",
        "### Host modes (the fp8_channel checkpoint)",
        "",
        f"wan-diffusers-fp8: {gb(ckpt_bytes)} GB in {len(list(checkpoint.glob('*.safetensors')))} shard(s), "
        f"{gb(tensors)} GB of tensors.",
        "",
        table,
        "",
        f"Memory target (RSS above the imports at most {RSS_TARGET}x the bytes kept resident): {verdict} "
        f"(worst {worst:.2f}x). With mmap nothing is read at load time: pages come in on first use, as the "
        "touch row shows, and stay reclaimable page cache.",
        "",
        "The read yardstick reuses one 8 MB buffer; `pageable` must also fault in fresh memory for every "
        "byte, which is most of its cost here (zeroing each tensor before the pread, so the pages are faulted "
        "from user space rather than one by one inside the read, took it from 4.2 s to the figure above).",
        "",
        "### Every format: load and peak memory",
        "",
        '`load_quantized(WanTransformer3DModel, ckpt, host="pageable", dtype=torch.bfloat16)` (every tensor '
        "read into memory, so the load's peak holds the whole model), against the bf16 source loaded by "
        "`WanTransformer3DModel.from_pretrained(src, torch_dtype=torch.bfloat16)`; then the steps below, in "
        "the same process. Load seconds are in the process after the imports. Peak RSS after the load is the "
        "process's `ru_maxrss` then; with the steps, its `ru_maxrss` from `os.wait4`; both less the RSS after "
        "the imports, worst over the runs, and divided by the checkpoint's tensor bytes (from the file "
        "headers). The target is judged after the load: no quantized layer exists in bf16 on the way in.",
        "",
        mem_table,
        "",
        f"RSS target per format (peak RSS above the imports at most {RSS_TARGET}x the checkpoint's tensor "
        "bytes, after the load):",
        "",
        *(f"- {v}" for v in verdicts),
        "",
        "`from_pretrained` maps the bf16 files and reads them on first use, so its peak after the load is "
        "small and its weights come in during the first step (its peak with the steps is the whole model). "
        "What the steps add above the load is the step's working memory (activations, each quantized "
        "layer's weight decoded for its call where the format's CPU path decodes, the allocator's free "
        "lists), not a model in bf16.",
        "",
        "### Every format: one CPU transformer step against bf16",
        "",
        f"Forward steps under `torch.inference_mode()` on the CPU ({os.cpu_count()} threads): "
        f"hidden_states {list(LATENT)} bf16 ({tokens} tokens), encoder_hidden_states "
        f'[1, {TEXT_TOKENS}, {PRESETS[preset]["text_dim"]}] bf16, timestep [{TIMESTEP}], `compute="fast"` '
        "(each format's default path). The first step also pays one-time set-up; the step time is the "
        f"second (or the first alone when that ran past {STEP_BUDGET_S:g} s). CPU s: process CPU time of "
        "that step, all threads (about twice the wall time when both cores are busy). Cosine: the last "
        "step's output against the bf16 model's.",
        "",
        step_table,
        "",
        *one_core_note(results),
        'On the CPU `compute="fast"` decodes the float8 formats\' weights for each call (their emulated '
        "`_scaled_mm` took 3.4-4x a bf16 step here) and runs int8's `_int_mm`. The GPU figures (each scheme's "
        "Linear against bf16 at 14B shapes, H2D GB/s, a block-offloaded step against the resident model) are "
        "`make gpu-check`'s (DEVELOPERS.md), in its own section.",
    ]
    return "\n".join(lines)


# --- entry point -------------------------------------------------------------------------------


def parse_formats(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in FORMATS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"formats are a comma-separated subset of {', '.join(FORMATS)}")
    return [k for k in FORMATS if k in keys]  # in the table's order


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="rounds of measurements (default: 3)")
    ap.add_argument(
        "--formats",
        type=parse_formats,
        default=list(FORMATS),
        metavar="LIST",
        help=f"comma-separated formats to load beside bf16 (default: all of {','.join(FORMATS)})",
    )
    ap.add_argument(
        "--preset", choices=list(PRESETS), default="1.3b", help="model shape (tiny: a quick check)"
    )
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    ap.add_argument("--write", type=Path, help="update this markdown file's load section")
    ap.add_argument("--case", choices=[*HOST_CASES, "steps", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.case in HOST_CASES:
        print(json.dumps(run_case(args.case, args.checkpoint)), flush=True)
        return
    if args.case:
        print(json.dumps(run_steps(args.checkpoint, args.case == "peer", args.output)), flush=True)
        return
    t_start = time.perf_counter()
    args.load_start = os.getloadavg()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    source = ensure_source(args.data_dir, args.preset)
    components = {PEER: source / "transformer"}
    for key in dict.fromkeys(["fp8", *args.formats]):  # fp8_channel: the host-mode rows' checkpoint too
        components[key] = ensure_converted(source, args.data_dir, key)
    checkpoint = components["fp8"]
    if "fp8" not in args.formats:
        del components["fp8"]
    nbytes = {key: tensor_bytes(c) for key, c in components.items()}
    scratch = args.data_dir / "load-scratch"
    scratch.mkdir(exist_ok=True)
    samples: dict[str, list[dict]] = {c: [] for c in HOST_CASES}
    results: dict[str, list[dict]] = {key: [] for key in components}
    measure(["--case", "read", "--checkpoint", str(checkpoint)], scratch, "read")  # warm the page cache
    for run in range(args.runs):
        for case in HOST_CASES:
            warm(checkpoint)
            s = measure(["--case", case, "--checkpoint", str(checkpoint)], scratch, case)
            samples[case].append(s)
            log(f"run {run + 1}/{args.runs} {case}: {s['seconds']:.2f} s, peak RSS {gb(s['peak_rss'])} GB")
        for key, component in components.items():
            out = scratch / f"{key}.pt"
            warm(component)
            case = "peer" if key == PEER else "steps"
            argv = ["--case", case, "--checkpoint", str(component), "--output", str(out)]
            s = measure(argv, scratch, key)
            s["cosine"] = None if key == PEER else cosine(out, scratch / f"{PEER}.pt")
            results[key].append(s)
            steps = ", ".join(f"{t:.2f}" for t in s["steps"])
            log(
                f"run {run + 1}/{args.runs} {key}: load {s['seconds']:.2f} s, steps {steps} s, peak RSS "
                f"{gb(s['load_peak_rss'] - s['baseline_rss'])} GB after load, "
                f"{gb(s['peak_rss'] - s['baseline_rss'])} GB in all (above imports)"
                + (f", cosine {s['cosine']:.5f}" if s["cosine"] is not None else "")
            )
    args.load_end = os.getloadavg()
    command = display_command([sys.executable, *sys.argv])
    body = report(samples, results, checkpoint, source / "transformer", nbytes, command, args)
    print(body)
    if args.write:
        update_section(args.write, body, (START, END))
    log(f"done in {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
