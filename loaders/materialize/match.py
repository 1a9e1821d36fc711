"""Step 2 of a load, the match: every checkpoint key placed on the model before any data is read (the plan).

Each Linear whose entry is in the format's parts becomes that format's module, with the options its stored parts
say; a Linear the checkpoint stacks with others (or cut into several) takes its row ranges as the format cuts them;
every other key must land on a parameter or persistent buffer of the same shape. Any mismatch is one
`CheckpointMismatchError` naming the key, so a load fails before it reads a byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from quantize import dtypes
from quantize.formats import Format, FormatOptions, UnsupportedShapeError, format_for, quantized_parts
from quantize.formats.base import RowCut
from quantize.models import Split, same_but_size_one_dims, stack_rows
from quantize.read.checkpoint import Component, TensorInfo, join_pieces, read_tensor

from ..modules import QuantizedLinear, module_for
from .errors import CheckpointMismatchError
from .names import _Names


@dataclass
class _Entry:
    """One module's tensors: where each comes from, and whether the module becomes a quantized Linear."""

    name: str
    module: nn.Module
    parent: nn.Module | None
    #: local name -> source: a stored tensor, the row ranges of a stacked one that are it, in order, or a part its
    #: format made from a stacked weight's small parts (`Format.cut_rows`: a cut nf4 weight's quant state)
    tensors: dict[str, TensorInfo | tuple[TensorInfo, ...] | torch.Tensor] = field(default_factory=dict)
    quantized: type[QuantizedLinear] | None = None
    options: FormatOptions | None = None


def _match(
    model: nn.Module, comp: Component, fmt: Format, names: _Names, tied: Mapping[str, str] | None = None
) -> dict[str, _Entry]:
    keys = dict(comp.tensors)
    plan: dict[str, _Entry] = {}
    modules = dict(model.named_modules())
    cut_from: set[str] = set()  # the stacked tensors Linears took row ranges of
    for key in (
        tied or {}
    ):  # loaded under the name they have first (`_tied`); a checkpoint may hold them twice
        stored = names.rename(key)
        if stored is not None:
            keys.pop(stored, None)
    for name, module in modules.items():
        own = [f"{name}.{k}" if name else k for k, t in module._parameters.items() if t is not None]
        if own and all(p in (tied or {}) for p in own) and not _persistent_buffers(module):
            continue  # its parameters are another module's (`_tied`), loaded there
        entry = _Entry(name, module, modules[name.rpartition(".")[0]] if name else None)
        params = {local: t for local, t in module._parameters.items() if t is not None}
        cut = {local: c for local in params if (c := names.cut_into(f"{name}.{local}" if name else local))}
        if cut:  # written as several tensors (a fused qkv's thirds): joined again
            for local, t in params.items():
                entry.tensors[local] = (
                    _joined(cut[local], keys, t, comp)
                    if local in cut
                    else _take(keys, names, name, local, t, comp)
                )
            plan[name] = entry
            continue
        already = isinstance(module, QuantizedLinear)
        options = None
        stacked = names.stacked_into(f"{name}.weight") if isinstance(module, nn.Linear) else None
        if stacked is not None and not already:
            _cut_entry(entry, stacked, names, comp.tensors, fmt, comp, cut_from)
            plan[name] = entry
            continue
        if already or isinstance(module, nn.Linear):
            stored = names.module(name, comp)
            options = _stored_options(stored, (module.out_features, module.in_features), keys, fmt, comp)
        layer_fmt = fmt if options is None else format_for(fmt, options)  # a mixed ComfyUI file's own layout
        if already and module.FORMAT is not layer_fmt:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {name!r} is a {type(module).__name__} ({module.FORMAT.NAME}); "
                f"the checkpoint stores it as {layer_fmt.NAME}"
            )
        if already and options is None:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {fmt.NAME} layer {name!r} is not quantized in it"
            )
        if already and module.options != options:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {name!r} holds {module.options.type_name}; the checkpoint's "
                f"{stored!r} is {options.type_name}: load into a new model"
            )
        if options is not None:
            entry.quantized, entry.options = module_for(layer_fmt), options
            for part, (key, _) in quantized_parts(
                fmt, stored, (module.out_features, module.in_features), options
            ).items():
                entry.tensors[part] = keys.pop(key)
            if module.bias is not None:
                entry.tensors["bias"] = _take(keys, names, name, "bias", module.bias, comp)
        else:
            for local, t in (*module._parameters.items(), *_persistent_buffers(module)):
                if t is not None:
                    entry.tensors[local] = _take(keys, names, name, local, t, comp)
        if entry.tensors:
            plan[name] = entry
    for key in cut_from:
        keys.pop(key, None)
    if keys:
        extra = sorted(keys)
        raise CheckpointMismatchError(
            f"{comp.dir}: {len(extra)} checkpoint tensor(s) fit nothing in {type(model).__name__}, "
            f"e.g. {extra[0]!r}: is this the model the checkpoint was converted from?"
        )
    return plan


