"""What every on-disk format provides. Each format is one module that satisfies `Format`.

Names are local: a format speaks of the parts of one Linear (``weight``, ``weight_scale``); the
full key is ``<module>.<part>``, built only by `names.part_key` (through `formats.quantized_parts`).
What else is known of a format (its libraries, container, name table, card words) is its row of
`formats.FORMAT_INFO`, not an attribute of the module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the table of formats is read (by recipes, for instance) without importing torch
    import torch

__all__ = ["Format", "PartSpec", "NonFiniteWeightError", "UnsupportedShapeError"]

#: A part of an encoded weight: (dtype name from `quantize.dtypes`, shape; None for a late blob, see `writer`).
PartSpec = tuple[str, tuple[int, ...] | None]


class NonFiniteWeightError(ValueError):
    """The weight holds NaN or Inf, which no scale can represent."""


class UnsupportedShapeError(ValueError):
    """The format cannot hold a weight of this shape; the message says why."""


class Format(Protocol):
    NAME: str  # its key in `formats.FORMAT_INFO`
    #: True when encoding any slice of rows gives those rows of the whole encoding, and every part
    #: has the weight's rows as its dim 0: the converter then streams a weight in row chunks.
    ROW_SEPARABLE: bool
    #: Optional. Parts that belong to the whole weight, not to its rows (a per-tensor scale, ComfyUI's marker):
    #: a row-separable format's `encode` of any row chunk gives them whole, the same for every chunk, and
    #: they are written (and compared) once. A format whose such parts depend on the whole weight also
    #: gives ``weight_options(chunks) -> dict``: a first streamed pass over the weight's float32 row chunks,
    #: whose result `encode` then takes as keyword arguments (comfy_fp8's scale from the weight's max |w|).
    # WEIGHT_PARTS: tuple[str, ...]

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
        """The `quantization_config` entry of config.json; `kept_linears` are the Linears left unquantized
        (the container decides where it goes)."""
        ...

    def checkpoint_metadata(self, tensors: list[tuple[str, tuple[int, ...] | None]]) -> dict[str, str]:
        """Entries a container's file metadata carries (every safetensors shard's ``__metadata__``), from
        (output tensor name, shape if quantized else None) for every tensor of the component."""
        ...
