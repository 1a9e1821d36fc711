"""`comfy_mxfp8`: ComfyUI's MXFP8 Linear (comfy-kitchen ``TensorCoreMXFP8Layout``, OCP microscaling): float8_e4m3fn
values with a power-of-two (E8M0) scale per block of 32 inputs. Blackwell GPUs (SM100+) multiply it natively; elsewhere
ComfyUI (and `loaders`) decode the weight. Twice NVFP4's bytes, with the finer block and 3 mantissa bits: the rung
`quantize sensitivity` raises an NVFP4 layer to.

On disk, per quantized Linear ``<m>``, for a weight [out, in] padded with zeros to [R, C] = [out, in] rounded up to
multiples of 32:
  ``<m>.weight``       float8_e4m3fn [R, C]
  ``<m>.weight_scale`` uint8 [R', C'/32 -> 4]  the E8M0 exponents (bias 127) in the tiled layout (`_blocked`); ComfyUI
                       views them as float8_e8m0fnu, and uint8 keeps the file readable by every safetensors reader
  ``<m>.comfy_quant``  uint8 [n]   UTF-8 JSON ``{"format": "mxfp8"}``

Reference numerics, bit for bit: comfy-kitchen's ``TensorCoreMXFP8Layout.quantize(w.float())``, i.e. the eager
``quantize_mxfp8(w.float(), pad_32x=...)``: per block b of 32, e = clamp(ceil(log2(max(max|b| / 448, 2^-127))) +
127, 0, 254) (torch's float32 log2, as the reference takes it); the block's values are e4m3(clamp(b / 2^(e - 127),
±448)); an all-zero block stores e = 0 and zeros. Decoding: e4m3 value · 2^(e - 127) in float32 (e = 0 reads as 0,
as comfy-kitchen's ``e8m0_to_f32`` has it), cast to the output dtype.

No whole-weight scale: the weight is encoded in row chunks of whole scale tiles (`ROW_BLOCK` = 128 rows).
"""

from __future__ import annotations

import torch

from . import _blocked, _comfy
from ._e4m3 import dequantize_rows
from .base import NonFiniteWeightError, PartSpec
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "ComfyMxfp8", "LAYOUT", "WEIGHT", "SCALE", "BLOCK", "e8m0_values"]

LAYOUT = "mxfp8"
WEIGHT = "weight"
SCALE = "weight_scale"
BLOCK = 32
E4M3_MAX = 448.0
E8M0_BIAS = 127


class ComfyMxfp8(_comfy.ComfyFormat):
    NAME = "comfy_mxfp8"
    ROW_SEPARABLE = True
    ROW_BLOCK = _blocked.TILE_ROWS
    WEIGHT_PARTS = (_comfy.MARKER,)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        self.layout(options)
        rows, cols = _blocked.padded_shape(*shape, BLOCK)
        return {
            WEIGHT: ("F8_E4M3", (rows, cols)),
            SCALE: ("U8", _blocked.blocked_shape(rows, cols // BLOCK)),
            _comfy.MARKER: self.marker_spec(options),
        }

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight, or a chunk of its rows starting on a tile.

        >>> p = FORMAT.encode(torch.tensor([[448.0, -1.0] + [0.0] * 30]))
        >>> p["weight_scale"][0, 0].item(), FORMAT.decode(p)[0, :2].tolist()
        (127, [448.0, -1.0])
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_mxfp8 quantizes 2-D weights, got shape {list(weight.shape)}")
        own = self.layout(options)
        x = weight.float()
        x = _blocked.padded(x, BLOCK)
        rows, cols = x.shape
        blocks = x.view(rows, cols // BLOCK, BLOCK)
        amax = blocks.abs().amax(dim=-1)
        if not bool(torch.isfinite(amax).all()):
            raise NonFiniteWeightError("holds NaN or Inf values")
        needed = (amax / E4M3_MAX).clamp_(min=2.0**-127)
        exponent = (torch.ceil(torch.log2(needed)).to(torch.int32) + E8M0_BIAS).clamp_(0, 254)
        zero = amax == 0
        exponent.masked_fill_(zero, 0)
        scale = torch.where(zero, 1.0, e8m0_values(exponent))
        scaled = (blocks / scale.unsqueeze(-1)).masked_fill_(zero.unsqueeze(-1), 0.0)
        q = scaled.clamp_(-E4M3_MAX, E4M3_MAX).view(rows, cols).to(torch.float8_e4m3fn)
        return {
            WEIGHT: q,
            SCALE: _blocked.to_blocked(exponent.to(torch.uint8)),
            _comfy.MARKER: _comfy.marker(own),
        }

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """e4m3 value · 2^(e - 127) in float32, cast to `dtype`; the padded weight (or its rows [r0, r1)):
        `Format.decoded` crops it."""
        q = parts[WEIGHT]
        r0, r1 = rows if rows is not None else (0, q.shape[0])
        cols = q.shape[1]
        scale = e8m0_values(_blocked.from_blocked(parts[SCALE], r0, r1, cols // BLOCK).to(torch.int32))
        values = dequantize_rows(q[r0:r1], torch.ones((), device=q.device), torch.float32)
        return (
            values.view(r1 - r0, cols // BLOCK, BLOCK).mul_(scale.unsqueeze(-1)).view(r1 - r0, cols).to(dtype)
        )


def e8m0_values(exponent: torch.Tensor) -> torch.Tensor:
    """2^(e - 127) of biased E8M0 exponents (int32), as float32; 0 for e = 0 (comfy-kitchen's ``e8m0_to_f32``)."""
    return torch.where(exponent == 0, 0, exponent << 23).view(torch.float32)


FORMAT = ComfyMxfp8()
