"""Fused Triton kernels for the loaders' W8A8 and FP8 fast paths, each equal bit for bit to an eager one.

On a GPU the eager activation quantizers read and write the whole activation once per step (`x.float()`, the
max, the division, the clamp, the cast); each kernel here makes one pass (two for a per-tensor scale: its
maximum first). Each function names its reference (the activation quantizers': their format's own), and
tests/loaders/test_fused_kernels.py holds the two equal bit for bit (`torch.equal` on the bytes) on the CPU,
through Triton's interpreter, and on CUDA. Each quantizer returns (values, scales), as its reference does.

| function | its eager reference |
|---|---|
| `fp8_rows` | `quantize.formats.fp8_channel.quantize_rows` (per-row float8 activations, `FP8ChannelLinear`) |
| `fp8_tensor` | `quantize.formats.comfy_fp8.quantize_tensor` (per-tensor float8 activations, `ComfyFP8Linear`) |
| `int8_rows` | `quantize.formats.comfy_int8.quantize_rows` (comfy-kitchen's per-row int8, `ComfyInt8Linear`) |
| `int8_rows_torchao` | `quantize.formats.torchao_int8.quantize_rows` (torchao's per-row int8, `TorchaoInt8Linear`) |
| `int8_epilogue` | the scaling in `ComfyInt8Linear.fast_forward` / `TorchaoInt8Linear.fast_forward` |
| `int8_mm` | `int8_epilogue(torch._int_mm(x_q, w_q.t()), ...)`: the GEMM and the epilogue in one kernel |
| `q8_0_decode` | `quantize.formats._q8_0.dequantize(blocks).to(dtype)` |

The central decision: a kernel computes what its reference computes on the device it runs on, which is not
the same on every device, rounding for rounding:

- torch divides a tensor by a Python number differently on the two: on CUDA ``t / c`` is ``t * float32(1 /
  c)`` (ATen's ``div_true_kernel_cuda``: "compute a * reciprocal(b) ... may lose one bit"), on the CPU a true
  division (`fp8_rows`' ``amax / 448`` differs between the two in about half of all float32 values). The
  kernels divide as the device's torch does (`_div_const`, RECIP on CUDA).
- A division by a tensor is IEEE's (`tl.div_rn`; Triton's ``/`` on float32 is the approximate
  ``div.full.f32``); every cast to a narrower float rounds to nearest even; `enable_fp_fusion=False` keeps the
  compiler from fusing a product and a sum into one FMA (one rounding where the reference has two: it would
  with a bias). Compiled for sm_90 the PTX has ``div.rn.f32``, ``cvt.rn.bf16.f32``,
  ``cvt.rn.satfinite.e4m3x2.f32``, no ``fma`` and no ``.ftz``.
- Triton's interpreter (TRITON_INTERPRET=1: how the CPU runs these) casts float32 to bfloat16 by truncation,
  and to float8 with a rounding of its own (up from half without the sticky bits, a carry out of the
  mantissa lost, subnormals truncated). Interpreted (EMULATE), those two casts are done on the bits, to
  nearest even (`_narrow`, `_round`, `_e4m3_bits`; the tests hold them to torch's casts around every
  bfloat16 and over float8's range); compiled, they are the hardware's.
- Two more limits of the interpreter shape the code, not the numbers. Triton's library functions (``tl.max``,
  ``tl.cdiv``, ``tl.zeros``) are made when triton is imported, interpretable only if TRITON_INTERPRET was set
  by then, and torch imports triton early (torch._dynamo): the kernels use builtins only (`_max` is tl.max's
  own reduction). With numpy 2.4 it cannot take a runtime argument as a loop bound ("only 0-dimensional
  arrays can be converted"): every bound is a constexpr, K (a layer's width: one compilation each) or
  fp8_tensor's steps (a power of two).

Not covered: NaN inputs (the reductions here do not propagate NaN as torch's ``amax`` does; the reference's
int8 results are meaningless there). Inputs: 2-D bf16, fp16 or fp32 tensors (made contiguous) on an NVIDIA
CUDA device (float8 needs SM89+), or on the CPU under the interpreter (`available`). triton is imported and
the kernels are built on first use (`_build`): importing this module, or `loaders`, does not import triton.
"""

from __future__ import annotations

import functools
import os
import threading

import torch

from quantize.formats import _q8_0, comfy_int8, torchao_int8
from quantize.formats._e4m3 import FP8_MAX

__all__ = [
    "STYLES",
    "available",
    "fp8_rows",
    "fp8_tensor",
    "int8_rows",
    "int8_rows_torchao",
    "int8_epilogue",
    "int8_mm",
    "q8_0_decode",
]

#: the two int8 epilogues: comfy-kitchen's (`ComfyInt8Linear`) and torchao's (`TorchaoInt8Linear`)
STYLES = ("comfy", "torchao")
# the formats' own constants, handed to the kernels as constexprs (float8's largest value, comfy-kitchen's and
# torchao's divisors and scale floors, Q8_0's block): the formats' modules own them
_Q8_0_BLOCK, _Q8_0_BYTES = _q8_0.BLOCK, _q8_0.BLOCK_BYTES

