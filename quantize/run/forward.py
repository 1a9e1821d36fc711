"""One forward pass of a model whose weights are read layer by layer: `verify --forward` and `sensitivity`.

A component is run as its model family's diffusers class (`models.Family.diffusers_class`), found by the class
its config names; a model of the family's original release (`Family.native_classes`) is run as that class too, its
config derived from the original one and the tensor shapes (`Family.diffusers_config`), its tensors renamed
through the family's one name table as the loader renames them (`names.class_names`), once the family has refused
what its class lacks (`models.runnable_names`). A stacked tensor (a native fused projection,
`models.runnable_stacks`; or one a conversion stacks from diffusers' separate ones, `read.StackedSource`) is cut
into the class's parameters by row ranges (`Runnable.rows`); a tensor stored with other size-1 dimensions than its
parameter is viewed to its shape (`models.same_but_size_one_dims`); the carried ones (`Family.carried`) are no part
of the class and left out.

The model is built with every parameter on the meta device (`models.meta.parameters_on_meta`). A forward
pass (`StreamedModel.forward`) is given where each parameter's float32 values come from (`Weights`): the
source as the plan reads it (every step applied), a stored checkpoint decoded by its format, or the
source encoded and decoded at other types (`sensitivity`). Each unit (every module with parameters of its
own: a Linear, a norm, a block's modulation table) gets its values just before it runs and gives them back
right after, so a pass holds one layer in float32 plus the activations: far less than one block (the 14B
shape's largest Linear, its time projection, is 0.63 GB in float32), on the CPU.

The inputs are fixed random tensors shaped from the config (the family's `ModelInputs.random`, seed 0), or real ones
from a safetensors file (`load_inputs`: latents, timestep and text embeddings captured from a pipeline).

A pass is of the weights alone (each Linear sees its input as it is, in float32): what `verify --forward` proves. With
`quantized_inputs` as its hooks, each quantized Linear whose runtime quantizes its input (ComfyUI's FP8 and NVFP4
layers) sees it as that runtime would: with its static input scale (`convert --calibrate`) or the call's own.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import dtypes
from ..encode import row_chunks
from ..errors import InputError
from ..formats import Format, format_for
from ..models import (
    FAMILIES,
    Family,
    ModelInputs,
    family_of,
    family_of_class,
    runnable_names,
    same_but_size_one_dims,
    stack_rows,
)
from ..plan import ComponentPlan, TensorPlan
from ..process import release_free_memory
from ..read.checkpoint import CONFIG_NAME, Component, read_rows, read_tensor
from ..read.files import config_class
from ..read.source import SourceFolder
from ..read.tensor_source import SlicedSource, StackedSource
from ..recipes import Recipe
from .names import class_names

__all__ = [
    "Runnable",
    "StreamedModel",
    "Weights",
    "runnable",
    "load_inputs",
    "check_forward",
    "forward_sqnr_db",
    "named_failure",
    "quantized_inputs",
    "require_known_models",
    "source_weights",
    "stored_weights",
    "DEFAULT_MIN_FORWARD_SQNR_DB",
]

DEFAULT_MIN_FORWARD_SQNR_DB = 20.0


# --- inputs ----------------------------------------------------------------------------------------


def _check_input_names(path: Path, family: Family) -> None:
    """The tensor names of the inputs file `path` (its header only) are all inputs of `family`'s class."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:
            names = list(f.keys())
    except (OSError, SafetensorError) as e:
        raise InputError(f"{path}: cannot read the inputs as safetensors: {e}") from None
    accepts = family.inputs.accepts
    for key in names:
        if key not in accepts:
            raise InputError(
                f"{path}: tensor {key!r} is not an input of this model (a {family.diffusers_class} forward takes "
                f"{', '.join(accepts)})"
            )


