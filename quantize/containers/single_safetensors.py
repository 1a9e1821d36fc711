"""`single_safetensors`: a component as one unsharded safetensors file, what ComfyUI loads from
``models/diffusion_models/``, and config.json with the format's `quantization_config`.

The file is ``<component>_<format>.safetensors`` in the component's folder (``diffusion_model_<format>``
for a component at the root): deterministic, and two experts' files do not collide when copied into one
ComfyUI folder. It is written streaming like a shard (`writer.ShardWriter`: header first, each tensor at
its offset), whatever its size; `--max-shard-size` does not apply.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ..checkpoint import CONFIG_NAME, Component, open_component
from ..formats import Format
from ..layout import SHARD_METADATA
from ..output import write_file
from ..plan import ComponentPlan
from ..writer import ShardWriter
from . import PlannedFile, WrittenFile, config_text, config_with_quantization

__all__ = [
    "NAME",
    "file_name",
    "layout",
    "open_file",
    "finish",
    "component_config",
    "file_metadata",
    "open_stored",
]

NAME = "single_safetensors"


def file_name(component: str, fmt_name: str) -> str:
    """``high_noise_model_comfy_fp8.safetensors``; ``diffusion_model_comfy_fp8.safetensors`` at the root."""
    stem = "diffusion_model" if component == "." else "_".join(PurePosixPath(component).parts)
    return f"{stem}_{fmt_name}.safetensors"


def layout(cp: ComponentPlan, fmt: Format, max_bytes: int) -> list[PlannedFile]:
    """One file holding every tensor, in source order."""
    return [PlannedFile(file_name(cp.rel, fmt.NAME), tuple(cp.tensors))]


def file_metadata(fmt: Format, cp: ComponentPlan) -> dict[str, str]:
    return {**SHARD_METADATA, **fmt.checkpoint_metadata(cp.metadata_entries())}


def open_file(path: Path, file: PlannedFile, cp: ComponentPlan, fmt: Format) -> ShardWriter:
    return ShardWriter(path, [spec for tp in file.tensors for spec in tp.outputs], file_metadata(fmt, cp))


def component_config(fmt: Format, config: dict | None, kept_linears: list[str]) -> dict:
    return config_with_quantization(fmt, config, kept_linears)


def finish(out_dir: Path, cp: ComponentPlan, fmt: Format, written: list[WrittenFile]) -> list[Path]:
    path = out_dir / CONFIG_NAME
    write_file(path, config_text(component_config(fmt, cp.component.config, cp.kept_linears())))
    return [path]


def open_stored(root: Path, rel: str) -> Component:
    return open_component(root, rel)
