"""What ComfyUI's formats share: the per-layer marker, how a loader reads a layer's layout back, the ladder
`quantize sensitivity` climbs, and the config.json declaration.

ComfyUI recognizes a quantized Linear ``<m>`` by ``<m>.comfy_quant``: a uint8 tensor holding UTF-8 JSON,
read as ``json.loads(bytes(t.tolist()))``, whose ``format`` names the layout (a ``QUANT_ALGOS`` key of
``comfy/quant_ops.py``: comfy-kitchen's ``TensorCoreFP8Layout`` for ``float8_e4m3fn``, ``TensorCoreNVFP4Layout``
for ``nvfp4``, ...). It reads the marker layer by layer, so one file may mix layouts (`options.ComfyOptions`): a
layer is written by the format of its layout, and each format's `stored_options` reads any layout back from the
marker, as ComfyUI does. A Linear without a marker in a marked file is cast to the compute dtype, so kept layers
hold their real values.

A layer of a layout that ComfyUI quantizes the input of with a static scale (`options.COMFY_INPUT_RANGES`: FP8 and
NVFP4) may also hold ``<m>.input_scale``, float32 [] (ComfyUI's QUANTIZATION.md: "float32 (scalar)"), which its
Linear loads (``load_extra_params``) and passes as ``scale=`` to the layout's ``quantize`` of each call's input
instead of computing one: `convert --calibrate` writes it (`calibrated`: amax / the layout's range, in float32, the
scale a call whose input reached that amax would take), written once per weight.

An NVFP4 layer (`options.COMFY_SMOOTHED`) may also hold ``<m>.pre_quant_scale``, float32 [in]: ComfyUI's Linear
multiplies each call's input by it (cast to the input's dtype) before quantizing it (ModelOpt's AWQ-style
smoothing), so the layer stores W·diag(1/p); `convert --calibrate` writes it where it measures better
(`run.calibrate`), and our `decode` returns W (the stored weight times p), the input quantized as the runtime does
being divided by p again (`quantized_input`): the same products.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable

import torch

from . import _hadamard, format_info
from .base import Format, MetadataEntry, NonFiniteWeightError, UnfittedShapeError
from .options import COMFY_INPUT_RANGES, COMFY_SMOOTHED, CONVROT_LAYOUTS, ComfyOptions, FormatOptions

__all__ = [
    "MARKER",
    "INPUT_SCALE",
    "PRE_QUANT_SCALE",
    "CONVROT_GROUP",
    "W4A8_GROUP",
    "ComfyFormat",
    "marker_bytes",
    "marker",
    "marker_json",
    "read_marker",
    "layout_of_marker",
    "amax_of",
    "tensor_scale",
    "quantization_config",
]

MARKER = "comfy_quant"
#: the optional static scale of a layer's input (float32 []; FP8 and NVFP4 layouts)
INPUT_SCALE = "input_scale"
#: the optional per-input-channel factor of a layer's input (float32 [in]; NVFP4: `options.COMFY_SMOOTHED`)
PRE_QUANT_SCALE = "pre_quant_scale"
#: ConvRot's Hadamard group: what ComfyUI assumes when a marker gives none
CONVROT_GROUP = _hadamard.DEFAULT_GROUP
#: W4A8's group of inputs per FP8 scale: comfy-kitchen's default, the one its CUDA kernel runs
W4A8_GROUP = 16
#: one rung up for a layer that needs more bits (`quantize sensitivity`): NVFP4 to MXFP8 (both Blackwell's native
#: block formats); W4A8 and W4A4 to int8 ConvRot: the same Hadamard rotation of each call's input, so an outlier the
#: 4-bit layer's rotation spread stays spread (int8 per row without it loses a row that holds one), int8 GEMMs on
#: every GPU from Turing and the CPU, a ComfyUI (0.27) no newer than theirs: the raised file runs wherever the 4-bit
#: one does; everything else to kept
_RAISED = {"nvfp4": "mxfp8", "asym_w4a8_int8": "int8_convrot", "convrot_w4a4": "int8_convrot"}
#: where a full ComfyUI checkpoint keeps its diffusion model; both of ComfyUI's loaders strip it
CHECKPOINT_PREFIX = "model.diffusion_model."


def marker_json(options: ComfyOptions) -> dict:
    """The marker's JSON for a layer in `options`' layout, keys in the order ComfyUI's own ``state_dict`` writes
    them (``comfy/ops.py`` ``_quantized_weight_state_dict``); a ConvRot layout's with the layer's group."""
    if options.convrot:
        return {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": options.group}
    if options.layout == "asym_w4a8_int8":
        return {"format": options.layout, "group_size": W4A8_GROUP, "convrot_groupsize": options.group}
    if options.layout == "convrot_w4a4":
        return {"format": options.layout, "convrot_groupsize": options.group}
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
    """The layout a marker's JSON declares, as ComfyUI's loader reads it (ConvRot from ``convrot``, a group from
    ``convrot_groupsize``, each at the top level or under ``params``; 256 where it gives none); ValueError naming
    what it holds for a layout or a setting this package does not write."""
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}

    def setting(key: str, default):
        return conf.get(key, params.get(key, default))

    fmt = conf.get("format")
    if fmt == "int8_tensorwise" and setting("convrot", False):
        fmt = "int8_convrot"
    elif fmt == "int8_convrot":  # our type name, never a marker's
        raise ValueError("format 'int8_convrot'")
    if fmt == "asym_w4a8_int8" and int(setting("group_size", W4A8_GROUP)) != W4A8_GROUP:
        raise ValueError(f"W4A8 group_size {setting('group_size', None)}; only {W4A8_GROUP} is read here")
    if fmt == "convrot_w4a4" and setting("linear_dtype", "int4") != "int4":
        raise ValueError(f"W4A4 linear_dtype {setting('linear_dtype', None)!r}; only 'int4' is read here")
    if fmt in CONVROT_LAYOUTS:
        return ComfyOptions(str(fmt), convrot_group=int(setting("convrot_groupsize", CONVROT_GROUP)))
    return ComfyOptions(str(fmt))


def pre_quant_scale(options: ComfyOptions, device: torch.device | None = None) -> torch.Tensor:
    """The layer's ``pre_quant_scale`` as a float32 [in] tensor (what ``<m>.pre_quant_scale`` holds)."""
    return torch.tensor(options.pre_quant_scale, dtype=torch.float32, device=device)


