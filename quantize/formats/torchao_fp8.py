"""`torchao_fp8`: TorchAO's own `Float8Tensor` (PerRow weight, dynamic PerRow activations), as diffusers saves it.

On disk, per quantized Linear ``<m>`` (torchao's safetensors layout):
  ``<m>._weight_qdata``  float8_e4m3fn [out, in]
  ``<m>._weight_scale``  float32 [out, 1]
and in every shard's ``__metadata__``: ``tensor_names`` (every tensor of the model) and, per tensor,
torchao's JSON (``{"_type": "Float8Tensor", ...}`` for quantized weights, ``{"_type": "Tensor"}``
otherwise). The whole model's metadata goes into every shard, as diffusers' `save_pretrained` does,
because its loader merges the shards' metadata.

Numerics: those of ``Float8Tensor.from_hp(w, granularity=PerRow(), ...)`` on the CPU, which
`Float8DynamicActivationFloat8WeightConfig` applies to a bf16 weight: w is first rounded to bf16
(fp32 and fp16 sources included, as a model loaded in bf16 would be); scale = rowmax|w| / 448
computed in bf16, then widened to float32; q = e4m3(clamp(float32(w) / scale, ±448)). One deliberate
difference: where torchao's scale is 0 (an all-zero row) it divides 0 by 0 and stores NaN; we store
scale 1 and exact zeros, as `fp8_channel` does.

Both dims must be multiples of 16 (`torch._scaled_mm`); torchao itself would silently leave such a
weight in bf16, we refuse it at planning time so the recipe says what happens.
"""

from __future__ import annotations

import functools
import json

import torch

from ._e4m3 import FP8_MAX, dequantize_rows, quantize_rows, row_absmax
from ._torchao import TorchaoFormat, torchao
from .base import NonFiniteWeightError, PartSpec, UnsupportedShapeError
from .options import NO_OPTIONS, FormatOptions

__all__ = ["FORMAT", "TorchaoFp8", "QDATA", "SCALE", "to_float8_tensor", "quantize_activation"]

QDATA = "_weight_qdata"
SCALE = "_weight_scale"
HP_DTYPE = torch.bfloat16  # the precision torchao's PerRow config quantizes from


class TorchaoFp8(TorchaoFormat):
    NAME = "torchao_fp8"
    ROW_SEPARABLE = True

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        if out % 16 or inp % 16:
            raise UnsupportedShapeError(
                f"is [{out}, {inp}]; torchao_fp8 needs both dims to be multiples of 16 (torch._scaled_mm)"
            )
        return {QDATA: ("F8_E4M3", (out, inp)), SCALE: ("F32", (out, 1))}

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight as `Float8Tensor.from_hp` does on the CPU (see the module docstring)."""
        if weight.dim() != 2:
            raise ValueError(f"torchao_fp8 quantizes 2-D weights, got shape {list(weight.shape)}")
        w = weight.to(HP_DTYPE)
        amax = row_absmax(w)
        if not bool(torch.isfinite(amax).all()):
            raise NonFiniteWeightError("holds NaN or Inf values")
        # the division in bf16, as torchao's _choose_scale_float8 does
        q, scale = quantize_rows(w.float(), (amax / FP8_MAX).float())
        return {QDATA: q, SCALE: scale}

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """qdata.float() * scale, cast to `dtype`; only `rows` [r0, r1) of it if given."""
        return dequantize_rows(parts[QDATA], parts[SCALE], dtype, rows)

    def config_dict(self) -> dict:
        """``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``, as torchao's ``config_to_dict`` writes it."""
        return _CONFIG_DICT

    def weight_json(self, in_features: int) -> str:
        return _weight_json(in_features)


@functools.cache
def _config():
    ao = torchao()
    return ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())


# torchao's serialized forms, written without importing torchao (1.4 s of a conversion): what its
# `config_to_dict` gives for `_config()` and its `TensorSubclassAttributeJSONEncoder` for the `Float8Tensor`
# that `to_float8_tensor` builds. Tests hold them equal, string for string, to torchao's own encoders.
def _enum(kind: str, value: str) -> dict:
    return {"_type": kind, "_data": value}


_E4M3 = _enum("torch.dtype", "float8_e4m3fn")
_AUTO = _enum("KernelPreference", "AUTO")
_MM = {"emulate": False, "use_fast_accum": True, "pad_inner_dim": False}
_CONFIG_DICT = {
    "_type": "Float8DynamicActivationFloat8WeightConfig",
    "_version": 2,
    "_data": {
        "activation_dtype": _E4M3,
        "weight_dtype": _E4M3,
        "granularity": [{"_type": "PerRow", "_version": 1, "_data": {"dim": -1}}] * 2,
        "packing_format": _enum("Float8PackingFormat", "PLAIN"),
        "mm_config": {"_type": "Float8MMConfig", "_version": 1, "_data": _MM},
        "activation_value_lb": None,
        "activation_value_ub": None,
        "kernel_preference": _AUTO,
        "set_inductor_config": True,
        "alg_id": 0,
    },
}


def to_float8_tensor(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """The stored parts as torchao's `Float8Tensor`, with the config's mm_config and activation quantization.

    The format's own view of its parts, as torchao serializes them: `checkpoint_metadata` writes the JSON torchao
    encodes one into (tested string for string), and the loader's `TorchaoFP8Linear` wraps its buffers in one (no
    copy) on each call."""
    ao, cfg = torchao(), _config()
    act_granularity, _ = cfg.granularity
    act_quant_kwargs = ao.QuantizeTensorToFloat8Kwargs(
        cfg.activation_dtype,
        act_granularity,
        hp_value_lb=cfg.activation_value_lb,
        hp_value_ub=cfg.activation_value_ub,
        kernel_preference=cfg.kernel_preference,
    )
    qdata = parts[QDATA]
    return ao.Float8Tensor(
        qdata,
        parts[SCALE],
        block_size=[1, qdata.shape[1]],
        mm_config=cfg.mm_config,
        act_quant_kwargs=act_quant_kwargs,
        kernel_preference=cfg.kernel_preference,
        dtype=HP_DTYPE,
    )


def quantize_activation(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The activations `x` as torchao's linear on the `Float8Tensor` `weight` quantizes them (reference: torchao's
    ``_choose_quant_func_and_quantize_tensor(x, weight.act_quant_kwargs)``, what its ``F.linear`` dispatch calls):
    a `Float8Tensor` whose ``qdata`` and ``scale`` are the float8 values and their per-row float32 scales."""
    return torchao().quantize_activation(x, weight.act_quant_kwargs)


@functools.cache
def _weight_json(in_features: int) -> str:
    """torchao's JSON for a quantized weight of `in_features` columns (it does not depend on the data)."""
    act_quant_kwargs = {
        "float8_dtype": _E4M3,
        "granularity": {"_type": "PerRow", "_data": {"dim": -1}},
        "mm_config": None,
        "hp_value_lb": None,
        "hp_value_ub": None,
        "kernel_preference": _AUTO,
    }
    data = {
        "block_size": [1, in_features],
        "mm_config": {"_type": "Float8MMConfig", "_data": _MM},
        "act_quant_kwargs": {"_type": "QuantizeTensorToFloat8Kwargs", "_data": act_quant_kwargs},
        "kernel_preference": _AUTO,
        "dtype": _enum("torch.dtype", "bfloat16"),
    }
    return json.dumps({"_type": "Float8Tensor", "_data": data, "_tensor_data_names": ["qdata", "scale"]})


FORMAT = TorchaoFp8()
