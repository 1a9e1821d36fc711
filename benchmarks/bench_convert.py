"""Benchmark `quantize convert` against plain safetensors read-and-write on a Wan2.1-1.3B-shaped checkpoint.

`make bench` runs::

    .venv/bin/python benchmarks/bench_convert.py --preset 1.3b --write docs/BENCHMARKS.md

1. A random-weight checkpoint with the original Wan key names (bf16, 1 GB shards) is generated once
   into ``<data-dir>/wan-<preset>-bf16/`` and reused while it is complete (built in a temporary
   folder and renamed into place, then checked against the expected names, shapes and dtype).
2. Each measured run is its own process, so its peak RSS (``ru_maxrss`` from ``os.wait4``) is that
   run's alone, and its wall time includes start-up (Python, torch import) as a user would see it:

   * ``read-and-write``, the plain I/O floor: every source shard opened with ``safe_open``, read
     whole, written with ``safetensors.torch.save_file`` and fsynced (the converter fsyncs its
     shards too), one shard held at a time;
   * ``quantize convert SRC OUT --recipe wan-fp8.yaml --overwrite`` with the default 5GB shards,
     with ``--max-shard-size 1GB``, and with ``--workers 1`` (with ``--lora-only``: only the default run
     and the same with ``--lora``, a rank-64 LoRA on every block Linear generated once beside the
     checkpoint, into its own section);
   * the other formats: ``--recipe wan-torchao-fp8.yaml``, ``--recipe wan-nf4.yaml``, and ComfyUI's
     ``--recipe wan-comfy-fp8.yaml`` and ``--recipe wan-comfy-int8.yaml`` (one file per model), and GGUF
     ``--recipe wan-gguf-q8_0.yaml`` and ``--recipe wan-gguf-q4_k_m.yaml``, with their peers (this script's
     ``--gguf-peer`` mode): gguf-py's quantize + GGUFWriter for Q8_0, ggml's own quantizer on one thread +
     GGUFWriter for the K-quant mix;
   * the newer ComfyUI formats: ``--recipe wan-comfy-nvfp4.yaml`` (mixed: NVFP4, MXFP8 for block 0 and every
     ffn.2), ``--recipe wan-comfy-mxfp8.yaml``, ``--recipe wan-comfy-int8-convrot.yaml`` and this script's
     ``wan-comfy-nvfp4-all.yaml`` (NVFP4 on every block Linear, written beside the outputs), each with its peer
     (this script's ``--ck-peer`` mode): each shard read whole, every tensor the recipe quantizes passed whole to
     comfy-kitchen's eager quantizer for its type (``TensorCoreNVFP4Layout.quantize(w.float())``,
     ``TensorCoreMXFP8Layout.quantize(w.float())``, ``quantize_int8_convrot_weight(w.float(), 256)``), the shard
     written with ``save_file`` and fsynced; and ``--recipe wan-torchao-int8.yaml`` where it is bundled;
   * ``bitsandbytes quantize_4bit``, the peer for nf4 (this script's ``--bnb-nf4`` mode): each shard
     read whole, every tensor wan-nf4.yaml quantizes passed through bitsandbytes' own
     ``quantize_4bit(blocksize=64, compress_statistics=True, quant_type="nf4")`` in bf16, the shard
     written with ``save_file`` and fsynced.

   Runs alternate baseline / converter (A B A C A D, ``--runs`` times over) so both see the same
   page-cache state; the source is read once beforehand so every run starts from a warm cache.
   Outputs are measured and deleted after every run.
3. The table (wall time min / median / max, ratio of medians to read-and-write, peak RSS, GB/s of
   source bytes, output size) is printed and, with ``--write FILE``, stored in the section of that
   Markdown file between ``<!-- bench:convert:start -->`` and ``<!-- bench:convert:end -->``.

``--preset small --runs 1`` checks the whole script in seconds. GB means 10^9 bytes throughout.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = "wan-fp8.yaml"
TORCHAO_RECIPE = "wan-torchao-fp8.yaml"
NF4_RECIPE = "wan-nf4.yaml"
COMFY_RECIPES = ("wan-comfy-fp8.yaml", "wan-comfy-int8.yaml")  # one ComfyUI file, native names
#: the ComfyUI formats with comfy-kitchen's eager quantizer, run whole on each tensor, as their peer
CK_RECIPES = ("wan-comfy-nvfp4.yaml", "wan-comfy-mxfp8.yaml", "wan-comfy-int8-convrot.yaml")
#: pure NVFP4 (no MXFP8 layers): a recipe of this script's, written beside the outputs
NVFP4_ALL = "wan-comfy-nvfp4-all.yaml"
NVFP4_ALL_TEXT = """name: wan-comfy-nvfp4-all
description: bench_convert.py's pure NVFP4 case, every Linear of the blocks in NVFP4.
format: comfy_nvfp4
targets:
  - 'blocks\\.\\d+\\.(self_attn|cross_attn)\\.(q|k|v|o|k_img|v_img)'
  - 'blocks\\.\\d+\\.ffn\\.(0|2)'
