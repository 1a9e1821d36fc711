"""What ComfyUI's formats share: the per-layer marker, how a loader reads a layer's layout back, the ladder
`quantize sensitivity` climbs, and the config.json declaration.

ComfyUI recognizes a quantized Linear ``<m>`` by ``<m>.comfy_quant``: a uint8 tensor holding UTF-8 JSON,
read as ``json.loads(bytes(t.tolist()))``, whose ``format`` names the layout (a ``QUANT_ALGOS`` key of
``comfy/quant_ops.py``: comfy-kitchen's ``TensorCoreFP8Layout`` for ``float8_e4m3fn``, ``TensorCoreNVFP4Layout``
for ``nvfp4``, ...). It reads the marker layer by layer, so one file may mix layouts (`options.ComfyOptions`): a
layer is written by the format of its layout, and each format's `stored_options` reads any layout back from the
marker, as ComfyUI does. A Linear without a marker in a marked file is cast to the compute dtype, so kept layers
hold their real values.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch

from . import format_info
from .base import Format
from .options import ComfyOptions, FormatOptions

__all__ = [
    "MARKER",
    "CONVROT_GROUP",
    "ComfyFormat",
    "marker_bytes",
    "marker",
    "marker_json",
    "read_marker",
    "layout_of_marker",
    "quantization_config",
]

MARKER = "comfy_quant"
#: ConvRot's Hadamard group: what ComfyUI assumes when a marker gives none, and all we write
CONVROT_GROUP = 256
#: one rung up for a layer that needs more bits (`quantize sensitivity`): NVFP4 to MXFP8 (both Blackwell's native
#: block formats), everything else to kept
_RAISED = {"nvfp4": "mxfp8"}


def marker_json(options: ComfyOptions) -> dict:
    """The marker's JSON for a layer in `options`' layout, keys in the order ComfyUI's own ``state_dict`` writes
    them (``comfy/ops.py`` ``_quantized_weight_state_dict``)."""
    if options.convrot:
        return {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": CONVROT_GROUP}
    return {"format": options.layout}


def marker_bytes(options: ComfyOptions) -> bytes:
    """The marker's bytes (``json.dumps`` defaults: what ComfyUI writes)."""
    return json.dumps(marker_json(options)).encode()


def marker(options: ComfyOptions) -> torch.Tensor:
    return torch.frombuffer(bytearray(marker_bytes(options)), dtype=torch.uint8)


def read_marker(t: torch.Tensor) -> dict:
    """The marker's JSON, read the way ComfyUI reads it."""
    return json.loads(bytes(t.tolist()))


def layout_of_marker(conf: dict) -> ComfyOptions:
    """The layout a marker's JSON declares, as ComfyUI's loader reads it (ConvRot from ``convrot``, at the top
    level or under ``params``); ValueError naming what it holds for a layout this package does not write."""
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}
    fmt = conf.get("format")
    if fmt == "int8_tensorwise" and conf.get("convrot", params.get("convrot", False)):
        group = int(conf.get("convrot_groupsize", params.get("convrot_groupsize", CONVROT_GROUP)))
        if group != CONVROT_GROUP:
            raise ValueError(f"ConvRot group {group}; only {CONVROT_GROUP} is read here")
        return ComfyOptions("int8_convrot")
    if fmt == "int8_convrot":  # our type name, never a marker's
        raise ValueError("format 'int8_convrot'")
    return ComfyOptions(str(fmt))


class ComfyFormat(Format):
    """A ComfyUI format: its layers carry the marker (`MARKER`), written once per weight; the other parts are its
    own. Subclasses set `LAYOUT` (their default layout's marker name) and the numerics."""

    LAYOUT: str

    def marker_spec(self, options: FormatOptions) -> tuple[str, tuple[int, ...]]:
        return ("U8", (len(marker_bytes(self.layout(options))),))

    def stored_options(
        self,
        dtype_of: Callable[[str], str | None],
        read: Callable[[str], torch.Tensor] | None = None,
    ) -> FormatOptions | None:
        """The layout the marker of a stored Linear declares (any of ComfyUI's: a mixed file's layers differ); None
        where it has no marker (kept). Without `read`, the recipe format's default layout."""
        if dtype_of(MARKER) is None:
            return None
        if read is None:
            return self.options_type.from_type(None)
        return layout_of_marker(read_marker(read(MARKER)))

    def raised(self, options: FormatOptions) -> FormatOptions | None:
        up = _RAISED.get(self.layout(options).layout)
        return None if up is None else ComfyOptions(up)

    def quantization_config(self, kept_linears: list[str]) -> dict:
        return quantization_config(self.NAME, self.LAYOUT, kept_linears)

    def layout(self, options: FormatOptions) -> ComfyOptions:
        """`options` as a layout of this format (its default for `NO_OPTIONS`)."""
        if not isinstance(options, ComfyOptions):
            return self.options_type.from_type(None)
        if options.format_name != self.NAME:
            raise ValueError(f"{self.NAME} does not write the {options.layout} layout")
        return options


def quantization_config(name: str, layout: str, kept_linears: list[str]) -> dict:
    """config.json's declaration (ComfyUI itself reads the markers, not this): the format, ComfyUI's layout
    name of its default layout, and the Linears kept unquantized."""
    return {"quant_method": format_info(name).quant_method, "layout": layout, "ignore": sorted(kept_linears)}
