"""`quantize sensitivity`: which Linears hurt the output most when quantized, and the recipe that raises them.

Measured, not guessed: one streamed forward pass of the source model (`forward.StreamedModel`) on fixed
(or captured) inputs sees each targeted Linear's input X while its weight W is loaded. For each rung of
the layer's ladder (its recipe type, then each type up: GGUF Q4_K -> Q5_K -> Q6_K -> Q8_0 -> kept; ComfyUI nvfp4 ->
mxfp8 -> kept, W4A8 and W4A4 -> int8 ConvRot -> kept, still one file: ComfyUI reads each layer's layout; one
encoding -> kept for the other formats), Q(W) is exactly what `convert` would store (encoded and decoded
by the format, from the source as stored), and the layer's *output SQNR* is
10·log10(|X·Wᵀ|² / |X·(W − Q(W))ᵀ|²): activation-aware, unlike the weight SQNR beside it. A second pass
runs the whole recipe (every tensor as the output would hold it) against the source: the *forward SQNR*.

Proposing a recipe (`propose`): a layer is raised one rung at a time, the step with the most predicted
gain per byte first, counting the gain only in the components that need it (those short of the target;
for a budget, the worst one: the figure is the worst component's). The prediction: the forward's noise is
taken as a sum of the layers' relative output noises, scaled by one factor per component fitted to the
last measured pass. Every prediction is then measured (another pass): for a quality target, steps are
added until the measured forward SQNR reaches it (at most `MAX_PASSES` passes); for a size budget, until
no step fits, and a proposal measured worse than the recipe falls back to the recipe. The result is an
ordinary recipe: the raised modules as explicit `types` (first match wins, so they come first) or `ignore`
entries, and `checks.min_forward_sqnr_db` for `verify --forward` to prove.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import dtypes
from ..encode import ChunkPool, ErrorStats, encode_and_measure, row_chunks
from ..errors import InputError
from ..formats import KEPT, NO_OPTIONS, Format, FormatOptions, format_for
from ..plan import ComponentPlan, Plan, TensorPlan, replanned
from ..recipes import Recipe
from .forward import (
    Runnable,
    StreamedModel,
    Weights,
    as_stored,
    forward_sqnr_db,
    load_inputs,
    named_failure,
    runnable,
    source_weights,
    whole_then_cut,
)

__all__ = [
    "Rung",
    "Layer",
    "Measurement",
    "Proposal",
    "measure",
    "propose",
    "proposed_recipe",
    "files_size",
    "KEPT",
]

#: measured passes a proposal may take before it gives up on a quality target
MAX_PASSES = 16


@dataclass(frozen=True)
class Rung:
    """One way to store a layer: with the format's options (gguf's GGML type; none for a format with one
    encoding), or kept."""

    options: FormatOptions
    keep: bool = False

    def label(self, fmt: Format) -> str:
        return KEPT if self.keep else self.options.type_name or fmt.NAME


def ladder(fmt: Format, base: FormatOptions) -> list[Rung]:
    """The rungs of a layer planned with options `base`, lowest first: each step the format raises it to
    (`Format.raised`), then kept."""
    rungs = [Rung(base)]
    up = format_for(fmt, base).raised(base)
    while up is not None:
        rungs.append(Rung(up))
        up = format_for(fmt, up).raised(up)
    return [*rungs, Rung(NO_OPTIONS, keep=True)]


@dataclass
class Layer:
    """One targeted Linear of one component, measured at each rung of its ladder."""

    component: str
    module: str  # the source module name (what recipe patterns match)
    param: str  # its weight's name in the model that runs it (a stacked tensor's: its first part's)
    rungs: list[Rung]
    plans: list[TensorPlan]  # the tensor as each rung plans it
    pattern: str = ""  # the recipe pattern that names exactly its source tensors (empty: the module's)
    signal: float = 0.0  # |X·Wᵀ|²
    noise: list[float] = field(default_factory=list)  # |X·(W − Q(W))ᵀ|², per rung
    weight_sqnr: list[float | None] = field(default_factory=list)  # None: exact

    @property
    def bytes(self) -> list[int]:
        return [tp.output_bytes for tp in self.plans]

    def relative_noise(self, level: int) -> float:
        return self.noise[level] / self.signal if self.signal > 0 else 0.0

    def output_sqnr_db(self, level: int = 0) -> float:
        noise = self.noise[level]
        if noise == 0:
            return math.inf
        return -math.inf if self.signal == 0 else 10 * math.log10(self.signal / noise)


@dataclass
class Measurement:
    """What one `measure` found: each layer at each rung, and each component's forward SQNR under the recipe."""

    plan: Plan
    layers: list[Layer]
    forward_sqnr_db: dict[str, float]  # component -> dB, the recipe as it is
    #: measure a variant: (component -> {model param -> TensorPlan} of what changed) -> component -> dB
    remeasure: Callable[[dict[str, dict[str, TensorPlan]]], dict[str, float]]

    @property
    def worst_forward_sqnr_db(self) -> float:
        return min(self.forward_sqnr_db.values())

    def sorted_layers(self) -> list[Layer]:
        """Most sensitive first (lowest output SQNR at the recipe's type)."""
        return sorted(self.layers, key=lambda layer: (layer.output_sqnr_db(0), layer.component, layer.module))