checks:
  min_sqnr_db: 16
  min_cosine: 0.98
"""
TORCHAO_INT8_RECIPE = "wan-torchao-int8.yaml"
GGUF_RECIPES = ("wan-gguf-q8_0.yaml", "wan-gguf-q4_k_m.yaml")
GGUF_PEER = "gguf-py quantize + GGUFWriter (Q8_0 peer)"
GGML_PEER = "ggml quantize_chunk, one thread, + GGUFWriter (K-quant mix peer)"
LORA_RANK = 64
LORA_CASE = f"convert --lora (rank {LORA_RANK} on every block Linear)"
BNB_PEER = "bitsandbytes quantize_4bit (nf4 peer)"
LLMC_PEER = "llm-compressor model_free_ptq FP8_DYNAMIC (fp8 peer)"
#: llm-compressor lives in its own virtual environment (`make bench-peers`), never in ours
LLMC_PYTHON = REPO / "bench-data" / "peers" / "llmcompressor" / "bin" / "python"
SOURCE_SHARD_BYTES = 10**9
RSS_TARGET_BYTES = 10**9
BASELINE = "read-and-write"
START, END = "<!-- bench:convert:start -->", "<!-- bench:convert:end -->"
LORA_MARKERS = ("<!-- bench:lora:start -->", "<!-- bench:lora:end -->")
DOC_HEADER = """# Benchmarks

