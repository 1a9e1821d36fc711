"""Each kernel's exact emulation, and the bound a correct kernel's output keeps to it.

A quantized Linear's kernel computes ``y = round_out(s_x s_w Σ_i a_i b_i + bias)``: the activations `a`
quantized as that kernel quantizes them (per row, per tensor, in blocks), the stored weight `b`, both scales, the
bias, with sums in the kernel's accumulator and a rounding to the output dtype at the end. The emulation computes
the same thing with the operands decoded exactly (an e4m3 or int8 value times a float32 scale is exact in float64)
and the products summed in float64: `value`, the number a perfect kernel would round. A real kernel differs from it
by at most (`Emulation.bound`):

* **the rounding to the output**: ulp(|value|) + ulp(|value - bias|) of the output dtype (`ulp` below, subnormal
  spacing included): a kernel rounds its result once (half an ulp), and the int8 epilogues of comfy-kitchen and
  torchao round the unbiased or half-scaled product to the output dtype before the bias or the weight scale is
  applied (a relative error below the dtype's unit roundoff, itself below one ulp);
* **the accumulation**: ``c · u · Σ_i |a_i b_i| s_x s_w`` (`magnitude`), where the sum of K products kept in a
  floating accumulator of unit roundoff u loses at most γ_K ≈ K·u of the sum of magnitudes (Higham, *Accuracy and
  Stability of Numerical Algorithms*, §3.1): c = K and u = 2⁻²⁴ for float32 accumulation (the CPU, cuBLAS without
  fast accumulation, bitsandbytes). Hopper's FP8 tensor cores with fast accumulation keep about 14 bits of the
  running sum (DeepSeek-V3 technical report, §3.3.2): u = 2⁻¹⁴ there, with the probabilistic constant c = λ√K,
  λ = 6 (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019: the bound fails with probability below 2·exp(-λ²/2)
  ≈ 3·10⁻⁸ an element), since the deterministic K·2⁻¹⁴ would exceed |y| itself and prove nothing. int8 products
  are summed exactly in int32; their float32 epilogue (the int32 sum widened, the scales multiplied) costs c = 4,
  u = 2⁻²⁴. cuBLAS's bf16 GEMMs on CUDA (bitsandbytes' NF4 product) may reduce split-K partial sums in bf16
  (torch's ``allow_bf16_reduced_precision_reduction``, on by default; cuBLAS splits K where the output has few
  tiles, as a probe's has): u = 2⁻⁸ there, with λ√K. Measured on an H200: bitsandbytes' product of 16 x 128 by
  128 x 64 left the float32-accumulation bound 32-fold (docs/BENCHMARKS.md, the GPU check).

So a kernel whose output leaves the bound computes something else (a wrong scale, a different quantization of
the activations, a transposed operand), and a failing test says which side is wrong: the CPU's kernel and the
GPU's are each held to the emulation, never to each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

__all__ = [
    "Accumulation",
    "Emulation",
    "FP32_SUM",
    "INT32_SUM",
    "FP8_FAST_SUM",
    "BF16_REDUCED_SUM",
    "emulate_product",
    "ulp",
]


@dataclass(frozen=True)
class Accumulation:
    """How a kernel sums its K products: unit roundoff `u` and whether the constant is √K (probabilistic) or K."""

    name: str
    u: float
    probabilistic: bool = False
    constant: float | None = None  # a fixed c (the int8 epilogue), else K or λ√K

    def factor(self, k: int) -> float:
        if self.constant is not None:
            return self.constant * self.u
        return (6.0 * math.sqrt(k) if self.probabilistic else float(k)) * self.u


FP32_SUM = Accumulation("float32", 2.0**-24)
INT32_SUM = Accumulation("int32, float32 epilogue", 2.0**-24, constant=4.0)
FP8_FAST_SUM = Accumulation("Hopper fp8 fast accumulation", 2.0**-14, probabilistic=True)
BF16_REDUCED_SUM = Accumulation("cuBLAS bf16 GEMM, split-K partial sums in bf16", 2.0**-8, probabilistic=True)


def ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype`'s numbers at |magnitude| (float64), down to its subnormal spacing."""
    info = torch.finfo(dtype)
    mantissa = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}[dtype]
    tiny = info.tiny * 2.0**-mantissa  # the subnormal spacing
    exponent = torch.floor(torch.log2(magnitude.abs().clamp(min=info.tiny)))
    return torch.maximum(torch.exp2(exponent - mantissa), torch.full_like(magnitude, tiny))


