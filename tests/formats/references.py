"""Each registered format's reference quantizer (DESIGN.md "Formats"), spelled with the reference libraries and
none of our code: ``REFERENCES[name](weight, options)`` gives the parts that format's `encode` must give, bit for
bit. The contract test (`test_contract.py`) holds every registered format to its entry; a format registered
without one fails there.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable

import numpy as np
import torch

from quantize.formats import FormatOptions

Reference = Callable[[torch.Tensor, FormatOptions], dict[str, torch.Tensor]]


# --- fp8_channel: DESIGN.md's formula, e4m3fn decoded from its bits and rounded by hand ---------------------


def _e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite non-negative e4m3fn value (sorted) and its 7-bit code, decoded from the bit layout."""
    values, codes = [], []
    for code in range(0x7F):  # 0x7F is NaN
        exp, mant = code >> 3, code & 7
        v = (mant / 8) * 2.0**-6 if exp == 0 else (1 + mant / 8) * 2.0 ** (exp - 7)
        values.append(v)
        codes.append(code)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(codes)


def e4m3_bits(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values (|x| <= 448) to e4m3fn, nearest, ties to even; returns the uint8 bit patterns."""
    values, codes = _e4m3_table()
    a = x.double().abs().flatten()
    hi = torch.searchsorted(values, a).clamp(max=len(values) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - values[lo], values[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0) & (hi != lo))
    code = torch.where(pick_hi, codes[hi], codes[lo])
    sign = (torch.signbit(x.flatten())).to(torch.int64) << 7
    return (code | sign).to(torch.uint8).reshape(x.shape)


def fp8_channel(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """scale = rowmax|w|/448 in float32; q = e4m3(clamp(w/scale, ±448)); a zero scale -> 1 (the compressed-tensors
    formula, whose decompressor `test_fp8_channel_compressed_tensors.py` runs on a converted checkpoint)."""
    w32 = w.to(torch.float32)
    scale = w32.abs().amax(dim=1, keepdim=True) / 448.0
    scale[scale == 0] = 1.0
    q = e4m3_bits((w32 / scale).clamp(-448, 448)).view(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale}


# --- torchao_fp8: torchao's own Float8Tensor.from_hp ----------------------------------------------------------


def torchao_float8(w: torch.Tensor):
    """What Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()) makes of a weight loaded in bf16."""
    from quantize.formats._torchao import torchao

    ao = torchao()
    cfg = ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())
    act, weight = cfg.granularity
    kwargs = ao.QuantizeTensorToFloat8Kwargs(
        cfg.activation_dtype, act, kernel_preference=cfg.kernel_preference
    )
    return ao.Float8Tensor.from_hp(
        w.to(torch.bfloat16),
        float8_dtype=cfg.weight_dtype,
        granularity=weight,
        mm_config=cfg.mm_config,
        kernel_preference=cfg.kernel_preference,
        act_quant_kwargs=kwargs,
    )


def torchao_fp8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """`torchao_float8`'s qdata and scale. Where torchao's scale is 0 (an all-zero row) it stores NaN (0 / 0); the
    format's one documented difference is scale 1 and exact zeros there, signs kept (`test_torchao_fp8.py` shows
    both)."""
    ref = torchao_float8(w)
    q, scale = ref.qdata.clone(), ref.scale.clone()
    zero = (scale == 0).flatten()
    q.view(torch.uint8)[zero] = w[zero].float().to(torch.float8_e4m3fn).view(torch.uint8)  # ±0 / 1
    scale[zero] = 1.0
    return {"_weight_qdata": q, "_weight_scale": scale}


# --- nf4: bitsandbytes' quantize_4bit --------------------------------------------------------------------------


def nf4(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """bitsandbytes' own result for the weight loaded in bf16, keyed as Linear4bit stores it (on one thread: the
    nested offset is a mean, whose last bit bitsandbytes computes differently on more)."""
    import bitsandbytes.functional as F

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        packed, state = F.quantize_4bit(
            w.to(torch.bfloat16), blocksize=64, compress_statistics=True, quant_type="nf4"
        )
    finally:
        torch.set_num_threads(saved)
    return {"weight": packed, **{f"weight.{k}": v for k, v in state.as_dict(packed=True).items()}}


# --- ComfyUI: comfy-kitchen's eager quantizers, and the marker ComfyUI's tooling writes ------------------------


def _marker(layout: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps({"format": layout}).encode()), dtype=torch.uint8)


def comfy_fp8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """scale = max|w|/448 in float32; comfy-kitchen's ``quantize_per_tensor_fp8(w.float(), scale)``."""
    from comfy_kitchen.backends.eager import quantization as ck

    scale = w.float().abs().amax() / 448.0
    q = ck.quantize_per_tensor_fp8(w.float(), scale)
    return {"weight": q, "weight_scale": scale, "comfy_quant": _marker("float8_e4m3fn")}


def comfy_int8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """comfy-kitchen's eager ``quantize_int8_rowwise(w.float())``."""
    from comfy_kitchen.backends.eager import quantization as ck

    q, scale = ck.quantize_int8_rowwise(w.float())
    return {"weight": q, "weight_scale": scale, "comfy_quant": _marker("int8_tensorwise")}


# --- gguf: gguf-py's quantizers; ggml's own reference quantizer for the K-quants --------------------------------


def ggml_quantize_chunk(w: np.ndarray, type_name: str) -> np.ndarray:
    """ggml's own C quantizer (``ggml_quantize_chunk``, no importance matrix), through ggml-python."""
    import ggml
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = w.shape
    out = np.zeros((rows, cols // block * type_size), dtype=np.uint8)
    src = np.ascontiguousarray(w, dtype=np.float32)
    ggml.ggml_quantize_chunk(
        int(qtype), src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data, 0, rows, cols, None
    )
    return out


def gguf_py_quantize(w: np.ndarray, type_name: str) -> np.ndarray:
    """gguf-py's ``gguf.quants.quantize`` (pure numpy)."""
    import gguf

    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name])


def gguf(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """Q8_0 and the ``_0`` / ``_1`` types: gguf-py's quantizer; the K-quants: ggml's own."""
    name = options.type_name
    x = w.float().numpy()
    q = ggml_quantize_chunk(x, name) if name.endswith("_K") else gguf_py_quantize(x, name)
    return {"weight": torch.from_numpy(np.ascontiguousarray(q))}


#: format name -> its reference quantizer
REFERENCES: dict[str, Reference] = {
    "fp8_channel": fp8_channel,
    "torchao_fp8": torchao_fp8,
    "nf4": nf4,
    "comfy_fp8": comfy_fp8,
    "comfy_int8": comfy_int8,
    "gguf": gguf,
}
