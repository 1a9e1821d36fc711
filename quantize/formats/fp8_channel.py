"""`fp8_channel`: float8_e4m3fn weights with one float32 scale per output channel.

On disk, per quantized Linear ``<m>``:
  ``<m>.weight``        float8_e4m3fn [out, in]
  ``<m>.weight_scale``  float32 [out, 1]         so that w ≈ weight.float() * weight_scale

Reference numerics, in float32 from the values as stored (fp32, fp16 or bf16):
  scale = rowmax|w| / 448;   q = e4m3(clamp(w / scale, -448, 448)), rounded to nearest even.
A row whose scale is 0 (all zeros, or too small for float32 after the division) gets scale 1,
so it stays finite and its values are exact zeros.

`quantization_config` follows the compressed-tensors schema (`float-quantized`): weights
float/8-bit/channel/symmetric/static, input activations float/8-bit/token/dynamic: each call's input
is quantized per row (per token) by the same arithmetic (`quantize_rows`), which the loader's `FP8ChannelLinear` calls.
"""

from __future__ import annotations

import torch

from . import format_info
from ._e4m3 import FP8_MAX, dequantize_rows
from ._e4m3 import quantize_rows as _e4m3_rows
from ._e4m3 import row_absmax as _row_absmax
from .base import Format, NonFiniteWeightError, PartSpec
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "Fp8Channel", "WEIGHT", "SCALE", "FP8_MAX", "quantize_rows"]

WEIGHT = "weight"
SCALE = "weight_scale"


class Fp8Channel(Format):
    NAME = "fp8_channel"
    ROW_SEPARABLE = True

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        return {WEIGHT: ("F8_E4M3", (out, inp)), SCALE: ("F32", (out, 1))}

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight row by row.

        >>> p = FORMAT.encode(torch.tensor([[1.0, -2.0], [0.0, 0.0]]))
        >>> p["weight_scale"].flatten().tolist(), FORMAT.decode(p).tolist()
        ([0.004464285913854837, 1.0], [[1.0, -2.0], [0.0, 0.0]])
        """
        if weight.dim() != 2:
            raise ValueError(f"fp8_channel quantizes 2-D weights, got shape {list(weight.shape)}")
        q, scale = quantize_rows(weight)
        if not bool(torch.isfinite(scale).all()):  # a NaN or Inf anywhere in a row makes its scale one
            raise NonFiniteWeightError("holds NaN or Inf values")
        return {WEIGHT: q, SCALE: scale}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """weight.float() * weight_scale, cast to `dtype`; only `rows` [r0, r1) of it if given."""
        return dequantize_rows(parts[WEIGHT], parts[SCALE], dtype, rows)

    def quantization_config(self, kept_linears: list[str]) -> dict:
        """compressed-tensors' config for FP8 channel-wise weights with dynamic per-token activations (nothing
        goes into the shards' ``__metadata__``: config.json says it all)."""

        def args(strategy: str, dynamic: bool) -> dict:
            return {
                "num_bits": 8,
                "type": "float",
                "symmetric": True,
                "strategy": strategy,
                "dynamic": dynamic,
                "group_size": None,
                "block_structure": None,
                "actorder": None,
                "observer": None if dynamic else "minmax",
                "observer_kwargs": {},
            }

        return {
            "quant_method": format_info(self.NAME).quant_method,
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": args("channel", False),
                    "input_activations": args("token", True),
                    "output_activations": None,
                    "format": "float-quantized",
                }
            },
            "ignore": sorted(kept_linears),
            "kv_cache_scheme": None,
            "global_compression_ratio": None,
        }


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn values, float32 scales [rows, 1]) of 2-D `x` quantized per row in float32 (from its values
    as they are): scale = rowmax|x| / 448 (0 taken as 1), q = e4m3(clamp(x / scale, ±448)), to nearest even. The
    weights (per output channel) and, in the loader's `FP8ChannelLinear`, each call's input (per token).

    >>> q, scale = quantize_rows(torch.tensor([[896.0, -1.0], [0.0, 0.0]]))
    >>> q.float().tolist(), scale.flatten().tolist()
    ([[448.0, -0.5], [0.0, 0.0]], [2.0, 1.0])
    """
    xf = x.float()
    return _e4m3_rows(xf, _row_absmax(xf).div_(FP8_MAX))


FORMAT = Fp8Channel()
