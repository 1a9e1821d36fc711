"""`comfy_w4a8` at run time: `ComfyW4a8Linear`, ComfyUI's W4A8 (4-bit codes of a 16-level codebook, float8 group
scales, float32 row scales, the weight ConvRot-rotated).

Its kernel is comfy-kitchen's eager ``w4a8_int8_linear``: the codes decoded to the int8 grid (`comfy_w4a8.int8_grid`),
then its ``int8_linear`` with ConvRot: the activations rotated, quantized per row to int8, `torch._int_mm`, both
scales applied in float32; on CUDA the fused int8 passes of `loaders/fused.py`, as `ComfyInt8Linear`'s.
"""

from __future__ import annotations

import torch

from quantize.formats import _hadamard, comfy_int8, comfy_w4a8

from ..emulation import INT32_SUM, Accumulation
from .base import QuantizedLinear, _decoded, _rows
from .comfy_int8 import int8_linear


class ComfyW4a8Linear(QuantizedLinear):
    """`comfy_w4a8`: 4-bit codes (int8 [out, in/2]), float8 scales per 16 inputs, a float32 scale per row and the
    tensor's codebook, ConvRot-rotated in the layer's group (its options: the marker's ``convrot_groupsize``); W4A8.

    Fast path, comfy-kitchen's eager ``w4a8_int8_linear`` (what ComfyUI calls for an ``AsymW4A8Int8Layout`` weight
    where its CUDA kernel does not run; bit for bit on the CPU, tested): the weight's codes decoded to the int8 grid
    for the call (`comfy_w4a8.int8_grid`: each code's level times its group's scale, rounded), the call's input
    rotated (`_hadamard.rotate_activations`) and quantized per row to int8 (`comfy_int8.quantize_rows`), multiplied
    by `torch._int_mm` with int32 accumulation, and scaled back in float32 by the input's row scale times the
    weight's (``weight_s_channel``), cast to the input's dtype, then the bias added in it. Runs wherever
    `torch._int_mm` does (the CPU; CUDA GPUs from Turing on); on CUDA the quantization and the product are
    `ComfyInt8Linear`'s fused passes. The eager reference decodes the weight (rotated back) for the call.
    """

    FORMAT = comfy_w4a8.FORMAT
    PROBE_SHAPE = (64, 256)  # in_features a whole ConvRot group of 256, the default's

    def accumulation(self, device: torch.device) -> Accumulation:
        return INT32_SUM

    def _input_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The call's input as 2-D rows, rotated as the stored weight is (X·Wᵀ = (X·H)·(W·H)ᵀ)."""
        rows = _rows(x, self.in_features).contiguous()
        return _hadamard.rotate_activations(rows, self.FORMAT.layout(self.options).group)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        grid, s_channel = comfy_w4a8.int8_grid(self.stored())
        return int8_linear(x, self._input_rows(x), grid, s_channel, self.bias)

    def kernel_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = comfy_int8.quantize_rows(self._input_rows(x))
        grid, s_channel = comfy_w4a8.int8_grid(self.stored())
        return _decoded(x_q, x_scale), _decoded(grid, s_channel.reshape(-1, 1))
