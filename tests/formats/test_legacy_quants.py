"""The legacy block types (Q4_0, Q4_1, Q5_0, Q5_1) decoded in torch (`_legacy_quants`): gguf-py's
``gguf.quants.dequantize`` values bit for bit (float32 bits compared, so -0.0 / +0.0 and NaN payloads count),
on random bytes (every field value), real encodings, all-zero blocks and row slices, through the module and
through the gguf format's `decode`."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from quantize.formats import GgufOptions, _legacy_quants
from quantize.formats import gguf as gguf_module
from quantize.formats._legacy_quants import TYPES, dequantize
from quantize.ggml_types import ggml_type

fmt = gguf_module.FORMAT
BLOCKS = 8  # blocks a row: 256 values


def _theirs(q: torch.Tensor, qtype: str) -> torch.Tensor:
    """gguf-py's decoding of uint8 rows `q`, the reference, as float32 torch."""
    with np.errstate(invalid="ignore"):  # Inf times a zero value: NaN, the value to compare with
        values = gguf.quants.dequantize(q.numpy(), gguf.GGMLQuantizationType[qtype])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def _assert_same_bits(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))
    if not theirs.isnan().any():
        assert torch.equal(ours, theirs)


def _scale_fields(qtype: str) -> list[int]:
    """The byte offsets of a block's float16 fields: d, and m for the _1 types."""
    return [0, 2] if qtype.endswith("_1") else [0]


def _finite_f16_bits(n: int, generator: torch.Generator) -> torch.Tensor:
    """`n` random finite float16 values as their bytes [n, 2]: random bit patterns (every sign, exponent,
    subnormals and zeros included), those with the all-ones exponent (Inf, NaN) moved down by its top bit."""
    bits = torch.randint(0, 1 << 16, (n,), dtype=torch.int32, generator=generator)
    bits = torch.where((bits & 0x7C00) == 0x7C00, bits & ~0x4000, bits).to(torch.int16)
    assert torch.isfinite(bits.view(torch.float16)).all()
    return bits.view(torch.uint8).view(n, 2)


def _random_rows(qtype: str, rows: int, seed: int) -> torch.Tensor:
    """uint8 rows of `BLOCKS` blocks of random bytes, the float16 fields random finite values."""
    size = ggml_type(qtype).type_size
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (rows, BLOCKS * size), dtype=torch.uint8, generator=g)
    blocks = q.view(rows * BLOCKS, size)
    for at in _scale_fields(qtype):
        blocks[:, at : at + 2] = _finite_f16_bits(rows * BLOCKS, g)
    return q


def _weight(rows: int, seed: int) -> torch.Tensor:
    w = torch.randn(rows, BLOCKS * 32, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[1, 3] = 0.5  # an outlier in a block
    w[2] = 0  # an all-zero row
    w[3, :32] = -0.0  # a block of negative zeros
    w[4] += 0.1  # blocks all of one sign: the _1 types' min away from zero
    return w


@pytest.mark.parametrize("qtype", TYPES)
def test_random_bytes_decode_bit_for_bit_as_gguf_py(qtype):
    """Random bytes give every 4- and 5-bit value in every position, the scales (and mins) any finite float16;
    enough rows for the CPU's chunks of blocks, the last one partial."""
    rows = 2 * _legacy_quants._CPU_CHUNK // BLOCKS + 3
    q = _random_rows(qtype, rows, seed=11)
    theirs = _theirs(q, qtype)
    _assert_same_bits(dequantize(q, qtype), theirs)
    _assert_same_bits(fmt.decode({"weight": q}, options=GgufOptions(qtype)), theirs)
    assert theirs.shape == (rows, BLOCKS * 32) and (theirs < 0).any() and (theirs > 0).any()
    if qtype.endswith("_0"):  # a zero value: d times +0, both signs of zero
        zeros = theirs[theirs == 0]
        assert zeros.signbit().any() and not zeros.signbit().all()


@pytest.mark.parametrize("qtype", TYPES)
def test_real_encodings_decode_bit_for_bit_as_gguf_py(qtype):
    """gguf-py's own encoding of random weights (with an outlier, zero blocks and one-signed blocks)."""
    w = _weight(16, seed=12)
    q = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[qtype]))
    theirs = _theirs(q, qtype)
    _assert_same_bits(dequantize(q, qtype), theirs)
    encoded = fmt.encode(w, GgufOptions(qtype))["weight"]  # ggml's bytes where installed: the same
    _assert_same_bits(fmt.decode({"weight": encoded}, options=GgufOptions(qtype)), _theirs(encoded, qtype))