Measured numbers for dit-quantize, each section written by the script named in it (re-run it to
update that section only). Checkpoints are random-weight stand-ins with the real key names, shapes
and dtypes: the converter's cost depends on those alone.
"""
COLUMNS = [
    "case",
    "runs",
    "time min / median / max (s)",
    "ratio to read-and-write",
    "peak RSS (GB)",
    "GB/s",
    "output (GB)",
]


@dataclass(frozen=True)
class Case:
    """One measured command and the output it writes (deleted after each run)."""

    name: str
    argv: list[str]
    out: Path


@dataclass(frozen=True)
class Sample:
    wall_s: float
    peak_rss: int  # bytes
    output_bytes: int
    reported_s: float | None  # the converter's own timer, from its "wrote OUT: ..." line


@dataclass
class Result:
    case: Case
    samples: list[Sample] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [s.wall_s for s in self.samples]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    @property
    def peak_rss(self) -> int:
        return max(s.peak_rss for s in self.samples)


# --- the checkpoint ----------------------------------------------------------------------------


def checkpoint_dir(data_dir: Path, preset: str) -> Path:
    return data_dir / f"wan-{preset}-bf16"


def source_shards(src: Path) -> list[Path]:
    """The checkpoint files of a source folder, or the one file a source given as a file is."""
    return [src] if src.is_file() else sorted(src.rglob("*.safetensors"))


def source_bytes(src: Path) -> int:
    return sum(p.stat().st_size for p in source_shards(src))


def is_complete(path: Path, preset: str) -> bool:
    """Every expected tensor is there, bf16, with its shape, and every shard is whole."""
    from quantize.errors import QuantizeError
    from quantize.models.examples import examples_of
    from quantize.read.checkpoint import open_component

    if not (path / "example.json").is_file():
        return False
    try:
        component = open_component(path)
    except QuantizeError:
        return False
    found = {name: info.shape for name, info in component.tensors.items()}
    bf16 = all(info.dtype == "BF16" for info in component.tensors.values())
    (model,) = examples_of("wan").models(preset, "t2v")
    return bf16 and found == dict(model.tensors)


def ensure_checkpoint(data_dir: Path, preset: str) -> Path:
    """The benchmark checkpoint, generated unless a complete one is already there."""
    import torch

    from quantize.examples import write_example

    path = checkpoint_dir(data_dir, preset)
    if path.is_dir() and is_complete(path, preset):
        log(f"reusing {path}")
        return path
    shutil.rmtree(path, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"generating {path} (random bf16 weights, {SOURCE_SHARD_BYTES / 1e9:g} GB shards)")
    t0 = time.perf_counter()
    write_example(tmp, preset, "t2v", dtype=torch.bfloat16, max_shard_size=SOURCE_SHARD_BYTES)
    os.rename(tmp, path)
    log(f"generated {gb(source_bytes(path))} GB in {time.perf_counter() - t0:.0f} s")
    return path


def ensure_lora(data_dir: Path, preset: str) -> Path:
    """A rank-`LORA_RANK` LoRA on every block Linear of the benchmark model, generated once."""
    from quantize.examples import write_example_lora

    path = data_dir / f"wan-{preset}-lora-r{LORA_RANK}.safetensors"
    if not path.is_file():
        tmp = path.with_name(f".{path.name}.tmp")
        write_example_lora(tmp, preset, rank=LORA_RANK)
        os.rename(tmp, path)
    return path


def warm_page_cache(src: Path) -> None:
    """Read the source once so the first measured run does not pay for a cold cache alone."""
    buf = bytearray(8 << 20)
    for shard in source_shards(src):
        with open(shard, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --- the baseline (runs in its own process: --read-and-write SRC OUT) --------------------------


def read_and_write(src: Path, out: Path) -> None:
    """Each shard read whole with safe_open and written with save_file, one shard at a time."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    for shard in source_shards(src):
        dest = out / shard.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with safe_open(shard, framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
            metadata = f.metadata()
        save_file(tensors, dest, metadata=metadata)
        del tensors
        fsync_file(dest)


def bnb_nf4(src: Path, out: Path) -> None:
    """The peer for nf4: bitsandbytes' own quantizer over the tensors wan-nf4.yaml quantizes, shard by shard."""
    import bitsandbytes.functional as F
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from quantize.plan import make_plan
    from quantize.recipes import load_recipe

    (component,) = make_plan(src, load_recipe(NF4_RECIPE).recipe).components
    targets = {t.name for t in component.quantized()}
    for shard in source_shards(src):
        dest = out / shard.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tensors = {}
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if name not in targets:
                    tensors[name] = t
                    continue
                packed, state = F.quantize_4bit(
                    t.to(torch.bfloat16), blocksize=64, compress_statistics=True, quant_type="nf4"
                )
                tensors[name] = packed
                tensors.update({f"{name}.{k}": v for k, v in state.as_dict(packed=True).items()})
        save_file(tensors, dest)
        del tensors
        fsync_file(dest)


def gguf_peer(src: Path, out: Path, recipe: str) -> None:
    """A GGUF peer: the same tensors, in the same types, as `quantize convert --recipe RECIPE` writes them,
    quantized by the reference (gguf-py's numpy quantizer for Q8_0; ggml's own `ggml_quantize_chunk`, on this
    one thread, for the K-quant mix) and written by gguf-py's GGUFWriter (which holds every tensor until it
    writes)."""
    import ctypes

    import gguf
    import numpy as np
    import torch
    from safetensors import safe_open

    from quantize import dtypes
    from quantize.plan import make_plan
    from quantize.recipes import load_recipe

    def ggml_quantize(w: np.ndarray, qtype: str) -> np.ndarray:
        import ggml

        rows, cols = w.shape
        q = np.empty((rows, dtypes.nbytes(qtype, (cols,))), dtype=np.uint8)
        src_ptr = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        ggml.ggml_quantize_chunk(dtypes.by_name(qtype).ggml, src_ptr, q.ctypes.data, 0, rows, cols, None)
        return q

    (component,) = make_plan(src, load_recipe(recipe).recipe).components
    plans = {t.name: t for t in component.tensors}
    writer = gguf.GGUFWriter(out, "wan")
    writer.add_quantization_version(2)
    writer.add_file_type(7)
    for shard in source_shards(src):
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():
                t, spec = f.get_tensor(name), plans[name].outputs[0]
                if plans[name].quantize:
                    qtype = gguf.GGMLQuantizationType[spec.dtype]
                    w = np.ascontiguousarray(t.float().numpy())
                    q = (
                        gguf.quants.quantize(w, qtype)
                        if spec.dtype == "Q8_0"
                        else ggml_quantize(w, spec.dtype)
                    )
                    writer.add_tensor(name, q, raw_dtype=qtype)
                elif spec.dtype == "BF16":
                    writer.add_tensor(
                        name, t.view(torch.int16).numpy(), raw_dtype=gguf.GGMLQuantizationType.BF16
                    )
                else:
                    writer.add_tensor(name, t.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fsync_file(out)


def ck_peer_name(recipe: str) -> str:
    return f"comfy-kitchen eager, whole tensors ({Path(recipe).name} peer)"


def ck_peer(src: Path, out: Path, recipe: str) -> None:
    """The peer for the ComfyUI NVFP4 / MXFP8 / ConvRot recipes: comfy-kitchen's eager quantizer for each tensor's
    type, on the whole tensor in float32, over the tensors the recipe quantizes, shard by shard (the output keys
    and parts of `quantize convert`; the marker as ComfyUI's own ``state_dict`` writes it)."""
    import json

    import torch
    from comfy_kitchen.backends.eager.quantization import quantize_int8_convrot_weight
    from comfy_kitchen.tensor import TensorCoreMXFP8Layout, TensorCoreNVFP4Layout

    def marker(conf: dict) -> torch.Tensor:
        return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)

    def quantize(w: torch.Tensor, qtype: str) -> dict[str, torch.Tensor]:
        if qtype == "nvfp4":
            q, params = TensorCoreNVFP4Layout.quantize(w.float())
            return {
                "weight": q,
                "weight_scale": params.block_scale,
                "weight_scale_2": params.scale,
                "comfy_quant": marker({"format": "nvfp4"}),
            }
        if qtype == "mxfp8":
            q, params = TensorCoreMXFP8Layout.quantize(w.float())
            return {
                "weight": q,
                "weight_scale": params.scale.view(torch.uint8),
                "comfy_quant": marker({"format": "mxfp8"}),
            }
        if qtype == "int8_convrot":
            q, scale = quantize_int8_convrot_weight(w.float(), 256)
            conf = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
            return {"weight": q, "weight_scale": scale, "comfy_quant": marker(conf)}
        raise SystemExit(f"--ck-peer: no comfy-kitchen peer for type {qtype!r}")

    write_peer_shards(src, out, recipe, lambda w, tp: quantize(w, tp.qtype))


def write_peer_shards(src: Path, out: Path, recipe: str, quantize) -> None:
    """A peer's output: each source shard read whole, each tensor the recipe quantizes replaced by
    ``quantize(w, tp)`` (its parts by local name, `tp` its plan), the rest kept, the output keys those of `quantize
    convert`; each shard written with save_file and fsynced."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from quantize.plan import make_plan
    from quantize.recipes import load_recipe

    (component,) = make_plan(src, load_recipe(recipe).recipe).components
    plans = {t.name: t for t in component.tensors}
    for shard in source_shards(src):
        dest = out / shard.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tensors = {}
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():
                t, tp = f.get_tensor(name), plans[name]
                if not tp.quantize:
                    tensors[tp.output_name] = t
                    continue
                keys = {part: spec.name for part, spec in zip(tp.parts, tp.outputs, strict=True)}
                tensors.update({keys[part]: v.contiguous() for part, v in quantize(t, tp).items()})
        save_file(tensors, dest)
        del tensors
        fsync_file(dest)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- measuring ---------------------------------------------------------------------------------


def quantize_command() -> list[str]:
    """The installed console script beside this Python, else the CLI module."""
    script = Path(sys.executable).with_name("quantize")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "quantize.cli"]


def make_cases(
    src: Path, scratch: Path, formats: bool = True, lora: Path | None = None
) -> tuple[Case, list[Case]]:
    copy = scratch / BASELINE
    baseline = Case(BASELINE, [sys.executable, __file__, "--read-and-write", str(src), str(copy)], copy)
    out = scratch / src.name.replace("-bf16", "-fp8")
    convert = [*quantize_command(), "convert", str(src), str(out), "--recipe", RECIPE, "--overwrite"]
    workers = os.cpu_count() or 1
    cases = [
        Case(f"convert (default: 5GB shards, {workers} workers)", convert, out),
        Case("convert --max-shard-size 1GB", [*convert, "--max-shard-size", "1GB"], out),
        Case("convert --workers 1", [*convert, "--workers", "1"], out),
    ]
    if lora is not None:
        cases.append(Case(LORA_CASE, [*convert, "--lora", str(lora)], out))
    if formats:
        for recipe in (TORCHAO_RECIPE, NF4_RECIPE, *COMFY_RECIPES, *GGUF_RECIPES):
            argv = [*quantize_command(), "convert", str(src), str(out), "--recipe", recipe, "--overwrite"]
            cases.append(Case(f"convert --recipe {recipe}", argv, out))
        (scratch / NVFP4_ALL).write_text(NVFP4_ALL_TEXT)
        for recipe in (*CK_RECIPES, str(scratch / NVFP4_ALL)):
            name = Path(recipe).name
            argv = [*quantize_command(), "convert", str(src), str(out), "--recipe", recipe, "--overwrite"]
            cases.append(Case(f"convert --recipe {name}", argv, out))
            peer = scratch / "ck-peer"
            argv = [sys.executable, __file__, "--ck-peer", recipe, str(src), str(peer)]
            cases.append(Case(ck_peer_name(name), argv, peer))
        from quantize.recipes import bundled_names

        if TORCHAO_INT8_RECIPE in bundled_names():
            argv = [*quantize_command(), "convert", str(src), str(out), "--recipe", TORCHAO_INT8_RECIPE]
            cases.append(Case(f"convert --recipe {TORCHAO_INT8_RECIPE}", [*argv, "--overwrite"], out))
        peer = scratch / "bnb-nf4"
        cases.append(Case(BNB_PEER, [sys.executable, __file__, "--bnb-nf4", str(src), str(peer)], peer))
        for name, recipe in ((GGUF_PEER, GGUF_RECIPES[0]), (GGML_PEER, GGUF_RECIPES[1])):
            peer = scratch / "gguf-peer.gguf"
            cases.append(
                Case(name, [sys.executable, __file__, "--gguf-peer", recipe, str(src), str(peer)], peer)
            )
    if LLMC_PYTHON.exists():
        script = str(Path(__file__).with_name("peer_llmcompressor.py"))
        view = scratch / "transformers-view"  # the same shards, hard-linked under the names it expects
        subprocess.run(
            [str(LLMC_PYTHON), script, str(src), "-", "1", str(view)], check=True, capture_output=True
        )
        peer = scratch / "llmc-fp8"
        argv = [str(LLMC_PYTHON), script, str(view), str(peer), str(os.cpu_count() or 1)]
        cases.append(Case(LLMC_PEER, argv, peer))
    return baseline, cases


def run_process(argv: list[str], log_path: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one command, which must succeed."""
    os.sync()  # no dirty pages left by the previous run or its deletion
    with open(log_path, "wb") as log_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"failed with exit code {proc.returncode}: {shlex.join(argv)}\n{tail}")
    return wall, usage.ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def reported_seconds(log_path: Path) -> float | None:
    """The time in the converter's 'wrote OUT: ... in 12.3s (...)' line, if any."""
    found = re.findall(r" in (\d+(?:\.\d+)?)s \(", log_path.read_text(errors="replace"))
    return float(found[-1]) if found else None


