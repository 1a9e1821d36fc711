"""`torchao_int8`: TorchAO's own `Int8Tensor` (per-row int8 weights, dynamic per-row int8 activations), as diffusers
saves it: int8 W8A8 for GPUs without FP8 (RTX 30xx, A100) and for the CPU.

On disk, per quantized Linear ``<m>`` (torchao's safetensors layout):
  ``<m>._weight_qdata``       int8 [out, in]
  ``<m>._weight_scale``       float32 [out, 1]
  ``<m>._weight_zero_point``  int8 [out, 1], all zeros (symmetric; torchao stores it all the same)
and in every shard's ``__metadata__``: ``tensor_names`` (every tensor of the model) and, per tensor, torchao's JSON
(``{"_type": "Int8Tensor", ...}`` for quantized weights, ``{"_type": "Tensor"}`` otherwise), the whole model's in
every shard, as diffusers' `save_pretrained` writes it.

Numerics: those of ``Int8Tensor.from_hp(w, PerRow(), act_quant_kwargs=QuantizeTensorToInt8Kwargs(PerRow(),
SYMMETRIC))``, which ``Int8DynamicActivationInt8WeightConfig()`` (version 2) applies to a bf16 weight: w is first
rounded to bf16 (fp32 and fp16 sources included, as a model loaded in bf16 would be); scale = max(rowmax|w| / 127.5,
2⁻²³) computed in bf16 (127.5 = (127 - (-128)) / 2, the floor float32's eps), then widened to float32;
q = clamp(round(float32(w) · (1 / scale)), -128, 127), rounded half to even, the reciprocal in float32. An all-zero
row gets the floor as its scale and exact zeros, as torchao gives it (no difference here). Decoding: (q - zero
point) · scale in float32, torchao's `dequantize`.

torchao holds any 2-D shape (on CUDA its int8 matmul falls back where cuBLAS cannot take one), so none is refused.
"""

from __future__ import annotations

import functools
import json

import torch

from ._e4m3 import row_absmax
from ._torchao import TorchaoFormat, torchao
from .base import NonFiniteWeightError, PartSpec
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "TorchaoInt8", "QDATA", "SCALE", "ZERO_POINT", "quantize_rows", "to_int8_tensor"]

QDATA = "_weight_qdata"
SCALE = "_weight_scale"
ZERO_POINT = "_weight_zero_point"
HP_DTYPE = torch.bfloat16  # the precision the config quantizes from (a model loaded in bf16)
HALF_RANGE = 127.5  # torchao's symmetric divisor: (quant_max - quant_min) / 2 for int8
MIN_SCALE = torch.finfo(torch.float32).eps  # torchao's floor for a scale (2⁻²³, exact in bf16)


class TorchaoInt8(TorchaoFormat):
    NAME = "torchao_int8"
    ROW_SEPARABLE = True

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        return {QDATA: ("I8", (out, inp)), SCALE: ("F32", (out, 1)), ZERO_POINT: ("I8", (out, 1))}

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight as `Int8Tensor.from_hp` does for the config (see the module docstring).

        >>> p = FORMAT.encode(torch.tensor([[1.0, -127.5], [0.0, 0.0]]))
        >>> p["_weight_qdata"].tolist(), p["_weight_scale"].flatten().tolist()
        ([[1, -128], [0, 0]], [1.0, 1.1920928955078125e-07])
        """
        if weight.dim() != 2:
            raise ValueError(f"torchao_int8 quantizes 2-D weights, got shape {list(weight.shape)}")
        q, scale = quantize_rows(weight.to(HP_DTYPE))
        if not bool(torch.isfinite(scale).all()):  # a NaN or Inf anywhere in a row makes its scale one
            raise NonFiniteWeightError("holds NaN or Inf values")
        return {QDATA: q, SCALE: scale, ZERO_POINT: torch.zeros_like(scale, dtype=torch.int8)}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """(qdata - zero_point) · scale in float32, cast to `dtype`; only `rows` [r0, r1) of it if given."""
        q, scale, zero = parts[QDATA], parts[SCALE], parts[ZERO_POINT]
        if rows is not None:
            q, scale, zero = (t[rows[0] : rows[1]] for t in (q, scale, zero))
        return q.float().sub_(zero).mul_(scale).to(dtype)

    def config_dict(self) -> dict:
        """``Int8DynamicActivationInt8WeightConfig()``, as torchao's ``config_to_dict`` writes it."""
        return _CONFIG_DICT

    def weight_json(self, in_features: int) -> str:
        return _weight_json(in_features)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scales [rows, 1]) of 2-D `x` quantized per row in its own dtype, as torchao's
    ``Int8Tensor.from_hp(x, PerRow())`` (symmetric) does: ``choose_qparams_affine`` takes scale = max(rowmax|x| /
    127.5, 2⁻²³) in x's dtype, widened to float32; ``quantize_affine`` q = clamp(round(float32(x) · (1 / scale)),
    -128, 127), half to even. The weights (in bf16) and, in torchao's linear, the activations of each call."""
    scale = (row_absmax(x) / HALF_RANGE).clamp_(min=MIN_SCALE).float()
    return (x.float() * (1.0 / scale)).round_().clamp_(-128, 127).to(torch.int8), scale


