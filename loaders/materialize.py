"""`load_quantized`: a converted checkpoint straight into a model, without a bf16 copy on the way.

Every format `quantize convert` writes loads: the diffusers-layout formats (sharded safetensors), ComfyUI's
(one safetensors file) and GGUF (one ``.gguf``), in either naming. A checkpoint in the family's native names
(ComfyUI's and GGUF's files, or a converted original release) goes into the family's diffusers class through
the family's one name table, read the other way (`models.Family.names`); a checkpoint whose names are the
model's loads as it is. A checkpoint of several models (Wan2.2 A14B's two experts) loads each. A native tensor
that stacks several of the class's (a fused q/k/v projection, `models.Stack`) gives each Linear its rows' parts
as the format cuts them (`Format.cut_rows`): ranges of the parts that have the weight's rows (a view of the file
when the range is one), the whole of the parts that belong to the whole weight (a per-tensor scale, ComfyUI's
marker), a part made for the cut (an nf4 quant state of its shape).

1. The skeleton: a class is built from the checkpoint's config.json (an original release's config is made the
   diffusers class's by its family) with its parameters on the meta device (buffers it computes itself, such
   as rotary tables, are built for real); a module passed in is filled in place.
2. The match, before any data is read: every Linear whose checkpoint entry is in the format's parts
   is swapped for that format's module (`loaders.modules`), with the options its stored parts say (gguf's
   GGML type of that layer); every checkpoint key must land on a parameter, buffer or part of the model with
   the same shape (or the same but for size-1 dims, viewed to the model's: `models.same_but_size_one_dims`), and
   every parameter must be given; what the family carries (`Family.carried`: a release's VAE, buffers the class
   computes) is left out. Any mismatch is one `CheckpointMismatchError` naming the key.
3. The data, module group by module group (the layers outside the blocks, then block by block):
   each tensor is taken from the safetensors file as the `host` mode says (a memory-map view, a
   pageable read, a pinned read) and assigned, or copied straight to `device`. Nothing else holds it,
   so the host peak is what stays resident, never twice it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from quantize import dtypes
from quantize.errors import InputError
from quantize.formats import (
    Format,
    FormatOptions,
    UnsupportedShapeError,
    format_for,
    format_of_config,
    quantized_parts,
)
from quantize.formats.base import RowCut
from quantize.models import (
    FAMILIES,
    BlockNames,
    Family,
    Split,
    Stack,
    component_family,
    family_of,
    same_but_size_one_dims,
    stack_rows,
)
from quantize.models.meta import parameters_on_meta
from quantize.read.checkpoint import (
    CONFIG_NAME,
    Component,
    TensorInfo,
    join_pieces,
    open_component,
    read_tensor,
)
from quantize.read.files import config_class, read_json_object
from quantize.read.gguf import open_gguf_component
from quantize.run.names import class_names

from .blocks import find_blocks
from .host import TensorReader, remember_source
from .modules import COMPUTE, QuantizedLinear, module_for

__all__ = [
    "load_quantized",
    "CheckpointMismatchError",
    "find_component",
    "find_components",
    "parameters_on_meta",
]

_MODEL_FILES = ("*.safetensors", "*.gguf")


class CheckpointMismatchError(InputError):
    """The checkpoint does not fit the model: a key, shape or dtype names where."""


def _holds_model(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in _MODEL_FILES)


def find_components(checkpoint: Path) -> list[Path]:
    """The model folders of a checkpoint: `checkpoint` itself when it holds a model's files (safetensors or
    GGUF), else each subfolder holding them and a config.json; of a pipeline's folders, only its quantized models
    (those whose config.json declares a `quantization_config`: Wan2.2 A14B's two experts, not its VAE)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        what = (
            "a file: pass the folder holding it and its config.json" if checkpoint.is_file() else "not found"
        )
        raise InputError(f"{checkpoint}: {what}")
    if _holds_model(checkpoint):
        return [checkpoint]
    found = sorted(
        d for d in checkpoint.iterdir() if d.is_dir() and _holds_model(d) and (d / CONFIG_NAME).is_file()
    )
    if not found:
        raise InputError(f"{checkpoint}: no *.safetensors or *.gguf here or in a model subfolder")
    quantized = [d for d in found if _declares_quantization(d / CONFIG_NAME)]
    return quantized or found  # none quantized: each is refused by name when it is loaded


