"""GGML's tensor types: the one table of them, plain data, readable without torch.

Every fact about a GGML type lives in its row: its name (gguf-py's ``GGMLQuantizationType`` member, which is
also our dtype name for it), its type id (ggml.h's ``enum ggml_type``, what a GGUF tensor info stores), its
block (values a block holds along a row; 1 for a plain float) and bytes a block (gguf-py's
``GGML_QUANT_SIZES``), whether it is a K-quant (super-blocks of 256, quantized by ggml's own C reference),
the next type up a layer that needs more bits is raised to (`quantize sensitivity`), and llama.cpp's
``general.file_type`` of a model mostly in it. Rows never share a block, so a quantized type needs
in_features to be a multiple of its block. `quantize.dtypes` (sizes, the reader, the writer), the `gguf`
format (its types, their quantizers, the ladder up), its options (what a recipe may name) and the GGUF
container (the file type) all read this table; tests hold it equal to gguf-py's own.

>>> ggml_type("Q4_K").block, ggml_type("Q4_K").raised, QUANTIZED_TYPES[0]
(256, 'Q5_K', 'Q8_0')
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError

__all__ = ["GGMLType", "GGML_TYPES", "QUANTIZED_TYPES", "ggml_type"]


@dataclass(frozen=True)
class GGMLType:
    name: str  # GGML's name: gguf-py's GGMLQuantizationType member, and our dtype name
    id: int  # GGML's type id (ggml.h `enum ggml_type`), as a GGUF tensor info stores it
    block: int  # values a block holds along a row (1: a plain float, one value a "block")
    type_size: int  # bytes a block
    k_quant: bool = False  # a K-quant: super-blocks of 256, quantized by ggml's own reference quantizer
    #: the next type up, for a layer that needs more bits (`quantize sensitivity`); None: the next step is kept
    raised: str | None = None
    #: llama.cpp's `general.file_type` (LlamaFileType) of a model mostly in this type; None: not a model's type
    file_type: int | None = None
    #: the same where a mix raises some tensors to other types (the `_M` types); None: `file_type` either way
    file_type_mix: int | None = None

    @property
    def quantized(self) -> bool:
        """A block type (a row's values in blocks with their scales), not a plain float."""
        return self.block > 1

    @property
    def in_features_multiple(self) -> int:
        """What a quantized Linear's in_features must be a multiple of: rows never share a block."""
        return self.block


#: Every GGML type this tool reads or writes. The quantized ones in the order recipes and errors list them.
GGML_TYPES: tuple[GGMLType, ...] = (
    GGMLType("F32", 0, 1, 4, file_type=0),  # llama.cpp's ALL_F32, MOSTLY_F16, MOSTLY_BF16
    GGMLType("F16", 1, 1, 2, file_type=1),
    GGMLType("BF16", 30, 1, 2, file_type=32),
    GGMLType("Q8_0", 8, 32, 34, file_type=7),
    GGMLType("Q6_K", 14, 256, 210, k_quant=True, raised="Q8_0", file_type=18),
    GGMLType("Q5_K", 13, 256, 176, k_quant=True, raised="Q6_K", file_type=16, file_type_mix=17),
    GGMLType("Q4_K", 12, 256, 144, k_quant=True, raised="Q5_K", file_type=14, file_type_mix=15),
    GGMLType("Q5_0", 6, 32, 22, raised="Q8_0", file_type=8),
    GGMLType("Q5_1", 7, 32, 24, raised="Q8_0", file_type=9),
    GGMLType("Q4_0", 2, 32, 18, raised="Q5_0", file_type=2),
    GGMLType("Q4_1", 3, 32, 20, raised="Q5_1", file_type=3),
)

_BY_NAME = {t.name: t for t in GGML_TYPES}

#: The block types a Linear weight can be quantized to (a gguf recipe's `type` / `types`).
QUANTIZED_TYPES: tuple[str, ...] = tuple(t.name for t in GGML_TYPES if t.quantized)


def ggml_type(name: str) -> GGMLType:
    """The row of GGML type `name` (``"Q4_K"``); the error lists the known names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InputError(f"unknown GGML type {name!r} (known: {', '.join(_BY_NAME)})") from None