def _joined(
    pieces: Mapping[str, Split], keys: dict[str, TensorInfo], like: torch.Tensor, comp: Component
) -> tuple[TensorInfo, ...] | torch.Tensor:
    """A model tensor the conversion cut into `pieces` (`models.Split`: a fused qkv's thirds, a Conv3d's temporal
    taps), from the checkpoint's: their rows in order, read as one; cut along a later dim, the tensor they make,
    read now (a patch embedding: small). Only stored floats are joined: the plan keeps a tensor it cuts."""
    order = sorted(pieces, key=lambda n: pieces[n][2])
    infos = []
    for key in order:
        info = keys.pop(key, None)
        if info is None:
            raise CheckpointMismatchError(
                f"{comp.dir}: {key!r} is not in the checkpoint ({', '.join(order)} make one)"
            )
        if info.dtype not in dtypes.FLOAT_DTYPES:
            raise CheckpointMismatchError(
                f"{comp.dir}: {key!r} is {info.dtype}: a tensor cut into several ({', '.join(order)}) loads only "
                "as stored floats; convert with a recipe that keeps it"
            )
        infos.append(info)
    dim = pieces[order[0]][1]
    if dim == 0:
        shape = (sum(i.shape[0] for i in infos), *infos[0].shape[1:])
        joined: tuple[TensorInfo, ...] | torch.Tensor = tuple(infos)
    else:
        joined = join_pieces([read_tensor(i) for i in infos], dim, like.dim())
        shape = tuple(joined.shape)
    if shape != tuple(like.shape):
        raise CheckpointMismatchError(
            f"{comp.dir}: {', '.join(order)} make {list(shape)}; the model needs {list(like.shape)}"
        )
    return joined


def _persistent_buffers(module: nn.Module):
    return [(k, b) for k, b in module._buffers.items() if k not in module._non_persistent_buffers_set]


def _cut_entry(
    entry: _Entry,
    stacked: str,
    names: _Names,
    keys: dict[str, TensorInfo],
    fmt: Format,
    comp: Component,
    cut_from: set[str],
) -> None:
    """Linear `entry` as row ranges of the checkpoint's stacked weight `stacked` (and of its stacked bias)."""
    linear, name = entry.module, entry.name
    stack = names.stack_of(stacked)
    share = sum(1 for n, _, _ in stack if n == f"{name}.weight")  # how many of the stack's equal parts it is
    rows = linear.out_features // share * len(stack)
    ranges = stack_rows(stack, rows)[f"{name}.weight"]
    stored = stacked[: -len(".weight")]
    options = _stored_options(stored, (rows, linear.in_features), keys, fmt, comp)
    if options is not None:
        layer_fmt = format_for(fmt, options)
        entry.quantized, entry.options = module_for(layer_fmt), options
        parts = quantized_parts(fmt, stored, (rows, linear.in_features), options)
        try:
            cuts = layer_fmt.cut_rows(
                (rows, linear.in_features), options, ranges, lambda part: read_tensor(keys[parts[part][0]])
            )
        except UnsupportedShapeError as e:
            raise CheckpointMismatchError(
                f"{comp.dir}: {stacked!r} ({layer_fmt.NAME}) stacks several of the model's Linears and cannot be "
                f"cut into {name!r}: {e} (convert the diffusers-named model instead, or to a format that can)"
            ) from None
        for part, (key, _) in parts.items():
            cut_from.add(key)
            entry.tensors[part] = _cut_part(keys[key], cuts[part], comp)
    elif stacked not in keys:
        raise CheckpointMismatchError(
            f"{comp.dir}: the model's {name + '.weight'!r} ({stacked!r} in {names.why}) is not in the checkpoint"
        )
    else:
        cut_from.add(stacked)
        entry.tensors["weight"] = _row_ranges(keys[stacked], ranges, rows, comp)
    if linear.bias is not None:
        bias = names.stacked_into(f"{name}.bias")
        if bias is None or bias not in keys:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {name + '.bias'!r} has no stacked bias in the checkpoint ({bias!r})"
            )
        cut_from.add(bias)
        entry.tensors["bias"] = _row_ranges(keys[bias], ranges, rows, comp)


