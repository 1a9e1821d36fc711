"""`make gpu-check`: on one CUDA GPU, every test skipped for lack of one, and the GPU figures, in at most 6 minutes.

`make gpu-check` runs::

    .venv/bin/python benchmarks/gpu_check.py --write docs/BENCHMARKS.md

Without a CUDA device it prints one line saying so, writes nothing and exits 0. With one it runs, each under its
own time guard (the `*_CAP_S` constants below), the whole within `TOTAL_BUDGET_S`:

1. ``python -m pytest -q -m gpu tests`` (the tests marked `gpu`), for its passed / failed counts;
2. host-to-device copies from pinned and pageable memory (a 1 GiB tensor, CUDA events): GB/s;
3. one forward step of a 14B-shaped diffusers `WanTransformer3DModel` whose block Linears are `FP8Linear`s,
   resident on the GPU and under `loaders.enable_block_offload` (pageable, then pinned host memory), and the same
   model with bf16 `nn.Linear`s in their place, resident (the baseline): the offloaded / resident ratio (target
   <= 1.1x), the fp8 / bf16 ratios, resident and pinned-offloaded (target <= 0.80x), and
   `torch.cuda.max_memory_allocated()` of each. Fewer than the 40 layers are built where the time or the memory
   left would not hold them (the bf16 model then has as many), and the section says so;
4. the raw GEMMs on ready operands at the same Linear shapes (the floor the modules chase): `torch._scaled_mm`
   float8 with row-wise and with tensor-wise scales, each with ``use_fast_accum`` False and True, and int8
   `torch._int_mm`, each against bf16 `F.linear`; an op the GPU refuses is a skip line with its error;
5. real checkpoints: a Wan source at 14B widths with 2 of its 40 blocks (`quantize.examples`), converted on this
   machine's CPU by the console script to fp8_channel and to comfy_int8, each loaded by `loaders.load_quantized`
   onto the GPU and run for one forward step: convert and load seconds, step time, `max_memory_allocated`;
6. each quantized Linear of `loaders` (its `from_weight`, encoded on the CPU, then moved to the GPU) against
   bf16 `F.linear` at Wan2.1-14B's shapes (8192 tokens, bf16 input), with whether its fast kernel ran
   (`uses_fast_path`) and the output's SQNR against the bf16 product.

Steps 2 to 6 each run in a child process of this script (``--step``), so a crash, a hung kernel or a poisoned
CUDA context ends that step alone, and its time guard is a real one (the child is killed, with what it started);
a step whose library or kernel is missing is skipped with one line saying why. Times are medians of CUDA-event
timings after warm-up. The ``--write`` file's section between ``<!-- bench:gpu:start -->`` and
``<!-- bench:gpu:end -->`` is replaced; one summary line is printed last. Exit 1 if a GPU test failed (or their
run did not finish), else 0.

Without a GPU, ``--device cpu`` is a dry run of the whole flow on the CPU, its steps at toy sizes (``--step NAME
--device cpu --tiny`` runs one of them): the structure and the report, not figures.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # `loaders`, `quantize` without an install
from bench_convert import (  # noqa: E402
    REPO,
    display_command,
    display_path,
    markdown_table,
    quantize_command,
    section_head,
    update_section,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

START, END = "<!-- bench:gpu:start -->", "<!-- bench:gpu:end -->"
TOTAL_BUDGET_S = 360.0  # 6 minutes, everything included
FINISH_RESERVE_S = 10.0  # kept back for the report and as margin
#: each step's time guard in seconds, sized for one H200 with 16 cores (DEVELOPERS.md has what each takes): a step
#: gets min(its guard, the time left of TOTAL_BUDGET_S), and is skipped, not started, with less than MIN_STEP_S
TEST_TIMEOUT_S = 150.0
H2D_CAP_S = 20.0
OFFLOAD_CAP_S = 100.0  # the fp8 model built, resident, pageable, pinned; then its bf16 twin, resident
RAW_CAP_S = 30.0
CKPT_CAP_S = 80.0  # the source written, two conversions on the CPU, two loads and forward steps
LINEAR_CAP_S = 30.0  # each scheme, three weights encoded on the CPU included
Q4_K_CAP_S = 50.0  # ggml encodes Q4_K on one core: about 10 s for each of the two 13824 x 5120 weights
MIN_STEP_S = 15.0
#: the CPU dry run's total and guards are this many times the GPU's: 2 cores convert, import and start processes
#: slower than 16, and it checks the flow, not the times
DRY_RUN_SLACK = 2.0
#: the test files that hold gpu-marked tests, found by their marker: a module elsewhere that cannot import a package
#: this machine lacks must not stop the GPU tests from being collected
GPU_TEST_FILES = sorted(
    str(f.relative_to(REPO)) for f in (REPO / "tests").rglob("test_*.py") if "mark.gpu" in f.read_text()
)
TEST_ARGV = ["-m", "pytest", "-q", "-m", "gpu", *GPU_TEST_FILES]
RECORD = "@gpu-check "  # the prefix of the lines a step prints for the parent
TARGET_RATIO = 1.1  # offloaded step time / resident step time
TARGET_VS_BF16 = 0.80  # fp8 step time (resident, and offloaded from pinned memory) / the bf16 resident step's
LINEAR_WARMUP, LINEAR_RUNS = 3, 10
STEP_RUNS = 3  # forward steps timed per model configuration, after one warm-up step
#: a generous guess at measuring one layer: its moves, pinning, 3 x 4 fp8 steps, its bf16 twin made and 4 steps
OFFLOAD_S_PER_LAYER = 1.0
GPU_HEADROOM = 8 << 30  # bytes of GPU memory kept free for activations when choosing the layers
HOST_HEADROOM = 8 << 30
HOST_COPIES = 2.5  # host bytes per block byte while pinning: the block, its pinned copy, slack
K_QUANTS = ("Q6_K", "Q5_K", "Q4_K")

WAN_14B: dict[str, Any] = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=40,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=13824,
    num_layers=40,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=None,
    added_kv_proj_dim=None,
    rope_max_seq_len=1024,
)
WAN_TOY: dict[str, Any] = {
    **WAN_14B,
    **dict(num_attention_heads=2, attention_head_dim=32, text_dim=64, freq_dim=64, ffn_dim=128, num_layers=4),
}


@dataclass(frozen=True)
class Sizes:
    """What the steps measure on: the real ones, or toy ones that check the structure on a CPU in seconds."""

    name: str
    wan: dict[str, Any]
    linear_shapes: tuple[tuple[int, int], ...]  # [out, in]
    tokens: int  # rows of the Linears' input
    latent: tuple[int, int, int]  # frames, height, width: F * H/2 * W/2 tokens in the model
    text_tokens: int
    copy_bytes: int
    min_layers: int  # the model is built with at least these (or all it has)
    ckpt_preset: str  # the `quantize example` preset of Wan whose widths the real-checkpoint source has
    ckpt_layers: int  # and its blocks: the first few, so that writing and converting it takes seconds


FULL = Sizes(
    name="Wan2.1-14B",
    wan=WAN_14B,
    linear_shapes=((5120, 5120), (13824, 5120), (5120, 13824)),  # attention projections, FFN up, FFN down
    tokens=8192,
    latent=(5, 60, 104),  # 7800 tokens: 5 of the 21 latent frames of an 832x480 video
    text_tokens=512,
    copy_bytes=1 << 30,
    min_layers=8,
    ckpt_preset="14b",
    ckpt_layers=2,
)
TINY = Sizes("toy", WAN_TOY, ((256, 256), (512, 256), (256, 512)), 64, (2, 8, 8), 8, 1 << 24, 2, "small", 2)


@dataclass(frozen=True)
class Scheme:
    """One quantized Linear to time, as its row and the skipped list name it."""

    label: str
    cls_name: str  # in `loaders`; "" for the bf16 baseline
    kernel: str
    gguf_type: str | None = None
    has_fast_kernel: bool = True  # False: nothing to miss (gguf decodes, then multiplies)
    #: the compute capability its kernel needs (Blackwell's block-scaled GEMMs), below which it decodes by design
    min_capability: tuple[int, int] | None = None
    cap_s: float = LINEAR_CAP_S  # its step's time guard
    #: the int8 modules' GEMM on CUDA (`loaders.modules.INT8_GEMM`): "int_mm" (cuBLASLt, then the fused epilogue)
    #: or "triton" (`loaders.fused.int8_mm`, the epilogue inside the GEMM); None: the module's default
    int8_gemm: str | None = None
    comfy_layout: str | None = None  # a ComfyOptions layout other than the format's default (ConvRot)


BASELINE = Scheme("bf16 F.linear", "", "cuBLAS bf16 GEMM", has_fast_kernel=False)
BLACKWELL = (10, 0)
#: the module rows in the order they run: what the targets name first, the variants and decoded ones after, so that
#: a run short of time loses those
SCHEMES = (
    Scheme("FP8Linear", "FP8Linear", "fp8 `_scaled_mm`, row-wise scales"),
    Scheme("ComfyFP8Linear", "ComfyFP8Linear", "fp8 `_scaled_mm`, per-tensor scale"),
    Scheme(  # its guard includes Triton's autotuning (4 tiles compiled per shape)
        "Int8Linear",
        "Int8Linear",
        "int8 `fused.int8_mm` (epilogue fused), W8A8",
        int8_gemm="triton",
        cap_s=60.0,
    ),
    Scheme(
        "TorchaoInt8Linear",
        "TorchaoInt8Linear",
        "int8 `fused.int8_mm` (epilogue fused), torchao's W8A8",
        int8_gemm="triton",
        cap_s=60.0,
    ),
    Scheme("GGUFLinear Q8_0", "GGUFLinear", "fused decode + matmul", "Q8_0", has_fast_kernel=False),
    Scheme("Float8Linear", "Float8Linear", "torchao `Float8Tensor`"),
    Scheme("NF4Linear", "NF4Linear", "bitsandbytes `matmul_4bit`"),
    Scheme(
        "Int8Linear, `_int_mm`", "Int8Linear", "int8 `torch._int_mm` + fused epilogue", int8_gemm="int_mm"
    ),
    Scheme("Int8Linear ConvRot", "Int8Linear", "Hadamard rotation + int8 W8A8", comfy_layout="int8_convrot"),
    Scheme("NVFP4Linear", "NVFP4Linear", "NVFP4 block-scaled `_scaled_mm`", min_capability=BLACKWELL),
    Scheme("MXFP8Linear", "MXFP8Linear", "MXFP8 block-scaled `_scaled_mm`", min_capability=BLACKWELL),
    Scheme(
        "GGUFLinear Q4_K", "GGUFLinear", "decode + matmul", "Q4_K", has_fast_kernel=False, cap_s=Q4_K_CAP_S
    ),
)

Factory = Callable[["torch.Tensor", "torch.Tensor"], "nn.Module"]


# --- what a step reports: one JSON record a line ----------------------------------------------


def emit(kind: str, **fields: Any) -> None:
    print(RECORD + json.dumps({"kind": kind, **fields}), flush=True)


def emit_row(table: str, **row: Any) -> None:
    emit("row", table=table, row=row)


def emit_note(table: str, text: str) -> None:
    emit("note", table=table, text=text)


def emit_skip(what: str, why: str) -> None:
    emit("skip", what=what, why=why)


def reason(exc: BaseException) -> str:
    """An exception as one short line."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# --- timing -------------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], device: str, warmup: int, runs: int) -> list[float]:
    """Milliseconds of each of `runs` calls after `warmup` untimed ones: CUDA events on the GPU, else a clock."""
    import torch

    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def spread(times: list[float]) -> dict[str, float]:
    return {"ms": statistics.median(times), "lo": min(times), "hi": max(times), "runs": len(times)}


