"""The plan: what each source tensor becomes, computed from safetensors headers alone.

Rules (DESIGN.md "Recipes"): a tensor's *match key* is its module name (`names.module_name`: without a
trailing ``.weight``), matched against the recipe's patterns with `re.fullmatch`. A tensor hit by a
target and by no ignore pattern is quantized, and must then be a 2-D float Linear weight; every
pattern must match at least one key in every component.

The plan is where the pipeline's seams meet: each tensor's `TensorSource` (the only way its values are
read, with the steps that change it), its output keys (the format's parts under the output names of the
format's name table: `TensorPlan.outputs` is the one place output keys come from), and the format and
container that will encode and store it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import dtypes
from .errors import InputError
from .formats import (
    FORMATS,
    KEPT,
    NO_OPTIONS,
    Format,
    FormatOptions,
    UnfittedShapeError,
    UnsupportedShapeError,
    format_for,
    format_info,
    get_format,
    quantized_parts,
)
from .models import IDENTITY, Family, NameTable, Split, names_for
from .names import WEIGHT_SUFFIX, manifest_key, module_name
from .read.checkpoint import Component, TensorInfo, read_rows
from .read.source import SourceFolder, local_source
from .read.spiece import read_spiece_bytes, tokenizer_model_bytes
from .read.tensor_source import BytesSource, SlicedSource, StackedSource, TensorSource
from .recipes import Recipe
from .steps import TensorStep, check_order

__all__ = [
    "TensorSpec",
    "TensorPlan",
    "ComponentPlan",
    "Plan",
    "make_plan",
    "plan_component",
    "replanned",
    "with_input_scales",
    "KEEP_DTYPES",
    "LATE_MAX_BYTES",
]

#: recipe `keep_dtype` -> safetensors dtype name
KEEP_DTYPES = {name: dtypes.by_torch(getattr(torch, name)).name for name in ("bfloat16", "float32")}
#: The most bytes a late tensor may take; a plan counts each late tensor at this size.
LATE_MAX_BYTES = 1024


@dataclass(frozen=True)
class TensorSpec:
    """An output tensor as planned: its key, safetensors dtype name and shape (None: a late U8 blob whose length
    is known once it is encoded, see `containers.writer`)."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None

    @property
    def late(self) -> bool:
        return self.shape is None

    @property
    def nbytes(self) -> int:
        """Exact bytes; for a late tensor, the most it may take."""
        if self.shape is None:
            return LATE_MAX_BYTES
        return dtypes.nbytes(self.dtype, self.shape)


@dataclass(frozen=True)
class TensorPlan:
    """One source tensor: kept (copied or cast) or quantized, and the tensors it becomes.

    `outputs` are the output tensors by key, in the format's part order; `parts` names the format part each
    one is (``""`` for a kept tensor, which is one output).
    """

    source: TensorSource
    quantize: bool
    pattern: str | None  # the target that quantizes it, or the ignore pattern that keeps it
    output_name: str  # the tensor's name in the output (the format's name table applied)
    outputs: tuple[TensorSpec, ...]
    parts: tuple[str, ...]
    #: what the format's `parts`, `encode` and `decode` take besides the data (gguf's GGML type; none for a format
    #: with one encoding, and for a kept tensor), fitted to the tensor's shape (`Format.fitted`)
    options: FormatOptions = NO_OPTIONS
    #: why a tensor a target hits is kept all the same (no ConvRot group fits its width); None: it is not
    reason: str | None = None

    @property
    def qtype(self) -> str | None:
        """The format's type for this tensor (gguf's Q4_K, say), as the manifest records it; None: one encoding."""
        return self.options.type_name

    @property
    def info(self) -> TensorInfo:
        return self.source.info

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def module(self) -> str:
        """The source module name (what recipe patterns match): a piece's is the tensor it was cut from's."""
        return module_name(_source_name(self.source))

    @property
    def source_modules(self) -> tuple[str, ...]:
        """The source modules whose tensors it is: its own, a stacked tensor's parts' (`StackedSource`), or the one
        it was cut from (`SlicedSource`)."""
        if isinstance(self.source, StackedSource):
            return tuple(dict.fromkeys(module_name(s.info.name) for s, _, _ in self.source.segments))
        return (self.module,)

    @property
    def output_module(self) -> str:
        return module_name(self.output_name)

    def output(self, part: str = "") -> TensorSpec:
        """The output tensor of format part `part` (``""``: the kept tensor)."""
        return self.outputs[self.parts.index(part)]

    @property
    def output_bytes(self) -> int:
        return sum(s.nbytes for s in self.outputs)

    @property
    def is_linear_weight(self) -> bool:
        return _is_linear_weight(self.info)