def tree_bytes(path: Path) -> int:
    """Bytes of an output: a folder's files, or one file (a GGUF peer's)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(case: Case, scratch: Path) -> Sample:
    shutil.rmtree(case.out, ignore_errors=True)
    log_path = scratch / "run.log"
    wall, rss = run_process(case.argv, log_path)
    sample = Sample(wall, rss, tree_bytes(case.out), reported_seconds(log_path))
    shutil.rmtree(case.out, ignore_errors=True)
    return sample


def benchmark(baseline: Case, cases: list[Case], runs: int, scratch: Path) -> list[Result]:
    """`runs` rounds of baseline, case, baseline, case...; the baseline first in the result."""
    results = {c.name: Result(c) for c in [baseline, *cases]}
    for round_no in range(1, runs + 1):
        for case in cases:
            for c in (baseline, case):
                sample = measure(c, scratch)
                results[c.name].samples.append(sample)
                log(f"run {round_no}/{runs} {c.name}: {sample.wall_s:.2f} s, {gb(sample.peak_rss)} GB RSS")
    return list(results.values())


# --- reporting ---------------------------------------------------------------------------------


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def table_rows(results: list[Result], src_bytes: int) -> list[list[str]]:
    base = results[0].median_s
    rows = []
    for r in results:
        t = r.times
        rows.append(
            [
                r.case.name,
                str(len(t)),
                f"{min(t):.2f} / {statistics.median(t):.2f} / {max(t):.2f}",
                f"{r.median_s / base:.2f}",
                gb(r.peak_rss),
                f"{src_bytes / r.median_s / 1e9:.2f}",
                gb(r.samples[-1].output_bytes),
            ]
        )
    return rows


def markdown_table(rows: list[list[str]], columns: list[str] = COLUMNS) -> str:
    """A Markdown table: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def ram_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def disk_of(path: Path) -> str:
    """Device, filesystem type, size and free space of `path`, from df ("unknown" where df is missing or says
    otherwise: a machine's header never costs its figures)."""
    try:
        lines = subprocess.run(["df", "-hT", str(path)], capture_output=True, text=True).stdout.splitlines()
        device, fstype, size, _used, avail, *_ = lines[1].split()
    except (OSError, IndexError, ValueError):
        return "unknown"
    return f"{device} ({fstype}, {size}, {avail} free)"


