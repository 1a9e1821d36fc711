"""`comfy_w4a8`: ComfyUI's W4A8 Linear (comfy-kitchen ``AsymW4A8Int8Layout``): each input row ConvRot-rotated, cut into
groups of 16 inputs, each value a 4-bit index into one 16-level codebook of the tensor, a float8 scale per group and
a float32 scale per row; ComfyUI decodes the codes to int8 and multiplies int8 by int8 activations.

On disk, per quantized Linear ``<m>`` (the model family's native names, which ComfyUI reads; one file per component):
  ``<m>.weight``           int8 [out, in/2]            two 4-bit codes a byte, the even column's in the low nibble
  ``<m>.weight_s_rel``     float8_e4m3fn [out, in/16]  each group's scale relative to its row's
  ``<m>.weight_s_channel`` float32 [out]               each row's scale
  ``<m>.weight_codebook``  float32 [16]                the 16 levels the codes index (sorted, within ±1)
  ``<m>.comfy_quant``      uint8 [n]   UTF-8 JSON ``{"format": "asym_w4a8_int8", "group_size": 16,
                           "convrot_groupsize": g}``, g the layer's ConvRot group (`Format.fitted`: 256, or the
                           largest of 64, 16 that divides a narrower input width; in_features a multiple of 16)

Reference numerics, bit for bit: comfy-kitchen 0.2.40's ``AsymW4A8Int8Layout.quantize(w.float(),
convrot_groupsize=g)`` with its defaults (group_size 16, symmetric, codebook, float8 scales, 4 bits), i.e. the eager
``quantize_w4a8_int8_weight``, with its one documented difference: the rotation W·H is `_hadamard.rotate` (float64,
rounded once; the same on every machine and row chunk) where comfy-kitchen's ``rotate_int8_convrot_weight`` is a
float32 matrix product whose last bit depends on the BLAS's blocking (comfy_int8's ConvRot has the same one;
tested bit for bit with that name patched to ours, and within one code step without). In float32:

* the codebook, one per tensor, from its rows sampled evenly (all of them up to 2²² values; else 2²² // in rows at
  ``linspace(0, out - 1)``), rotated, divided by their groups' max |w| (at least 1e-8): the fixed Lloyd-Max table
  for a Gaussian (`FIXED_LUT`) unless the excess kurtosis of those values (2¹⁹ of them drawn with a generator seeded
  0 where there are more) is above -0.1; then a Lloyd-Max table fitted to them (`fit_codebook`: 300000 values drawn
  the same way, the 16 quantiles, 25 rounds of nearest-level means);
* per group of 16 rotated values: the scale s = max|w| (at least 1e-8); each w/s to its nearest level (ties to the
  lower), then twice: s = Σ w·l / Σ l² (each at least 1e-8) and the levels reassigned to w/s;
* per row: s_channel = max |l·s| over the row / 127 (at least 1e-8); per group: s_rel = e4m3(s / s_channel);
* the stored codes: per group, the levels on the int8 grid, clamp(round(l · s_rel), ±127) (`int8_grid`), and each
  w / s_channel to its nearest one (ties to the lower index).

Each nearest level is that search's (`_nearest`, `_nearest_per_group`: comfy-kitchen's float32 distances) read off
its exact float32 thresholds (`_Steps`: found once per codebook by bisection with the search itself, for the codebook
and for each float8 s_rel's grid), a few gathers a value; a codebook that is not strictly increasing, or a
non-finite scale, takes the search itself. Rows are encoded in blocks that stay in cache (the rotation too).

Decoding (comfy-kitchen's ``dequantize_w4a8_int8_weight`` to float32, its rotation ours): the int8 grid value of
each code times s_channel, rotated back by H (its own inverse), in float64 rounded once, then cast to the dtype
asked for (comfy-kitchen casts before rotating: a bf16 decode is a rounding apart).

Every part but the codebook and the marker is per row: a weight is encoded in row chunks (`ROW_SEPARABLE`), the
codebook decided first from one streamed pass over the whole weight (`weight_options`, which holds only the
sampled rows) and passed to each chunk's `encode`. The codebook is a code table (`CODE_TABLES`): a fitted one is made
of float32 means of up to 300000 values, whose last bit torch sums differently on another CPU or number of threads
(measured: 1 and 2 threads give tables up to 1e-9 apart), so `verify` compares it within a float32 rounding.
Everything else is the same for any thread count and row chunk, but, as comfy-kitchen's own result, not on every
CPU: the refinement's float32 sums of 16 values follow torch's vectorized order (measured: the same bytes under its
AVX2 and AVX-512 kernels, others under ``ATEN_CPU_CAPABILITY=default``); summing them exactly instead would change
the last bit of half the row scales against comfy-kitchen.

ComfyUI's ``w4a8_int8_linear`` (eager on the CPU) multiplies the int8 grid (`int8_grid`) by the call's input,
rotated (`_hadamard.rotate_activations`) and quantized per row to int8 (`comfy_int8.quantize_rows`), with int32
sums, scaled back by both row scales: the loader's `ComfyW4a8Linear`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

from . import _comfy, _hadamard
from .base import NonFiniteWeightError, PartSpec, UnsupportedShapeError
from .options import NO_OPTIONS, FormatOptions

__all__ = [
    "FORMAT",
    "ComfyW4a8",
    "LAYOUT",
    "WEIGHT",
    "S_REL",
    "S_CHANNEL",
    "CODEBOOK",
    "GROUP",
    "FIXED_LUT",
    "int8_grid",
    "decide_codebook",
    "codebook_for",
    "fit_codebook",
    "sampled_rows",
]

LAYOUT = "asym_w4a8_int8"
WEIGHT = "weight"
S_REL = "weight_s_rel"
S_CHANNEL = "weight_s_channel"
CODEBOOK = "weight_codebook"
#: inputs per float8 group scale (the marker's ``group_size``)
GROUP = _comfy.W4A8_GROUP
LEVELS = 16
INT8_MAX = 127.0
MIN_SCALE = 1e-8  # comfy-kitchen's floor for a group's and a row's scale
#: the Lloyd-Max levels of a Gaussian group divided by its max |w|: comfy-kitchen's ``_FIXED_LUT`` (its CUDA
#: kernel's built-in table), used unless the weight's rotated groups are heavy-tailed
FIXED_LUT = (
    -0.980602, -0.794529, -0.638165, -0.500986, -0.377321, -0.263187, -0.155210, -0.050720,
    0.052541, 0.156985, 0.265284, 0.379533, 0.502636, 0.638953, 0.794876, 0.980671,
)  # fmt: skip
#: the excess kurtosis above which the codebook is fitted rather than fixed (Gaussian groups sit near -0.5)
GATE_KURTOSIS = -0.1
#: values the codebook is decided from: the rows of up to this many values, sampled evenly
CODEBOOK_SAMPLE = 1 << 22
#: values the kurtosis is measured on, drawn from those
KURTOSIS_SAMPLE = 1 << 19
#: values a codebook is fitted to, drawn from those, and its rounds of Lloyd-Max
FIT_SAMPLE = 300000
FIT_ROUNDS = 25
#: the rounds of least-squares refinement of each group's scale
REFINE_ROUNDS = 2


class ComfyW4a8(_comfy.ComfyFormat):
    NAME = "comfy_w4a8"
    ROW_SEPARABLE = True
    WEIGHT_PARTS = (CODEBOOK, _comfy.MARKER)
    CODE_TABLES = (CODEBOOK,)
    LAYOUT = LAYOUT

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        out, inp = shape
        own = self.layout(options)
        if inp % GROUP or inp % own.group:
            raise UnsupportedShapeError(
                f"is [{out}, {inp}]; W4A8 scales groups of {GROUP} inputs and rotates groups of {own.group}: "
                "in_features must be a multiple of both"
            )
        return {
            WEIGHT: ("I8", (out, inp // 2)),
            S_REL: ("F8_E4M3", (out, inp // GROUP)),
            S_CHANNEL: ("F32", (out,)),
            CODEBOOK: ("F32", (LEVELS,)),
            _comfy.MARKER: self.marker_spec(options),
        }

    def weight_options(
        self,
        chunks: Iterable[torch.Tensor],
        options: FormatOptions = NO_OPTIONS,
        shape: tuple[int, int] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The tensor's codebook from one pass over its float32 row chunks, holding only the rows it samples
        (`sampled_rows` of `shape`; without `shape`, the chunks are the whole weight); `NonFiniteWeightError` for
        a NaN or Inf anywhere."""
        own = self.layout(options)
        if shape is None:
            whole = [_finite(c.float()) for c in chunks]
            w = torch.cat(whole) if whole else torch.zeros(0, 0)
            return {"codebook": decide_codebook(_sample_of(w), own.group)}
        picks = sampled_rows(*shape)
        taken, r0 = [], 0
        for chunk in chunks:
            chunk = _finite(chunk.float())
            r1 = r0 + chunk.shape[0]
            if picks is None:
                taken.append(chunk)
            else:
                inside = picks[(picks >= r0) & (picks < r1)] - r0
                taken.append(chunk.index_select(0, inside))
            r0 = r1
        return {"codebook": decide_codebook(torch.cat(taken), own.group)}

    def encode(
        self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS, codebook: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight, or a chunk of its rows (`codebook`: the whole weight's, `weight_options`; without
        it, decided from `weight` as the whole).

        >>> w = torch.eye(16, 256)  # rotated: rows of ±1/16, two levels of the codebook
        >>> p = FORMAT.encode(w)
        >>> p["weight"].shape, p["weight_s_rel"].dtype, [round(v, 3) for v in FORMAT.decode(p)[0, :3].tolist()]
        (torch.Size([16, 128]), torch.float8_e4m3fn, [0.992, 0.0, 0.0])
        """
        if weight.dim() != 2:
            raise ValueError(f"comfy_w4a8 quantizes 2-D weights, got shape {list(weight.shape)}")
        own = self.layout(options)
        self.parts(tuple(weight.shape), own)
        w = _finite(weight.float())
        if codebook is None:
            codebook = decide_codebook(_sample_of(w), own.group)
        packed, s_rel, s_channel = _quantize_rotated(_hadamard.rotate(w, own.group), codebook)
        return {
            WEIGHT: packed,
            S_REL: s_rel,
            S_CHANNEL: s_channel,
            CODEBOOK: codebook,
            _comfy.MARKER: _comfy.marker(own),
        }

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """The int8 grid (`int8_grid`) times s_channel in float32, rotated back (`_hadamard.rotate`), cast to
        `dtype`; only `rows` [r0, r1) of it if given."""
        grid, s_channel = int8_grid(parts, rows)
        n, k = grid.shape
        w = grid.float().view(n, k // GROUP, GROUP) * s_channel.float().view(n, 1, 1)
        return _hadamard.rotate(w.view(n, k), self.layout(options).group).to(dtype)


def int8_grid(
    parts: dict[str, torch.Tensor], rows: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rotated weight on the int8 grid, int8 [n, in]; s_channel, float32 [n]) of the stored parts (their rows
    [r0, r1) if given): each code's level times its group's s_rel in float32, rounded half to even and clamped to
    ±127, comfy-kitchen's ``_dequant_int4_grouped_to_int8``. The weight ComfyUI's int8 GEMM multiplies: W·H ≈
    grid · s_channel."""
    packed, s_rel, s_channel = parts[WEIGHT], parts[S_REL], parts[S_CHANNEL]
    if rows is not None:
        packed, s_rel, s_channel = (t[rows[0] : rows[1]] for t in (packed, s_rel, s_channel))
    n, k = packed.shape[0], packed.shape[1] * 2
    nibbles = packed.view(torch.uint8)
    codes = torch.stack((nibbles & 0xF, nibbles >> 4), dim=-1).view(-1).int()  # column 2j low, 2j + 1 high
    table = parts[CODEBOOK].to(device=packed.device, dtype=torch.float32)
    values = table.index_select(0, codes).view(n, k // GROUP, GROUP).mul_(s_rel.float().unsqueeze(-1))
    return values.view(n, k).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), s_channel


def sampled_rows(rows: int, cols: int) -> torch.Tensor | None:
    """The rows of a [rows, cols] weight its codebook is decided from, as comfy-kitchen's ``_decide_codebook``
    strides them (``linspace(0, rows - 1, 2²² // cols)`` in float32, truncated); None: all of them."""
    most = max(1, CODEBOOK_SAMPLE // max(cols, 1))
    if rows <= most:
        return None
    return torch.linspace(0, rows - 1, most).long()


def decide_codebook(sample: torch.Tensor, group: int) -> torch.Tensor:
    """The codebook of a weight from its sampled rows (`sampled_rows`; float32, not rotated): the rows rotated in
    groups of `group` (`_hadamard.rotate`), each group of `GROUP` divided by its max |w| (at least 1e-8), then
    `codebook_for` them."""
    rotated = _hadamard.rotate(sample.contiguous(), group)
    grouped = rotated.float().view(sample.shape[0], sample.shape[1] // GROUP, GROUP)
    return codebook_for(grouped / grouped.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_SCALE))


def codebook_for(normalized: torch.Tensor) -> torch.Tensor:
    """`FIXED_LUT` where the excess kurtosis of `normalized` (at most `KURTOSIS_SAMPLE` of its values, drawn with a
    generator seeded 0) is at most `GATE_KURTOSIS`, else `fit_codebook` of them: comfy-kitchen's ``_codebook_for``."""
    x = normalized.detach().flatten()
    if x.numel() > KURTOSIS_SAMPLE:
        x = x[_drawn(x.numel(), KURTOSIS_SAMPLE, x.device)]
    x = x.float()
    excess = ((x - x.mean()) / (x.std() + 1e-9)).pow(4).mean() - 3.0
    if excess.item() <= GATE_KURTOSIS:
        return torch.tensor(FIXED_LUT, dtype=torch.float32, device=normalized.device)
    return fit_codebook(normalized)


def fit_codebook(normalized: torch.Tensor) -> torch.Tensor:
    """A 16-level Lloyd-Max codebook of `normalized` (at most `FIT_SAMPLE` of its values, drawn with a generator
    seeded 0): its quantiles at 16 even steps, then `FIT_ROUNDS` times each level the mean of the values nearest
    to it (first of equals; a level none is nearest to kept), comfy-kitchen's ``_fit_codebook``."""
    values = normalized.flatten()
    if values.numel() > FIT_SAMPLE:
        values = values[_drawn(values.numel(), FIT_SAMPLE, values.device)]
    values = values.float()
    table = torch.quantile(values, torch.linspace(0, 1, LEVELS, device=values.device))
    for _ in range(FIT_ROUNDS):
        nearest = (values.unsqueeze(-1) - table).abs().argmin(-1)
        updated = table.clone()
        for level in range(LEVELS):
            mine = nearest == level
            if mine.any():
                updated[level] = values[mine].mean()
        table = updated
    return table.contiguous()


def _drawn(population: int, count: int, device: torch.device) -> torch.Tensor:
    """`count` indices below `population`, drawn with replacement by a generator seeded 0 (comfy-kitchen's)."""
    generator = torch.Generator(device=device).manual_seed(0)
    return torch.randint(0, population, (count,), device=device, generator=generator)


def _sample_of(w: torch.Tensor) -> torch.Tensor:
    picks = sampled_rows(*w.shape)
    return w if picks is None else w.index_select(0, picks.to(w.device))


def _finite(w: torch.Tensor) -> torch.Tensor:
    """`w`, or `NonFiniteWeightError` (the rotation would spread a NaN over its group); a finite sum is all finite,
    and one pass cheaper than the check of each value it spares."""
    if not bool(torch.isfinite(w.sum())) and not bool(torch.isfinite(w).all()):
        raise NonFiniteWeightError("holds NaN or Inf values")
    return w


def _nearest(values: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The index of the nearest entry of the sorted 1-D `table` to each value, the lower one on a tie."""
    last = table.numel() - 1
    at = torch.searchsorted(table, values.contiguous())
    lo, hi = (at - 1).clamp(0, last), at.clamp(0, last)
    closer_hi = (values - table[hi]).abs_() < (values - table[lo]).abs_()
    return torch.where(closer_hi, hi, lo).to(torch.int32)


def _nearest_per_group(target: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """For [n, groups, 16] `target`, the index of the nearest of its group's sorted `grid` [n, groups, 16] levels,
    the lower one on a tie."""
    n, groups, width = target.shape
    last = grid.shape[-1] - 1
    table = grid.reshape(n * groups, last + 1).contiguous()
    flat = target.reshape(n * groups, width).contiguous()
    at = torch.searchsorted(table, flat)
    lo, hi = (at - 1).clamp(0, last), at.clamp(0, last)
    d_lo = flat.sub(torch.gather(table, 1, lo)).abs_()
    d_hi = flat.sub(torch.gather(table, 1, hi)).abs_()
    return torch.where(d_hi < d_lo, hi, lo).to(torch.int32).reshape(n, groups, width)


#: values `_quantize_rotated` works on at a time on the CPU (its float32 intermediates stay in a core's cache)
_BLOCK = 1 << 18


def _quantize_rotated(
    rotated: torch.Tensor, codebook: torch.Tensor, fast: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed codes, s_rel, s_channel) of a rotated float32 weight with `codebook`: the numerics of the module
    docstring, in comfy-kitchen's ``_quantize_rotated_w4a8_int8_weight`` order of float32 operations, a block of
    rows at a time (every part is per row, `ROW_SEPARABLE`). `fast`: each nearest level read off the codebook's
    `_Steps` (the same codes); False, or a codebook or weight they do not cover (unsorted, non-finite), the
    straightforward `_nearest` / `_nearest_per_group`."""
    n, k = rotated.shape
    step = max(1, _BLOCK // max(k, 1)) if fast and rotated.device.type == "cpu" else max(n, 1)
    if n <= step:
        return _quantize_rows(rotated, codebook, fast)
    blocks = [_quantize_rows(rotated[r0 : r0 + step], codebook, fast) for r0 in range(0, n, step)]
    return tuple(torch.cat(parts) for parts in zip(*blocks, strict=True))  # type: ignore[return-value]


def _quantize_rows(
    rotated: torch.Tensor, codebook: torch.Tensor, fast: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, k = rotated.shape
    grouped = rotated.float().view(n, k // GROUP, GROUP)
    table = codebook.to(device=rotated.device, dtype=torch.float32)
    steps = _steps_of(table) if fast else None

    def levels_at(scale: torch.Tensor) -> torch.Tensor:  # each w / scale's nearest level
        if steps is not None and bool(torch.isfinite(scale).all()):
            return steps[0].nearest(grouped / scale, of=steps[2])
        return table.index_select(0, _nearest(grouped / scale, table).flatten()).view(grouped.shape)

    scale = grouped.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_SCALE)
    if not bool(torch.isfinite(scale).all()):  # an Inf in the rotated weight (a NaN t: no step function's)
        steps = None
    levels = levels_at(scale)
    for _ in range(REFINE_ROUNDS):  # least squares for each group's scale, given its levels
        fit = (grouped * levels).sum(-1, keepdim=True)
        scale = (fit / (levels * levels).sum(-1, keepdim=True).clamp(min=MIN_SCALE)).clamp(min=MIN_SCALE)
        levels = levels_at(scale)
    reached = levels * scale
    s_channel = (reached.abs().amax(dim=(1, 2)) / INT8_MAX).clamp(min=MIN_SCALE)
    s_rel = (scale.squeeze(-1) / s_channel.unsqueeze(1)).float().contiguous().to(torch.float8_e4m3fn)
    target = grouped / s_channel.view(-1, 1, 1)
    rel_codes = s_rel.view(torch.uint8)
    if (
        steps is not None
        and rel_codes.numel()
        and int(rel_codes.max()) < _E4M3_NAN
        and bool(torch.isfinite(s_channel).all())
    ):
        codes = steps[1].nearest(target, rel_codes.int().unsqueeze(-1), of=steps[3]).view(n, k)  # uint8 0..15
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8)
    else:
        grid = (table.view(1, 1, -1) * s_rel.float().unsqueeze(-1)).round_().clamp_(-INT8_MAX, INT8_MAX)
        codes = _nearest_per_group(target, grid).view(n, k)
        packed = ((codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)).to(torch.int8)
    return packed.contiguous(), s_rel, s_channel.float().contiguous()


#: float8_e4m3fn's bit patterns: 0 to 126 the non-negative numbers, 127 NaN (then the negative ones)
_E4M3_NAN = 127
#: the most distinct steps one bucket of a `_Steps` may hold before it is not worth it
_MOST_IN_A_BUCKET = 4


class _Steps:
    """A non-decreasing step function from float32 to the codes 0..15, one per row of a table (the nearest level
    of a sorted codebook; of one float8 s_rel's int8 grid), read off its exact thresholds: the code of t is the
    number of thresholds at most t. The thresholds are found once by bisection over float32 bit patterns with the
    straightforward function itself (so they are its own, bit for bit), and read back through buckets of equal
    width over [-bound, bound] (every threshold inside): a bucket's count below it, then a compare with each of
    the few distinct thresholds inside it. Same codes as the function for every float32, ±inf included."""

    def __init__(self, evaluate, rows: int, bound: float, buckets: int) -> None:
        self.bound, self.buckets, self.width = bound, buckets, buckets / (2 * bound)
        steps = torch.arange(1, LEVELS, dtype=torch.int64).expand(rows, LEVELS - 1)
        lo = torch.full((rows, LEVELS - 1), int(_ordered(torch.tensor([-bound]))[0]))
        hi = torch.full((rows, LEVELS - 1), int(_ordered(torch.tensor([bound]))[0]))
        if bool((evaluate(_unordered(lo)) != 0).any()) or bool(
            (evaluate(_unordered(hi)) != LEVELS - 1).any()
        ):
            raise _NotCovered
        while bool((hi - lo > 1).any()):  # f(lo) < step <= f(hi)
            mid = (lo + hi) >> 1
            reached = evaluate(_unordered(mid)) >= steps
            hi, lo = torch.where(reached, mid, hi), torch.where(reached, lo, mid)
        thresholds = _unordered(hi)  # [rows, 15], non-decreasing along a row
        keys = self._keys(thresholds).long()
        at = torch.arange(buckets, dtype=torch.int64).expand(rows, buckets).contiguous()
        self.below = torch.searchsorted(keys.contiguous(), at).int().flatten()
        inside: dict[int, list[list[float | int]]] = {}
        for row, (row_keys, row_thresholds) in enumerate(
            zip(keys.tolist(), thresholds.tolist(), strict=True)
        ):
            for key, value in zip(row_keys, row_thresholds, strict=True):
                found = inside.setdefault(row * buckets + key, [])
                if found and found[-1][0] == value:
                    found[-1][1] += 1
                else:
                    found.append([value, 1])
        most = max(len(found) for found in inside.values())
        if most > _MOST_IN_A_BUCKET:
            raise _NotCovered
        self.at = torch.full((most, rows * buckets), float("inf"))
        self.codes = self.below.view(-1, 1).repeat(1, most + 1)  # [bucket, thresholds passed in it]
        for index, found in inside.items():
            reached = int(self.below[index])
            for slot in range(most):
                if slot < len(found):
                    self.at[slot, index] = found[slot][0]
                    reached += found[slot][1]
                self.codes[index, slot + 1] = reached  # an unused slot: +inf, passed only by t = +inf
        self.codes = self.codes.flatten()
        self.slots = most + 1

    def _keys(self, t: torch.Tensor) -> torch.Tensor:
        """Each value's bucket: monotone in t, the same float32 operations for the thresholds and the data."""
        # width a power of 2: t · width is exact, so fused or not, one rounding of the sum
        return torch.add(self.bound * self.width, t, alpha=self.width).clamp_(0, self.buckets - 1).int()

    def nearest(
        self, t: torch.Tensor, row: torch.Tensor | None = None, of: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The codes (int32, t's shape) of float32 `t`, with the table's `row` (int32 broadcast to t; None: 0); `of`:
        `composed` with a table, that table's entries at them instead."""
        index = self._keys(t)
        if row is not None:
            index = index.add_(row * self.buckets)
        index, flat = index.flatten(), t.flatten()
        passed = index * self.slots
        for at in self.at:
            passed += flat >= at.index_select(0, index)
        return (self.codes if of is None else of).index_select(0, passed).view(t.shape)

    def composed(self, table: torch.Tensor) -> torch.Tensor:
        """table[code] for each of `nearest`'s indices into its codes: a code's value in one gather."""
        return table.index_select(0, self.codes)


class _NotCovered(Exception):
    """A codebook `_Steps` cannot read exactly: the straightforward path then."""


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """float32 values as int64 keys in their order (±0 both 0)."""
    bits = x.float().view(torch.int32).long()
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def _unordered(keys: torch.Tensor) -> torch.Tensor:
    return torch.where(keys < 0, -keys - (1 << 31), keys).to(torch.int32).view(torch.float32)


@functools.lru_cache(maxsize=8)
def _steps_for(levels: tuple[float, ...]) -> tuple[_Steps, _Steps, torch.Tensor, torch.Tensor] | None:
    table = torch.tensor(levels, dtype=torch.float32)
    if not bool((table[1:] > table[:-1]).all()):
        return None  # an unsorted or repeated codebook: the nearest level is not a step function of it
    try:
        nearest = _Steps(lambda t: _nearest(t, table), 1, 2.0, 8192)
        s_rel = torch.arange(_E4M3_NAN, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        grids = (table.view(1, 1, -1) * s_rel.view(-1, 1, 1)).round_().clamp_(-INT8_MAX, INT8_MAX)
        per_group = _Steps(
            lambda t: _nearest_per_group(t.unsqueeze(1), grids).squeeze(1), _E4M3_NAN, 128.0, 1024
        )
    except _NotCovered:
        return None
    return nearest, per_group, nearest.composed(table), per_group.codes.to(torch.uint8)


def _steps_of(table: torch.Tensor) -> tuple[_Steps, _Steps, torch.Tensor, torch.Tensor] | None:
    """The `_Steps` of a float32 codebook on the CPU (cached): its nearest level, its int8 grids' for each s_rel,
    the first's codes composed with the codebook (the levels themselves), the second's as uint8; None where they do
    not apply."""
    if table.device.type != "cpu" or not bool(torch.isfinite(table).all()):
        return None
    return _steps_for(tuple(table.tolist()))


FORMAT = ComfyW4a8()
