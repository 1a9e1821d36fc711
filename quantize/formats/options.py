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

import math
import struct
from dataclasses import dataclass
from typing import ClassVar

from ..ggml_types import QUANTIZED_TYPES, GGMLType, ggml_type

__all__ = [
    "FormatOptions",
    "NoOptions",
    "NO_OPTIONS",
    "GgufOptions",
    "ComfyOptions",
    "COMFY_LAYOUTS",
    "COMFY_RUNTIMES",
    "COMFY_INPUT_RANGES",
    "COMFY_SMOOTHED",
    "ComfyFp8Options",
    "ComfyInt8Options",
    "ComfyNvfp4Options",
    "ComfyMxfp8Options",
    "ComfyW4a8Options",
    "ComfyW4a4Options",
    "CONVROT_LAYOUTS",
    "KEPT",
]

#: what a recipe's `types` names for Linears it keeps unquantized (as `ignore` would)
KEPT = "kept"


@dataclass(frozen=True)
class FormatOptions:
    """The options of one quantized tensor in one format (subclassed per format; frozen, compared by value)."""

    #: the type names a recipe may give (`type`, `types`); empty: the format has one encoding
    TYPES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def accepted(cls) -> tuple[str, ...]:
        """Every name a recipe's `types` may give: the format's own types, the other formats' it may mix in
        (ComfyUI's layouts), and ``kept``; none for a format with one encoding."""
        return (*cls.TYPES, KEPT) if cls.TYPES else ()

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

    @property
    def format_name(self) -> str | None:
        """The format that encodes a tensor with these options, where it is not the recipe's own (a layer of a
        mixed ComfyUI file in another of ComfyUI's layouts); None: the recipe's format."""
        return None

    @property
    def input_scale(self) -> float | None:
        """The static scale of the Linear's input that these options store (`convert --calibrate`: ComfyUI's
        ``input_scale``, a float32 value); None: none (the runtime scales each call's input itself)."""
        return None

    @property
    def pre_quant_scale(self) -> tuple[float, ...] | None:
        """The per-input-channel factor the runtime multiplies the Linear's input by before the layer
        (`convert --calibrate`'s smoothing: ComfyUI's ``pre_quant_scale``), float32 values; None: none."""
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


#: ComfyUI's layouts, as a recipe's `type` / `types` names them -> the format that writes them. The names are those of
#: the `comfy_quant` markers (ComfyUI's ``QUANT_ALGOS`` keys), but ``int8_convrot``: ``int8_tensorwise`` with the
#: weight rotated (``"convrot": true`` in its marker).
COMFY_LAYOUTS: dict[str, str] = {
    "nvfp4": "comfy_nvfp4",
    "mxfp8": "comfy_mxfp8",
    "float8_e4m3fn": "comfy_fp8",
    "float8_e5m2": "comfy_fp8",
    "int8_tensorwise": "comfy_int8",
    "int8_convrot": "comfy_int8",
    "asym_w4a8_int8": "comfy_w4a8",
    "convrot_w4a4": "comfy_w4a4",
}

#: the layouts whose weight is rotated by ConvRot's Hadamard matrix in groups of inputs (`ComfyOptions.convrot_group`),
#: and what a layer's input width must be a multiple of besides (W4A8: 16 codes a scale; W4A4: comfy-kitchen's int4
#: GEMM tiles of 64)
CONVROT_LAYOUTS: dict[str, int] = {"int8_convrot": 1, "asym_w4a8_int8": 16, "convrot_w4a4": 64}

