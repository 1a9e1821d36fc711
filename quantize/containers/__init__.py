"""Containers: how a component's planned tensors become files. One module each, looked up by name.

The format table (`formats.FORMAT_INFO`) says which container a format's output uses. A container module
provides:

- ``NAME``;
- ``planned_files(cp, fmt, max_bytes) -> list[PlannedFile]``: the files of a component and the tensors each holds,
  from the plan alone (sizes are known before anything is encoded);
- ``planned_size(file, cp, fmt) -> int``: the bytes that file will take on disk, from the plan alone (`check_headers`
  asks it of every file at plan time: a header that cannot be made is refused before any work);
- ``open_file(path, file, cp, fmt) -> TensorWriter``: a writer for one of them (see `TensorWriter`);
- ``finish(out_dir, cp, fmt, written) -> list[Path]``: the extras once every file is written (an index,
  config.json), returning the paths it wrote;
- ``component_config(fmt, config, kept_linears) -> dict``: the component's config.json as written (verify
  compares it);
- ``stored_metadata(cp, fmt, stored) -> Iterator[(check, ok, failure)]``: each written file's metadata is the
  plan's (safetensors: the format's ``__metadata__`` entries; GGUF: the whole header, key-values included), as
  verify records it;
- ``open_stored(root, rel) -> Component``: a written component read back (verify).

The converter, verify and forward do not know a container's name: a new one is a new module here and a
row in `_MODULES`.

>>> get_container("sharded_safetensors").NAME
'sharded_safetensors'
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from ..errors import InputError
from ..read.files import CONFIG_NAME

if TYPE_CHECKING:
    import torch

    from ..formats import Format
    from ..plan import ComponentPlan, Plan, TensorPlan

__all__ = [
    "PlannedFile",
    "WrittenFile",
    "TensorWriter",
    "get_container",
    "config_with_quantization",
    "config_text",
    "write_config",
    "source_config",
    "component_stem",
    "planned_files_size",
    "check_headers",
    "write_file",
]

#: container name -> the module that defines it
_MODULES = {name: f"{__name__}.{name}" for name in ("sharded_safetensors", "single_safetensors", "gguf_file")}


@dataclass(frozen=True)
class PlannedFile:
    """One output file of a component: its name (relative to the component's folder) and the tensors it holds."""

    name: str
    tensors: tuple[TensorPlan, ...]


@dataclass(frozen=True)
class WrittenFile:
    """A file once written: its plan and the bytes of tensor data it holds."""

    file: PlannedFile
    data_bytes: int


class TensorWriter(Protocol):
    """One output file being written; tensors, or row ranges of them, arrive from any thread, in any order."""

    path: Path

    def write(self, name: str, tensor: torch.Tensor, row_start: int = 0) -> None:
        """Rows ``[row_start, row_start + len(tensor))`` of the planned tensor `name`."""
        ...

    def write_bytes(self, name: str, data: memoryview, offset: int = 0) -> None:
        """Raw stored bytes at `offset` within the planned tensor `name` (an unchanged kept tensor)."""
        ...

    def close(self, sync: bool = True) -> int:
        """Finish the file, checking that every planned byte was written; returns its tensor data bytes."""
        ...

    def abort(self) -> None:
        """Give up on the file (the caller removes the staging directory)."""
        ...


def get_container(name: str) -> ModuleType:
    """The container module registered under `name`; the error lists the known names."""
    try:
        return importlib.import_module(_MODULES[name])
    except KeyError:
        raise InputError(f"unknown container {name!r} (known: {', '.join(_MODULES)})") from None


def planned_files_size(cp: ComponentPlan, fmt: Format, container: str, max_bytes: int) -> int:
    """The bytes the tensor files of `cp` will take on disk in `container` (shards of `max_bytes` where it shards):
    headers and padding included, from the plan alone (what a size budget is held to)."""
    c = get_container(container)
    return sum(c.planned_size(f, cp, fmt) for f in c.planned_files(cp, fmt, max_bytes))


def check_headers(plan: Plan, max_bytes: int) -> None:
    """Make the header of every file `plan` writes once, from the plan alone (key-values: a GGUF text encoder's
    hyperparameters, a companion's): what one cannot be made of is refused now, in one line naming the model,
    before any tensor is read or any file written."""
    for cp in plan.components:
        planned_files_size(cp, plan.format, plan.container, max_bytes)


def config_with_quantization(fmt: Format, config: dict | None, kept_linears: list[str]) -> dict:
    """A component's config.json: the source's, with the format's `quantization_config` added."""
    out = dict(config or {})
    out["quantization_config"] = fmt.quantization_config(kept_linears)
    return out


def config_text(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


def component_stem(cp: ComponentPlan) -> str:
    """The stem of a one-file-per-model name: the family's at the root (`PlanPolicy.root_stem`:
    ``diffusion_model``, a text encoder's own), else the component's folders joined (``high_noise_model``), so
    that two experts' files do not collide when copied into one folder."""
    if cp.rel == ".":
        return "diffusion_model" if cp.family is None else cp.family.plan.root_stem
    return "_".join(PurePosixPath(cp.rel).parts)


def write_file(path: Path, text: str) -> None:
    """Create `path` (never overwriting) with `text`, flushed to disk: how every text file of an output is
    written (config.json, an index, the recipe, the card, the manifest)."""
    with open(path, "x", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def source_config(cp: ComponentPlan) -> dict | None:
    """The model's config as its output's config.json is written from: the source's, else (a release without
    config.json) the one its family reads off the release's shapes; None where neither is."""
    config = cp.component.config
    if config is None and cp.family is not None:
        config = cp.family.release_config(cp.component.tensors, cp.component.where)
    return config


def write_config(out_dir: Path, cp: ComponentPlan, fmt: Format) -> Path:
    """The component's config.json: the source's config with the format's quantization_config."""
    path = out_dir / CONFIG_NAME
    write_file(path, config_text(config_with_quantization(fmt, source_config(cp), cp.kept_linears())))
    return path
