"""`comfy_w4a8` against comfy-kitchen 0.2.40's eager W4A8 (``AsymW4A8Int8Layout``), what ComfyUI quantizes, decodes
and multiplies with: bit for bit with its rotation patched to ours (groups 256, 64, 16; the fixed codebook, a
fitted one, a weight with more rows than its codebook sample), within a code step of its own float32 rotation;
the codebook decided in one streamed pass; the int8 grid, the decoding and ComfyUI's linear of our parts.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from comfy_kitchen.backends.eager import w4a8_int8 as ckw
from comfy_kitchen.registry import registry
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.w4a8_int8 import AsymW4A8Int8Layout

from quantize.formats import ComfyOptions, NonFiniteWeightError, UnsupportedShapeError, _hadamard, get_format
from quantize.formats import comfy_w4a8 as w4a8

fmt = get_format("comfy_w4a8")
GROUPS = [256, 64, 16]


def _options(group: int) -> ComfyOptions:
    return ComfyOptions("asym_w4a8_int8", convrot_group=group)


def _gaussian(shape, seed=0, dtype=torch.float32) -> torch.Tensor:
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[3, 5] = 0.4  # an outlier
    w[4] = 0  # an all-zero row
    return w.to(dtype)


def _heavy(shape, group, seed=0) -> torch.Tensor:
    """A weight whose rotated groups are sparse spikes (W·H = S: a fifth of it a Gaussian over a uniform, the rest
    zeros): their excess kurtosis trips comfy-kitchen's gate, so its codebook is fitted."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(shape, generator=g) / torch.rand(shape, generator=g).clamp(min=1e-3)
    s = s * (torch.rand(shape, generator=g) < 0.2)
    return _hadamard.rotate(s * 0.01, group)


@pytest.fixture
def ours_in_comfy_kitchen(monkeypatch):
    """comfy-kitchen's eager W4A8 with its rotation ours (the one intended difference)."""
    impl = registry.get_implementation("quantize_w4a8_int8_weight", kwargs={"weight": torch.zeros(16, 256)})
    assert impl is ckw.quantize_w4a8_int8_weight  # the eager backend is what runs here
    monkeypatch.setattr(ckw, "rotate_int8_convrot_weight", lambda w, g: _hadamard.rotate(w, g))