def machine_lines(data_dir: Path) -> list[str]:
    cores = os.cpu_count()
    return [
        f"CPU: {cpu_model()}, {cores} cores; RAM {ram_bytes() / 2**30:.1f} GiB; Linux {platform.release()}",
        f"Python {platform.python_version()}, torch {version('torch')}, safetensors {version('safetensors')}",
        f"Data dir `{display_path(data_dir)}` on {disk_of(data_dir)}",
    ]


def checkpoint_line(src: Path, preset: str) -> str:
    from quantize.models.examples import examples_of

    s = examples_of("wan").presets[preset]
    (model,) = examples_of("wan").models(preset, "t2v")
    shards = len(source_shards(src))
    return (
        f"Wan2.1-{preset}-shaped T2V DiT, original key names, random weights: dim {s.dim}, ffn {s.ffn_dim}, "
        f"{s.num_layers} blocks, {s.num_heads} heads, {len(model.tensors)} tensors, bf16, "
        f"{SOURCE_SHARD_BYTES / 1e9:g} GB shards ({shards} file{'s' if shards > 1 else ''}), "
        f"{gb(source_bytes(src))} GB in total"
    )


def rss_verdict(results: list[Result]) -> str:
    converters = [r for r in results if r.case.name.startswith("convert")]
    worst = max(converters, key=lambda r: r.peak_rss)
    met = worst.peak_rss <= RSS_TARGET_BYTES
    return (
        f"Converter peak RSS target <= {gb(RSS_TARGET_BYTES)} GB whatever the shard size: "
        f"{'met' if met else '**not met**'} (highest: {gb(worst.peak_rss)} GB, {worst.case.name})."
    )


