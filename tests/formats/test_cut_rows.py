"""`Format.cut_rows`: a stored weight's row ranges taken as a weight of their own (a loader cutting a fused q/k/v into
the model's projections), bit for bit what the format decodes for those rows of the whole; and one line where the
format cannot cut there.

nf4's reference is bitsandbytes itself: ``dequantize_4bit`` of the cut's parts, as `Linear4bit` builds its
`QuantState` from a state dict, against ``dequantize_4bit`` of the whole weight's parts, those rows.
"""

from __future__ import annotations

import pytest
import torch

from loaders.bnb import functional, quant_state
from quantize import dtypes
from quantize.formats import UnsupportedShapeError, get_format
from quantize.formats.nf4 import FORMAT as NF4
from quantize.formats.options import NO_OPTIONS


def _cut(parts: dict[str, torch.Tensor], cuts: dict) -> dict[str, torch.Tensor]:
    """The cut's parts taken from the whole's as `cuts` says (what the loader reads from the file)."""
    out = {}
    for part, how in cuts.items():
        if how is None:
            out[part] = parts[part]
        elif isinstance(how, torch.Tensor):
            out[part] = how
        else:
            out[part] = torch.cat([parts[part][a:b] for a, b in how])
    return out


def _weight(rows: int, cols: int) -> torch.Tensor:
    torch.manual_seed(rows * 7 + cols)
    w = torch.randn(rows, cols) * torch.linspace(0.2, 3, rows)[:, None]  # each projection its own scale
    return w.to(torch.bfloat16)


@pytest.mark.parametrize(
    "shape, ranges",
    [
        ((384 * 3, 256), ((0, 384),)),  # q of a fused q/k/v (MiniMax-H3 small's)
        ((384 * 3, 256), ((384, 768),)),  # k
        ((384 * 3, 256), ((768, 1152),)),  # v: the whole's end, its groups all full
        ((1536, 256), ((768, 1536), (0, 768))),  # a gate/value stack with its halves swapped (fc1)
        ((600, 256), ((512, 600),)),  # the whole's short last group, as the cut's last
        ((600, 256), ((0, 512), (512, 600))),
    ],
)
def test_nf4_rows_cut_are_what_bitsandbytes_decodes_for_those_rows(shape, ranges):
    whole = NF4.encode(_weight(*shape))
    cut = _cut(whole, NF4.cut_rows(shape, NO_OPTIONS, ranges, whole.__getitem__))
    rows = sum(b - a for a, b in ranges)
    specs = NF4.parts((rows, shape[1]))
    for part, (dtype, spec_shape) in specs.items():  # the parts of a weight of the cut's shape
        assert cut[part].dtype == dtypes.by_name(dtype).torch, part
        assert spec_shape is None or tuple(cut[part].shape) == spec_shape, part
    F = functional()
    want = F.dequantize_4bit(whole["weight"], quant_state(whole), quant_type="nf4")
    want = torch.cat([want[a:b] for a, b in ranges])
    got = F.dequantize_4bit(cut["weight"], quant_state(cut), quant_type="nf4")
    assert got.shape == (rows, shape[1]) and torch.equal(got, want)
    assert torch.equal(NF4.decode(cut, torch.bfloat16), want)  # bitsandbytes' dtype, the quant state's
    exact = NF4.decode(whole, torch.float32)
    assert torch.equal(NF4.decode(cut, torch.float32), torch.cat([exact[a:b] for a, b in ranges]))


@pytest.mark.parametrize(
    "shape, ranges, row",
    [
        ((96 * 3, 128), ((96, 192),), 96),  # MiniMax-H3 tiny's q/k/v: 96 x 128 weights end inside a group
        ((1536, 256), ((0, 768), (768, 1000)), 1000),
        (
            (600, 256),
            ((512, 600), (0, 512)),
            600,
        ),  # the whole's short last group, then more: not the cut's end
    ],
)
def test_nf4_refuses_a_cut_inside_a_group_of_block_scales_naming_the_row(shape, ranges, row):
    whole = NF4.encode(_weight(*shape))
    with pytest.raises(UnsupportedShapeError) as e:
        NF4.cut_rows(shape, NO_OPTIONS, ranges, whole.__getitem__)
    assert str(e.value) == (
        f"nf4 codes a weight's block scales in groups of 16384 weights, and row {row} of {list(shape)} "
        f"({row * shape[1]} weights in) is inside one"
    )


@pytest.mark.parametrize("name", ["fp8_channel", "torchao_int8", "comfy_fp8", "comfy_nvfp4"])
def test_a_row_separable_format_cuts_its_rows_and_keeps_its_whole_weight_parts(name):
    fmt = get_format(name)
    options = fmt.options_type.choices()[0]
    shape, ranges = (512, 256), ((256, 512), (0, 128))
    whole = fmt.encode(_weight(*shape), options, **fmt.weight_options([_weight(*shape).float()], options))
    cut = _cut(whole, fmt.cut_rows(shape, options, ranges, whole.__getitem__))
    want = fmt.decode(whole, torch.float32, options=options)
    want = torch.cat([want[a:b] for a, b in ranges])
    assert torch.equal(fmt.decode(cut, torch.float32, options=options), want)


def test_a_tiled_format_refuses_a_cut_inside_a_tile():
    fmt = get_format("comfy_nvfp4")
    with pytest.raises(
        UnsupportedShapeError, match=r"^comfy_nvfp4 stores a weight in tiles of 128 rows, and row 64"
    ):
        fmt.cut_rows((512, 256), fmt.options_type.choices()[0], ((64, 512),), lambda part: None)
