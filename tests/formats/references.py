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


# --- torchao_int8: torchao's own Int8Tensor.from_hp -----------------------------------------------------------


def torchao_int8_tensor(w: torch.Tensor):
    """What Int8DynamicActivationInt8WeightConfig() makes of a weight loaded in bf16: `Int8Tensor.from_hp` with the
    arguments its transform passes (``_int8_dynamic_activation_int8_weight_quantize_tensor``)."""
    from quantize.formats._torchao import torchao

    ao = torchao()
    cfg = ao.Int8DynamicActivationInt8WeightConfig()
    act, weight = ao.Int8Tensor._normalize_granularity(cfg.granularity)
    kwargs = ao.QuantizeTensorToInt8Kwargs(
        granularity=act, mapping_type=cfg.act_mapping_type, reduce_range=cfg.reduce_range
    )
    return ao.Int8Tensor.from_hp(
        w.to(torch.bfloat16), granularity=weight, act_quant_kwargs=kwargs, reduce_range=cfg.reduce_range
    )


def torchao_int8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """`torchao_int8_tensor`'s qdata, scale and zero_point, as torchao's safetensors layout names them."""
    ref = torchao_int8_tensor(w)
    return {"_weight_qdata": ref.qdata, "_weight_scale": ref.scale, "_weight_zero_point": ref.zero_point}


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


def _marker_json(conf: dict) -> torch.Tensor:
    """The marker as ComfyUI's own ``state_dict`` writes it: ``torch.tensor(list(json.dumps(conf).encode()))``."""
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def _marker(layout: str) -> torch.Tensor:
    return _marker_json({"format": layout})


def comfy_fp8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """scale = max|w|/M in float32 (M: the float8 type's largest value); comfy-kitchen's
    ``quantize_per_tensor_fp8(w.float(), scale, dtype)``."""
    from comfy_kitchen.backends.eager import quantization as ck

    dtype = getattr(torch, options.type_name)
    scale = w.float().abs().amax() / torch.finfo(dtype).max
    q = ck.quantize_per_tensor_fp8(w.float(), scale, dtype)
    return {"weight": q, "weight_scale": scale, "comfy_quant": _marker(options.type_name)}


def comfy_int8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """comfy-kitchen's eager ``quantize_int8_rowwise(w.float())``; for ConvRot, of the weight rotated by
    comfy-kitchen's Hadamard matrix with its own ``_rotate_weight``, in float64 (its float32 product's last bit
    depends on the BLAS's blocking; `test_comfy.py` holds the format within one step of it)."""
    from comfy_kitchen.backends.eager import quantization as ck

    if options.type_name == "int8_convrot":
        from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_weight

        h = _build_hadamard(256, dtype=torch.float64)
        q, scale = ck.quantize_int8_rowwise(_rotate_weight(w.double(), h, 256).float())
        marker = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
        return {"weight": q, "weight_scale": scale, "comfy_quant": _marker_json(marker)}
    q, scale = ck.quantize_int8_rowwise(w.float())
    return {"weight": q, "weight_scale": scale, "comfy_quant": _marker("int8_tensorwise")}


def comfy_nvfp4(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """comfy-kitchen's ``TensorCoreNVFP4Layout.quantize(w.float())`` (what ComfyUI's layout calls), keyed as its
    ``state_dict_tensors`` names the parts."""
    from comfy_kitchen.tensor import TensorCoreNVFP4Layout

    q, params = TensorCoreNVFP4Layout.quantize(w.float())
    return {
        "weight": q,
        "weight_scale": params.block_scale,
        "weight_scale_2": params.scale,
        "comfy_quant": _marker("nvfp4"),
    }


def comfy_mxfp8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """comfy-kitchen's ``TensorCoreMXFP8Layout.quantize(w.float())``; its E8M0 scales stored as their bytes (uint8,
    as Comfy-Org's comfy-quants stores them; ComfyUI views them as float8_e8m0fnu)."""
    from comfy_kitchen.tensor import TensorCoreMXFP8Layout

    q, params = TensorCoreMXFP8Layout.quantize(w.float())
    return {"weight": q, "weight_scale": params.scale.view(torch.uint8), "comfy_quant": _marker("mxfp8")}


def comfy_w4a4(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """comfy-kitchen's eager ``quantize_convrot_w4a4_weight(w.float(), g)`` (what ``TensorCoreConvRotW4A4Layout
    .quantize`` calls), its rotation by its own ``_rotate_weight`` with its Hadamard matrix in float64 (as
    comfy_int8's ConvRot: the float32 product's last bit depends on the BLAS's blocking)."""
    from comfy_kitchen.backends.eager import convrot_w4a4 as ck

    g = options.group
    h = ck._build_hadamard(g, dtype=torch.float64)
    q, scale = ck.quantize_signed_int4_rowwise(ck._rotate_weight(w.double(), h, g).float())
    marker = {"format": "convrot_w4a4", "convrot_groupsize": g}
    return {"weight": q, "weight_scale": scale, "comfy_quant": _marker_json(marker)}


def comfy_w4a8(w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """comfy-kitchen's ``AsymW4A8Int8Layout.quantize(w.float(), convrot_groupsize=g)`` (its defaults: groups of 16,
    the codebook, float8 group scales), its rotation (``rotate_int8_convrot_weight``, a float32 product whose last
    bit depends on the BLAS's blocking) the same product of its own Hadamard matrix in float64, as comfy_int8's;
    keyed as ComfyUI's loader reads the parts (``weight_s_rel``, ...; `test_comfy_w4a8.py` holds the format within
    one step of the float32 product)."""
    from comfy_kitchen.backends.eager import w4a8_int8 as ckw
    from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_weight
    from comfy_kitchen.tensor.w4a8_int8 import AsymW4A8Int8Layout

    def rotate64(x: torch.Tensor, group: int) -> torch.Tensor:
        return _rotate_weight(x.double(), _build_hadamard(group, dtype=torch.float64), group).to(x.dtype)

    group = options.group
    saved = ckw.rotate_int8_convrot_weight
    ckw.rotate_int8_convrot_weight = rotate64
    try:
        q, params = AsymW4A8Int8Layout.quantize(w.float(), convrot_groupsize=group)
    finally:
        ckw.rotate_int8_convrot_weight = saved
    marker = {"format": "asym_w4a8_int8", "group_size": params.group_size, "convrot_groupsize": group}
    return {
        "weight": q,
        "weight_s_rel": params.scale,
        "weight_s_channel": params.s_channel,
        "weight_codebook": params.codebook,
        "comfy_quant": _marker_json(marker),
    }


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
    "torchao_int8": torchao_int8,
    "nf4": nf4,
    "comfy_fp8": comfy_fp8,
    "comfy_int8": comfy_int8,
    "comfy_nvfp4": comfy_nvfp4,
    "comfy_mxfp8": comfy_mxfp8,
    "comfy_w4a8": comfy_w4a8,
    "comfy_w4a4": comfy_w4a4,
    "gguf": gguf,
}
