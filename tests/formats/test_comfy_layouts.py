"""ComfyUI's newer layouts: NVFP4, MXFP8, ConvRot int8, e5m2 fp8; read back by comfy-kitchen's layout classes, their
markers, padding, zero blocks, and what ComfyUI's loader reads off them. Bit-exactness to comfy-kitchen's quantizers on
bf16, fp16 and fp32, row chunks and non-finite weights are `test_contract.py`'s.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from comfy_kitchen.backends.eager import quantization as ck
from comfy_kitchen.tensor import (
    QuantizedTensor,
    TensorCoreMXFP8Layout,
    TensorCoreNVFP4Layout,
    TensorWiseINT8Layout,
)
from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout

from quantize.formats import ComfyOptions, UnfittedShapeError, _comfy, _hadamard, get_format
from quantize.formats.comfy_int8 import hadamard_rotate
from quantize.formats.comfy_nvfp4 import e2m1_codes

nvfp4, mxfp8 = get_format("comfy_nvfp4"), get_format("comfy_mxfp8")
fp8, int8 = get_format("comfy_fp8"), get_format("comfy_int8")
E5M2, CONVROT = ComfyOptions("float8_e5m2"), ComfyOptions("int8_convrot")


def _weight(shape, dtype=torch.bfloat16, seed=0):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[3, 5] = 0.9  # an outlier: the tensor's scale, and its block's
    w[4, :40] = 0  # all-zero blocks
    return w.to(dtype)


def _qt(fmt, parts, shape, dtype, options=None):
    """Our stored parts as comfy-kitchen's QuantizedTensor, built as ComfyUI's loader builds it (ops.py)."""
    if fmt is nvfp4:
        params = TensorCoreNVFP4Layout.Params(
            scale=parts["weight_scale_2"],
            block_scale=parts["weight_scale"],
            orig_dtype=dtype,
            orig_shape=shape,
        )
        return QuantizedTensor(parts["weight"], "TensorCoreNVFP4Layout", params)
    if fmt is mxfp8:
        params = TensorCoreMXFP8Layout.Params(
            scale=parts["weight_scale"].view(torch.float8_e8m0fnu), orig_dtype=dtype, orig_shape=shape
        )
        return QuantizedTensor(parts["weight"], "TensorCoreMXFP8Layout", params)
    if fmt is int8:
        params = TensorWiseINT8Layout.Params(
            scale=parts["weight_scale"],
            orig_dtype=dtype,
            orig_shape=shape,
            convrot=True,
            convrot_groupsize=256,
        )
        return QuantizedTensor(parts["weight"], "TensorWiseINT8Layout", params)
    params = TensorCoreFP8Layout.Params(scale=parts["weight_scale"], orig_dtype=dtype, orig_shape=shape)
    return QuantizedTensor(parts["weight"], "TensorCoreFP8Layout", params)


@pytest.mark.parametrize("shape", [(256, 512), (300, 100), (17, 40)], ids=str)
@pytest.mark.parametrize("fmt", [nvfp4, mxfp8], ids=lambda f: f.NAME)
def test_comfy_kitchens_layout_dequantizes_our_parts_as_we_decode_them(fmt, shape):
    """Padded shapes included (rows and columns not whole blocks): the layout's dequantize of our parts, cropped to
    the weight as ComfyUI's loader crops it, is our decoding bit for bit in float32."""
    w = _weight(shape)
    parts = fmt.encode(w)
    ours = fmt.decoded(parts, shape, torch.float32)
    theirs = _qt(fmt, parts, shape, torch.float32).dequantize()[: shape[0], : shape[1]]
    assert torch.equal(theirs, ours)
    assert not ours[4, :32].any()  # the zero blocks
    # in bf16 (ComfyUI's compute dtype) within a bf16 rounding
    bf16 = _qt(fmt, parts, shape, torch.bfloat16).dequantize()[: shape[0], : shape[1]]
    assert torch.allclose(bf16.float(), ours, rtol=2**-7, atol=0)


def test_padded_parts_have_comfy_kitchens_storage_shapes():
    for fmt, layout in ((nvfp4, TensorCoreNVFP4Layout), (mxfp8, TensorCoreMXFP8Layout)):
        for shape in ((300, 100), (17, 40), (5120, 13824)):
            specs = fmt.parts(shape)
            stored = layout.get_storage_shape(shape) if fmt is nvfp4 else layout.get_padded_shape(shape)
            assert specs["weight"][1] == tuple(stored), (fmt.NAME, shape)


def test_nvfp4_codes_round_to_nearest_ties_to_even_as_comfy_kitchen():
    """Every tie between E2M1 values, values just off them, the saturation and both zeros."""
    from comfy_kitchen.float_utils import _f32_to_floatx_unpacked

    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    near = torch.cat([mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(9.0))])
    x = torch.cat([near, -near, torch.tensor([0.0, -0.0, 6.0, -6.0, 1e-30, -1e-30])])
    assert torch.equal(e2m1_codes(x), _f32_to_floatx_unpacked(x, 2, 1))
    assert e2m1_codes(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])).tolist() == [0, 2, 2, 4, 4, 6, 6]


