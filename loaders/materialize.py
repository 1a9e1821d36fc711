"""`load_quantized`: a converted checkpoint straight into a model, without a bf16 copy on the way.

1. The skeleton: a class is built from the checkpoint's config.json with its parameters on the meta
   device (buffers it computes itself, such as rotary tables, are built for real); a module passed
   in is filled in place.
2. The match, before any data is read: every Linear whose checkpoint entry is in the format's parts
   is swapped for that format's module (`loaders.modules`); every checkpoint key must land on a
   parameter, buffer or part of the model with the same shape, and every parameter must be given.
   Any mismatch is one `CheckpointMismatchError` naming the key.
3. The data, module group by module group (the layers outside the blocks, then block by block):
   each tensor is taken from the safetensors file as the `host` mode says (a memory-map view, a
   pageable read, a pinned read) and assigned, or copied straight to `device`. Nothing else holds it,
   so the host peak is what stays resident, never twice it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from quantize.errors import InputError
from quantize.formats import Format, format_of_config, quantized_parts
from quantize.models.meta import parameters_on_meta
from quantize.read.checkpoint import CONFIG_NAME, Component, TensorInfo, open_component

from .blocks import find_blocks
from .host import TensorReader, remember_source
from .modules import QuantizedLinear, module_for

__all__ = ["load_quantized", "CheckpointMismatchError", "find_component", "parameters_on_meta"]


class CheckpointMismatchError(InputError):
    """The checkpoint does not fit the model: a key, shape or dtype names where."""


def find_component(checkpoint: Path) -> Path:
    """The component directory: `checkpoint` itself when it holds safetensors, else its one model subfolder."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise InputError(f"{checkpoint}: checkpoint directory not found")
    if any(checkpoint.glob("*.safetensors")):
        return checkpoint
    found = sorted(
        d
        for d in checkpoint.iterdir()
        if d.is_dir() and any(d.glob("*.safetensors")) and (d / CONFIG_NAME).is_file()
    )
    if len(found) == 1:
        return found[0]
    if not found:
        raise InputError(f"{checkpoint}: no *.safetensors here or in a model subfolder")
    names = ", ".join(d.name for d in found)
    raise InputError(f"{checkpoint}: holds several models ({names}): pass the one to load, e.g. {found[0]}")


