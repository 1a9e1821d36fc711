"""`comfy_w4a4`: ComfyUI's ConvRot W4A4 Linear (comfy-kitchen ``TensorCoreConvRotW4A4Layout``): each row rotated by
ConvRot's Hadamard matrix in groups of g inputs, then signed int4 with one float32 scale per row. ComfyUI rotates
and quantizes each call's input the same way and multiplies int4 by int4 on tensor cores from Turing on (SM75+);
elsewhere (and in `loaders`) the weight is decoded.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component):
  ``<m>.weight``       int8 [out, in/2]  two signed int4 codes a byte, the even column's in the low nibble
  ``<m>.weight_scale`` float32 [out]     one scale per row
  ``<m>.comfy_quant``  uint8 [n]   UTF-8 JSON ``{"format": "convrot_w4a4", "convrot_groupsize": g}``
in_features must be a multiple of 64 (comfy-kitchen's int4 GEMM groups, ``quant_group_size``) and of g; g is the
layer's (`Format.fitted`: 256 where it divides the width, else 64; a marker of ComfyUI's may also say 16 or 4,
which are read and decoded alike). ComfyUI's loader
(``comfy/ops.py`` ``_load_quantized_module``) builds the layout's ``Params(scale, convrot_groupsize,
quant_group_size=64, linear_dtype="int4")`` from these.

Reference numerics: comfy-kitchen 0.2.40's ``TensorCoreConvRotW4A4Layout.quantize(w.float(), convrot_groupsize=g)``
(quant_group_size 64, no stochastic rounding), i.e. the eager ``quantize_convrot_w4a4_weight``: W_rot = W·Hᵀ in
groups of g; per row, in float32, scale = max(rowmax|W_rot|, 1e-10) / 7; q = clamp(round(W_rot / scale), -7, 7),
rounded half to even (-8 is never written); the codes packed two a byte as its ``_pack_int4_row_major``. An
all-zero row gets the scale 1e-10 / 7 and zeros. The one difference is the rotation: comfy-kitchen's is a float32
matrix product whose last bit depends on the BLAS's blocking; ours is `_hadamard.rotate` (the same matrix, in
float64, rounded once: see comfy_int8's ConvRot), equal to the reference bit for bit where its rotation is ours
(tested), within one int4 step of it as called. Decoding: code · scale in float32, rotated back the same way
(comfy-kitchen's ``dequantize_convrot_w4a4_weight``, whose rotation is then ours).

Every part but the marker is per row: a weight is encoded in row chunks (`ROW_SEPARABLE`), the marker written once
(`WEIGHT_PARTS`). Nothing goes into the file's metadata: ComfyUI reads the per-layer markers.
"""

from __future__ import annotations

import torch

from . import _comfy, _hadamard
from .base import NonFiniteWeightError, PartSpec, UnsupportedShapeError
from .options import CONVROT_LAYOUTS, NO_OPTIONS, FormatOptions

__all__ = [
    "FORMAT",
    "ComfyW4a4",
    "LAYOUT",
    "WEIGHT",
    "SCALE",
    "INT4_MAX",
    "QUANT_GROUP",
    "quantize_rows",
    "pack",
    "unpack",
]

LAYOUT = "convrot_w4a4"  # ComfyUI's name for the layout (comfy-kitchen TensorCoreConvRotW4A4Layout)
WEIGHT = "weight"
SCALE = "weight_scale"
#: the largest code written: comfy-kitchen's symmetric range [-7, 7]
INT4_MAX = 7
#: comfy-kitchen's floor for a row's max |w| before dividing by 7
MIN_AMAX = 1e-10
#: the int4 GEMM's group of inputs (comfy-kitchen's ``quant_group_size``, the only one it runs): in % 64 == 0
QUANT_GROUP = CONVROT_LAYOUTS[LAYOUT]


