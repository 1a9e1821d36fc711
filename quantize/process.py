"""Process-wide settings for a long streaming run. The `quantize` command owns its process and applies
them; the Python API (`convert`, `verify`) leaves a caller's process as it is.

- glibc's allocator gives freed memory back to the kernel eagerly: a conversion allocates and frees
  a few MB of temporaries per row chunk, so every chunk faulted its pages in anew (1.2 million minor
  faults, about a second of system time for a 1.3B model). Larger thresholds keep those pages.
- A forward pass (`verify --forward`, `sensitivity`) frees a layer's float32 weights and its activations
  after each layer, between long-lived small allocations: glibc keeps the freed pages in its heaps, so a
  pass grew by about 1.3 GB on the 1.3B shape with torch on one thread. `release_free_memory` (glibc's
  `malloc_trim`) gives them back every 256 MB of weights (after every layer, it tripled the pass's time);
  it changes no setting, so the library may call it.
- `gc.freeze()` after the heavy imports: torch's hundreds of thousands of objects leave the
  collector's generations, so the collections triggered by a conversion's many small objects
  (futures, tensor handles) do not walk them again and again.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import platform
from collections.abc import Callable

__all__ = ["tune_for_streaming", "release_free_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
#: allocations above this get pages of their own (and give them back when freed): twice a 4 MB row chunk,
#: so whole-weight arrays (nf4 encodes a weight at once) are not kept by the allocator after use
MMAP_THRESHOLD = 8 << 20
#: free memory at the top of a heap kept for reuse rather than trimmed
TRIM_THRESHOLD = 64 << 20


def tune_for_streaming() -> bool:
    """Apply the settings above (call it after the imports); returns whether the allocator took them."""
    gc.freeze()
    return _keep_freed_memory()


def release_free_memory() -> None:
    """Give the allocator's free pages back to the kernel (glibc's `malloc_trim`; nothing elsewhere)."""
    trim = _glibc("malloc_trim", (ctypes.c_size_t,))
    if trim is not None:
        trim(0)


@functools.cache
def _glibc(name: str, argtypes: tuple) -> Callable[..., int] | None:
    """glibc's function `name` (returning int), or None where the C library is not glibc or lacks it."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function


def _keep_freed_memory() -> bool:
    mallopt = _glibc("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None:
        return False
    # the mmap threshold first: setting either one fixes both (no more dynamic adjustment), and a trim
    # threshold alone, with the default 128 KiB mmap threshold, would map every chunk afresh
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