# Launch sizes: module globals, read at each call (the tests shrink them to reach the loops with small input).
_ROW_BLOCK_MAX = 16384  # the widest row held in registers; wider ones are read twice, in chunks
_ELEMENTS = 8192  # elements per program of fp8_tensor's second pass (which first reduces the partial maxima)
_AMAX_BLOCK = 8192  # elements per program and step of fp8_tensor's first pass
_MAX_PARTIALS = 512  # at most this many programs in that pass, each leaving one partial maximum
_Q8_0_BLOCKS = 128  # Q8_0 blocks per program (4096 values)
_EPILOGUE_TILE = (16, 256)
_COMPILE = {"enable_fp_fusion": False}  # no FMA: the references round a product before adding to it

# -- triton, imported and the kernels built on first use: importing loaders never imports triton -------------

triton = tl = None  # the modules, once `_build` has imported them
#: whether the kernels were built interpreted (TRITON_INTERPRET set when they were: numpy, on the host)
_INTERPRET = False
#: the kernels' EMULATE: casts to bf16 and float8 done on the bits, exactly (the interpreter's are not)
_EMULATE = False
_JIT: list[str] = []  # the names of the functions `_build` makes Triton functions, in order
_BUILT: bool | None = None  # None: not tried yet; else whether triton imported
_BUILD_LOCK = threading.Lock()


def _jit(fn):
    """Mark `fn` (a module-level function) to become ``triton.jit(fn)`` when the kernels are built."""
    _JIT.append(fn.__name__)
    return fn


def _build() -> bool:
    """Import triton and make every `_jit` function a Triton function in place (the kernels find their helpers
    by their global names), once; whether triton is there. triton.jit reads TRITON_INTERPRET now."""
    global _BUILT, triton, tl, _INTERPRET, _EMULATE
    if _BUILT is not None:
        return _BUILT
    with _BUILD_LOCK:
        if _BUILT is None:
            try:
                import triton as triton_module
                import triton.language as tl_module
            except ImportError:  # torch's CPU wheels come without it
                _BUILT = False
                return False
            triton, tl = triton_module, tl_module
            _INTERPRET = _EMULATE = bool(triton.knobs.runtime.interpret)
            names = globals()
            for name in _JIT:
                names[name] = triton.jit(names[name])
            _BUILT = True
    return _BUILT


def _interpret_requested() -> bool:
    """TRITON_INTERPRET set, read as triton reads it."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on", "y")


def available(device: torch.device | str) -> bool:
    """Whether the kernels run on `device`: an NVIDIA CUDA device where triton imports; the CPU only through
    Triton's interpreter (slow, for tests): TRITON_INTERPRET=1 set now and when the kernels were first built.

    >>> available("meta")
    False
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.version.hip is None and torch.cuda.is_available() and _build()
    return device.type == "cpu" and _interpret_requested() and _build() and _INTERPRET


@functools.cache
def _reciprocal(c: float) -> float:
    """float32(1 / c) as CUDA's torch takes it for ``t / c`` (a float32 division on the host)."""
    return (torch.tensor(1.0) / torch.tensor(c)).item()


_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _check_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype not in _FLOATS:
        raise ValueError(f"{what} takes bfloat16, float16 or float32, got {dtype}")


def _check_device(t: torch.Tensor, what: str) -> None:
    if not available(t.device):
        raise RuntimeError(
            f"{what}: no Triton kernels on {t.device} (an NVIDIA GPU with triton, or the CPU under "
            "TRITON_INTERPRET=1): check loaders.fused.available(device) first"
        )


def _rows(x: torch.Tensor, what: str) -> torch.Tensor:
    """`x` checked (2-D, bf16/fp16/fp32, a device the kernels run on) and contiguous."""
    if x.dim() != 2:
        raise ValueError(f"{what} takes 2-D activations [rows, features], got shape {list(x.shape)}")
    _check_dtype(x.dtype, what)
    _check_device(x, what)
    return x.contiguous()


