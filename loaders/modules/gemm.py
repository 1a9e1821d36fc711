"""The GEMMs the schemes share, and what each needs of a layer and its input.

float8: `torch._scaled_mm` with the bias fused (added after where CUDA refuses it), row-wise or tensor-wise scales
(the tensor-wise call the one comfy-kitchen makes), fast accumulation on CUDA; int8: `torch._int_mm` padded to what
cuBLASLt takes, and on CUDA the fused product `INT8_GEMM` chooses; the block-scaled (NVFP4, MXFP8) `_scaled_mm`'s
needs. Kept apart from the schemes because several call each (fp8_channel and comfy_fp8, comfy_int8 and
torchao_int8, comfy_nvfp4 and comfy_mxfp8), so that one change reaches both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import fused
from ..emulation import FP8_FAST_SUM, FP32_SUM, Accumulation
from .base import QuantizedLinear


def _fp8_problem(layer: QuantizedLinear, x: torch.Tensor) -> str | None:
    """What the float8 `_scaled_mm` needs of a layer and its input: dims multiples of 16, a float input."""
    if layer.in_features % 16 or layer.out_features % 16:
        return f"float8 _scaled_mm needs both dims multiples of 16, the layer is [{layer.out_features}, {layer.in_features}]"
    return QuantizedLinear.static_problem(layer, x)


def _fast_accumulation(device: torch.device) -> bool:
    """Whether the float8 GEMMs accumulate fast: on CUDA (Hopper's FP8 tensor cores keep about 14 bits of the sum
    there, the price of twice bf16's rate, as torchao's inference kernels pay it); the CPU ignores the flag."""
    return device.type == "cuda"


def _fp8_accumulation(device: torch.device) -> Accumulation:
    return FP8_FAST_SUM if _fast_accumulation(device) else FP32_SUM


def _scaled_mm_with_bias(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`torch._scaled_mm` with the bias fused, but on CUDA with a float32 output, which refuses a bias ("Bias is
    not supported when out_dtype is set to Float32"): there it is added after, as torchao does. Fast accumulation
    on CUDA (`_fast_accumulation`)."""
    bias = None if bias is None else bias.to(out_dtype)
    fused_bias = bias is None or not (a.is_cuda and out_dtype == torch.float32)
    fast = _fast_accumulation(a.device)
    kw = dict(scale_a=scale_a, scale_b=scale_b, bias=bias if fused_bias else None, out_dtype=out_dtype)
    if scale_a.dim() == 0 and scale_b.dim() == 0:
        y = _tensorwise_scaled_mm(a, b, use_fast_accum=fast, **kw)
    else:
        y = torch._scaled_mm(a, b, use_fast_accum=fast, **kw)
    return y if fused_bias else y + bias


def _tensorwise_scaled_mm(a, b, *, scale_a, scale_b, bias, out_dtype, use_fast_accum=False) -> torch.Tensor:
    """One scale per operand, the op comfy-kitchen's `TensorCoreFP8Layout` linear calls (reference:
    ``comfy_kitchen.scaled_mm_v2.scaled_mm_v2``): `F.scaled_mm` with tensor-wise recipes where torch has it (2.10
    on), else `torch._scaled_mm`. The two are separate kernels that may sum in another order on some CPUs, so the
    float32 outputs agree with ComfyUI's bit for bit only through the same one."""
    if not hasattr(F, "scaled_mm"):
        return torch._scaled_mm(
            a,
            b,
            scale_a=scale_a,
            scale_b=scale_b,
            bias=bias,
            out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )
    tensorwise = F.ScalingType.TensorWise
    return F.scaled_mm(
        a,
        b,
        scale_a=scale_a,
        scale_recipe_a=tensorwise,
        scale_b=scale_b,
        scale_recipe_b=tensorwise,
        bias=bias,
        output_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
    )


#: how the fused int8 paths multiply on CUDA: "triton" (`fused.int8_mm`: the GEMM with the epilogue in it, the
#: int32 sums never written) or "int_mm" (cuBLASLt's `torch._int_mm`, then `fused.int8_epilogue` in one pass over
#: the int32 sums). Bit for bit the same numbers; `make gpu-check` times both: on an H200 at Wan 14B's shapes,
#: 0.98-1.03x bf16 against 1.09-1.23x (docs/BENCHMARKS.md)
INT8_GEMM = "triton"


def _int8_product(x_q, weight, x_scale, w_scale, bias, out_dtype, style: str) -> torch.Tensor:
    """The fused int8 product of `style`'s epilogue, by the GEMM `INT8_GEMM` names."""
    if INT8_GEMM == "triton":
        return fused.int8_mm(x_q, weight, x_scale, w_scale, bias, out_dtype, style)
    return fused.int8_epilogue(int_mm(x_q, weight.t()), x_scale, w_scale, bias, out_dtype, style)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int32 [m, n] = int8 a [m, k] @ int8 b [k, n] by `torch._int_mm`; on CUDA, the rows and the inner dim are
    padded with zeros to what cuBLASLt takes (m > 16 and a multiple of 8, k and n multiples of 8), which changes
    no sum."""
    if a.device.type != "cuda":
        return torch._int_mm(a, b)
    m, k = a.shape
    n = b.shape[1]
    pm, pk, pn = max(32, -(-m // 8) * 8), -(-k // 8) * 8, -(-n // 8) * 8
    if (pm, pk) != (m, k):
        a = F.pad(a, (0, pk - k, 0, pm - m))
    if (pk, pn) != (k, n):  # padded as the [n, k] weight, then viewed back: b stays column-major (cuBLASLt's)
        b = F.pad(b.t(), (0, pk - k, 0, pn - n)).t()
    return torch._int_mm(a, b)[:m, :n]


def _block_scaled_problem(layer: QuantizedLinear, x: torch.Tensor, layout: str) -> str | None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return "the block-scaled kernel takes bf16 or fp16 inputs"
    if layer.in_features % 32:
        return (
            f"the block-scaled kernel needs in_features a multiple of 32, the layer has {layer.in_features}"
        )
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) < (10, 0):
        return f"block-scaled {layout} _scaled_mm needs a Blackwell GPU (SM100+)"
    return None
