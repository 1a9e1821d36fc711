"""What long work reports while it runs; the CLI draws it, the library only calls it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Progress", "NoProgress"]


class Progress(Protocol):
    """Calls may come from several threads."""

    def start(self, total_bytes: int, total_items: int) -> None: ...
    def advance(self, nbytes: int, items: int = 1) -> None: ...
    def note(self, text: str) -> None: ...


class NoProgress:
    """The default: reports nothing."""

    def start(self, total_bytes: int, total_items: int) -> None: ...
    def advance(self, nbytes: int, items: int = 1) -> None: ...
    def note(self, text: str) -> None: ...
