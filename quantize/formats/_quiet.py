"""Importing the format libraries quietly: on a CPU-only machine they log harmless warnings about
GPU kernels they cannot load ("Failed to load ... .so", "Failed to load CPU gemm_4bit_forward")."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["silenced"]


@contextmanager
def silenced(*loggers: str) -> Iterator[None]:
    """Raise the named loggers to ERROR for the duration (of an import, say)."""
    levels = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