def _row_launch(k: int) -> dict:
    """Block and warps of a one-program-per-row kernel for rows of `k` values: the whole row in one block (the
    next power of two) up to _ROW_BLOCK_MAX, else chunks of min(_ROW_BLOCK_MAX, 4096) in two passes."""
    block = triton.next_power_of_2(max(k, 1))
    chunked = block > _ROW_BLOCK_MAX
    if chunked:
        block = min(_ROW_BLOCK_MAX, 4096)
    return {"BLOCK": block, "CHUNKED": chunked, "num_warps": min(16, max(4, block // 1024))}


# -- arithmetic shared by the kernels ------------------------------------------------------------------------
# The helpers call no other (`_epilogue` aside): the interpreter re-patches triton.language on each call of a
# Triton function, some milliseconds each.


@_jit
def _widen(x, EMULATE: tl.constexpr):
    """x (bf16, fp16 or fp32) as float32, exactly (interpreted, bf16 through its bits: the interpreter's cast
    mishandles subnormals)."""
    if EMULATE and x.dtype == tl.bfloat16:
        y = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        y = x.to(tl.float32)
    return y


@_jit
def _narrow(v, DTYPE: tl.constexpr, EMULATE: tl.constexpr):
    """float32 `v` in DTYPE, rounded to nearest even: torch's ``.to(dtype)``. Interpreted, bf16 on the bits
    (the interpreter truncates): add 0x7FFF and the lowest bit kept, keep the upper half; NaN: 0x7FC0, as
    torch."""
    if EMULATE and DTYPE == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        u = tl.where(v == v, (u + (0x7FFF + ((u >> 16) & 1))) >> 16, 0x7FC0)
        y = u.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = v.to(DTYPE)
    return y


@_jit
def _round(v, DTYPE: tl.constexpr, EMULATE: tl.constexpr):
    """float32 `v` rounded to DTYPE (to nearest even), kept in float32: ``t.to(dtype)`` of an intermediate."""
    if EMULATE and DTYPE == tl.bfloat16:  # as `_narrow`, the low half cleared in place
        u = v.to(tl.uint32, bitcast=True)
        r = ((u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000).to(tl.float32, bitcast=True)
        y = tl.where(v == v, r, v)
    else:
        y = v.to(DTYPE).to(tl.float32)
    return y


@_jit
def _max(x):
    """The maximum of 1-D `x` (``tl.max``, written as its reduction: triton's library functions such as tl.max
    are made when triton is imported, interpretable only where TRITON_INTERPRET was set by then, and torch
    imports triton early; the builtins and the functions here are fine. The interpreter knows this combine
    function: numpy's max)."""
    return tl.reduce(x, 0, tl.standard._elementwise_max)


@_jit
def _rint(v):
    """float32 `v` (|v| < 2**22) rounded to an integer, halves to even (torch's ``round``): the sum lands in
    [2**23, 2**24), where float32's spacing is 1 and its rounding to nearest even does the work; both steps
    exact otherwise, and nothing may fold them (no fast-math)."""
    return (v + 12582912.0) - 12582912.0


@_jit
def _div_const(a, C: tl.constexpr, INV_C: tl.constexpr, RECIP: tl.constexpr):
    """float32 `a` / C as torch computes ``tensor / C`` for a Python number C: on CUDA ``a * float32(1 / C)``
    (INV_C: ATen's optimization for a CPU scalar divisor), on the CPU an IEEE division."""
    if RECIP:
        r = a * INV_C
    else:
        r = tl.div_rn(a, tl.full(a.shape, C, tl.float32))
    return r


@_jit
def _e4m3_bits(v, EMULATE: tl.constexpr):
    """float32 `v` (|v| <= 448) as float8_e4m3fn, rounded to nearest even: its bits (uint8). Interpreted, on
    the bits: from 2**-6 up, the mantissa rounded to 3 bits (add 0x7FFFF and the lowest bit kept; a carry
    moves the exponent on) and the exponent rebiased (127 -> 7); below, multiples of 2**-9: rint(|v| · 2**9)
    (as `_rint`); then the sign."""
    if EMULATE:
        u = v.to(tl.uint32, bitcast=True)
        a = u & 0x7FFFFFFF
        normal = ((a + (0x7FFFF + ((a >> 20) & 1))) >> 20) - (120 << 3)
        subnormal = ((a.to(tl.float32, bitcast=True) * 512.0 + 12582912.0) - 12582912.0).to(tl.uint32)
        y = (tl.where(a >= 0x3C800000, normal, subnormal) | ((u >> 24) & 0x80)).to(tl.uint8)
    else:
        y = v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return y


@_jit
def _row_absmax(x_row, K: tl.constexpr, BLOCK: tl.constexpr, EMULATE: tl.constexpr):
    """max |x| of a row of K values read in chunks of BLOCK, as float32 (exact); the chunks widened inline."""
    cols = tl.arange(0, BLOCK)
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for start in range(0, K, BLOCK):
        c = start + cols
        x = tl.load(x_row + c, mask=c < K, other=0.0)
        if EMULATE and x.dtype == tl.bfloat16:
            xf = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        else:
            xf = x.to(tl.float32)
        acc = tl.maximum(acc, tl.abs(xf))
    return tl.reduce(acc, 0, tl.standard._elementwise_max)


# -- fp8_rows ------------------------------------------------------------------------------------------------

# The row kernels: one program per row. Not CHUNKED, the row is read once (its maximum, then its values, from
# registers) and the store loop runs once; CHUNKED, the maximum is taken over chunks, then each chunk read
# again.


@_jit
def _fp8_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    K: tl.constexpr,
    QMAX: tl.constexpr,
    INV_C: tl.constexpr,
    RECIP: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKED: tl.constexpr,
    EMULATE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row, q_row = x_ptr + row * K, q_ptr + row * K
    cols = tl.arange(0, BLOCK)
    if CHUNKED:
        amax = _row_absmax(x_row, K, BLOCK, EMULATE)
    else:
        x = _widen(tl.load(x_row + cols, mask=cols < K, other=0.0), EMULATE)
        amax = _max(tl.abs(x))
    scale = _div_const(amax, QMAX, INV_C, RECIP)  # row_absmax(x.float()).div_(FP8_MAX)
    scale = tl.where(scale == 0.0, 1.0, scale)  # torch.where(scale == 0, 1.0, scale)
    tl.store(scale_ptr + row, scale)
    for start in range(0, K, BLOCK):
        c = start + cols
        if CHUNKED:
            x = _widen(tl.load(x_row + c, mask=c < K, other=0.0), EMULATE)
        v = tl.minimum(tl.maximum(tl.div_rn(x, scale), -QMAX), QMAX)  # torch.div(x, scale).clamp_(±448)
        tl.store(q_row + c, _e4m3_bits(v, EMULATE), mask=c < K)  # .to(float8_e4m3fn)


def fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row float8 quantization of 2-D activations: (float8_e4m3fn values, float32 scales [rows, 1]), bit
    for bit ``quantize.formats.fp8_channel.quantize_rows(x)``: scale = rowmax|x| / 448 in float32 (a scale of 0
    taken as 1), q = e4m3(clamp(x / scale, ±448)), the division IEEE's, the cast to nearest even. One program
    per row, one read of it (two above 16384 values).

    >>> q, scale = fp8_rows(x)  # doctest: +SKIP
    """
    x = _rows(x, "fp8_rows")
    m, k = x.shape
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    if m:
        _fp8_rows_kernel[(m,)](
            x, q.view(torch.uint8), scale, k, QMAX=FP8_MAX, INV_C=_reciprocal(FP8_MAX), RECIP=x.is_cuda,
            EMULATE=_EMULATE, **_row_launch(k), **_COMPILE,
        )  # fmt: skip
    return q, scale


# -- fp8_tensor ----------------------------------------------------------------------------------------------


@_jit
def _absmax_partials_kernel(
    x_ptr, partial_ptr, n, STEPS: tl.constexpr, BLOCK: tl.constexpr, EMULATE: tl.constexpr
):
    """Each program's max |x| over its STEPS consecutive blocks of BLOCK values, as float32 (exact)."""
    start = tl.program_id(0).to(tl.int64) * (STEPS * BLOCK)
    cols = tl.arange(0, BLOCK)
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for step in range(STEPS):
        offs = start + step * BLOCK + cols
        acc = tl.maximum(acc, tl.abs(_widen(tl.load(x_ptr + offs, mask=offs < n, other=0.0), EMULATE)))
    tl.store(partial_ptr + tl.program_id(0), _max(acc))


@_jit
def _fp8_tensor_kernel(
    x_ptr,
    q_ptr,
    partial_ptr,
    scale_ptr,
    n,
    PARTIALS,
    PARTIALS_BLOCK: tl.constexpr,
    DYNAMIC: tl.constexpr,
    QMAX: tl.constexpr,
    INV_C: tl.constexpr,
    RECIP: tl.constexpr,
    BLOCK: tl.constexpr,
    EMULATE: tl.constexpr,
):
    DTYPE = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    if DYNAMIC:  # every program reduces the partial maxima (a few KB from L2), program 0 stores the scale
        p = tl.arange(0, PARTIALS_BLOCK)
        amax = _max(tl.load(partial_ptr + p, mask=p < PARTIALS, other=0.0))
        # (x.abs().amax() / FP8_MAX).float(): the division in x's dtype
        scale = _round(_div_const(amax, QMAX, INV_C, RECIP), DTYPE, EMULATE)
        scale = tl.where(scale == 0.0, 1.0, scale)
        tl.store(scale_ptr, scale, mask=pid == 0)
    else:
        scale = tl.load(scale_ptr)
    inv = _round(tl.div_rn(tl.full([], 1.0, tl.float32), scale), DTYPE, EMULATE)  # (1.0 / scale).to(x.dtype)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = _widen(tl.load(x_ptr + offs, mask=offs < n, other=0.0), EMULATE)
    # torch.clamp(x * inv, -FP8_MAX, FP8_MAX), the product in x's dtype
    v = tl.minimum(tl.maximum(_round(x * inv, DTYPE, EMULATE), -QMAX), QMAX)
    tl.store(q_ptr + offs, _e4m3_bits(v, EMULATE), mask=offs < n)


def fp8_tensor(x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor float8 quantization of 2-D activations: (float8_e4m3fn values, float32 scale []), bit for
    bit ``quantize.formats.comfy_fp8.quantize_tensor(x, scale)`` (comfy-kitchen's ``quantize_per_tensor_fp8``): a
    dynamic scale is ``(x.abs().amax() / 448).float()``, the division in x's dtype, 0 taken as 1; then ``clamp(x
    * (1.0 / scale).to(x.dtype), ±448).to(float8)``, the reciprocal in float32 rounded to x's dtype, the product
    in x's dtype. A static `scale` (float32, one value) is used as given (and returned). Two kernels: each
    program of the first leaves the maximum of its part of x; the second reduces those, and scales and casts.

    >>> q, scale = fp8_tensor(x)  # doctest: +SKIP
    """
    x = _rows(x, "fp8_tensor")
    n = x.numel()
    if scale is not None and (scale.dtype != torch.float32 or scale.numel() != 1 or scale.device != x.device):
        raise ValueError(
            f"fp8_tensor's static scale must be one float32 value on {x.device}, "
            f"got {scale.dtype}{list(scale.shape)} on {scale.device}"
        )
    if scale is None and n == 0:
        raise ValueError("fp8_tensor: an empty tensor has no maximum to take a scale from")
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if scale is None:
        blocks = triton.cdiv(n, _AMAX_BLOCK)
        steps = triton.next_power_of_2(triton.cdiv(blocks, _MAX_PARTIALS))  # a power of two: few compilations
        programs = triton.cdiv(blocks, steps)
        partials = torch.empty(programs, dtype=torch.float32, device=x.device)
        _absmax_partials_kernel[(programs,)](
            x, partials, n, STEPS=steps, BLOCK=_AMAX_BLOCK, EMULATE=_EMULATE,
            num_warps=8, **_COMPILE,
        )  # fmt: skip
        out_scale = torch.empty((), dtype=torch.float32, device=x.device)
    else:
        partials, programs, out_scale = scale, 1, scale
    if n:
        _fp8_tensor_kernel[(triton.cdiv(n, _ELEMENTS),)](
            x, q.view(torch.uint8), partials, out_scale, n, programs,
            PARTIALS_BLOCK=triton.next_power_of_2(programs), DYNAMIC=scale is None,
            QMAX=FP8_MAX, INV_C=_reciprocal(FP8_MAX), RECIP=x.is_cuda, BLOCK=_ELEMENTS, EMULATE=_EMULATE,
            num_warps=8, **_COMPILE,
        )  # fmt: skip
    return q, out_scale


# -- int8_rows (comfy-kitchen) -------------------------------------------------------------------------------


@_jit
def _int8_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    K: tl.constexpr,
    TINY: tl.constexpr,
    QMAX: tl.constexpr,
    FLOOR: tl.constexpr,
    INV_C: tl.constexpr,
    RECIP: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKED: tl.constexpr,
    EMULATE: tl.constexpr,
):
    DTYPE = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    x_row, q_row = x_ptr + row * K, q_ptr + row * K
    cols = tl.arange(0, BLOCK)
    if CHUNKED:
        amax = _row_absmax(x_row, K, BLOCK, EMULATE)
    else:
        x = _widen(tl.load(x_row + cols, mask=cols < K, other=0.0), EMULATE)
        amax = _max(tl.abs(x))
    scale = tl.maximum(_div_const(amax, QMAX, INV_C, RECIP), FLOOR)  # (amax.float() / 127).clamp_(min=1e-30)
    divisor = _round(scale, DTYPE, EMULATE)  # scale.to(x.dtype), 0 there taken as finfo(x.dtype).tiny
    divisor = tl.where(divisor == 0.0, TINY, divisor)
    tl.store(scale_ptr + row, scale)
    for start in range(0, K, BLOCK):
        c = start + cols
        if CHUNKED:
            x = _widen(tl.load(x_row + c, mask=c < K, other=0.0), EMULATE)
        # (x / divisor) in x's dtype, .round_() (half to even), .clamp_(-128, 127): clamped first, the same
        v = tl.minimum(tl.maximum(_round(tl.div_rn(x, divisor), DTYPE, EMULATE), -128.0), 127.0)
        tl.store(q_row + c, _rint(v).to(tl.int8), mask=c < K)


def int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row int8 quantization of 2-D activations, comfy-kitchen's arithmetic: (int8 values, float32 scales
    [rows, 1]), bit for bit ``quantize.formats.comfy_int8.quantize_rows(x)``: scale = max(rowmax|x| / 127 in
    float32, 1e-30); divisor = the scale in x's dtype (finfo(x.dtype).tiny where that is 0); q = clamp(round(x /
    divisor), -128, 127), the division rounded to x's dtype, then half to even. One program per row.

    >>> q, scale = int8_rows(x)  # doctest: +SKIP
    """
    x = _rows(x, "int8_rows")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        _int8_rows_kernel[(m,)](
            x, q, scale, k, TINY=torch.finfo(x.dtype).tiny, QMAX=comfy_int8.INT8_MAX,
            FLOOR=comfy_int8.MIN_SCALE, INV_C=_reciprocal(comfy_int8.INT8_MAX), RECIP=x.is_cuda,
            EMULATE=_EMULATE, **_row_launch(k), **_COMPILE,
        )  # fmt: skip
    return q, scale


# -- int8_rows_torchao ---------------------------------------------------------------------------------------


@_jit
def _int8_torchao_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    K: tl.constexpr,
    QMAX: tl.constexpr,
    FLOOR: tl.constexpr,
    INV_C: tl.constexpr,
    RECIP: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKED: tl.constexpr,
    EMULATE: tl.constexpr,
):
    DTYPE = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    x_row, q_row = x_ptr + row * K, q_ptr + row * K
    cols = tl.arange(0, BLOCK)
    if CHUNKED:
        amax = _row_absmax(x_row, K, BLOCK, EMULATE)
    else:
        x = _widen(tl.load(x_row + cols, mask=cols < K, other=0.0), EMULATE)
        amax = _max(tl.abs(x))
    # (row_absmax(x) / 127.5).clamp_(min=2**-23) in x's dtype, then .float()
    scale = tl.maximum(_round(_div_const(amax, QMAX, INV_C, RECIP), DTYPE, EMULATE), FLOOR)
    inv = tl.div_rn(tl.full([], 1.0, tl.float32), scale)  # 1.0 / scale, in float32
    tl.store(scale_ptr + row, scale)
    for start in range(0, K, BLOCK):
        c = start + cols
        if CHUNKED:
            x = _widen(tl.load(x_row + c, mask=c < K, other=0.0), EMULATE)
        v = tl.minimum(tl.maximum(x * inv, -128.0), 127.0)  # (x.float() * inv).round_().clamp_(-128, 127)
        tl.store(q_row + c, _rint(v).to(tl.int8), mask=c < K)  # clamped first: the same


def int8_rows_torchao(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row int8 quantization of 2-D activations, torchao's arithmetic: (int8 values, float32 scales
    [rows, 1]), bit for bit ``quantize.formats.torchao_int8.quantize_rows(x)``: scale = max(rowmax|x| / 127.5,
    2**-23) in x's dtype, then float32; q = clamp(round(float32(x) · (1 / scale)), -128, 127), the reciprocal
    and the product in float32, half to even. One program per row.

    >>> q, scale = int8_rows_torchao(x)  # doctest: +SKIP
    """
    x = _rows(x, "int8_rows_torchao")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        _int8_torchao_kernel[(m,)](
            x, q, scale, k, QMAX=torchao_int8.HALF_RANGE, FLOOR=torchao_int8.MIN_SCALE,
            INV_C=_reciprocal(torchao_int8.HALF_RANGE), RECIP=x.is_cuda, EMULATE=_EMULATE,
            **_row_launch(k), **_COMPILE,
        )  # fmt: skip
    return q, scale


# -- int8_epilogue and int8_mm -------------------------------------------------------------------------------


@_jit
def _epilogue(
    acc,
    xs,
    ws,
    bias,
    HAS_BIAS: tl.constexpr,
    TORCHAO: tl.constexpr,
    DTYPE: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """int32 `acc` [BM, BN] scaled back to DTYPE, every rounding of the eager epilogue in its place:
    comfy:   ``acc.float().mul_(x_scale * w_scale).to(dtype)``, then ``+ bias.to(dtype)`` in dtype;
    torchao: ``(acc.float() * x_scale).to(dtype) * w_scale`` (dtype times float32 is float32), ``+
    bias.to(dtype)`` in float32, ``.to(dtype)``. Both end in one float32 sum rounded to dtype."""
    a = acc.to(tl.float32)
    if TORCHAO:
        y = _round(a * xs[:, None], DTYPE, EMULATE) * ws[None, :]
    else:
        y = _round(a * (xs[:, None] * ws[None, :]), DTYPE, EMULATE)
    if HAS_BIAS:
        y = y + _round(_widen(bias, EMULATE), DTYPE, EMULATE)[None, :]
    return _narrow(y, DTYPE, EMULATE)


@_jit
def _int8_epilogue_kernel(
    acc_ptr,
    xs_ptr,
    ws_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    HAS_BIAS: tl.constexpr,
    TORCHAO: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EMULATE: tl.constexpr,
):
    DTYPE = out_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m, in_n = rows < M, cols < N
    mask = in_m[:, None] & in_n[None, :]
    idx = rows[:, None] * N + cols[None, :]
    acc = tl.load(acc_ptr + idx, mask=mask, other=0)
    xs = tl.load(xs_ptr + rows, mask=in_m, other=1.0)
    ws = tl.load(ws_ptr + cols, mask=in_n, other=1.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=in_n, other=0.0)
    else:
        bias = ws
    tl.store(out_ptr + idx, _epilogue(acc, xs, ws, bias, HAS_BIAS, TORCHAO, DTYPE, EMULATE), mask=mask)


def _epilogue_args(m: int, n: int, x_scale, w_scale, bias, out_dtype, style: str, what: str) -> tuple:
    """x_scale [m], w_scale [n], bias [n] (or a stand-in) checked and flattened; whether there is a bias and
    which style."""
    if style not in STYLES:
        raise ValueError(f"{what}: style must be one of {STYLES}, got {style!r}")
    _check_dtype(out_dtype, what)
    if x_scale.dtype != torch.float32 or x_scale.numel() != m:
        raise ValueError(
            f"{what}: x_scale must be float32 [{m}, 1], got {x_scale.dtype}{list(x_scale.shape)}"
        )
    if w_scale.dtype != torch.float32 or w_scale.numel() != n:
        raise ValueError(f"{what}: w_scale must be float32 [{n}], got {w_scale.dtype}{list(w_scale.shape)}")
    if bias is not None and (
        bias.numel() != n or bias.dtype not in (torch.bfloat16, torch.float16, torch.float32)
    ):
        raise ValueError(f"{what}: bias must be a float [{n}], got {bias.dtype}{list(bias.shape)}")
    xs, ws = x_scale.reshape(-1).contiguous(), w_scale.reshape(-1).contiguous()
    b = ws if bias is None else bias.reshape(-1).contiguous()
    return xs, ws, b, bias is not None, style == "torchao"


def int8_epilogue(
    acc: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    style: str,
) -> torch.Tensor:
    """int32 `acc` [M, N] (``x_q @ w_q.t()``) scaled back to `out_dtype` in one pass, bit for bit the eager
    epilogue of `style` (`x_scale` float32 [M, 1], `w_scale` float32 [N] or [N, 1], `bias` [N] of any float
    dtype or None):

    - "comfy", ``ComfyInt8Linear.fast_forward``: ``y = acc.float().mul_(x_scale * w_scale.reshape(1,
      -1)).to(dtype)``, then ``y + bias.to(dtype)`` (in dtype);
    - "torchao", ``TorchaoInt8Linear.fast_forward``: ``y = (acc.float() * x_scale).to(dtype) *
      w_scale.reshape(-1)`` (float32), ``y + bias.to(dtype)`` (float32), ``.to(dtype)``.

    >>> acc = torch._int_mm(x_q, w_q.t())  # doctest: +SKIP
    >>> y = int8_epilogue(acc, x_scale, w_scale, bias, torch.bfloat16, "comfy")  # doctest: +SKIP
    """
    if acc.dim() != 2 or acc.dtype != torch.int32:
        raise ValueError(f"int8_epilogue takes an int32 [M, N] accumulator, got {acc.dtype}{list(acc.shape)}")
    _check_device(acc, "int8_epilogue")
    m, n = acc.shape
    xs, ws, b, has_bias, torchao = _epilogue_args(
        m, n, x_scale, w_scale, bias, out_dtype, style, "int8_epilogue"
    )
    out = torch.empty(m, n, dtype=out_dtype, device=acc.device)
    if m and n:
        bm, bn = _EPILOGUE_TILE
        _int8_epilogue_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            acc.contiguous(), xs, ws, b, out, m, n, HAS_BIAS=has_bias, TORCHAO=torchao,
            BLOCK_M=bm, BLOCK_N=bn, EMULATE=_EMULATE, num_warps=8, **_COMPILE,
        )  # fmt: skip
    return out


@_jit
def _int8_mm_kernel(
    a_ptr,
    b_ptr,
    xs_ptr,
    ws_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    TORCHAO: tl.constexpr,
    EMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out = epilogue(a [M, K] @ b [N, K]ᵀ), int32 accumulation; tiles grouped GROUP_M along M (L2 reuse)."""
    DTYPE = out_ptr.dtype.element_ty
    pid = tl.program_id(0)
    tiles_m, tiles_n = (M + BLOCK_M - 1) // BLOCK_M, (N + BLOCK_N - 1) // BLOCK_N
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # rows and columns past the end read rows M - 1, N - 1 again (no mask in the loop); their sums are dropped
    a_ptrs = a_ptr + (rows % M).to(tl.int64)[:, None] * K + ks[None, :]
    b_ptrs = b_ptr + (cols % N).to(tl.int64)[None, :] * K + ks[:, None]  # the stored [N, K] weight, as [K, N]
    acc = tl.full([BLOCK_M, BLOCK_N], 0, tl.int32)
    for k in range((K + BLOCK_K - 1) // BLOCK_K):
        left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=ks[None, :] < left, other=0)
        b = tl.load(b_ptrs, mask=ks[:, None] < left, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    in_m, in_n = rows < M, cols < N
    xs = tl.load(xs_ptr + rows, mask=in_m, other=1.0)
    ws = tl.load(ws_ptr + cols, mask=in_n, other=1.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=in_n, other=0.0)
    else:
        bias = ws
    y = _epilogue(acc, xs, ws, bias, HAS_BIAS, TORCHAO, DTYPE, EMULATE)
    out = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out, y, mask=in_m[:, None] & in_n[None, :])


#: Hopper (SM90) tiles for int8 tensor cores (wgmma): 128-wide K steps (128 bytes a row), 3-4 stages in its
#: 228 KB of shared memory (128-147 KB used, no spills: checked with ptxas); 64 x 128 for few rows
_MM_CONFIGS = (
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=4, num_warps=8),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_stages=3, num_warps=8),
    dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=3, num_warps=8),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_stages=4, num_warps=4),
)
#: what the interpreter runs (no autotuning there: it would time numpy)
_MM_INTERPRETED = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, GROUP_M=2)