def peer_note(results: list[Result]) -> str | None:
    """nf4: our converter against bitsandbytes' own quantizer, medians of the same run."""
    by_name = {r.case.name: r for r in results}
    ours, peer = by_name.get(f"convert --recipe {NF4_RECIPE}"), by_name.get(BNB_PEER)
    if not ours or not peer:
        return None
    return (
        f"nf4: `quantize convert --recipe {NF4_RECIPE}` takes {ours.median_s:.1f} s against {peer.median_s:.1f} s "
        f"for bitsandbytes' own quantizer on the same tensors ({peer.median_s / ours.median_s:.1f}x faster), "
        "with bit-identical quantized tensors (tests/formats/test_nf4.py), and also hashes, verifies its layout "
        "and measures the error of every tensor."
    )


def gguf_note(results: list[Result]) -> str | None:
    """gguf: our converter against gguf-py (Q8_0) and ggml on one thread (the K-quant mix), medians of the same run."""
    by_name = {r.case.name: r for r in results}
    lines = []
    for recipe, peer_name, who in (
        (GGUF_RECIPES[0], GGUF_PEER, "gguf-py's own quantizer and writer"),
        (GGUF_RECIPES[1], GGML_PEER, "ggml's own quantizer on one thread and gguf-py's writer"),
    ):
        ours, peer = by_name.get(f"convert --recipe {recipe}"), by_name.get(peer_name)
        if ours and peer:
            lines.append(
                f"`quantize convert --recipe {recipe}` takes {ours.median_s:.1f} s against {peer.median_s:.1f} s "
                f"for {who} on the same tensors ({peer.median_s / ours.median_s:.1f}x faster; peak RSS "
                f"{gb(ours.peak_rss)} vs {gb(peer.peak_rss)} GB)"
            )
    if not lines:
        return None
    return "gguf: " + "; ".join(lines) + ". The quantized blocks are identical (tests/formats/test_gguf.py)."


