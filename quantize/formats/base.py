"""What every on-disk format provides: the abstract base `Format`, which declares, documents and defaults every
hook. Each format is one module defining one subclass and its one instance, ``FORMAT``, which
`formats.get_format` returns; callers call the hooks directly, never probing for them.

Names are local: a format speaks of the parts of one Linear (``weight``, ``weight_scale``); the
full key is ``<module>.<part>``, built only by `names.part_key` (through `formats.quantized_parts`).
What else is known of a format (its libraries, container, name role, card words, its options type) is its row
of `formats.FORMAT_INFO`, not an attribute of the class. This module imports no torch (the table of formats
is read, by recipes for instance, without it); the formats themselves do.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar, Union

from .info import format_info
from .options import NO_OPTIONS, FormatOptions

if TYPE_CHECKING:
    import torch

__all__ = [
    "Format",
    "PartSpec",
    "RowCut",
    "MetadataEntry",
    "NonFiniteWeightError",
    "UnsupportedShapeError",
    "UnfittedShapeError",
]

#: A part of an encoded weight: (dtype name from `quantize.dtypes`, shape; None for a late blob, see `writer`).
PartSpec = tuple[str, tuple[int, ...] | None]
#: How a part of a weight cut into row ranges is taken (`Format.cut_rows`): the ranges of its dim 0 to join, None for
#: the whole part, or a tensor made from the whole's parts.
RowCut = Union[tuple[tuple[int, int], ...], "torch.Tensor", None]
#: A tensor of a component as its file metadata sees it: (output name, weight shape and options if quantized, else
#: None and None).
MetadataEntry = tuple[str, "tuple[int, ...] | None", "FormatOptions | None"]


class NonFiniteWeightError(ValueError):
    """The weight holds NaN or Inf, which no scale can represent."""


class UnsupportedShapeError(ValueError):
    """The format cannot hold a weight of this shape; the message says why."""


class UnfittedShapeError(UnsupportedShapeError):
    """The options cannot be fitted to this weight's shape (`Format.fitted`: no ConvRot group divides its input
    width): a recipe's own targets keep the layer and the plan says why; a layer its `types` names is refused."""


