"""`comfy_nvfp4` at run time: `ComfyNVFP4Linear`, ComfyUI's NVFP4 (E2M1 values, E4M3 block scales, a tensor scale).

Blackwell (SM100+) runs the block-scaled `torch._scaled_mm` on activations the format itself encodes; elsewhere the
weight is decoded for each call, as ComfyUI does. A smoothed layer (``pre_quant_scale``, `convert --calibrate`):
the kernel multiplies the input by it and takes the stored W / p, as ComfyUI's Linear; the decoded path takes
the weight `decode` gives, W / p times p, exact for the powers of two `calibrate` writes: the same products.
"""

from __future__ import annotations

import dataclasses

import torch

from quantize.formats import comfy_nvfp4

from .base import QuantizedLinear, _rows
from .gemm import _block_scaled_problem


class ComfyNVFP4Linear(QuantizedLinear):
    """`comfy_nvfp4`: E2M1 weight with E4M3 block scales (per 16 inputs) and one float32 scale.

    Fast path (Blackwell, SM100+: FP4 tensor cores), as ComfyUI runs the layer there: the activations of the call
    are quantized to NVFP4 by the format's own encoder (its tensor scale the stored ``input_scale`` where the
    checkpoint has one, `convert --calibrate`, else dynamic), and `torch._scaled_mm` multiplies
    the two with both block-scale layouts as cuBLAS reads them, the product of the tensor scales applied after.
    Elsewhere (the CPU, GPUs before Blackwell) the weight is decoded for each call, as ComfyUI does.
    """

    FORMAT = comfy_nvfp4.FORMAT
    PROBE_SHAPE = (128, 128)

    def static_problem(self, x: torch.Tensor) -> str | None:
        return _block_scaled_problem(self, x, "nvfp4")

    def _encoded_input(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The call's input as the kernel takes it: times the stored ``pre_quant_scale`` first where the layer has
        one (cast to the input's dtype, as ComfyUI's Linear multiplies it), then NVFP4 with the static scale."""
        smoothing = self.part(comfy_nvfp4.PRE_QUANT_SCALE, None)  # a part only where the options have it
        if smoothing is not None:
            rows = rows * smoothing.to(rows.dtype)
        static = self.part(comfy_nvfp4.INPUT_SCALE, None)
        return comfy_nvfp4.FORMAT.encode(rows, **({} if static is None else {"scale": static}))

    def _stored_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as stored (W / p where the layer is smoothed: what the kernel multiplies), decoded."""
        plain = dataclasses.replace(self.options, pre_quant_scale=None) if self.smoothed else self.options
        return self.FORMAT.decoded(self.stored(), (self.out_features, self.in_features), dtype, options=plain)

    @property
    def smoothed(self) -> bool:
        return getattr(self.options, "pre_quant_scale", None) is not None

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, self.in_features)
        a = self._encoded_input(rows)
        w = self.stored()
        y = torch._scaled_mm(
            a[comfy_nvfp4.WEIGHT].view(torch.float4_e2m1fn_x2),
            w[comfy_nvfp4.WEIGHT].view(torch.float4_e2m1fn_x2).t(),
            scale_a=a[comfy_nvfp4.SCALE].reshape(-1),  # the tiled scales flattened, as torchao passes them
            scale_b=w[comfy_nvfp4.SCALE].reshape(-1),
            out_dtype=torch.float32,
        )
        y = y[: rows.shape[0], : self.out_features].mul_(
            a[comfy_nvfp4.SCALE_2] * w[comfy_nvfp4.SCALE_2].float()
        )
        y = y.to(x.dtype) if self.bias is None else (y + self.bias.float()).to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self._encoded_input(rows)
        shape = (rows.shape[0], self.in_features)
        return self.FORMAT.decoded(a, shape, torch.float64), self._stored_weight(torch.float64)
