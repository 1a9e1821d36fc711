"""`comfy_w4a8`'s fast nearest levels (`_Steps`: exact thresholds found once per codebook, read back through
buckets) against the straightforward comfy-kitchen-order `_nearest` / `_nearest_per_group`, code for code, on the
values where they could part: the levels themselves, their float32 midpoints and the ulps around both, the
thresholds and bucket edges, ±0, ±inf, denormals; every float8 s_rel's grid (0 from underflow, the small ones whose
levels repeat); fixed, fitted heavy-tailed and crowded codebooks; and whole encodes, fast against straightforward,
byte for byte.
"""

from __future__ import annotations

import pytest
import torch

from quantize.formats import _hadamard
from quantize.formats import comfy_w4a8 as w4a8

FIXED = torch.tensor(w4a8.FIXED_LUT, dtype=torch.float32)


def _fitted(sparse: bool) -> torch.Tensor:
    """A Lloyd-Max codebook fitted to heavy-tailed groups; `sparse` (most values 0): one whose levels come out
    unsorted, as comfy-kitchen's fit leaves them."""
    g = torch.Generator().manual_seed(7)
    s = torch.randn(64, 256, generator=g) / torch.rand(64, 256, generator=g).clamp(min=1e-3)
    if sparse:
        s = s * (torch.rand(64, 256, generator=g) < 0.2)
    grouped = s.view(64, 16, 16)
    table = w4a8.fit_codebook(grouped / grouped.abs().amax(-1, keepdim=True).clamp(min=1e-8))
    assert table.tolist() != FIXED.tolist() and bool((table[1:] > table[:-1]).all()) != sparse
    return table


def _crowded() -> torch.Tensor:
    """Levels a few ulps apart around 0.3, -0.0 and 0 both, the ends at ±1."""
    near = 0.3 + torch.arange(4, dtype=torch.float32) * 2**-24
    rest = torch.tensor([-1.0, -0.7, -0.5, -0.2, -0.1, -0.05, -0.0, 0.05, 0.1, 0.6, 0.8, 1.0])
    return torch.sort(torch.cat([rest, near])).values


CODEBOOKS = {"fixed": FIXED, "fitted": _fitted(sparse=False), "crowded": _crowded()}


def _around(x: torch.Tensor, ulps: int = 3) -> torch.Tensor:
    """x and the float32s up to `ulps` steps either side of each value."""
    out, up, down = [x], x, x
    for _ in range(ulps):
        up, down = torch.nextafter(up, torch.tensor(float("inf"))), torch.nextafter(down, torch.tensor(-float("inf")))
        out += [up, down]
    return torch.cat([t.flatten() for t in out])


def _hard_values(levels: torch.Tensor, steps, span: float) -> torch.Tensor:
    flat = levels.flatten()
    mids = (flat[..., 1:] + flat[..., :-1]) / 2 if flat.numel() > 1 else flat
    edges = (torch.arange(steps.buckets + 1, dtype=torch.float32) / steps.width - steps.bound)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45, 1e-38, -1e-38, 3e38, -3e38])
    g = torch.Generator().manual_seed(0)
    spread = (torch.rand(20000, generator=g) * 2 - 1) * span * 1.1
    return torch.cat([_around(flat), _around(mids), _around(steps.at[steps.at.isfinite()]), _around(edges, 1),
                      specials, spread])  # fmt: skip


@pytest.mark.parametrize("name", list(CODEBOOKS))
def test_the_nearest_level_is_the_straightforward_ones(name):
    table = CODEBOOKS[name]
    steps = w4a8._steps_of(table)
    assert steps is not None
    t = _hard_values(table, steps[0], 1.0)
    assert torch.equal(steps[0].nearest(t), w4a8._nearest(t, table))


@pytest.mark.parametrize("name", list(CODEBOOKS))
def test_the_nearest_on_every_s_rels_grid_is_the_straightforward_ones(name):
    table = CODEBOOKS[name]
    steps = w4a8._steps_of(table)[1]
    codes = torch.arange(w4a8._E4M3_NAN, dtype=torch.uint8)
    grids = (table.view(1, 1, -1) * codes.view(torch.float8_e4m3fn).float().view(-1, 1, 1)).round_().clamp_(-127, 127)
    assert int((grids == 0).all(-1).sum()) > 1 and bool((grids[:, 0, 1:] == grids[:, 0, :-1]).any())  # repeats
    integers = torch.arange(-128, 129, dtype=torch.float32)
    t = _hard_values(torch.cat([integers, integers + 0.5]), steps, 128.0)
    for code in codes.tolist():
        row = torch.full((t.numel(), 1), code, dtype=torch.int32)
        fast = steps.nearest(t.view(-1, 1), row).flatten()
        want = w4a8._nearest_per_group(t.view(1, 1, -1), grids[code].view(1, 1, -1)).flatten()
        assert torch.equal(fast, want), code


def test_a_codebook_with_a_repeated_level_takes_the_straightforward_path():
    table = FIXED.clone()
    table[8] = table[7]
    assert w4a8._steps_of(table) is None
    assert w4a8._steps_of(_fitted(sparse=True)) is None
    assert w4a8._steps_of(torch.tensor([float("nan")] * 16)) is None


def _hard_weight(table: torch.Tensor) -> torch.Tensor:
    """Rotated rows (the encoder's input) with groups of zeros, tiny groups (s_rel underflows or its grid repeats
    levels), groups exactly on scaled levels and at their midpoints, and a Gaussian rest."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(24, 512, generator=g) * 0.02
    groups = w.view(24, 32, 16)
    groups[:, 0] = 0
    groups[:, 1] *= 1e-5
    groups[:, 2] *= torch.logspace(-4, -1, 24).view(24, 1)
    picks = torch.randint(0, 16, (24, 16), generator=g)
    groups[:, 3] = table[picks] * 0.03
    groups[:, 4] = (table[picks] + table[(picks + 1).clamp(max=15)]) / 2 * 0.03
    groups[:, 5] = table[picks] * 0.5  # the row's largest
    w[5] = 0
    w[6, :16] = 1e-30
    return w


@pytest.mark.parametrize("name", [*CODEBOOKS, "unsorted"])
def test_the_fast_encode_is_the_straightforward_one_byte_for_byte(name):
    table = _fitted(sparse=True) if name == "unsorted" else CODEBOOKS[name]
    rotated = torch.cat([_hard_weight(table), _hadamard.rotate(_hard_weight(table), 16)])
    fast = w4a8._quantize_rotated(rotated, table)
    plain = w4a8._quantize_rotated(rotated, table, fast=False)
    for a, b in zip(fast, plain):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    rel = fast[1].view(torch.uint8)
    assert int((rel == 0).sum()) > 0 and int((rel < 40).sum()) > 20  # underflown and repeating grids were met
