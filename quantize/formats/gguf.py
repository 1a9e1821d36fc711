"""`gguf`: GGML's block types for Linear weights, one GGUF file per model (ComfyUI-GGUF, diffusers' GGUF loader).

A quantized Linear ``<m>`` is one tensor ``<m>.weight`` of the recipe's GGML type for it (its ``type``, or the
type of the first of its ``types`` patterns that matches): rows of blocks, each block 32 values (Q8_0, Q5_0,
Q5_1, Q4_0, Q4_1) or 256 (Q6_K, Q5_K, Q4_K). Rows never share a block, so a weight is encoded row chunk by
row chunk (`ROW_SEPARABLE`); a part's rows are held as their bytes (uint8 [rows, row bytes]).

Reference numerics, bit for bit:
- Q8_0 and the ``_0`` / ``_1`` types: gguf-py's ``gguf.quants.quantize(w.float().numpy(), type)`` (pure
  numpy), whose bytes ggml's own quantizer gives too (tested). Q8_0, the most used, is quantized in torch
  (`_q8_0`, the same bytes, tested against both); for the others ggml's is used where it is installed
  (much faster), gguf-py's otherwise;
- the K-quants: ggml's own reference quantizer, ``ggml_quantize_chunk`` without an importance matrix, called
  through ggml-python (the optional extra ``dit-quantize[gguf]``; its absence is one error naming the extra).
Decoding: every type in torch, on the bytes' own device (`_q8_0`, `_kquants`, `_legacy_quants`: gguf-py's
``gguf.quants.dequantize`` values bit for bit, tested on arbitrary bytes; Q8_0 and the K-quants several times
faster on the CPU, the _0 / _1 types somewhat, most of their time the fresh float32 result).

What is known of each type (block size, bytes a block, GGML id, K-quant or not, the next type up) is its row of
the one GGML table, `quantize.ggml_types`; a tensor's type reaches the hooks as its `GgufOptions`.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import numpy as np
import torch

from .. import dtypes
from ..errors import InputError
from ..ggml_types import GGML_TYPES, GGMLType
from . import _kquants, _legacy_quants, _q8_0
from .base import Format, NonFiniteWeightError, PartSpec, UnsupportedShapeError
from .options import NO_OPTIONS, FormatOptions, GgufOptions

__all__ = ["FORMAT", "Gguf", "WEIGHT", "EXTRA"]

WEIGHT = "weight"
EXTRA = "pip install 'dit-quantize[gguf]'"
_K_QUANTS = ", ".join(t.name for t in GGML_TYPES if t.k_quant)


def _type(options: FormatOptions) -> GGMLType:
    if not isinstance(options, GgufOptions):
        raise ValueError(f"gguf needs a GGML type, one of {', '.join(GgufOptions.TYPES)}; got {options!r}")
    return options.ggml


@functools.cache
def _gguf():
    try:
        import gguf
        import gguf.quants
    except ImportError:
        raise InputError(f"the gguf format needs gguf-py: {EXTRA}") from None
    return gguf


@functools.cache
def _ggml():
    try:
        import ggml
    except ImportError:
        raise InputError(f"the K-quants ({_K_QUANTS}) need ggml's own quantizer: {EXTRA}") from None
    return ggml


@functools.cache
def _has_ggml() -> bool:
    try:
        _ggml()
    except InputError:
        return False
    return True


def _zero_blocks_as_gguf_py(w: np.ndarray, q: np.ndarray, t) -> None:
    """Blocks whose values are all zero (of either sign) in gguf-py's bytes, the reference: for them ggml writes
    the other sign of zero in the scale (and the min) of the _0/_1 types. The same values; now the same bytes.
    Reference: ``gguf.quants.quantize(block, type)`` on each such block (a block's bytes depend on it alone)."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // t.block, t.block)
    zero = ~np.any(blocks != 0, axis=-1)
    if zero.any():
        g = _gguf()
        fixed = g.quants.quantize(np.ascontiguousarray(blocks[zero]), g.GGMLQuantizationType[t.name])
        q.reshape(rows, cols // t.block, t.type_size)[zero] = fixed.reshape(-1, t.type_size)


class Gguf(Format):
    NAME = "gguf"
    ROW_SEPARABLE = True
    WIDENS_KEPT = True  # `kept_dtype`: F32 for all but the 2-D Linear weights

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        t = _type(options)
        multiple = t.in_features_multiple
        if len(shape) != 2 or shape[1] % multiple:
            raise UnsupportedShapeError(
                f"is {list(shape)}; {t.name} stores rows in blocks of {t.block}: "
                f"in_features must be a multiple of {multiple}"
            )
        return {WEIGHT: (t.name, tuple(shape))}

    def stored_options(
        self, dtype_of: Callable[[str], str | None], read: Callable[[str], torch.Tensor] | None = None
    ) -> GgufOptions | None:
        """The GGML type the stored weight is in; None for a weight kept lossless (BF16, F16, F32)."""
        stored = dtype_of(WEIGHT)
        return GgufOptions(stored) if stored in GgufOptions.TYPES else None

    def check_available(self, options: FormatOptions) -> None:
        """Refuse, naming the extra, a type whose quantizer is not installed (the plan asks, before any writing)."""
        _ggml() if _type(options).k_quant else _gguf()

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """The rows of a 2-D weight in the GGML type of `options`, as uint8 [rows, row bytes]."""
        t = _type(options)
        if t.name == "Q8_0":  # the most used type, in torch (ggml's bytes, 2.5x faster than its C)
            return {WEIGHT: _q8_0.quantize(weight.float().contiguous())}
        w = np.ascontiguousarray(weight.float().numpy())
        if not np.isfinite(w).all():
            raise NonFiniteWeightError("holds NaN or Inf values")
        rows, cols = w.shape
        row_bytes = dtypes.nbytes(t.name, (cols,))
        if not t.k_quant and not _has_ggml():
            g = _gguf()
            q = g.quants.quantize(w, g.GGMLQuantizationType[t.name])
        else:  # ggml's own C quantizer: the same bytes as gguf-py's for the _0/_1 types (tested), many times faster
            ggml = _ggml()
            q = np.empty((rows, row_bytes), dtype=np.uint8)
            src = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            written = ggml.ggml_quantize_chunk(t.id, src, q.ctypes.data, 0, rows, cols, None)
            if written != rows * row_bytes:
                raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes for {rows} rows of {t.name}")
            if not t.k_quant:
                _zero_blocks_as_gguf_py(w, q, t)
        return {WEIGHT: torch.from_numpy(np.ascontiguousarray(q)).view(rows, row_bytes)}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """The dequantized rows (gguf-py's dequantization's values, decoded in torch for Q8_0, the K-quants
        and the _0 / _1 types), cast to `dtype`."""
        t = _type(options)
        q = parts[WEIGHT]
        if rows is not None:
            q = q[rows[0] : rows[1]]
        if t.name == "Q8_0":  # the most used types, decoded in place (gguf-py's values, several times faster)
            return _q8_0.dequantize(q).to(dtype)
        if t.k_quant:
            return _kquants.dequantize(q, t.name).to(dtype)
        if t.name in _legacy_quants.TYPES:
            return _legacy_quants.dequantize(q, t.name).to(dtype)
        g = _gguf()
        values = g.quants.dequantize(q.contiguous().numpy(), g.GGMLQuantizationType[t.name])
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(dtype)

    def quantization_config(self, kept_linears: list[str]) -> dict:
        """config.json's declaration (GGUF readers read the file's own types, not this; a GGUF file has no
        safetensors metadata)."""
        return {"quant_method": "gguf", "ignore": sorted(kept_linears)}

    def kept_dtype(
        self, source_dtype: str, shape: tuple[int, ...], linear_weight: bool, recipe_dtype: str
    ) -> str | None:
        """What a kept tensor becomes in a GGUF file, whatever the recipe's keep_dtype (which must be `source`): a
        2-D Linear weight stays lossless as stored (BF16, F16, F32); every other float tensor (biases, norms,
        modulation, the 5-D patch embedding) is F32, which diffusers' GGUF loader needs (it breaks on a BF16
        Conv3d weight) and ComfyUI-GGUF reads."""
        if linear_weight and source_dtype in ("BF16", "F16", "F32"):
            return source_dtype
        return "F32" if source_dtype in ("BF16", "F16", "F32", "F64") else None  # None: GGUF cannot hold it

    def raised(self, options: FormatOptions) -> GgufOptions | None:
        """The next GGML type up (the table's `raised`: Q4_K -> Q5_K -> Q6_K -> Q8_0); None after Q8_0."""
        up = _type(options).raised
        return None if up is None else GgufOptions(up)


FORMAT = Gguf()
