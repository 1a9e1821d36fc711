"""What ComfyUI's two formats share: the per-layer marker and its config.json declaration.

ComfyUI recognizes a quantized Linear ``<m>`` by ``<m>.comfy_quant``: a uint8 tensor holding UTF-8 JSON,
read as ``json.loads(bytes(t.tolist()))``, whose ``format`` names the layout (comfy-kitchen's
``TensorCoreFP8Layout`` for ``float8_e4m3fn``, ``TensorWiseINT8Layout`` for ``int8_tensorwise``). A Linear
without a marker in a marked file is cast to the compute dtype, so kept layers hold their real values.
"""

from __future__ import annotations

import json

import torch

from . import format_info

__all__ = ["MARKER", "marker_bytes", "marker", "read_marker", "quantization_config"]

MARKER = "comfy_quant"


def marker_bytes(layout: str) -> bytes:
    """The marker's bytes for ComfyUI layout name `layout` (``json.dumps`` defaults: what ComfyUI writes)."""
    return json.dumps({"format": layout}).encode()


def marker(layout: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(marker_bytes(layout)), dtype=torch.uint8)


def read_marker(t: torch.Tensor) -> dict:
    """The marker's JSON, read the way ComfyUI reads it."""
    return json.loads(bytes(t.tolist()))


def quantization_config(name: str, layout: str, kept_linears: list[str]) -> dict:
    """config.json's declaration (ComfyUI itself reads the markers, not this): the format, ComfyUI's layout
    name, and the Linears kept unquantized."""
    return {"quant_method": format_info(name).quant_method, "layout": layout, "ignore": sorted(kept_linears)}
