"""`sharded_safetensors`: a component as the source had it: safetensors shards of at most `max_bytes` of
tensor data (``STEM-0000i-of-0000n.safetensors`` + ``STEM.safetensors.index.json``, or ``STEM.safetensors``
alone when the source had one file and no index), and config.json with the format's `quantization_config`.

Every shard's ``__metadata__`` carries ``{"format": "pt"}`` and the whole component's format metadata
(diffusers merges the shards' metadata, so each shard carries all of it). Files are written streaming
(`writer.ShardWriter`), byte-identical to what `safetensors.torch.save_file` writes from the same tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..formats import Format
from ..plan import ComponentPlan
from ..read.checkpoint import Component, open_component
from ..read.files import SHARD_METADATA, group_by_size, index_json, index_name, shard_names
from . import PlannedFile, WrittenFile, config_with_quantization, write_config, write_file
from .writer import ShardWriter, header_bytes, shard_layout

__all__ = [
    "NAME",
    "planned_files",
    "planned_size",
    "open_file",
    "finish",
    "component_config",
    "file_metadata",
    "stored_metadata",
    "open_stored",
]

NAME = "sharded_safetensors"


#: the shard stem transformers' `from_pretrained` looks for (``model.safetensors``, ``model-0000i-of-0000n``)
TRANSFORMERS_STEM = "model"


def shard_stem(cp: ComponentPlan) -> str:
    """The source's stem; a text encoder's release file, which has no config.json and is written with one (its
    family's `release_config`), gets transformers' own (``umt5_xxl_fp16`` -> ``model``), and a release its family
    names a stem for (`PlanPolicy.release_stem`: Wan-Animate-2's, diffusers' own) that one, so that
    `from_pretrained` finds what config.json describes."""
    family = cp.family
    release = cp.component.config is None and family is not None
    if release and family.plan.release_stem is not None:  # a diffusers class's (`PlanPolicy.release_stem`)
        return family.plan.release_stem
    return TRANSFORMERS_STEM if release and family.detection.library == "transformers" else cp.component.stem


def planned_files(cp: ComponentPlan, fmt: Format, max_bytes: int) -> list[PlannedFile]:
    """Tensors in source order, a new shard whenever the next would push one past `max_bytes`; the source's stem
    (`shard_stem`)."""
    groups = group_by_size(cp.tensors, lambda tp: tp.output_bytes, max_bytes)
    names = shard_names(shard_stem(cp), len(groups), with_index=cp.component.index_path is not None)
    return [PlannedFile(name, tuple(group)) for group, name in zip(groups, names, strict=True)]


def planned_size(file: PlannedFile, cp: ComponentPlan, fmt: Format) -> int:
    """The bytes `file` takes on disk: its header (names, shapes, offsets, metadata) and its tensor data (a late
    blob counted at the most it may take)."""
    specs = [spec for tp in file.tensors for spec in tp.outputs]
    return len(header_bytes(shard_layout(specs), file_metadata(fmt, cp))) + sum(s.nbytes for s in specs)


def file_metadata(fmt: Format, cp: ComponentPlan) -> dict[str, str]:
    return {**SHARD_METADATA, **cp.carried_metadata(), **fmt.checkpoint_metadata(cp.metadata_entries())}


def stored_metadata(cp: ComponentPlan, fmt: Format, stored: Component) -> Iterator[tuple[str, bool, str]]:
    """Every shard's ``__metadata__`` holds the format's entries (`file_metadata`: torchao's tensor JSON, say), as
    written."""
    expected = file_metadata(fmt, cp)
    for shard in stored.shards:
        have = stored.metadata[shard]
        ok = all(have.get(k) == v for k, v in expected.items())
        yield (
            "shard metadata",
            ok,
            "" if ok else f"{shard.name}: __metadata__ lacks the {fmt.NAME} entries a loader needs",
        )


def open_file(path: Path, file: PlannedFile, cp: ComponentPlan, fmt: Format) -> ShardWriter:
    return ShardWriter(path, [spec for tp in file.tensors for spec in tp.outputs], file_metadata(fmt, cp))


def component_config(fmt: Format, config: dict | None, kept_linears: list[str]) -> dict:
    return config_with_quantization(fmt, config, kept_linears)


def finish(out_dir: Path, cp: ComponentPlan, fmt: Format, written: list[WrittenFile]) -> list[Path]:
    """The index (when there are several shards, or the source had one) and config.json."""
    paths = []
    if len(written) > 1 or cp.component.index_path is not None:
        weight_map = {spec.name: w.file.name for w in written for tp in w.file.tensors for spec in tp.outputs}
        total = sum(w.data_bytes for w in written)
        paths.append(out_dir / index_name(shard_stem(cp)))
        write_file(paths[-1], index_json(weight_map, total))
    return [*paths, write_config(out_dir, cp, fmt)]


def open_stored(root: Path, rel: str) -> Component:
    return open_component(root, rel)