@pytest.mark.parametrize("qtype", TYPES)
def test_all_zero_blocks_decode_bit_for_bit_as_gguf_py(qtype):
    """All-zero bytes (a zero scale times a negative offset gives -0.0 in the _0 types) and blocks with a
    negative zero scale (and min)."""
    size = ggml_type(qtype).type_size
    zeros = torch.zeros(4, BLOCKS * size, dtype=torch.uint8)
    _assert_same_bits(dequantize(zeros, qtype), _theirs(zeros, qtype))
    negative = _random_rows(qtype, 4, seed=13)
    for at in _scale_fields(qtype):
        negative.view(-1, size)[:, at : at + 2] = torch.tensor([0x00, 0x80], dtype=torch.uint8)  # -0.0
    theirs = _theirs(negative, qtype)
    assert (theirs == 0).all() and theirs.signbit().any()
    _assert_same_bits(dequantize(negative, qtype), theirs)


@pytest.mark.parametrize("qtype", TYPES)
def test_special_scales_decode_bit_for_bit_as_gguf_py(qtype):
    """Scales (or mins, the other field finite) that are Inf, NaN, subnormal or -0: the same values, NaNs
    and their payloads included (on the CPU, where both do the same float32 operations)."""
    size = ggml_type(qtype).type_size
    # +Inf, -Inf, NaN, a NaN with a payload, the smallest subnormal, a negative subnormal, -0, 1
    special = torch.tensor(
        [0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x0001, 0x83FF, 0x8000, 0x3C00], dtype=torch.int32
    )
    for at in _scale_fields(qtype):
        q = _random_rows(qtype, 2, seed=14)
        q.view(-1, size)[: len(special), at : at + 2] = special.short().view(torch.uint8).view(-1, 2)
        theirs = _theirs(q, qtype)
        assert theirs.isnan().any() and theirs.isinf().any()
        _assert_same_bits(dequantize(q, qtype), theirs)


@pytest.mark.parametrize("qtype", TYPES)
def test_a_row_slice_decodes_as_gguf_py_and_as_the_whole(qtype):
    q = _random_rows(qtype, 10, seed=15)
    whole = dequantize(q, qtype)
    part = q[3:7]
    _assert_same_bits(dequantize(part, qtype), _theirs(part.contiguous(), qtype))
    _assert_same_bits(dequantize(part, qtype), whole[3:7])
    _assert_same_bits(fmt.decode({"weight": q}, rows=(3, 7), options=GgufOptions(qtype)), whole[3:7])
    assert torch.equal(
        fmt.decode({"weight": q}, torch.bfloat16, rows=(3, 7), options=GgufOptions(qtype)),
        whole[3:7].bfloat16(),
    )


@pytest.mark.parametrize("qtype", TYPES)
def test_a_meta_tensor_decodes_to_its_shape(qtype):
    """No host-only step: the path every device but the CPU takes (the whole tensor at once) runs on meta."""
    q = torch.empty(5, BLOCKS * ggml_type(qtype).type_size, dtype=torch.uint8, device="meta")
    ours = dequantize(q, qtype)
    assert ours.device.type == "meta" and ours.dtype == torch.float32 and ours.shape == (5, BLOCKS * 32)


def test_other_types_and_ragged_rows_are_refused():
    with pytest.raises(ValueError, match="Q8_0 is not one of Q4_0, Q4_1, Q5_0, Q5_1"):
        dequantize(torch.zeros(2, 34, dtype=torch.uint8), "Q8_0")
    with pytest.raises(ValueError, match="Q4_1 rows are uint8 in blocks of 20 bytes"):
        dequantize(torch.zeros(2, 30, dtype=torch.uint8), "Q4_1")
    with pytest.raises(ValueError, match="got torch.int8"):
        dequantize(torch.zeros(2, 18, dtype=torch.int8), "Q4_0")
    assert dequantize(torch.zeros(0, 44, dtype=torch.uint8), "Q5_0").shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", TYPES)
def test_cuda_bytes_decode_on_the_gpu_as_on_the_cpu(qtype):
    """The same code on CUDA tensors (finite scales: float32 products and sums are exact-rounded everywhere)."""
    q = _random_rows(qtype, 64, seed=16)
    ours = dequantize(q.cuda(), qtype)
    assert ours.is_cuda
    _assert_same_bits(ours.cpu(), _theirs(q, qtype))
