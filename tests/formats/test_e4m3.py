"""The float8 decoding both FP8 formats share: table lookups equal to torch's own float8 cast."""

from __future__ import annotations

import pytest
import torch

from quantize.formats._e4m3 import FP8_DTYPE, dequantize_rows


def _every_pair() -> torch.Tensor:
    """All 65536 pairs of float8 bit patterns (NaN ones included), as a [256, 512] weight."""
    return (
        torch.arange(1 << 16, dtype=torch.int32)
        .to(torch.uint16)
        .view(torch.uint8)
        .view(FP8_DTYPE)
        .view(256, 512)
    )


def test_pair_lookup_equals_the_float8_cast_for_every_pair_of_values():
    q = _every_pair()
    scale = torch.rand(256, 1) + 0.5
    expected = q.float() * scale
    assert torch.equal(dequantize_rows(q, scale, torch.float32).isnan(), expected.isnan())
    assert torch.allclose(dequantize_rows(q, scale, torch.float32), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape", [(7, 5), (4, 6)])  # odd width: one value at a time; even: pairs
def test_rows_and_odd_widths_decode_the_same(shape):
    q = (torch.randn(shape) * 100).clamp(-448, 448).to(FP8_DTYPE)
    scale = torch.rand(shape[0], 1)
    whole = dequantize_rows(q, scale, torch.float32)
    assert torch.equal(whole, q.float() * scale)
    assert torch.equal(dequantize_rows(q, scale, torch.bfloat16, rows=(1, 3)), whole[1:3].bfloat16())
    assert torch.equal(dequantize_rows(q.t().contiguous().t(), scale, torch.float32), whole)  # not contiguous
