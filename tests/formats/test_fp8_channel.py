"""fp8_channel: what is particular to it (its rounding at ties, zero rows, its error, its config). Bit-exactness to
DESIGN.md's reference formula, from fp32, fp16 and bf16 sources, and the shared checks are `test_contract.py`'s."""

from __future__ import annotations

import pytest
import torch

from quantize.errors import InputError
from quantize.formats import FORMATS, get_format
from quantize.formats import fp8_channel as fp8_module

fp8 = fp8_module.FORMAT


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


def test_decode_error_is_small_on_gaussian_weights():
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(1))
    dq = fp8.decode(fp8.encode(w))
    sqnr = 10 * torch.log10(w.pow(2).sum() / (w - dq).pow(2).sum())
    assert sqnr > 28  # e4m3 keeps 3 mantissa bits: about 31 dB on Gaussian rows
    assert (w - dq).abs().max() <= w.abs().amax(dim=1).max() / 448 * 16  # half an ulp at the top binade


def test_only_2d_weights():
    with pytest.raises(ValueError, match="2-D"):
        fp8.encode(torch.ones(2, 3, 4))


def test_parts_are_the_compressed_tensors_layout():
    assert fp8.parts((10, 6)) == {fp8_module.WEIGHT: ("F8_E4M3", (10, 6)), fp8_module.SCALE: ("F32", (10, 1))}


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
    with pytest.raises(InputError, match="known: " + ", ".join(sorted(FORMATS))):
        get_format("fp4")


def test_decode_table_equals_torch_cast_for_every_bit_pattern():
    q = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(16, 16)
    scale = torch.ones(16, 1)
    got, want = fp8.decode({"weight": q, "weight_scale": scale}), q.float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])
