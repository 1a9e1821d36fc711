"""How a checkpoint is laid out on disk: shard grouping, shard names, the index. Used by every writer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = [
    "INDEX_SUFFIX",
    "CONFIG_NAME",
    "SHARD_METADATA",
    "group_by_size",
    "shard_names",
    "index_name",
    "index_json",
]

INDEX_SUFFIX = ".safetensors.index.json"
CONFIG_NAME = "config.json"

#: `__metadata__` of every shard we write (what transformers and diffusers expect).
SHARD_METADATA = {"format": "pt"}

T = TypeVar("T")


def group_by_size(items: Iterable[T], size: Callable[[T], int], max_bytes: int) -> list[list[T]]:
    """Items in order, a new group whenever the next one would push the current group past `max_bytes`."""
    groups: list[list[T]] = [[]]
    total = 0
    for item in items:
        n = size(item)
        if groups[-1] and total + n > max_bytes:
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += n
    return groups


def shard_names(stem: str, n: int, with_index: bool) -> list[str]:
    """``STEM.safetensors`` for one unindexed file, else ``STEM-0000i-of-0000n.safetensors``."""
    if n == 1 and not with_index:
        return [f"{stem}.safetensors"]
    return [f"{stem}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def index_name(stem: str) -> str:
    return f"{stem}{INDEX_SUFFIX}"


def index_json(weight_map: dict[str, str], total_size: int) -> str:
    """The ``*.safetensors.index.json`` text: total tensor bytes and key -> shard, keys sorted."""
    return (
        json.dumps(
            {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}, indent=2
        )
        + "\n"
    )