def _declares_quantization(config: Path) -> bool:
    try:
        return "quantization_config" in read_json_object(config)
    except InputError:
        return True  # an unreadable config is named when the folder is loaded


def find_component(checkpoint: Path) -> Path:
    """The component directory: `checkpoint` itself when it holds a model's files, else its one model subfolder."""
    found = find_components(checkpoint)
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise InputError(
            f"{checkpoint}: holds several models ({names}): pass the one to load, e.g. {found[0]}, "
            "or a model class to load each"
        )
    return found[0]


def open_model_files(folder: Path) -> Component:
    """One model's folder read (headers only): its GGUF file (with its companion: a vision tower's mmproj), or its
    safetensors shards; never both."""
    gguf, safetensors = sorted(folder.glob("*.gguf")), sorted(folder.glob("*.safetensors"))
    if gguf and safetensors:
        raise InputError(
            f"{folder}: holds both {gguf[0].name} and {safetensors[0].name}: one model a folder (move one out)"
        )
    return open_gguf_component(folder) if gguf else open_component(folder)


def load_quantized(
    model: type[nn.Module] | nn.Module,
    checkpoint: str | Path,
    host: str = "mmap",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    compute: str = "fast",
) -> nn.Module | dict[str, nn.Module]:
    """Build (or fill) `model` from a checkpoint written by `quantize convert`, ready for inference.

    model: a model class (built from the checkpoint's config.json, e.g. `WanTransformer3DModel`) or an
        `nn.Module` whose parameter names match the checkpoint's, or its family's other naming (filled in place).
    checkpoint: the component directory (``ckpt/transformer``, ``ckpt/high_noise_model``), or a checkpoint
        holding one model; with a class, a checkpoint holding several (``ckpt/`` of Wan2.2 A14B) loads each,
        returned as ``{folder name: model}`` in folder order.
    host: ``"mmap"`` (default: views of the files, paged in on use), ``"pageable"`` or ``"pinned"``.
    device: where the tensors go; None keeps them on the host as `host` says.
    dtype: cast the kept (unquantized) floating tensors to this dtype, except those of the model's
        ``_keep_in_fp32_modules`` (float32), as diffusers does; None keeps the stored dtypes (a GGUF file's
        F32 norms and biases come back in its kept Linears' dtype, the source's, as diffusers would hold
        them). Quantized parts always keep theirs.
    compute: ``"fast"`` (each scheme's kernel where the device has it and it beats decoding there: on the CPU
        int8's, not float8's emulated one), ``"kernel"`` (the kernel wherever it runs at all) or
        ``"dequantize"`` (every quantized layer decodes its weight to the input's dtype for the call: the eager
        reference, what `quantize verify --forward` computes).
    """
    if compute not in COMPUTE:
        raise ValueError(f"compute must be one of {COMPUTE}, got {compute!r}")
    device = torch.device(device) if device is not None else None
    TensorReader(host, device)  # checks `host` before anything is read
    folders = find_components(Path(checkpoint))
    if len(folders) > 1:
        if not isinstance(model, type):
            find_component(Path(checkpoint))  # the error: one module cannot take several models
        comps = [open_model_files(f) for f in folders]
        for comp in comps:  # every header and format checked before any model is built
            _runnable_format(comp)
        return {
            f.name: _load_one(model, comp, host, device, dtype, compute)
            for f, comp in zip(folders, comps, strict=True)
        }
    return _load_one(model, open_model_files(folders[0]), host, device, dtype, compute)


def _load_one(
    model: type[nn.Module] | nn.Module,
    comp: Component,
    host: str,
    device: torch.device | None,
    dtype: torch.dtype | None,
    compute: str,
) -> nn.Module:
    reader = TensorReader(host, device)
    fmt = _runnable_format(comp)
    family = component_family(comp)
    if isinstance(model, type):
        model = _skeleton(model, comp, family)
    elif not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module class or instance, got {type(model).__name__}")
    if family is None:
        _check_names_of_no_family(model, comp)
    names = _checkpoint_names(model, comp, family)
    if family is not None:  # a release's other parts (its VAE), buffers the class computes: not the model's
        comp = replace(comp, tensors={k: t for k, t in comp.tensors.items() if not family.carried(k)})
    tied = _tied(model)
    plan = _match(model, comp, fmt, names, tied)
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype is None:
        dtype = _source_dtype(plan, fmt)
    for group in _groups(model, plan):
        _materialize(model, group, reader, dtype, keep_fp32, compute)
    _retie(model, tied)
    _finish(model, device)
    return model


