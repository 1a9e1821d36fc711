"""`torchao_fp8` at run time: `TorchaoFP8Linear`, torchao's `Float8Tensor` (PerRow weight and activations).

The stored buffers are wrapped in a `Float8Tensor` for each call and `F.linear` dispatches to torchao, so the numbers
are torchao's own (those of diffusers' torchao loader).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantize.formats import torchao_fp8

from ..emulation import Accumulation
from .base import QuantizedLinear, _decoded
from .gemm import _fp8_accumulation


class TorchaoFP8Linear(QuantizedLinear):
    """`torchao_fp8`: torchao's `Float8Tensor` (PerRow weight, dynamic PerRow activations).

    The stored qdata and scale are plain buffers; each call wraps them (no copy) in the `Float8Tensor`
    that diffusers' torchao loader would have put in `.weight`, and `F.linear` dispatches to torchao,
    so the numbers are torchao's own (its mm config accumulates fast). `.weight` returns that tensor too.
    """

    FORMAT = torchao_fp8.FORMAT
    KERNEL_ON_CPU = False  # torchao's CPU path for Float8Tensor: 3.8x a bf16 step, decoding about 1x

    @property
    def weight(self) -> torch.Tensor:
        return torchao_fp8.to_float8_tensor(self.stored())

    def accumulation(self, device: torch.device) -> Accumulation:
        return _fp8_accumulation(device)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight, bias)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weight = self.weight  # torchao's own activation quantizer, with the weight's act_quant_kwargs
        x_q = torchao_fp8.quantize_activation(rows, weight)
        return _decoded(x_q.qdata, x_q.scale), _decoded(weight.qdata, weight.scale)