def load_inputs(path: Path | None, family: Family, config: dict) -> dict[str, torch.Tensor]:
    """The tensors of one forward pass of `family`'s diffusers class built from `config`: from the safetensors
    file `path` (floating ones as float32), or the fixed random ones (seed 0) when `path` is None. A missing or
    unknown key, or a tensor of the wrong rank or shape, is an `InputError` naming it."""
    spec = family.inputs
    keys = spec.keys(config)
    if path is None:
        return spec.random(config, torch.Generator().manual_seed(0))
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (OSError, SafetensorError) as e:
        raise InputError(f"{path}: cannot read the inputs as safetensors: {e}") from None
    expected = f"a {family.diffusers_class} forward takes {', '.join(keys)}"
    for key in tensors:
        if key not in keys:
            raise InputError(f"{path}: tensor {key!r} is not an input of this model ({expected})")
    for key in keys:
        if key not in tensors:
            raise InputError(f"{path}: no tensor {key!r} ({expected})")
    for key, want in spec.shapes(config).items():
        _check_input_shape(path, key, tuple(tensors[key].shape), want, family)
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def _check_input_shape(
    path: Path, key: str, shape: tuple[int, ...], wants: tuple[tuple[int | None, ...], ...], family: Family
) -> None:
    def fits(want: tuple[int | None, ...]) -> bool:
        return len(shape) == len(want) and all(w is None or w == d for d, w in zip(shape, want, strict=True))

    if any(fits(want) for want in wants):
        return
    wanted = " or ".join("[" + ", ".join("*" if w is None else str(w) for w in want) + "]" for want in wants)
    raise InputError(
        f"{path}: tensor {key!r} has shape {list(shape)}; this {family.diffusers_class} takes {key} of shape "
        f"{wanted} (* any size)"
    )


# --- which model runs a component ------------------------------------------------------------------