def _row_ranges(
    info: TensorInfo, ranges: tuple[tuple[int, int], ...], rows: int, comp: Component
) -> tuple[TensorInfo, ...]:
    """Row ranges of a stored tensor whose dim 0 is a stacked weight's `rows`: each its byte range."""
    if not info.shape or info.shape[0] != rows:
        raise CheckpointMismatchError(
            f"{comp.dir}: {info.name!r} is {info.dtype}{list(info.shape)}: not {rows} rows to cut"
        )
    return _dim0_ranges(info, ranges)


def _cut_part(
    info: TensorInfo, cut: RowCut, comp: Component
) -> TensorInfo | tuple[TensorInfo, ...] | torch.Tensor:
    """A quantized part of a cut Linear, as its format's `cut_rows` says: the whole part, ranges of its dim 0, or
    the tensor the format made."""
    if cut is None or isinstance(cut, torch.Tensor):
        return info if cut is None else cut
    if not info.shape or any(not 0 <= a <= b <= info.shape[0] for a, b in cut):
        raise CheckpointMismatchError(
            f"{comp.dir}: {info.name!r} is {info.dtype}{list(info.shape)}: it has no rows {list(cut)} to cut"
        )
    return _dim0_ranges(info, cut)


def _dim0_ranges(info: TensorInfo, ranges: tuple[tuple[int, int], ...]) -> tuple[TensorInfo, ...]:
    """Ranges of a stored tensor's dim 0: each its byte range of the file."""
    return tuple(info.rows(a, b) for a, b in ranges)


def _stored_options(
    stored: str, shape: tuple[int, int], keys: dict[str, TensorInfo], fmt: Format, comp: Component
) -> FormatOptions | None:
    """The options the checkpoint holds Linear `stored` of `shape` [out, in] in (all of `fmt`'s parts, as
    specified), or None where it holds it as a plain weight."""

    def dtype_of(part: str) -> str | None:
        info = keys.get(f"{stored}.{part}")
        return None if info is None else info.dtype

    def read(part: str) -> torch.Tensor:
        return read_tensor(keys[f"{stored}.{part}"])

    try:
        options = fmt.stored_options(dtype_of, read)
    except ValueError as e:  # a marker declaring a layout no format here writes
        raise CheckpointMismatchError(
            f"{comp.dir}: Linear {stored!r} is stored as {e}: not loadable here"
        ) from None
    if options is None:
        return None
    try:
        specs = quantized_parts(fmt, stored, shape, options)
    except ValueError:  # the format cannot hold this shape: it must be kept
        return None
    present = {p: keys.get(key) for p, (key, _) in specs.items()}
    if not any(info is not None and info.dtype == specs[p][1][0] for p, info in present.items()):
        return None
    for part, (key, (dtype, shape)) in specs.items():
        info = present[part]
        if info is None:
            raise CheckpointMismatchError(
                f"{comp.dir}: {key!r} is missing: {format_for(fmt, options).NAME} stores Linear {stored!r} in "
                f"{sorted(specs)}"
            )
        if info.dtype != dtype or (shape is not None and info.shape != shape):
            want = f"{dtype}{list(shape) if shape is not None else ''}"
            raise CheckpointMismatchError(
                f"{comp.dir}: {key!r} is {info.dtype}{list(info.shape)}; Linear {stored!r} "
                f"{list(shape)} in {format_for(fmt, options).NAME} needs {want}"
            )
    return options


def _take(
    keys: dict[str, TensorInfo], names: _Names, module: str, local: str, like: torch.Tensor, comp: Component
) -> TensorInfo:
    key = names.key(f"{module}.{local}" if module else local, comp)
    info = keys.pop(key, None)
    if info is None:
        theirs = f" ({key!r} in the checkpoint's names)" if names.why else ""
        own = f"{module}.{local}" if module else local
        raise CheckpointMismatchError(
            f"{comp.dir}: the model's {own!r}{theirs} {list(like.shape)} is not in the checkpoint"
        )
    if info.shape != tuple(like.shape) and not same_but_size_one_dims(info.shape, like.shape):
        raise CheckpointMismatchError(
            f"{comp.dir}: {key!r} is {info.dtype}{list(info.shape)} in the checkpoint, the model needs {list(like.shape)}"
        )
    return info