def release(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> int | None:
    import torch

    return torch.cuda.max_memory_allocated() if device == "cuda" else None


# --- step: host-to-device copies ----------------------------------------------------------------


def pinned_as_loaders_pins(n: int, keep: list[object]) -> torch.Tensor:
    """A host buffer page-locked the way `loaders` pins blocks: exactly sized, `cudaHostRegister`."""
    import torch
    from torch import nn

    from loaders.host import host_buffer

    owner = nn.Module()  # holds the registration, which ends when the owner goes: kept in `keep`
    keep.append(owner)
    (buf,) = host_buffer([(torch.uint8, (n,))], True, owner)
    return buf


def step_h2d(sizes: Sizes, device: str) -> None:
    if device != "cuda":
        emit_skip("host-to-device copies", "they need CUDA")
        return
    import torch

    n = sizes.copy_bytes
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    keep: list[object] = []
    sources: list[tuple[str, Callable[[], torch.Tensor]]] = [
        ("pinned (torch `pin_memory=True`)", lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True)),
        ("pinned (`cudaHostRegister`, as loaders pins)", lambda: pinned_as_loaders_pins(n, keep)),
        ("pageable", lambda: torch.empty(n, dtype=torch.uint8)),
    ]
    for label, make in sources:
        try:
            src = make().fill_(1)
            times = time_ms(lambda src=src: dst.copy_(src, non_blocking=True), "cuda", warmup=1, runs=5)
        except Exception as exc:
            emit_skip(f"H2D from {label}", reason(exc))
            continue
        rates = sorted(n / 1e9 / (t / 1e3) for t in times)
        emit_row(
            "h2d",
            memory=label,
            gbps=statistics.median(rates),
            lo=rates[0],
            hi=rates[-1],
            runs=len(rates),
            bytes=n,
        )
        del src
        keep.clear()
        gc.collect()


# --- step: one quantized Linear against bf16 ----------------------------------------------------


def scheme_named(label: str) -> Scheme:
    for scheme in (BASELINE, *SCHEMES):
        if scheme.label == label:
            return scheme
    raise SystemExit(f"no scheme {label!r}")


def bnb_cuda_problem() -> str | None:
    """Why bitsandbytes cannot multiply on this GPU, or None (the loader's own check)."""
    try:
        from loaders import bnb
    except Exception as exc:
        return f"loaders does not import: {reason(exc)}"
    return bnb.cuda_problem()


def linear_factory(scheme: Scheme, device: str) -> tuple[Factory | None, str | None]:
    """(weight, bias) -> the scheme's module on the CPU, via `from_weight`; or None and why it cannot be built."""
    try:
        import loaders
    except Exception as exc:
        return None, f"loaders does not import: {reason(exc)}"
    cls = getattr(loaders, scheme.cls_name, None)
    if cls is None:
        return None, f"loaders has no {scheme.cls_name} (yet)"
    if not callable(getattr(cls, "from_weight", None)):
        return None, f"loaders.{scheme.cls_name} has no from_weight (yet)"
    if scheme.gguf_type in K_QUANTS and importlib.util.find_spec("ggml") is None:
        return None, "ggml-python is not installed (ggml encodes the K-quants: the `gguf` extra)"
    if scheme.cls_name == "NF4Linear" and device == "cuda":
        problem = bnb_cuda_problem()
        if problem:
            return None, problem
    if scheme.int8_gemm is not None:  # each step runs in its own process: the setting is this row's alone
        loaders.modules.INT8_GEMM = scheme.int8_gemm
    if scheme.comfy_layout is not None:
        from quantize.formats.options import ComfyOptions

        layout = ComfyOptions(scheme.comfy_layout)
        return (lambda w, b: cls.from_weight(w, b, options=layout)), None
    if scheme.gguf_type is not None:
        from quantize.formats.options import GgufOptions

        options = GgufOptions(scheme.gguf_type)
        return (lambda w, b: cls.from_weight(w, b, options=options)), None
    return (lambda w, b: cls.from_weight(w, b)), None


