"""`comfy_fp8`: ComfyUI's "fp8 scaled" Linear: float8_e4m3fn weights with one float32 scale per tensor.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component):
  ``<m>.weight``       float8_e4m3fn [out, in]
  ``<m>.weight_scale`` float32 [] (one value: ComfyUI's CUDA path asserts a single scale)
  ``<m>.comfy_quant``  uint8 [n]   UTF-8 JSON ``{"format": "float8_e4m3fn"}``

Reference numerics (comfy-kitchen, bit for bit): in float32 from the stored values, scale = max|w| / 448;
q = ``quantize_per_tensor_fp8(w.float(), scale)``: w times the float32 reciprocal of the scale, clamped
to ±448, cast to e4m3 (round to nearest even). An all-zero weight gets scale 1 and exact zeros (the
reference would divide by zero). Decoding: q.float() · scale, what comfy-kitchen's
``TensorCoreFP8Layout.dequantize`` computes for a float32 ``orig_dtype``.

The scale depends on the whole weight: it is taken in a first streamed pass over the weight's row chunks
(`weight_options`: the max of the chunks' max |w|, exactly the weight's), then the weight is encoded chunk by
chunk with it (`ROW_SEPARABLE`); the scale and the marker are written once (`WEIGHT_PARTS`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import _comfy
from ._e4m3 import FP8_DTYPE, FP8_MAX, dequantize_rows
from .base import Format, NonFiniteWeightError, PartSpec
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "ComfyFp8", "LAYOUT", "WEIGHT", "SCALE"]

LAYOUT = "float8_e4m3fn"  # ComfyUI's name for the layout (comfy-kitchen TensorCoreFP8Layout)
WEIGHT = "weight"
SCALE = "weight_scale"
_MARKER = _comfy.marker_bytes(LAYOUT)


class ComfyFp8(Format):
    NAME = "comfy_fp8"
    ROW_SEPARABLE = True
    WEIGHT_PARTS = (SCALE, _comfy.MARKER)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        return {WEIGHT: ("F8_E4M3", tuple(shape)), SCALE: ("F32", ()), _comfy.MARKER: ("U8", (len(_MARKER),))}

    def weight_options(
        self, chunks: Iterable[torch.Tensor], options: FormatOptions = NO_OPTIONS
    ) -> dict[str, torch.Tensor]:
        """The weight's scale from its float32 row chunks: max|w| / 448 (1 for an all-zero weight)."""
        amax = torch.zeros((), dtype=torch.float32)
        for chunk in chunks:
            amax = torch.maximum(amax, chunk.abs().amax())  # NaN propagates
        if not bool(torch.isfinite(amax)):
            raise NonFiniteWeightError("holds NaN or Inf values")
        scale = amax / FP8_MAX
        return {"scale": torch.ones((), dtype=torch.float32) if float(scale) == 0 else scale}

    def encode(
        self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS, scale: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight with one scale: the weight's own (`weight_options`), or `scale`, the whole
        weight's, when `weight` is a chunk of its rows.

        >>> p = FORMAT.encode(torch.tensor([[1.0, -2.0], [0.0, 448.0]]))
        >>> float(p["weight_scale"]), FORMAT.decode(p).tolist()
        (1.0, [[1.0, -2.0], [0.0, 448.0]])
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_fp8 quantizes 2-D weights, got shape {list(weight.shape)}")
        w = weight.float()
        if scale is None:
            scale = self.weight_options([w])["scale"]
        # comfy-kitchen's order of operations: times the float32 reciprocal, clamped, cast
        q = torch.clamp(w * (1.0 / scale), -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        return {WEIGHT: q, SCALE: scale, _comfy.MARKER: _comfy.marker(LAYOUT)}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """weight.float() * weight_scale, cast to `dtype`; only `rows` [r0, r1) of it if given."""
        q = parts[WEIGHT]
        return dequantize_rows(q, parts[SCALE].reshape(1, 1).expand(q.shape[0], 1), dtype, rows)

    def quantization_config(self, kept_linears: list[str]) -> dict:
        return _comfy.quantization_config(self.NAME, LAYOUT, kept_linears)


FORMAT = ComfyFp8()