def test_an_all_zero_nvfp4_weight_gets_scale_one_and_zeros():
    """comfy-kitchen divides 0 by 0 there (NaN scales); we store s = 1 and zeros, which it reads back as zeros."""
    parts = nvfp4.encode(torch.zeros(32, 64, dtype=torch.bfloat16))
    assert float(parts["weight_scale_2"]) == 1.0 and not parts["weight"].any()
    theirs = _qt(nvfp4, parts, (32, 64), torch.float32).dequantize()
    assert not theirs.any() and not nvfp4.decode(parts).any()
    q, params = TensorCoreNVFP4Layout.quantize(torch.zeros(32, 64))
    assert params.block_scale.float().isnan().any()  # the reference's own result: NaN block scales


def test_the_nvfp4_and_mxfp8_linears_run_in_comfy_kitchen_as_decoded():
    """comfy-kitchen's F.linear on our parts (it dequantizes where there is no FP4/MXFP8 GEMM, as on the CPU)."""
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(3))
    for fmt in (nvfp4, mxfp8):
        w = _weight((256, 512), torch.float32, seed=1)
        parts = fmt.encode(w)
        got = F.linear(x, _qt(fmt, parts, (256, 512), torch.float32))
        assert torch.allclose(got, F.linear(x, fmt.decoded(parts, (256, 512), torch.float32)), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_convrot_is_within_one_int8_step_of_comfy_kitchens_float32_rotation(dtype):
    """Our exactly rounded rotation against comfy-kitchen's own call (a float32 product): the same scales to a
    float32 summation error, the codes at most one step apart and nearly all equal."""
    w = _weight((384, 1024), dtype, seed=5)
    ours = int8.encode(w, CONVROT)
    q, scale = ck.quantize_int8_convrot_weight(w.float(), 256)
    assert torch.allclose(ours["weight_scale"], scale, rtol=1e-5, atol=0)  # its float32 sums of 256 products
    diff = (ours["weight"].int() - q.int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 1e-3


def test_convrot_rotation_is_the_same_for_any_rows_and_threads():
    """The float32 product comfy-kitchen rotates with differs with the number of rows and of threads on this CPU;
    ours does not (what keeps a conversion byte-identical whatever its chunks and workers)."""
    w = torch.randn(512, 1536, generator=torch.Generator().manual_seed(6))
    whole = hadamard_rotate(w)
    saved = torch.get_num_threads()
    try:
        for threads in (1, saved):
            torch.set_num_threads(threads)
            rows = torch.cat([hadamard_rotate(w[i : i + 7]) for i in range(0, 512, 7)])
            assert torch.equal(rows, whole)
    finally:
        torch.set_num_threads(saved)
    assert torch.allclose(hadamard_rotate(whole), w, atol=1e-6)  # its own inverse


def test_comfy_kitchen_dequantizes_convrot_and_e5m2_parts_as_we_decode_them():
    w = _weight((64, 512), seed=7)
    parts = int8.encode(w, CONVROT)
    theirs = _qt(int8, parts, (64, 512), torch.float32).dequantize()
    assert torch.allclose(theirs, int8.decode(parts, options=CONVROT), rtol=0, atol=1e-6)
    parts = fp8.encode(w, E5M2)
    assert parts["weight"].dtype == torch.float8_e5m2
    assert torch.equal(
        _qt(fp8, parts, (64, 512), torch.float32).dequantize(), fp8.decode(parts, options=E5M2)
    )


@pytest.mark.parametrize(
    "fmt, options, marker",
    [
        (nvfp4, None, {"format": "nvfp4"}),
        (mxfp8, None, {"format": "mxfp8"}),
        (fp8, E5M2, {"format": "float8_e5m2"}),
        (int8, CONVROT, {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}),
    ],
    ids=["nvfp4", "mxfp8", "e5m2", "convrot"],
)
def test_the_marker_is_what_comfyui_reads_and_writes(fmt, options, marker):
    options = options or fmt.options_type.from_type(None)
    t = fmt.encode(_weight((32, 256)), options)["comfy_quant"]
    assert json.loads(t.numpy().tobytes()) == marker  # ComfyUI's reading (ops.py)
    assert t.tolist() == list(json.dumps(marker).encode())  # its own writing, key order included
    # and ours, as the loader reads it back
    assert _comfy.layout_of_marker(marker) == fmt.fitted(options, (32, 256))


def test_a_marker_of_a_layout_we_do_not_write_is_refused_naming_it():
    for conf, match in (
        ({"format": "int8_convrot"}, "int8_convrot"),  # our type name, never a marker's
        ({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 128}, "got 128"),
        ({"format": "convrot_w4a4", "convrot_groupsize": 8}, "got 8"),
        ({"format": "convrot_w4a4", "linear_dtype": "int8"}, "linear_dtype 'int8'"),
        ({"format": "svdquant_w4a4"}, "svdquant_w4a4"),
    ):
        with pytest.raises(ValueError, match=match):
            _comfy.layout_of_marker(conf)


# -- ConvRot's groups: 256, 64, 16, 4 (a layer's own, `Format.fitted`) ---------------------------------------


@pytest.fixture
def our_int8_rotation(monkeypatch):
    """comfy-kitchen's int8 ConvRot `_rotate_weight` replaced by ours (`_hadamard.rotate`); the groups it was
    called with."""
    calls = []

    def rotate(weight, h, group_size):
        calls.append(group_size)
        return _hadamard.rotate(weight, group_size)

    monkeypatch.setattr(ck, "_rotate_weight", rotate)
    return calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("group", [256, 64, 16, 4])
def test_convrot_in_every_group_is_comfy_kitchens_quantizer_where_the_rotation_is_ours(
    group, dtype, our_int8_rotation
):
    """``quantize_int8_convrot_weight(w.float(), g)`` with its rotation ours: the same bytes and scales, and the
    marker names the group."""
    w = _weight((24, 256 if group == 256 else 192), dtype, seed=group)
    options = ComfyOptions("int8_convrot", convrot_group=group)
    ours = int8.encode(w, options)
    q, scale = ck.quantize_int8_convrot_weight(w.float(), group)
    assert our_int8_rotation == [group]
    assert torch.equal(ours["weight"], q) and torch.equal(ours["weight_scale"], scale)
    marker = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}
    assert _comfy.read_marker(ours["comfy_quant"]) == marker
    assert _comfy.layout_of_marker(marker) == options
    decoded = int8.decode(ours, options=options)
    assert torch.equal(decoded, ck.dequantize_int8_convrot_weight(q, scale, group))  # its rotation ours too


@pytest.mark.parametrize("group", [256, 64, 16, 4])
def test_our_rotation_is_comfy_kitchens_hadamard_product_in_float64(group):
    """`_hadamard.rotate` is x · H_gᵀ of comfy-kitchen's ``_build_hadamard(g)``: exactly on values whose sums float64
    holds exactly (integers), and rounded once to float32 from the float64 product on a float32 weight."""
    from comfy_kitchen.tensor.int8_utils import _build_hadamard

    h = _build_hadamard(group, dtype=torch.float64)
    assert torch.equal(_hadamard.hadamard(group, torch.device("cpu"), torch.float64), h)
    g = torch.Generator().manual_seed(group)
    ints = torch.randint(-1000, 1000, (16, 1024), generator=g).double()
    product = (ints.reshape(16, -1, group) @ h.T).reshape(16, 1024)
    assert torch.equal(_hadamard.rotate(ints, group), product)
    w = torch.randn(64, 1024, generator=g)
    product = (w.double().reshape(64, -1, group) @ h.T).reshape(64, 1024).float()
    assert torch.equal(_hadamard.rotate(w, group), product)


@pytest.mark.parametrize(
    "width, group",
    [(5120, 256), (4304, 16), (3072, 256), (320, 64), (80, 16), (48, 16), (100, 4), (36, 4)],
)
def test_int8_convrot_fits_the_largest_group_that_divides_the_width(width, group):
    """Qwen3-VL-8B's 4304 = 16 · 269: group 16; the parts are int8's at any group."""
    fitted = int8.fitted(CONVROT, (8, width))
    assert fitted == ComfyOptions("int8_convrot", convrot_group=group)
    assert int8.parts((8, width), fitted)["weight"] == ("I8", (8, width))
    marker = _comfy.read_marker(int8.encode(_weight((8, width)), fitted)["comfy_quant"])
    assert marker["convrot_groupsize"] == group


@pytest.mark.parametrize("width", [102, 30, 7])
def test_a_width_no_convrot_group_divides_is_unfitted(width):
    with pytest.raises(
        UnfittedShapeError,
        match=rf"has {width} inputs: int8_convrot needs in_features a multiple of a ConvRot",
    ):
        int8.fitted(CONVROT, (8, width))
    assert int8.fitted(ComfyOptions("int8_tensorwise"), (8, width)) == ComfyOptions("int8_tensorwise")


def test_the_ladder_raises_nvfp4_to_mxfp8_then_keeps():
    from quantize.run.sensitivity import ladder

    rungs = ladder(nvfp4, ComfyOptions("nvfp4"))
    assert [r.label(nvfp4) for r in rungs] == ["nvfp4", "mxfp8", "kept"]
    assert [r.label(int8) for r in ladder(int8, CONVROT)] == ["int8_convrot", "kept"]
