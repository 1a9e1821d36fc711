"""`comfy_int8`: ComfyUI's int8 Linear: int8 weights with one float32 scale per output row.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component):
  ``<m>.weight``       int8 [out, in]
  ``<m>.weight_scale`` float32 [out, 1]
  ``<m>.comfy_quant``  uint8 [n]   UTF-8 JSON ``{"format": "int8_tensorwise"}``

Reference numerics (comfy-kitchen's eager ``quantize_int8_rowwise(w.float())``, bit for bit): in float32,
scale = max(rowmax|w| / 127, 1e-30); q = clamp(round(w / scale), -128, 127), rounded half to even. An
all-zero row gets the scale 1e-30 and exact zeros. Decoding: q.float() · scale, comfy-kitchen's
``dequantize_int8_simple``. ComfyUI runs it with int8 matmuls on the CPU and on GPUs from Turing on.

ConvRot (``type: int8_convrot``; ComfyUI >= 0.27 reads it): each row is first rotated in groups of g inputs by the
normalized regular Hadamard matrix H (``H4 ⊗ H4 ⊗ H4 ⊗ H4 / 16`` for g = 256, symmetric and orthogonal; `_hadamard`),
W_rot = W·Hᵀ, then quantized as above; the marker says ``{"format": "int8_tensorwise", "convrot": true,
"convrot_groupsize": g}`` and ComfyUI rotates the activations the same way, so X·Wᵀ = (X·H)·(W·H)ᵀ. g is the
layer's (`Format.fitted`): 256, or the largest of 64, 16, 4 that divides a narrower or odd input width. Rotating spreads an outlier
over its group, so the row's scale fits the rest better. The reference is comfy-kitchen's
``quantize_int8_convrot_weight(w.float(), g)``, whose rotation is a float32 matrix product: its last bit
depends on how the BLAS blocks it (on this CPU the rows of a product differ with the number of rows and of
threads), so no encoder can be bit-exact to it as called. Ours rotates with the same matrix exactly, in
float64 (every product w·(±1/16) is exact) by a fixed sequence of additions (four 4-point butterflies), then
rounds once to float32: the same result on every machine, row chunk and worker count, equal to
comfy-kitchen's ``quantize_int8_rowwise`` of the float64 rotation (tested bit for bit), and within one int8
step of the float32 call (tested). Decoding rotates back the same way: q.float() · scale · H.

Every part but the marker is per row: a weight is encoded in row chunks (`ROW_SEPARABLE`), the marker written
once (`WEIGHT_PARTS`). Nothing goes into the file's metadata: ComfyUI reads the per-layer markers.

ComfyUI multiplies int8 by int8: each call's input is quantized per row the same way, in its own dtype
(`quantize_rows`), after a ConvRot layer's rotates it (`rotate_activations`); the loader's `ComfyInt8Linear` calls both.
"""

from __future__ import annotations

import torch

from . import _comfy, _hadamard
from .base import NonFiniteWeightError, PartSpec, UnsupportedShapeError
from .options import NO_OPTIONS, FormatOptions

__all__ = [
    "FORMAT",
    "ComfyInt8",
    "LAYOUT",
    "WEIGHT",
    "SCALE",
    "quantize_rows",
    "hadamard_rotate",
    "rotate_activations",
]

LAYOUT = "int8_tensorwise"  # ComfyUI's name for the layout (comfy-kitchen TensorWiseINT8Layout)
WEIGHT = "weight"
SCALE = "weight_scale"
INT8_MAX = 127.0
MIN_SCALE = 1e-30  # comfy-kitchen's floor for a row's scale
#: the signs of H4 (symmetric): output e of a 4-point butterfly is the sum over a of _H4[a][e] · x_a
_H4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))


class ComfyInt8(_comfy.ComfyFormat):
    NAME = "comfy_int8"
    ROW_SEPARABLE = True
    WEIGHT_PARTS = (_comfy.MARKER,)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        own = self.layout(options)
        if own.convrot and inp % own.group:
            raise UnsupportedShapeError(
                f"is [{out}, {inp}]; ConvRot rotates groups of {own.group} inputs: in_features must be a multiple"
            )
        return {
            WEIGHT: ("I8", (out, inp)),
            SCALE: ("F32", (out, 1)),
            _comfy.MARKER: self.marker_spec(options),
        }

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight row by row.

        >>> p = FORMAT.encode(torch.tensor([[1.0, -127.0], [0.0, 0.0]]))
        >>> p["weight"].tolist(), FORMAT.decode(p).tolist()
        ([[1, -127], [0, 0]], [[1.0, -127.0], [0.0, 0.0]])
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_int8 quantizes 2-D weights, got shape {list(weight.shape)}")
        own = self.layout(options)
        w = weight.float()
        if own.convrot:
            if not bool(torch.isfinite(w).all()):  # the rotation would spread a NaN over its group
                raise NonFiniteWeightError("holds NaN or Inf values")
            w = _hadamard.rotate(w, own.group)
        q, scale = quantize_rows(w)
        if not bool(torch.isfinite(scale).all()):  # a NaN or Inf anywhere in a row makes its scale one
            raise NonFiniteWeightError("holds NaN or Inf values")
        return {WEIGHT: q, SCALE: scale, _comfy.MARKER: _comfy.marker(own)}

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
        w = q.float().mul_(scale)
        own = self.layout(options)
        return (_hadamard.rotate(w, own.group) if own.convrot else w).to(dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scales [rows, 1]) of 2-D `x` quantized per row in its own dtype, comfy-kitchen's eager
    ``quantize_int8_rowwise(x)`` bit for bit: scale = max(rowmax|x| / 127 in float32, 1e-30); q = clamp(round(x /
    divisor), -128, 127), half to even, the divisor the scale in x's dtype (a scale that is 0 there taken as its
    smallest normal) and the division in x's dtype. The weights (in float32: the divisor is the scale) and, in the
    loader's `ComfyInt8Linear`, each call's input.

    >>> q, scale = quantize_rows(torch.tensor([[254.0, -1.0, 3.0]]))
    >>> q.tolist(), scale.tolist()
    ([[127, 0, 2]], [[2.0]])
    """
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / INT8_MAX).clamp_(min=MIN_SCALE)
    divisor = scale.to(x.dtype)
    divisor = torch.where(divisor == 0, torch.full_like(divisor, torch.finfo(x.dtype).tiny), divisor)
    return (x / divisor).round_().clamp_(-128.0, 127.0).to(torch.int8), scale  # round: half to even


#: ConvRot's rotation (`_hadamard`), under the names this module gave it first
hadamard_rotate = _hadamard.rotate
rotate_activations = _hadamard.rotate_activations


FORMAT = ComfyInt8()
