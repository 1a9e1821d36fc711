"""The consoles (stdout, stderr), the progress display, sizes as text, and the --debug setting."""

from __future__ import annotations

import logging
import os
import threading
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

__all__ = ["out", "err", "state", "progress_display", "gb", "quiet_model_imports"]

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
for _c in (out, err):
    if not _c.is_terminal:  # logs and pipes: wide lines rather than wrapped tables
        _c.width = max(_c.width, 160)
#: set by the group's options: "debug" (show tracebacks), "command" (the one invoked, for its option names)
state: dict = {"debug": False, "command": None}


class _RichProgress:
    """A progress bar with bytes, items (tensors, files), rate and ETA, for a terminal."""

    def __init__(self, label: str, unit: str):
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=False),
            TextColumn("{task.fields[items]}/{task.fields[total_items]} " + unit),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        )
        self._label = label
        self._task = None
        self._lock = threading.Lock()
        self._items = 0

    def start(self, total_bytes: int, total_items: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task(self._label, total=total_bytes, items=0, total_items=total_items)

    def advance(self, nbytes: int, items: int = 1) -> None:
        with self._lock:
            self._items += items
            self._bar.update(self._task, advance=nbytes, items=self._items)

    def note(self, text: str) -> None:
        pass

    def stop(self) -> None:
        self._bar.stop()


class _PlainProgress:
    """Plain progress lines (every 10% or 10 s), for logs and pipes."""

    def __init__(self, label: str, unit: str):
        self._label, self._unit = label, unit
        self._lock = threading.Lock()
        self._done = self._items = 0
        self._total = self._total_items = 0
        self._t0 = self._last_t = time.monotonic()
        self._last_pct = 0

    def start(self, total_bytes: int, total_items: int) -> None:
        self._total, self._total_items = total_bytes, total_items
        self._t0 = self._last_t = time.monotonic()
        err.print(f"{self._label}: {total_items} {self._unit}, {gb(total_bytes)}")

    def advance(self, nbytes: int, items: int = 1) -> None:
        with self._lock:
            self._done += nbytes
            self._items += items
            now = time.monotonic()
            pct = 100 * self._done // max(1, self._total)
            if pct >= self._last_pct + 10 or now - self._last_t >= 10 or self._items == self._total_items:
                rate = self._done / max(now - self._t0, 1e-9)
                eta = (self._total - self._done) / rate if rate else 0
                err.print(
                    f"{self._label}: {pct:3d}%  {gb(self._done)}/{gb(self._total)}  "
                    f"{self._items}/{self._total_items} {self._unit}  {gb(rate)}/s  ETA {eta:.0f}s"
                )
                self._last_pct, self._last_t = pct, now

    def note(self, text: str) -> None:
        err.print(f"{self._label}: {text}")

    def stop(self) -> None:
        pass


def progress_display(label: str, unit: str = "tensors", on_start=None):
    """The progress display for this terminal or log; `on_start()` runs when the work starts (after the plan)."""
    progress = _RichProgress(label, unit) if err.is_terminal else _PlainProgress(label, unit)
    if on_start is not None:
        start = progress.start

        def started(total_bytes: int, total_items: int) -> None:
            on_start()
            start(total_bytes, total_items)

        progress.start = started
    return progress


def gb(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale / 10:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


#: loggers of what importing diffusers pulls in, warning about optional kernels a CPU pass never uses
#: (torchao's CUDA libraries, bitsandbytes' kernels package, torch.compile's registrations)
_IMPORT_NOISE = ("torchao", "torch.utils._pytree", "bitsandbytes", "diffusers")


def quiet_model_imports() -> None:
    """Before a forward pass imports diffusers: its libraries' import warnings hidden (shown with --debug)."""
    if not state["debug"]:
        for name in _IMPORT_NOISE:
            logging.getLogger(name).setLevel(logging.ERROR)
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")  # diffusers sets its own level when imported