@dataclass(frozen=True)
class ComponentPlan:
    component: Component
    tensors: tuple[TensorPlan, ...]  # source order
    pattern_matches: dict[str, int]  # pattern -> number of tensors whose match key it matches
    family: Family | None = None  # the model family of the component (None: one the tool does not know)
    #: a text encoder's tokenizer (a uint8 tensor: a source tensor, a file's bytes, or a model rebuilt from a
    #: tokenizer.json) that a format holding it as key-values writes there (`FormatInfo.tokenizer`,
    #: `models.family.Tokenizer`); None: none
    tokenizer: TensorSource | None = None

    @property
    def rel(self) -> str:
        return self.component.rel

    def quantized(self) -> Iterator[TensorPlan]:
        return (t for t in self.tensors if t.quantize)

    def kept_linears(self) -> list[str]:
        """Modules with a 2-D weight that stay in high precision (compressed-tensors' `ignore`), output names; and
        the class's tied Linears (`Family.tied_linears`) where the output holds, under the class's names, the tensor
        they are tied to: no checkpoint stores them, and no quantizer may take them."""
        kept = [t.output_module for t in self.tensors if not t.quantize and t.is_linear_weight]
        tied = {} if self.family is None else self.family.tied_linears
        outputs = {t.output_name for t in self.tensors}
        return kept + [m for m, to in tied.items() if to in outputs and m not in kept]

    def manifest_key(self, tp: TensorPlan) -> str:
        """How the manifest keys `tp`: its component and its output name."""
        return manifest_key(self.rel, tp.output_name)

    def carried_metadata(self) -> dict[str, str]:
        """The source files' ``__metadata__`` entries the family's runtimes read (`Carried.metadata`: LTX-2's
        ``config``, which ComfyUI builds the model and its VAEs from), in shard order: what every output file of
        the component carries (a safetensors file in its ``__metadata__``; a GGUF file as string key-values, which
        ComfyUI-GGUF hands ComfyUI as the file's metadata since its PR #399), after the entries the family writes
        whatever the source holds (`Carried.written`: Wan-Animate-2's ``config``)."""
        carried = None if self.family is None else self.family.plan.carried
        keys = () if carried is None else carried.metadata
        stored = {k: v for meta in self.component.metadata.values() for k, v in meta.items() if k in keys}
        return {**dict(() if carried is None else carried.written), **stored}

    def metadata_entries(self) -> list[tuple[str, tuple[int, ...] | None, FormatOptions | None]]:
        """(output tensor name, shape and options if quantized else None) of every tensor: what a format's file
        metadata is made from (`Format.checkpoint_metadata`)."""
        return [
            (t.output_name, *((t.info.shape, t.options) if t.quantize else (None, None)))
            for t in self.tensors
        ]

    @property
    def source_bytes(self) -> int:
        return sum(t.info.nbytes for t in self.tensors)

    @property
    def output_bytes(self) -> int:
        return sum(t.output_bytes for t in self.tensors)


