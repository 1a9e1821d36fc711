"""Process-wide settings for a long streaming run. The `quantize` command owns its process and applies
them; the Python API (`convert`, `verify`) leaves a caller's process as it is.

- glibc's allocator gives freed memory back to the kernel eagerly: a conversion allocates and frees
  a few MB of temporaries per row chunk, so every chunk faulted its pages in anew (1.2 million minor
  faults, about a second of system time for a 1.3B model). Larger thresholds keep those pages.
- `gc.freeze()` after the heavy imports: torch's hundreds of thousands of objects leave the
  collector's generations, so the collections triggered by a conversion's many small objects
  (futures, tensor handles) do not walk them again and again.
"""

from __future__ import annotations

import ctypes
import gc
import platform

__all__ = ["tune_for_streaming", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

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


def _keep_freed_memory() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the mmap threshold first: setting either one fixes both (no more dynamic adjustment), and a trim
    # threshold alone, with the default 128 KiB mmap threshold, would map every chunk afresh
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
