"""`nf4`: bitsandbytes' 4-bit NormalFloat layout (blocksize 64, double quantization), as diffusers saves it.

On disk, per quantized Linear ``<m>`` (what `Linear4bit` puts in a state dict):
  ``<m>.weight``                                 uint8 [ceil(n/2), 1]   two 4-bit codes a byte, high nibble first
  ``<m>.weight.absmax``                          uint8 [ceil(n/64)]     block absmax, 8-bit quantized (double quant)
  ``<m>.weight.quant_map``                       float32 [16]           the NF4 code book
  ``<m>.weight.nested_absmax``                   float32 [ceil(n/64/256)]
  ``<m>.weight.nested_quant_map``                float32 [256]
  ``<m>.weight.quant_state.bitsandbytes__nf4``   uint8 [~170]           packed JSON: shape, dtype, nested_offset...
The last one is a *late* tensor: its length depends on the printed nested offset (see `writer`).

Numerics: those of ``bitsandbytes.functional.quantize_4bit(w, blocksize=64, compress_statistics=True,
quant_type="nf4")`` on the CPU, applied to the weight in bf16 (as a model loaded with
``torch_dtype=bfloat16`` and `BitsAndBytesConfig(..., bnb_4bit_compute_dtype=bfloat16)` is): per 64
values, absmax = max|w|, scaled = clamp(w · (1 / absmax), ±1), code = the NF4 bucket of scaled; then
the absmaxes, less their mean, are quantized blockwise (256) with the 8-bit dynamic code by
bitsandbytes' own CPU kernel (`_bnb_lib`: called without importing the package, whose import costs
seconds). The first stage, which is nearly all the work, is ours: the same float32 operations, the
bucket found through a 64K-entry table on the top 16 bits of the float (exact comparison for the few
cells that straddle a bucket edge); it is bit-exact and several times faster than bitsandbytes' CPU
path. The mean is taken on one thread; bitsandbytes' own result can differ in the last bit with more
threads. The code books and the packed JSON are built here too, equal to bitsandbytes' (tests compare
them); decoding is plain float32 arithmetic, code value times block absmax, as bitsandbytes does it.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable

import torch

from . import format_info
from ._bnb_lib import quantize_blockwise
from .base import Format, NonFiniteWeightError, PartSpec, RowCut, UnsupportedShapeError
from .options import NO_OPTIONS, FormatOptions

__all__ = [
    "FORMAT",
    "Nf4",
    "WEIGHT",
    "ABSMAX",
    "QUANT_MAP",
    "NESTED_ABSMAX",
    "NESTED_QUANT_MAP",
    "QUANT_STATE",
    "state_fields",
]

BLOCKSIZE = 64
NESTED_BLOCKSIZE = 256
HP_DTYPE = torch.bfloat16
WEIGHT = "weight"
ABSMAX = "weight.absmax"
QUANT_MAP = "weight.quant_map"
NESTED_ABSMAX = "weight.nested_absmax"
NESTED_QUANT_MAP = "weight.nested_quant_map"
QUANT_STATE = "weight.quant_state.bitsandbytes__nf4"
_HIGH_HALF = 1 if sys.byteorder == "little" else 0  # of a float32 seen as two uint16
_CHUNK_ELEMS = BLOCKSIZE * 16384  # one million values a step: stays in cache, amortizes calls


#: The NF4 code book: QLoRA's 4-bit NormalFloat values (Dettmers et al. 2023, arXiv:2305.14314), sorted,
#: as bitsandbytes stores them (`get_4bit_type("nf4")`).
NF4_CODE = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


@functools.cache
def _nf4_code() -> torch.Tensor:
    return torch.tensor(NF4_CODE, dtype=torch.float32)


@functools.cache
def _dynamic_code() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic code (`create_dynamic_map()`), which double quantization uses.

    Dynamic tree quantization (Dettmers 2016, arXiv:1511.04561) with 7 exponent bits: decade ``10^(i-6)``
    for i = 0..6 holds 2^i values, the midpoints of a float32 linspace from 0.1 to 1 scaled into it, with
    both signs; then 0 and 1. 2 · 127 + 2 = 256 values, sorted.
    """
    values = [0.0, 1.0]
    for i in range(7):
        steps = torch.linspace(0.1, 1, 2**i + 1, dtype=torch.float32)
        midpoints = (steps[:-1] + steps[1:]) / 2.0
        decade = 10 ** (i - 6)
        values += (decade * midpoints).tolist() + (-decade * midpoints).tolist()
    return torch.tensor(sorted(values), dtype=torch.float32)


