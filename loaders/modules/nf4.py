"""`nf4` at run time: `NF4Linear`, bitsandbytes' 4-bit NormalFloat with double quantization.

bitsandbytes' `QuantState` is rebuilt on each call from the plain buffers (`loaders/bnb.py`); `matmul_4bit` runs on
CUDA, the weight dequantized by bitsandbytes on the CPU, in bf16 as its `Linear4bit` computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantize.formats import nf4

from .. import bnb
from ..emulation import BF16_REDUCED_SUM, FP32_SUM, Accumulation
from .base import QuantizedLinear


class NF4Linear(QuantizedLinear):
    """`nf4`: bitsandbytes' 4-bit NormalFloat with double quantization.

    The quant state's fixed fields (shape, nested offset...) are parsed once, when the parts are set;
    each call builds bitsandbytes' `QuantState` from the buffers on their device, with no host round
    trip. On the CPU the weight is dequantized for the call and used by `F.linear` (what
    `bitsandbytes.matmul_4bit` does there); elsewhere `matmul_4bit` runs. The input is computed in
    `compute_dtype` (bf16, the checkpoint's `bnb_4bit_compute_dtype`) and the output returned in the
    input's dtype, as bitsandbytes' `Linear4bit` does.
    """

    FORMAT = nf4.FORMAT
    compute_dtype = torch.bfloat16

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._fields: dict | None = None
        self.register_buffer("nested_offset", torch.zeros((), device=kw.get("device")), persistent=False)

    def parts_changed(self) -> None:
        packed = self.part(nf4.QUANT_STATE)
        if packed.is_meta:
            self._fields = None
            return
        self._fields = nf4.state_fields(packed)
        offset = torch.tensor(float(self._fields["nested_offset"]), dtype=torch.float32)
        self._buffers["nested_offset"] = offset.to(packed.device)

    def _quant_state(self):
        if self._fields is None:
            raise RuntimeError("NF4Linear has no weight yet: load it with loaders.load_quantized")
        return bnb.quant_state(self.stored(), self._fields, self._buffers["nested_offset"])

    def _bnb_weight(self) -> torch.Tensor:
        """The weight as bitsandbytes dequantizes it for a matmul (in the quant state's dtype, bf16)."""
        return bnb.functional().dequantize_4bit(self.part(nf4.WEIGHT), self._quant_state(), quant_type="nf4")

    def static_problem(self, x: torch.Tensor) -> str | None:
        if x.device.type == "cuda" and (problem := bnb.cuda_problem()) is not None:
            return problem
        return super().static_problem(x)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        x_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        if x.device.type == "cpu":
            y = F.linear(x, self._bnb_weight().to(self.compute_dtype), bias)
        else:
            weight = self.part(nf4.WEIGHT).t()
            y = bnb.bitsandbytes().matmul_4bit(x, weight, bias=bias, quant_state=self._quant_state())
        return y.to(x_dtype)

    def kernel_bias(self, x: torch.Tensor) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.to(self.compute_dtype)

    def accumulation(self, device: torch.device) -> Accumulation:
        return BF16_REDUCED_SUM if device.type == "cuda" else FP32_SUM

    def kernel_dtype(self, x: torch.Tensor) -> torch.dtype:
        return self.compute_dtype  # computed in bf16, then widened or kept in the input's dtype

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rows.to(self.compute_dtype).double(), self._bnb_weight().double()