@dataclass(frozen=True)
class Plan:
    source: Path
    recipe: Recipe
    components: tuple[ComponentPlan, ...]
    copied: tuple[Path, ...]  # other source files copied as they are (`copy_other_files`)

    @property
    def format(self) -> Format:
        return get_format(self.recipe.format)

    @property
    def container(self) -> str:
        """How each component's tensors become files (`quantize.containers`)."""
        return format_info(self.recipe.format).container

    @property
    def source_bytes(self) -> int:
        return sum(c.source_bytes for c in self.components)

    @property
    def output_bytes(self) -> int:
        return sum(c.output_bytes for c in self.components)

    @property
    def tensor_count(self) -> int:
        return sum(len(c.tensors) for c in self.components)


def _is_linear_weight(info: TensorInfo) -> bool:
    return info.name.endswith(WEIGHT_SUFFIX) and len(info.shape) == 2


def _first_match(patterns: list[re.Pattern], key: str) -> str | None:
    for p in patterns:
        if p.fullmatch(key):
            return p.pattern
    return None


def _kept_spec(
    info: TensorInfo, output_name: str, keep_dtype: str, fmt: Format, linear: bool | None = None
) -> TensorSpec:
    """A kept tensor's output: what the recipe's keep_dtype makes of it, as the format stores that (gguf has its
    own rule). `linear`: whether it is a Linear layer's weight (None: any 2-D weight is)."""
    dt = info.dtype
    if keep_dtype != "source" and dt in dtypes.FLOAT_SOURCE_DTYPES:
        dt = KEEP_DTYPES[keep_dtype]
    linear = _is_linear_weight(info) if linear is None else linear
    stored = fmt.kept_dtype(info.dtype, info.shape, linear, dt)
    if stored is None:
        raise InputError(
            f"{info.file}: tensor {info.name!r} is {info.dtype}, which this format's files cannot hold"
        )
    return TensorSpec(output_name, stored, info.shape)


def _check_quantizable(info: TensorInfo, pattern: str, where: str, linear: bool | None = None) -> None:
    if not (_is_linear_weight(info) if linear is None else linear):
        raise InputError(
            f"{where}: target '{pattern}' hits tensor {info.name!r} {info.dtype}{list(info.shape)}, which is not a 2-D "
            "Linear weight (biases, norms, modulation tables, convolutions and a family's plain weight parameters "
            "are never quantized): narrow the pattern"
        )
    if 0 in info.shape:
        raise InputError(
            f"{where}: tensor {info.name!r} {info.dtype}{list(info.shape)} is empty: there is nothing to quantize; "
            "narrow the pattern or add it to the recipe's ignore"
        )
    if info.dtype not in dtypes.FLOAT_SOURCE_DTYPES:
        raise InputError(
            f"{where}: tensor {info.name!r} is {info.dtype}; only F32, F16 and BF16 weights can be quantized "
            "(is this checkpoint already quantized?)"
        )


#: Parts other libraries store quantized weights as (ours come from the formats themselves).
_FOREIGN_PARTS = (
    "weight_zero_point",  # compressed-tensors
    "weight_packed",
    "weight_shape",
    "qweight",  # GPTQ / AWQ
    "qzeros",
    "SCB",  # bitsandbytes int8
    "weight.quant_state.bitsandbytes__fp4",
)
_PROBE_SHAPE = (64, 64)  # a Linear weight shape every format accepts


@functools.cache
def _quantized_part_suffixes() -> tuple[str, ...]:
    """``.weight_scale``, ``._weight_qdata``, ``.weight.absmax``, ...: what only a quantized checkpoint holds."""
    ours = {
        part
        for fmt in FORMATS.values()
        for part in quantized_parts(
            fmt, "m", _PROBE_SHAPE, fmt.fitted(fmt.options_type.choices()[0], _PROBE_SHAPE)
        )
    } - {"weight"}
    return tuple(sorted(f".{part}" for part in ours | set(_FOREIGN_PARTS)))


_ALREADY_QUANTIZED = (
    "this checkpoint is already quantized: convert from the original F32, F16 or BF16 weights"
)


