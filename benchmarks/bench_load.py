"""Benchmark `loaders.load_quantized` on a Wan2.1-1.3B-shaped fp8 checkpoint in diffusers layout.

`make bench` runs::

    .venv/bin/python benchmarks/bench_load.py --write docs/BENCHMARKS.md

The source (diffusers `WanTransformer3DModel` with the 1.3B config, random bf16 weights, 1 GB shards)
is generated once under ``bench-data/`` and converted once with wan-diffusers-fp8.yaml. Each case is
its own process (peak RSS from ``os.wait4``), ``--runs`` times, interleaved, page cache warm:

* ``read``: pread every byte of the checkpoint's shards into one reused buffer: the I/O yardstick;
* ``mmap``: ``load_quantized(WanTransformer3DModel, ckpt, host="mmap")``, then one byte of every page of
  every tensor touched (what the first forward would fault in): load time, and load + touch;
* ``pageable``: ``load_quantized(..., host="pageable")``: every tensor read into its own memory.

Times are measured inside the process, after the imports (torch, diffusers), which every case pays
alike. Memory is judged as (peak RSS - RSS after the imports) / the checkpoint's tensor bytes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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
    machine_lines,
    markdown_table,
    quantize_command,
    run_process,
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
CASES = ("read", "mmap", "pageable")


def ensure_source(data_dir: Path) -> Path:
    """A diffusers-layout Wan 1.3B-shaped bf16 checkpoint (``transformer/``), generated once."""
    root = data_dir / "wan-1.3b-diffusers-bf16"
    if (root / "transformer" / "config.json").is_file():
        log(f"reusing {root}")
        return root
    import torch
    from diffusers import WanTransformer3DModel

    from quantize.examples import write_random_checkpoint

    tmp = root.with_name(f".{root.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.device("meta"):
        model = WanTransformer3DModel(**WAN_1_3B)
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    config = {**dict(model.config), "_class_name": "WanTransformer3DModel"}
    config = json.loads(json.dumps(config, default=list))
    log(f"generating {root} ({len(shapes)} tensors, random bf16)")
    write_random_checkpoint(tmp / "transformer", shapes, max_shard_size=SHARD_BYTES, config=config)
    os.rename(tmp, root)
    return root


def ensure_converted(src: Path, data_dir: Path) -> Path:
    out = data_dir / "wan-1.3b-diffusers-fp8"
    if not (out / "quantize_manifest.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        log(f"converting {src} -> {out}")
        argv = [*quantize_command(), "convert", str(src), str(out), "--recipe", "wan-diffusers-fp8.yaml"]
        subprocess.run(argv, check=True, capture_output=True)
    return out / "transformer"


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_case(case: str, checkpoint: Path) -> dict:
    """One measurement, in this process; returns what it timed."""
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


def measure(case: str, checkpoint: Path, scratch: Path) -> dict:
    log_path = scratch / f"{case}.log"
    argv = [sys.executable, __file__, "--case", case, "--checkpoint", str(checkpoint)]
    wall, peak = run_process(argv, log_path)
    lines = [ln for ln in log_path.read_text().splitlines() if ln.startswith("{")]
    return {**json.loads(lines[-1]), "peak_rss": peak, "wall": wall}


def report(samples: dict[str, list[dict]], checkpoint: Path, command: str, data_dir: Path) -> str:
    ckpt_bytes = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    read_s = statistics.median(s["seconds"] for s in samples["read"])

    def row(label: str, seconds: list[float], case: str) -> list[str]:
        peak = max(s["peak_rss"] for s in samples[case])
        base = min(s["baseline_rss"] for s in samples[case])
        per_byte = (peak - base) / ckpt_bytes
        med = statistics.median(seconds)
        return [
            label,
            f"{min(seconds):.2f} / {med:.2f} / {max(seconds):.2f}",
            f"{med / read_s:.2f}x",
            f"{gb(peak)} GB",
            f"{per_byte:.2f}" if case != "read" else "-",
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
    tensor_bytes = samples["pageable"][0]["tensor_bytes"]
    worst = max(
        (max(s["peak_rss"] for s in samples[c]) - min(s["baseline_rss"] for s in samples[c])) / ckpt_bytes
        for c in ("mmap", "pageable")
    )
    verdict = "met" if worst <= RSS_TARGET else "NOT met"
    lines = [
        "## Loading (`loaders.load_quantized`)",
        "",
        f"Run {datetime.date.today().isoformat()} with `{command}`.",
        "",
        *(f"- {line}" for line in machine_lines(data_dir)),
        f"- Checkpoint: Wan2.1-1.3B-shaped diffusers `WanTransformer3DModel`, random weights, converted with "
        f"wan-diffusers-fp8.yaml: {gb(ckpt_bytes)} GB in {len(list(checkpoint.glob('*.safetensors')))} shard(s), "
        f"{gb(tensor_bytes)} GB of tensors. Page cache warm; each case its own process; "
        f"{len(samples['read'])} runs each, interleaved.",
        "",
        markdown_table(rows, columns),
        "",
        f"Memory target (RSS above the imports at most {RSS_TARGET}x the bytes kept resident): {verdict} "
        f"(worst {worst:.2f}x). With mmap nothing is read at load time: pages come in on first use, as the "
        "touch row shows, and stay reclaimable page cache.",
        "",
        "The read yardstick reuses one 8 MB buffer; `pageable` must also fault in fresh memory for every "
        "byte, which is most of its cost here (zeroing each tensor before the pread, so the pages are faulted "
        "from user space rather than one by one inside the read, took it from 4.2 s to the figure above).",
        "",
        "GPU figures (FP8Linear's `_scaled_mm` on the GPU against bf16; block offload step time, H2D GB/s and "
        "copy/compute overlap with pinned and with pageable host memory) are **not measured yet**: no GPU "
        "machine was lent to this task.",
    ]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench-data")
    ap.add_argument("--write", type=Path, help="update this markdown file's load section")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args.checkpoint)), flush=True)
        return
    args.data_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = ensure_converted(ensure_source(args.data_dir), args.data_dir)
    scratch = args.data_dir / "load-scratch"
    scratch.mkdir(exist_ok=True)
    samples: dict[str, list[dict]] = {c: [] for c in CASES}
    measure("read", checkpoint, scratch)  # warm the page cache
    for run in range(args.runs):
        for case in CASES:
            s = measure(case, checkpoint, scratch)
            samples[case].append(s)
            log(f"run {run + 1}/{args.runs} {case}: {s['seconds']:.2f} s, peak RSS {gb(s['peak_rss'])} GB")
    command = display_command([sys.executable, *sys.argv])
    body = report(samples, checkpoint, command, args.data_dir)
    print(body)
    if args.write:
        update_section(args.write, body, (START, END))


if __name__ == "__main__":
    main()