class Format(abc.ABC):
    """One on-disk format: its numerics, its part names and how it declares itself.

    A subclass sets `NAME` and `ROW_SEPARABLE`, implements the abstract methods, and overrides the other hooks
    where the defaults below do not fit. Every hook takes the tensor's `options` (`formats.options`: gguf's
    GGML type; `NoOptions` for a format with one encoding), which the plan gives each quantized tensor.
    """

    #: its key in `formats.FORMAT_INFO`
    NAME: ClassVar[str]
    #: True when encoding any slice of rows gives those rows of the whole encoding, and every part but the
    #: `WEIGHT_PARTS` has the weight's rows as its dim 0: the converter then streams a weight in row chunks.
    ROW_SEPARABLE: ClassVar[bool]
    #: Row chunks start on a multiple of it (a scale tile's rows: NVFP4, MXFP8); only the last may be shorter.
    ROW_BLOCK: ClassVar[int] = 1
    #: Parts that belong to the whole weight, not to its rows (a per-tensor scale, ComfyUI's marker): a
    #: row-separable format's `encode` of any row chunk gives them whole, the same for every chunk, and they are
    #: written (and compared) once. Where they depend on the whole weight, `weight_options` decides them. One that
    #: only some options have (a static input scale) is among them; `parts` gives it where they have it.
    WEIGHT_PARTS: ClassVar[tuple[str, ...]] = ()
    #: Parts that are code books, not data: a library builds them with float32 arithmetic whose last bit can
    #: differ between CPU instruction sets, so `verify` compares them to within a float32 rounding.
    CODE_TABLES: ClassVar[tuple[str, ...]] = ()
    #: True when the kept tensors other than 2-D Linear weights are stored wider than the source (gguf: F32, while
    #: kept Linear weights stay as stored): a loader given no dtype loads them in the kept Linear weights' dtype.
    WIDENS_KEPT: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<format {self.NAME}>"

    @property
    def options_type(self) -> type[FormatOptions]:
        """The class of its options, declared in its `FormatInfo` row (where recipes read it without torch)."""
        return format_info(self.NAME).options

    # --- numerics --------------------------------------------------------------------------------------------

    @abc.abstractmethod
    def parts(self, shape: tuple[int, ...], options: FormatOptions = NO_OPTIONS) -> dict[str, PartSpec]:
        """The tensors a weight of `shape` becomes, by local part name, in their order;
        `UnsupportedShapeError` (saying why) if the format cannot hold the shape."""

    @abc.abstractmethod
    def encode(
        self, weight: torch.Tensor, options: FormatOptions = NO_OPTIONS, **whole: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Quantize a 2-D weight (fp32, fp16 or bf16, as stored), or a chunk of its rows, into its parts;
        `whole` is what `weight_options` decided from the whole weight. `NonFiniteWeightError` for NaN or Inf."""

    @abc.abstractmethod
    def decode(
        self,
        parts: dict[str, torch.Tensor],
        dtype: torch.dtype,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """The dequantized weight (float32 when a format's own default is used), or only its rows [r0, r1). A
        format that pads the weight to whole blocks (NVFP4, MXFP8) returns it padded: `decoded` crops it."""

    def decoded(
        self,
        parts: dict[str, torch.Tensor],
        shape: tuple[int, int],
        dtype: torch.dtype,
        rows: tuple[int, int] | None = None,
        options: FormatOptions = NO_OPTIONS,
    ) -> torch.Tensor:
        """The dequantized [out, in] weight of logical `shape` (or its rows [r0, r1)): `decode` without any padding
        the format adds (a view where there is none)."""
        w = self.decode(parts, dtype, rows, options)
        n = shape[0] if rows is None else rows[1] - rows[0]
        return w if tuple(w.shape) == (n, shape[1]) else w[:n, : shape[1]]

    def fitted(self, options: FormatOptions, shape: tuple[int, ...]) -> FormatOptions:
        """`options` fitted to a weight of `shape`, what the plan stores for it (a ConvRot layout's group: the
        largest that divides the input width); `UnfittedShapeError`, saying why, where nothing fits. Default: the
        options as they are."""
        return options

    def stored_options(
        self,
        dtype_of: Callable[[str], str | None],
        read: Callable[[str], torch.Tensor] | None = None,
    ) -> FormatOptions | None:
        """The options a stored Linear was encoded with, read off what a checkpoint holds under its module name
        (`dtype_of(part)`: the dtype name of ``<module>.<part>``, None where there is none; `read(part)`: a small
        part's values, ComfyUI's marker): what a loader needs to know of a tensor without the recipe. None: the
        format did not quantize this Linear (gguf's lossless kept weights, ComfyUI's unmarked ones). Default:
        `NO_OPTIONS` (one encoding: whether the Linear is quantized is told by its parts)."""
        return NO_OPTIONS

    def weight_options(
        self,
        chunks: Iterable[torch.Tensor],
        options: FormatOptions = NO_OPTIONS,
        shape: tuple[int, int] | None = None,
    ) -> dict[str, torch.Tensor]:
        """What `encode` takes, as keyword arguments, from the whole weight before encoding any chunk of it
        (comfy_fp8's per-tensor scale, W4A8's codebook), from one streamed pass over its float32 row chunks, in
        order; `shape` is the whole weight's (None: the chunks are all of it). Default: nothing, and the chunks are
        not read.
        """
        return {}

    def cut_rows(
        self,
        shape: tuple[int, int],
        options: FormatOptions,
        ranges: tuple[tuple[int, int], ...],
        read: Callable[[str], torch.Tensor],
    ) -> dict[str, RowCut]:
        """How a Linear made of the rows `ranges` (in order, joined) of a stored weight of `shape` [rows, in] takes
        each of that weight's parts (a loader cutting a fused q/k/v into the model's projections, bit for bit): per
        part, the ranges of its dim 0 to join, None for a part taken whole, or a tensor made from the whole's small
        parts (`read(part)` gives one). `UnsupportedShapeError`, saying where, when a range does not start and end
        on a boundary the format stores. Default: a row-separable format's parts hold the weight's rows as their
        dim 0 (in tiles of `ROW_BLOCK` rows), its `WEIGHT_PARTS` belong to the whole weight."""
        if not self.ROW_SEPARABLE:
            raise UnsupportedShapeError(f"{self.NAME} does not store a weight in rows")
        inside = next((r for rng in ranges for r in rng if r % self.ROW_BLOCK), None)
        if inside is not None:
            raise UnsupportedShapeError(
                f"{self.NAME} stores a weight in tiles of {self.ROW_BLOCK} rows, and row {inside} is inside one"
            )
        return {part: None if part in self.WEIGHT_PARTS else ranges for part in self.parts(shape, options)}

    # --- declarations ----------------------------------------------------------------------------------------

    @abc.abstractmethod
    def quantization_config(self, kept_linears: list[str]) -> dict:
        """The `quantization_config` entry of config.json; `kept_linears` are the Linears left unquantized
        (the container decides where it goes)."""

    def checkpoint_metadata(self, tensors: list[MetadataEntry]) -> dict[str, str]:
        """Entries a container's file metadata carries (every safetensors shard's ``__metadata__``), from
        (output tensor name, shape and options if quantized, else None and None) for every tensor of the
        component. Default: none (config.json, or the parts themselves, say it all)."""
        return {}

    def kept_dtype(
        self, source_dtype: str, shape: tuple[int, ...], linear_weight: bool, recipe_dtype: str
    ) -> str | None:
        """The dtype name a tensor the recipe keeps is stored in (from `quantize.dtypes`), given what the recipe's
        `keep_dtype` makes of it (`recipe_dtype`); None: this format's files cannot hold it. Default:
        `recipe_dtype`."""
        return recipe_dtype

    # --- the plan and `quantize sensitivity` -----------------------------------------------------------------

    def check_available(self, options: FormatOptions) -> None:
        """Refuse (`InputError`, naming what to install) options whose quantizer is not installed: the plan
        asks before anything is written. Default: everything the format needs is always there."""
        return None

    def raised(self, options: FormatOptions) -> FormatOptions | None:
        """The options one rung up for a layer that needs more bits (`quantize sensitivity`: a GGML type up);
        None: the next rung is to keep the layer. Default: None (one encoding)."""
        return None

    # --- static input scales (`convert --calibrate`) ---------------------------------------------------------

    def calibrated(self, options: FormatOptions, amax: float) -> FormatOptions | None:
        """`options` with the static scale of the Linear's input (`FormatOptions.input_scale`) that `amax`, the
        largest |x| its input reached in a calibration pass (a float32 value), makes: what `convert --calibrate`
        plans, and `parts` then stores it. None: this format (or layout) stores no input scale. Default: None."""
        return None

    def quantized_input(
        self, x: torch.Tensor, options: FormatOptions, static: bool = True
    ) -> torch.Tensor | None:
        """The Linear's input `x` (float32 [rows, in]) as the format's runtime quantizes it for its matmul, decoded
        back to float32: with the options' static input scale when `static` and they have one, else with the
        scale of this call (dynamic). None: this runtime does not quantize its input that way (a forward leaves
        it as it is). Default: None."""
        return None

    def smoothed(self, options: FormatOptions, scale: tuple[float, ...]) -> FormatOptions | None:
        """`options` with the per-input-channel `scale` (`FormatOptions.pre_quant_scale`: float32 values the runtime
        multiplies the Linear's input by) that `convert --calibrate` chose for the layer; `parts` then stores it and
        the weight divided by it. None: this format (or layout) has no such scale. Default: None."""
        return None