@functools.cache
def _tuned_int8_mm():
    configs = [
        triton.Config(
            {k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
            num_stages=c["num_stages"],
            num_warps=c["num_warps"],
        )
        for c in _MM_CONFIGS
    ]
    # tuned once per shape and variant (the tensors' dtypes are part of the key too)
    return triton.autotune(configs=configs, key=["M", "N", "K", "HAS_BIAS", "TORCHAO"])(_int8_mm_kernel)


def int8_mm(
    x_q: torch.Tensor,
    w_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    style: str,
) -> torch.Tensor:
    """int8 `x_q` [M, K] times the stored int8 weight `w_q` [N, K] (read transposed in place, no copy), summed
    in int32 and scaled back by the epilogue of `style`, in one kernel: bit for bit
    ``int8_epilogue(torch._int_mm(x_q, w_q.t()), x_scale, w_scale, bias, out_dtype, style)`` (integer sums are
    exact in any order). Autotuned over a few Hopper tiles per (M, N, K) on CUDA.

    >>> y = int8_mm(*int8_rows(x), w_q, w_scale, bias, torch.bfloat16, "comfy")  # doctest: +SKIP
    """
    for name, t in (("x_q", x_q), ("w_q", w_q)):
        if t.dim() != 2 or t.dtype != torch.int8:
            raise ValueError(f"int8_mm: {name} must be int8 2-D, got {t.dtype}{list(t.shape)}")
    if x_q.shape[1] != w_q.shape[1]:
        raise ValueError(f"int8_mm: x_q {list(x_q.shape)} and w_q {list(w_q.shape)} differ in K")
    _check_device(x_q, "int8_mm")
    (m, k), n = x_q.shape, w_q.shape[0]
    xs, ws, b, has_bias, torchao = _epilogue_args(m, n, x_scale, w_scale, bias, out_dtype, style, "int8_mm")
    out = torch.empty(m, n, dtype=out_dtype, device=x_q.device)
    if not (m and n):
        return out
    args = (x_q.contiguous(), w_q.contiguous(), xs, ws, b, out, m, n, k)
    flags = dict(HAS_BIAS=has_bias, TORCHAO=torchao, EMULATE=_EMULATE, **_COMPILE)
    if _INTERPRET:
        c = _MM_INTERPRETED
        grid = (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]),)
        _int8_mm_kernel[grid](*args, **flags, **c)
    else:
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _tuned_int8_mm()[grid](*args, **flags)
    return out


