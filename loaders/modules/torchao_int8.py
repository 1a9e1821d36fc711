"""`torchao_int8` at run time: `TorchaoInt8Linear`, torchao's `Int8Tensor` W8A8 (int8 weight, per-row scales).

Its kernel is torchao's own int8 linear, bit for bit on the CPU: the activations quantized per row as torchao does,
`torch._int_mm`, torchao's scaling; on CUDA the fused passes of `loaders/fused.py`.
"""

from __future__ import annotations

import torch

from quantize.formats import torchao_int8

from .. import fused
from ..emulation import INT32_SUM, Accumulation
from .base import QuantizedLinear, _decoded, _rows
from .gemm import _int8_product, int_mm


class TorchaoInt8Linear(QuantizedLinear):
    """`torchao_int8`: torchao's `Int8Tensor` (int8 weight, one float32 scale per output row); W8A8.

    Fast path, torchao's own linear for the `Int8Tensor` diffusers' loader puts in `.weight` (bit for bit on the
    CPU, tested): the activations of the call quantized per row in their dtype as torchao's `from_hp` does
    (`torchao_int8.quantize_rows`), multiplied by `int_mm` (int32 accumulation; on CUDA padded, the weight never
    copied), times the activation scales in float32, cast to the input's dtype, times the weight scales in
    float32, the bias added, cast back. Runs wherever `torch._int_mm` does. `.weight` is that `Int8Tensor`. On
    CUDA the quantization and the epilogue are one fused pass each (`fused.int8_rows_torchao`,
    `fused.int8_epilogue`: bit for bit the eager ones).
    """

    FORMAT = torchao_int8.FORMAT
    KERNEL_ON_CPU = False  # measured: 1.7-2.2x a bf16 Linear on the CPU, decoding about 1x

    @property
    def weight(self) -> torch.Tensor:
        return torchao_int8.to_int8_tensor(self.stored())

    def accumulation(self, device: torch.device) -> Accumulation:
        return INT32_SUM

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self.part(torchao_int8.QDATA), self.part(torchao_int8.SCALE)
        rows = _rows(x, self.in_features)
        if fused.available(rows.device):
            x_q, x_scale = fused.int8_rows_torchao(rows)
            y = _int8_product(x_q, weight, x_scale, scale, self.bias, x.dtype, "torchao")
            return y.reshape(*x.shape[:-1], self.out_features)
        x_q, x_scale = torchao_int8.quantize_rows(rows)
        y = (int_mm(x_q, weight.t()).float() * x_scale).to(x.dtype) * scale.reshape(-1)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = torchao_int8.quantize_rows(rows)
        weight, scale = self.part(torchao_int8.QDATA), self.part(torchao_int8.SCALE)
        return _decoded(x_q, x_scale), _decoded(weight, scale.reshape(-1, 1))