def ck_note(results: list[Result]) -> str | None:
    """ComfyUI NVFP4 / MXFP8 / ConvRot: our converter against comfy-kitchen's eager quantizer run whole, medians of
    the same run."""
    by_name = {r.case.name: r for r in results}
    lines = []
    for recipe in (*CK_RECIPES, NVFP4_ALL):
        ours, peer = by_name.get(f"convert --recipe {recipe}"), by_name.get(ck_peer_name(recipe))
        if ours and peer:
            speed = peer.median_s / ours.median_s
            lines.append(
                f"`{recipe}` {ours.median_s:.1f} s against {peer.median_s:.1f} s "
                f"({f'{speed:.2f}x faster' if speed >= 1 else f'{1 / speed:.2f}x slower'}; peak RSS "
                f"{gb(ours.peak_rss)} vs {gb(peer.peak_rss)} GB)"
            )
    if not lines:
        return None
    return (
        "ComfyUI NVFP4 / MXFP8 / ConvRot against comfy-kitchen's eager quantizer run whole on the same tensors "
        "(`TensorCoreNVFP4Layout.quantize(w.float())`, `TensorCoreMXFP8Layout.quantize(w.float())`, "
        "`quantize_int8_convrot_weight(w.float(), 256)`; this script's `--ck-peer` mode, one shard held at a "
        f"time): {'; '.join(lines)}. `{NVFP4_ALL}` is this script's: NVFP4 on every block Linear, no MXFP8 layer."
    )


def llmc_note(results: list[Result]) -> str | None:
    """fp8: our converter against llm-compressor's model_free_ptq, medians of the same run."""
    by_name = {r.case.name: r for r in results}
    peer = by_name.get(LLMC_PEER)
    ours = next((r for r in results if r.case.name.startswith("convert (default")), None)
    if not ours or not peer:
        return None
    return (
        f"fp8: `quantize convert --recipe {RECIPE}` takes {ours.median_s:.1f} s against {peer.median_s:.1f} s "
        f'for llm-compressor\'s `model_free_ptq(scheme="FP8_DYNAMIC")` on the same shards and the same Linears '
        f"({peer.median_s / ours.median_s:.1f}x faster; peak RSS {gb(ours.peak_rss)} vs {gb(peer.peak_rss)} GB)."
    )


def lora_note(results: list[Result]) -> str | None:
    """What merging a LoRA costs on top of the same conversion without it."""
    by_name = {r.case.name: r for r in results}
    ours, plain = by_name.get(LORA_CASE), results[1] if len(results) > 1 else None
    if not ours or not plain:
        return None
    lora = Path(ours.case.argv[-1])
    return (
        f"LoRA merge: `{RECIPE}` with `--lora` (a rank-{LORA_RANK} LoRA on every block Linear, "
        f"{gb(lora.stat().st_size)} GB) takes {ours.median_s:.1f} s against {plain.median_s:.1f} s without "
        f"(+{ours.median_s - plain.median_s:.1f} s, {ours.median_s / plain.median_s:.2f}x); peak RSS "
        f"{gb(ours.peak_rss)} vs {gb(plain.peak_rss)} GB: the LoRA is read per row chunk, never held whole."
    )


def startup_note(results: list[Result]) -> str | None:
    """How much of a converter run its own timer covers, the rest being start-up, planning and exit."""
    pairs = [(s.wall_s, s.reported_s) for r in results[1:] for s in r.samples if s.reported_s is not None]
    if not pairs:
        return None
    outside = statistics.median(w - rep for w, rep in pairs)
    return (
        f"The converter's own timer (its `wrote OUT: ... in N s` line) misses about {outside:.1f} s per run: "
        f"Python start-up, the command line's imports, recipe loading (its timer starts before torch is imported, "
        f"when the source starts being hashed; wall time minus reported, median)."
    )


def display_path(path: Path | str) -> str:
    text = str(path)
    return text.removeprefix(str(REPO) + "/") if text.startswith(str(REPO) + "/") else text


def display_command(argv: list[str]) -> str:
    return shlex.join(display_path(a) for a in argv)


def section_head(title: str, command: str, data_dir: Path) -> list[str]:
    """The opening lines of every benchmark section: title, when and how it was measured, the machine."""
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return [
        f"## {title}",
        "",
        f"Measured {when} with:",
        "",
        "```",
        command,
        "```",
        "",
        *(f"- {line}" for line in machine_lines(data_dir)),
    ]


