"""Random-weight checkpoints with the real key names of a model family, for demos, tests and benchmarks.

No model can be downloaded here, and none is needed to exercise the toolchain: the converter only
cares about names, shapes and dtypes. Each family's examples give its example models (`models.examples`:
names, shapes and config.json as its releases write them, with the dimensions the runtimes fix), and they
are written shard by shard with the same streaming writer as the converter, so even a 14B-shaped one
needs little RAM.

>>> from quantize.models import DEFAULT_FAMILY
>>> from quantize.models.examples import examples_of
>>> examples_of(DEFAULT_FAMILY).models("tiny", "t2v")[0].tensors[0]
('patch_embedding.weight', (128, 16, 1, 2, 2))
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from . import dtypes
from .containers.writer import ShardWriter
from .models import DEFAULT_FAMILY
from .models.examples import ExampleModel, examples_of
from .plan import TensorSpec
from .read.files import SHARD_METADATA, group_by_size, index_json, index_name, shard_names

__all__ = ["write_random_checkpoint", "write_example", "write_example_lora"]


#: a shard size no model reaches: one file
ONE_FILE = 1 << 62


def _random(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    seed: int,
    init: dict[str, tuple[float, float]] | None = None,
) -> torch.Tensor:
    """Gaussian values: zero mean, 1/sqrt(fan-in) for a matrix, 1 for a vector; or (mean, std) of the first
    `init` pattern found in `name`."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    fan_in = shape[-1] if len(shape) >= 2 else 1
    mean, std = 0.0, 1.0 if len(shape) < 2 else fan_in**-0.5
    mean, std = next((v for p, v in (init or {}).items() if re.search(p, name)), (mean, std))
    values = torch.randn(shape, generator=g) * std
    return (values + mean if mean else values).to(dtype)


def write_random_checkpoint(
    out_dir: Path,
    tensors: list[tuple[str, tuple[int, ...]]],
    *,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: int = 10**9,
    stem: str = "diffusion_pytorch_model",
    config: dict | None = None,
    seed: int = 0,
    metadata: dict[str, str] | None = None,
    fixed: dict[str, bytes] | None = None,
    init: dict[str, tuple[float, float]] | None = None,
) -> list[Path]:
    """Write random tensors, then the `fixed` ones (uint8 tensors of the given bytes), as safetensors shards
    (+ index when more than one, + config.json); each shard's ``__metadata__`` holds `metadata` beside
    ``format``. `init`: (mean, std) of the tensors whose names a pattern is found in (`_random`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dt = dtypes.by_torch(dtype).name
    fixed = {
        name: torch.frombuffer(bytearray(data), dtype=torch.uint8) for name, data in (fixed or {}).items()
    }
    specs = [TensorSpec(name, dt, shape) for name, shape in tensors]
    specs += [TensorSpec(name, "U8", tuple(t.shape)) for name, t in fixed.items()]
    groups = group_by_size(specs, lambda s: s.nbytes, max_shard_size)
    names = shard_names(stem, len(groups), with_index=False)
    weight_map = {}
    for group, name in zip(groups, names, strict=True):
        with ShardWriter(out_dir / name, group, {**SHARD_METADATA, **(metadata or {})}) as w:
            for spec in group:
                tensor = fixed.get(spec.name)
                if tensor is None:
                    tensor = _random(spec.name, spec.shape, dtype, seed, init)
                w.write(spec.name, tensor)
        weight_map.update(dict.fromkeys((s.name for s in group), name))
    if len(groups) > 1:
        (out_dir / index_name(stem)).write_text(index_json(weight_map, sum(s.nbytes for s in specs)))
    if config is not None:
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out_dir / n for n in names]


def write_example(
    out_dir: Path,
    preset: str = "tiny",
    layout: str = "t2v",
    *,
    family: str = DEFAULT_FAMILY,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: int = 10**9,
    seed: int = 0,
    models: list[ExampleModel] | None = None,
) -> Path:
    """An example checkpoint of `family` (its `preset` shape, in its folder `layout`), with the other files of
    its releases beside it (copied when a recipe asks); `models`: those of the preset with blocks left out, say
    (`make bench-large` fits a shape to the disk), None: the preset's own."""
    out_dir = Path(out_dir)
    chosen = examples_of(family)
    if models is None:
        models = chosen.models(preset, layout)
    for i, model in enumerate(models):
        write_random_checkpoint(
            out_dir / model.component,
            model.tensors,
            dtype=dtype,
            max_shard_size=ONE_FILE if model.one_file else max_shard_size,
            stem=model.stem,
            config=model.config,
            seed=seed + i,
            metadata=dict(model.metadata or {}),
            fixed=dict(model.fixed or {}),
            init=dict(model.init or {}),
        )
    for rel, content in chosen.preset_files(preset, layout).items():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (out_dir / rel).write_bytes(content)
        else:
            (out_dir / rel).write_text(content)
    (out_dir / "example.json").write_text(
        json.dumps({"family": family, "preset": preset, "layout": layout}, indent=2) + "\n"
    )
    return out_dir


def write_example_lora(
    path: Path,
    preset: str = "small",
    layout: str = "t2v",
    *,
    family: str = DEFAULT_FAMILY,
    rank: int = 16,
    seed: int = 0,
) -> Path:
    """A random-weight LoRA for a `write_example` model, as the family's LoRAs in the wild are written
    (`models.examples.Examples.lora`; alpha = rank/2), streamed to `path` one tensor at a time."""
    tensors = examples_of(family).lora(preset, layout, rank)
    specs = [TensorSpec(name, dt, dims) for name, dims, dt in tensors]
    with ShardWriter(Path(path), specs, SHARD_METADATA) as w:
        for name, dims, _ in tensors:
            if name.endswith(".alpha"):
                w.write(name, torch.tensor(rank / 2, dtype=torch.float32))
            else:  # small enough that the merged weights stay close to the model's
                w.write(
                    name, _random(name, dims, torch.bfloat16, seed) * (0.3 if "lora_down" in name else 0.03)
                )
    return Path(path)