def check_not_quantized(component: Component) -> None:
    """Refuse a quantized checkpoint as a source, told by its config, or by fp8, integer or quantized-part tensors
    (a Linear weight is always a float; other integer tensors are copied as they are)."""
    config = component.config or {}
    if "quantization_config" in config:
        qc = config["quantization_config"]
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        raise InputError(
            f"{component.config_path}: has a quantization_config ({method}): {_ALREADY_QUANTIZED}"
        )
    for info in component.tensors.values():
        if info.dtype.startswith("F8_"):
            what = f"is {info.dtype}"
        elif info.name.endswith(_quantized_part_suffixes()):
            what = f"({info.dtype}) is a part of a quantized weight"
        elif info.name.endswith(WEIGHT_SUFFIX) and info.dtype not in dtypes.FLOAT_DTYPES:
            what = f"is {info.dtype}, an integer weight"
        else:
            continue
        raise InputError(f"{info.file}: tensor {info.name!r} {what}: {_ALREADY_QUANTIZED}")


def plan_component(
    component: Component,
    recipe: Recipe,
    names: NameTable = IDENTITY,
    steps: Sequence[TensorStep] = (),
    family: Family | None = None,
) -> ComponentPlan:
    """Decide each tensor of `component`: its fate under `recipe`, its output keys (source names through
    `names`), and its source (stored values, then the transforms `steps` give it)."""
    check_not_quantized(component)
    fmt = get_format(recipe.format)
    held_as = format_info(recipe.format).tokenizer
    tokenizer = _tokenizer(component, family, held_as)
    targets = [re.compile(p) for p in recipe.targets]
    ignores = [re.compile(p) for p in recipe.ignore]
    typed = [(re.compile(p), t) for p, t in recipe.types.items()]
    matches = dict.fromkeys([*recipe.targets, *recipe.ignore, *recipe.types], 0)
    compiled = [re.compile(p) for p in matches]
    where = f"{component.where}"
    # a tokenizer the format holds as key-values is no tensor of its file; nor is a release file's tokenizer tensor
    # in a format that holds none (transformers' loaders read the model's tensors alone: torchao's fails on another)
    policy = None if family is None else family.plan.tokenizer
    dropped = tokenizer.info if held_as == "key_values" and tokenizer is not None else None
    if held_as is None and policy is not None:
        dropped = component.tensors.get(policy.tensor)
    infos = [i for i in component.tensors.values() if dropped is None or i is not dropped]
    names_in = [i.name for i in infos]
    stacks = names.stacker(names_in, where)
    stack_of = {n: out for out, stack in stacks.items() for n, _, _ in stack}
    splits = names.splitter(names_in, where)
    split_of: dict[str, list[str]] = {}
    for out, (n, _, _, _) in splits.items():
        split_of.setdefault(n, []).append(out)
    rename = names.renamer([n for n in names_in if n not in split_of], where)
    changes = [step.transforms_for(component.rel, component.tensors) for step in steps]

    def source_of(info: TensorInfo) -> TensorSource:
        return TensorSource(info, tuple(c[info.name] for c in changes if info.name in c))

    def fate(info: TensorInfo) -> tuple[str | None, str | None, str | None]:
        """(target, ignore pattern, type) of one source tensor, counting the patterns it matches."""
        key = module_name(info.name)
        for p in compiled:
            if p.fullmatch(key):
                matches[p.pattern] += 1
        target, ignored = _first_match(targets, key), _first_match(ignores, key)
        typed_as = next(((p.pattern, t) for p, t in typed if p.fullmatch(key)), None) if target else None
        if typed_as is not None and typed_as[1] == KEPT:  # `types` keeps it, as `ignore` would
            ignored, typed_as = ignored or typed_as[0], None
        return target, ignored, None if typed_as is None else typed_as[1]

    plans = []
    for info in infos:
        if info.name in split_of:  # planned once for each tensor cut from it, in the cut's order
            target, ignored, type_ = fate(info)
            if target is not None and ignored is None:
                raise InputError(
                    f"{where}: target '{target}' hits tensor {info.name!r}, which {names.description} write as "
                    f"{len(split_of[info.name])} tensors ({', '.join(split_of[info.name])}): a tensor cut into "
                    "several is kept as stored (its pieces are joined again to load and run it); narrow the pattern"
                )
            for out_name in split_of[info.name]:
                source = _split_source(source_of(info), splits[out_name], out_name, where)
                plans.append(_planned(source, out_name, target, ignored, type_, recipe, fmt, family, where))
            continue
        if info.name in stack_of:  # planned once, where its stack's first tensor is
            out_name = stack_of.pop(info.name)
            if out_name not in stacks:
                continue
            stack = stacks.pop(out_name)
            fates = {n: fate(component.tensors[n]) for n, _, _ in stack}
            (target, ignored, type_), *others = dict.fromkeys(fates.values())
            if others:
                raise InputError(
                    f"{where}: tensors {', '.join(repr(n) for n in fates)} are stacked into {out_name!r}, so the "
                    "recipe must treat them alike (the same target, ignore and type for each)"
                )
            source = _stacked_source(component, stack, out_name, source_of, where)
            info = source.info
        else:
            target, ignored, type_ = fate(info)
            source, out_name = source_of(info), rename(info.name)
        plans.append(_planned(source, out_name, target, ignored, type_, recipe, fmt, family, where))
    if held_as == "tensor" and tokenizer is not None and tokenizer.info.name not in component.tensors:
        plans.append(_kept_plan(tokenizer, None, tokenizer.info.name, fmt, "source", False))
    for options in dict.fromkeys(t.options for t in plans if t.quantize):
        fmt.check_available(options)  # an optional library a type needs (gguf's K-quants: ggml)
    _check_every_pattern_matches(component, recipe, matches)
    if not any(t.quantize for t in plans):
        raise InputError(
            f"{where}: the recipe's ignore patterns keep every tensor its targets match: nothing would be quantized"
        )
    _check_no_key_collision(component, plans)
    return ComponentPlan(
        component, tuple(plans), matches, family, tokenizer if held_as == "key_values" else None
    )