@dataclass(frozen=True)
class Runnable:
    """A component as a model we can run: its family, the diffusers class's config, and the plan of each
    parameter (by the class's parameter names)."""

    family: Family
    config: dict
    plans: dict[str, TensorPlan]  # model parameter name -> the planned source tensor
    #: model parameter name -> the row ranges of its planned tensor that are it, in order (a stacked tensor's
    #: share); a parameter not here is its whole tensor
    rows: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    #: model parameter name -> the planned tensors the conversion cut it into (`read.SlicedSource`: a fused
    #: qkv's thirds, a Conv3d's taps), in order: joined again for a pass, and no entry of `plans`
    cuts: dict[str, tuple[TensorPlan, ...]] = field(default_factory=dict)

    @property
    def parameters(self) -> list[str]:
        """Every model parameter it gives values of."""
        return [*self.plans, *self.cuts]

    def joined(self, name: str, value: Callable[[TensorPlan], torch.Tensor]) -> torch.Tensor:
        """Cut parameter `name`'s values, from each of its planned tensors' (`value`)."""
        pieces = self.cuts[name]
        return SlicedSource.join([tp.source for tp in pieces], [value(tp) for tp in pieces])

    def cut(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """Parameter `name`'s values out of its whole planned tensor's (`whole`)."""
        ranges = self.rows.get(name)
        if ranges is None:
            return whole
        return (
            torch.cat([whole[a:b] for a, b in ranges])
            if len(ranges) > 1
            else whole[ranges[0][0] : ranges[0][1]]
        )

    @property
    def class_name(self) -> str:
        return self.family.diffusers_class

    @property
    def inputs(self) -> ModelInputs:
        return self.family.inputs


def _runnable_family(config: dict | None, where: Path, names: Iterable[str] = ()) -> Family:
    """The family whose diffusers class (or original release) `config` names, or, where it names no class (a
    release without config.json), the family of the tensor `names`; `InputError` otherwise."""
    name = config_class(config)
    # a class no family is registered by runs nothing; one that is, by the family that owns the model's names too
    family = family_of(name, names) if name is None or family_of_class(name) is not None else None
    if family is None:
        runs = ", ".join(
            f"{f.diffusers_class}{''.join(f' / {n}' for n in f.native_classes)}" for f in FAMILIES
        )
        raise InputError(f"{where / CONFIG_NAME}: a forward pass runs {runs}; this config names {name!r}")
    return family


def require_known_models(source: SourceFolder, inputs: Path | None = None) -> None:
    """Refuse a forward pass up front (headers only) when a component is not a model we can run, or when the
    `inputs` file holds a tensor no pass of it takes (what each pass needs is checked by `load_inputs`)."""
    families = {}
    for rel in source.components:
        component = source.component(rel)
        family = _runnable_family(component.config, component.dir, component.tensors)
        if config_class(component.config) != family.diffusers_class:
            runnable_names(family, list(component.tensors), component.dir)
        families[family.name] = family
    if inputs is not None:
        for name in sorted(families):
            _check_input_names(inputs, families[name])
    for library in sorted({f.detection.library for f in families.values()}):
        try:
            importlib.import_module(library)
        except ImportError:
            raise InputError(
                f"a forward pass needs {library}: pip install 'dit-quantize[{library}]'"
            ) from None


def runnable(cp: ComponentPlan) -> Runnable:
    """How to run the component `cp` plans; `InputError` naming the config or tensor when we cannot."""
    config = {k: v for k, v in (cp.component.config or {}).items() if k != "quantization_config"}
    where = cp.component.dir
    family = _runnable_family(config, where, cp.component.tensors)
    plans: dict[str, TensorPlan] = {}
    rows: dict[str, tuple[tuple[int, int], ...]] = {}
    cuts: dict[str, list[TensorPlan]] = {}  # a source tensor the conversion cut into several -> its pieces
    for tp in cp.tensors:
        if isinstance(tp.source, SlicedSource):
            cuts.setdefault(tp.source.base.info.name, []).append(tp)
    whole = [tp for tp in cp.tensors if not isinstance(tp.source, SlicedSource)]
    if config_class(config) == family.diffusers_class:
        for tp in whole:
            if isinstance(tp.source, StackedSource):  # diffusers' tensors, stacked by the conversion
                for name, ranges in _segment_rows(tp.source).items():
                    plans[name], rows[name] = tp, ranges
            elif not family.carried(tp.name):  # a text encoder's tokenizer is no part of the class
                plans[tp.name] = tp
        return Runnable(family, config, plans, rows, _in_order(cuts))
    names = [*(tp.name for tp in whole), *cuts]
    runnable_names(family, names, where)  # the family refuses what its class lacks, naming the tensor
    native = class_names(family, names)
    for tp in whole:
        if tp.name in native.stacks:  # a native fused tensor: the class's tensors are its row ranges
            for name, ranges in stack_rows(native.stacks[tp.name], tp.source.rows).items():
                plans[name], rows[name] = tp, ranges
        elif tp.name in native.renamed:  # not carried (a release's VAE is no part of the class)
            plans[native.renamed[tp.name]] = tp
    joined = {
        native.renamed[name]: pieces for name, pieces in _in_order(cuts).items() if name in native.renamed
    }
    config = family.diffusers_config(config, cp.component.tensors, where)
    return Runnable(family, config, plans, rows, joined)


def _in_order(cuts: dict[str, list[TensorPlan]]) -> dict[str, tuple[TensorPlan, ...]]:
    """Each cut tensor's pieces in the order they join (`SlicedSource.start`)."""
    return {name: tuple(sorted(pieces, key=lambda tp: tp.source.start)) for name, pieces in cuts.items()}


def _segment_rows(source: StackedSource) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each stacked tensor -> the row ranges of the stack that hold it, in its own row order."""
    found: dict[str, list[tuple[int, int, int]]] = {}
    at = 0
    for seg, r0, r1 in source.segments:
        found.setdefault(seg.info.name, []).append((r0, at, at + r1 - r0))
        at += r1 - r0
    return {name: tuple((a, b) for _, a, b in sorted(spans)) for name, spans in found.items()}


# --- where the values come from --------------------------------------------------------------------

#: model parameter name -> its float32 values for this pass
Weights = Callable[[str], torch.Tensor]


def float32_in_rows(shape: tuple[int, ...], read: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """A whole tensor in float32, `read(r0, r1)` giving its rows r0..r1 in float32, filled in row chunks: no
    other copy of it is made, in any dtype (the 14B shape's time projection is 0.63 GB in float32)."""
    if not shape:
        return read(0, 1)
    out = torch.empty(shape, dtype=torch.float32)
    rows = shape[0]
    for r0, r1 in row_chunks(rows, out.numel() // max(1, rows)):
        out[r0:r1] = read(r0, r1)
    return out


def source_weights(run: Runnable) -> Weights:
    """The source as the plan reads it (every step applied): the reference."""

    def whole(tp: TensorPlan) -> torch.Tensor:
        return float32_in_rows(tp.info.shape, lambda r0, r1: tp.source.read_rows(r0, r1, torch.float32))

    def weight(name: str) -> torch.Tensor:
        if name in run.cuts:
            return run.joined(name, whole)
        source = run.plans[name].source
        shape = source.info.shape
        ranges = run.rows.get(name)
        if ranges is None:
            return float32_in_rows(shape, lambda r0, r1: source.read_rows(r0, r1, torch.float32))
        parts = [
            float32_in_rows(
                (b - a, *shape[1:]), lambda r0, r1, a=a: source.read_rows(a + r0, a + r1, torch.float32)
            )
            for a, b in ranges
        ]
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    return weight


def whole_then_cut(run: Runnable, whole: Callable[[TensorPlan], torch.Tensor]) -> Weights:
    """Parameters from `whole(tp)`, each planned tensor's values in float32, cut to each parameter's rows; the
    last one kept, since a stacked tensor's parameters are asked for one after another (q, k, v)."""
    last: list = [None, None]

    def weight(name: str) -> torch.Tensor:
        if name in run.cuts:
            return run.joined(name, whole)
        tp = run.plans[name]
        if last[0] is not tp:
            last[:] = [tp, None]  # the previous one freed first
            last[1] = whole(tp)
        values = run.cut(name, last[1])
        if name not in run.rows:
            last[:] = [None, None]  # a whole tensor is not asked for twice: not kept
        return values

    return weight


def stored_weights(run: Runnable, stored: Component, fmt: Format) -> Weights:
    """A converted checkpoint's tensors decoded by its format (kept ones as stored), under the model's names."""

    def whole(tp: TensorPlan) -> torch.Tensor:
        if not tp.quantize:
            info = stored.tensors[tp.output().name]
            return float32_in_rows(info.shape, lambda r0, r1: read_rows(info, r0, r1, torch.float32))
        parts = {
            part: read_tensor(stored.tensors[spec.name])
            for part, spec in zip(tp.parts, tp.outputs, strict=True)
        }
        return format_for(fmt, tp.options).decoded(parts, tp.info.shape, torch.float32, options=tp.options)

    return whole_then_cut(run, whole)


def as_stored(tp: TensorPlan) -> torch.Tensor:
    """A kept tensor's values as the output holds them (cast to its output dtype), in float32: read straight
    into float32 when the output keeps the stored dtype (exact), else through the output dtype's rounding."""
    dtype = dtypes.by_name(tp.output().dtype).torch
    exact = dtype == dtypes.by_name(tp.info.dtype).torch or dtype == torch.float32
    return float32_in_rows(
        tp.info.shape,
        lambda r0, r1: tp.source.read_rows(r0, r1, torch.float32 if exact else dtype).float(),
    )


#: what `StreamedModel.forward` calls with a named Linear and its input: None, or the input to take instead
LinearHook = Callable[[torch.nn.Module, torch.Tensor], "torch.Tensor | None"]


def quantized_inputs(run: Runnable, fmt: Format, static: bool = True) -> dict[str, LinearHook]:
    """Hooks that give each quantized Linear of `run` its input as its format's runtime quantizes it
    (`Format.quantized_input`: ComfyUI's FP8 and NVFP4 layers; the others' inputs stay as they are): with the
    tensor's static input scale where `static` and the plan gives one, else each call's own (dynamic) scale."""
    hooks = {}
    for param, tp in run.plans.items():
        if not tp.quantize:
            continue
        layer_fmt, options = format_for(fmt, tp.options), tp.options

        def hook(module, x, layer_fmt=layer_fmt, options=options):
            rows = x.reshape(-1, x.shape[-1]).float()
            q = layer_fmt.quantized_input(rows, options, static)
            return None if q is None else q.reshape(x.shape).to(x.dtype)

        hooks[param.removesuffix(".weight")] = hook
    return hooks


# --- the streamed model ----------------------------------------------------------------------------


class StreamedModel:
    """A model whose parameters live on the meta device and are filled unit by unit during a pass."""

    def __init__(self, run: Runnable):
        from torch import nn

        from ..models.meta import parameters_on_meta

        self.run = run
        try:
            with parameters_on_meta():
                self.model = run.family.build_model(run.config).eval()
        except (TypeError, ValueError, KeyError) as e:
            raise InputError(f"cannot build {run.class_name} from the component's config: {e}") from None
        #: the plan's tensor -> the class's parameter it fills (`Family.parameter_names`), and back
        self.param_of = run.family.parameter_names(run.parameters)
        self.plan_of = {param: name for name, param in self.param_of.items()}
        names = {n for n, _ in self.model.named_parameters()}
        # the persistent buffers a checkpoint may store (Gemma 4's layer scalars): filled for the whole pass
        stored_buffers = set(self.model.state_dict()) - names
        missing = sorted(names - set(self.plan_of))
        unexpected = sorted(n for n, p in self.param_of.items() if p not in names and p not in stored_buffers)
        if missing or unexpected:
            what = (
                f"no tensor for parameter {missing[0]!r}"
                if missing
                else f"tensor {unexpected[0]!r} is no parameter"
            )
            raise InputError(f"{run.class_name} built from the config does not match the checkpoint: {what}")
        #: each unit: (prefix, module), every module with parameters of its own (a Linear, a norm, a block's
        #: modulation table); a pass fills a unit's own parameters just before it runs, empties them right after
        self.units: list[tuple[str, nn.Module]] = [
            (name, m)
            for name, m in self.model.named_modules()
            if name and any(True for _ in m.parameters(recurse=False))
        ]
        #: the root's own parameters (a top-level modulation table, say), held for the whole pass
        self.root_params = [n for n, _ in self.model.named_parameters(recurse=False)]
        #: the checkpoint's buffers of the class, set for the whole pass
        self.buffers = [p for p in self.plan_of if p in stored_buffers]

    def forward(
        self,
        inputs: dict[str, torch.Tensor],
        weights: Weights,
        linear_hooks: Mapping[str, LinearHook] = {},
    ) -> torch.Tensor:
        """One pass on `inputs` with the values `weights` gives (by the plan's tensor names);
        `linear_hooks[name](module, x)` sees the input of the Linear whose weight is the plan's ``<name>.weight``
        while its weight is filled, and the Linear takes the tensor it returns instead, if any. Returns the output
        in float32."""
        handles = []
        filler = _Filler(lambda param: weights(self.plan_of[param]))
        try:
            for prefix, unit in self.units:
                handles.append(unit.register_forward_pre_hook(filler.pre_hook(prefix, unit)))
                handles.append(unit.register_forward_hook(filler.post_hook))
            modules = dict(self.model.named_modules())
            for name, hook in linear_hooks.items():
                module = modules[self.param_of[f"{name}.weight"].removesuffix(".weight")]
                handles.append(module.register_forward_pre_hook(lambda m, args, h=hook: h(m, args[0])))
            for name in self.root_params:
                _set(self.model, name, weights(self.plan_of[name]))
            for name in self.buffers:
                owner, _, attr = name.rpartition(".")
                target = self.model.get_submodule(owner) if owner else self.model
                held = target._buffers[attr]
                target._buffers[attr] = weights(self.plan_of[name]).reshape(held.shape).to(held.dtype)
            spec = self.run.inputs
            runs = self.model.get_submodule(spec.module) if spec.module else self.model
            with torch.no_grad():
                out = runs(**spec.call(self.run.config, inputs))
            return (out[0] if isinstance(out, (tuple, list)) else out).float()
        finally:
            for h in handles:
                h.remove()
            _empty(self.model)


#: float32 bytes filled between two returns of the allocator's free pages to the kernel
TRIM_EVERY = 256 << 20


class _Filler:
    """Fills a unit's own parameters before it runs and empties them after; every `TRIM_EVERY` bytes given
    out, the memory they and the layers' temporaries took goes back to the kernel
    (`process.release_free_memory`: else the allocator's heaps grow layer after layer)."""

    def __init__(self, weights: Weights):
        self.weights = weights
        self.since_trim = 0

    def pre_hook(self, prefix: str, unit):
        def hook(module, args):
            for name, _ in list(unit.named_parameters(recurse=False)):
                value = self.weights(f"{prefix}.{name}")
                self.since_trim += value.nbytes
                _set(unit, name, value)

        return hook

    def post_hook(self, module, args, out) -> None:
        _empty(module, recurse=False)
        if self.since_trim >= TRIM_EVERY:
            release_free_memory()
            self.since_trim = 0


def _set(module, name: str, value: torch.Tensor) -> None:
    """Parameter `name` of `module` filled with `value`, viewed to the parameter's shape where the two differ by
    size-1 dimensions only (`models.same_but_size_one_dims`: a release's [1, C, 1, 1] bias of a [C] one)."""
    owner, _, attr = name.rpartition(".")
    target = module.get_submodule(owner) if owner else module
    shape = target._parameters[attr].shape
    if value.shape != shape and same_but_size_one_dims(value.shape, shape):
        value = value.reshape(shape)
    target._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)


def _empty(module, recurse: bool = True) -> None:
    """Give every parameter of `module` (its own only, unless `recurse`) back: meta again, its memory freed."""
    for sub in module.modules() if recurse else (module,):
        for attr, p in sub._parameters.items():
            if p is not None and not p.is_meta:
                sub._parameters[attr] = torch.nn.Parameter(p.to("meta"), requires_grad=False)


def forward_sqnr_db(want: torch.Tensor, got: torch.Tensor) -> float:
    """10·log10(|want|² / |want - got|²) in float64; inf when they are equal."""
    want, got = want.double(), got.double()
    noise = float((want - got).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(want.pow(2).sum()) / noise)


# --- verify --forward ------------------------------------------------------------------------------


def check_forward(
    plan, checkpoint: Path, recipe: Recipe, fmt: Format, report, inputs: Path | None = None
) -> None:
    """Record one `forward/output SQNR` check per component of `plan` (the source's plan under `recipe`): one
    streamed pass of the source and one of the stored checkpoint, on the same inputs. Where the plan has static
    input scales (`convert --calibrate`), two more passes of the checkpoint, its inputs quantized as the runtime
    does with a dynamic scale and with the static ones, give figures beside the check's (``inputs_quantized``)."""
    from ..containers import get_container
    from ..formats import format_info

    threshold = recipe.checks.min_forward_sqnr_db
    threshold = DEFAULT_MIN_FORWARD_SQNR_DB if threshold is None else threshold
    container = get_container(format_info(fmt.NAME).container)
    for cp in plan.components:
        run = runnable(cp)
        x = load_inputs(inputs, run.family, run.config)  # a bad inputs file is unusable input, not a check
        try:
            with named_failure(inputs):
                model = StreamedModel(run)
                want = model.forward(x, source_weights(run))
                stored = stored_weights(run, container.open_stored(checkpoint, cp.rel), fmt)
                got = model.forward(x, stored)
                quantized = None
                if any(tp.options.input_scale is not None for tp in run.plans.values()):
                    quantized = [
                        forward_sqnr_db(want, model.forward(x, stored, quantized_inputs(run, fmt, static)))
                        for static in (False, True)
                    ]
            sqnr = forward_sqnr_db(want, got)
        except InputError as e:
            report.fail("forward", "output SQNR", f"{cp.rel}: {e}")
            continue
        ok = sqnr >= threshold
        message = f"{cp.rel}: {run.class_name} forward output SQNR {sqnr:.2f} dB below min_forward_sqnr_db {threshold}"
        report.record("forward", "output SQNR", ok, "" if ok else message)
        report.forward[cp.rel] = {
            "model": run.class_name,
            "output_sqnr_db": None if math.isinf(sqnr) else round(sqnr, 3),  # None: identical outputs
            "min_forward_sqnr_db": threshold,
        }
        if quantized is not None:
            report.forward[cp.rel]["inputs_quantized"] = {
                f"{kind}_sqnr_db": None if math.isinf(db) else round(db, 3)
                for kind, db in zip(("dynamic", "static"), quantized, strict=True)
            }


@contextmanager
def named_failure(inputs: Path | None = None) -> Iterator[None]:
    """A model that will not run on the inputs: one `InputError` with the reason (and the inputs file)."""
    try:
        yield
    except InputError:
        raise
    except Exception as e:  # the model's own code: shapes that do not fit, a class it does not know
        on = f" on the inputs {inputs}" if inputs is not None else ""
        raise InputError(f"the forward pass{on} failed: {type(e).__name__}: {e}") from None
