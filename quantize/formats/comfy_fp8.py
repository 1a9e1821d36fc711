"""`comfy_fp8`: ComfyUI's "fp8 scaled" Linear: float8 weights with one float32 scale per tensor.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component):
  ``<m>.weight``       float8_e4m3fn [out, in] (``type: float8_e5m2``: float8_e5m2)
  ``<m>.weight_scale`` float32 [] (one value: ComfyUI's CUDA path asserts a single scale)
  ``<m>.comfy_quant``  uint8 [n]   UTF-8 JSON ``{"format": "float8_e4m3fn"}`` (or ``"float8_e5m2"``)
  ``<m>.input_scale``  float32 []  only with a static input scale (`convert --calibrate`): max|x| / M of the
                       layer's input over the calibration pass; ComfyUI quantizes each call's input with it

Reference numerics (comfy-kitchen, bit for bit): in float32 from the stored values, scale = max|w| / M (M = 448
for e4m3, 57344 for e5m2); q = ``quantize_per_tensor_fp8(w.float(), scale, dtype)``: w times the float32
reciprocal of the scale, clamped to ±M, cast (round to nearest even). An all-zero weight gets scale 1 and exact
zeros (the reference would divide by zero). Decoding: q.float() · scale, what comfy-kitchen's
``TensorCoreFP8Layout.dequantize`` computes for a float32 ``orig_dtype``. ComfyUI reads e5m2 as
``TensorCoreFP8E5M2Layout`` (``QUANT_ALGOS["float8_e5m2"]``); it has 2 bits of mantissa to e4m3's 3, for weights
whose range e4m3 cannot span.

The scale depends on the whole weight: it is taken in a first streamed pass over the weight's row chunks
(`weight_options`: the max of the chunks' max |w|, exactly the weight's), then the weight is encoded chunk by
chunk with it (`ROW_SEPARABLE`); the scale and the marker are written once (`WEIGHT_PARTS`).

ComfyUI quantizes each call's input the same way (`quantize_tensor`, in the input's dtype): with the layer's
``input_scale``, or one of its own, max|x| / M; the loader's `ComfyFP8Linear` calls it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import _comfy
from ._e4m3 import dequantize_rows
from .base import PartSpec
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "ComfyFp8", "LAYOUT", "WEIGHT", "SCALE", "INPUT_SCALE", "FLOAT8", "quantize_tensor"]

LAYOUT = "float8_e4m3fn"  # ComfyUI's name for the default layout (comfy-kitchen TensorCoreFP8Layout)
WEIGHT = "weight"
SCALE = "weight_scale"
INPUT_SCALE = _comfy.INPUT_SCALE  # only with a static input scale
#: layout -> (torch dtype, its safetensors name, its largest finite value)
FLOAT8 = {
    "float8_e4m3fn": (torch.float8_e4m3fn, "F8_E4M3", float(torch.finfo(torch.float8_e4m3fn).max)),
    "float8_e5m2": (torch.float8_e5m2, "F8_E5M2", float(torch.finfo(torch.float8_e5m2).max)),
}


class ComfyFp8(_comfy.ComfyFormat):
    NAME = "comfy_fp8"
    ROW_SEPARABLE = True
    WEIGHT_PARTS = (SCALE, _comfy.MARKER, INPUT_SCALE)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        _, stored, _ = FLOAT8[self.layout(options).layout]
        return {
            WEIGHT: (stored, tuple(shape)),
            SCALE: ("F32", ()),
            _comfy.MARKER: self.marker_spec(options),
            **self.input_scale_spec(options),
        }

    def weight_options(
        self,
        chunks: Iterable[torch.Tensor],
        options: FormatOptions = NO_OPTIONS,
        shape: tuple[int, int] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The weight's scale from its float32 row chunks: max|w| / M (1 for an all-zero weight)."""
        _, _, top = FLOAT8[self.layout(options).layout]
        return {"scale": _comfy.tensor_scale(_comfy.amax_of(chunks), top)}

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
        own = self.layout(options)
        w = weight.float()
        if scale is None:
            scale = self.weight_options([w], own)["scale"]
        q, scale = quantize_tensor(w, scale, own.layout)
        return {WEIGHT: q, SCALE: scale, _comfy.MARKER: _comfy.marker(own), **self.input_scale_part(own)}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """weight.float() * weight_scale, cast to `dtype`; only `rows` [r0, r1) of it if given."""
        q, scale = parts[WEIGHT], parts[SCALE]
        if q.dtype == torch.float8_e4m3fn:  # a table lookup, faster than the cast
            return dequantize_rows(q, scale.reshape(1, 1).expand(q.shape[0], 1), dtype, rows)
        if rows is not None:
            q = q[rows[0] : rows[1]]
        return q.float().mul_(scale).to(dtype)


def quantize_tensor(
    x: torch.Tensor, scale: torch.Tensor | None = None, layout: str = LAYOUT
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 values, float32 scale []) of `x` quantized with one scale in its own dtype, comfy-kitchen's
    ``quantize_per_tensor_fp8(x, scale, dtype)`` bit for bit: x times the float32 reciprocal of the scale rounded to
    x's dtype, the product in x's dtype, clamped to ±M, cast (to nearest even). `scale`: float32 [], returned as
    given; None: x's own, max|x| / M taken in x's dtype (`_comfy.tensor_scale`: 1 for an all-zero `x`). The weights
    (float32, with `weight_options`' scale) and, in the loader's `ComfyFP8Linear`, each call's input.

    >>> q, scale = quantize_tensor(torch.tensor([[896.0, -1.0]]))
    >>> q.float().tolist(), float(scale)
    ([[448.0, -0.5]], 2.0)
    """
    dtype, _, top = FLOAT8[layout]
    if scale is None:
        scale = _comfy.tensor_scale(x.abs().amax(), top)
    return torch.clamp(x * (1.0 / scale).to(x.dtype), -top, top).to(dtype), scale


FORMAT = ComfyFp8()
