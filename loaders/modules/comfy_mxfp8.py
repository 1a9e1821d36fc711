"""`comfy_mxfp8` at run time: `ComfyMXFP8Linear`, ComfyUI's MXFP8 (float8_e4m3fn values, E8M0 block scales).

Blackwell (SM100+) runs the block-scaled `torch._scaled_mm` on activations the format itself encodes; elsewhere the
weight is decoded for each call, as ComfyUI does.
"""

from __future__ import annotations

import torch

from quantize.formats import comfy_mxfp8

from .base import QuantizedLinear, _rows
from .gemm import _block_scaled_problem


class ComfyMXFP8Linear(QuantizedLinear):
    """`comfy_mxfp8`: float8_e4m3fn weight with E8M0 block scales (per 32 inputs).

    Fast path (Blackwell, SM100+): the activations of the call are quantized to MXFP8 by the format's own
    encoder and `torch._scaled_mm` multiplies the two with their tiled E8M0 scales. Elsewhere the weight is
    decoded for each call, as ComfyUI does.
    """

    FORMAT = comfy_mxfp8.FORMAT
    PROBE_SHAPE = (128, 128)

    def static_problem(self, x: torch.Tensor) -> str | None:
        return _block_scaled_problem(self, x, "mxfp8")

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, self.in_features)
        a = comfy_mxfp8.FORMAT.encode(rows)
        w = self.stored()
        y = torch._scaled_mm(
            a[comfy_mxfp8.WEIGHT],
            w[comfy_mxfp8.WEIGHT].t(),
            scale_a=a[comfy_mxfp8.SCALE].view(torch.float8_e8m0fnu).reshape(-1),
            scale_b=w[comfy_mxfp8.SCALE].view(torch.float8_e8m0fnu).reshape(-1),
            out_dtype=x.dtype,
        )[: rows.shape[0], : self.out_features]
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = comfy_mxfp8.FORMAT.encode(rows)
        shape = (rows.shape[0], self.in_features)
        return self.FORMAT.decoded(a, shape, torch.float64), self.dequantize(torch.float64)