def _planned(
    source: TensorSource,
    out_name: str,
    target: str | None,
    ignored: str | None,
    type_: str | None,
    recipe: Recipe,
    fmt: Format,
    family: Family | None,
    where: str,
) -> TensorPlan:
    """One output tensor's plan: quantized where a target hits it and no ignore pattern keeps it (its type the
    recipe's, or the one `types` gives it), else kept."""
    info = source.info
    linear = _is_linear_weight(info) and not (
        family is not None and family.plain_weight(_source_name(source))
    )
    if target is not None and ignored is None:
        _check_quantizable(info, target, where, linear)
        # checked when the recipe was validated
        options = fmt.options_type.from_type(recipe.type if type_ is None else type_)
        try:
            return _quantized_plan(source, target, out_name, fmt, options, where, named=type_ is not None)
        except UnfittedShapeError as e:
            # the recipe's own type, which this layer cannot take: kept, saying why (the reason names the layout)
            kept = _kept_plan(source, target, out_name, fmt, recipe.keep_dtype, linear)
            return dataclasses.replace(kept, reason=str(e))
    return _kept_plan(source, ignored, out_name, fmt, recipe.keep_dtype, linear)


def _source_name(source: TensorSource) -> str:
    """The source tensor's name: a piece's (`SlicedSource`) is the tensor it was cut from's."""
    return source.base.info.name if isinstance(source, SlicedSource) else source.info.name


def _split_source(source: TensorSource, split: Split, out_name: str, where: str) -> TensorSource:
    """The range of `source` that `split` cuts out as output tensor `out_name` (`models.Split`)."""
    _, dim, part, parts = split
    info = source.info
    if dim >= len(info.shape) or info.shape[dim] % parts:
        raise InputError(
            f"{where}: tensor {info.name!r} {info.dtype}{list(info.shape)} does not cut into {parts} equal parts "
            f"along dim {dim}, as {out_name!r} takes"
        )
    n = info.shape[dim] // parts
    return SlicedSource.of(out_name, source, dim, part * n, (part + 1) * n)


