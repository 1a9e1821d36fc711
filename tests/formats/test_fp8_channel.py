"""fp8_channel: bit-exact to DESIGN.md's reference formula, from fp32, fp16 and bf16 sources."""

from __future__ import annotations

import pytest
import torch

from quantize.encode import row_chunks
from quantize.formats import FORMATS, get_format
from quantize.formats import fp8_channel as fp8
from quantize.formats.base import NonFiniteWeightError

# --- an independent reference: e4m3fn decoded from its bits, rounding done by hand -------------


def _e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite non-negative e4m3fn value (sorted) and its 7-bit code, decoded from the bit layout."""
    values, codes = [], []
    for code in range(0x7F):  # 0x7F is NaN
        exp, mant = code >> 3, code & 7
        v = (mant / 8) * 2.0**-6 if exp == 0 else (1 + mant / 8) * 2.0 ** (exp - 7)
        values.append(v)
        codes.append(code)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(codes)


def reference_e4m3_bits(x: torch.Tensor) -> torch.Tensor:
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


def reference_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DESIGN.md: scale = rowmax|w|/448 in float32; q = e4m3(clamp(w/scale, ±448)); zero scale -> 1."""
    w32 = w.to(torch.float32)
    scale = w32.abs().amax(dim=1, keepdim=True) / 448.0
    scale[scale == 0] = 1.0
    return reference_e4m3_bits((w32 / scale).clamp(-448, 448)), scale


def _weights(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=g) * 0.05
    w[3, 7] = 4.0  # an outlier row
    w[5] = 0.0  # an all-zero row
    w[6, :] = torch.linspace(-1e-3, 1e-3, 96)  # a row of tiny values, subnormals after scaling
    w[7, :] = 1e-30  # denormal-range magnitudes in fp32
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_encode_is_bit_exact_to_reference(dtype):
    w = _weights(dtype)
    if dtype != torch.float32:
        w[7, :] = 0  # fp16/bf16 cannot hold 1e-30 uniformly; keep the row all-zero there
    parts = fp8.encode(w)
    ref_bits, ref_scale = reference_encode(w)
    assert parts["weight"].dtype == torch.float8_e4m3fn and parts["weight"].shape == w.shape
    assert parts["weight_scale"].dtype == torch.float32 and parts["weight_scale"].shape == (64, 1)
    assert torch.equal(parts["weight"].view(torch.uint8), ref_bits)
    assert torch.equal(parts["weight_scale"], ref_scale)


def test_ties_round_to_even():
    # rowmax 448 gives scale 1 exactly, so these values are the scaled values themselves
    row = torch.tensor([[448.0, 1.0625, 1.1875, -1.0625, 0.0, 2.0**-10, 3 * 2.0**-10, 17.0]])
    q = fp8.encode(row)["weight"].float()
    # 1.0625 is halfway between 1.0 (even) and 1.125 (odd); 1.1875 between 1.125 (odd) and 1.25 (even);
    # 2^-10 is halfway between 0 and the smallest subnormal 2^-9; 17 between 16 (even) and 18 (odd)
    assert q.flatten().tolist() == [448.0, 1.0, 1.25, -1.0, 0.0, 0.0, 2.0**-8, 16.0]


def test_zero_row_gets_finite_scale_and_exact_zeros():
    w = torch.zeros(3, 8, dtype=torch.bfloat16)
    w[1] = 2.0
    parts = fp8.encode(w)
    assert torch.isfinite(parts["weight_scale"]).all()
    assert parts["weight_scale"][0].item() == 1.0
    assert torch.equal(fp8.decode(parts)[0], torch.zeros(8))
    assert torch.equal(fp8.decode(parts)[1], torch.full((8,), 2.0))


def test_row_chunks_encode_identically_to_whole():
    w = _weights(torch.bfloat16)
    whole = fp8.encode(w)
    for r0, r1 in row_chunks(64, 96, chunk_bytes=96 * 4 * 5):  # 5 rows a chunk
        part = fp8.encode(w[r0:r1])
        assert torch.equal(part["weight"].view(torch.uint8), whole["weight"][r0:r1].view(torch.uint8))
        assert torch.equal(part["weight_scale"], whole["weight_scale"][r0:r1])


def test_decode_error_is_small_on_gaussian_weights():
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(1))
    dq = fp8.decode(fp8.encode(w))
    sqnr = 10 * torch.log10(w.pow(2).sum() / (w - dq).pow(2).sum())
    assert sqnr > 28  # e4m3 keeps 3 mantissa bits: about 31 dB on Gaussian rows
    assert (w - dq).abs().max() <= w.abs().amax(dim=1).max() / 448 * 16  # half an ulp at the top binade


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(bad):
    w = torch.ones(2, 4)
    w[1, 2] = bad
    with pytest.raises(NonFiniteWeightError):
        fp8.encode(w)


def test_only_2d_weights():
    with pytest.raises(ValueError, match="2-D"):
        fp8.encode(torch.ones(2, 3, 4))


def test_parts_match_encode_output():
    w = torch.randn(10, 6)
    specs = fp8.parts((10, 6))
    parts = fp8.encode(w)
    assert set(specs) == set(parts) == {fp8.WEIGHT, fp8.SCALE}
    assert specs[fp8.WEIGHT] == ("F8_E4M3", (10, 6)) and specs[fp8.SCALE] == ("F32", (10, 1))


def test_quantization_config_is_compressed_tensors_fp8_channel():
    cfg = fp8.quantization_config(["head.head", "blocks.0.ffn.2"])
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == "float-quantized"
    (group,) = cfg["config_groups"].values()
    assert group["targets"] == ["Linear"]
    w, a = group["weights"], group["input_activations"]
    assert (w["type"], w["num_bits"], w["strategy"], w["symmetric"], w["dynamic"]) == (
        "float",
        8,
        "channel",
        True,
        False,
    )
    assert (a["type"], a["num_bits"], a["strategy"], a["symmetric"], a["dynamic"]) == (
        "float",
        8,
        "token",
        True,
        True,
    )
    assert cfg["ignore"] == ["blocks.0.ffn.2", "head.head"]


def test_format_table_lookup_lists_known_names():
    assert get_format("fp8_channel") is fp8
    with pytest.raises(Exception, match="known: " + ", ".join(sorted(FORMATS))):
        get_format("fp4")


def test_decode_table_equals_torch_cast_for_every_bit_pattern():
    q = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(16, 16)
    scale = torch.ones(16, 1)
    got, want = fp8.decode({"weight": q, "weight_scale": scale}), q.float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])
