"""gguf: what is particular to its GGML types (Q8_0 and the K-quants in torch, decoding, the extra, kept tensors)
and the one GGML table. Bit-exactness of every type to its reference (gguf-py's quantizers; ggml's own for the
K-quants) and the shared checks are `test_contract.py`'s."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from quantize import dtypes
from quantize.errors import InputError
from quantize.formats import NO_OPTIONS, GgufOptions
from quantize.formats import gguf as gguf_module
from quantize.formats.base import UnsupportedShapeError
from quantize.ggml_types import GGML_TYPES, QUANTIZED_TYPES, ggml_type
from tests.formats.references import ggml_quantize_chunk as _ggml_reference
from tests.formats.references import gguf_py_quantize

fmt = gguf_module.FORMAT
TYPES = [pytest.param(GgufOptions(t), id=t) for t in QUANTIZED_TYPES]
NUMPY_TYPES = [
    pytest.param(GgufOptions(t.name), id=t.name) for t in GGML_TYPES if t.quantized and not t.k_quant
]
K_TYPES = [pytest.param(GgufOptions(t.name), id=t.name) for t in GGML_TYPES if t.k_quant]
Q8_0 = GgufOptions("Q8_0")


def _weight(shape, dtype=torch.bfloat16, seed=0):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[1, 3] = 0.5  # an outlier in a block
    w[2] = 0  # an all-zero row
    return w.to(dtype)


def test_the_ggml_table_is_gguf_pys():
    """Ids, block sizes and bytes a block as gguf-py has them; llama.cpp's file types; K-quants the 256 blocks."""
    for t in GGML_TYPES:
        qtype = gguf.GGMLQuantizationType[t.name]
        assert (t.id, (t.block, t.type_size)) == (int(qtype), gguf.GGML_QUANT_SIZES[qtype]), t.name
        assert t.k_quant == t.name.endswith("_K") and t.k_quant == (t.block == 256), t.name
        assert dtypes.by_name(t.name).ggml == t.id and dtypes.by_ggml(t.id).name == t.name
        assert dtypes.by_name(t.name).block == t.block
        if t.quantized:
            assert t.file_type == gguf.LlamaFileType[f"MOSTLY_{t.name}" + ("_S" if t.file_type_mix else "")]
        if t.file_type_mix is not None:
            assert t.file_type_mix == gguf.LlamaFileType[f"MOSTLY_{t.name}_M"]
        assert t.raised is None or ggml_type(t.raised).quantized


def test_ggml_gives_gguf_pys_bytes_for_the_0_and_1_types():
    """Why encoding those types with ggml, when installed, is encoding them with their reference (gguf-py)."""
    w = _weight((16, 256)).float().numpy()
    for t in GGML_TYPES:
        if t.quantized and not t.k_quant:
            assert np.array_equal(_ggml_reference(w, t.name), gguf_py_quantize(w, t.name)), t.name


@pytest.mark.parametrize("options", [p for p in NUMPY_TYPES if p.values[0].type != "Q8_0"])
def test_blocks_of_signed_zeros_are_gguf_pys_bytes(options):
    """For a block of zeros whose first value is -0.0 (or of mixed signs) ggml stores the other sign of zero in
    the _0/_1 types' scale (and min) than gguf-py, the reference: such blocks are gguf-py's bytes, and the rest
    ggml's (the same as gguf-py's), in any mix."""
    w = torch.tensor([[-0.0] + [0.0] * 255, [-0.0] * 256, [0.0] * 32 + [0.5, -0.25] * 112])
    ours = fmt.encode(w, options)["weight"].numpy()
    assert np.array_equal(ours, gguf_py_quantize(w.numpy(), options.type))
    assert not np.array_equal(ours, _ggml_reference(w.numpy(), options.type))  # what ggml alone would give


def test_q8_0_agrees_on_blocks_of_signed_zeros():
    """Q8_0 is quantized in torch, its scale's zero made positive as both references make it."""
    w = torch.tensor([[-0.0] + [0.0] * 255, [-0.0] * 256])
    ours = fmt.encode(w, GgufOptions("Q8_0"))["weight"].numpy()
    assert np.array_equal(ours, gguf_py_quantize(w.numpy(), "Q8_0"))
    assert np.array_equal(ours, _ggml_reference(w.numpy(), "Q8_0"))


