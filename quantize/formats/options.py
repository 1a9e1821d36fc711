"""A format's options: what its `parts`, `encode` and `decode` take besides the data, one small frozen class per
format, plain data without torch (a recipe is validated against them before torch is imported).

A recipe names them (a gguf recipe's `type` and `types`: a GGML type a tensor); the plan builds each quantized
tensor's options once (`TensorPlan.options`) and hands them to the format; the manifest records what they are
called (`type_name`). A format with one encoding has none (`NoOptions`). A new knob (a group size, a rotation,
an activation scheme) is a field of its format's class, validated here.

>>> GgufOptions.from_type("Q4_K").type_name, NoOptions.from_type(None) == NO_OPTIONS
('Q4_K', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ggml_types import QUANTIZED_TYPES, GGMLType, ggml_type

__all__ = ["FormatOptions", "NoOptions", "NO_OPTIONS", "GgufOptions"]


@dataclass(frozen=True)
class FormatOptions:
    """The options of one quantized tensor in one format (subclassed per format; frozen, compared by value)."""

    #: the type names a recipe may give (`type`, `types`); empty: the format has one encoding
    TYPES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_type(cls, type_name: str | None) -> FormatOptions:
        """The options that a recipe's type name stands for (None: the recipe gives none); ValueError, saying
        why, for a name the format does not have."""
        if type_name is not None:
            raise ValueError(f"this format has one encoding, no type {type_name!r}")
        return cls()

    @classmethod
    def choices(cls) -> tuple[FormatOptions, ...]:
        """Every options value a recipe can ask for: one per type, or the one of a format with one encoding."""
        return tuple(cls.from_type(t) for t in cls.TYPES) or (cls.from_type(None),)

    @property
    def type_name(self) -> str | None:
        """What a recipe's `type` / `types` and the manifest's per-tensor `type` call these options; None for a
        format with one encoding."""
        return None


@dataclass(frozen=True)
class NoOptions(FormatOptions):
    """The options of a format with one encoding: none."""


NO_OPTIONS = NoOptions()


@dataclass(frozen=True)
class GgufOptions(FormatOptions):
    """gguf's options: the GGML block type of the tensor (`quantize.ggml_types`)."""

    type: str

    TYPES: ClassVar[tuple[str, ...]] = QUANTIZED_TYPES

    def __post_init__(self) -> None:
        if self.type not in QUANTIZED_TYPES:
            raise ValueError(
                f"gguf needs a GGML type, one of {', '.join(QUANTIZED_TYPES)}; got {self.type!r}"
            )

    @classmethod
    def from_type(cls, type_name: str | None) -> GgufOptions:
        return cls(type_name)  # type: ignore[arg-type]  # None is refused by __post_init__

    @property
    def type_name(self) -> str:
        return self.type

    @property
    def ggml(self) -> GGMLType:
        """The type's row of the GGML table."""
        return ggml_type(self.type)
