"""Step 3 of a load, the data: the plan's tensors read and assigned, group by group, in the dtypes they keep.

The layers outside the blocks first, then each block, each group read as the `host` mode says (memory-map views,
pageable or pinned reads) and assigned or copied straight to the device, so no tensor is held twice; quantized
Linears are swapped in here, and the kept floating tensors cast as `dtype=` asks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import nn

from quantize import dtypes
from quantize.formats import Format
from quantize.read.checkpoint import TensorInfo

from ..blocks import find_blocks
from ..host import TensorReader, remember_source
from ..modules import QuantizedLinear
from .match import _Entry


def _groups(model: nn.Module, plan: dict[str, _Entry]) -> Iterator[list[_Entry]]:
    """The plan's entries outside the blocks, then those of each block in turn."""
    prefixes = [name for name, _ in find_blocks(model)]
    grouped: dict[str, list[_Entry]] = {}
    for entry in plan.values():
        owner = next((p for p in prefixes if entry.name == p or entry.name.startswith(p + ".")), "")
        grouped.setdefault(owner, []).append(entry)
    yield grouped.pop("", [])
    yield from grouped.values()


def _materialize(
    model: nn.Module,
    group: list[_Entry],
    reader: TensorReader,
    dtype: torch.dtype | None,
    keep_fp32: tuple[str, ...],
    compute: str,
) -> None:
    for entry in group:
        if entry.quantized is not None and not isinstance(entry.module, QuantizedLinear):
            _replace(entry, entry.quantized.like(entry.module, entry.options, compute))
        elif entry.quantized is not None:  # a loaded model filled again: computes as this call says
            entry.module.compute = compute
    jobs = [(entry, local, info) for entry in group for local, info in entry.tensors.items()]
    pieces = iter(reader.read_group([i for _, _, info in jobs for i in _pieces(info)], owner=model))
    for entry, local, info in jobs:
        if isinstance(info, torch.Tensor):  # made when matched
            t, info = info.to(reader.device) if reader.device is not None else info, None
        else:
            parts = [next(pieces) for _ in _pieces(info)]
            t = parts[0] if len(parts) == 1 else torch.cat(parts)  # a stacked tensor's ranges, joined: a copy
            info = _pieces(info)[0] if len(parts) == 1 else None  # None: not a view of the file
        module = entry.module
        if isinstance(module, QuantizedLinear) and local in module.part_attrs:
            if reader.host == "mmap" and reader.device is None and info is not None:
                remember_source(module, module.part_attrs[local], t, info)
            module.set_part(local, t)
            continue
        like = module._parameters.get(local) if local in module._parameters else module._buffers.get(local)
        if like is not None and t.shape != like.shape:  # stored with other size-1 dims (`_take` checked)
            t = t.reshape(like.shape)
            info = None if info is None else replace(info, shape=tuple(like.shape))
        cast = _kept_dtype(f"{entry.name}.{local}", t, dtype, keep_fp32)
        if cast is not None and cast != t.dtype:
            t = t.to(cast)
        elif reader.host == "mmap" and reader.device is None and info is not None:
            remember_source(module, local, t, info)
        if local in module._parameters:
            module._parameters[local] = nn.Parameter(t, requires_grad=False)
        else:
            module._buffers[local] = t


def _pieces(info: TensorInfo | tuple[TensorInfo, ...] | torch.Tensor) -> tuple[TensorInfo, ...]:
    """What is read from the files for a source: its ranges, or itself; nothing for a tensor made when matched."""
    if isinstance(info, torch.Tensor):
        return ()
    return info if isinstance(info, tuple) else (info,)


def _replace(entry: _Entry, new: nn.Module) -> None:
    """Put `new` in `entry.module`'s place in the model."""
    entry.parent._modules[entry.name.rpartition(".")[2]] = new
    entry.module = new


def _source_dtype(plan: dict[str, _Entry], fmt: Format) -> torch.dtype | None:
    """What `dtype=None` loads the kept floating tensors in: each as stored (None), except for a format that
    widens them (`Format.WIDENS_KEPT`: a GGUF file keeps norms, biases and convolutions in F32 and its kept 2-D
    Linear weights as stored, BF16, a mix no input dtype runs): then the kept Linear weights' dtype, the source's."""
    if not fmt.WIDENS_KEPT:
        return None
    linears = {
        dtypes.by_name(_pieces(entry.tensors["weight"])[0].dtype).torch
        for entry in plan.values()
        if entry.quantized is None and isinstance(entry.module, nn.Linear) and "weight" in entry.tensors
    }
    return linears.pop() if len(linears) == 1 else None


def _kept_dtype(
    key: str, t: torch.Tensor, dtype: torch.dtype | None, keep_fp32: tuple[str, ...]
) -> torch.dtype | None:
    """The dtype a kept tensor `key` is loaded in: `dtype`, or float32 for the model's `_keep_in_fp32_modules`."""
    if dtype is None or not t.is_floating_point():
        return None
    if keep_fp32 and any(m in key.split(".") for m in keep_fp32):
        return torch.float32
    return dtype


def _finish(model: nn.Module, device: torch.device | None) -> None:
    """Move the buffers the model computed itself to `device` (every parameter was loaded: `_match` saw to it)."""
    for module in model.modules():
        for local, b in module._buffers.items():
            if b is not None and device is not None and b.device != device:
                module._buffers[local] = b.to(device)
    model.eval()
    model.requires_grad_(False)
