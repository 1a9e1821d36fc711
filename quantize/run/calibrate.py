"""`convert --calibrate INPUTS`: static input scales from a streamed forward pass, and what they cost.

One streamed pass of the source model (`forward.StreamedModel`, as `sensitivity` runs it) on the captured inputs
(`forward.load_inputs`: one pass, its batch as many samples as the file holds) records, for each quantized Linear,
the largest |x| its input reaches (in float32, over every call). The plan's scales are then filled from those
amaxes (`plan.with_input_scales`; nothing else of the plan changes): a layer whose format stores a static input
scale (ComfyUI's FP8 and NVFP4 layers: `Format.calibrated`) gets amax / its range as ``input_scale``; the others stay
as they were. A mixed ComfyUI file whose other layers are int8 or MXFP8 gets scales for its FP8 and NVFP4 layers
only; a plan with none is refused. The converter takes this step once, between planning and writing.

The same pass records, for each NVFP4 Linear (`Format.smoothed`: ComfyUI's ``pre_quant_scale``), the mean and
the max of |x_j| per input channel (two [in] vectors, whatever the number of calls). A second streamed pass of the
source then chooses each such layer's smoothing (`smoothing_search`, inside the Linear's hook: no input is held
beyond its call), AWQ's rule as ModelOpt exports it: p_j = (mean|x_j|)^-alpha, normalized by the geometric mean
of its largest and smallest value, each rounded to a power of two (so x · p and W / p are exact in any float dtype:
ComfyUI's bf16 x · p is ours); ComfyUI multiplies the input by p and the layer holds W / p. alpha is chosen per
layer from `ALPHAS` by the output error |X·Wᵀ − Q(X·p)·Q(W/p)ᵀ|² on that call's rows (`SEARCH_ROWS` of them, evenly
spaced, against `SEARCH_WEIGHT_ROWS` rows of W), Q being NVFP4 as ComfyUI runs it: the weight encoded with its
tensor scale, the input with the static scale of its smoothed amax max_j(amax_j · p_j). alpha 0 is plain NVFP4; a
layer is smoothed only where its best alpha beats that by `MIN_GAIN_DB` (the manifest records both figures).

Then the recipe's model is run twice more on the same inputs, its quantized Linears' inputs quantized as the runtime
does (`forward.quantized_inputs`): with a dynamic scale per call, and with the static scales. Both forward SQNRs
against the source are returned (`Calibration.forward_sqnr_db`) and recorded in the manifest: on the calibration
inputs themselves, so a static scale there never clips (other inputs may exceed its amax: `verify --forward
--inputs` measures them). Where some layer is smoothed, once more with the static scales of the plain layers
(`Calibration.unsmoothed_sqnr_db`): what the smoothing gained.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..encode import encode_and_measure
from ..errors import InputError
from ..plan import ComponentPlan, Plan, TensorPlan, with_input_scales
from .forward import (
    StreamedModel,
    forward_sqnr_db,
    load_inputs,
    named_failure,
    quantized_inputs,
    runnable,
    source_weights,
)

if TYPE_CHECKING:
    from ..formats import Format
    from ..recipes import Checks

__all__ = ["Calibration", "Smoothing", "calibrate", "input_amax", "smoothing_search"]

#: AWQ's grid of exponents (0: plain NVFP4)
ALPHAS = tuple(i / 20 for i in range(21))
#: the rows of a call's input, evenly spaced, and of the weight, that a smoothing is measured on
SEARCH_ROWS = 256
SEARCH_WEIGHT_ROWS = 256
#: how much better than plain NVFP4 (output SQNR on those rows, in dB) a smoothing must measure to be written
MIN_GAIN_DB = 0.1
#: a channel's mean |x| is taken as at least this fraction of the largest one (AWQ clamps its scales likewise)
_FLOOR = 1e-4


@dataclass(frozen=True)
class Smoothing:
    """One Linear's chosen smoothing: AWQ's exponent, the ``pre_quant_scale`` (powers of two), and the layer's
    output SQNR on the calibration rows, plain and smoothed."""

    alpha: float
    scale: tuple[float, ...]
    plain_sqnr_db: float
    smoothed_sqnr_db: float


@dataclass(frozen=True)
class Calibration:
    """What calibrating a plan found."""

    #: manifest key of each quantized Linear's weight -> the largest |x| its input reached (float32; of x · p for a
    #: smoothed one)
    amax: dict[str, float]
    #: manifest key -> the static input scale the plan now holds, for the Linears that took one, in plan order
    scales: dict[str, float]
    #: component -> (forward SQNR in dB with a dynamic input scale per call, with the static scales), against the
    #: source on the calibration inputs; inf: identical outputs
    forward_sqnr_db: dict[str, tuple[float, float]]
    #: manifest key -> the smoothing of the NVFP4 Linears that took one (their `amax` is of x · p)
    smoothing: dict[str, Smoothing] = field(default_factory=dict)
    #: component -> forward SQNR with the static scales of plain NVFP4 layers, where some layer is smoothed
    unsmoothed_sqnr_db: dict[str, float] = field(default_factory=dict)


def calibrate(
    plan: Plan, inputs: Path, *, on_pass: Callable[[str], None] | None = None, workers: int | None = None
) -> tuple[Plan, Calibration]:
    """`plan` with its static input scales filled from a streamed pass of the source on `inputs`, and what it found
    (see the module docstring). An `InputError` when no quantized layer of the plan stores an input scale (naming the
    format), when the model never calls a quantized Linear, or when an input is not finite."""
    from .sensitivity import _pool, planned_weights

    note = on_pass or (lambda text: None)
    _require_input_scales(plan)
    for cp in plan.components:  # what each pass takes, before the first: a tensor missing is one line
        run = runnable(cp)
        load_inputs(inputs, run.family, run.config)
    amax: dict[str, float] = {}
    wants: dict[str, torch.Tensor] = {}
    smoothing: dict[str, Smoothing] = {}
    smoothed_amax: dict[str, float] = {}
    for cp in plan.components:
        note(f"{cp.rel}: the source model, recording each quantized Linear's input amax")
        found, wants[cp.rel], channels = input_amax(cp, inputs, _smoothable(cp, plan.format))
        amax.update(found)
        if channels:
            note(f"{cp.rel}: the source model again, choosing each NVFP4 Linear's smoothing on its inputs")
            found_smoothing = smoothing_search(cp, inputs, plan.format, channels, plan.recipe.checks)
            for key, (chosen, top) in found_smoothing.items():
                smoothing[key], smoothed_amax[key] = chosen, top
    calibrated = with_input_scales(
        plan, {**amax, **smoothed_amax}, {key: sm.scale for key, sm in smoothing.items()}
    )
    scales = {
        cp.manifest_key(tp): tp.options.input_scale
        for cp in calibrated.components
        for tp in cp.quantized()
        if tp.options.input_scale is not None
    }
    figures = {}
    fmt = calibrated.format
    with _pool(workers) as pool:
        for cp in calibrated.components:
            run = runnable(cp)
            model = StreamedModel(run)
            x = load_inputs(inputs, run.family, run.config)
            got = []
            for static in (False, True):
                note(
                    f"{cp.rel}: the recipe's model, inputs quantized with {'static' if static else 'dynamic'} scales"
                )
                with named_failure(inputs):
                    got.append(
                        model.forward(
                            x, planned_weights(run, fmt, pool=pool), quantized_inputs(run, fmt, static)
                        )
                    )
            want = wants[cp.rel]
            figures[cp.rel] = (forward_sqnr_db(want, got[0]), forward_sqnr_db(want, got[1]))
        unsmoothed = {}
        if smoothing:
            plain = with_input_scales(plan, amax)
            for cp in plain.components:
                if not any(cp.manifest_key(tp) in smoothing for tp in cp.quantized()):
                    continue
                note(f"{cp.rel}: the recipe's model without smoothing, inputs quantized with static scales")
                run = runnable(cp)
                x = load_inputs(inputs, run.family, run.config)
                with named_failure(inputs):
                    got_plain = StreamedModel(run).forward(
                        x, planned_weights(run, fmt, pool=pool), quantized_inputs(run, fmt, True)
                    )
                unsmoothed[cp.rel] = forward_sqnr_db(wants[cp.rel], got_plain)
    amax = {key: smoothed_amax.get(key, value) for key, value in amax.items()}
    return calibrated, Calibration(amax, scales, figures, smoothing, unsmoothed)


def input_amax(
    cp: ComponentPlan, inputs: Path, smoothable: frozenset[str] = frozenset()
) -> tuple[dict[str, float], torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """One streamed pass of the source of component plan `cp` on `inputs`: each quantized Linear's input amax (by
    its weight's manifest key), the pass's output (the reference the quantized passes are measured against), and
    for the Linears of `smoothable` (model parameter names), by manifest key, the (mean, max) of |x_j| per input
    channel over every row of every call, float32 [in] each."""
    run = runnable(cp)
    model = StreamedModel(run)
    x = load_inputs(inputs, run.family, run.config)
    seen: dict[str, torch.Tensor] = {}
    #: param -> (sum of |x_j| in float64, max of |x_j|, rows)
    channels: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def recorder(param: str):
        def hook(module, x):
            a = x.detach().abs().amax().float()
            seen[param] = a if param not in seen else torch.maximum(seen[param], a)
            if param in smoothable:
                rows = x.detach().reshape(-1, x.shape[-1]).abs().float()
                total, top, count = rows.sum(0, dtype=torch.float64), rows.amax(0), rows.shape[0]
                held = channels.get(param)
                if held is not None:
                    total, top, count = held[0] + total, torch.maximum(held[1], top), held[2] + count
                channels[param] = (total, top, count)

        return hook

    hooks = {param.removesuffix(".weight"): recorder(param) for param, tp in run.plans.items() if tp.quantize}
    with named_failure(inputs):
        want = model.forward(x, source_weights(run), hooks)
    amax = {}
    for param, tp in run.plans.items():
        if not tp.quantize:
            continue
        if param not in seen:
            raise InputError(
                f"{cp.component.dir}: {run.class_name}'s forward never called the quantized Linear {tp.module!r}: "
                f"its input cannot be calibrated on {inputs}; add it to the recipe's ignore"
            )
        value = float(seen[param])
        if not math.isfinite(value):
            raise InputError(
                f"{inputs}: the input of {tp.module!r} holds NaN or Inf in the source's forward pass: "
                "no input scale can be calibrated from it"
            )
        amax[cp.manifest_key(tp)] = value
    stats = {
        cp.manifest_key(run.plans[param]): ((total / count).float(), top)
        for param, (total, top, count) in channels.items()
    }
    return amax, want, stats


def _smoothable(cp: ComponentPlan, fmt: Format) -> frozenset[str]:
    """The model parameters of `cp` whose Linear may be smoothed: a quantized layer of a layout that stores a
    ``pre_quant_scale`` (`Format.smoothed`), its planned tensor being that one Linear's weight (not a stacked or
    cut one: those Linears would need one scale)."""
    from ..formats import format_for

    run = runnable(cp)
    return frozenset(
        param
        for param, tp in run.plans.items()
        if tp.quantize
        and len(tp.info.shape) == 2
        and param not in run.rows
        and format_for(fmt, tp.options).smoothed(tp.options, (1.0,)) is not None
    )


def smoothing_search(
    cp: ComponentPlan,
    inputs: Path,
    fmt: Format,
    channels: dict[str, tuple[torch.Tensor, torch.Tensor]],
    checks: Checks,
) -> dict[str, tuple[Smoothing, float]]:
    """A streamed pass of the source of `cp` on `inputs` choosing each Linear's smoothing from its input's
    per-channel statistics `channels` (by manifest key: `input_amax`'s), inside the Linear's hook (see the module
    docstring): by manifest key, the `Smoothing` of each layer it measures better on, with the amax of its smoothed
    input (max_j amax_j · p_j, exact: p_j is a power of two). A smoothing whose weight would fail the recipe's
    `checks` (its figures are of W: a smoothed layer trades weight SQNR for output SQNR) gives way to the next best
    one."""
    from ..formats import format_for

    run = runnable(cp)
    model = StreamedModel(run)
    x = load_inputs(inputs, run.family, run.config)
    key_of = {param: cp.manifest_key(tp) for param, tp in run.plans.items()}
    #: key -> [options per alpha, noise per alpha, signal]
    found: dict[str, list] = {}

    def searcher(param: str):
        key = key_of[param]
        tp = run.plans[param]
        layer_fmt = format_for(fmt, tp.options)
        mean, top = channels[key]
        candidates = []
        for alpha in ALPHAS:
            scale = tuple(pre_quant_scale(mean, alpha).tolist())
            smoothed_amax = float((top * torch.tensor(scale)).amax())
            options = layer_fmt.smoothed(layer_fmt.calibrated(tp.options, smoothed_amax), scale)
            candidates.append((options, smoothed_amax))
        found[key] = [candidates, [0.0] * len(ALPHAS), 0.0]

        def hook(module, x):
            rows = _evenly(x.detach().reshape(-1, x.shape[-1]).float(), SEARCH_ROWS)
            w = module.weight.detach().float()
            column_amax = w.abs().amax(0, keepdim=True)
            w_rows = _evenly(w, SEARCH_WEIGHT_ROWS)
            want = rows.double() @ w_rows.double().T
            entry = found[key]
            entry[2] += float(want.pow(2).sum())
            for i, (options, _) in enumerate(entry[0]):
                scale = layer_fmt.weight_options([column_amax], options)["scale"]  # the whole weight's
                parts = layer_fmt.encode(w_rows, options, scale=scale)
                wq = layer_fmt.decoded(parts, tuple(w_rows.shape), torch.float32, options=options)
                xq = layer_fmt.quantized_input(rows, options, True)
                entry[1][i] += float((want - xq.double() @ wq.double().T).pow(2).sum())
            return None

        return hook

    hooks = {
        param.removesuffix(".weight"): searcher(param) for param in run.plans if key_of[param] in channels
    }
    with named_failure(inputs):
        model.forward(x, source_weights(run), hooks)
    tensor_of = {key_of[param]: tp for param, tp in run.plans.items()}
    chosen = {}
    for key, (candidates, noise, signal) in found.items():
        db = [_db(signal, n) for n in noise]
        # the best first, the smaller alpha of two equal; the first whose whole weight passes the recipe's checks
        for i in sorted(range(1, len(ALPHAS)), key=lambda i: (-db[i], i)):
            if db[i] < db[0] + MIN_GAIN_DB:
                break
            options, smoothed_amax = candidates[i]
            if _passes_checks(dataclasses.replace(tensor_of[key], options=options), fmt, checks):
                chosen[key] = (Smoothing(ALPHAS[i], options.pre_quant_scale, db[0], db[i]), smoothed_amax)
                break
    return chosen


def _passes_checks(tp: TensorPlan, fmt: Format, checks: Checks) -> bool:
    """Whether the weight as `tp` plans it (a smoothing's options: the figures are of W, decoded times p) keeps to
    the recipe's `checks` (`min_sqnr_db`, `min_cosine`): what `verify` holds the stored layer to. Streamed in row
    chunks, as `convert` measures it."""
    if checks.min_sqnr_db is None and checks.min_cosine is None:
        return True
    stats = encode_and_measure(tp, fmt, lambda parts, rows: parts)
    sqnr = stats.sqnr_db
    return (checks.min_sqnr_db is None or sqnr is None or sqnr >= checks.min_sqnr_db) and (
        checks.min_cosine is None or stats.cosine >= checks.min_cosine
    )


def pre_quant_scale(mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """AWQ's smoothing of an input whose channels' mean |x| is `mean` (float32 [in]) at exponent `alpha`, as the
    factor ComfyUI multiplies the input by: p_j = mean_j^-alpha / sqrt(max · min of mean^-alpha) (each mean at
    least `_FLOOR` of the largest), rounded to the nearest power of two in the log (float32 [in]; all 1 for alpha 0
    or an all-zero input)."""
    m = mean.double()
    largest = float(m.amax())
    if alpha == 0 or largest == 0:
        return torch.ones_like(mean, dtype=torch.float32)
    log = m.clamp(min=largest * _FLOOR).log2() * -alpha
    log = log - (log.amax() + log.amin()) / 2
    return torch.ldexp(torch.ones_like(log, dtype=torch.float32), log.round().to(torch.int32))


def _evenly(x: torch.Tensor, n: int) -> torch.Tensor:
    """At most `n` rows of `x`, evenly spaced (the first and the last among them)."""
    if x.shape[0] <= n:
        return x
    return x.index_select(0, torch.linspace(0, x.shape[0] - 1, n).round().long())


def _db(signal: float, noise: float) -> float:
    return math.inf if noise == 0 else 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _require_input_scales(plan: Plan) -> None:
    """Refuse a plan none of whose quantized layers stores an input scale, naming its format and the layouts that
    do."""
    from ..formats import format_for
    from ..formats.options import COMFY_INPUT_RANGES

    fmt = plan.format
    for cp in plan.components:
        for tp in cp.quantized():
            if format_for(fmt, tp.options).calibrated(tp.options, 1.0) is not None:
                return
    layouts = ", ".join(COMFY_INPUT_RANGES)
    raise InputError(
        f"{fmt.NAME} stores no static input scale for any layer of this recipe (ComfyUI reads one for the "
        f"{layouts} layers of comfy_fp8 and comfy_nvfp4 files): drop `calibrate` or pick such a recipe",
        parameters=("calibrate",),
    )