@functools.cache
def _config():
    return torchao().Int8DynamicActivationInt8WeightConfig()


# torchao's serialized forms, written without importing torchao: what its `config_to_dict` gives for `_config()`
# and its `TensorSubclassAttributeJSONEncoder` for the `Int8Tensor` that `to_int8_tensor` builds. Tests hold them
# equal, string for string, to torchao's own encoders.
def _enum(kind: str, value: str) -> dict:
    return {"_type": kind, "_data": value}


_SYMMETRIC = _enum("MappingType", "SYMMETRIC")
_CONFIG_DICT = {
    "_type": "Int8DynamicActivationInt8WeightConfig",
    "_version": 2,
    "_data": {
        "act_mapping_type": _SYMMETRIC,
        "weight_only_decode": False,
        "granularity": {"_type": "PerRow", "_version": 1, "_data": {"dim": -1}},
        "set_inductor_config": True,
        "reduce_range": False,
    },
}


def to_int8_tensor(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The stored parts as torchao's `Int8Tensor`, with the config's dynamic activation quantization.

    The format's own view of its parts, as torchao serializes them: `checkpoint_metadata` writes the JSON torchao
    encodes one into (tested string for string); the loader's `TorchaoInt8Linear.weight` wraps its buffers in one (no
    copy). Built as the config's ``_int8_dynamic_activation_int8_weight_quantize_tensor`` builds it."""
    ao, cfg = torchao(), _config()
    act_granularity, _ = ao.Int8Tensor._normalize_granularity(cfg.granularity)
    qdata = parts[QDATA]
    return ao.Int8Tensor(
        qdata,
        parts[SCALE],
        block_size=[1, qdata.shape[1]],
        dtype=HP_DTYPE,
        zero_point=parts[ZERO_POINT],
        act_quant_kwargs=ao.QuantizeTensorToInt8Kwargs(
            granularity=act_granularity, mapping_type=cfg.act_mapping_type, reduce_range=cfg.reduce_range
        ),
        reduce_range=cfg.reduce_range,
    )


@functools.cache
def _weight_json(in_features: int) -> str:
    """torchao's JSON for a quantized weight of `in_features` columns (it does not depend on the data)."""
    act_quant_kwargs = {
        "granularity": {"_type": "PerRow", "_data": {"dim": -1}},
        "mapping_type": _SYMMETRIC,
        "reduce_range": False,
    }
    data = {
        "act_quant_kwargs": {"_type": "QuantizeTensorToInt8Kwargs", "_data": act_quant_kwargs},
        "reduce_range": False,
        "block_size": [1, in_features],
        "dtype": _enum("torch.dtype", "bfloat16"),
    }
    return json.dumps(
        {"_type": "Int8Tensor", "_data": data, "_tensor_data_names": ["zero_point", "qdata", "scale"]}
    )


FORMAT = TorchaoInt8()
