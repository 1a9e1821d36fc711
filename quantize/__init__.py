"""dit-quantize: offline conversion of video diffusion transformers to pre-quantized checkpoints.

>>> from quantize import convert
>>> # manifest = convert("Wan2.1-T2V-1.3B", "Wan2.1-T2V-1.3B-fp8", "wan-fp8.yaml")

The entry points are imported on first use, so that `loaders` can use `quantize.formats` and
`quantize.read.checkpoint` without pulling in the converter.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {"convert": ".publish.converter", "make_plan": ".plan", "load_recipe": ".recipes"}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