def _tokenizer(component: Component, family: Family | None, held_as: str | None) -> TensorSource | None:
    """The tokenizer a format that holds one (`held_as`: `FormatInfo.tokenizer`) writes into the file of a model
    whose runtimes read it from there (`models.family.Tokenizer`), as a uint8 tensor: the source's own, else the
    first of the family's tokenizer files beside the component (a tokenizer.json: the SentencePiece model rebuilt
    from it, `read.spiece.tokenizer_model_bytes`). Each is read as a SentencePiece model here, before anything is
    written: `InputError` in one line naming the file or tensor that is none (ComfyUI would fail to load the
    output), and naming every place looked in when there is none. None where the format or the family has no
    tokenizer."""
    tok = None if family is None else family.plan.tokenizer
    if held_as is None or tok is None:
        return None
    if tok.tensor in component.tensors:
        info = component.tensors[tok.tensor]
        st = info.file.stat()
        _check_tokenizer_tensor(info, st.st_size, st.st_mtime_ns, tok.kind)
        return TensorSource(info)
    looked = []
    for rel in tok.files:
        path = component.dir / rel
        looked.append(str(path))
        if path.is_file() and tok.kind == "json":  # its own bytes, checked as tokenizers reads them
            _check_tokenizer_json(path.read_bytes(), str(path))
            size = path.stat().st_size
            return TensorSource(TensorInfo(tok.tensor, "U8", (size,), path.resolve(), 0, size))
        if path.is_file():
            # its folder resolved, not the file: a tokenizer.json is told by its name, with its config beside it (a
            # Hub snapshot's files are links to blobs of no name)
            named = path.parent.resolve() / path.name
            made = tokenizer_model_bytes(named)
            if made is not None:
                return BytesSource.of(tok.tensor, made, named)
            size = path.stat().st_size
            return TensorSource(TensorInfo(tok.tensor, "U8", (size,), path.resolve(), 0, size))
    reader = (
        "ComfyUI-GGUF reads it from the GGUF file"
        if held_as == "key_values"
        else "ComfyUI reads it from the file"
    )
    raise InputError(
        f"{component.dir}: {family.title}'s tokenizer is missing ({reader}, as tensor {tok.tensor!r} or its "
        f"{', '.join(dict.fromkeys(p.rsplit('/', 1)[-1] for p in tok.files))}): looked for {', '.join(looked)}; "
        "put the tokenizer there (a pipeline's tokenizer/ folder holds it)"
    )


@functools.lru_cache(maxsize=4)
def _check_tokenizer_tensor(info: TensorInfo, size: int, mtime_ns: int, kind: str = "sentencepiece") -> None:
    """A tokenizer a source file holds as a tensor (Comfy-Org's ``spiece_model``) is a SentencePiece model: read
    once per tensor while its file (`size`, `mtime_ns`) is unchanged, `InputError` naming the file and the tensor
    otherwise."""
    if info.dtype != "U8" or len(info.shape) != 1:
        raise InputError(
            f"{info.file}: tensor {info.name!r} is {info.dtype}{list(info.shape)}: a tokenizer is U8 bytes"
        )
    data, where = bytes(read_rows(info, 0, info.shape[0]).numpy()), f"{info.file}: {info.name}"
    if kind == "json":  # `Tokenizer.kind`: Comfy-Org's Gemma 4 ``tokenizer_json``
        _check_tokenizer_json(data, where)
    else:
        read_spiece_bytes(data, where)


