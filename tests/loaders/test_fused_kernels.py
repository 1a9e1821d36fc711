"""The fused Triton kernels of `loaders.fused` against their eager references, bit for bit (`torch.equal` on
the bytes): on the CPU through Triton's interpreter, and on CUDA (marked gpu).

Without a GPU, TRITON_INTERPRET=1 is set while this module's tests run (a fixture), not for the session:
`loaders.modules` asks `fused.available(device)` on every call, and the suite's other CPU Linears must not run
interpreted. The kernels are built on first use, here, so interpreted."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from loaders import fused, modules
from quantize.formats import _q8_0, comfy_fp8, comfy_int8, fp8_channel, torchao_int8

# float16 overflows to inf where the references do (a static scale far below the values, torchao's epilogue on
# sums past 65504 · scale); numpy, which runs the interpreter's casts, says so
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

_INTERPRETED = not torch.cuda.is_available()  # no GPU: the kernels run in Triton's interpreter
DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not _INTERPRETED, reason="with a GPU the kernels are compiled, not interpreted on the CPU"
        ),
    ),
    pytest.param("cuda", marks=pytest.mark.gpu),
]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
#: rows x features: K a power of two or not, one wider than 8192 (the rows stay few: the interpreter is slow)
SHAPES = [(5, 96), (3, 320), (2, 13824)]


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """TRITON_INTERPRET=1 while this module's tests run, where there is no GPU; as it was afterwards."""
    if not _INTERPRETED:
        yield
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers of its item size: equal bits, -0.0 and NaN payloads included."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same(got, want, what: str = "") -> None:
    """Each tensor of `got` has the dtype, shape and bits of the one of `want` at its place."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (
            f"{what} output {i}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
        )
        differ = bits(g.cpu()) != bits(w.cpu())
        first = differ.nonzero()[0].tolist() if differ.any() else None
        assert first is None, (
            f"{what} output {i}: {int(differ.sum())} of {g.numel()} differ, the first at {first}"
        )


def activations(shape, dtype, device, seed=0) -> torch.Tensor:
    """randn rows, each times 10**e (e in [-6, 3]: fp16 subnormals to large values), the second all zeros."""
    g = torch.Generator().manual_seed(seed)
    rows, k = shape
    x = torch.randn(rows, k, generator=g) * 10.0 ** torch.randint(-6, 4, (rows, 1), generator=g).float()
    x[min(1, rows - 1)] = 0
    return x.to(dtype).to(device)


def tie_rows(
    top: float, points: torch.Tensor, k: int, exponents: tuple[int, ...], dtype, device
) -> torch.Tensor:
    """A row of k values per e in `exponents`, 2**e · (top, then `points` cycled from the row's own start,
    signs alternating): top being the maximum, the scale is 2**e (exactly where the reference divides exactly,
    on the CPU; CUDA's reciprocal may miss by an ulp in float32) and x / scale lands on `points`."""
    signs = torch.where(torch.arange(k - 1) % 2 == 0, 1.0, -1.0)
    rows = []
    for r, e in enumerate(exponents):
        cycled = points[(torch.arange(k - 1) + 37 * r) % len(points)]
        rows.append(torch.cat([torch.tensor([top]), cycled * signs]) * 2.0**e)
    return torch.stack(rows).to(dtype).to(device)


#: the halves from -126.5 to 126.5: round half to even decides each
HALVES = torch.arange(-127, 127).double() + 0.5
#: the midpoints of consecutive positive float8_e4m3fn values (subnormals included): the cast's ties
_E4M3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
E4M3_MIDPOINTS = (_E4M3[:-1] + _E4M3[1:]) / 2


# -- the activation quantizers -------------------------------------------------------------------------------

#: each kernel and its reference: the format's own quantizer, which the module's eager path calls
ROW_QUANTIZERS = {
    "fp8_rows": (fused.fp8_rows, fp8_channel.quantize_rows),
    "fp8_tensor": (fused.fp8_tensor, comfy_fp8.quantize_tensor),
    "int8_rows": (fused.int8_rows, comfy_int8.quantize_rows),
    "int8_rows_torchao": (fused.int8_rows_torchao, torchao_int8.quantize_rows),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", ROW_QUANTIZERS)
def test_quantizer_equals_its_reference(name, shape, dtype, device):
    kernel, reference = ROW_QUANTIZERS[name]
    x = activations(shape, dtype, device, seed=shape[1])
    assert_same(kernel(x), reference(x))


#: per quantizer, the row maximum that makes its scale a power of two, and the points x / scale is to land on
TIES = {
    "fp8_rows": (448.0, E4M3_MIDPOINTS),
    "fp8_tensor": (448.0, E4M3_MIDPOINTS),
    "int8_rows": (127.0, HALVES),
    "int8_rows_torchao": (127.5, HALVES),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ROW_QUANTIZERS)
def test_quantizer_rounds_ties_as_its_reference(name, dtype, device):
    """Values landing exactly halfway (int8: on .5, float8: between two e4m3 values) after the scaling."""
    kernel, reference = ROW_QUANTIZERS[name]
    top, points = TIES[name]
    exponents = (3, 3) if name == "fp8_tensor" else (-4, 3)  # one scale for the whole tensor
    x = tie_rows(top, points, 320, exponents, dtype, device)
    scaled = x.double() * (top / x.double().abs().amax(1, keepdim=True))  # x / scale: times 2**-e, exact
    assert torch.isin(scaled.abs(), points.abs().to(device)).sum() == 2 * 319  # the rows do hold ties
    assert_same(kernel(x), reference(x), name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_tensor_with_a_static_scale_and_zeros(dtype, device):
    x = activations((3, 320), dtype, device)
    for scale in (0.37, 1e-3):  # 1e-3: most values past ±448 · scale, clamped
        static = torch.tensor(scale, device=device)
        got, want = fused.fp8_tensor(x, static), comfy_fp8.quantize_tensor(x, static)
        assert got[1] is static
        assert_same(got, want)
    zeros = torch.zeros(2, 96, dtype=dtype, device=device)  # scale 0 -> 1
    assert_same(fused.fp8_tensor(zeros), comfy_fp8.quantize_tensor(zeros))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_loops_over_chunks_equal_the_references(dtype, device, monkeypatch):
    """Rows wider than a block (read in chunks, twice) and a per-tensor maximum over several programs of
    several steps each: the launch sizes shrunk so that small tensors reach those loops."""
    monkeypatch.setattr(fused, "_ROW_BLOCK_MAX", 64)  # 200 = 3 chunks of 64 and one of 8
    monkeypatch.setattr(fused, "_AMAX_BLOCK", 64)  # 400 values = 7 blocks: 2 programs of 4 steps
    monkeypatch.setattr(fused, "_MAX_PARTIALS", 2)
    monkeypatch.setattr(fused, "_ELEMENTS", 128)  # 4 programs in the second pass
    x = activations((2, 200), dtype, device, seed=1)
    x[1, 195] = x.abs().amax() * 2  # the maximum in the last chunk and the last block
    for name, (kernel, reference) in ROW_QUANTIZERS.items():
        assert_same(kernel(x), reference(x), name)


# -- the int8 epilogue and GEMM ------------------------------------------------------------------------------


def eager_epilogue(acc, x_scale, w_scale, bias, dtype, style):
    """The two eager epilogues, as `Int8Linear.fast_forward` ("comfy") and `TorchaoInt8Linear.fast_forward`
    ("torchao") write them (the module tests below hold the kernels to those methods themselves)."""
    if style == "comfy":
        y = acc.float().mul_(x_scale * w_scale.reshape(1, -1)).to(dtype)
        return y if bias is None else y + bias.to(dtype)
    y = (acc.float() * x_scale).to(dtype) * w_scale.reshape(-1)
    if bias is not None:
        y = y + bias.to(dtype)
    return y.to(dtype)


def int8_problem(m, k, n, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x_q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    x_scale = torch.rand(m, 1, generator=g) * 1e-3 + 1e-4
    w_scale = torch.rand(n, 1, generator=g) * 1e-3 + 1e-4  # torchao's [N, 1]; comfy's scale is read flat too
    return [t.to(device) for t in (x_q, w_q, x_scale, w_scale)]


#: the bias of each output dtype's case: another dtype (rounded to the output's), or none
BIASES = {torch.bfloat16: torch.float32, torch.float16: None, torch.float32: torch.bfloat16}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", fused.STYLES)
def test_int8_epilogue_equals_the_eager_one(style, dtype, device):
    x_q, w_q, x_scale, w_scale = int8_problem(19, 96, 300, device)
    acc = modules.int_mm(x_q, w_q.t())
    # sums float32 rounds (past 2**24) and the extremes of int32
    acc[0, :6] = torch.tensor(
        [2**24 + 1, 2**30 + 3, -(2**31), 2**31 - 1, 16777219, -33554435], dtype=torch.int32
    )
    g = torch.Generator().manual_seed(1)
    bias_dtype = BIASES[dtype]
    bias = None if bias_dtype is None else (torch.randn(300, generator=g) * 4).to(bias_dtype).to(device)
    got = fused.int8_epilogue(acc, x_scale, w_scale, bias, dtype, style)
    assert_same([got], [eager_epilogue(acc, x_scale, w_scale, bias, dtype, style)])


#: M, K, N: rows past a tile and not a multiple of one, K not a multiple of BLOCK_K (128); one K, so that CUDA
#: compiles each config once per dtype, style and bias (K is a constexpr) and autotunes the shapes
MM_SHAPES = [(5, 320, 40), (33, 320, 72)]
MM_SHAPES_CUDA = [(300, 320, 384), (1, 320, 16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", fused.STYLES)
def test_int8_mm_equals_int_mm_then_the_epilogue(style, dtype, device):
    for i, (m, k, n) in enumerate(MM_SHAPES + (MM_SHAPES_CUDA if device == "cuda" else [])):
        x_q, w_q, x_scale, w_scale = int8_problem(m, k, n, device, seed=i)
        bias = torch.randn(n).to(torch.bfloat16).to(device) if i % 2 else None
        want = eager_epilogue(modules.int_mm(x_q, w_q.t()), x_scale, w_scale, bias, dtype, style)
        assert_same([fused.int8_mm(x_q, w_q, x_scale, w_scale, bias, dtype, style)], [want])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", [modules.Int8Linear, modules.TorchaoInt8Linear], ids=lambda c: c.__name__)
def test_the_fused_quantizer_and_epilogue_equal_the_module(cls, dtype, device):
    """The fused pieces composed as the module's fast path does, against its own eager code (`fast_forward`
    with the kernels off): the quantizer, `int_mm`, the epilogue; and `int8_mm` in place of the last two."""
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(48, 320, generator=g), torch.randn(48, generator=g)
    layer = cls.from_weight(w, b.to(dtype)).to(device)
    x = activations((3, 320), dtype, device, seed=3)
    with pytest.MonkeyPatch.context() as mp:  # the module's own eager arithmetic
        mp.setattr(fused, "available", lambda device: False)
        want = layer.fast_forward(x)
    comfy = cls is modules.Int8Linear
    parts = (comfy_int8.WEIGHT, comfy_int8.SCALE) if comfy else (torchao_int8.QDATA, torchao_int8.SCALE)
    weight, scale = (layer.stored()[part] for part in parts)
    x_q, x_scale = (fused.int8_rows if comfy else fused.int8_rows_torchao)(x)
    style = "comfy" if comfy else "torchao"
    got = fused.int8_epilogue(modules.int_mm(x_q, weight.t()), x_scale, scale, layer.bias, dtype, style)
    assert_same([got], [want])
    assert_same([fused.int8_mm(x_q, weight, x_scale, scale, layer.bias, dtype, style)], [want])


# -- Q8_0 decoding -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_q8_0_decode_equals_the_format_s(dtype, device):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(7, 96, generator=g) * 10.0 ** torch.randint(-6, 4, (7, 1), generator=g).float()
    blocks = _q8_0.quantize(w).view(7, 3, 34)
    # d set by hand: a bf16 tie (1 + 2**-8, times odd q), a float16 subnormal, zero, a negative one
    for j, d in enumerate([1 + 2**-8, 2.0**-20, 0.0, -3.5]):
        blocks[j, 0, :2] = torch.tensor([d], dtype=torch.float16).view(torch.uint8)
    blocks = blocks.reshape(7, 102).to(device)
    got = fused.q8_0_decode(blocks, dtype)
    assert_same([got], [_q8_0.dequantize(blocks).to(dtype)])


# -- the exact casts the interpreter runs in place of its own ------------------------------------------------


def cast_inputs() -> torch.Tensor:
    """float32 values around every bfloat16 (each bf16's bits with the low half 0, 0x7FFF, 0x8000 (a tie),
    0x8001), NaN left out; values spread over float8's range (its subnormals to past 448); float8's ties."""
    hi = torch.arange(1 << 16, dtype=torch.int64) << 16
    around = torch.cat([hi | low for low in (0, 0x7FFF, 0x8000, 0x8001)]).to(torch.int32).view(torch.float32)
    g = torch.Generator().manual_seed(5)
    spread = torch.exp2(torch.rand(1 << 16, generator=g) * 22 - 12) * torch.where(
        torch.rand(1 << 16, generator=g) < 0.5, -1.0, 1.0
    )
    ties = torch.cat([E4M3_MIDPOINTS, -E4M3_MIDPOINTS]).float()
    values = torch.cat([around, spread, ties])
    return values[~values.isnan()]


#: triton.language once the kernels are built (`casts_kernel` makes `_casts` a Triton function then)
tl = None


def _casts(v_ptr, bf16_ptr, f8_ptr, n, BLOCK: tl.constexpr, EMULATE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(v_ptr + offs, mask=offs < n)
    tl.store(bf16_ptr + offs, fused._narrow(v, tl.bfloat16, EMULATE), mask=offs < n)
    tl.store(
        f8_ptr + offs, fused._e4m3_bits(tl.minimum(tl.maximum(v, -448.0), 448.0), EMULATE), mask=offs < n
    )


@functools.cache
def casts_kernel():
    """`_casts` as a Triton function, built as the kernels are (interpreted here without a GPU)."""
    global tl
    assert fused._build()
    tl = fused.tl
    return fused.triton.jit(_casts)


@pytest.mark.parametrize("device", DEVICES)
def test_the_exact_casts_equal_torch_s(device):
    """`_narrow` to bfloat16 and `_e4m3_bits`, with EMULATE (what the interpreter runs; compiled too on CUDA)
    and without (the hardware's casts: compiled only, the interpreter's own being what EMULATE replaces)."""
    v = cast_inputs().to(device)
    n = v.numel()
    block = 1024 if device == "cuda" else 1 << 19  # the interpreter: one program
    want = [v.to(torch.bfloat16), v.clamp(-448, 448).to(torch.float8_e4m3fn)]
    for emulate in (True, False) if device == "cuda" else (True,):
        bf16 = torch.empty(n, dtype=torch.bfloat16, device=device)
        f8 = torch.empty(n, dtype=torch.float8_e4m3fn, device=device)
        casts_kernel()[(-(-n // block),)](v, bf16, f8.view(torch.uint8), n, BLOCK=block, EMULATE=emulate)
        assert_same([bf16, f8], want, f"EMULATE={emulate}")


# -- the surface ---------------------------------------------------------------------------------------------


def test_available_says_where_the_kernels_run():
    assert fused.available("meta") is False
    assert fused.available("cpu") is _INTERPRETED
    assert fused.available("cuda") is (not _INTERPRETED)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_are_refused_naming_what_is_wrong(device):
    x = torch.zeros(2, 3, 32, device=device)
    with pytest.raises(ValueError, match=r"2-D activations \[rows, features\], got shape \[2, 3, 32\]"):
        fused.fp8_rows(x)
    with pytest.raises(ValueError, match="bfloat16, float16 or float32, got torch.float64"):
        fused.int8_rows(torch.zeros(2, 32, dtype=torch.float64, device=device))
    acc = torch.zeros(2, 4, dtype=torch.int32, device=device)
    ones = torch.ones(2, 1, device=device), torch.ones(4, device=device)
    with pytest.raises(ValueError, match=r"style must be one of \('comfy', 'torchao'\), got 'ao'"):
        fused.int8_epilogue(acc, *ones, None, torch.bfloat16, "ao")
    with pytest.raises(ValueError, match="uint8 rows of 34-byte blocks"):
        fused.q8_0_decode(torch.zeros(2, 33, dtype=torch.uint8, device=device), torch.bfloat16)
