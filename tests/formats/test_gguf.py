"""gguf: each GGML type bit-exact to its reference (gguf-py's quantizers; ggml's own for the K-quants)."""

from __future__ import annotations

import ctypes

import ggml
import gguf
import numpy as np
import pytest
import torch

from quantize import dtypes
from quantize.formats import gguf as fmt
from quantize.formats.base import NonFiniteWeightError, UnsupportedShapeError


def _weight(shape, dtype=torch.bfloat16, seed=0):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[1, 3] = 0.5  # an outlier in a block
    w[2] = 0  # an all-zero row
    return w.to(dtype)


def _ggml_reference(w: np.ndarray, qtype: str) -> np.ndarray:
    rows, cols = w.shape
    out = np.zeros((rows, dtypes.nbytes(qtype, (cols,))), dtype=np.uint8)
    src = np.ascontiguousarray(w, dtype=np.float32)
    ggml.ggml_quantize_chunk(
        dtypes.by_name(qtype).ggml,
        src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        out.ctypes.data,
        0,
        rows,
        cols,
        None,
    )
    return out


@pytest.mark.parametrize("qtype", fmt.NUMPY_TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_0_and_1_types_are_gguf_pys_quantizer(qtype, dtype):
    w = _weight((16, 256), dtype)
    ours = fmt.encode(w, qtype)["weight"].numpy()
    theirs = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType[qtype])
    assert ours.dtype == np.uint8 and np.array_equal(ours, theirs)
    assert np.array_equal(ours, _ggml_reference(w.float().numpy(), qtype))  # which is ggml's too


@pytest.mark.parametrize("qtype", fmt.K_TYPES)
def test_the_k_quants_are_ggmls_reference_quantizer(qtype):
    w = _weight((24, 512))
    ours = fmt.encode(w, qtype)["weight"].numpy()
    assert np.array_equal(ours, _ggml_reference(w.float().numpy(), qtype))


@pytest.mark.parametrize("qtype", fmt.TYPES)
def test_rows_encode_alone_as_in_the_whole_and_decode_as_gguf_py(qtype):
    w = _weight((12, 256), seed=1)
    whole = fmt.encode(w, qtype)["weight"]
    assert torch.equal(fmt.encode(w[5:9], qtype)["weight"], whole[5:9])  # row-separable: streamed in chunks
    assert fmt.parts((12, 256), qtype) == {"weight": (qtype, (12, 256))}
    assert whole.shape == (12, dtypes.nbytes(qtype, (256,)))
    decoded = fmt.decode({"weight": whole}, qtype=qtype)
    theirs = gguf.quants.dequantize(whole.numpy(), gguf.GGMLQuantizationType[qtype])
    assert np.array_equal(decoded.numpy(), theirs.astype(np.float32))
    assert torch.equal(fmt.decode({"weight": whole}, rows=(3, 7), qtype=qtype), decoded[3:7])
    assert not decoded[2].any()  # the all-zero row


def _q8_0_edge_blocks() -> torch.Tensor:
    """Rows of 32-value blocks where a rounding shortcut would show: every kind of tie, zero and -0 blocks,
    scales below float16's normal range and past its largest value, and plain random blocks."""
    g = torch.Generator().manual_seed(4)
    below = lambda x: float(torch.nextafter(torch.tensor(x), torch.tensor(0.0)))  # noqa: E731
    above = lambda x: float(torch.nextafter(torch.tensor(x), torch.tensor(1e9)))  # noqa: E731
    ties = [
        0.5,
        1.5,
        2.5,
        3.5,
        64.5,
        125.5,
        126.5,
        below(0.5),
        below(1.5),
        below(2.5),
        above(0.5),
        above(1.5),
    ]
    ties = torch.tensor(ties + [0.25, 1.0, 0.0])
    block = torch.cat([torch.tensor([127.0]), ties, -ties, torch.tensor([-127.0])])  # d = 1: x · id is x
    rows = [
        block,
        block.flip(0),
        2 * block,  # d = 2: the same ties, scaled
        torch.zeros(32),
        torch.full((32,), -0.0),
        torch.randn(32, generator=g) * 1e-9,  # d below float16's smallest subnormal
        torch.randn(32, generator=g) * 1e-6,  # d a float16 subnormal
        torch.randn(32, generator=g) * 1e7,  # d past float16's max: inf
        torch.randn(32, generator=g),
        torch.tensor([0.0] * 31 + [-5e-45]),  # one float32 subnormal
    ]
    return torch.stack(rows).repeat(2, 2)


def test_q8_0_in_torch_is_ggml_and_gguf_py_on_every_edge():
    w = _q8_0_edge_blocks()
    ours = fmt.encode(w, "Q8_0")["weight"].numpy()
    assert np.array_equal(ours, _ggml_reference(w.numpy(), "Q8_0"))
    assert np.array_equal(ours, gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))
    rnd = torch.randn(300, 4096, generator=torch.Generator().manual_seed(5)) * 0.02
    assert np.array_equal(fmt.encode(rnd, "Q8_0")["weight"].numpy(), _ggml_reference(rnd.numpy(), "Q8_0"))