def _check_tokenizer_json(data: bytes, where: str) -> None:
    """A tokenizers ``tokenizer.json`` (what ComfyUI's Gemma 4 builds its tokenizer from: `Tokenizer.from_str`):
    UTF-8 JSON of an object with a ``model``; `InputError` naming `where` otherwise."""
    import json

    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{where}: not a tokenizer.json ({e})") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("model"), dict):
        raise InputError(f"{where}: not a tokenizer.json (no tokenizer model in it)")


def _stacked_source(component: Component, stack, out_name: str, source_of, where: str) -> StackedSource:
    """The rows of `stack`'s tensors, in its order, as one source named `out_name`."""
    segments = []
    for name, part, parts in stack:
        src = source_of(component.tensors[name])
        if src.rows % parts:
            raise InputError(
                f"{where}: tensor {name!r} has {src.rows} rows: {out_name!r} takes {parts} equal parts"
            )
        n = src.rows // parts
        segments.append((src, part * n, (part + 1) * n))
    return StackedSource.of(out_name, segments, where)


def _quantized_plan(
    source: TensorSource,
    pattern: str,
    out_name: str,
    fmt: Format,
    options: FormatOptions,
    where: str,
    named: bool = True,
) -> TensorPlan:
    """The plan of a tensor quantized with `options`, fitted to its shape. A shape the options cannot be fitted to
    raises `UnfittedShapeError` where the recipe's own type gave them (not `named`: the caller keeps the tensor),
    any other shape the format cannot hold an `InputError`."""
    info = source.info
    try:
        options = format_for(fmt, options).fitted(options, info.shape)
        parts = quantized_parts(fmt, module_name(out_name), info.shape, options)
    except UnfittedShapeError as e:
        if not named:
            raise
        raise InputError(f"{where}: tensor {info.name!r} {e}: add it to the recipe's ignore") from None
    except UnsupportedShapeError as e:
        raise InputError(f"{where}: tensor {info.name!r} {e}: add it to the recipe's ignore") from None
    outs = tuple(TensorSpec(k, dt, shape) for k, (dt, shape) in parts.values())
    return TensorPlan(source, True, pattern, out_name, outs, tuple(parts), options)


def _kept_plan(
    source: TensorSource,
    pattern: str | None,
    out_name: str,
    fmt: Format,
    keep_dtype: str,
    linear: bool | None = None,
) -> TensorPlan:
    kept = _kept_spec(source.info, out_name, keep_dtype, fmt, linear)
    return TensorPlan(source, False, pattern, out_name, (kept,), ("",))


def replanned(
    tp: TensorPlan, fmt: Format, keep_dtype: str, options: FormatOptions, *, keep: bool = False
) -> TensorPlan:
    """The quantized tensor `tp` as another recipe would plan it: with the format's `options` (gguf: a GGML type
    up), or kept (`keep`), with the same source and output name (what `sensitivity` weighs a layer's raise by).
    Kept, it names no pattern: a kept plan's pattern is the ignore entry that kept it, and the proposal has yet
    to write one."""
    if keep:
        return _kept_plan(tp.source, None, tp.output_name, fmt, keep_dtype)
    return _quantized_plan(tp.source, tp.pattern or "", tp.output_name, fmt, options, str(tp.info.file))