#: layout -> (the ComfyUI that reads it: the first version after the commit that added it, and what else it needs;
#: the GPUs that run it fast): what the card and docs/formats.md say. Elsewhere ComfyUI decodes the weight per layer.
COMFY_RUNTIMES: dict[str, tuple[str, str]] = {
    "nvfp4": (
        "ComfyUI 0.8 or later, with comfy-kitchen",
        "FP4 tensor cores on Blackwell (RTX 50xx, RTX PRO 6000, B200: SM100+)",
    ),
    "mxfp8": (
        "ComfyUI 0.18 or later, with a comfy-kitchen that has TensorCoreMXFP8Layout",
        "Blackwell's MXFP8 GEMM (SM100+)",
    ),
    "float8_e4m3fn": (
        "ComfyUI 0.3.77 or later",
        "FP8 tensor cores from Ada on (RTX 40xx, L40S, H100, RTX 50xx)",
    ),
    "float8_e5m2": (
        "ComfyUI 0.3.77 or later",
        "FP8 tensor cores from Ada on (RTX 40xx, L40S, H100, RTX 50xx)",
    ),
    "int8_tensorwise": (
        "ComfyUI 0.27 or later",
        "int8 matmuls on every GPU from Turing (RTX 20xx, 30xx, A100) and the CPU",
    ),
    "int8_convrot": (
        "ComfyUI 0.27 or later (ConvRot)",
        "int8 matmuls on every GPU from Turing (RTX 20xx, 30xx, A100) and the CPU",
    ),
    "asym_w4a8_int8": (
        "ComfyUI 0.31 or later, with comfy-kitchen 0.2.40 or later",
        "int8 tensor cores from Ampere (RTX 30xx, A100: SM80+), 4-bit weights decoded to int8 in the GEMM",
    ),
    "convrot_w4a4": (
        "ComfyUI 0.28 or later, with comfy-kitchen 0.2.40 or later",
        "int4 tensor cores from Turing (RTX 20xx-40xx, A100: SM75+)",
    ),
}


#: The layouts whose ComfyUI Linear quantizes its input with a static ``input_scale`` when the file holds one (it is
#: in their ``QUANT_ALGOS`` "parameters" and their layout's ``quantize`` takes it as ``scale``; MXFP8's ignores it,
#: int8 quantizes per row), and the largest value of the input's encoding: the scale is amax / it, as the dynamic
#: scale of a call is (FP8: max|x| / 448 for e4m3, / 57344 for e5m2; NVFP4: the tensor scale max|x| / (448 · 6)).
COMFY_INPUT_RANGES: dict[str, float] = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "nvfp4": 2688.0}

#: The layouts whose ComfyUI Linear multiplies its input by a stored ``pre_quant_scale`` before the layer (in their
#: ``QUANT_ALGOS`` "parameters"; ModelOpt's AWQ-style smoothing): `convert --calibrate` writes one where it measures
#: better (`run.calibrate`).
COMFY_SMOOTHED: tuple[str, ...] = ("nvfp4",)


def _is_float32(x: float) -> bool:
    return struct.unpack("<f", struct.pack("<f", x))[0] == x


