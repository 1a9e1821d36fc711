"""What the Hub tests share: the stand-in Hub (`tests.hub_server`) as fixtures (in tests/publish/conftest.py), a
folder's files as a repo's, and which repo files a run fetched."""

from __future__ import annotations

from pathlib import Path

from tests.hub_server import HubStandIn


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under `root` by its path relative to it: what `HubStandIn.add_files` publishes as a repo."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def fetched(hub: HubStandIn, ranges: bool = False) -> set[str]:
    """The repo files the Hub sent whole; with `ranges`, those it sent a range of (a safetensors header)."""
    return {
        r["path"].split("/resolve/", 1)[1].split("/", 1)[1]
        for r in hub.requests
        if "/resolve/" in r["path"] and r["method"] == "GET" and bool(r["range"]) == ranges
    }
