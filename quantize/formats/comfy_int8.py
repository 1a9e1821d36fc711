"""`comfy_int8`: ComfyUI's int8 Linear: int8 weights with one float32 scale per output row.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component):
  ``<m>.weight``       int8 [out, in]
  ``<m>.weight_scale`` float32 [out, 1]
  ``<m>.comfy_quant``  uint8 [n]   UTF-8 JSON ``{"format": "int8_tensorwise"}``

Reference numerics (comfy-kitchen's eager ``quantize_int8_rowwise(w.float())``, bit for bit): in float32,
scale = max(rowmax|w| / 127, 1e-30); q = clamp(round(w / scale), -128, 127), rounded half to even. An
all-zero row gets the scale 1e-30 and exact zeros. Decoding: q.float() · scale, comfy-kitchen's
``dequantize_int8_simple``. ComfyUI runs it with int8 matmuls on the CPU and on GPUs from Turing on.

Every part but the marker is per row: a weight is encoded in row chunks (`ROW_SEPARABLE`), the marker written
once (`WEIGHT_PARTS`). Nothing goes into the file's metadata: ComfyUI reads the per-layer markers.
"""

from __future__ import annotations

import torch

from . import _comfy
from .base import Format, NonFiniteWeightError, PartSpec
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "ComfyInt8", "LAYOUT", "WEIGHT", "SCALE"]

LAYOUT = "int8_tensorwise"  # ComfyUI's name for the layout (comfy-kitchen TensorWiseINT8Layout)
WEIGHT = "weight"
SCALE = "weight_scale"
INT8_MAX = 127.0
MIN_SCALE = 1e-30  # comfy-kitchen's floor for a row's scale
_MARKER = _comfy.marker_bytes(LAYOUT)


class ComfyInt8(Format):
    NAME = "comfy_int8"
    ROW_SEPARABLE = True
    WEIGHT_PARTS = (_comfy.MARKER,)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        return {WEIGHT: ("I8", (out, inp)), SCALE: ("F32", (out, 1)), _comfy.MARKER: ("U8", (len(_MARKER),))}

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight row by row.

        >>> p = FORMAT.encode(torch.tensor([[1.0, -127.0], [0.0, 0.0]]))
        >>> p["weight"].tolist(), FORMAT.decode(p).tolist()
        ([[1, -127], [0, 0]], [[1.0, -127.0], [0.0, 0.0]])
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_int8 quantizes 2-D weights, got shape {list(weight.shape)}")
        w = weight.float()
        amax = w.abs().amax(dim=-1, keepdim=True)
        if not bool(torch.isfinite(amax).all()):
            raise NonFiniteWeightError("holds NaN or Inf values")
        scale = (amax / INT8_MAX).clamp_(min=MIN_SCALE)
        q = torch.div(w, scale).round_().clamp_(-128.0, 127.0).to(torch.int8)  # round: half to even
        return {WEIGHT: q, SCALE: scale, _comfy.MARKER: _comfy.marker(LAYOUT)}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """weight.float() * weight_scale, cast to `dtype`; only `rows` [r0, r1) of it if given."""
        q, scale = parts[WEIGHT], parts[SCALE]
        if rows is not None:
            q, scale = q[rows[0] : rows[1]], scale[rows[0] : rows[1]]
        return q.float().mul_(scale).to(dtype)

    def quantization_config(self, kept_linears: list[str]) -> dict:
        return _comfy.quantization_config(self.NAME, LAYOUT, kept_linears)


FORMAT = ComfyInt8()