def test_q8_0_decodes_any_bytes_bit_for_bit_as_gguf_py():
    """Q8_0 is decoded in torch: every int8 value, every float16 scale (subnormals, infinities, NaNs included)."""
    q = torch.randint(0, 256, (64, 16 * 34), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    q.view(64, 16, 34)[0, :, 2:] = torch.arange(256, dtype=torch.uint8).view(16, 16).repeat(1, 2)
    d = torch.tensor(
        [0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8000, 0x3C00], dtype=torch.int32
    ).short()  # ±inf, NaN, 2^-24, -0, 1
    q.view(64, 16, 34)[1, :6, :2] = d.view(torch.uint8).view(6, 2)
    theirs = gguf.quants.dequantize(q.numpy(), gguf.GGMLQuantizationType.Q8_0).astype(np.float32)
    ours = fmt.decode({"weight": q}, qtype="Q8_0")
    assert np.isnan(theirs).any() and np.isinf(theirs).any()
    assert np.array_equal(ours.numpy().view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("qtype", fmt.K_TYPES)
def test_k_quants_decode_any_bytes_bit_for_bit_as_gguf_py(qtype):
    """The K-quants are decoded in torch: random bytes give every field every value (NaN and Inf scales too)."""
    row_bytes = dtypes.nbytes(qtype, (1024,))
    q = torch.randint(0, 256, (96, row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    theirs = gguf.quants.dequantize(q.numpy(), gguf.GGMLQuantizationType[qtype]).astype(np.float32)
    ours = fmt.decode({"weight": q}, qtype=qtype)
    assert ours.shape == (96, 1024) and np.isnan(theirs).any()
    assert np.array_equal(ours.numpy().view(np.uint32), theirs.view(np.uint32))
    w = _weight((8, 1024))
    encoded = fmt.encode(w, qtype)["weight"]
    decoded = fmt.decode({"weight": encoded}, qtype=qtype).numpy()
    assert np.array_equal(decoded, gguf.quants.dequantize(encoded.numpy(), gguf.GGMLQuantizationType[qtype]))


def test_the_weight_sqnr_of_each_type_is_what_it_is_known_for():
    w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(2))
    sqnr = {}
    for qtype in fmt.TYPES:
        d = fmt.decode(fmt.encode(w, qtype), qtype=qtype)
        sqnr[qtype] = float(10 * torch.log10(w.pow(2).sum() / (w - d).pow(2).sum()))
    assert sqnr["Q8_0"] > 44 and 34 < sqnr["Q6_K"] < 36 and 28 < sqnr["Q5_K"] < 30 and 22 < sqnr["Q4_K"] < 24
    assert sqnr["Q8_0"] > sqnr["Q6_K"] > sqnr["Q5_K"] > sqnr["Q4_K"]


@pytest.mark.parametrize("qtype, width", [("Q8_0", 48), ("Q4_K", 128), ("Q6_K", 320)])
def test_a_width_that_is_not_whole_blocks_is_refused(qtype, width):
    with pytest.raises(
        UnsupportedShapeError, match=f"in_features must be a multiple of {dtypes.by_name(qtype).block}"
    ):
        fmt.parts((8, width), qtype)


def test_non_finite_weights_and_missing_types_are_refused():
    w = torch.ones(4, 256)
    w[1, 2] = float("nan")
    with pytest.raises(NonFiniteWeightError):
        fmt.encode(w, "Q8_0")
    with pytest.raises(ValueError, match="gguf needs a GGML type"):
        fmt.parts((4, 256))


def test_kept_tensors_are_lossless_linears_and_f32_otherwise():
    assert fmt.kept_dtype("BF16", (16, 16), True) == "BF16"
    assert fmt.kept_dtype("F32", (16, 16), True) == "F32"
    assert fmt.kept_dtype("BF16", (16,), False) == "F32"
    assert fmt.kept_dtype("BF16", (16, 4, 1, 2, 2), False) == "F32"  # the patch embedding: diffusers needs it
    assert fmt.kept_dtype("I64", (3,), False) is None  # refused at plan time, naming the tensor


@pytest.mark.parametrize("qtype", fmt.NUMPY_TYPES)
def test_without_ggml_the_0_and_1_types_come_from_gguf_py_with_the_same_bytes(qtype, monkeypatch):
    w = _weight((8, 256), seed=3)
    with_ggml = fmt.encode(w, qtype)["weight"]
    monkeypatch.setattr(fmt, "_has_ggml", lambda: False)
    assert torch.equal(fmt.encode(w, qtype)["weight"], with_ggml)


def test_a_missing_extra_is_one_error_naming_it_at_plan_time(monkeypatch):
    from quantize.errors import InputError

    def missing():
        raise InputError(f"the K-quants (Q6_K, Q5_K, Q4_K) need ggml's own quantizer: {fmt.EXTRA}")

    monkeypatch.setattr(fmt, "_ggml", missing)
    with pytest.raises(InputError, match=r"pip install 'dit-quantize\[gguf\]'"):
        fmt.check_available("Q4_K")
    fmt.check_available("Q8_0")  # gguf-py alone serves the _0 / _1 types
    assert fmt.parts((8, 256), "Q4_K")  # shapes alone: every format's plan probes parts without the extra


def test_without_the_extra_every_other_format_still_plans_and_gguf_names_the_extra(wan_tiny):
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['gguf'] = None; sys.modules['ggml'] = None\n"
        "from quantize.plan import make_plan; from quantize.recipes import load_recipe, parse_recipe\n"
        "from quantize.errors import InputError\n"
        f"make_plan({str(wan_tiny)!r}, load_recipe('wan-fp8').recipe)\n"
        "try:\n"
        f"    make_plan({str(wan_tiny)!r}, parse_recipe('format: gguf\\ntype: Q8_0\\ntargets: [blocks.0.ffn.0]\\n'))\n"
        "except InputError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "the gguf format needs gguf-py: pip install 'dit-quantize[gguf]'"