def with_input_scales(
    plan: Plan, amax: Mapping[str, float], smoothing: Mapping[str, tuple[float, ...]] | None = None
) -> Plan:
    """`plan` with a static input scale for each quantized Linear that `amax` names (by its weight's manifest key,
    ``<component>/<output name>``: the largest |x| its input reached in a calibration pass) and whose format
    stores one (`Format.calibrated`: ComfyUI's FP8 and NVFP4 layers); the others as they were. A key that names no
    quantized tensor of the plan is an `InputError`: the calibration was of another plan. `smoothing` gives some
    of those Linears a per-input-channel ``pre_quant_scale`` (`Format.smoothed`: ComfyUI's NVFP4 layers; their
    amax is then that of the input times it); one whose format has none is an `InputError`."""
    fmt, known, smoothing = plan.format, set(), smoothing or {}
    components = []
    for cp in plan.components:
        tensors = []
        for tp in cp.tensors:
            key = cp.manifest_key(tp)
            options = None
            if tp.quantize and key in amax:
                known.add(key)
                layer_fmt = format_for(fmt, tp.options)
                try:
                    options = layer_fmt.calibrated(tp.options, amax[key])
                    if key in smoothing and options is not None:
                        options = layer_fmt.smoothed(options, smoothing[key])
                        if options is None:
                            raise ValueError(f"its {tp.options.type_name} layout has no pre_quant_scale")
                except ValueError as e:
                    raise InputError(f"{key}: {e}") from None
            if options is not None:
                tp = _quantized_plan(
                    tp.source, tp.pattern or "", tp.output_name, fmt, options, str(tp.info.file)
                )
            tensors.append(tp)
        components.append(dataclasses.replace(cp, tensors=tuple(tensors)))
    unknown = sorted(set(amax) - known) or sorted(set(smoothing) - set(amax))
    if unknown:
        raise InputError(f"{unknown[0]}: calibrated, but no quantized tensor of the plan has this name")
    return dataclasses.replace(plan, components=tuple(components))


def _check_every_pattern_matches(component: Component, recipe: Recipe, matches: dict[str, int]) -> None:
    # one module name per shape of name (block numbers aside), the first: what the closest match is picked from
    # (difflib over every module of a 48-block model takes seconds a pattern, and `recipes --for` tries them all)
    shapes = {re.sub(r"\d+", "#", module_name(n)): module_name(n) for n in reversed(component.tensors)}
    keys = list(reversed(shapes.values()))
    for field, patterns in (
        ("targets", recipe.targets),
        ("ignore", recipe.ignore),
        ("types", list(recipe.types)),
    ):
        for p in patterns:
            if matches[p] == 0:
                close = difflib.get_close_matches(p.replace("\\", ""), keys, n=1, cutoff=0.0)
                raise InputError(
                    f"recipe {field} pattern '{p}' matches no module in component {component.rel!r} ({component.where}; "
                    f"closest module name: {close[0]!r}): fix the pattern or pick the recipe for these key names"
                )


def _check_no_key_collision(component: Component, plans: list[TensorPlan]) -> None:
    seen: dict[str, str] = {}
    for t in plans:
        for spec in t.outputs:
            if spec.name in seen and seen[spec.name] != t.name:
                raise InputError(
                    f"{component.where}: output key {spec.name!r} of {t.name!r} collides with tensor {seen[spec.name]!r}"
                )
            seen[spec.name] = t.name


def make_plan(source: Path | SourceFolder, recipe: Recipe, *, steps: Sequence[TensorStep] = ()) -> Plan:
    """Open every component the recipe names and decide each tensor's fate, reading headers only.

    source: a `SourceFolder` (`read.source.open_source`), or a local folder, resolved here under `recipe`.
    steps: per-tensor steps (`steps.TensorStep`) whose transforms each tensor's source applies.
    """
    src = source if isinstance(source, SourceFolder) else local_source(source, recipe)
    recipe, folder = src.fit(recipe), src.folder
    role = format_info(recipe.format).names
    check_order(steps)
    for step in steps:
        step.start(src)
    components = []
    for rel in recipe.components:
        comp = src.component(rel)
        family = src.family(rel)
        names = names_for(role, family, format_info(recipe.format), str(comp.where))
        if comp.config is None and family is not None:
            # the config.json every container writes for a release that ships none, read off its shapes now: a
            # file it cannot be read off is refused before any work (`containers.write_config`)
            family.release_config(comp.tensors, comp.where)
        components.append(plan_component(comp, recipe, names, steps, family))
    for step in steps:
        step.finish()
    copied: list[Path] = []
    if recipe.copy_other_files:
        copied = src.other_files(skip=[f for step in steps for f in step.inputs])  # a LoRA kept in the folder
    return Plan(folder, recipe, tuple(components), tuple(copied))
