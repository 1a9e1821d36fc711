"""`gguf_file`: a component as one GGUF v3 file (``<component>.gguf``; ``diffusion_model.gguf`` at the root),
what ComfyUI-GGUF's Unet Loader and diffusers' `from_single_file` read, and config.json as for every format.

The file's key-values: ``general.architecture = "wan"``, ``general.quantization_version`` (GGML's, 2) and
``general.file_type`` (llama.cpp's file type of the component's most used type, `_M` when a mix raises some
tensors). Tensors in the source's order, each at its aligned offset; written streaming (`gguf_file.GGUFWriter`),
byte for byte what gguf-py's own `GGUFWriter` writes for the same tensors. `--max-shard-size` does not apply.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..checkpoint import CONFIG_NAME, Component
from ..errors import InputError
from ..formats import Format
from ..gguf_file import GGUFTensor, GGUFWriter, read_gguf
from ..layout import read_json_object
from ..plan import ComponentPlan
from . import PlannedFile, WrittenFile, component_stem, config_with_quantization, write_config

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

NAME = "gguf_file"
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: the block layouts these types have had since 2023
#: llama.cpp's `general.file_type` (LlamaFileType) by a model's main type; `_M` where a mix raises some tensors
_FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18}
_FILE_TYPES_M = {"Q4_K": 15, "Q5_K": 17}


def file_name(component: str) -> str:
    """``high_noise_model.gguf``; ``diffusion_model.gguf`` at the root."""
    return f"{component_stem(component)}.gguf"


def layout(cp: ComponentPlan, fmt: Format, max_bytes: int) -> list[PlannedFile]:
    """One file holding every tensor, in source order."""
    return [PlannedFile(file_name(cp.rel), tuple(cp.tensors))]


def file_type(cp: ComponentPlan) -> int:
    """llama.cpp's file type: the type holding the most quantized bytes, `_M` if other types hold some."""
    by_type = Counter()
    for tp in cp.quantized():
        by_type[tp.qtype] += tp.output_bytes
    (main, _), *others = by_type.most_common()
    return _FILE_TYPES_M.get(main, _FILE_TYPES[main]) if others else _FILE_TYPES[main]


def key_values(cp: ComponentPlan) -> dict[str, str | int]:
    return {
        "general.architecture": "wan",
        "general.quantization_version": QUANTIZATION_VERSION,
        "general.file_type": file_type(cp),
    }


def file_metadata(fmt: Format, cp: ComponentPlan) -> dict[str, str]:
    """Nothing beyond the key-values (a GGUF file has no safetensors ``__metadata__``)."""
    return {}


def open_file(path: Path, file: PlannedFile, cp: ComponentPlan, fmt: Format) -> GGUFWriter:
    specs = [GGUFTensor(s.name, s.dtype, s.shape) for tp in file.tensors for s in tp.outputs]
    return GGUFWriter(path, specs, key_values(cp))


def component_config(fmt: Format, config: dict | None, kept_linears: list[str]) -> dict:
    return config_with_quantization(fmt, config, kept_linears)


def finish(out_dir: Path, cp: ComponentPlan, fmt: Format, written: list[WrittenFile]) -> list[Path]:
    return [write_config(out_dir, cp, fmt)]


def open_stored(root: Path, rel: str) -> Component:
    """The component's GGUF file read back: its tensors (types, logical shapes, byte ranges) and config.json."""
    folder = root if rel == "." else root / rel
    path = folder / file_name(rel)
    if not path.is_file():
        raise InputError(f"{folder}: {path.name} not found")
    _, tensors = read_gguf(path)
    config = read_json_object(folder / CONFIG_NAME) if (folder / CONFIG_NAME).is_file() else None
    return Component(root, rel, [path], tensors, None, path.stem, config, {path: {}})
