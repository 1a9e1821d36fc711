"""`single_safetensors`: a component as one unsharded safetensors file, what ComfyUI loads from
``models/diffusion_models/``, and config.json with the format's `quantization_config`.

The file is ``<component>_<format>.safetensors`` in the component's folder (``diffusion_model_<format>``
for a component at the root): deterministic, and two experts' files do not collide when copied into one
ComfyUI folder. It is a shard of `sharded_safetensors` in all but its name and count (the same writer,
metadata, config and reader); `--max-shard-size` does not apply.
"""

from __future__ import annotations

from pathlib import Path

from ..formats import Format
from ..plan import ComponentPlan
from . import PlannedFile, WrittenFile, component_stem, write_config
from .sharded_safetensors import (
    component_config,
    file_metadata,
    open_file,
    open_stored,
    planned_size,
    stored_metadata,
)

__all__ = [
    "NAME",
    "file_name",
    "planned_files",
    "planned_size",
    "open_file",
    "finish",
    "component_config",
    "file_metadata",
    "stored_metadata",
    "open_stored",
]

NAME = "single_safetensors"


def file_name(cp: ComponentPlan, fmt_name: str) -> str:
    """``high_noise_model_comfy_fp8.safetensors``; ``diffusion_model_comfy_fp8.safetensors`` at the root (a text
    encoder's: ``umt5_comfy_fp8.safetensors``)."""
    return f"{component_stem(cp)}_{fmt_name}.safetensors"


def planned_files(cp: ComponentPlan, fmt: Format, max_bytes: int) -> list[PlannedFile]:
    """One file holding every tensor, in source order."""
    return [PlannedFile(file_name(cp, fmt.NAME), tuple(cp.tensors))]


def finish(out_dir: Path, cp: ComponentPlan, fmt: Format, written: list[WrittenFile]) -> list[Path]:
    """config.json only: one file needs no index."""
    return [write_config(out_dir, cp, fmt)]