def measure(
    plan: Plan,
    *,
    inputs: Path | None = None,
    all_rungs: bool = False,
    on_pass: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> Measurement:
    """Measure every targeted Linear of `plan` (at the recipe's type; at every rung of its ladder too when
    `all_rungs`), and the recipe's forward SQNR, per component; each weight's row chunks are encoded on
    `workers` threads (default: every core). A targeted Linear the model never calls is an `InputError`
    naming it (its figure would be missing, not measured)."""
    fmt = plan.format
    recipe = plan.recipe
    note = on_pass or (lambda text: None)
    models: dict[str, tuple[Runnable, StreamedModel, dict, torch.Tensor]] = {}
    layers: list[Layer] = []
    figures: dict[str, float] = {}
    for cp in plan.components:
        run = runnable(cp)
        model = StreamedModel(run)
        x = load_inputs(inputs, run.family, run.config)
        found = _layers(cp, run, fmt, recipe, all_rungs)
        note(f"{cp.rel}: the source model, and each of its {len(found)} quantized Linears")
        with _pool(workers) as pool:
            hooks = {lay.param: _capture(lay, fmt, pool) for lay in found}
            want = _run(model, x, source_weights(run), inputs, hooks)
            _require_every_layer_ran(found, cp, run)
            note(f"{cp.rel}: the recipe's model")
            got = _run(model, x, planned_weights(run, fmt, pool=pool), inputs)
        figures[cp.rel] = forward_sqnr_db(want, got)
        models[cp.rel] = (run, model, x, want)
        layers += found

    def remeasure(changes: dict[str, dict[str, TensorPlan]]) -> dict[str, float]:
        result = {}
        with _pool(workers) as pool:
            for rel, (run, model, x, want) in models.items():
                note(f"{rel}: a proposal's model")
                got = _run(model, x, planned_weights(run, fmt, changes.get(rel, {}), pool), inputs)
                result[rel] = forward_sqnr_db(want, got)
        return result

    return Measurement(plan, layers, figures, remeasure)


def _require_every_layer_ran(found: list[Layer], cp: ComponentPlan, run: Runnable) -> None:
    idle = [lay.module for lay in found if not lay.weight_sqnr]
    if idle:
        raise InputError(
            f"{cp.component.dir}: {run.class_name}'s forward never called the targeted Linear {idle[0]!r}"
            + (f" (and {len(idle) - 1} more)" if len(idle) > 1 else "")
            + ": its sensitivity cannot be measured; add it to the recipe's ignore or targets"
        )


def _layers(cp: ComponentPlan, run: Runnable, fmt: Format, recipe: Recipe, all_rungs: bool) -> list[Layer]:
    """One layer per quantized tensor. A stacked one (a fused projection) is several parameters of the model,
    which see the same input: it is measured on its first part's Linear, as a whole."""
    found, seen = [], set()
    for param, tp in run.plans.items():
        if not tp.quantize or tp.name in seen:
            continue
        seen.add(tp.name)
        ladder_ = ladder(fmt, tp.options) if all_rungs else [Rung(tp.options)]
        plans = [
            tp if i == 0 else replanned(tp, fmt, recipe.keep_dtype, r.options, keep=r.keep)
            for i, r in enumerate(ladder_)
        ]
        for r in ladder_:
            if not r.keep:
                fmt.check_available(r.options)
        pattern = "|".join(re.escape(m) for m in tp.source_modules)
        found.append(Layer(cp.rel, tp.module, param.removesuffix(".weight"), ladder_, plans, pattern=pattern))
    return found


def _decoded(tp: TensorPlan, fmt: Format, pool: ChunkPool | None = None) -> torch.Tensor:
    """What `convert` would store for `tp`, decoded to float32 (row chunks encoded on `pool`)."""
    if not tp.quantize:
        return as_stored(tp)
    out = torch.empty(tp.info.shape, dtype=torch.float32)
    encode_and_measure(tp, fmt, lambda parts, rows: parts, lambda r0, r1, w, q: out[r0:r1].copy_(q), pool)
    return out


def planned_weights(
    run: Runnable,
    fmt: Format,
    changes: dict[str, TensorPlan] | None = None,
    pool: ChunkPool | None = None,
) -> Weights:
    """Every tensor as a conversion under the plan (with `changes`: model param -> replanned tensor) would store
    it, decoded to float32: equal, bit for bit, to what `verify --forward` decodes from the converted files.
    With a `pool`, each weight's row chunks are encoded on its threads."""
    swapped = {run.plans[param].name: tp for param, tp in (changes or {}).items()}  # by planned tensor
    return whole_then_cut(run, lambda tp: _decoded(swapped.get(tp.name, tp), fmt, pool))


def rung_noise(
    tp: TensorPlan, fmt: Format, x: torch.Tensor, pool: ChunkPool | None = None
) -> tuple[float, float | None]:
    """|X·(W − Q(W))ᵀ|² for the weight as `tp` plans it (Q(W): what `convert` would store, decoded), and the
    weight SQNR (None: exact). Streamed in row chunks of W (encoded on `pool`): no copy of the whole weight."""
    return _rung(tp, fmt, x, pool)[:2]


def _rung(
    tp: TensorPlan, fmt: Format, x: torch.Tensor, pool: ChunkPool | None = None, with_signal: bool = False
) -> tuple[float, float | None, float]:
    """`rung_noise`, and `with_signal` |X·Wᵀ|² over the same chunks (the whole planned tensor's: a stacked one's
    parts' Linears each hold only their own rows)."""
    noise = signal = 0.0

    def seen(r0: int, r1: int, w: torch.Tensor, q: torch.Tensor) -> None:
        nonlocal noise, signal
        noise += float(torch.linalg.vector_norm(x @ (q - w).T)) ** 2
        if with_signal:
            signal += float(torch.linalg.vector_norm(x @ w.T)) ** 2

    if tp.quantize:
        stats = encode_and_measure(tp, fmt, lambda parts, rows: parts, seen, pool)
    else:  # kept: each chunk read once; what is stored is its cast to the output dtype (as `kept_rows` casts)
        stats = ErrorStats()
        stored = dtypes.by_name(tp.output().dtype).torch
        for r0, r1 in row_chunks(tp.source.rows, tp.info.numel // max(1, tp.source.rows)):
            w = tp.source.read_rows(r0, r1, torch.float32)
            q = w.to(stored).float()
            seen(r0, r1, w, q)
            stats.add(w, q)
    return noise, stats.sqnr_db, signal


@contextmanager
def _pool(workers: int | None) -> Iterator[ChunkPool]:
    """Threads for the row chunks of a weight, each running torch on one thread (as convert's workers do); the
    process's torch threads are as they were afterwards."""
    saved = torch.get_num_threads()
    workers = workers or os.cpu_count() or 1
    executor = ThreadPoolExecutor(
        workers, thread_name_prefix="sensitivity", initializer=torch.set_num_threads, initargs=(1,)
    )
    try:
        yield ChunkPool.of(executor, workers)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(saved)


def _capture(layer: Layer, fmt: Format, pool: ChunkPool):
    """A hook on the layer's Linear: its input X against W (loaded) and each rung's Q(W), each rung's row
    chunks encoded on the pool's threads."""
    layer.noise = [0.0] * len(layer.rungs)

    def hook(module: torch.nn.Module, x: torch.Tensor) -> None:
        x2 = x.reshape(-1, x.shape[-1]).float()
        found = [_rung(tp, fmt, x2, pool, with_signal=i == 0) for i, tp in enumerate(layer.plans)]
        layer.signal += found[0][2]  # |X·Wᵀ|² of the whole planned tensor, taken with its first rung
        for i, (noise, _, _) in enumerate(found):
            layer.noise[i] += noise
        if not layer.weight_sqnr:
            layer.weight_sqnr = [sqnr for _, sqnr, _ in found]

    return hook


def _run(model: StreamedModel, x, weights: Weights, inputs: Path | None, hooks=None) -> torch.Tensor:
    with named_failure(inputs):
        return model.forward(x, weights, hooks or {})


# --- the proposal ----------------------------------------------------------------------------------


@dataclass
class _Choice:
    """One module name, raised together in every component that has it (a recipe pattern covers them all)."""

    module: str
    layers: list[Layer]
    level: int = 0

    @property
    def top(self) -> int:
        return len(self.layers[0].rungs) - 1

    def step_bytes(self) -> int:
        return sum(lay.bytes[self.level + 1] - lay.bytes[self.level] for lay in self.layers)


@dataclass
class Proposal:
    recipe: Recipe
    forward_sqnr_db: dict[str, float]  # component -> measured dB
    reached: bool
    raised: list[tuple[str, str]]  # (module, rung label), most sensitive first
    bytes: int  # the proposed checkpoint's tensor files on disk (headers and padding included)
    base_bytes: int  # the recipe's
    passes: int  # measured passes after the first two

    @property
    def worst_forward_sqnr_db(self) -> float:
        return min(self.forward_sqnr_db.values())


def propose(
    m: Measurement, *, min_forward_sqnr_db: float | None = None, max_bytes: int | None = None
) -> Proposal:
    """The cheapest raises that reach `min_forward_sqnr_db` (measured), or the best forward SQNR within
    `max_bytes` of tensor files on disk (headers and padding included); see the module docstring. `reached` is
    False when the target cannot be met."""
    if (min_forward_sqnr_db is None) == (max_bytes is None):
        raise ValueError("give exactly one of min_forward_sqnr_db and max_bytes")
    fmt = m.plan.format
    choices = _choices(m.layers)
    if max_bytes is not None:
        measured, reached, passes = _propose_within_bytes(m, choices, max_bytes)
    else:
        measured, reached, passes = _propose_for_sqnr(m, choices, min_forward_sqnr_db)
    raised = [(c.module, c.layers[0].rungs[c.level].label(fmt)) for c in choices if c.level]
    recipe = proposed_recipe(m.plan.recipe, choices, fmt, min_forward_sqnr_db, measured)
    return Proposal(recipe, measured, reached, raised, _on_disk(m, choices), files_size(m.plan), passes)


def _propose_within_bytes(
    m: Measurement, choices: list[_Choice], max_bytes: int
) -> tuple[dict[str, float], bool, int]:
    """`--max-size`: `choices` raised, by predicted gain per byte for the worst component, while they fit in
    `max_bytes`, then measured once; back to the recipe where that measures worse. Returns the forward SQNRs
    measured, whether the recipe itself fits, and the passes measured."""
    measured = dict(m.forward_sqnr_db)
    on_disk = _on_disk(m, choices)
    # before any raise: what the files take beyond their tensors
    overhead = on_disk - _tensor_bytes(m, choices)
    if on_disk > max_bytes:
        return measured, False, 0
    _raise_within_bytes(m, choices, _fit(choices, measured), max_bytes, overhead)
    if not any(c.level for c in choices):
        return measured, True, 0
    measured = _remeasured(m, choices)
    if min(measured.values()) < m.worst_forward_sqnr_db:  # predicted better, measured worse
        for c in choices:
            c.level = 0
        measured = dict(m.forward_sqnr_db)
    return measured, True, 1


def _raise_within_bytes(
    m: Measurement, choices: list[_Choice], scale: dict[str, float], max_bytes: int, overhead: int
) -> None:
    """Raise the best step for the component predicted worst while one fits in the room left; then undo the
    last raises while the files (headers and padding included) outgrow `max_bytes`."""
    steps: list[_Choice] = []
    while True:
        predicted = _predicted(choices, scale)
        worst = {max(predicted, key=predicted.__getitem__)}  # the figure is the worst component's
        room = max_bytes - overhead - _tensor_bytes(m, choices)
        step = _best_step(choices, scale, m.plan, worst, room=room)
        if step is None:
            break
        step.level += 1
        steps.append(step)
    while steps and _on_disk(m, choices) > max_bytes:  # a raise's padding or header outgrew the room: undo it
        steps.pop().level -= 1


def _propose_for_sqnr(
    m: Measurement, choices: list[_Choice], min_forward_sqnr_db: float
) -> tuple[dict[str, float], bool, int]:
    """`--min-forward-sqnr`: `choices` raised pass by pass, each pass's raises measured, until the measured
    forward SQNR reaches `min_forward_sqnr_db`, nothing is left to raise, or `MAX_PASSES`. Returns the forward
    SQNRs last measured, whether they reach the target, and the passes measured."""
    measured = dict(m.forward_sqnr_db)
    passes = 0
    while True:
        reached = min(measured.values()) >= min_forward_sqnr_db
        if reached or passes >= MAX_PASSES:
            break
        if not _raise_for_sqnr(m, choices, _fit(choices, measured), measured, min_forward_sqnr_db):
            break  # nothing left to raise
        measured, passes = _remeasured(m, choices), passes + 1
    return measured, reached, passes


def _raise_for_sqnr(
    m: Measurement,
    choices: list[_Choice],
    scale: dict[str, float],
    measured: dict[str, float],
    min_forward_sqnr_db: float,
) -> int:
    """One pass's raises: the best step for the components predicted short of the target, until none is (at
    least one step). Returns the steps taken."""
    target = 10 ** (-min_forward_sqnr_db / 10)  # relative noise
    steps = 0
    while True:
        short = {rel for rel, noise in _predicted(choices, scale).items() if noise > target}
        if steps and not short:
            break
        # at least one step a pass, for the components the last pass measured short of the target
        needy = short or {rel for rel, db in measured.items() if db < min_forward_sqnr_db}
        step = _best_step(choices, scale, m.plan, needy)
        if step is None:
            break
        step.level += 1
        steps += 1
    return steps


def _tensor_bytes(m: Measurement, choices: list[_Choice]) -> int:
    """The tensors' bytes with `choices` raised (no headers, no padding)."""
    return m.plan.output_bytes + sum(lay.bytes[c.level] - lay.bytes[0] for c in choices for lay in c.layers)


def _on_disk(m: Measurement, choices: list[_Choice]) -> int:
    """The files' bytes with `choices` raised, headers and padding included."""
    raised = {(lay.component, lay.plans[0].name): lay.plans[c.level] for c in choices for lay in c.layers}
    return _files_size(m.plan, raised)


def _remeasured(m: Measurement, choices: list[_Choice]) -> dict[str, float]:
    """Each component's forward SQNR, measured again with `choices` raised."""
    changes: dict[str, dict[str, TensorPlan]] = {}
    for c in choices:
        for lay in c.layers:
            if c.level:
                changes.setdefault(lay.component, {})[f"{lay.param}.weight"] = lay.plans[c.level]
    return m.remeasure(changes)


def files_size(plan: Plan) -> int:
    """The bytes the tensor files of `plan` take on disk (headers and padding included)."""
    return _files_size(plan, {})


def _files_size(plan: Plan, changed: dict[tuple[str, str], TensorPlan]) -> int:
    """The bytes the tensor files of `plan` take on disk with the tensors `changed` ((component, source tensor
    name) -> its plan) planned otherwise: headers and padding included, shards of the default size (what a
    budget is held to)."""
    from ..containers import planned_files_size
    from ..read.files import DEFAULT_MAX_SHARD_SIZE

    total = 0
    for cp in plan.components:
        tensors = tuple(changed.get((cp.rel, tp.name), tp) for tp in cp.tensors)
        total += planned_files_size(
            dataclasses.replace(cp, tensors=tensors), plan.format, plan.container, DEFAULT_MAX_SHARD_SIZE
        )
    return total


def _choices(layers: list[Layer]) -> list[_Choice]:
    by_module: dict[str, _Choice] = {}
    for lay in sorted(layers, key=lambda lay: lay.output_sqnr_db(0)):
        by_module.setdefault(lay.module, _Choice(lay.module, [])).layers.append(lay)
    return list(by_module.values())


def _fit(choices: list[_Choice], measured: dict[str, float]) -> dict[str, float]:
    """Per component, the factor that turns the sum of the layers' relative output noises into the measured
    relative noise of the forward pass (0 when the layers make no noise: raising them cannot help)."""
    summed = _predicted(choices, dict.fromkeys(measured, 1.0))
    scale = {}
    for rel, db in measured.items():
        noise = 0.0 if math.isinf(db) else 10 ** (-db / 10)
        scale[rel] = noise / summed[rel] if summed.get(rel, 0) > 0 else 0.0
    return scale


def _predicted(choices: list[_Choice], scale: dict[str, float]) -> dict[str, float]:
    noise = dict.fromkeys(scale, 0.0)
    for c in choices:
        for lay in c.layers:
            noise[lay.component] += scale[lay.component] * lay.relative_noise(c.level)
    return noise


def _best_step(
    choices: list[_Choice], scale: dict[str, float], plan: Plan, needy: set[str], room: int | None = None
) -> _Choice | None:
    """The raise with the most predicted gain per byte in the `needy` components (that fits in `room` bytes),
    None when none helps. Its bytes count in every component: a recipe pattern raises a module in each."""
    quantized_left = {cp.rel: sum(1 for t in cp.tensors if t.quantize) for cp in plan.components}
    for c in choices:
        for lay in c.layers:
            if c.level == c.top:
                quantized_left[lay.component] -= 1
    best, best_ratio = None, 0.0
    for c in choices:
        if c.level == c.top:
            continue
        if c.level + 1 == c.top and any(quantized_left[lay.component] <= 1 for lay in c.layers):
            continue  # a recipe must quantize something in every component
        gain = sum(
            scale[lay.component] * (lay.relative_noise(c.level) - lay.relative_noise(c.level + 1))
            for lay in c.layers
            if lay.component in needy
        )
        cost = c.step_bytes()
        if gain <= 0 or (room is not None and cost > room):
            continue
        ratio = gain / max(cost, 1)
        if ratio > best_ratio:
            best, best_ratio = c, ratio
    return best


def proposed_recipe(
    recipe: Recipe,
    choices: list[_Choice],
    fmt: Format,
    min_forward_sqnr_db: float | None,
    measured: dict[str, float],
) -> Recipe:
    """`recipe` with the raised modules spelled out: a raised type as a `types` entry ahead of the recipe's own
    (the first match decides), kept as an `ignore` entry; `checks.min_forward_sqnr_db` the target (or, for a
    size budget, the figure measured, rounded down to 0.1 dB)."""
    types: dict[str, str] = {}
    ignore = list(recipe.ignore)
    for c in choices:
        if not c.level:
            continue
        rung = c.layers[0].rungs[c.level]
        pattern = c.layers[0].pattern or re.escape(c.module)
        if rung.keep:
            ignore.append(pattern)
        elif rung.options.type_name is not None:
            types[pattern] = rung.options.type_name
    figure = min(measured.values())
    floor = min_forward_sqnr_db if min_forward_sqnr_db is not None else math.floor(figure * 10) / 10
    raised = sum(1 for c in choices if c.level)
    name = f"{recipe.name or recipe.format}-sensitivity"
    description = (
        f"{recipe.name or 'the recipe'} with the {raised} most sensitive Linears raised, by measured output "
        f"SQNR (`quantize sensitivity`): forward SQNR {figure:.2f} dB"
    )
    return recipe.model_copy(
        update={
            "name": name,
            "description": description,
            "ignore": ignore,
            "types": {**types, **{p: t for p, t in recipe.types.items() if p not in types}},
            "checks": recipe.checks.model_copy(
                update={"min_forward_sqnr_db": floor if not math.isinf(floor) else None}
            ),
        }
    )