class ComfyW4a4(_comfy.ComfyFormat):
    NAME = "comfy_w4a4"
    ROW_SEPARABLE = True
    WEIGHT_PARTS = (_comfy.MARKER,)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        own = self.layout(options)
        if inp % QUANT_GROUP or inp % own.group:
            raise UnsupportedShapeError(
                f"is [{out}, {inp}]; W4A4 needs in_features a multiple of {QUANT_GROUP} and of its ConvRot group "
                f"{own.group}"
            )
        return {
            WEIGHT: ("I8", (out, inp // 2)),
            SCALE: ("F32", (out,)),
            _comfy.MARKER: self.marker_spec(options),
        }

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Rotate a 2-D weight in its ConvRot groups and quantize it row by row to packed int4.

        >>> p = FORMAT.encode(torch.tensor([[0.0, 0.0, 0.0, 0.0] * 64]))
        >>> p["weight"].shape, p["weight"].abs().sum().item(), FORMAT.decode(p).abs().sum().item()
        (torch.Size([1, 128]), 0, 0.0)
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_w4a4 quantizes 2-D weights, got shape {list(weight.shape)}")
        own = self.layout(options)
        w = weight.float()
        if not bool(torch.isfinite(w).all()):  # the rotation would spread a NaN over its group
            raise NonFiniteWeightError("holds NaN or Inf values")
        q, scale = quantize_rows(_hadamard.rotate(w, own.group))
        return {WEIGHT: pack(q), SCALE: scale, _comfy.MARKER: _comfy.marker(own)}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """unpack(weight).float() · weight_scale, rotated back, cast to `dtype`; only `rows` [r0, r1) of it if
        given."""
        q, scale = parts[WEIGHT], parts[SCALE]
        if rows is not None:
            q, scale = q[rows[0] : rows[1]], scale[rows[0] : rows[1]]
        w = unpack(q).float().mul_(scale.float().reshape(-1, 1))
        return _hadamard.rotate(w, self.layout(options).group).to(dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes in [-7, 7], float32 scales [rows]) of 2-D float32 `x` quantized per row, comfy-kitchen's
    ``_quantize_signed_int4_rowwise_unpacked(x)`` bit for bit: scale = max(rowmax|x|, 1e-10) / 7; q =
    clamp(round(x / scale), -7, 7), half to even.

    >>> q, scale = quantize_rows(torch.tensor([[14.0, -1.0, 3.0, 0.0]]))
    >>> q.tolist(), scale.tolist()
    ([[7, 0, 2, 0]], [2.0])
    """
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / INT4_MAX
    q = (x / scale).round_().clamp_(-INT4_MAX, INT4_MAX).to(torch.int8)  # round: half to even
    return q, scale.reshape(x.shape[0]).to(torch.float32)


def pack(q: torch.Tensor) -> torch.Tensor:
    """Signed 4-bit codes [rows, k] (int8) as int8 [rows, k/2]: column 2j in the low nibble of byte j, 2j + 1 in the
    high one (two's complement nibbles: comfy-kitchen's ``_pack_int4_row_major``).

    >>> pack(torch.tensor([[1, -1, -7, 7]], dtype=torch.int8)).view(torch.uint8).tolist()
    [[241, 121]]
    """
    u = q.view(torch.uint8) & 0x0F
    return (u[:, 0::2] | (u[:, 1::2] << 4)).view(torch.int8)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """`pack`'s inverse: int8 [rows, k/2] -> signed codes int8 [rows, k] in [-8, 7].

    >>> unpack(torch.tensor([[-15, 121]], dtype=torch.int8)).tolist()
    [[1, -1, -7, 7]]
    """
    u = packed.view(torch.uint8)
    nibbles = torch.stack((u & 0x0F, u >> 4), dim=-1).reshape(*u.shape[:-1], -1)
    return (nibbles ^ 0x08).view(torch.int8) - 8  # 0..7 stay, 8..15 become -8..-1


FORMAT = ComfyW4a4()