@dataclass(frozen=True)
class ComfyOptions(FormatOptions):
    """The ComfyUI layout of one quantized Linear. ComfyUI reads each layer's marker, so one file may mix layouts:
    every ComfyUI format's recipe may give any of `COMFY_LAYOUTS` in `types` (and ``kept``), and the layer is
    written by the format of its layout (`format_name`). Each format's own layouts are its `TYPES`; its first
    one is its default (`type` may be left out).

    `input_scale`: the layer's static input scale (a positive finite float32 value), for the layouts of
    `COMFY_INPUT_RANGES` only: `convert --calibrate` plans it, the layer stores it as ``input_scale``. A recipe never
    names it (`type_name` is the layout alone).

    `convrot_group`: the Hadamard group of a ConvRot layout (`CONVROT_LAYOUTS`), one of 4, 16, 64, 256; the plan
    fits it to the layer's input width (`Format.fitted`: the largest that divides it), the marker stores it as
    ``convrot_groupsize``. None: not fitted yet (`group` is then ComfyUI's default, 256).

    `pre_quant_scale`: the layer's smoothing (`convert --calibrate`), for the layouts of `COMFY_SMOOTHED` only: one
    positive finite float32 value p_j per input channel; ComfyUI multiplies each call's input by it before the
    layer, so the layer stores the weight W·diag(1/p) (the format's `decode` gives W back: times p)."""

    layout: str
    input_scale: float | None = None
    convrot_group: int | None = None
    pre_quant_scale: tuple[float, ...] | None = None

    TYPES: ClassVar[tuple[str, ...]] = tuple(COMFY_LAYOUTS)

    def __post_init__(self) -> None:
        if self.layout not in COMFY_LAYOUTS:
            raise ValueError(f"a ComfyUI layout is one of {', '.join(COMFY_LAYOUTS)}; got {self.layout!r}")
        group = self.convrot_group
        if group is not None:
            if self.layout not in CONVROT_LAYOUTS:
                raise ValueError(f"a {self.layout} layer has no ConvRot group")
            if group not in (4, 16, 64, 256):
                raise ValueError(f"a ConvRot group is one of 4, 16, 64, 256; got {group!r}")
        smoothing = self.pre_quant_scale
        if smoothing is not None:
            if self.layout not in COMFY_SMOOTHED:
                raise ValueError(f"a {self.layout} layer has no pre_quant_scale")
            if not (isinstance(smoothing, tuple) and smoothing):
                raise ValueError("a pre_quant_scale is a non-empty tuple of values, one per input channel")
            if not all(
                isinstance(v, float) and math.isfinite(v) and v > 0 and _is_float32(v) for v in smoothing
            ):
                raise ValueError("a pre_quant_scale holds positive finite float32 values")
        scale = self.input_scale
        if scale is None:
            return
        if self.layout not in COMFY_INPUT_RANGES:
            raise ValueError(f"a {self.layout} layer has no static input scale")
        if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0 and _is_float32(scale)):
            raise ValueError(f"an input scale is a positive finite float32 value; got {scale!r}")

    @classmethod
    def from_type(cls, type_name: str | None) -> ComfyOptions:
        return ComfyOptions(cls.TYPES[0] if type_name is None else type_name)

    @classmethod
    def accepted(cls) -> tuple[str, ...]:
        return (*cls.TYPES, *(t for t in COMFY_LAYOUTS if t not in cls.TYPES), KEPT)

    @property
    def type_name(self) -> str:
        return self.layout

    @property
    def format_name(self) -> str:
        return COMFY_LAYOUTS[self.layout]

    @property
    def convrot(self) -> bool:
        """int8 with its weight rotated by a Hadamard matrix in groups of `group` inputs (ComfyUI >= 0.27)."""
        return self.layout == "int8_convrot"

    @property
    def rotated(self) -> bool:
        """The layout rotates the weight (and ComfyUI each call's input) in ConvRot groups (`CONVROT_LAYOUTS`)."""
        return self.layout in CONVROT_LAYOUTS

    @property
    def group(self) -> int:
        """The ConvRot group the layer is rotated in: `convrot_group`, or ComfyUI's default (256) before fitting."""
        return 256 if self.convrot_group is None else self.convrot_group


class ComfyFp8Options(ComfyOptions):
    """comfy_fp8's layouts: float8 e4m3 (the default) or e5m2, one scale per tensor."""

    TYPES = ("float8_e4m3fn", "float8_e5m2")


class ComfyInt8Options(ComfyOptions):
    """comfy_int8's layouts: int8 per row (the default), or the same with ConvRot."""

    TYPES = ("int8_tensorwise", "int8_convrot")


class ComfyNvfp4Options(ComfyOptions):
    """comfy_nvfp4's one layout."""

    TYPES = ("nvfp4",)


class ComfyMxfp8Options(ComfyOptions):
    """comfy_mxfp8's one layout."""

    TYPES = ("mxfp8",)


class ComfyW4a8Options(ComfyOptions):
    """comfy_w4a8's one layout: 4-bit codes of a 16-level codebook, an FP8 scale per 16 inputs and an FP32 one per
    row, ConvRot-rotated."""

    TYPES = ("asym_w4a8_int8",)


class ComfyW4a4Options(ComfyOptions):
    """comfy_w4a4's one layout: signed int4 with one FP32 scale per row, ConvRot-rotated."""

    TYPES = ("convrot_w4a4",)
