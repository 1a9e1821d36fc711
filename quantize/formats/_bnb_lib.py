"""bitsandbytes' blockwise 8-bit quantizer (its CPU library), called without importing the package.

`nf4` uses bitsandbytes for one step only: its double quantization, which quantizes the block absmaxes
with the 8-bit dynamic code, 256 at a time. Importing `bitsandbytes.functional` for that costs about
3 s of a 1.3B conversion's 11 (it loads torch._dynamo and every backend), for a few milliseconds of
work. So the kernel the package itself calls on the CPU, ``cquantize_blockwise_cpu_fp32`` in the
``libbitsandbytes_cpu`` library shipped inside the installed package, is loaded directly with ctypes.
Where that library or symbol is missing (another platform, another bitsandbytes), the package's own
``quantize_blockwise`` is used instead: slower to start, the same numbers. tests/formats/test_nf4.py
checks both paths against bitsandbytes, bit for bit.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
from pathlib import Path

import torch

from ._quiet import silenced

__all__ = ["quantize_blockwise", "native_library"]

_SYMBOL = "cquantize_blockwise_cpu_fp32"
_SUFFIX = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")


@functools.cache
def native_library() -> ctypes.CDLL | None:
    """bitsandbytes' CPU library with the quantizer's signature set, or None where it cannot be used."""
    spec = importlib.util.find_spec("bitsandbytes")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / f"libbitsandbytes_cpu{_SUFFIX}"
    try:
        lib = ctypes.CDLL(str(path))
        fn = getattr(lib, _SYMBOL)
    except (OSError, AttributeError):
        return None
    # (code, values, absmax out, codes out, blocksize, n): bitsandbytes 0.50's backends/cpu/ops.py call
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_longlong] * 2
    fn.restype = None
    return lib


def quantize_blockwise(
    values: torch.Tensor, code: torch.Tensor, blocksize: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit codes (uint8, values' shape) and float32 absmax per block of `values` (float32, CPU) in `code`."""
    values, code = values.float().contiguous(), code.float().contiguous()
    lib = native_library()
    if lib is None:
        return _through_package(values, code, blocksize)
    n = values.numel()
    codes = torch.empty(values.shape, dtype=torch.uint8)
    absmax = torch.empty(-(-n // blocksize), dtype=torch.float32)
    getattr(lib, _SYMBOL)(
        code.data_ptr(), values.data_ptr(), absmax.data_ptr(), codes.data_ptr(), blocksize, n
    )
    return codes, absmax


def _through_package(values: torch.Tensor, code: torch.Tensor, blocksize: int):
    with silenced("bitsandbytes"):
        import bitsandbytes  # noqa: F401  (registers the bitsandbytes ops)

    return torch.ops.bitsandbytes.quantize_blockwise(values, code, blocksize)
