"""`comfy_fp8` at run time: `ComfyFP8Linear`, ComfyUI's "fp8 scaled" (a float8 weight, one tensor scale).

Its kernel is comfy-kitchen's `TensorCoreFP8Layout` linear: the activations quantized with one scale (the stored
``input_scale``, else a dynamic one) and `torch._scaled_mm` with both tensor scales.
"""

from __future__ import annotations

import torch

from quantize.formats import comfy_fp8
from quantize.formats._e4m3 import FP8_DTYPE

from .. import fused
from ..emulation import Accumulation
from .base import QuantizedLinear, _decoded, _rows
from .gemm import _fp8_accumulation, _fp8_problem, _scaled_mm_with_bias


class ComfyFP8Linear(QuantizedLinear):
    """`comfy_fp8`: float8_e4m3fn weight with one float32 scale for the whole tensor (ComfyUI's "fp8 scaled").

    Fast path, as comfy-kitchen's `TensorCoreFP8Layout` runs the layer: the activations of the call are quantized
    with one scale by ``quantize_per_tensor_fp8`` (`comfy_fp8.quantize_tensor`: times the reciprocal in the
    input's dtype, clamped, cast; on CUDA by the fused `fused.fp8_tensor`, bit for bit the same), then
    `torch._scaled_mm` with both tensor scales, bias fused, output in the input's dtype (fast accumulation on
    CUDA); where the device has a tensor-wise `_scaled_mm` for that dtype and both dims are multiples of 16.
    The scale: the layer's stored ``input_scale`` where the checkpoint has one (`convert --calibrate`; ComfyUI
    passes it as ``scale=`` too, and an input beyond its amax is clamped), else a dynamic one, ``amax|x| / 448``
    taken in the input's dtype and held in float32 (comfy-kitchen's default; an all-zero input gets 1, where
    comfy-kitchen's would divide by zero. ComfyUI's own FP8 layout takes the scale 1 for a layer without
    ``input_scale``). The eager reference quantizes no activation, with a static scale or without: it is the
    weight's decoding alone, what `verify --forward` proves.
    """

    FORMAT = comfy_fp8.FORMAT
    KERNEL_ON_CPU = (
        False  # as FP8ChannelLinear; ComfyUI too decodes float8 weights where the device has no FP8 compute
    )

    def static_problem(self, x: torch.Tensor) -> str | None:
        if self.part(comfy_fp8.WEIGHT).dtype != FP8_DTYPE:
            return "the kernel multiplies float8_e4m3fn weights, this layer's are float8_e5m2"
        return _fp8_problem(self, x)

    def accumulation(self, device: torch.device) -> Accumulation:
        return _fp8_accumulation(device)

    def quantized_input(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        static = self.part(comfy_fp8.INPUT_SCALE, None)  # a part only where the options have it
        if fused.available(rows.device):
            return fused.fp8_tensor(rows, static)
        return comfy_fp8.quantize_tensor(rows, static)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self.part(comfy_fp8.WEIGHT), self.part(comfy_fp8.SCALE)
        x_q, x_scale = self.quantized_input(_rows(x, self.in_features))
        y = _scaled_mm_with_bias(x_q, weight.t(), x_scale, scale.float(), self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = comfy_fp8.quantize_tensor(rows, self.part(comfy_fp8.INPUT_SCALE, None))
        return _decoded(x_q, x_scale), _decoded(self.part(comfy_fp8.WEIGHT), self.part(comfy_fp8.SCALE))
