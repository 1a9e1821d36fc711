"""`comfy_w4a8`'s fast nearest levels (`_Steps`: exact thresholds found once per codebook, read back through
buckets) against the straightforward comfy-kitchen-order `_nearest` / `_nearest_per_group`, code for code, on the
values where they could part: the levels themselves, their float32 midpoints and the ulps around both, the
thresholds and bucket edges, ±0, ±inf, denormals; every float8 s_rel's grid (0 from underflow, the small ones whose
levels repeat); fixed, fitted heavy-tailed and crowded codebooks; and whole encodes, fast against straightforward,
byte for byte; and `_hadamard.rotate` (in cache-sized blocks) against the whole-tensor butterflies it replaced.
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
        up, down = (
            torch.nextafter(up, torch.tensor(float("inf"))),
            torch.nextafter(down, torch.tensor(-float("inf"))),
        )
        out += [up, down]
    return torch.cat([t.flatten() for t in out])


def _hard_values(levels: torch.Tensor, steps, span: float) -> torch.Tensor:
    flat = levels.flatten()
    mids = (flat[..., 1:] + flat[..., :-1]) / 2 if flat.numel() > 1 else flat
    edges = torch.arange(steps.buckets + 1, dtype=torch.float32) / steps.width - steps.bound
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45, 1e-38, -1e-38, 3e38, -3e38]
    )
    g = torch.Generator().manual_seed(0)
    spread = (torch.rand(5000, generator=g) * 2 - 1) * span * 1.1
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
    grids = (
        (table.view(1, 1, -1) * codes.view(torch.float8_e4m3fn).float().view(-1, 1, 1))
        .round_()
        .clamp_(-127, 127)
    )
    assert int((grids == 0).all(-1).sum()) > 1  # s_rel 0 and the smallest: every level 0
    assert bool((grids[:, 0, 1:] == grids[:, 0, :-1]).any())  # grids that repeat a level
    integers = torch.arange(-128, 129, dtype=torch.float32)
    t = _hard_values(torch.cat([integers, integers + 0.5]), steps, 128.0)
    every = t.expand(len(codes), -1).unsqueeze(1).contiguous()  # [s_rel, 1, values]
    fast = steps.nearest(every, codes.int().view(-1, 1, 1))
    assert torch.equal(fast, w4a8._nearest_per_group(every, grids))


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
def test_the_fast_encode_is_the_straightforward_one_byte_for_byte(name, monkeypatch):
    monkeypatch.setattr(w4a8, "_BLOCK", 5 * 512)  # in blocks of rows, the last one short
    table = _fitted(sparse=True) if name == "unsorted" else CODEBOOKS[name]
    rotated = torch.cat([_hard_weight(table), _hadamard.rotate(_hard_weight(table), 16)])
    fast = w4a8._quantize_rotated(rotated, table)
    plain = w4a8._quantize_rotated(rotated, table, fast=False)
    for a, b in zip(fast, plain, strict=True):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    rel = fast[1].view(torch.uint8)
    assert int((rel == 0).sum()) > 0 and int((rel < 40).sum()) > 20  # underflown and repeating grids were met


def test_overflowing_and_infinite_rows_take_the_straightforward_path_with_the_same_bytes():
    """Sums that overflow float32 (a scale of Inf or NaN), an Inf from the rotation's rounding: no step function's
    input, the same bytes as the straightforward path all the same."""
    rotated = _hard_weight(FIXED)
    rotated[7] = 3e38 * torch.sign(rotated[7])
    rotated[8, 40] = float("inf")
    for rows in (rotated, rotated[7:8]):
        fast, plain = w4a8._quantize_rotated(rows, FIXED), w4a8._quantize_rotated(rows, FIXED, fast=False)
        for a, b in zip(fast, plain, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _butterflies(x: torch.Tensor, group: int) -> torch.Tensor:
    """`_hadamard.rotate` as it was first written: whole-tensor float64 stages, y_e = total - 2·x_(3-e) by a flip."""
    m = {4: 1, 16: 2, 64: 3, 256: 4}[group]
    *lead, n = x.shape
    y = x.double().reshape(-1, *([4] * m))
    for axis in range(1, m + 1):
        x0, x1, x2, x3 = y.unbind(axis)
        total = (x0 + x1).add_(x2).add_(x3).unsqueeze(axis)
        y = y.flip(axis).mul_(-2.0).add_(total)
    return y.div_(float(2**m)).reshape(*lead, n).to(x.dtype)


@pytest.mark.parametrize("group", [4, 16, 64, 256])
def test_the_blocked_rotation_is_the_whole_tensor_butterflies(group, monkeypatch):
    monkeypatch.setattr(_hadamard, "_BLOCK", 3 * 256)  # blocks that cut a tensor unevenly
    g = torch.Generator().manual_seed(group)
    base = torch.randn(37, 512, generator=g)
    for x in (base, base * 1e-41, base * 3e37, base * torch.logspace(-30, 30, 512), base.round(), base.bfloat16(),
              base.double(), base[:0]):  # fmt: skip
        kept = x.clone()
        ours, first = _hadamard.rotate(x, group), _butterflies(x, group)
        assert torch.equal(x, kept) and ours.dtype == first.dtype
        assert torch.equal(ours.view(torch.uint8), first.view(torch.uint8)), x.dtype