def random_linear(out_f: int, in_f: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 weight [out, in] and bias on the CPU, scaled as a trained Linear's roughly are."""
    import torch

    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(out_f, in_f, generator=g) * in_f**-0.5).to(torch.bfloat16)
    return weight, (torch.randn(out_f, generator=g) * 0.02).to(torch.bfloat16)


def probe_problem(factory: Factory, device: str) -> str | None:
    """Why the module cannot compute on `device` at all (a small Linear, built and called), or None."""
    import torch

    try:
        w, b = random_linear(256, 256)
        with torch.no_grad():
            y = factory(w, b).to(device)(torch.randn(32, 256, device=device, dtype=torch.bfloat16))
        synchronize(device)
    except Exception as exc:
        return reason(exc)
    return (
        None
        if tuple(y.shape) == (32, 256)
        else f"a [256, 256] Linear gave output {list(y.shape)} for [32, 256]"
    )


def uses_fast_path(module: nn.Module, x: torch.Tensor) -> bool | None:
    check = getattr(module, "uses_fast_path", None)
    return bool(check(x)) if callable(check) else None


def sqnr_db(want: torch.Tensor, got: torch.Tensor) -> float:
    import math

    want, got = want.float(), got.float()
    noise = float((got - want).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(want.pow(2).sum()) / noise)


def capability(device: str) -> tuple[int, int] | None:
    """The GPU's compute capability; None on the CPU."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if device == "cuda" else None


def lacks_capability(scheme: Scheme, device: str) -> str | None:
    """Where the device is below what the scheme's kernel needs (so it decodes by design): the device's words."""
    if scheme.min_capability is None:
        return None
    have = capability(device)
    if have is not None and have >= scheme.min_capability:
        return None
    need = "SM{}{}+".format(*scheme.min_capability)
    return f"needs {need}, this is {'the CPU' if have is None else 'SM{}{}'.format(*have)}"


def time_linear(
    scheme: Scheme, factory: Factory | None, shape: tuple[int, int], sizes: Sizes, device: str
) -> bool:
    """One row: the scheme's forward at this weight shape (the bf16 product where `factory` is None). True where
    it decoded because the device is below the capability its kernel needs."""
    import torch
    import torch.nn.functional as F

    out_f, in_f = shape
    tokens = sizes.tokens
    weight, bias = random_linear(out_f, in_f)
    x = torch.randn(tokens, in_f, device=device, dtype=torch.bfloat16)
    row: dict[str, Any] = {
        "scheme": scheme.label,
        "kernel": scheme.kernel,
        "shape": [out_f, in_f],
        "tokens": tokens,
        "sizes": sizes.name,
        "has_fast_kernel": scheme.has_fast_kernel,
    }
    lacks = lacks_capability(scheme, device)
    if lacks:
        row["lacks"] = lacks
    with torch.no_grad():
        w_dev, b_dev = weight.to(device), bias.to(device)
        want = F.linear(x, w_dev, b_dev)
        if factory is None:
            times = time_ms(lambda: F.linear(x, w_dev, b_dev), device, LINEAR_WARMUP, LINEAR_RUNS)
        else:
            del w_dev, b_dev
            t0 = time.perf_counter()
            module = factory(weight, bias)
            row["encode_s"] = time.perf_counter() - t0
            module = module.to(device)
            row["fast"] = uses_fast_path(module, x)
            row["sqnr_db"] = sqnr_db(want, module(x))
            del want
            times = time_ms(lambda: module(x), device, LINEAR_WARMUP, LINEAR_RUNS)
    row.update(spread(times))
    row["tflops"] = 2 * tokens * out_f * in_f / (row["ms"] / 1e3) / 1e12
    emit_row("linear", **row)
    if scheme.has_fast_kernel and row.get("fast") is False:
        if lacks:  # one line for the scheme (`step_linear`): it decodes by design on this device
            return True
        emit_skip(
            f"{scheme.label} fast kernel {[out_f, in_f]}",
            "uses_fast_path() is False here: its fallback was timed",
        )
    return False


def step_linear(scheme: Scheme, sizes: Sizes, device: str) -> None:
    factory: Factory | None = None
    if scheme is not BASELINE:
        factory, problem = linear_factory(scheme, device)
        if factory is not None:
            problem = probe_problem(factory, device)
        if problem:
            emit_skip(scheme.label, problem)
            return
    decoded = False
    for shape in sizes.linear_shapes:
        try:
            decoded |= time_linear(scheme, factory, shape, sizes, device)
        except Exception as exc:
            emit_skip(f"{scheme.label} {list(shape)}", reason(exc))
        release(device)
    if decoded:  # one line for the scheme: as on every GPU before Blackwell, its rows timed the decoding
        emit_skip(
            f"{scheme.label} fast kernel", f"it {lacks_capability(scheme, device)}: its decoding was timed"
        )


# --- step: the raw GEMMs on ready operands --------------------------------------------------------


@dataclass(frozen=True)
class RawOp:
    """One GEMM on operands already in its dtypes (nothing quantized in the timed call): the floor of a module."""

    op: str
    operands: str
    fast_accum: bool | None = None  # `_scaled_mm`'s use_fast_accum; None: the op has no such choice
    module: str | None = None  # the linear table's scheme that calls this op (its row's time / this one's)


RAW_BASELINE = RawOp("`F.linear`", "bf16 x bf16, no bias")
RAW_OPS = (
    RAW_BASELINE,
    RawOp("`torch._scaled_mm`", "float8_e4m3fn, row-wise float32 scales", False),
    RawOp("`torch._scaled_mm`", "float8_e4m3fn, row-wise float32 scales", True, "FP8Linear"),
    RawOp("`torch._scaled_mm`", "float8_e4m3fn, tensor-wise float32 scales", False),
    RawOp("`torch._scaled_mm`", "float8_e4m3fn, tensor-wise float32 scales", True, "ComfyFP8Linear"),
    RawOp("`torch._int_mm`", "int8 x int8, int32 out", None, "Int8Linear, `_int_mm`"),
)


def raw_label(op: RawOp) -> str:
    scales = (
        " row-wise" if "row-wise" in op.operands else " tensor-wise" if "tensor-wise" in op.operands else ""
    )
    accum = "" if op.fast_accum is None else f" use_fast_accum={op.fast_accum}"
    return f"raw {op.op.strip('`')}{scales}{accum}"


def raw_calls(shape: tuple[int, int], tokens: int, device: str) -> dict[RawOp, Callable[[], object]]:
    """Each op's call on ready operands for x [tokens, in] times a weight [out, in] (contiguous, passed as .t(),
    as the modules pass theirs): bf16, float8 (unit scales: values do not change a GEMM's time), int8."""
    import torch
    import torch.nn.functional as F

    out_f, in_f = shape
    torch.manual_seed(0)  # made on the device: the CPU's generator would take seconds at these sizes
    x = torch.randn(tokens, in_f, dtype=torch.bfloat16, device=device)
    w = torch.randn(out_f, in_f, dtype=torch.bfloat16, device=device)
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    row_a = torch.ones(tokens, 1, dtype=torch.float32, device=device)
    row_b = torch.ones(1, out_f, dtype=torch.float32, device=device)
    one = torch.ones((), dtype=torch.float32, device=device)
    xi = torch.randint(-127, 128, (tokens, in_f), dtype=torch.int8, device=device)
    wi = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8, device=device)

    def scaled(a_scale: torch.Tensor, b_scale: torch.Tensor, fast: bool) -> Callable[[], object]:
        return lambda: torch._scaled_mm(
            x8, w8.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16, use_fast_accum=fast
        )

    calls: dict[RawOp, Callable[[], object]] = {}
    for op in RAW_OPS:
        if op is RAW_BASELINE:
            calls[op] = lambda: F.linear(x, w)
        elif "int8" in op.operands:
            calls[op] = lambda: torch._int_mm(xi, wi.t())
        elif "row-wise" in op.operands:
            calls[op] = scaled(row_a, row_b, bool(op.fast_accum))
        else:
            calls[op] = scaled(one, one, bool(op.fast_accum))
    return calls


