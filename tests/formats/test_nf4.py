"""nf4: bit-exact to bitsandbytes' quantize_4bit (blocksize 64, double quantization) on the shapes its block
bookkeeping trips on, decoded as bitsandbytes decodes. The shared checks (bit-exactness from fp32, fp16 and bf16,
the parts' layout, row ranges, non-finite weights) are `test_contract.py`'s."""

from __future__ import annotations

import bitsandbytes.functional as F
import pytest
import torch

from loaders.bnb import quant_state
from quantize.formats import NO_OPTIONS
from quantize.formats import nf4 as nf4_module
from quantize.formats.base import UnsupportedShapeError
from tests.formats.references import nf4 as _reference

nf4 = nf4_module.FORMAT


@pytest.fixture(autouse=True)
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # the nested offset is a mean: bitsandbytes' last bit depends on the thread count
    yield
    torch.set_num_threads(saved)


def reference(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """bitsandbytes' own result for the weight loaded in bf16, keyed as Linear4bit stores it."""
    return _reference(w, NO_OPTIONS)


def _weight(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * 0.02
    if w.numel() >= 256:
        w.view(-1)[:64] = 0  # an all-zero block
        w.view(-1)[64:128] *= 1e-30  # a block of tiny values
        w.view(-1)[200] = 1.5  # an outlier
    return w.to(dtype)


@pytest.mark.parametrize("shape", [(256, 192), (130, 64), (33, 7), (5, 13)])
def test_encode_is_bit_exact_to_bitsandbytes_on_any_shape(shape):
    """Odd counts (a padded last byte), a short last block, a short last group of 256 absmaxes."""
    w = _weight(shape, torch.bfloat16)
    ours, theirs = nf4.encode(w), reference(w)
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key


def test_large_weight_crosses_many_chunks_bit_exactly():
    w = _weight((2048, 1536), torch.bfloat16, seed=1)  # three 1M-value chunks
    ours, theirs = nf4.encode(w), reference(w)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key


def test_decode_matches_bitsandbytes():
    w = _weight((96, 256), torch.bfloat16)
    parts = nf4.encode(w)
    state = quant_state(parts)
    assert torch.equal(nf4.decode(parts, torch.bfloat16), F.dequantize_4bit(parts["weight"], state))
    whole = nf4.decode(parts)
    err = (whole - w.float()).norm() / w.float().norm()
    assert 0.05 < err < 0.12  # NF4 on Gaussian weights: about 0.09


def test_widths_bitsandbytes_cannot_decode_on_cpu_are_refused():
    with pytest.raises(UnsupportedShapeError, match="multiple of 64"):
        nf4.parts((64, 160))


def test_quantization_config_is_diffusers_bitsandbytes_config():
    import diffusers

    kept = ["proj_out", "condition_embedder.time_proj"]
    theirs = diffusers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        llm_int8_skip_modules=sorted(kept),
    )
    assert nf4.quantization_config(kept) == theirs.to_dict()


def test_code_books_equal_bitsandbytes():
    assert torch.equal(nf4_module._nf4_code(), F.get_4bit_type("nf4", device="cpu"))
    assert torch.equal(nf4_module._dynamic_code(), F.create_dynamic_map(signed=True))


@pytest.mark.parametrize("shape", [(33, 7), (600, 128), (5, 13)])
def test_decode_is_bitsandbytes_dequantize_for_any_rows(shape):
    w = _weight(shape, torch.bfloat16, seed=2)
    parts = nf4.encode(w)
    theirs = F.dequantize_4bit(parts["weight"], quant_state(parts), quant_type="nf4")
    whole = nf4.decode(parts, torch.float32)
    assert torch.equal(whole.to(torch.bfloat16), theirs)
    # (600, 128): 1200 blocks of 64, 5 groups of 256 absmaxes; these ranges start and end inside groups
    for r0, r1 in [(0, 1), (100, 350), (shape[0] - 1, shape[0]), (0, shape[0])]:
        if r1 <= shape[0]:
            assert torch.equal(nf4.decode(parts, rows=(r0, r1)), whole[r0:r1])


def test_double_quantization_without_the_native_library_gives_the_same_bytes(monkeypatch):
    from quantize.formats import _bnb_lib

    assert _bnb_lib.native_library() is not None  # the installed bitsandbytes ships its CPU library
    w = _weight((256, 192), torch.bfloat16, seed=3)
    native = nf4.encode(w)
    monkeypatch.setattr(_bnb_lib, "native_library", lambda: None)
    through_package = nf4.encode(w)
    for key in native:
        assert torch.equal(native[key], through_package[key]), key


def test_encoding_and_decoding_do_not_import_bitsandbytes():
    import subprocess
    import sys

    code = (
        "import sys, torch; from quantize.formats.nf4 import FORMAT as nf4; "
        "p = nf4.encode(torch.randn(64, 128)); nf4.decode(p); "
        "print(sorted(m for m in sys.modules if m.startswith('bitsandbytes')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
