"""`comfy_nvfp4`: ComfyUI's NVFP4 Linear (comfy-kitchen ``TensorCoreNVFP4Layout``): 4-bit E2M1 values, an E4M3 scale
per block of 16 inputs, one float32 scale per tensor. Blackwell GPUs (RTX 50xx, B200: SM100+) multiply it on their
FP4 tensor cores; everywhere else ComfyUI (and `loaders`) decode the weight to the compute dtype.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component),
for a weight [out, in] padded with zeros to [R, C] = [out, in] rounded up to multiples of 16:
  ``<m>.weight``         uint8 [R, C/2]          two E2M1 codes a byte, the even column's in the high nibble
  ``<m>.weight_scale``   float8_e4m3fn [R', C'/16 -> 4]  the block scales in the tiled layout (`_blocked`)
  ``<m>.weight_scale_2`` float32 []              the tensor's scale
  ``<m>.comfy_quant``    uint8 [n]   UTF-8 JSON ``{"format": "nvfp4"}``
  ``<m>.input_scale``    float32 []  only with a static input scale (`convert --calibrate`): max|x| / (448 · 6) of
                         the layer's input over the calibration pass, the tensor scale of each call's input
  ``<m>.pre_quant_scale`` float32 [in]  only with smoothing (`convert --calibrate`, where it measures better): p,
                         each a power of two; ComfyUI multiplies each call's input by it before the layer, and
                         the weight parts above hold W·diag(1/p)
ComfyUI's loader reads the weight's logical shape from the model and strips the padding.

Reference numerics, bit for bit: comfy-kitchen's ``TensorCoreNVFP4Layout.quantize(w.float())`` (what ComfyUI's
``comfy/quant_ops.py`` layout calls, without stochastic rounding), i.e. the eager ``quantize_nvfp4(w.float(), s,
pad_16x=...)`` with s = max|w| / (448 · 6) in float32: per block b of 16, d = e4m3(min(max|b| / 6 / s, 448)); the
block's values are b / (s · d) clamped to ±6 and rounded to the nearest E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6),
ties to the even code; a block whose s · d is 0 becomes zeros. An all-zero weight gets s = 1 and zeros (the
reference divides 0 by 0). Decoding: E2M1 value · (s · d) in float32, comfy-kitchen's ``dequantize_nvfp4`` to
float32.

The tensor's scale is a first streamed pass (`weight_options`, as comfy_fp8's); then the weight is encoded in row
chunks of whole scale tiles (`ROW_BLOCK` = 128 rows), each giving its rows of every part (`_blocked`).

Smoothed (`options.pre_quant_scale`), the weight quantized is W / p by columns, what ModelOpt's AWQ export stores
(the reference is the quantizer above on ``w.float() / p``), and `decode` returns it times p: W's basis again, as
every reader of a decoded weight here expects (figures, `verify --forward`, the loader's decoded path). `calibrate`
makes each p_j a power of two, so W / p and decoded · p are exact in float32 and x · p exact in bf16, fp16 and
float32: a decoded x · (Q · p)ᵀ has the very products of ComfyUI's (x · p) · Qᵀ.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

import torch

from . import _blocked, _comfy
from .base import PartSpec, UnsupportedShapeError
from .options import NO_OPTIONS, FormatOptions

__all__ = [
    "FORMAT",
    "ComfyNvfp4",
    "LAYOUT",
    "WEIGHT",
    "SCALE",
    "SCALE_2",
    "INPUT_SCALE",
    "PRE_QUANT_SCALE",
    "BLOCK",
    "E2M1_MAX",
    "e2m1_codes",
]

LAYOUT = "nvfp4"
WEIGHT = "weight"
SCALE = "weight_scale"
SCALE_2 = "weight_scale_2"
INPUT_SCALE = _comfy.INPUT_SCALE  # only with a static input scale
PRE_QUANT_SCALE = _comfy.PRE_QUANT_SCALE  # only with smoothing
BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: the E2M1 values of the codes 0..15 (bit 3 the sign)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: the midpoints between consecutive magnitudes, and whether a value on one rounds up (the upper code is even)
_MIDPOINTS = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)


class ComfyNvfp4(_comfy.ComfyFormat):
    NAME = "comfy_nvfp4"
    ROW_SEPARABLE = True
    ROW_BLOCK = _blocked.TILE_ROWS
    WEIGHT_PARTS = (SCALE_2, _comfy.MARKER, INPUT_SCALE, PRE_QUANT_SCALE)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        own = self.layout(options)
        rows, cols = _blocked.padded_shape(*shape, BLOCK)
        smoothing = {}
        if own.pre_quant_scale is not None:
            if len(own.pre_quant_scale) != shape[1]:
                raise UnsupportedShapeError(
                    f"has {shape[1]} inputs and a pre_quant_scale of {len(own.pre_quant_scale)} values"
                )
            smoothing = {PRE_QUANT_SCALE: ("F32", (shape[1],))}
        return {
            WEIGHT: ("U8", (rows, cols // 2)),
            SCALE: ("F8_E4M3", _blocked.blocked_shape(rows, cols // BLOCK)),
            SCALE_2: ("F32", ()),
            _comfy.MARKER: self.marker_spec(options),
            **self.input_scale_spec(options),
            **smoothing,
        }

    def weight_options(
        self,
        chunks: Iterable[torch.Tensor],
        options: FormatOptions = NO_OPTIONS,
        shape: tuple[int, int] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The tensor's scale from its float32 row chunks: max|w| / 2688 (1 for an all-zero weight); smoothed, of
        the weight divided by the ``pre_quant_scale``."""
        own = self.layout(options)
        if own.pre_quant_scale is not None:
            p = _comfy.pre_quant_scale(own)
            chunks = (chunk.float() / p for chunk in chunks)
        return {"scale": _comfy.tensor_scale(_comfy.amax_of(chunks), E4M3_MAX * E2M1_MAX)}

    def encode(
        self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS, scale: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight, or a chunk of its rows starting on a tile (`scale`: the whole weight's).

        >>> p = FORMAT.encode(torch.tensor([[6.0, -3.0] + [0.0] * 14]))
        >>> p["weight"][0, 0].item(), FORMAT.decode(p)[0, :2].tolist()
        (125, [6.0, -3.0])
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_nvfp4 quantizes 2-D weights, got shape {list(weight.shape)}")
        own = self.layout(options)
        x = weight.float()
        smoothing = {}
        if own.pre_quant_scale is not None:
            p = _comfy.pre_quant_scale(own, x.device)
            x = x / p  # W · diag(1/p), ModelOpt's stored weight: exact for powers of two
            smoothing = {PRE_QUANT_SCALE: p}
        if scale is None:
            scale = self.weight_options([x], dataclasses.replace(own, pre_quant_scale=None))["scale"]
        x = _blocked.padded(x, BLOCK)
        rows, cols = x.shape
        blocks = x.view(rows, cols // BLOCK, BLOCK)
        block_scale = (blocks.abs().amax(dim=-1) / E2M1_MAX / scale).clamp_(max=E4M3_MAX)
        stored = block_scale.to(torch.float8_e4m3fn)
        total = (
            scale * stored.float()
        )  # the reference's order: the tensor's scale times the rounded block scale
        zero = total == 0
        scaled = blocks / torch.where(zero, 1.0, total).unsqueeze(-1)
        scaled.masked_fill_(zero.unsqueeze(-1), 0.0).clamp_(-E2M1_MAX, E2M1_MAX)
        codes = e2m1_codes(scaled.view(rows, cols))
        packed = (codes[:, 0::2] << 4) | codes[:, 1::2]
        return {
            WEIGHT: packed,
            SCALE: _blocked.to_blocked(stored),
            SCALE_2: scale,
            _comfy.MARKER: _comfy.marker(own),
            **self.input_scale_part(own),
            **smoothing,
        }

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """E2M1 value · (tensor scale · block scale) in float32 (comfy-kitchen's ``dequantize_nvfp4`` to float32),
        cast to `dtype` (comfy-kitchen's to bf16 rounds the scale product in bf16 first: a last bit apart); the
        padded weight (or its rows [r0, r1)): `Format.decoded` crops it. Smoothed, times the ``pre_quant_scale``
        by columns (the stored part where `parts` has it): W's basis, not the stored W / p."""
        own = self.layout(options)
        packed = parts[WEIGHT]
        r0, r1 = rows if rows is not None else (0, packed.shape[0])
        packed = packed[r0:r1]
        cols = packed.shape[1] * 2
        block = _blocked.from_blocked(parts[SCALE], r0, r1, cols // BLOCK)
        codes = torch.stack([packed >> 4, packed & 0x0F], dim=-1).view(r1 - r0, cols)
        values = _values(packed.device).index_select(0, codes.reshape(-1).int()).view(r1 - r0, cols)
        total = parts[SCALE_2].float() * block.float()
        blocks = values.view(r1 - r0, cols // BLOCK, BLOCK).mul_(total.unsqueeze(-1))
        w = blocks.view(r1 - r0, cols)
        if own.pre_quant_scale is not None:
            p = parts.get(PRE_QUANT_SCALE)
            p = _comfy.pre_quant_scale(own, w.device) if p is None else p.to(w.device, torch.float32)
            w[:, : p.shape[0]].mul_(p)  # the padded columns are zeros
        return w.to(dtype)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """The E2M1 codes (uint8, 0..15) of float32 values |x| <= 6: the nearest value, ties to the even code, the sign
    bit from x's sign (as comfy-kitchen's ``_f32_to_floatx_unpacked(x, 2, 1)`` gives)."""
    a = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for mid, up in _MIDPOINTS:
        code += (a >= mid) if up else (a > mid)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


@functools.cache
def _values(device: torch.device) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


FORMAT = ComfyNvfp4()