def step_raw(sizes: Sizes, device: str) -> None:
    tokens = sizes.tokens
    refused: dict[tuple[RawOp, str], list[list[int]]] = {}  # (op, why) -> the shapes where it raised
    for shape in sizes.linear_shapes:
        try:
            calls = raw_calls(shape, tokens, device)
        except Exception as exc:
            emit_skip(f"raw GEMMs {list(shape)}", f"making the operands: {reason(exc)}")
            continue
        for op, call in calls.items():
            try:
                call()  # a first call: where the op raises on this GPU, it does here
                synchronize(device)
                times = time_ms(call, device, LINEAR_WARMUP, LINEAR_RUNS)
            except Exception as exc:
                refused.setdefault((op, reason(exc)), []).append(list(shape))
                continue
            row = {"op": op.op, "operands": op.operands, "fast_accum": op.fast_accum, "module": op.module}
            row.update(shape=list(shape), tokens=tokens, sizes=sizes.name, **spread(times))
            row["tflops"] = 2 * tokens * shape[0] * shape[1] / (row["ms"] / 1e3) / 1e12
            emit_row("raw", **row)
        del calls
        release(device)
    for (op, why), shapes in refused.items():
        emit_skip(f"{raw_label(op)} {', '.join(map(str, shapes))}", why)


# --- step: block offload against the resident model ---------------------------------------------


def tensor_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def linear_shapes_in(block: nn.Module) -> dict[tuple[int, int, bool], int]:
    """(out, in, has bias) -> how many `nn.Linear`s of that shape `block` has."""
    from torch import nn

    counts: dict[tuple[int, int, bool], int] = {}
    for m in block.modules():
        if isinstance(m, nn.Linear):
            key = (m.out_features, m.in_features, m.bias is not None)
            counts[key] = counts.get(key, 0) + 1
    return counts


def fp8_templates(fp8: Any, shapes: list[tuple[int, int, bool]]) -> dict[tuple[int, int, bool], nn.Module]:
    """One `FP8Linear.from_weight` per Linear shape of a block, from random bf16 weights, on the CPU."""
    templates = {}
    for seed, (out_f, in_f, has_bias) in enumerate(shapes):
        weight, bias = random_linear(out_f, in_f, seed)
        templates[(out_f, in_f, has_bias)] = fp8.from_weight(weight, bias if has_bias else None)
    return templates