def _runnable_format(comp: Component) -> Format:
    """The checkpoint's format, which a module here must run (else one line naming it, before anything is built)."""
    fmt = _checkpoint_format(comp)
    try:
        module_for(fmt)
    except InputError as e:
        raise InputError(f"{comp.dir}: {e}") from None
    return fmt


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


def _skeleton(cls: type[nn.Module], comp: Component, family: Family | None) -> nn.Module:
    config = {k: v for k, v in comp.config.items() if k != "quantization_config"}
    if family is not None:
        _check_class(cls, comp, family)
        if config_class(config) in family.native_classes and _is_class(cls, family.diffusers_class):
            config = family.diffusers_config(config, comp.tensors, comp.dir)
    try:
        with parameters_on_meta():
            if family is not None and cls.__name__ == family.diffusers_class:
                return family.build_model(config)  # its class as the family builds it (transformers' config)
            if hasattr(cls, "from_config"):
                return cls.from_config(config)
            return cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    except (TypeError, ValueError) as e:
        raise InputError(
            f"{comp.config_path}: cannot build {cls.__name__} from it ({e}): pass the model class the "
            "checkpoint was converted from, or an instance to fill"
        ) from None


def _is_class(cls: type, name: str) -> bool:
    """Whether `cls` is the class called `name`, or a subclass of it."""
    return any(c.__name__ == name for c in cls.__mro__)


def _check_names_of_no_family(model: nn.Module, comp: Component) -> None:
    """A checkpoint no family knows (by its config's class or its names) cannot be a known family's model."""
    own = family_of(None, model.state_dict().keys())
    if own is not None:
        cls = config_class(comp.config)
        known = ", ".join(f.title for f in FAMILIES)
        raise CheckpointMismatchError(
            f"{comp.dir}: its config names {cls!r} and its tensor names (e.g. {next(iter(comp.tensors))!r}) are "
            f"of no model family this tool knows ({known}); the model is a {own.title} model: is this the "
            "checkpoint converted from it?"
        )


def _check_class(cls: type, comp: Component, family: Family) -> None:
    """Refuse another family's diffusers class for this family's checkpoint, naming both."""
    for other in FAMILIES:
        if other is not family and _is_class(cls, other.diffusers_class):
            raise CheckpointMismatchError(
                f"{comp.dir}: a {family.title} checkpoint ({config_class(comp.config)}); {cls.__name__} "
                f"is a {other.title} model: pass {family.diffusers_class}"
            )


# -- 2. the match -----------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class _Names:
    """The checkpoint's name of each of the model's tensors: the same, or through the family's name table."""

    rename: Callable[[str], str | None]  # model tensor name -> checkpoint name (None: it has none)
    why: str  # what the renaming is, for messages ("" when the names are the model's)
    #: model tensor name -> the checkpoint tensor stacking it (None: not stacked), and that one's `Stack`
    stacked_into: Callable[[str], str | None] = lambda key: None
    stack_of: Callable[[str], Stack | None] = lambda key: None
    #: model tensor name -> the checkpoint tensors it was cut into, each with its `Split` (None: not cut)
    cut_into: Callable[[str], dict[str, Split] | None] = lambda key: None

    def key(self, model_key: str, comp: Component) -> str:
        key = self.rename(model_key)
        if key is None:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {model_key!r} has no name in {self.why}: the model does not fit the checkpoint"
            )
        return key

    def module(self, name: str, comp: Component) -> str:
        """The checkpoint's name of the Linear `name` (its weight's name, less ``.weight``)."""
        return self.key(f"{name}.weight", comp)[: -len(".weight")]


_SAME = _Names(lambda key: key, "")


def _checkpoint_names(model: nn.Module, comp: Component, family: Family | None) -> _Names:
    """How the model's tensor names become the checkpoint's: the family's names of the class's parameters first
    (`Family.parameter_names` read backwards: Gemma 3's class holds the stored ``language_model.model.`` as
    ``model.language_model.``), then `_stored_names`."""
    if family is None:
        return _stored_names(model.state_dict(), comp, family)
    to_family = _family_names(model, comp, family)
    names = _stored_names([to_family.get(k, k) for k in model.state_dict()], comp, family)
    if all(k == v for k, v in to_family.items()):
        return names
    return _Names(
        lambda key: names.rename(to_family.get(key, key)),
        names.why or f"the names {family.title}'s checkpoints store",
        lambda key: names.stacked_into(to_family.get(key, key)),
        names.stack_of,
        lambda key: names.cut_into(to_family.get(key, key)),
    )