@dataclass(frozen=True)
class Emulation:
    """A kernel's result before its one rounding (`value`, float64), with what bounds a real kernel's error."""

    value: torch.Tensor  # s_x s_w Σ a b + bias, [..., out]
    magnitude: torch.Tensor  # s_x s_w Σ |a b|
    unbiased: torch.Tensor  # value - bias
    k: int
    out_dtype: torch.dtype
    accumulation: Accumulation

    def reshaped(self, shape: tuple[int, ...]) -> Emulation:
        """The same emulation with its elements in `shape` (a layer's input's leading dims, its outputs)."""
        return replace(
            self,
            value=self.value.reshape(shape),
            magnitude=self.magnitude.reshape(shape),
            unbiased=self.unbiased.reshape(shape),
        )

    def rounded(self) -> torch.Tensor:
        """The value rounded once to the output dtype: what an exact kernel returns."""
        return self.value.to(self.out_dtype)

    def bound(self) -> torch.Tensor:
        """The most a correct kernel's element may differ from `value` (module docstring)."""
        out = ulp(self.value, self.out_dtype) + ulp(self.unbiased, self.out_dtype)
        return out + self.accumulation.factor(self.k) * self.magnitude

    def excess(self, got: torch.Tensor) -> float:
        """max |got - value| / bound: at most 1 for a kernel that computes what the emulation says. Where the
        emulation is NaN (an input the kernel's own quantizer divides by zero: torchao's float8 on an all-zero row),
        the kernel's element must be NaN too; elsewhere a non-finite element is out of bounds."""
        got = got.to(self.value.device, torch.float64).reshape(self.value.shape)
        nan = torch.isnan(self.value)
        if not bool(torch.isnan(got[nan]).all()) or not bool(torch.isfinite(got[~nan]).all()):
            return math.inf
        err = (got - self.value).abs()[~nan]
        return float((err / self.bound()[~nan]).max()) if err.numel() else 0.0

    def check(self, got: torch.Tensor, what: str) -> None:
        """Raise AssertionError naming `what` and the worst element where `got` leaves the bound."""
        excess = self.excess(got)
        if excess > 1.0:
            got = got.to(self.value.device, torch.float64).reshape(self.value.shape)
            err = (got - self.value).abs() / self.bound()
            err = torch.where(torch.isnan(self.value) & torch.isnan(got), 0.0, err)
            worst = int(err.nan_to_num(nan=math.inf).reshape(-1).argmax())
            raise AssertionError(
                f"{what}: element {worst} is {float(got.reshape(-1)[worst]):.9g}, the emulation "
                f"{float(self.value.reshape(-1)[worst]):.9g} ± {float(self.bound().reshape(-1)[worst]):.3g} "
                f"({excess:.3g}x the bound; {self.accumulation.name} accumulation, {self.out_dtype} output)"
            )


def emulate_product(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    accumulation: Accumulation,
) -> Emulation:
    """The emulation of ``a @ b.T + bias`` for exactly decoded operands `a` [M, K] and `b` [N, K] (scales
    included), summed in float64."""
    a, b = a.double(), b.double()
    unbiased = a @ b.T
    value = unbiased if bias is None else unbiased + bias.double()
    return Emulation(value, a.abs() @ b.abs().T, unbiased, a.shape[1], out_dtype, accumulation)