def report(
    results: list[Result], src: Path, preset: str, data_dir: Path, command: str, lora_only: bool = False
) -> str:
    """The Markdown section, without its markers."""
    table = markdown_table(table_rows(results, source_bytes(src)))
    title = (
        "Convert with a LoRA merged: the cost of `--lora` against the same conversion without it"
        if lora_only
        else "Convert: every format vs. plain read-and-write (and the reference quantizers as peers)"
    )
    lines = [
        *section_head(title, command, data_dir),
        f"- Checkpoint: {checkpoint_line(src, preset)}",
        f"- Converter: `{display_command(results[1].case.argv)}`, plus the options in the case name",
        f"- Baseline: `{BASELINE}` (this script's `--read-and-write` mode): each shard opened with "
        '`safetensors.safe_open(framework="pt")`, every tensor read, written with '
        "`safetensors.torch.save_file` and fsynced, one shard held at a time",
        "",
        table,
        "",
        f"- {rss_verdict(results)}",
        "- Each run is a fresh process (wall time includes Python start-up and the torch import); peak RSS "
        "is its `ru_maxrss` from `os.wait4`. Ratio = median time / median time of read-and-write. GB/s = "
        "source bytes / median time. GB = 10^9 bytes.",
        "- Baseline and converter runs alternate (A B A C A D per round), the source is in the page cache "
        "(read once before the first run), both write to the same disk and fsync their output files; "
        "outputs are deleted between runs.",
    ]
    notes = (
        peer_note(results),
        gguf_note(results),
        ck_note(results),
        llmc_note(results),
        lora_note(results),
        startup_note(results),
    )
    for note in notes:
        if note:
            lines.append(f"- {note}")
    return "\n".join(lines)


def update_section(doc: Path, body: str, markers: tuple[str, str] = (START, END)) -> None:
    """Replace the text between the markers (or append a marked section), leaving the rest alone."""
    begin, finish = markers
    text = doc.read_text() if doc.exists() else DOC_HEADER
    block = f"{begin}\n{body.rstrip()}\n{finish}"
    start, end = text.find(begin), text.find(finish)
    if 0 <= start < end:
        text = text[:start] + block + text[end + len(finish) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


# --- entry point -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=["tiny", "small", "1.3b"], default="1.3b", help="checkpoint shape")
    p.add_argument("--runs", type=int, default=3, help="rounds of measurements (default: 3)")
    p.add_argument("--data-dir", type=Path, default=REPO / "bench-data", help="checkpoints and scratch")
    p.add_argument("--write", type=Path, metavar="MARKDOWN", help="store the results section in this file")
    p.add_argument("--read-and-write", nargs=2, type=Path, metavar=("SRC", "OUT"), help="internal: baseline")
    p.add_argument("--bnb-nf4", nargs=2, type=Path, metavar=("SRC", "OUT"), help="internal: the nf4 peer")
    p.add_argument("--gguf-peer", nargs=3, metavar=("RECIPE", "SRC", "OUT"), help="internal: the gguf peers")
    p.add_argument(
        "--ck-peer", nargs=3, metavar=("RECIPE", "SRC", "OUT"), help="internal: the comfy-kitchen peers"
    )
    p.add_argument(
        "--fp8-only", action="store_true", help="skip the torchao_fp8, nf4, comfy and bitsandbytes cases"
    )
    p.add_argument(
        "--lora-only",
        action="store_true",
        help="only wan-fp8 with and without --lora, stored in the bench:lora section",
    )
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.read_and_write:
        read_and_write(*args.read_and_write)
        return
    if args.bnb_nf4:
        bnb_nf4(*args.bnb_nf4)
        return
    if args.gguf_peer:
        recipe, src, out = args.gguf_peer
        gguf_peer(Path(src), Path(out), recipe)
        return
    if args.ck_peer:
        recipe, src, out = args.ck_peer
        ck_peer(Path(src), Path(out), recipe)
        return
    command = display_command([sys.executable, *sys.argv])
    data_dir = args.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    src = ensure_checkpoint(data_dir, args.preset)
    scratch = data_dir / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        warm_page_cache(src)
        lora = ensure_lora(data_dir, args.preset) if args.lora_only else None
        baseline, cases = make_cases(src, scratch, formats=not (args.fp8_only or args.lora_only), lora=lora)
        if args.lora_only:
            cases = [cases[0], cases[-1]]
        results = benchmark(baseline, cases, args.runs, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    body = report(results, src, args.preset, data_dir, command, lora_only=args.lora_only)
    print(markdown_table(table_rows(results, source_bytes(src))))
    print(rss_verdict(results))
    if args.write:
        markers = LORA_MARKERS if args.lora_only else (START, END)
        update_section(args.write, body, markers)
        log(f"wrote the {markers[0]} section of {args.write}")


if __name__ == "__main__":
    main()
