"""`fp8_channel` at run time: `FP8ChannelLinear`, a float8_e4m3fn weight with one scale per output channel.

Its kernel quantizes the activations per row to float8 and runs `torch._scaled_mm` with both row-wise scales.
"""

from __future__ import annotations

import torch

from quantize.formats import fp8_channel

from .. import fused
from ..emulation import Accumulation
from .base import QuantizedLinear, _decoded, _rows
from .gemm import _fp8_accumulation, _fp8_problem, _scaled_mm_with_bias


class FP8ChannelLinear(QuantizedLinear):
    """`fp8_channel`: float8_e4m3fn weight, one float32 scale per output channel.

    Fast path: activations quantized per row (per token) to float8 on each call, as the checkpoint's config
    says (`fp8_channel.quantize_rows`; on CUDA by one fused pass, `fused.fp8_rows`, bit for bit the same), and
    multiplied by `torch._scaled_mm` with both row-wise scales, bias fused, fast accumulation on CUDA, where the
    device has it for the input's dtype (probed once per device: the CPU from torch 2.13, SM89+ GPUs) and both
    dims are multiples of 16.
    """

    FORMAT = fp8_channel.FORMAT
    KERNEL_ON_CPU = False  # the CPU's _scaled_mm is emulated: 3.4x a bf16 step, decoding about 1x

    def static_problem(self, x: torch.Tensor) -> str | None:
        return _fp8_problem(self, x)

    def accumulation(self, device: torch.device) -> Accumulation:
        return _fp8_accumulation(device)

    def quantized_input(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if fused.available(rows.device):
            return fused.fp8_rows(rows)
        return fp8_channel.quantize_rows(rows)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self.part(fp8_channel.WEIGHT), self.part(fp8_channel.SCALE)
        x_q, x_scale = self.quantized_input(_rows(x, self.in_features))
        y = _scaled_mm_with_bias(x_q, weight.t(), x_scale, scale.t(), self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = fp8_channel.quantize_rows(rows)
        return _decoded(x_q, x_scale), _decoded(self.part(fp8_channel.WEIGHT), self.part(fp8_channel.SCALE))