@pytest.mark.parametrize("options", TYPES)
def test_decoding_is_gguf_pys(options):
    whole = fmt.encode(_weight((12, 256), seed=1), options)["weight"]
    decoded = fmt.decode({"weight": whole}, options=options)
    theirs = gguf.quants.dequantize(whole.numpy(), gguf.GGMLQuantizationType[options.type])
    assert np.array_equal(decoded.numpy(), theirs.astype(np.float32))


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
    ours = fmt.encode(w, Q8_0)["weight"].numpy()
    assert np.array_equal(ours, _ggml_reference(w.numpy(), "Q8_0"))
    assert np.array_equal(ours, gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))
    rnd = torch.randn(300, 4096, generator=torch.Generator().manual_seed(5)) * 0.02
    assert np.array_equal(fmt.encode(rnd, Q8_0)["weight"].numpy(), _ggml_reference(rnd.numpy(), "Q8_0"))


def test_q8_0_decodes_any_bytes_bit_for_bit_as_gguf_py():
    """Q8_0 is decoded in torch: every int8 value, every float16 scale (subnormals, infinities, NaNs included)."""
    q = torch.randint(0, 256, (64, 16 * 34), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    q.view(64, 16, 34)[0, :, 2:] = torch.arange(256, dtype=torch.uint8).view(16, 16).repeat(1, 2)
    d = torch.tensor(
        [0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8000, 0x3C00], dtype=torch.int32
    ).short()  # ±inf, NaN, 2^-24, -0, 1
    q.view(64, 16, 34)[1, :6, :2] = d.view(torch.uint8).view(6, 2)
    theirs = gguf.quants.dequantize(q.numpy(), gguf.GGMLQuantizationType.Q8_0).astype(np.float32)
    ours = fmt.decode({"weight": q}, options=Q8_0)
    assert np.isnan(theirs).any() and np.isinf(theirs).any()
    assert np.array_equal(ours.numpy().view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("options", K_TYPES)
def test_k_quants_decode_any_bytes_bit_for_bit_as_gguf_py(options):
    """The K-quants are decoded in torch: random bytes give every field every value (NaN and Inf scales too)."""
    qtype = options.type
    row_bytes = dtypes.nbytes(qtype, (1024,))
    q = torch.randint(0, 256, (96, row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    theirs = gguf.quants.dequantize(q.numpy(), gguf.GGMLQuantizationType[qtype]).astype(np.float32)
    ours = fmt.decode({"weight": q}, options=options)
    assert ours.shape == (96, 1024) and np.isnan(theirs).any()
    assert np.array_equal(ours.numpy().view(np.uint32), theirs.view(np.uint32))
    w = _weight((8, 1024))
    encoded = fmt.encode(w, options)["weight"]
    decoded = fmt.decode({"weight": encoded}, options=options).numpy()
    assert np.array_equal(decoded, gguf.quants.dequantize(encoded.numpy(), gguf.GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("options", TYPES)
def test_decoding_runs_on_the_blocks_own_device(options):
    """A loader decodes a layer where its blocks are (the GPU): nothing the decoders hold may stay on the CPU.
    The meta device stands in for CUDA here: any CPU tensor mixed in fails there the same way."""
    row_bytes = dtypes.nbytes(options.type, (256,))
    q = torch.zeros(3, row_bytes, dtype=torch.uint8, device="meta")
    out = fmt.decode({"weight": q}, torch.bfloat16, options=options)
    assert out.device.type == "meta" and out.shape == (3, 256) and out.dtype == torch.bfloat16


def test_the_weight_sqnr_of_each_type_is_what_it_is_known_for():
    w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(2))
    sqnr = {}
    for qtype in QUANTIZED_TYPES:
        options = GgufOptions(qtype)
        d = fmt.decode(fmt.encode(w, options), options=options)
        sqnr[qtype] = float(10 * torch.log10(w.pow(2).sum() / (w - d).pow(2).sum()))
    assert sqnr["Q8_0"] > 44 and 34 < sqnr["Q6_K"] < 36 and 28 < sqnr["Q5_K"] < 30 and 22 < sqnr["Q4_K"] < 24
    assert sqnr["Q8_0"] > sqnr["Q6_K"] > sqnr["Q5_K"] > sqnr["Q4_K"]


@pytest.mark.parametrize("qtype, width", [("Q8_0", 48), ("Q4_K", 128), ("Q6_K", 320)])
def test_a_width_that_is_not_whole_blocks_is_refused(qtype, width):
    with pytest.raises(
        UnsupportedShapeError, match=f"in_features must be a multiple of {dtypes.by_name(qtype).block}"
    ):
        fmt.parts((8, width), GgufOptions(qtype))


def test_a_format_without_a_ggml_type_is_refused():
    with pytest.raises(ValueError, match="gguf needs a GGML type"):
        fmt.parts((4, 256))
    with pytest.raises(ValueError, match="gguf needs a GGML type"):
        fmt.encode(torch.ones(4, 256), NO_OPTIONS)
    with pytest.raises(ValueError, match="gguf needs a GGML type, one of Q8_0, Q6_K"):
        GgufOptions("F16")  # a GGML type, but not one a Linear is quantized to


def test_kept_tensors_are_lossless_linears_and_f32_otherwise():
    # whatever the recipe's keep_dtype made of it (a gguf recipe's is `source`)
    assert fmt.kept_dtype("BF16", (16, 16), True, "BF16") == "BF16"
    assert fmt.kept_dtype("F32", (16, 16), True, "F32") == "F32"
    assert fmt.kept_dtype("BF16", (16,), False, "BF16") == "F32"
    assert (
        fmt.kept_dtype("BF16", (16, 4, 1, 2, 2), False, "BF16") == "F32"
    )  # the patch embedding: diffusers needs it
    assert fmt.kept_dtype("I64", (3,), False, "I64") is None  # refused at plan time, naming the tensor


def test_the_ladder_is_the_tables():
    assert fmt.raised(GgufOptions("Q4_K")) == GgufOptions("Q5_K")
    assert fmt.raised(GgufOptions("Q6_K")) == GgufOptions("Q8_0") and fmt.raised(GgufOptions("Q8_0")) is None


@pytest.mark.parametrize("options", NUMPY_TYPES)
def test_without_ggml_the_0_and_1_types_come_from_gguf_py_with_the_same_bytes(options, monkeypatch):
    w = _weight((8, 256), seed=3)
    with_ggml = fmt.encode(w, options)["weight"]
    monkeypatch.setattr(gguf_module, "_has_ggml", lambda: False)
    assert torch.equal(fmt.encode(w, options)["weight"], with_ggml)


def test_a_missing_extra_is_one_error_naming_it_at_plan_time(monkeypatch):
    from quantize.errors import InputError

    def missing():
        raise InputError(f"the K-quants (Q6_K, Q5_K, Q4_K) need ggml's own quantizer: {gguf_module.EXTRA}")

    monkeypatch.setattr(gguf_module, "_ggml", missing)
    with pytest.raises(InputError, match=r"pip install 'dit-quantize\[gguf\]'"):
        fmt.check_available(GgufOptions("Q4_K"))
    fmt.check_available(GgufOptions("Q8_0"))  # gguf-py alone serves the _0 / _1 types
    assert fmt.parts(
        (8, 256), GgufOptions("Q4_K")
    )  # shapes alone: every format's plan probes parts without the extra


def test_a_missing_ggml_is_named_with_the_tables_k_quants(monkeypatch):
    import sys

    gguf_module._ggml.cache_clear()
    monkeypatch.setitem(sys.modules, "ggml", None)  # put back as it was (absent or imported) after the test
    try:
        with pytest.raises(InputError, match=r"the K-quants \(Q6_K, Q5_K, Q4_K\) need ggml's own quantizer"):
            gguf_module._ggml()
    finally:
        gguf_module._ggml.cache_clear()


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
