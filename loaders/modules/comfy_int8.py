"""`comfy_int8` at run time: `ComfyInt8Linear`, ComfyUI's W8A8 int8 (ConvRot's rotated layout too).

Its kernel is comfy-kitchen's eager ``int8_linear``: the activations quantized per row to int8, `torch._int_mm`,
both scales applied in float32; on CUDA the fused passes of `loaders/fused.py`.
"""

from __future__ import annotations

import torch

from quantize.formats import comfy_int8

from .. import fused
from ..emulation import INT32_SUM, Accumulation
from .base import QuantizedLinear, _decoded, _rows
from .gemm import _int8_product, int_mm


class ComfyInt8Linear(QuantizedLinear):
    """`comfy_int8`: int8 weight, one float32 scale per output row; W8A8.

    Fast path, comfy-kitchen's eager ``int8_linear`` (what ComfyUI calls for a `TensorWiseINT8Layout` weight;
    bit for bit on the CPU, tested): the activations of the call are quantized per row to int8
    (`comfy_int8.quantize_rows`; ConvRot: rotated first, `comfy_int8.rotate_activations`), multiplied by
    `torch._int_mm` with int32 accumulation, and scaled back in float32 by the product of both scales, cast to
    the input's dtype, then the bias added in it. Runs wherever `torch._int_mm` does (the CPU;
    CUDA GPUs from Turing on, rows padded to what cuBLASLt takes). On CUDA the quantization and the epilogue are
    one fused pass each (`fused.int8_rows`, `fused.int8_epilogue`: bit for bit the eager ones).
    """

    FORMAT = comfy_int8.FORMAT

    def accumulation(self, device: torch.device) -> Accumulation:
        return INT32_SUM

    def _input_rows(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, self.in_features).contiguous()
        own = self.FORMAT.layout(self.options)
        if own.convrot:  # X·Wᵀ = (X·H)·(W·H)ᵀ: the stored weight is W·H
            rows = comfy_int8.rotate_activations(rows, own.group)
        return rows

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self.part(comfy_int8.WEIGHT), self.part(comfy_int8.SCALE)
        return int8_linear(x, self._input_rows(x), weight, scale, self.bias)

    def kernel_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = comfy_int8.quantize_rows(self._input_rows(x))
        weight, scale = self.part(comfy_int8.WEIGHT), self.part(comfy_int8.SCALE)
        return _decoded(x_q, x_scale), _decoded(weight, scale.reshape(-1, 1))


def int8_linear(
    x: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """comfy-kitchen's eager ``int8_linear`` of `x`'s 2-D `rows` (already rotated where the layout rotates) by an
    int8 `weight` [out, in] with one float32 `scale` per output row: the rows quantized per row to int8,
    `torch._int_mm`, both scales in float32, cast to x's dtype, then the bias; on CUDA the fused passes. Shaped as
    `x` with its last dim the weight's rows. Shared by every ComfyUI layout that multiplies int8 by int8."""
    out_features = weight.shape[0]
    if fused.available(rows.device):
        x_q, x_scale = fused.int8_rows(rows)
        y = _int8_product(x_q, weight, x_scale, scale, bias, x.dtype, "comfy")
        return y.reshape(*x.shape[:-1], out_features)
    x_q, x_scale = comfy_int8.quantize_rows(rows)
    acc = int_mm(x_q, weight.t())
    y = acc.float().mul_(x_scale * scale.reshape(1, -1)).to(x.dtype)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*x.shape[:-1], out_features)