def _reference(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    q, params = AsymW4A8Int8Layout.quantize(w.float(), convrot_groupsize=group)
    return {
        "weight": q,
        "weight_s_rel": params.scale,
        "weight_s_channel": params.s_channel,
        "weight_codebook": params.codebook,
    }


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _encode(w: torch.Tensor, options) -> dict[str, torch.Tensor]:
    return fmt.encode(w, options, **fmt.weight_options([w.float()], options, tuple(w.shape)))


def _assert_bit_exact(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    ours, theirs = _encode(w, _options(group)), _reference(w, group)
    for part, t in theirs.items():
        assert _same(ours[part], t), part
    assert json.loads(bytes(ours["comfy_quant"].tolist())) == {
        "format": "asym_w4a8_int8",
        "group_size": 16,
        "convrot_groupsize": group,
    }
    return ours


def _small_budgets(monkeypatch, rows: int, cols: int) -> None:
    """Both sides' sample and chunk budgets shrunk alike, so a small weight takes the paths of a large one: the
    codebook from `rows` strided rows, the kurtosis and the fit on random draws, comfy-kitchen's chunked loop."""
    monkeypatch.setattr(w4a8, "CODEBOOK_SAMPLE", rows * cols)
    monkeypatch.setattr(ckw, "_CODEBOOK_SAMPLE_ELEMS", rows * cols)
    monkeypatch.setattr(ckw, "_QUANT_ROW_ELEM_BUDGET", 7 * cols)
    monkeypatch.setattr(w4a8, "KURTOSIS_SAMPLE", 1000)
    monkeypatch.setattr(ckw, "_KURTOSIS_SAMPLE", 1000)
    monkeypatch.setattr(w4a8, "FIT_SAMPLE", 700)
    monkeypatch.setattr(ckw._fit_codebook, "__defaults__", (16, 25, 700))


# --- bit for bit, its rotation ours --------------------------------------------------------------------------


@pytest.mark.parametrize("group", GROUPS)
def test_a_gaussian_weight_is_comfy_kitchens_with_the_fixed_codebook(group, ours_in_comfy_kitchen):
    for dtype in (torch.float32, torch.bfloat16):
        parts = _assert_bit_exact(_gaussian((40, 512), seed=group, dtype=dtype), group)
        assert parts["weight_codebook"].tolist() == torch.tensor(w4a8.FIXED_LUT).tolist()


@pytest.mark.parametrize("group", GROUPS)
def test_a_heavy_tailed_weight_is_comfy_kitchens_with_its_fitted_codebook(group, ours_in_comfy_kitchen):
    parts = _assert_bit_exact(_heavy((24, 256), group, seed=group), group)
    assert parts["weight_codebook"].tolist() != torch.tensor(w4a8.FIXED_LUT).tolist()  # the Lloyd-Max fit


@pytest.mark.parametrize("heavy", [False, True], ids=["fixed", "fitted"])
def test_a_weight_taller_than_the_codebook_sample_is_comfy_kitchens(
    heavy, ours_in_comfy_kitchen, monkeypatch
):
    """More rows than the codebook's sample (its rows strided over the weight), the draws of the kurtosis and the
    fit, and comfy-kitchen quantizing in row chunks: the same bytes, the codebook of the sampled rows."""
    shape = (37, 256)
    _small_budgets(monkeypatch, rows=6, cols=shape[1])
    w = _heavy(shape, 64, seed=3) if heavy else _gaussian(shape, seed=4)
    w[::2] *= 3.0  # rows that differ, so which are sampled matters
    parts = _assert_bit_exact(w, 64)
    fixed = parts["weight_codebook"].tolist() == torch.tensor(w4a8.FIXED_LUT).tolist()
    assert fixed != heavy
    assert w4a8.sampled_rows(*shape).tolist() == [0, 7, 14, 21, 28, 36]


# --- comfy-kitchen as it is: its float32 rotation --------------------------------------------------------------


@pytest.mark.parametrize("group", GROUPS)
def test_within_a_code_step_of_comfy_kitchens_own_rotation(group):
    """Its float32 product's last bits move a few values across a level's midpoint: the codes one index apart at
    most, nearly all equal, the row scales a float32 rounding apart, the same error."""
    w = _gaussian((48, 512), seed=group + 1)
    ours, theirs = _encode(w, _options(group)), _reference(w, group)
    codes = [torch.stack((p.view(torch.uint8) & 15, p.view(torch.uint8) >> 4), -1).int() for p in
             (ours["weight"], theirs["weight"])]  # fmt: skip
    diff = (codes[0] - codes[1]).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 1e-2
    assert torch.allclose(ours["weight_s_channel"], theirs["weight_s_channel"], rtol=1e-5, atol=0)
    steps = (
        ours["weight_s_rel"].view(torch.uint8).int() - theirs["weight_s_rel"].view(torch.uint8).int()
    ).abs()
    assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) < 1e-2

    def error(parts):
        d = fmt.decode(parts, options=_options(group)) - w
        return float(d.pow(2).sum() / w.pow(2).sum())

    assert abs(error(ours) - error(theirs)) < 1e-4
    assert error(ours) < 0.01  # about 23 dB


# --- streaming ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heavy", [False, True], ids=["fixed", "fitted"])
def test_row_chunks_with_the_streamed_codebook_encode_as_the_whole(heavy, monkeypatch):
    """The codebook from one pass over row chunks (holding the sampled rows only) is the whole weight's, and the
    chunks encoded with it are the whole's rows, bit for bit; `encode` without it decides the same."""
    shape = (37, 256)
    _small_budgets(monkeypatch, rows=6, cols=shape[1])
    w = _heavy(shape, 256, seed=5) if heavy else _gaussian(shape, seed=6)
    options = _options(256)
    chunks = [(0, 5), (5, 6), (6, 20), (20, 37)]
    decided = fmt.weight_options((w[r0:r1] for r0, r1 in chunks), options, shape)
    assert _same(decided["codebook"], fmt.weight_options([w], options)["codebook"])
    whole = fmt.encode(w, options)
    assert _same(whole["weight_codebook"], decided["codebook"])
    for r0, r1 in chunks:
        chunk = fmt.encode(w[r0:r1], options, **decided)
        for part, t in chunk.items():
            want = whole[part] if part in fmt.WEIGHT_PARTS else whole[part][r0:r1]
            assert _same(t, want), (part, r0, r1)


def test_a_non_finite_weight_is_refused_while_streaming():
    w = _gaussian((8, 64))
    w[5, 7] = float("nan")
    with pytest.raises(NonFiniteWeightError):
        fmt.weight_options([w[:4], w[4:]], _options(64), (8, 64))
    with pytest.raises(NonFiniteWeightError):
        fmt.encode(w, _options(64))


@pytest.mark.parametrize("shape, group", [((8, 40), 4), ((8, 48), 64), ((8, 320), 256)], ids=str)
def test_widths_that_are_not_whole_groups_are_refused(shape, group):
    with pytest.raises(UnsupportedShapeError):
        fmt.parts(shape, _options(group))
    assert fmt.parts((8, 64), _options(64))["weight_s_rel"] == ("F8_E4M3", (8, 4))


# --- decoding and ComfyUI's linear ----------------------------------------------------------------------------


def _qt(parts, shape, group, dtype) -> QuantizedTensor:
    """Our parts as comfy-kitchen's QuantizedTensor, built as ComfyUI's loader builds it (comfy/ops.py)."""
    params = AsymW4A8Int8Layout.Params(
        scale=parts["weight_s_rel"],
        s_channel=parts["weight_s_channel"],
        codebook=parts["weight_codebook"],
        group_size=16,
        convrot_groupsize=group,
        orig_dtype=dtype,
        orig_shape=shape,
    )
    return QuantizedTensor(parts["weight"], "AsymW4A8Int8Layout", params)


@pytest.mark.parametrize("group", GROUPS)
def test_the_int8_grid_and_the_decoding_are_comfy_kitchens(group, monkeypatch):
    shape = (48, 256)
    parts = _encode(
        _heavy(shape, group, seed=7) if group == 16 else _gaussian(shape, seed=7), _options(group)
    )
    grid, s_channel = w4a8.int8_grid(parts)
    theirs = ckw._dequant_int4_grouped_to_int8(
        parts["weight"], parts["weight_s_rel"], parts["weight_codebook"], 16
    )
    assert _same(grid, theirs) and s_channel is parts["weight_s_channel"]
    assert _same(w4a8.int8_grid(parts, (5, 17))[0], theirs[5:17])
    monkeypatch.setattr(ckw, "rotate_int8_convrot_weight", lambda w, g: _hadamard.rotate(w, g))
    ours = fmt.decode(parts, options=_options(group))
    assert _same(_qt(parts, shape, group, torch.float32).dequantize(), ours)
    assert _same(
        ckw.dequantize_w4a8_int8_weight(
            parts["weight"],
            parts["weight_s_rel"],
            parts["weight_s_channel"],
            parts["weight_codebook"],
            group_size=16,
            convrot_groupsize=group,
            output_dtype=torch.float32,
        ),
        ours,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_comfyuis_linear_of_our_parts_is_close_to_the_float_linear(dtype):
    """F.linear on the QuantizedTensor ComfyUI builds from our parts (its eager W4A8: int8 grid, activations rotated
    and quantized per row to int8) is close to the linear of the float weight, and to that of our decoding."""
    shape, group = (96, 512), 256
    w = _gaussian(shape, seed=8)
    parts = _encode(w, _options(group))
    x = torch.randn(2, 9, 512, generator=torch.Generator().manual_seed(9)).to(dtype)
    b = torch.randn(96, generator=torch.Generator().manual_seed(10)).to(dtype) * 0.1
    got = F.linear(x, _qt(parts, shape, group, dtype), b).float()
    exact = F.linear(x.float(), w, b.float())
    decoded = F.linear(x.float(), fmt.decode(parts, options=_options(group)), b.float())
    sqnr = lambda y, ref: 10 * torch.log10(ref.pow(2).sum() / (y - ref).pow(2).sum())  # noqa: E731
    assert got.shape == (2, 9, 96)
    assert float(sqnr(got, exact)) > 20 and float(sqnr(got, decoded)) > 30


def test_the_rotation_survives_a_decode_round_trip():
    """Decoding rotates back: a weight the codebook holds nearly exactly decodes nearly to itself."""
    w = torch.eye(64) * 0.5
    parts = fmt.encode(w, _options(64))
    assert torch.allclose(fmt.decode(parts, options=_options(64)), w, atol=0.02)