@functools.cache
def _bucket_table() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NF4 bucket edges (bitsandbytes' midpoints), and per top-16-bit float pattern (a *cell* of 65536 floats):
    the bucket of its smallest value, and the edge inside the cell (+inf where the cell is in one bucket).

    A cell spans less than 1% of its value, far less than the distance between two edges, so it holds at
    most one edge: the bucket of x is base[cell] + (x > edge[cell]), which is `torch.bucketize(x, edges)`
    (x <= edge stays below it) without a search.
    """
    code = _nf4_code()
    edges = (code[:-1] + code[1:]) / 2  # NF4's code is sorted: these are bitsandbytes' bucket bounds
    patterns = torch.arange(1 << 16, dtype=torch.int32) << 16
    ends = torch.stack([patterns.view(torch.float32), (patterns | 0xFFFF).view(torch.float32)])
    low, high = ends.amin(dim=0), ends.amax(dim=0)  # a negative cell's pattern order is reversed
    b_low, b_high = torch.bucketize(low, edges), torch.bucketize(high, edges)
    if bool((b_high - b_low > 1).any()):
        raise AssertionError("an NF4 edge table cell spans two edges")
    straddles = b_high != b_low
    edge = torch.full((1 << 16,), math.inf)
    edge[straddles] = edges[b_low[straddles]]
    nan = low.isnan() | high.isnan()  # NaN cells: what bucketize gives NaN (the weight is refused anyway)
    b_low[nan] = torch.bucketize(torch.tensor([math.nan]), edges)
    return edges, b_low.to(torch.uint8), edge


def _codes(scaled: torch.Tensor) -> torch.Tensor:
    """`torch.bucketize(scaled, edges)` as uint8, through the cell tables."""
    _, base, edge = _bucket_table()
    # the top 16 bits of each float32: the high half of its two 16-bit halves (one strided pass, no shift, no mask)
    cell = scaled.contiguous().view(torch.uint16).view(-1, 2)[:, _HIGH_HALF].int()
    q = base.index_select(0, cell)
    return q.add_(scaled > edge.index_select(0, cell))


def _first_stage(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed codes and float32 absmax of a flat weight, as bitsandbytes' CPU `quantize_4bit` computes them."""
    n = flat.numel()
    codes = torch.empty(n + (n % 2), dtype=torch.uint8)
    codes[n:] = _codes(torch.zeros(1))  # an odd count is padded with a scaled 0, as bitsandbytes does
    absmax = torch.empty(-(-n // BLOCKSIZE), dtype=torch.float32)
    full = n - n % BLOCKSIZE
    for start in range(0, full, _CHUNK_ELEMS):
        end = min(full, start + _CHUNK_ELEMS)
        x = flat[start:end].float().view(-1, BLOCKSIZE)
        am = x.abs().amax(dim=1)
        scaled = x.mul_((1.0 / am.clamp(min=1e-38)).view(-1, 1)).clamp_(-1, 1)
        absmax[start // BLOCKSIZE : end // BLOCKSIZE] = am
        codes[start:end] = _codes(scaled.view(-1))
    if full < n:  # a last, short block: bitsandbytes divides there instead of multiplying by the reciprocal
        x = flat[full:].float()
        am = x.abs().max().clamp(min=1e-38)
        absmax[-1] = am
        codes[full:n] = _codes(torch.clamp(x / am, -1, 1))
    if not bool(torch.isfinite(absmax).all()):
        raise NonFiniteWeightError("holds NaN or Inf values")
    return _pack_pairs(codes).unsqueeze(1), absmax


def _pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes a byte, the first in the high nibble: ``(codes[0::2] << 4) | codes[1::2]``, computed on
    the codes seen as int16 pairs (4x faster than the stride-2 byte ops): the low byte of (v << 4) | (v >> 8)."""
    if sys.byteorder != "little":
        return (codes[0::2] << 4) | codes[1::2]
    pairs = codes.view(torch.int16)  # little-endian: low byte = first code, high byte = second
    return ((pairs << 4) | (pairs >> 8)).to(torch.uint8)  # the cast keeps the low byte


def _packed_fields(shape: tuple[int, ...], nested_offset: float) -> torch.Tensor:
    """The quant state's fixed fields as bitsandbytes packs them: its JSON (`json.dumps` defaults, its key
    order), UTF-8, as a uint8 tensor."""
    fields = {
        "quant_type": "nf4",
        "blocksize": BLOCKSIZE,
        "dtype": str(HP_DTYPE).removeprefix("torch."),
        "shape": list(shape),
        "nested_blocksize": NESTED_BLOCKSIZE,
        "nested_dtype": "float32",
        "nested_offset": nested_offset,
    }
    return _packed_state(fields)


def _packed_state(fields: dict) -> torch.Tensor:
    """A quant state's fields packed as bitsandbytes packs them: `json.dumps` (defaults), UTF-8, a uint8 tensor."""
    return torch.frombuffer(bytearray(json.dumps(fields).encode()), dtype=torch.uint8)


def state_fields(packed: torch.Tensor) -> dict:
    """The fixed fields of a weight's quant state (shape, dtype, blocksizes, nested offset), from its packed JSON part."""
    return json.loads(bytes(packed.cpu().tolist()).decode())


def _block_absmax(parts: dict[str, torch.Tensor], offset: float, b0: int, b1: int) -> torch.Tensor:
    """The float32 absmax of blocks [b0, b1): nested code value · nested absmax of its group of 256, + offset."""
    n0, n1 = b0 // NESTED_BLOCKSIZE, -(-b1 // NESTED_BLOCKSIZE)
    coded = parts[ABSMAX][n0 * NESTED_BLOCKSIZE : n1 * NESTED_BLOCKSIZE]
    values = parts[NESTED_QUANT_MAP].index_select(0, coded.int())
    scaled = _per_block(values, NESTED_BLOCKSIZE).mul_(parts[NESTED_ABSMAX][n0:n1].view(-1, 1))
    absmax = scaled.view(-1)[: coded.numel()].add_(torch.tensor(offset, dtype=torch.float32))
    return absmax[b0 - n0 * NESTED_BLOCKSIZE : b1 - n0 * NESTED_BLOCKSIZE]


def _per_block(values: torch.Tensor, blocksize: int) -> torch.Tensor:
    """`values` as rows of `blocksize` (a short last block padded with zeros)."""
    short = -values.numel() % blocksize
    if short:
        values = torch.cat([values, values.new_zeros(short)])
    return values.view(-1, blocksize)


def _pair_table(code: torch.Tensor) -> torch.Tensor:
    """Per packed byte, its two decoded code values (high nibble first), as one 8-byte item: one 1-D lookup
    decodes two weights (`.view(torch.float32)` after it). A [256, 2] table would be gathered row by row
    with a memcpy each, 2.5x slower."""
    nibbles = torch.arange(256, device=code.device)
    pairs = torch.stack([code[nibbles >> 4], code[nibbles & 0xF]], dim=1).float()
    return pairs.view(torch.int64).view(-1)


class Nf4(Format):
    NAME = "nf4"
    ROW_SEPARABLE = False
    CODE_TABLES = (QUANT_MAP, NESTED_QUANT_MAP)  # bitsandbytes' float32 code books

    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        if shape[-1] % BLOCKSIZE:
            raise UnsupportedShapeError(
                f"is {list(shape)}; nf4 needs in_features to be a multiple of {BLOCKSIZE} "
                "(bitsandbytes 0.50's CPU kernel decodes other widths wrongly)"
            )
        n = math.prod(shape)
        blocks = -(-n // BLOCKSIZE)
        return {
            WEIGHT: ("U8", ((n + 1) // 2, 1)),
            ABSMAX: ("U8", (blocks,)),
            QUANT_MAP: ("F32", (16,)),
            NESTED_ABSMAX: ("F32", (-(-blocks // NESTED_BLOCKSIZE),)),
            NESTED_QUANT_MAP: ("F32", (256,)),
            QUANT_STATE: ("U8", None),
        }

    def encode(self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS) -> dict[str, torch.Tensor]:
        """Quantize a weight to NF4 with double quantization, bit-exact to bitsandbytes (see the module docstring)."""
        w = weight.to(HP_DTYPE).contiguous()
        packed, absmax = _first_stage(w.view(-1))
        offset = absmax.mean()
        qabsmax, nested_absmax = quantize_blockwise(absmax - offset, _dynamic_code(), NESTED_BLOCKSIZE)
        return {
            WEIGHT: packed,
            ABSMAX: qabsmax,
            QUANT_MAP: _nf4_code().clone(),
            NESTED_ABSMAX: nested_absmax,
            NESTED_QUANT_MAP: _dynamic_code().clone(),
            QUANT_STATE: _packed_fields(tuple(w.shape), float(offset)),
        }

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """The dequantized weight (or rows of it): code[q] · absmax of its block, in float32, then cast to `dtype`.

        The float32 products bitsandbytes' dequantization computes, so the values are the same to the bit.
        """
        fields = state_fields(parts[QUANT_STATE])
        out_features, in_features = fields["shape"]
        r0, r1 = rows or (0, out_features)
        start, end = r0 * in_features, r1 * in_features
        b0, b1 = start // BLOCKSIZE, -(-end // BLOCKSIZE)
        absmax = _block_absmax(parts, float(fields["nested_offset"]), b0, b1)
        packed = parts[WEIGHT].view(-1)[b0 * BLOCKSIZE // 2 : -(-b1 * BLOCKSIZE // 2)]
        values = _pair_table(parts[QUANT_MAP]).index_select(0, packed.int()).view(torch.float32)
        values = _per_block(values, BLOCKSIZE).mul_(absmax.view(-1, 1)).view(-1)
        first = b0 * BLOCKSIZE
        return values[start - first : end - first].view(r1 - r0, in_features).to(dtype)

    def cut_rows(
        self,
        shape: tuple[int, int],
        options: FormatOptions,
        ranges: tuple[tuple[int, int], ...],
        read: Callable[[str], torch.Tensor],
    ) -> dict[str, RowCut]:
        """Rows of an NF4 weight as an NF4 weight of their own, bit for bit: their packed codes, their blocks' coded
        absmax and the nested absmax of those blocks' groups, the whole's code books, and the whole's quant state
        (its nested offset, the mean of its absmax, which the coded absmax are relative to) with the cut's shape. A nested
        group holds 256 blocks' absmax, so every range starts and ends on a group (16384 weights), but for the
        whole's end as the cut's last range (the short group that ends it)."""
        rows, cols = shape
        group = BLOCKSIZE * NESTED_BLOCKSIZE
        last = len(ranges) - 1
        inside = next(
            (
                r
                for i, rng in enumerate(ranges)
                for r in rng
                if r * cols % group and not (i == last and r == rows)
            ),
            None,
        )
        if inside is not None:
            raise UnsupportedShapeError(
                f"nf4 codes a weight's block scales in groups of {group} weights, and row {inside} of "
                f"{list(shape)} ({inside * cols} weights in) is inside one"
            )

        def of(unit: int) -> tuple[tuple[int, int], ...]:  # the ranges in units of `unit` weights
            return tuple((a * cols // unit, -(-b * cols // unit)) for a, b in ranges)

        cut = (sum(b - a for a, b in ranges), cols)
        return {
            WEIGHT: of(2),  # two codes a byte (each range starts on a group: on a whole byte)
            ABSMAX: of(BLOCKSIZE),
            NESTED_ABSMAX: of(group),
            **dict.fromkeys(self.CODE_TABLES),  # the code books: whole
            QUANT_STATE: _packed_state({**state_fields(read(QUANT_STATE)), "shape": list(cut)}),
        }

    def quantization_config(self, kept_linears: list[str]) -> dict:
        """diffusers' ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=kept).to_dict()``. Nothing goes into the
        shards' ``__metadata__``: the quant state travels with each weight."""
        return {
            "quant_method": format_info(self.NAME).quant_method,
            "_load_in_8bit": False,
            "_load_in_4bit": True,
            "llm_int8_threshold": 6.0,
            "llm_int8_skip_modules": sorted(kept_linears) or None,
            "llm_int8_enable_fp32_cpu_offload": False,
            "llm_int8_has_fp16_weight": False,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16",
            "bnb_4bit_quant_storage": "uint8",
            "load_in_4bit": True,
            "load_in_8bit": False,
        }


FORMAT = Nf4()
