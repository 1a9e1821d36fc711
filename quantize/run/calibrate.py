"""`convert --calibrate INPUTS`: static input scales from a streamed forward pass, and what they cost.

One streamed pass of the source model (`forward.StreamedModel`, as `sensitivity` runs it) on the captured inputs
(`forward.load_inputs`: one pass, its batch as many samples as the file holds) records, for each quantized Linear,
the largest |x| its input reaches (in float32, over every call). The plan's scales are then filled from those
amaxes (`plan.with_input_scales`; nothing else of the plan changes): a layer whose format stores a static input
scale (ComfyUI's FP8 and NVFP4 layers: `Format.calibrated`) gets amax / its range as ``input_scale``; the others stay
as they were. A mixed ComfyUI file whose other layers are int8 or MXFP8 gets scales for its FP8 and NVFP4 layers
only; a plan with none is refused. The converter takes this step once, between planning and writing.

Then the recipe's model is run twice more on the same inputs, its quantized Linears' inputs quantized as the runtime
does (`forward.quantized_inputs`): with a dynamic scale per call, and with the static scales. Both forward SQNRs
against the source are returned (`Calibration.forward_sqnr_db`) and recorded in the manifest: on the calibration
inputs themselves, so a static scale there never clips (other inputs may exceed its amax: `verify --forward
--inputs` measures them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from ..plan import ComponentPlan, Plan, with_input_scales
from .forward import (
    StreamedModel,
    forward_sqnr_db,
    load_inputs,
    named_failure,
    quantized_inputs,
    runnable,
    source_weights,
)

__all__ = ["Calibration", "calibrate", "input_amax"]


@dataclass(frozen=True)
class Calibration:
    """What calibrating a plan found."""

    #: manifest key of each quantized Linear's weight -> the largest |x| its input reached (float32)
    amax: dict[str, float]
    #: manifest key -> the static input scale the plan now holds, for the Linears that took one, in plan order
    scales: dict[str, float]
    #: component -> (forward SQNR in dB with a dynamic input scale per call, with the static scales), against the
    #: source on the calibration inputs; inf: identical outputs
    forward_sqnr_db: dict[str, tuple[float, float]]


def calibrate(
    plan: Plan, inputs: Path, *, on_pass: Callable[[str], None] | None = None, workers: int | None = None
) -> tuple[Plan, Calibration]:
    """`plan` with its static input scales filled from a streamed pass of the source on `inputs`, and what it found
    (see the module docstring). An `InputError` when no quantized layer of the plan stores an input scale (naming the
    format), when the model never calls a quantized Linear, or when an input is not finite."""
    from .sensitivity import _pool, planned_weights

    note = on_pass or (lambda text: None)
    _require_input_scales(plan)
    amax: dict[str, float] = {}
    wants: dict[str, torch.Tensor] = {}
    for cp in plan.components:
        note(f"{cp.rel}: the source model, recording each quantized Linear's input amax")
        found, wants[cp.rel] = input_amax(cp, inputs)
        amax.update(found)
    calibrated = with_input_scales(plan, amax)
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
    return calibrated, Calibration(amax, scales, figures)


def input_amax(cp: ComponentPlan, inputs: Path) -> tuple[dict[str, float], torch.Tensor]:
    """One streamed pass of the source of component plan `cp` on `inputs`: each quantized Linear's input amax (by
    its weight's manifest key), and the pass's output (the reference the quantized passes are measured against)."""
    run = runnable(cp)
    model = StreamedModel(run)
    x = load_inputs(inputs, run.family, run.config)
    seen: dict[str, torch.Tensor] = {}

    def recorder(param: str):
        def hook(module, x):
            a = x.detach().abs().amax().float()
            seen[param] = a if param not in seen else torch.maximum(seen[param], a)

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
    return amax, want


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
