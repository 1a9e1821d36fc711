"""Each quantized Linear's kernel against its exact emulation (loaders/emulation.py), on every device here.

The CPU's kernel and the GPU's are each held to the emulation within the bound written down there (the output
dtype's rounding at that magnitude, the accumulator's), never to each other: a failing case says which side is
wrong. Where a kernel does not run (an older torch's CPU, a GPU without it), `compute="kernel"` raises one line and
the test skips with that reason; `compute="fast"` decodes there, exactly as the eager reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import loaders.modules as modules
from loaders import (
    ComfyFP8Linear,
    ComfyW4a8Linear,
    Float8Linear,
    FP8Linear,
    GGUFLinear,
    Int8Linear,
    MXFP8Linear,
    NF4Linear,
    NVFP4Linear,
    TorchaoInt8Linear,
)
from loaders.emulation import FP8_FAST_SUM, FP32_SUM, ulp
from loaders.modules import KernelUnavailable
from quantize.formats import NO_OPTIONS, ComfyOptions, GgufOptions, get_format
from tests.conftest import skip_without_kernel

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
STATIC = get_format("comfy_fp8").calibrated(ComfyOptions("float8_e4m3fn"), 3.0)
KERNELS = [
    pytest.param(FP8Linear, NO_OPTIONS, id="fp8_channel"),
    pytest.param(ComfyFP8Linear, NO_OPTIONS, id="comfy_fp8"),
    pytest.param(ComfyFP8Linear, STATIC, id="comfy_fp8-static"),
    pytest.param(Int8Linear, NO_OPTIONS, id="comfy_int8"),
    pytest.param(Int8Linear, ComfyOptions("int8_convrot"), id="comfy_int8-convrot"),
    pytest.param(TorchaoInt8Linear, NO_OPTIONS, id="torchao_int8"),
    pytest.param(Float8Linear, NO_OPTIONS, id="torchao_fp8"),
    pytest.param(NF4Linear, NO_OPTIONS, id="nf4"),
    pytest.param(NVFP4Linear, NO_OPTIONS, id="comfy_nvfp4"),
    pytest.param(MXFP8Linear, NO_OPTIONS, id="comfy_mxfp8"),
    pytest.param(ComfyW4a8Linear, NO_OPTIONS, id="comfy_w4a8"),
    pytest.param(ComfyW4a8Linear, ComfyOptions("asym_w4a8_int8", convrot_group=64), id="comfy_w4a8-g64"),
]


def _layer(out: int, inp: int, rows: int, dtype: torch.dtype, seed: int = 0):
    """A weight [out, in] and bias of magnitudes spread over decades, an input [2, rows, in] with an all-zero row
    (its magnitudes within what torchao's int8 epilogue keeps finite in float16: it rounds the product scaled by the
    activations' scale alone to the output dtype, |x|·127·√K < 65504)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * torch.logspace(-2, 1, out).reshape(-1, 1)
    b = torch.randn(out, generator=g).to(dtype)
    x = torch.randn(2, rows, inp, generator=g) * torch.logspace(-3, 1, rows).reshape(1, -1, 1)
    x = x.to(dtype)
    x[0, rows // 2] = 0
    return w, b, x


def _on_gpu_the_kernel_must_run(cls, device: str) -> bool:
    """Where the GPU has the kernel: the float8 GEMMs from SM89 on, int8 from Turing on, bitsandbytes where it has
    its CUDA library, the block-scaled ones on Blackwell."""
    if device != "cuda":
        return False
    capability = torch.cuda.get_device_capability()
    if cls in (NVFP4Linear, MXFP8Linear):
        return capability >= (10, 0)
    if cls is NF4Linear:
        from loaders import bnb

        return bnb.cuda_problem() is None
    if cls in (Int8Linear, TorchaoInt8Linear, ComfyW4a8Linear):
        return True
    return capability >= (8, 9)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls, options", KERNELS)
def test_the_kernel_keeps_to_its_exact_emulation(cls, options, dtype, device):
    w, b, x = _layer(64, 256, 24, dtype)
    m = cls.from_weight(w, b, options, compute="kernel").to(device)
    x = x.to(device)
    if _on_gpu_the_kernel_must_run(cls, device) and (
        cls not in (NVFP4Linear, MXFP8Linear) or dtype != torch.float32
    ):
        assert m.kernel_problem(x) is None, m.kernel_problem(x)
    skip_without_kernel(m, x)
    got = m(x)
    assert got.dtype == dtype and got.shape == (2, 24, 64) and got.device == x.device
    emulation = m.emulate(x)
    emulation.check(got.cpu(), f"{cls.__name__} on {device} in {dtype}")
    if cls is not NF4Linear and dtype != torch.float32:  # not a bound anything passes: most elements are the
        # emulation rounded once to a half-precision output, the rest its neighbours
        exact = (got.cpu() == emulation.rounded().cpu()).float().mean()
        assert exact > (0.3 if emulation.accumulation is FP8_FAST_SUM else 0.8), float(exact)


@pytest.mark.parametrize("device", DEVICES)
def test_a_kernel_that_computes_something_else_leaves_the_bound(device):
    """A weight scale off by one part in 2⁸ (an ulp of bf16), a transposed product, activations quantized with a
    scale of another row: each is caught by the bound on every device, float32 output."""
    w, b, x = _layer(64, 256, 24, torch.float32)
    m = Int8Linear.from_weight(w, b, compute="kernel").to(device)
    x = x.to(device)
    skip_without_kernel(m, x)
    emulation, good = m.emulate(x), m(x).cpu()
    emulation.check(good, "the kernel")
    off_scale = good.double() * (1 + 2**-8)
    with pytest.raises(
        AssertionError, match=r"Int8Linear-scaled: element \d+ is .* the emulation .*x the bound"
    ):
        emulation.check(off_scale.float(), "Int8Linear-scaled")
    rolled = torch.roll(good, 1, dims=-1)
    with pytest.raises(AssertionError, match="x the bound"):
        emulation.check(rolled, "rolled")


def test_the_bound_is_the_output_rounding_plus_the_accumulation():
    """bf16 output at 1.5: one ulp is 2⁻⁷ (twice for two roundings); float32 accumulation of K products costs
    K·2⁻²⁴·Σ|ab|; Hopper's fast float8 accumulation 6√K·2⁻¹⁴·Σ|ab|."""
    assert float(ulp(torch.tensor([1.5], dtype=torch.float64), torch.bfloat16)) == 2**-7
    assert (
        float(ulp(torch.tensor([0.0], dtype=torch.float64), torch.bfloat16)) == 2.0**-133
    )  # subnormal spacing
    assert float(ulp(torch.tensor([3.0], dtype=torch.float64), torch.float32)) == 2**-22
    assert FP32_SUM.factor(256) == 256 * 2**-24
    assert FP8_FAST_SUM.factor(256) == 6 * 16 * 2**-14


class _ScaledWrong(FP8Linear):
    """A kernel that returns the right shape and dtype and the wrong numbers (a weight scale 1% off)."""

    def fast_forward(self, x):
        return super().fast_forward(x) * 1.01


class _Raising(ComfyFP8Linear):
    def fast_forward(self, x):
        raise RuntimeError("_scaled_mm only supports per-tensor scaling for CPU backend\nmore")


def test_the_probe_checks_the_kernels_result_and_kernel_raises_one_line_where_it_fails(monkeypatch):
    monkeypatch.setattr(modules.base, "_PROBED", {})  # the probe's cache, in the base module
    w, b, x = _layer(64, 128, 4, torch.float32)
    wrong = _ScaledWrong.from_weight(w, b, compute="kernel")
    skip_without_kernel(FP8Linear.from_weight(w, b, compute="kernel"), x)
    assert "leaves the exact emulation's bound" in wrong.kernel_problem(x)
    with pytest.raises(KernelUnavailable) as e:
        wrong(x)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("_ScaledWrong [64, 128] on cpu with torch.float32 input (torch ")
    assert "compute='fast' decodes the weight" in message
    fast = _ScaledWrong.from_weight(w, b, compute="fast")
    fast.KERNEL_ON_CPU = True  # "fast" would take the kernel here, if it kept to its emulation
    assert not fast.uses_fast_path(x) and torch.equal(fast(x), F.linear(x, fast.dequantize(), b))

    raising = _Raising.from_weight(w, b, compute="kernel")
    with pytest.raises(
        KernelUnavailable,
        match=r"RuntimeError: _scaled_mm only supports per-tensor scaling for CPU backend; ",
    ):
        raising(x)


@pytest.mark.parametrize(
    "cls, shape, dtype, missing",
    [
        (
            FP8Linear,
            (40, 24),
            torch.bfloat16,
            r"float8 _scaled_mm needs both dims multiples of 16, the layer is \[40, 24\]",
        ),
        (ComfyFP8Linear, (48, 24), torch.bfloat16, "needs both dims multiples of 16"),
        (
            NVFP4Linear,
            (64, 128),
            torch.bfloat16,
            r"block-scaled nvfp4 _scaled_mm needs a Blackwell GPU \(SM100\+\)",
        ),
        (MXFP8Linear, (64, 128), torch.float32, "the block-scaled kernel takes bf16 or fp16 inputs"),
        (
            Int8Linear,
            (64, 128),
            torch.float64,
            "the kernel takes torch.bfloat16, torch.float16, torch.float32 inputs",
        ),
    ],
)
def test_kernel_where_it_cannot_run_is_one_line_and_fast_decodes(cls, shape, dtype, missing):
    w, b, x = _layer(*shape, 4, torch.float32)
    x = x.to(dtype)
    with pytest.raises(KernelUnavailable, match=missing) as e:
        cls.from_weight(w, b, compute="kernel")(x)
    assert "\n" not in str(e.value) and str(e.value).startswith(
        f"{cls.__name__} [{shape[0]}, {shape[1]}] on cpu"
    )
    fast = cls.from_weight(w, b)
    assert not fast.uses_fast_path(x)
    assert torch.equal(fast(x), F.linear(x, fast.dequantize(dtype), b.to(dtype)))


def test_gguf_has_no_kernel_to_miss():
    """GGUF decodes for every call: "kernel" computes what "fast" and "dequantize" do, and raises nothing."""
    w, b, x = _layer(32, 256, 4, torch.bfloat16)
    m = GGUFLinear.from_weight(w, b, GgufOptions("Q8_0"), compute="kernel")
    assert not m.uses_fast_path(x)
    assert torch.equal(m(x), F.linear(x, m.dequantize(torch.bfloat16), b))
