"""The tensor source: the only way a source tensor's values are read, with its per-tensor steps applied.

Every planned tensor carries a `TensorSource`: where it is stored (`TensorInfo`) and the steps that change
it on the way in (`Transform`: a LoRA merge, say), in order. `read_rows(r0, r1)` reads rows of the stored
tensor and applies each step to them; `copy_bytes` streams the stored bytes unchanged and is refused when a
step would change them. Converter, verify and forward read through it, so a step given to them
(`convert(steps=...)`, `verify(steps=...)`) applies to all three.

The steps that give tensors their transforms are `steps.TensorStep`s, given to the plan.

>>> # source = TensorSource(info); rows = source.read_rows(0, 16)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .checkpoint import TensorInfo, copy_tensor_bytes, read_rows

__all__ = ["Transform", "TensorSource"]


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
