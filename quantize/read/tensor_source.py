"""The tensor source: the only way a source tensor's values are read, with its per-tensor steps applied.

Every planned tensor carries a `TensorSource`: where it is stored (`TensorInfo`) and the steps that change
it on the way in (`Transform`: a LoRA merge, say), in order. `read_rows(r0, r1)` reads rows of the stored
tensor and applies each step to them; `copy_bytes` streams the stored bytes unchanged and is refused when a
step would change them. Converter, verify and forward read through it, so a step given to them
(`convert(steps=...)`, `verify(steps=...)`) applies to all three.

The steps that give tensors their transforms are `steps.TensorStep`s, given to the plan.

A `StackedSource` is one output tensor made of row ranges of several source tensors, in order (a native fused
projection written from diffusers' separate ones: `models.Stack`); each range is read through its own tensor's
source, steps applied, so a LoRA on diffusers' ``to_q`` merges into the q rows of the stacked weight. A
`SlicedSource` is the other way round: one range of a source tensor along one dim, written as a tensor of its own
(llama.cpp's thirds of a fused qkv, a Conv3d's temporal taps: `models.Split`). A `BytesSource` is a uint8 tensor
made here, not stored (a tokenizer model rebuilt from a tokenizer.json), its bytes held.

>>> # source = TensorSource(info); rows = source.read_rows(0, 16)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from ..errors import InputError
from .checkpoint import TensorInfo, copy_tensor_bytes, join_pieces, read_rows

__all__ = ["Transform", "TensorSource", "StackedSource", "SlicedSource", "BytesSource"]


class Transform(Protocol):
    """A change to one source tensor, applied row range by row range."""

    #: what the plan and the manifest call it (e.g. ``lora:style.safetensors``)
    label: str

    def apply(self, rows: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """Rows [r0, r1) of the changed tensor, in the stored dtype, from the same rows as stored (or as the
        previous step left them). Rows along dim 0; a 0-d tensor is one row."""
        ...


@dataclass(frozen=True)
class TensorSource:
    """One source tensor as the pipeline sees it: stored values, then each transform in order."""

    info: TensorInfo
    transforms: tuple[Transform, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether a step changes the stored values (then they cannot be copied as bytes)."""
        return bool(self.transforms)

    @property
    def rows(self) -> int:
        return self.info.shape[0] if self.info.shape else 1

    def read_rows(self, r0: int, r1: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rows [r0, r1) of the tensor, every step applied, in fresh memory: in the stored dtype, or cast to
        `dtype` (read and cast in one copy when no step changes the tensor)."""
        if not self.transforms:
            return read_rows(self.info, r0, r1, dtype)
        rows = read_rows(self.info, r0, r1)
        for t in self.transforms:
            rows = t.apply(rows, r0, r1)
        return rows if dtype is None else rows.to(dtype)

    def read(self) -> torch.Tensor:
        """The whole tensor (see `read_rows`)."""
        return self.read_rows(0, self.rows)

    def copy_bytes(self, write: Callable[[memoryview, int], None]) -> None:
        """Stream the stored bytes, bit-exact, as `write(chunk, offset)` calls; only for an unchanged tensor."""
        if self.changed:
            raise ValueError(
                f"{self.info.name}: changed by {self.transforms[0].label}; read it with read_rows"
            )
        copy_tensor_bytes(self.info, write)


@dataclass(frozen=True)
class StackedSource(TensorSource):
    """One tensor stacking row ranges of others along dim 0: `segments` = (source, r0, r1) in order. Its `info`
    names the stacked tensor (`name`), with the stacked shape, the segments' dtype, and the first one's file."""

    segments: tuple[tuple[TensorSource, int, int], ...] = ()

    @classmethod
    def of(cls, name: str, segments: list[tuple[TensorSource, int, int]], where: str) -> StackedSource:
        """The stack of `segments`, which must agree in dtype and in every dim but the first (`InputError`
        naming the first that does not, and `where`)."""
        first = segments[0][0].info
        for source, _, _ in segments[1:]:
            info = source.info
            if info.dtype != first.dtype or info.shape[1:] != first.shape[1:]:
                raise InputError(
                    f"{where}: tensor {info.name!r} is {info.dtype}{list(info.shape)} and {first.name!r} "
                    f"{first.dtype}{list(first.shape)}: {name!r} cannot stack them"
                )
        rows = sum(r1 - r0 for _, r0, r1 in segments)
        nbytes = sum((r1 - r0) * (s.info.nbytes // max(1, s.rows)) for s, r0, r1 in segments)
        info = TensorInfo(name, first.dtype, (rows, *first.shape[1:]), first.file, 0, nbytes)
        return cls(info, (), tuple(segments))

    @property
    def changed(self) -> bool:
        return any(source.changed for source, _, _ in self.segments)

    def _pieces(self, r0: int, r1: int) -> list[tuple[TensorSource, int, int]]:
        """The (source, its rows a..b) that rows [r0, r1) of the stack are, in order."""
        pieces, at = [], 0
        for source, s0, s1 in self.segments:
            lo, hi = max(r0, at), min(r1, at + s1 - s0)
            if lo < hi:
                pieces.append((source, s0 + lo - at, s0 + hi - at))
            at += s1 - s0
        return pieces

    def read_rows(self, r0: int, r1: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        parts = [source.read_rows(a, b, dtype) for source, a, b in self._pieces(r0, r1)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def copy_bytes(self, write: Callable[[memoryview, int], None]) -> None:
        """The stored bytes of each range in turn (rows are contiguous, so a range is one byte range)."""
        if self.changed:
            raise ValueError(
                f"{self.info.name}: a stacked tensor is changed by a step; read it with read_rows"
            )
        at = 0
        for source, r0, r1 in self.segments:
            part = source.info.rows(r0, r1)
            base = at
            copy_tensor_bytes(part, lambda chunk, offset, base=base: write(chunk, base + offset))
            at += part.nbytes


@dataclass(frozen=True)
class SlicedSource(TensorSource):
    """One range of a source tensor along one dim, `dim` [`start`, `stop`), that dim dropped when the range is one
    along a dim other than the first (`models.Split`: a fused qkv's q rows; a Conv3d's temporal tap as a Conv2d
    kernel). Its `info` names the slice (`name`) with its shape; its rows are the source's rows (or a range of
    them), so it streams as the source does; `join` puts the slices back together."""

    base: TensorSource | None = None
    dim: int = 0
    start: int = 0
    stop: int = 0

    @classmethod
    def of(cls, name: str, base: TensorSource, dim: int, start: int, stop: int) -> SlicedSource:
        info = base.info
        shape = list(info.shape)
        shape[dim] = stop - start
        if dim and stop - start == 1:
            del shape[dim]
        nbytes = info.nbytes // max(1, info.shape[dim]) * (stop - start)
        return cls(
            TensorInfo(name, info.dtype, tuple(shape), info.file, 0, nbytes), (), base, dim, start, stop
        )

    @property
    def dropped(self) -> bool:
        return bool(self.dim) and self.stop - self.start == 1

    @property
    def changed(self) -> bool:
        """Where its bytes are not one range of the stored tensor's (a slice along a later dim), or a step changes
        them: read it with `read_rows`."""
        return bool(self.dim) or self.base.changed

    def read_rows(self, r0: int, r1: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        if not self.dim:
            return self.base.read_rows(self.start + r0, self.start + r1, dtype)
        rows = self.base.read_rows(r0, r1, dtype).narrow(self.dim, self.start, self.stop - self.start)
        return (rows.squeeze(self.dim) if self.dropped else rows).contiguous()

    def copy_bytes(self, write: Callable[[memoryview, int], None]) -> None:
        """The stored bytes of its rows (one byte range: rows are contiguous)."""
        if self.changed:
            raise ValueError(
                f"{self.info.name}: a slice along dim {self.dim} or changed by a step; read it with read_rows"
            )
        copy_tensor_bytes(self.base.info.rows(self.start, self.stop), write)

    @staticmethod
    def join(slices: list[SlicedSource], values: list[torch.Tensor]) -> torch.Tensor:
        """The values of the sliced tensor from `values`, those of its `slices`, in their order."""
        return join_pieces(values, slices[0].dim, len(slices[0].base.info.shape))


@dataclass(frozen=True)
class BytesSource(TensorSource):
    """A 1-D uint8 tensor made here rather than stored: its bytes `data` (a tokenizer model rebuilt from a
    tokenizer.json, `read.spiece`). Its `info` names it, with the file it was made from as its `file` (whose bytes
    are not these: only this source reads them); it reads and streams as a stored tensor does, unchanged."""

    data: bytes = field(default=b"", repr=False)

    @classmethod
    def of(cls, name: str, data: bytes, made_from: Path) -> BytesSource:
        return cls(TensorInfo(name, "U8", (len(data),), Path(made_from), 0, len(data)), (), bytes(data))

    def read_rows(self, r0: int, r1: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        chunk = bytearray(self.data[r0:r1])  # fresh memory, as a stored tensor's rows are read into
        rows = torch.frombuffer(chunk, dtype=torch.uint8) if chunk else torch.empty(0, dtype=torch.uint8)
        return rows if dtype is None else rows.to(dtype)

    def copy_bytes(self, write: Callable[[memoryview, int], None]) -> None:
        write(memoryview(self.data), 0)