def fill(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A real tensor for a meta one: norm weights 1, the rest small random values."""
    import torch

    if not dtype.is_floating_point:
        return torch.zeros(shape, dtype=dtype)
    if name == "weight" and len(shape) == 1:
        return torch.ones(shape, dtype=dtype)
    return (torch.randn(shape) * 0.02).to(dtype)


def quantize_block(block: nn.Module, templates: dict[tuple[int, int, bool], nn.Module]) -> None:
    """Each `nn.Linear` of a meta `block` becomes a copy of its shape's FP8Linear; the rest is made real, bf16."""
    import torch
    from torch import nn

    for parent in list(block.modules()):
        for local, child in list(parent._modules.items()):
            if isinstance(child, nn.Linear):
                key = (child.out_features, child.in_features, child.bias is not None)
                parent._modules[local] = copy.deepcopy(templates[key])
    for m in block.modules():
        for name, p in list(m._parameters.items()):
            if p is not None and p.is_meta:
                m._parameters[name] = nn.Parameter(
                    fill(name, tuple(p.shape), torch.bfloat16), requires_grad=False
                )
        for name, buf in list(m._buffers.items()):
            if buf is not None and buf.is_meta:
                m._buffers[name] = fill(name, tuple(buf.shape), buf.dtype)


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def layers_that_fit(block_bytes: int, device: str) -> tuple[int, str]:
    """How many blocks the GPU (resident) and the host (blocks and their pinned copies) hold, and which limits."""
    import torch

    fits = [(int((mem_available() - HOST_HEADROOM) // (HOST_COPIES * block_bytes)), "host memory")]
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        fits.append((int((free - GPU_HEADROOM) // block_bytes), "GPU memory"))
    return min(fits)


def build_model(
    sizes: Sizes, fp8: Any, device: str, budget_s: float, started: float
) -> tuple[nn.Module, str, list[tuple[int, int, bool]]]:
    """The Wan model with fp8 block Linears on the CPU, with as many of its layers as time and memory allow,
    a sentence saying how it was built, and its block Linears' shapes (out, in, has bias) in their seeds' order."""
    import torch
    from diffusers import WanTransformer3DModel
    from torch import nn

    total = sizes.wan["num_layers"]
    model = WanTransformer3DModel(**{**sizes.wan, "num_layers": 0}).to(torch.bfloat16).eval()
    model.rope.float()  # as diffusers keeps it when loading (`_keep_in_fp32_modules`)
    with torch.device("meta"):
        shell = WanTransformer3DModel(**sizes.wan)
    counts = linear_shapes_in(shell.blocks[0])
    t0 = time.perf_counter()
    templates = fp8_templates(fp8, list(counts))
    encode_s = time.perf_counter() - t0
    block_bytes = sum(tensor_bytes(templates[key]) * n for key, n in counts.items())
    fit, limited_by = layers_that_fit(block_bytes, device)
    target = max(1, min(total, fit))
    why = f"{limited_by} holds {fit}" if target < total else ""
    floor = min(sizes.min_layers, target)
    build_t0 = time.monotonic()
    blocks = []
    for i in range(target):
        if i == floor and target > floor:
            per_block = (time.monotonic() - build_t0) / floor
            projected = time.monotonic() - started + (target - i) * per_block + target * OFFLOAD_S_PER_LAYER
            if projected > 0.8 * budget_s:
                why = f"{target} would need about {projected:.0f} s of the {budget_s:.0f} s this step has"
                break
        quantize_block(shell.blocks[i], templates)
        blocks.append(shell.blocks[i])
    model.blocks = nn.ModuleList(blocks)
    layers = (
        f"all {total} layers" if len(blocks) == total else f"**{len(blocks)} of its {total} layers** ({why})"
    )
    how = (
        f"{layers}; each block Linear a copy of one `FP8Linear.from_weight` encoding of a random bf16 weight per "
        f"shape ({encode_s:.1f} s on the CPU for {len(templates)}; a step's time does not depend on the values), "
        f"{block_bytes / 1e9:.2f} GB a block"
    )
    return model, how, list(counts)


def wan_inputs(
    sizes: Sizes, device: str, in_channels: int | None = None, text_dim: int | None = None
) -> dict[str, Any]:
    """One step's inputs: the latent and text of `sizes`, with its model's channels unless given."""
    import torch

    g = torch.Generator().manual_seed(0)
    frames, height, width = sizes.latent
    in_channels = in_channels or sizes.wan["in_channels"]
    latent = torch.randn(1, in_channels, frames, height, width, generator=g)
    text = torch.randn(1, sizes.text_tokens, text_dim or sizes.wan["text_dim"], generator=g)
    return dict(
        hidden_states=latent.to(torch.bfloat16).to(device),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=text.to(torch.bfloat16).to(device),
        return_dict=False,
    )


def time_steps(
    model: nn.Module, inputs: dict[str, Any], device: str, offloader: Any = None
) -> dict[str, Any]:
    """One warm-up forward step, then `STEP_RUNS` timed ones: their times, the peak GPU memory over them and,
    offloaded, the bytes copied to the device per timed step."""
    import torch

    with torch.no_grad():
        model(**inputs)
        synchronize(device)
        reset_peak(device)
        copied = offloader.stats.bytes_copied if offloader is not None else 0
        times = time_ms(lambda: model(**inputs), device, warmup=0, runs=STEP_RUNS)
    row = {**spread(times), "peak_bytes": peak_bytes(device)}
    if offloader is not None:
        row["copied"] = (offloader.stats.bytes_copied - copied) / STEP_RUNS
    return row


def measure_resident(model: nn.Module, inputs: dict[str, Any], device: str) -> None:
    try:
        model.to(device)
        emit_row(
            "offload",
            case="fp8, resident on the GPU",
            linears="fp8",
            placement="resident",
            **time_steps(model, inputs, device),
        )
    except Exception as exc:
        emit_skip("block offload: the resident model", reason(exc))
    finally:
        model.to("cpu")
        release(device)


def bf16_linear(shape: tuple[int, int, bool], seed: int, device: str) -> nn.Module:
    """A bf16 `nn.Linear` on `device` holding `random_linear`'s weight (and bias) for `seed`: the weight the fp8
    template of that seed encodes."""
    import torch
    from torch import nn

    out_f, in_f, has_bias = shape
    weight, bias = random_linear(out_f, in_f, seed)
    with torch.device("meta"):
        linear = nn.Linear(in_f, out_f, bias=has_bias)
    linear.weight = nn.Parameter(weight.to(device), requires_grad=False)
    if has_bias:
        linear.bias = nn.Parameter(bias.to(device), requires_grad=False)
    return linear


def measure_bf16_resident(
    model: nn.Module, inputs: dict[str, Any], device: str, shapes: list[tuple[int, int, bool]]
) -> None:
    """The baseline: the same model (its layers, its other tensors) with each block's quantized Linear replaced
    by a bf16 `nn.Linear` of its shape (a copy, made on the device, of one per shape), resident on the GPU. The
    quantized Linears are put back after, on the host where they were."""
    import torch

    from loaders import QuantizedLinear

    what = "the bf16 resident step"
    swaps = [
        (parent, name, child)
        for parent in model.blocks.modules()
        for name, child in parent._modules.items()
        if isinstance(child, QuantizedLinear)
    ]
    key = lambda m: (m.out_features, m.in_features, m.bias is not None)  # noqa: E731
    need = sum((o * i + (o if b else 0)) * 2 for o, i, b in (key(m) for _, _, m in swaps))
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        if need + GPU_HEADROOM > free:
            emit_skip(
                what,
                f"its {len(model.blocks)} layers' bf16 Linears need {need / 2**30:.1f} GiB, "
                f"{free / 2**30:.1f} GiB of the GPU is free",
            )
            return
    try:
        templates = {shape: bf16_linear(shape, seed, device) for seed, shape in enumerate(shapes)}
        for parent, name, child in swaps:
            parent._modules[name] = copy.deepcopy(templates[key(child)])
        del templates
        model.to(device)
        emit_row(
            "offload",
            case="bf16 `nn.Linear`s, resident on the GPU",
            linears="bf16",
            placement="resident",
            linear_bytes=need,
            **time_steps(model, inputs, device),
        )
    except Exception as exc:
        emit_skip(what, reason(exc))
    finally:
        for parent, name, child in swaps:
            parent._modules[name] = child
        model.to("cpu")
        release(device)


def measure_offloaded(model: nn.Module, inputs: dict[str, Any], device: str, host: str) -> None:
    what = f"block offload from {host} memory"
    if host == "pinned" and device != "cuda":
        emit_skip(what, "pinned memory needs CUDA")
        return
    from loaders import enable_block_offload

    try:
        offloader = enable_block_offload(model, device=device, host=host)
    except Exception as exc:
        emit_skip(what, reason(exc))
        return
    try:
        emit_row(
            "offload",
            case=f"fp8, `enable_block_offload(host={host!r})`",
            linears="fp8",
            placement=host,
            **time_steps(model, inputs, device, offloader),
        )
    except Exception as exc:
        emit_skip(what, reason(exc))
    finally:
        offloader.remove()
        del offloader
        release(device)


def step_offload(sizes: Sizes, device: str, budget_s: float) -> None:
    started = time.monotonic()
    import torch

    try:
        import diffusers  # noqa: F401

        from loaders import FP8Linear

        if not callable(getattr(FP8Linear, "from_weight", None)):
            emit_skip("block offload", "loaders.FP8Linear has no from_weight (yet)")
            return
        model, how, shapes = build_model(sizes, FP8Linear, device, budget_s, started)
    except Exception as exc:
        emit_skip("block offload", f"building the model: {reason(exc)}")
        return
    frames, height, width = sizes.latent
    tokens = frames * (height // 2) * (width // 2)
    probe = torch.empty(
        16, sizes.wan["num_attention_heads"] * sizes.wan["attention_head_dim"], dtype=torch.bfloat16
    )
    first = next(m for m in model.blocks.modules() if isinstance(m, FP8Linear))
    fast = uses_fast_path(first, probe.to(device))
    emit_note(
        "offload",
        f"Model: diffusers `WanTransformer3DModel`, {sizes.name} config, {how}. Input: latent "
        f"[1, {sizes.wan['in_channels']}, {frames}, {height}, {width}] ({tokens} tokens), text "
        f"[1, {sizes.text_tokens}, {sizes.wan['text_dim']}], bf16; FP8Linear fast path: "
        f"{'n/a' if fast is None else 'yes' if fast else 'no'}.",
    )
    inputs = wan_inputs(sizes, device)
    measure_resident(model, inputs, device)
    measure_bf16_resident(model, inputs, device, shapes)
    for host in ("pageable", "pinned"):  # pageable first: pinning re-homes the blocks for good
        measure_offloaded(model, inputs, device, host)


# --- step: real checkpoints, converted here, loaded by loaders, one forward step -----------------------

#: (the format as the table names it, the `quantize convert` options that write it from the original Wan layout,
#: the bundled recipe those pick)
CKPT_FORMATS = (
    ("fp8_channel", ["--format", "fp8_channel"], "wan-fp8.yaml"),
    ("comfy_int8", ["--recipe", "wan-comfy-int8.yaml"], "wan-comfy-int8.yaml"),
)


def ckpt_conversions() -> list[tuple[str, list[str]]]:
    """(format, `quantize convert` options) of each real checkpoint (`CKPT_FORMATS`): bundled recipes are derived
    or read from the checkout's `recipes/` where the package is not installed (`quantize.recipes.curated_recipes`),
    so their names serve on the device machine too."""
    return [(fmt, options) for fmt, options, _ in CKPT_FORMATS]


#: the modules `quantize convert` imports that torch and diffusers do not bring (pyproject's dependencies)
CONVERTER_NEEDS = ("pydantic", "pydantic_core", "annotated_types", "yaml", "click", "rich", "huggingface_hub")


def write_ckpt_source(sizes: Sizes, dest: Path) -> tuple[Any, int]:
    """The example writer's Wan (original names, random bf16, 1 GB shards) at the widths of `sizes.ckpt_preset`
    with its first `sizes.ckpt_layers` blocks (config.json saying so): (its WanShape, bytes written)."""
    import dataclasses

    from quantize.examples import write_random_checkpoint
    from quantize.models.examples import examples_of
    from quantize.models.examples.wan import wan_config, wan_tensors

    shape = dataclasses.replace(examples_of("wan").presets[sizes.ckpt_preset], num_layers=sizes.ckpt_layers)
    files = write_random_checkpoint(dest, wan_tensors(shape), config=wan_config(shape))
    return shape, sum(f.stat().st_size for f in files)


def convert_command(src: Path, out: Path, options: list[str]) -> list[str]:
    return [*quantize_command(), "convert", str(src), str(out), *options]


def first_quantized(model: nn.Module) -> nn.Module | None:
    from loaders import QuantizedLinear

    return next((m for m in model.modules() if isinstance(m, QuantizedLinear)), None)


def measure_ckpt(model_cls: type, out: Path, sizes: Sizes, device: str) -> dict[str, Any]:
    """`load_quantized` of the converted checkpoint onto `device`, then `time_steps`: the row's figures."""
    import torch

    import loaders

    reset_peak(device)
    t0 = time.perf_counter()
    model = loaders.load_quantized(model_cls, out, device=device)
    synchronize(device)
    row: dict[str, Any] = {"load_s": time.perf_counter() - t0, "load_peak_bytes": peak_bytes(device)}
    try:
        model.eval()
        config = model.config
        inputs = wan_inputs(sizes, device, config.in_channels, config.text_dim)
        first = first_quantized(model)
        probe = torch.zeros(16, first.in_features, dtype=torch.bfloat16, device=device) if first else None
        row["fast"] = None if first is None else uses_fast_path(first, probe)
        row["quantized"] = sum(1 for m in model.modules() if isinstance(m, loaders.QuantizedLinear))
        row["layers"] = len(model.blocks)
        row.update(time_steps(model, inputs, device))
    finally:
        del model
        release(device)
    return row


def step_ckpt(sizes: Sizes, device: str, work: Path | None) -> None:
    import tempfile

    missing = [name for name in CONVERTER_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        emit_skip("real checkpoints", f"`quantize convert` needs {', '.join(missing)}, not installed here")
        return
    try:  # imported before anything is timed
        import diffusers

        import loaders  # noqa: F401
        import quantize.examples  # noqa: F401

        model_cls = diffusers.WanTransformer3DModel
    except Exception as exc:
        emit_skip("real checkpoints", reason(exc))
        return
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="gpu-check-ckpt-")) if own else work
    try:
        src = work / "source"
        t0 = time.perf_counter()
        try:
            shape, nbytes = write_ckpt_source(sizes, src)
        except Exception as exc:
            emit_skip("real checkpoints", f"writing the source: {reason(exc)}")
            return
        write_s = time.perf_counter() - t0
        conversions = ckpt_conversions()
        program = display_command(quantize_command())
        commands = " and ".join(
            f"`quantize convert SRC OUT {display_command(options)}`" for _, options in conversions
        )
        emit_note(
            "ckpt",
            f"Source: `quantize.examples.write_random_checkpoint` of Wan's `{sizes.ckpt_preset}` example (original "
            f"names; dim {shape.dim}, ffn {shape.ffn_dim}, {shape.num_heads} heads) with its first "
            f"{shape.num_layers} blocks, random bf16, {nbytes / 1e9:.2f} GB, written in {write_s:.1f} s. Converted on "
            f"this machine's CPU ({os.cpu_count()} cores) by {commands} (`{program}`); each loaded by "
            f"`loaders.load_quantized(WanTransformer3DModel, OUT, device={device!r})`.",
        )
        for fmt, options in conversions:
            what = f"real checkpoint {fmt}"
            out = work / fmt
            argv = convert_command(src, out, options)
            t0 = time.perf_counter()
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
            convert_s = time.perf_counter() - t0
            if done.returncode != 0:
                emit_skip(what, f"`quantize convert` exit {done.returncode}: {last_line(done.stderr)}")
                continue
            try:
                row = measure_ckpt(model_cls, out, sizes, device)
            except Exception as exc:
                emit_skip(what, f"loading or running it: {reason(exc)}")
                continue
            out_bytes = sum(f.stat().st_size for f in out.rglob("*.safetensors"))
            emit_row("ckpt", format=fmt, convert_s=convert_s, out_bytes=out_bytes, **row)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


# --- the parent: tests, then each step in its own process ---------------------------------------


@dataclass
class Deadline:
    """The time left of the whole check, and each step's guard: its cap (times `slack`) or what is left."""

    total: float  # seconds, the report and the finish included
    slack: float = 1.0  # the CPU dry run's guards are DRY_RUN_SLACK times the GPU's
    end: float = field(init=False)

    def __post_init__(self) -> None:
        self.end = time.monotonic() + self.total - FINISH_RESERVE_S

    def left(self) -> float:
        return self.end - time.monotonic()

    def guard(self, cap: float) -> float:
        return min(cap * self.slack, self.left())


@dataclass(frozen=True)
class Finished:
    rc: int | None  # None: killed at its time guard
    stdout: str
    stderr: str
    seconds: float


def run_bounded(argv: list[str], timeout: float) -> Finished:
    """Run `argv` in the repo, in its own process group, killed with all it started after `timeout` s."""
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=max(timeout, 1.0))
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        rc = None
    return Finished(rc, out, err, time.monotonic() - started)


@dataclass
class TestRun:
    counts: dict[str, int]
    seconds: float
    timed_out: bool
    rc: int | None
    failures: list[str]  # pytest's FAILED / ERROR lines

    @property
    def failed(self) -> int:
        bad = self.counts.get("failed", 0) + self.counts.get("errors", 0)
        unexplained = self.rc not in (0, 5) and not bad  # killed, interrupted, a usage or internal error
        return bad + (1 if self.timed_out or unexplained else 0)

    def summary(self) -> str:
        if self.timed_out:
            return f"GPU tests did not finish within {self.seconds:.0f} s"
        if self.rc not in (0, 1, 5) and not self.counts:
            return f"GPU tests did not run (pytest exit {self.rc})"
        text = f"{self.counts.get('passed', 0)} GPU tests passed, {self.failed} failed"
        skipped = self.counts.get("skipped", 0)
        return text + (f", {skipped} skipped" if skipped else "")


def parse_pytest(out: str) -> tuple[dict[str, int], list[str]]:
    """The counts of pytest's closing line (``3 passed, 1 failed, 900 deselected in 9.1s``) and its failure lines."""
    counts: dict[str, int] = {}
    closing = [
        ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|errors?)\b", ln)
    ]
    if closing:
        for n, word in re.findall(
            r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?)\b", closing[-1]
        ):
            counts["errors" if word.startswith("error") else word] = int(n)
    failures = [ln for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return counts, failures


def run_gpu_tests(timeout: float) -> TestRun:
    log(f"running `python {' '.join(TEST_ARGV)}` (up to {timeout:.0f} s)")
    done = run_bounded([sys.executable, *TEST_ARGV], timeout)
    counts, failures = parse_pytest(done.stdout)
    run = TestRun(counts, done.seconds, done.rc is None, done.rc, failures)
    log(run.summary() + "".join(f"\n  {ln}" for ln in failures))
    return run


@dataclass
class Findings:
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def take(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "row":
            self.rows.setdefault(record["table"], []).append(record["row"])
        elif kind == "note":
            self.notes.setdefault(record["table"], []).append(record["text"])
        elif kind == "skip":
            self.skip(record["what"], record["why"])

    def skip(self, what: str, why: str) -> None:
        self.skipped.append((what, why))
        print(f"gpu-check: skipped {what}: {why}", flush=True)

    @property
    def figures(self) -> int:
        return sum(len(rows) for rows in self.rows.values())


def records_in(stdout: str) -> list[dict[str, Any]]:
    records = []
    for line in stdout.splitlines():
        if line.startswith(RECORD):
            try:
                records.append(json.loads(line[len(RECORD) :]))
            except json.JSONDecodeError:
                continue
    return records


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output")[:200]


def run_step(findings: Findings, deadline: Deadline, what: str, step_args: list[str], cap: float) -> None:
    """One step in its own process, under min(`cap`, the time left); its records go into `findings`."""
    timeout = deadline.guard(cap)
    if timeout < MIN_STEP_S:
        findings.skip(
            what,
            f"out of time ({max(deadline.left(), 0):.0f} s of the {deadline.total / 60:g}-minute budget left)",
        )
        return
    log(f"{what}: up to {timeout:.0f} s")
    argv = [sys.executable, str(Path(__file__).resolve()), "--step", *step_args, "--budget", f"{timeout:.0f}"]
    done = run_bounded(argv, timeout)
    records = records_in(done.stdout)
    for record in records:
        findings.take(record)
    if done.rc is None:
        findings.skip(what, f"ran past its {timeout:.0f} s time guard (what it measured before is kept)")
    elif done.rc != 0 and not any(r.get("kind") == "skip" for r in records):
        findings.skip(what, f"its process failed (exit {done.rc}): {last_line(done.stderr)}")
    log(f"{what}: {done.seconds:.0f} s")


def check_gpu(write: Path | None, device: str = "cuda") -> int:
    """Everything, on the GPU; with `device` "cpu" a dry run of the same flow, the steps at toy sizes."""
    import tempfile

    slack = 1.0 if device == "cuda" else DRY_RUN_SLACK
    deadline = Deadline(TOTAL_BUDGET_S * slack, slack)
    gpu = gpu_line() if device == "cuda" else "GPU: none: a dry run on the CPU at toy sizes (`--device cpu`)"
    log(gpu)
    tests = run_gpu_tests(deadline.guard(TEST_TIMEOUT_S))
    findings = Findings()
    where = [] if device == "cuda" else ["--device", "cpu", "--tiny"]
    run_step(findings, deadline, "host-to-device copies", ["h2d", *where], H2D_CAP_S)
    run_step(findings, deadline, "block offload", ["offload", *where], OFFLOAD_CAP_S)
    run_step(findings, deadline, "raw GEMMs", ["raw", *where], RAW_CAP_S)
    # the checkpoints' files go with the folder even where the step is killed at its guard
    with tempfile.TemporaryDirectory(prefix="gpu-check-ckpt-") as work:
        run_step(findings, deadline, "real checkpoints", ["ckpt", "--work", work, *where], CKPT_CAP_S)
    for scheme in (BASELINE, *SCHEMES):
        run_step(findings, deadline, scheme.label, ["linear", "--scheme", scheme.label, *where], scheme.cap_s)
    body = report(tests, findings, gpu, display_command([sys.executable, *sys.argv]))
    if write:
        update_section(write, body, (START, END))
        where = f"written to {display_path(write)}"
    else:
        print(body)
        where = "measured (no --write: printed above)"
    skipped = "; ".join(f"{what} ({why})" for what, why in findings.skipped) or "nothing"
    print(f"gpu-check: {tests.summary()}; {findings.figures} figures {where}; skipped: {skipped}", flush=True)
    return 1 if tests.failed else 0


# --- the report ---------------------------------------------------------------------------------


def gpu_line() -> str:
    import torch

    props = torch.cuda.get_device_properties(0)
    return (
        f"GPU: {torch.cuda.get_device_name(0)}, {props.total_memory / 2**30:.1f} GiB, compute capability "
        f"{props.major}.{props.minor}; torch {torch.__version__} (CUDA {torch.version.cuda})"
    )


def h2d_lines(findings: Findings) -> list[str]:
    rows = [
        [r["memory"], f"{r['gbps']:.1f}", f"{r['lo']:.1f} / {r['hi']:.1f}", str(r["runs"])]
        for r in findings.rows.get("h2d", [])
    ]
    if not rows:
        return []
    size = findings.rows["h2d"][0]["bytes"] / 2**30
    return [
        f"### Host-to-device copies ({size:g} GiB tensor, one warm-up copy, CUDA events; GB = 10^9 bytes)",
        "",
        markdown_table(rows, ["host memory", "GB/s (median)", "min / max", "copies"]),
        "",
    ]


def fast_path_cell(row: dict[str, Any]) -> str:
    """Whether the scheme's kernel ran: a bold no where it has one and missed it, a plain one where it has none."""
    if row["scheme"] == BASELINE.label:
        return "-"
    value = row.get("fast")
    if value is None:
        return "?"
    if value:
        return "yes"
    if row.get("lacks"):  # below the capability its kernel needs: it decodes by design
        return f"no: decodes ({row['lacks'].split(',')[0]})"
    return "**no**" if row.get("has_fast_kernel", True) else "no (none)"


def linear_lines(findings: Findings) -> list[str]:
    found = findings.rows.get("linear", [])
    if not found:
        return []
    base = {tuple(r["shape"]): r["ms"] for r in found if r["scheme"] == BASELINE.label}
    rows = []
    for r in found:
        ref = base.get(tuple(r["shape"]))
        rows.append(
            [
                r["scheme"],
                r["kernel"],
                str(r["shape"]),
                fast_path_cell(r),
                f"{r['ms']:.3f} ({r['lo']:.3f} - {r['hi']:.3f})",
                f"{r['ms'] / ref:.2f}x" if ref else "-",
                f"{r['tflops']:.3g}",
                "-" if r.get("sqnr_db") is None else f"{r['sqnr_db']:.1f}",
                "-" if r.get("encode_s") is None else f"{r['encode_s']:.2f}",
            ]
        )
    columns = [
        "scheme",
        "kernel",
        "weight [out, in]",
        "fast path",
        "ms median (min - max)",
        "vs bf16",
        "TFLOP/s",
        "SQNR (dB)",
        "CPU encode (s)",
    ]
    return [
        f"### Quantized Linear forward at {found[0]['sizes']} shapes ({found[0]['tokens']} tokens, bf16 input)",
        "",
        markdown_table(rows, columns),
        "",
        f"- Median of {LINEAR_RUNS} calls after {LINEAR_WARMUP} warm-ups, CUDA events. Each module built with "
        "`from_weight` on the CPU from a random bf16 weight, then moved to the GPU. Fast path: `uses_fast_path(x)` "
        "(the kernel in the second column ran; NVFP4 and MXFP8 have theirs on Blackwell only and decode the weight "
        "for each call elsewhere). vs bf16: time / bf16 `F.linear`'s at that shape. SQNR: the output against bf16 "
        "`F.linear` with the unquantized weight. CPU encode: `from_weight`'s time.",
        "",
    ]


def raw_lines(findings: Findings) -> list[str]:
    found = findings.rows.get("raw", [])
    if not found:
        return []
    base = {tuple(r["shape"]): r["ms"] for r in found if r["op"] == RAW_BASELINE.op}
    modules = {(r["scheme"], tuple(r["shape"])): r["ms"] for r in findings.rows.get("linear", [])}
    rows = []
    for r in found:
        shape = tuple(r["shape"])
        ref, module = base.get(shape), modules.get((r.get("module"), shape))
        rows.append(
            [
                r["op"],
                r["operands"],
                "-" if r.get("fast_accum") is None else str(r["fast_accum"]),
                str(r["shape"]),
                f"{r['ms']:.3f} ({r['lo']:.3f} - {r['hi']:.3f})",
                f"{r['ms'] / ref:.2f}x" if ref else "-",
                f"{r['tflops']:.3g}",
                f"{r['module']} {module / r['ms']:.2f}x" if module else "-",
            ]
        )
    columns = [
        "op",
        "operands",
        "use_fast_accum",
        "weight [out, in]",
        "ms median (min - max)",
        "vs bf16",
        "TFLOP/s (int8: TOP/s)",
        "module / this",
    ]
    return [
        f"### Raw GEMMs on ready operands at {found[0]['sizes']} shapes ({found[0]['tokens']} tokens): the floor "
        "the modules chase",
        "",
        markdown_table(rows, columns),
        "",
        f"- Median of {LINEAR_RUNS} calls after {LINEAR_WARMUP} warm-ups, CUDA events; the operands made beforehand "
        "(x [tokens, in] row-major, the weight [out, in] contiguous and passed as `.t()`, as the modules pass it), "
        "so nothing is quantized in the timed call; float8 scales all ones, bf16 output; `_int_mm`'s output int32. "
        "vs bf16: time / bf16 `F.linear` (no bias) timed alongside at that shape. module / this: the linear table's "
        "module that calls this op, its time over this one's (what its activation quantization and scaling cost).",
        "",
    ]


def offload_kind(row: dict[str, Any]) -> tuple[str, str]:
    """(its Linears: fp8 or bf16, where its blocks live: resident, pageable or pinned)."""
    placement = row.get("placement")
    if placement is None:
        case = row["case"]
        placement = "resident" if "resident" in case else "pinned" if "pinned" in case else "pageable"
    return row.get("linears", "fp8"), placement


def offload_lines(findings: Findings) -> list[str]:
    found = findings.rows.get("offload", [])
    notes = findings.notes.get("offload", [])
    if not found and not notes:
        return []
    kinds = {offload_kind(r): r["ms"] for r in found}
    resident, bf16 = kinds.get(("fp8", "resident")), kinds.get(("bf16", "resident"))
    rows, verdicts, vs_bf16 = [], [], []
    for r in found:
        linears, placement = offload_kind(r)
        ratio = r["ms"] / resident if resident else None
        to_bf16 = r["ms"] / bf16 if bf16 else None
        copied = r.get("copied")
        rows.append(
            [
                r["case"],
                f"{r['ms']:.0f} ({r['lo']:.0f} - {r['hi']:.0f})",
                "-" if ratio is None else f"{ratio:.2f}x",
                "-" if to_bf16 is None else f"{to_bf16:.2f}x",
                "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**30:.2f}",
                "-" if copied is None else f"{copied / 1e9:.2f}",
            ]
        )
        if linears == "fp8" and ratio is not None and copied is not None:
            met = "met" if ratio <= TARGET_RATIO else "**not met**"
            verdicts.append(f"{r['case']} {ratio:.2f}x: {met}")
        if linears == "fp8" and placement in ("resident", "pinned") and to_bf16 is not None:
            met = "met" if to_bf16 <= TARGET_VS_BF16 else "**not met**"
            vs_bf16.append(f"{placement} {to_bf16:.2f}x: {met}")
    columns = [
        "case",
        "step ms median (min - max)",
        "vs fp8 resident",
        "vs bf16 resident",
        "max_memory_allocated (GiB)",
        "copied / step (GB)",
    ]
    lines = ["### One forward step: fp8 resident, offloaded, and bf16 resident", ""]
    lines += [f"- {note}" for note in notes]
    if rows:
        lines += ["", markdown_table(rows, columns), ""]
        lines.append(
            f"- One warm-up step, then the median of {STEP_RUNS}, CUDA events; `max_memory_allocated` over the "
            "timed steps (the weights included); copied: the offloader's host-to-device bytes per timed step. "
            "The bf16 row: the same model, its layers and other tensors, with each block Linear a bf16 `nn.Linear` "
            "(a copy of the random bf16 weight its shape's fp8 template encodes)."
        )
    if verdicts:
        lines.append(f"- Target: offloaded step <= {TARGET_RATIO}x resident: " + "; ".join(verdicts) + ".")
    if vs_bf16:
        lines.append(
            f"- Target: fp8 step <= {TARGET_VS_BF16:.2f}x the bf16 resident step: " + "; ".join(vs_bf16) + "."
        )
    return [*lines, ""]


def ckpt_lines(findings: Findings) -> list[str]:
    found = findings.rows.get("ckpt", [])
    notes = findings.notes.get("ckpt", [])
    if not found and not notes:
        return []

    def gib(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**30:.2f}"

    rows = [
        [
            r["format"],
            str(r.get("layers", "-")),
            str(r.get("quantized", "-")),
            "?" if r.get("fast") is None else "yes" if r["fast"] else "**no**",
            f"{r['convert_s']:.1f}",
            f"{r['out_bytes'] / 1e9:.2f}",
            f"{r['load_s']:.1f}",
            f"{r['ms']:.0f} ({r['lo']:.0f} - {r['hi']:.0f})",
            gib(r.get("peak_bytes")),
            gib(r.get("load_peak_bytes")),
        ]
        for r in found
    ]
    columns = [
        "format",
        "layers",
        "quantized Linears",
        "fast path",
        "convert (s)",
        "output (GB)",
        "load (s)",
        "step ms median (min - max)",
        "max_memory_allocated, step (GiB)",
        "load (GiB)",
    ]
    lines = ["### Real checkpoints: converted here, `load_quantized` onto the GPU, one forward step", ""]
    lines += [f"- {note}" for note in notes]
    if rows:
        lines += ["", markdown_table(rows, columns), ""]
        lines.append(
            f"- Input as in the step above; one warm-up step, then the median of {STEP_RUNS}, CUDA events. "
            "max_memory_allocated: over the timed steps, and over the load. Fast path: `uses_fast_path` of the "
            "first quantized Linear."
        )
    return [*lines, ""]


def report(tests: TestRun, findings: Findings, gpu: str, command: str) -> str:
    """The Markdown section, without its markers."""
    failures = "".join(f" `{ln}`" for ln in tests.failures[:10])
    lines = [
        *section_head(
            "GPU check: the GPU tests, host-to-device copies, fp8 and bf16 steps, block offload, real checkpoints, "
            "quantized Linears and raw GEMMs",
            command,
            REPO,
        ),
        f"- {gpu}",
        f"- GPU tests (`python {' '.join(TEST_ARGV)}`): {tests.summary()} in {tests.seconds:.0f} s.{failures}",
        "",
        *h2d_lines(findings),
        *offload_lines(findings),
        *ckpt_lines(findings),
        *linear_lines(findings),
        *raw_lines(findings),
    ]
    skipped = "; ".join(f"{what}: {why}" for what, why in findings.skipped) or "nothing"
    lines.append(f"Skipped: {skipped}.")
    return "\n".join(lines)


# --- entry point --------------------------------------------------------------------------------


def log(text: str) -> None:
    print(f"[gpu-check] {text}", file=sys.stderr, flush=True)


def no_cuda_line() -> str:
    import torch

    build = "" if torch.version.cuda else ": a CPU-only build"
    return f"gpu-check: skipped everything: no CUDA device (torch {torch.__version__} sees none{build})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", type=Path, metavar="MARKDOWN", help="store the GPU section in this file")
    p.add_argument("--step", choices=("h2d", "linear", "offload", "raw", "ckpt"), help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)  # the ckpt step's scratch folder
    p.add_argument("--scheme", default=BASELINE.label, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=OFFLOAD_CAP_S, help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run_one_step(args: argparse.Namespace) -> int:
    sizes = TINY if args.tiny else FULL
    if args.step == "h2d":
        step_h2d(sizes, args.device)
    elif args.step == "linear":
        step_linear(scheme_named(args.scheme), sizes, args.device)
    elif args.step == "raw":
        step_raw(sizes, args.device)
    elif args.step == "ckpt":
        step_ckpt(sizes, args.device, args.work)
    else:
        step_offload(sizes, args.device, args.budget)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.step:
        return run_one_step(args)
    import torch

    if args.device == "cpu":
        return check_gpu(args.write, "cpu")
    if not torch.cuda.is_available():
        print(no_cuda_line(), flush=True)
        return 0
    return check_gpu(args.write)


if __name__ == "__main__":
    sys.exit(main())