def amax_of(chunks: Iterable[torch.Tensor]) -> torch.Tensor:
    """max |w| over a weight's float32 row chunks, float32 []: what a per-tensor scale is taken from (the max of the
    chunks' maxima is the weight's); `NonFiniteWeightError` where it is not finite."""
    amax = torch.zeros((), dtype=torch.float32)
    for chunk in chunks:
        amax = torch.maximum(amax, chunk.abs().amax())  # NaN propagates
    if not bool(torch.isfinite(amax)):
        raise NonFiniteWeightError("holds NaN or Inf values")
    return amax


def tensor_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The one scale of a tensor whose max |x| is `amax` in a layout of range `top`: amax / top, divided in amax's
    dtype (an activation's in its own, as comfy-kitchen takes it), as float32 []; 1 where that is 0 (an all-zero
    tensor: exact zeros, where comfy-kitchen would divide by zero). A weight's (`weight_options`), a call's input
    (comfy_fp8's `quantize_tensor`) and a calibrated input's (`ComfyFormat.calibrated`).

    >>> float(tensor_scale(torch.tensor(896.0), 448.0)), float(tensor_scale(torch.tensor(0.0), 448.0))
    (2.0, 1.0)
    """
    scale = (amax / top).float()
    return torch.where(scale == 0, torch.ones_like(scale), scale)


class ComfyFormat(Format):
    """A ComfyUI format: its layers carry the marker (`MARKER`), written once per weight; the other parts are its
    own. Subclasses set `LAYOUT` (their default layout's marker name) and the numerics."""

    LAYOUT: str

    def marker_spec(self, options: FormatOptions) -> tuple[str, tuple[int, ...]]:
        return ("U8", (len(marker_bytes(self.layout(options))),))

    def input_scale_spec(self, options: FormatOptions) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The ``input_scale`` part where the options have one (the last of a layer's parts), else nothing."""
        return {} if self.layout(options).input_scale is None else {INPUT_SCALE: ("F32", ())}

    def input_scale_part(self, options: FormatOptions) -> dict[str, torch.Tensor]:
        """The ``input_scale`` tensor where the options have one, else nothing."""
        scale = self.layout(options).input_scale
        return {} if scale is None else {INPUT_SCALE: torch.tensor(scale, dtype=torch.float32)}

    def calibrated(self, options: FormatOptions, amax: float) -> FormatOptions | None:
        """The layout with the input scale amax / its range (`COMFY_INPUT_RANGES`) in float32 (1 for an amax of 0,
        as a weight's scale); None for a layout ComfyUI quantizes no input of with a static scale."""
        own = self.layout(options)
        top = COMFY_INPUT_RANGES.get(own.layout)
        if top is None:
            return None
        a = torch.tensor(amax, dtype=torch.float32)
        if not bool(torch.isfinite(a)) or float(a) < 0:
            raise ValueError(f"an input amax is a finite value >= 0; got {amax!r}")
        return dataclasses.replace(own, input_scale=float(tensor_scale(a, top)))

    def quantized_input(
        self, x: torch.Tensor, options: FormatOptions, static: bool = True
    ) -> torch.Tensor | None:
        """`x` encoded as a weight of the layout (the format's own `encode`: comfy-kitchen's quantizer of the
        layout, bit for bit) with the static scale, or with the call's own (`weight_options`: max|x| / the range),
        and decoded; None for a layout without input scales."""
        own = self.layout(options)
        if own.layout not in COMFY_INPUT_RANGES:
            return None
        plain = dataclasses.replace(own, input_scale=None, pre_quant_scale=None)
        smoothing = None if own.pre_quant_scale is None else pre_quant_scale(own, x.device)
        if smoothing is not None:  # the runtime quantizes x · p; the weight `decode` gives is W, not W / p
            x = x * smoothing
        if static and own.input_scale is not None:
            scale = torch.tensor(own.input_scale, dtype=torch.float32)
        else:
            scale = self.weight_options([x], plain)["scale"]
        parts = self.encode(x, plain, scale=scale)
        q = self.decoded(parts, (x.shape[0], x.shape[1]), torch.float32, options=plain)
        return q if smoothing is None else q / smoothing

    def smoothed(self, options: FormatOptions, scale: tuple[float, ...]) -> FormatOptions | None:
        """The layout with the ``pre_quant_scale`` `scale`, for the layouts of `COMFY_SMOOTHED` (ValueError where
        it is not one positive float32 value per input channel); None for the others."""
        own = self.layout(options)
        if own.layout not in COMFY_SMOOTHED:
            return None
        return dataclasses.replace(own, pre_quant_scale=tuple(float(v) for v in scale))

    def stored_options(
        self,
        dtype_of: Callable[[str], str | None],
        read: Callable[[str], torch.Tensor] | None = None,
    ) -> FormatOptions | None:
        """The layout the marker of a stored Linear declares (any of ComfyUI's: a mixed file's layers differ), with
        the static input scale it holds (``input_scale``, float32 [], for an FP8 or NVFP4 layout) and its smoothing
        (``pre_quant_scale``, float32 [in], NVFP4); None where it has no marker (kept). Without `read`, the recipe
        format's default layout."""
        if dtype_of(MARKER) is None:
            return None
        if read is None:
            return self.options_type.from_type(None)
        options = layout_of_marker(read_marker(read(MARKER)))
        if options.layout in COMFY_INPUT_RANGES and dtype_of(INPUT_SCALE) == "F32":
            scale = read(INPUT_SCALE)
            if scale.dim() != 0:
                raise ValueError(f"{options.layout} with an input_scale of shape {list(scale.shape)}, not []")
            try:
                options = dataclasses.replace(options, input_scale=float(scale))
            except ValueError:
                raise ValueError(
                    f"{options.layout} with an input_scale of {float(scale)!r}, not a positive finite value"
                ) from None
        smoothing = dtype_of(PRE_QUANT_SCALE)
        if options.layout in COMFY_SMOOTHED and smoothing is not None:
            if smoothing != "F32":
                raise ValueError(
                    f"{options.layout} with a {smoothing} pre_quant_scale; only F32 is read here"
                )
            scale = read(PRE_QUANT_SCALE)
            if scale.dim() != 1:
                raise ValueError(
                    f"{options.layout} with a pre_quant_scale of shape {list(scale.shape)}, not [in]"
                )
            try:
                options = dataclasses.replace(options, pre_quant_scale=tuple(scale.tolist()))
            except ValueError:
                raise ValueError(
                    f"{options.layout} with a pre_quant_scale holding a value that is not positive and finite"
                ) from None
        return options

    def fitted(self, options: FormatOptions, shape: tuple[int, ...]) -> FormatOptions:
        """A ConvRot layout with the layer's group (`_hadamard.group_for`: the largest that divides the input
        width, as ComfyUI reads ``convrot_groupsize`` per layer); `UnfittedShapeError` where none does (the layout's
        own multiple included: W4A8 16, W4A4 64). Other layouts as they are."""
        own = self.layout(options)
        if not own.rotated or len(shape) != 2:
            return options
        need = CONVROT_LAYOUTS[own.layout]
        group = _hadamard.group_for(shape[1], multiple_of=need)
        if group is None:
            whole = f" {need} and of" if need > 1 else ""
            raise UnfittedShapeError(
                f"has {shape[1]} inputs: {own.layout} needs in_features a multiple of{whole} a ConvRot group "
                f"({', '.join(map(str, _hadamard.GROUPS))})"
            )
        return dataclasses.replace(own, convrot_group=group)

    def raised(self, options: FormatOptions) -> FormatOptions | None:
        up = _RAISED.get(self.layout(options).layout)
        return None if up is None else ComfyOptions(up)

    def checkpoint_metadata(self, tensors: list[MetadataEntry]) -> dict[str, str]:
        """``_quantization_metadata``, as ComfyUI's QUANTIZATION.md documents it: each quantized layer's marker
        JSON by module name (ComfyUI's ``convert_old_quants`` writes these as the layers' markers, the same ones
        the file holds).

        Nothing for a file whose layers are under ComfyUI's checkpoint prefix (`CHECKPOINT_PREFIX`): its Load
        Diffusion Model (``comfy/sd.py`` ``load_diffusion_model_state_dict``) applies ``_quantization_metadata`` again
        after stripping the prefix, and ``convert_old_quants`` (``comfy/utils.py``) then adds every layer's marker
        under its prefixed name to the stripped model, where nothing takes it ("unet unexpected"). The markers the
        file holds as tensors are what both of its loaders read (``detect_layer_quantization``)."""
        layers = {
            name.removesuffix(".weight"): marker_json(options)
            for name, shape, options in tensors
            if shape is not None
        }
        if any(name.startswith(CHECKPOINT_PREFIX) for name in layers):
            return {}
        return {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}

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
