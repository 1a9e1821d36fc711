"""What every on-disk format provides. Each format is one module that satisfies `Format`.

Names are local: a format speaks of the parts of one Linear (``weight``, ``weight_scale``); the
full key is ``<module>.<part>``, built only by `part_key`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the table of formats is read (by recipes, for instance) without importing torch
    import torch

__all__ = ["Format", "PartSpec", "NonFiniteWeightError", "UnsupportedShapeError", "part_key"]

#: A part of an encoded weight: (safetensors dtype name, shape).
PartSpec = tuple[str, tuple[int, ...]]


class NonFiniteWeightError(ValueError):
    """The weight holds NaN or Inf, which no scale can represent."""


class UnsupportedShapeError(ValueError):
    """The format cannot hold a weight of this shape; the message says why."""


def part_key(module: str, part: str) -> str:
    """The checkpoint key of one part of a quantized module, e.g. ``blocks.0.ffn.0.weight_scale``."""
    return f"{module}.{part}"


class Format(Protocol):
    NAME: str
    LIBRARIES: tuple[str, ...]  # the packages whose numerics the format follows
    #: True when encoding any slice of rows gives those rows of the whole encoding, and every part
    #: has the weight's rows as its dim 0: the converter then streams a weight in row chunks.
    ROW_SEPARABLE: bool
    QUANT_METHOD: str  # `quantization_config.quant_method` in config.json: how a reader recognizes the format

    def parts(self, shape: tuple[int, ...]) -> dict[str, PartSpec]:
        """The tensors a weight of `shape` becomes, by local part name; `UnsupportedShapeError` if it cannot."""
        ...

    def encode(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight (fp32, fp16 or bf16, as stored) into its parts."""
        ...

    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype = ...,  # float32
        rows: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """The dequantized weight, or only its rows [r0, r1)."""
        ...

    def quantization_config(self, kept_linears: list[str]) -> dict:
        """The `quantization_config` entry of config.json; `kept_linears` are the Linears left unquantized."""
        ...

    def checkpoint_metadata(self, tensors: list[tuple[str, tuple[int, ...] | None]]) -> dict[str, str]:
        """Entries every shard's ``__metadata__`` carries, from (source tensor name, shape if quantized else None)."""
        ...
