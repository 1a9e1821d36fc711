"""The contract every registered format keeps, checked over the registry (for gguf: over every GGML type), so a new
format is held to it by being registered: its one `Format` instance; the parts `parts()` promises; bit for bit
its reference quantizer (`references.REFERENCES`: a format registered without one fails here); row chunks
that encode and decode as the whole; a non-finite weight refused naming the tensor and its file.

The per-format test files keep what is particular to one format (its edge cases, its library's readers).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from safetensors.torch import save_file

from quantize import dtypes
from quantize.encode import encode_and_measure
from quantize.errors import InputError
from quantize.formats import (
    FORMAT_INFO,
    FORMATS,
    Format,
    FormatOptions,
    format_for,
    format_info,
    format_of_config,
    get_format,
)
from quantize.plan import plan_component
from quantize.read.checkpoint import open_component
from quantize.recipes import parse_recipe
from tests.formats.references import REFERENCES

SHAPE = (48, 512)  # a shape every format holds: both dims multiples of 16, in_features whole K-quant blocks
MODULE = "blocks.0.ffn.0"
CHUNKS = [(0, 5), (5, 17), (17, 18), (18, 48)]  # uneven, one of a single row
#: a format whose chunks start on whole tiles of rows (`ROW_BLOCK`, 128 for NVFP4 and MXFP8): a taller weight, whose
#: last tile is partial and whose rows need padding to the format's blocks
TILED_SHAPE = (300, 512)
TILED_CHUNKS = [(0, 128), (128, 256), (256, 300)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _cases() -> list:
    """(format name, options) for every registered format and every options value a recipe can give it."""
    return [
        pytest.param(name, options, id=f"{name}-{options.type_name}" if options.type_name else name)
        for name in FORMAT_INFO
        for options in format_info(name).options.choices()
    ]


CASES = _cases()
FORMAT_NAMES = [pytest.param(name, id=name) for name in FORMAT_INFO]


def _weight(dtype: torch.dtype, seed: int = 0, shape: tuple[int, int] = SHAPE) -> torch.Tensor:
    """Gaussian rows and the rows quantizers trip on: an outlier, an all-zero row, rows of small and of tiny
    values (subnormal after scaling; fp16 flushes the 1e-30 row to zeros). Blocks of zeros of mixed signs are
    left to `test_gguf.py`, where ggml's and gguf-py's bytes for them differ (a known discrepancy, marked there)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * 0.02
    w[1, 3] = 0.5
    w[2] = 0
    w[4] = torch.randn(shape[1], generator=g) * 1e-3
    w[5] = torch.linspace(-1e-3, 1e-3, shape[1])
    w[6] = w[6].abs() * 1e-30
    return w.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype, shape and bytes (NaN included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _chunked(fmt: Format) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """The weight shape and row chunks to hold `fmt` to: chunks on its `ROW_BLOCK`."""
    return (SHAPE, CHUNKS) if fmt.ROW_BLOCK == 1 else (TILED_SHAPE, TILED_CHUNKS)


def _encode(fmt: Format, w: torch.Tensor, options: FormatOptions) -> dict[str, torch.Tensor]:
    """The whole weight encoded as the converter encodes it (what the format decides from it, then the parts)."""
    return fmt.encode(w, options, **fmt.weight_options([w.float()], options))


# --- the registry -------------------------------------------------------------------------------------------


def test_every_registered_format_has_a_reference():
    assert sorted(REFERENCES) == sorted(FORMATS), "a registered format needs its reference in references.py"


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_the_registry_gives_the_modules_one_instance(name):
    fmt = get_format(name)
    module = importlib.import_module(f"quantize.formats.{format_info(name).module}")
    assert isinstance(fmt, Format) and fmt is module.FORMAT and FORMATS[name] is fmt and fmt.NAME == name
    assert isinstance(fmt.ROW_SEPARABLE, bool)
    assert fmt.options_type is format_info(name).options
    assert format_of_config(fmt.quantization_config([]), "config.json") is fmt
    assert fmt.WEIGHT_PARTS == () or fmt.ROW_SEPARABLE  # whole-weight parts are a row-streaming notion
    for options in fmt.options_type.choices():
        fmt.check_available(options)  # the dev environment has every format's libraries
        specs = fmt.parts(SHAPE, options)
        # a whole-weight part only some options have (a static input scale, a pre_quant_scale): there where they
        # have it
        calibrated = fmt.calibrated(options, 1.0)
        every = set(specs) if calibrated is None else set(fmt.parts(SHAPE, calibrated))
        smoothed = None if calibrated is None else fmt.smoothed(calibrated, (1.0,) * SHAPE[1])
        every |= set() if smoothed is None else set(fmt.parts(SHAPE, smoothed))
        assert set(fmt.WEIGHT_PARTS) <= every and set(fmt.CODE_TABLES) <= set(specs)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_each_ladder_climbs_through_options_a_format_writes_and_ends(name):
    """Each rung up is options of the format itself, or (a mixed ComfyUI file) of the format its options name."""
    fmt = get_format(name)
    for options in fmt.options_type.choices():
        seen = {options}
        up = fmt.raised(options)
        while up is not None:
            owner = format_for(fmt, up)
            assert up in owner.options_type.choices() and up not in seen, (options, up)
            assert fmt.options_type.from_type(up.type_name) == up  # a recipe of `fmt` can name it
            seen.add(up)
            up = owner.raised(up)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_options_are_named_as_the_recipe_names_them(name):
    options_type = format_info(name).options
    for options in options_type.choices():
        assert options_type.from_type(options.type_name) == options
        hash(options)  # the plan collects them in sets
    with pytest.raises(ValueError):
        options_type.from_type("NOT_A_TYPE")


# --- numerics, for every format and every type --------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, options", CASES)
def test_encode_is_bit_exact_to_the_reference(name, options, dtype):
    w = _weight(dtype)
    ours, theirs = _encode(get_format(name), w, options), REFERENCES[name](w, options)
    assert set(ours) == set(theirs)
    for part, t in theirs.items():
        assert _same(ours[part], t), part


@pytest.mark.parametrize("name, options", CASES)
def test_the_parts_are_what_parts_promises(name, options):
    """Each encoded part has the dtype and shape `parts()` gives (a block type: its rows' bytes; a late part:
    1-D bytes of a length known only once encoded), in the same order."""
    fmt = get_format(name)
    specs, parts = fmt.parts(SHAPE, options), _encode(fmt, _weight(torch.bfloat16), options)
    assert list(parts) == list(specs)
    for part, (dtype_name, shape) in specs.items():
        row, t = dtypes.by_name(dtype_name), parts[part]
        if shape is None:
            assert t.dtype == torch.uint8 and t.dim() == 1, part
        elif row.block > 1:
            assert t.dtype == torch.uint8 and t.shape == (
                *shape[:-1],
                dtypes.nbytes(dtype_name, shape[-1:]),
            ), part
        else:
            assert t.dtype == row.torch and t.shape == shape, part


@pytest.mark.parametrize("name, options", CASES)
def test_row_ranges_decode_as_the_whole(name, options):
    fmt = get_format(name)
    shape, _ = _chunked(fmt)
    parts = _encode(fmt, _weight(torch.bfloat16, seed=1, shape=shape), options)
    whole = fmt.decoded(parts, shape, torch.float32, options=options)
    assert whole.dtype == torch.float32 and whole.shape == shape
    assert not whole[2].any()  # the all-zero row decodes to zeros
    for r0, r1 in [*CHUNKS, *TILED_CHUNKS, (130, 131)]:
        if r1 <= shape[0]:
            got = fmt.decoded(parts, shape, torch.float32, rows=(r0, r1), options=options)
            assert _same(got, whole[r0:r1]), (r0, r1)
    assert _same(fmt.decoded(parts, shape, torch.bfloat16, options=options), whole.to(torch.bfloat16))


@pytest.mark.parametrize("name, options", [c for c in CASES if get_format(c.values[0]).ROW_SEPARABLE])
def test_row_chunks_encode_and_decode_as_the_whole(name, options):
    """A row-separable format encodes float32 row chunks (what the converter streams, on its `ROW_BLOCK`) into
    the whole weight's rows, with its whole-weight parts (`WEIGHT_PARTS`) the same for every chunk."""
    fmt = get_format(name)
    shape, chunks = _chunked(fmt)
    w = _weight(torch.bfloat16, seed=2, shape=shape)
    whole = _encode(fmt, w, options)
    decided = fmt.weight_options((w[r0:r1].float() for r0, r1 in chunks), options)
    decoded = fmt.decoded(whole, shape, torch.float32, options=options)
    for r0, r1 in chunks:
        chunk = fmt.encode(w[r0:r1].float(), options, **decided)
        assert set(chunk) == set(whole)
        for part, t in chunk.items():
            want = whole[part] if part in fmt.WEIGHT_PARTS else whole[part][r0 : r0 + len(t)]
            assert _same(t, want), (part, r0, r1)
        got = fmt.decoded(chunk, (r1 - r0, shape[1]), torch.float32, options=options)
        assert _same(got, decoded[r0:r1])


# --- what the converter makes of a weight no scale can hold -------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("name, options", CASES)
def test_a_non_finite_weight_is_refused_naming_the_tensor(name, options, bad, tmp_path):
    w = _weight(torch.bfloat16)
    w[37, 300] = bad
    path = tmp_path / "model.safetensors"
    save_file({f"{MODULE}.weight": w.contiguous()}, path)
    type_line = f"type: {options.type_name}\n" if options.type_name else ""
    recipe = parse_recipe(f"format: {name}\n{type_line}targets: ['{MODULE}']\n")
    (tp,) = plan_component(open_component(tmp_path), recipe).tensors
    with pytest.raises(InputError) as e:
        encode_and_measure(tp, get_format(name), lambda parts, rows: parts)
    assert str(e.value) == (
        f"{path}: tensor '{MODULE}.weight' holds NaN or Inf values: refusing to quantize it"
    ), str(e.value)