def load_quantized(
    model: type[nn.Module] | nn.Module,
    checkpoint: str | Path,
    host: str = "mmap",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Build (or fill) `model` from a checkpoint written by `quantize convert`, ready for inference.

    model: a model class (built from the checkpoint's config.json, e.g. `WanTransformer3DModel`) or an
        `nn.Module` whose parameter names match the checkpoint (filled in place).
    checkpoint: the component directory (``ckpt/transformer``), or a checkpoint holding one model.
    host: ``"mmap"`` (default: views of the files, paged in on use), ``"pageable"`` or ``"pinned"``.
    device: where the tensors go; None keeps them on the host as `host` says.
    dtype: cast the kept (unquantized) floating tensors to this dtype, except those of the model's
        ``_keep_in_fp32_modules`` (float32), as diffusers does; None keeps the stored dtypes.
        Quantized parts always keep theirs.
    """
    device = torch.device(device) if device is not None else None
    reader = TensorReader(host, device)  # checks `host` before anything is built
    comp = open_component(find_component(checkpoint))
    fmt = _checkpoint_format(comp)
    try:
        module_for(fmt)  # a format no module here runs (ComfyUI's) is named before anything is built
    except InputError as e:
        raise InputError(f"{comp.dir}: {e}") from None
    if isinstance(model, type):
        model = _skeleton(model, comp)
    elif not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module class or instance, got {type(model).__name__}")
    plan = _match(model, comp, fmt)
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    for group in _groups(model, plan):
        _materialize(model, group, reader, dtype, keep_fp32)
    _finish(model, device)
    return model


def _checkpoint_format(comp: Component) -> Format:
    where = comp.config_path
    if comp.config is None:
        raise InputError(f"{where}: not found: a checkpoint written by `quantize convert` has one")
    qc = comp.config.get("quantization_config")
    if qc is None:
        raise InputError(
            f"{where}: has no quantization_config: not a quantized checkpoint (convert it first)"
        )
    return format_of_config(qc, str(where))


# -- 1. the skeleton --------------------------------------------------------------------------------


def _skeleton(cls: type[nn.Module], comp: Component) -> nn.Module:
    config = {k: v for k, v in comp.config.items() if k != "quantization_config"}
    try:
        with parameters_on_meta():
            if hasattr(cls, "from_config"):
                return cls.from_config(config)
            return cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    except (TypeError, ValueError) as e:
        raise InputError(
            f"{comp.config_path}: cannot build {cls.__name__} from it ({e}): pass the model class the "
            "checkpoint was converted from, or an instance to fill"
        ) from None


# -- 2. the match -----------------------------------------------------------------------------------


@dataclass
class _Entry:
    """One module's tensors: where each comes from, and whether the module becomes a quantized Linear."""

    name: str
    module: nn.Module
    parent: nn.Module | None
    tensors: dict[str, TensorInfo] = field(default_factory=dict)  # local name -> source
    quantized: type[QuantizedLinear] | None = None


def _match(model: nn.Module, comp: Component, fmt: Format) -> dict[str, _Entry]:
    keys = dict(comp.tensors)
    plan: dict[str, _Entry] = {}
    modules = dict(model.named_modules())
    for name, module in modules.items():
        entry = _Entry(name, module, modules[name.rpartition(".")[0]] if name else None)
        already = isinstance(module, QuantizedLinear)
        if already and module.FORMAT is not fmt:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {name!r} is a {type(module).__name__} ({module.FORMAT.NAME}); "
                f"the checkpoint is {fmt.NAME}"
            )
        if already or (isinstance(module, nn.Linear) and _is_quantized(name, module, keys, fmt, comp)):
            if already and not _is_quantized(name, module, keys, fmt, comp):
                raise CheckpointMismatchError(
                    f"{comp.dir}: the model's {fmt.NAME} layer {name!r} is not quantized in it"
                )
            entry.quantized = module_for(fmt)
            for part, (key, _) in quantized_parts(
                fmt, name, (module.out_features, module.in_features)
            ).items():
                entry.tensors[part] = keys.pop(key)
            if module.bias is not None:
                entry.tensors["bias"] = _take(keys, name, "bias", module.bias, comp)
        else:
            for local, t in (*module._parameters.items(), *_persistent_buffers(module)):
                if t is not None:
                    entry.tensors[local] = _take(keys, name, local, t, comp)
        if entry.tensors:
            plan[name] = entry
    if keys:
        extra = sorted(keys)
        raise CheckpointMismatchError(
            f"{comp.dir}: {len(extra)} checkpoint tensor(s) fit nothing in {type(model).__name__}, "
            f"e.g. {extra[0]!r}: is this the model the checkpoint was converted from?"
        )
    return plan


def _persistent_buffers(module: nn.Module):
    return [(k, b) for k, b in module._buffers.items() if k not in module._non_persistent_buffers_set]


def _is_quantized(
    name: str, linear: nn.Module, keys: dict[str, TensorInfo], fmt: Format, comp: Component
) -> bool:
    """Whether the checkpoint holds `linear` in `fmt`'s parts (all of them, as specified), or as a plain weight."""
    try:
        specs = quantized_parts(fmt, name, (linear.out_features, linear.in_features))
    except ValueError:  # the format cannot hold this shape: it must be kept
        return False
    present = {p: keys.get(key) for p, (key, _) in specs.items()}
    if not any(info is not None and info.dtype == specs[p][1][0] for p, info in present.items()):
        return False
    for part, (key, (dtype, shape)) in specs.items():
        info = present[part]
        if info is None:
            raise CheckpointMismatchError(
                f"{comp.dir}: {key!r} is missing: {fmt.NAME} stores Linear {name!r} in {sorted(specs)}"
            )
        if info.dtype != dtype or (shape is not None and info.shape != shape):
            want = f"{dtype}{list(shape) if shape is not None else ''}"
            raise CheckpointMismatchError(
                f"{comp.dir}: {key!r} is {info.dtype}{list(info.shape)}; Linear {name!r} "
                f"[{linear.out_features}, {linear.in_features}] in {fmt.NAME} needs {want}"
            )
    return True


def _take(
    keys: dict[str, TensorInfo], module: str, local: str, like: torch.Tensor, comp: Component
) -> TensorInfo:
    key = f"{module}.{local}" if module else local
    info = keys.pop(key, None)
    if info is None:
        raise CheckpointMismatchError(
            f"{comp.dir}: the model's {key!r} {list(like.shape)} is not in the checkpoint"
        )
    if info.shape != tuple(like.shape):
        raise CheckpointMismatchError(
            f"{comp.dir}: {key!r} is {info.dtype}{list(info.shape)} in the checkpoint, the model needs {list(like.shape)}"
        )
    return info


# -- 3. the data ------------------------------------------------------------------------------------


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
) -> None:
    for entry in group:
        if entry.quantized is not None and not isinstance(entry.module, QuantizedLinear):
            _replace(entry, entry.quantized.like(entry.module))
    jobs = [(entry, local, info) for entry in group for local, info in entry.tensors.items()]
    tensors = reader.read_group([info for _, _, info in jobs], owner=model)
    for (entry, local, info), t in zip(jobs, tensors, strict=True):
        module = entry.module
        if isinstance(module, QuantizedLinear) and local in module.part_attrs:
            if reader.host == "mmap" and reader.device is None:
                remember_source(module, module.part_attrs[local], t, info)
            module.set_part(local, t)
            continue
        cast = _kept_dtype(f"{entry.name}.{local}", t, dtype, keep_fp32)
        if cast is not None and cast != t.dtype:
            t = t.to(cast)
        elif reader.host == "mmap" and reader.device is None:
            remember_source(module, local, t, info)
        if local in module._parameters:
            module._parameters[local] = nn.Parameter(t, requires_grad=False)
        else:
            module._buffers[local] = t


def _replace(entry: _Entry, new: nn.Module) -> None:
    """Put `new` in `entry.module`'s place in the model."""
    entry.parent._modules[entry.name.rpartition(".")[2]] = new
    entry.module = new


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