# -- q8_0_decode ---------------------------------------------------------------------------------------------


@_jit
def _q8_0_kernel(
    blocks_ptr,
    out_ptr,
    total,
    VALUES: tl.constexpr,
    BYTES: tl.constexpr,
    BLOCKS: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """BLOCKS Q8_0 blocks a program: d from its 2 little-endian bytes, value = float32(d) · q, cast."""
    DTYPE = out_ptr.dtype.element_ty
    blk = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    ok = blk < total
    base = blocks_ptr + blk * BYTES
    lo = tl.load(base, mask=ok, other=0).to(tl.uint16)
    hi = tl.load(base + 1, mask=ok, other=0).to(tl.uint16)
    d = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
    j = tl.arange(0, VALUES)
    qs = tl.load(base[:, None] + 2 + j[None, :], mask=ok[:, None], other=0)
    v = qs.to(tl.int8, bitcast=True).to(tl.float32) * d[:, None]  # exact: 8 bits times 11
    tl.store(out_ptr + blk[:, None] * VALUES + j[None, :], _narrow(v, DTYPE, EMULATE), mask=ok[:, None])


def q8_0_decode(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """GGML Q8_0 rows (uint8 [rows, nblocks · 34]: per block a little-endian float16 d, then 32 int8 q)
    decoded to `dtype` [rows, nblocks · 32] in one pass, bit for bit
    ``quantize.formats._q8_0.dequantize(blocks).to(dtype)``: value = float32(d) · q (exact), cast to nearest
    even. A program decodes 128 blocks.

    >>> w = q8_0_decode(layer_blocks, torch.bfloat16)  # doctest: +SKIP
    """
    if blocks.dim() != 2 or blocks.dtype != torch.uint8 or blocks.shape[1] % _Q8_0_BYTES:
        raise ValueError(
            f"q8_0_decode takes uint8 rows of {_Q8_0_BYTES}-byte blocks, "
            f"got {blocks.dtype}{list(blocks.shape)}"
        )
    _check_dtype(dtype, "q8_0_decode")
    _check_device(blocks, "q8_0_decode")
    rows, nb = blocks.shape[0], blocks.shape[1] // _Q8_0_BYTES
    out = torch.empty(rows, nb * _Q8_0_BLOCK, dtype=dtype, device=blocks.device)
    total = rows * nb
    if total:
        _q8_0_kernel[(triton.cdiv(total, _Q8_0_BLOCKS),)](
            blocks.contiguous(),
            out,
            total,
            VALUES=_Q8_0_BLOCK,
            BYTES=_Q8_0_BYTES,
            BLOCKS=_Q8_0_BLOCKS,
            EMULATE=_EMULATE,
            num_warps=4,
            **_COMPILE,
        )
    return out