def _family_names(model: nn.Module, comp: Component, family: Family) -> dict[str, str]:
    """The model's tensor name -> the family's name of it, for each the checkpoint may hold: its stored names,
    read as the family's (through the GGUF or native table where they are those), and the weights a quantized
    Linear's parts hang from (`<module>.weight_scale`: `<module>.weight`)."""
    tables = [t for t in (family.plan.gguf_names, family.names) if t is not None]
    stored = list(comp.tensors)
    candidates = {*stored, *(f"{n.rpartition('.')[0]}.weight" for n in stored if "." in n)}
    candidates |= {d for t in tables for n in list(candidates) if (d := _family_name(t, n)) is not None}
    own = set(model.state_dict())
    return {param: name for name, param in family.parameter_names(sorted(candidates)).items() if param in own}


def _family_name(table: BlockNames, stored: str) -> str | None:
    """The family's name of a stored tensor: through `table`, or the one it was cut from (`BlockNames.cut_from`)."""
    cut = table.cut_from(stored)
    return table.diffusers(stored) if cut is None else cut[0]


def _stored_names(own_names: Iterable[str], comp: Component, family: Family | None) -> _Names:
    """How the class's tensor names (`own_names`, the family's names of them) become the checkpoint's: unchanged
    when both follow one naming, else through the family's name table (a diffusers model from a native
    checkpoint: ComfyUI's, GGUF's; or the reverse)."""
    gguf = None if family is None else family.plan.gguf_names
    if gguf is not None and all(_family_name(gguf, n) is not None for n in comp.tensors):
        arch = family.plan.gguf_architecture
        why = f"llama.cpp's {arch} names, which the checkpoint (a GGUF file) has"
        return _Names(gguf.native, why, cut_into=gguf.splits)
    if family is None or family.names is None:
        return _SAME
    stored = family.naming(comp.tensors)
    own = family.naming(own_names)
    if stored == own or stored not in ("native", "diffusers") or own not in ("native", "diffusers"):
        return _SAME
    if stored == "native":
        return _native_names(family, list(comp.tensors))
    return _Names(
        family.diffusers_name, f"diffusers' {family.diffusers_class} names, which the checkpoint has"
    )


def _native_names(family: Family, stored: list[str]) -> _Names:
    """A native checkpoint's names read through the map a forward pass reads them through (`class_names`): the
    class's tensor -> the checkpoint's tensor that is it, or the stacked one it is rows of. A release may hold apart
    what the native table stacks (a fused projection's parts, each under its own name); a model tensor the
    checkpoint lacks keeps the table's name, for the message."""
    stored = [n for n in stored if not family.carried(n)]  # no part of the class (`_load_one`)
    # a quantized weight is stored as parts hanging from its module (`<module>.<part>`: no `<module>.weight`)
    weights = {f"{'.'.join(p[:i])}.weight" for n in stored if (p := n.split(".")) for i in range(1, len(p))}
    native = class_names(family, [*weights, *stored])

    def stacked_into(key: str) -> str | None:
        return native.stacked.get(key) or (None if key in native.stored else family.names.stacked_into(key))

    return _Names(
        lambda key: native.stored.get(key) or family.native_name(key),
        f"{family.title}'s native names, which the checkpoint has",
        stacked_into,
        lambda key: native.stacks.get(key) or family.names.native_stack(key),
    )


def _tied(model: nn.Module) -> dict[str, str]:
    """Each parameter that is another's (tied: one tensor under two names, as transformers ties an output head to
    its token embedding) -> the name it has first: the checkpoint stores it once, under that name."""
    first: dict[int, str] = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def _retie(model: nn.Module, tied: Mapping[str, str]) -> None:
    """Tie again what `_tied` found: each loaded parameter's other names given the loaded tensor."""
    for name, source in tied.items():
        owner, _, attr = name.rpartition(".")
        src_owner, _, src_attr = source.rpartition(".")
        model.get_submodule(owner)._parameters[attr] = model.get_submodule(src_owner)._parameters[src_attr]


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
