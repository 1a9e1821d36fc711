"""diffusers' context parallelism (Ulysses, ``ContextParallelConfig(ulysses_degree=2)``, attention backend ``native``)
over our checkpoints, on two CPU ranks (gloo) spawned here: every format through `load_quantized` (compute "fast",
"dequantize", and "kernel" where the kernel runs on the CPU), with block offload before and after
`enable_context_parallel`, and diffusers' own loading of our torchao and GGUF files, each equal to the same model's
single-process output on the same rank, bit for bit (`torch.equal`).

The one bound: comfy_fp8 under ``compute="kernel"`` without a calibrated input scale quantizes each call's
activations with one dynamic scale over the tokens the call holds, which under context parallelism is the rank's
share (loaders/parallel.py). Its output is then another valid quantization of the same activations: its error
against the eager reference (``compute="dequantize"``) is held to the single-process kernel's own error (relative
L2, times `DYNAMIC_SCALE_SLACK`); with the input scale ``convert --calibrate`` stores it is exact again.

HunyuanVideo 1.5's class ships no plan; its family declares one (`Family.cp_plan`). diffusers 0.42.1's attention
processor for it cannot run under Ulysses with its query-and-key mask: diffusers' own call with the plan is pinned as
it fails, and `enable_context_parallel` (the mask on the keys, `Family.cp_masks_on_keys`) is held to the
single-process output to float32 rounding (the joint attention's keys are summed in another order).

One spawn for the whole module: the ranks load and run every case in turn and write their outputs to safetensors
files (no pickles), which the tests read.
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from pathlib import Path

import pytest
import torch

if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is absent: no CPU ranks to run", allow_module_level=True)

import diffusers
from safetensors.torch import load_file, save_file

from loaders.parallel import (
    accelerator_count_at_least_one,
    enable_context_parallel,
    needs_device_count_workaround,
)
from quantize.models import get_family
from tests import diffusers_models as models
from tests.conftest import run_cli
from tests.loaders.conftest import FORMATS, recipe_for

WORLD = 2
COMPUTES = ("fast", "dequantize", "kernel")
#: the formats (and compute) whose activation scale spans the call's tokens: the bound, not equality
DYNAMIC_SCALE = {("comfy_fp8", "kernel")}
#: how much larger the rank-local dynamic scale's error may be than the single-process one's (measured: 0.98 times,
#: relative L2 0.0084 against 0.0086)
DYNAMIC_SCALE_SLACK = 1.25
#: block offload around enable_context_parallel, for these formats
OFFLOADED = ("fp8_channel", "gguf")
#: how far the HunyuanVideo 1.5 output under its plan may be from one process's, in float32 ulps of its magnitude
#: (the joint attention's keys summed in another order; measured 2)
HV15_ULPS = 8
#: a tiny HunyuanVideo 1.5 (2 heads: one per rank under Ulysses)
HV15_TINY = dict(
    in_channels=8,
    out_channels=4,
    num_attention_heads=2,
    attention_head_dim=16,
    num_layers=2,
    num_refiner_layers=1,
    text_embed_dim=24,
    text_embed_2_dim=20,
    image_embed_dim=16,
    rope_axes_dim=(4, 6, 6),
)


# -- what each rank runs ----------------------------------------------------------------------------------------


def _load(case: dict) -> torch.nn.Module:
    """The case's model on the CPU by the loader it names: a Wan in bf16, the tiny HunyuanVideo 1.5 in float32."""
    kind = case["loader"]
    if kind == "ours":
        from loaders import load_quantized

        return load_quantized(
            diffusers.WanTransformer3DModel, case["path"], dtype=torch.bfloat16, compute=case["compute"]
        )
    if kind == "pretrained":
        return diffusers.WanTransformer3DModel.from_pretrained(case["path"], torch_dtype=torch.bfloat16)
    if kind == "single_file":
        return diffusers.WanTransformer3DModel.from_single_file(
            case["path"],
            config=case["config"],
            subfolder="transformer",
            quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.bfloat16),
            torch_dtype=torch.bfloat16,
        )
    torch.manual_seed(0)
    return diffusers.HunyuanVideo15Transformer3DModel(**HV15_TINY).eval()


def _inputs(case: dict, model: torch.nn.Module) -> dict:
    """Wan's usual inputs; HunyuanVideo 1.5's family inputs with text padding (2 of 6 Qwen tokens, 1 of 4 ByT5
    ones masked), so that the mask's split matters."""
    if case["loader"] != "hv15":
        return models.wan_inputs()
    hv = get_family("hunyuanvideo15")
    x = hv.inputs.random(dict(model.config), torch.Generator().manual_seed(0))
    x["encoder_attention_mask"][:, 4:] = 0
    x["encoder_attention_mask_2"][:, 3:] = 0
    return hv.inputs.call(model.config, x)


def _no_kernel(case: dict) -> str | None:
    """Why the case's kernels do not run on the CPU for bf16 here (the first layer without one), or None: our
    layers' own probes, and for diffusers' torchao model our module of its format, which is torchao's dispatch."""
    from loaders import QuantizedLinear
    from loaders.modules import MODULES

    if case["loader"] == "pretrained":
        g = torch.Generator().manual_seed(0)
        layer = MODULES[case["format"]].from_weight(torch.randn(64, 128, generator=g), compute="kernel")
        layers = {case["format"]: layer}
    else:
        layers = {n: m for n, m in _load(case).named_modules() if isinstance(m, QuantizedLinear)}
    for name, m in layers.items():
        problem = m.kernel_problem(torch.zeros(1, m.in_features, dtype=torch.bfloat16))
        if problem is not None:
            return f"{name}: {problem}"
    return None


def _run(case: dict) -> dict[str, torch.Tensor]:
    """The single-process output (``want``) and the output under context parallelism (``got``) of one model on this
    rank; for HunyuanVideo 1.5, ``after`` too: a fresh model's single-process output once its masks' fix is in."""
    model = _load(case)
    model.set_attention_backend("native")
    kwargs = _inputs(case, model)
    if case.get(
        "bare"
    ):  # diffusers' own call, without the workaround (or, with a plan, without the masks' fix)
        plan = get_family("hunyuanvideo15").cp_plan({}) if case["loader"] == "hv15" else None
        with accelerator_count_at_least_one() if plan else contextlib.nullcontext():
            model.enable_parallelism(
                config=diffusers.ContextParallelConfig(ulysses_degree=WORLD), cp_plan=plan
            )
        with torch.no_grad():
            return {"got": model(**kwargs)[0]}
    out = _parallel(model, kwargs, case["offload"])
    if case["loader"] == "hv15":  # one process, after the masks' fix went in: as before, bit for bit
        fresh = _load(case)
        fresh.set_attention_backend("native")
        with torch.no_grad():
            out["after"] = fresh(**kwargs)[0]
    return out


def _parallel(model: torch.nn.Module, kwargs: dict, offload: str) -> dict[str, torch.Tensor]:
    from diffusers import ContextParallelConfig

    with torch.no_grad():
        want = model(**kwargs)[0]
    when, _, kind = offload.partition(
        "-"
    )  # "before" / "after": ours; "before-group" / "after-group": diffusers'
    if when == "before":
        _offload(model, kind)
    enable_context_parallel(model, ContextParallelConfig(ulysses_degree=WORLD))
    if when == "after":
        _offload(model, kind)
    with torch.no_grad():
        got = model(**kwargs)[0]
    return {"want": want, "got": got}


def _offload(model: torch.nn.Module, kind: str) -> None:
    """Our block offload, or (``group``) diffusers' group offload, a block a group, onto the CPU (its code paths)."""
    from loaders import enable_block_offload

    if kind == "group":
        cpu = torch.device("cpu")
        model.enable_group_offload(
            cpu, offload_device=cpu, offload_type="block_level", num_blocks_per_group=1
        )
    else:
        enable_block_offload(model, device="cpu", host="pageable")


def _rank(rank: int, where: str) -> None:
    """One rank: every case of ``cases.json`` in turn; outputs to ``rank<r>.safetensors``, what happened (skipped,
    failed, seconds) to ``rank<r>.json``."""
    torch.set_num_threads(1)
    root = Path(where)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{root / 'rdzv'}", rank=rank, world_size=WORLD
    )
    outputs, report = {}, {}
    try:
        for case in json.loads((root / "cases.json").read_text()):
            start = time.perf_counter()
            try:
                if case.get("compute") == "kernel" or case["loader"] == "pretrained":
                    problem = _no_kernel(case)
                    if problem is not None:
                        report[case["id"]] = {"skipped": problem}
                        continue
                for name, t in _run(case).items():
                    outputs[f"{case['id']}/{name}"] = t.contiguous()
                report[case["id"]] = {"seconds": time.perf_counter() - start}
            except Exception as e:  # noqa: BLE001  (reported to the test, which says which case failed)
                report[case["id"]] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    finally:
        save_file(outputs, str(root / f"rank{rank}.safetensors"))
        (root / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
        torch.distributed.destroy_process_group()


# -- the cases, and one spawn for them all ----------------------------------------------------------------------


def _calibration_inputs(path: Path) -> Path:
    """Two passes' inputs for `models.wan` (what `convert --calibrate` streams through the source)."""
    g = torch.Generator().manual_seed(1)
    save_file(
        {
            "hidden_states": torch.randn(2, 16, 2, 8, 8, generator=g).to(torch.bfloat16),
            "timestep": torch.tensor([900, 100]),
            "encoder_hidden_states": torch.randn(2, 8, 64, generator=g).to(torch.bfloat16),
        },
        str(path),
    )
    return path


def _calibrated_comfy_fp8(converted, root: Path) -> Path:
    """The tiny Wan of `converted` in comfy_fp8, each layer's input_scale stored by ``convert --calibrate``."""
    src, _ = converted("wan", "comfy_fp8")
    out = root / "calibrated"
    recipe = recipe_for("wan", "comfy_fp8", root)
    run_cli(
        "convert",
        src.parent,
        out,
        "--recipe",
        recipe,
        "--calibrate",
        _calibration_inputs(root / "cal.st"),
        check=True,
    )
    return out / "transformer"


def _cases(converted, root: Path) -> list[dict]:
    cases = []
    for fmt in FORMATS:
        path = str(converted("wan", fmt)[1])
        for compute in COMPUTES:
            cases.append(dict(id=f"{fmt}-{compute}", loader="ours", path=path, compute=compute, offload=""))
    for fmt in OFFLOADED:
        for when in ("before", "after", "before-group", "after-group"):
            path = str(converted("wan", fmt)[1])
            cases.append(
                dict(id=f"{fmt}-offload-{when}", loader="ours", path=path, compute="fast", offload=when)
            )
    path = str(converted("wan", "fp8_channel")[1])
    cases.append(dict(id="bare", loader="ours", path=path, compute="fast", offload="", bare=True))
    calibrated = str(_calibrated_comfy_fp8(converted, root))
    for compute in ("kernel", "dequantize"):
        cases.append(
            dict(
                id=f"comfy_fp8-calibrated-{compute}",
                loader="ours",
                path=calibrated,
                compute=compute,
                offload="",
            )
        )
    for fmt in ("torchao_fp8", "torchao_int8"):
        path = str(converted("wan", fmt)[1])
        cases.append(dict(id=f"diffusers-{fmt}", loader="pretrained", path=path, format=fmt, offload=""))
    src, out = converted("wan", "gguf")
    (gguf_file,) = out.glob("*.gguf")
    cases.append(
        dict(
            id="diffusers-gguf", loader="single_file", path=str(gguf_file), config=str(src.parent), offload=""
        )
    )
    # diffusers' own enable_parallelism with the family's plan first: the fix of its masks goes in with the second
    cases.append(dict(id="hunyuanvideo15-bare", loader="hv15", offload="", bare=True))
    cases.append(dict(id="hunyuanvideo15", loader="hv15", offload=""))
    return cases


@pytest.fixture(scope="module")
def ranks(converted, tmp_path_factory):
    """Every case run on two spawned ranks: (cases by id, rank 0's outputs, rank 1's outputs, reports by rank, the
    spawn's seconds)."""
    root = tmp_path_factory.mktemp("context-parallel")
    cases = _cases(converted, root)
    (root / "cases.json").write_text(json.dumps(cases))
    start = time.perf_counter()
    torch.multiprocessing.start_processes(_rank, args=(str(root),), nprocs=WORLD, start_method="spawn")
    seconds = time.perf_counter() - start
    outputs = [load_file(root / f"rank{r}.safetensors") for r in range(WORLD)]
    reports = [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {c["id"]: c for c in cases}, outputs, reports, seconds


def _result(ranks, case_id: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(single-process, context-parallel) output of a case, the same on both ranks; a failed case's error raised."""
    _, outputs, reports, _ = ranks
    for report in reports:
        r = report[case_id]
        if "error" in r:
            pytest.fail(f"{case_id}: {r['error']}\n{r['trace']}")
        if "skipped" in r:
            pytest.skip(f"{case_id}: no kernel on the CPU with torch {torch.__version__} ({r['skipped']})")
    for other in outputs[1:]:
        assert torch.equal(
            outputs[0][f"{case_id}/got"], other[f"{case_id}/got"]
        )  # every rank the whole output
    return outputs[0][f"{case_id}/want"], outputs[0][f"{case_id}/got"]


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# -- the tests --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_under_context_parallel_is_the_single_process_output(ranks, fmt, compute):
    want, got = _result(ranks, f"{fmt}-{compute}")
    assert want.shape == (1, 16, 2, 8, 8) and torch.isfinite(want).all()
    if (fmt, compute) in DYNAMIC_SCALE:
        pytest.skip("a dynamic per-tensor activation scale: held to its bound below")
    assert torch.equal(got, want), float((got.float() - want.float()).abs().max())


@pytest.mark.parametrize("when", ["before", "after", "before-group", "after-group"])
@pytest.mark.parametrize("fmt", OFFLOADED)
def test_block_offload_before_or_after_context_parallel_changes_nothing(ranks, fmt, when):
    """Ours (`enable_block_offload`) or diffusers' group offload, before or after `enable_context_parallel`."""
    want, got = _result(ranks, f"{fmt}-offload-{when}")
    assert torch.equal(got, want)
    assert torch.equal(got, _result(ranks, f"{fmt}-fast")[0])  # the same model without offload


def test_comfy_fp8_kernel_with_a_dynamic_scale_keeps_to_its_bound(ranks):
    """The rank-local dynamic scale quantizes the activations as validly as the global one: the CP output's error
    against the eager reference is within the single-process kernel's own error (times the slack), and it differs
    from the single-process output (by no more than the two errors together)."""
    single, parallel = _result(ranks, "comfy_fp8-kernel")
    reference, _ = _result(ranks, "comfy_fp8-dequantize")
    own, under_cp = _rel_l2(single, reference), _rel_l2(parallel, reference)
    print(
        f"\ncomfy_fp8 kernel, relative L2 error to the reference: one process {own:.4g}, two ranks {under_cp:.4g}"
    )
    assert 0 < own < 0.1  # quantized activations, close to the reference
    assert under_cp <= DYNAMIC_SCALE_SLACK * own, (under_cp, own)
    assert _rel_l2(parallel, single) <= own + under_cp
    assert not torch.equal(parallel, single)  # the scale is the rank's: were it equal, this bound is moot


@pytest.mark.parametrize("compute", ["kernel", "dequantize"])
def test_comfy_fp8_with_a_calibrated_input_scale_is_exact(ranks, compute):
    want, got = _result(ranks, f"comfy_fp8-calibrated-{compute}")
    assert torch.equal(got, want)
    if compute == "kernel":
        dynamic, _ = _result(ranks, "comfy_fp8-kernel")
        assert not torch.equal(want, dynamic)  # the stored scale was used, not the dynamic one


@pytest.mark.parametrize("fmt", ["torchao_fp8", "torchao_int8", "gguf"])
def test_diffusers_own_loading_of_our_files_under_context_parallel(ranks, fmt):
    want, got = _result(ranks, f"diffusers-{fmt}")
    assert torch.isfinite(want).all() and torch.equal(got, want)


def test_hunyuanvideo15_under_diffusers_own_call_stops_at_its_query_and_key_mask(ranks):
    """diffusers 0.42.1's HunyuanVideo15AttnProcessor2_0 builds a [B, 1, S, S] mask from the tokens a rank holds;
    Ulysses gathers a mask along the keys only, so SDPA gets [B, 1, S/2, S] against S queries, whatever the plan.
    When this fails, diffusers' processor changed: `Family.cp_masks_on_keys` may no longer be needed."""
    _, _, reports, _ = ranks
    for report in reports:
        assert "must match the size of tensor b" in report["hunyuanvideo15-bare"].get("error", ""), report[
            "hunyuanvideo15-bare"
        ]


def test_hunyuanvideo15_under_its_plan_is_the_single_process_output(ranks):
    """`enable_context_parallel` with the family's plan and its masks on the keys gives the single-process output
    to float32 rounding, not bit for bit: a rank holds a share of both the image and the text tokens, so after
    Ulysses' all-to-all the joint attention sums its keys as [image 0, text 0, image 1, text 1], one process as
    [image, text]. Padded text tokens make a mask split at one block only fail (0.026). One process, after the fix
    went in, computes as before, bit for bit."""
    want, got = _result(ranks, "hunyuanvideo15")
    _, outputs, _, _ = ranks
    assert want.dtype == torch.float32 and torch.isfinite(want).all()
    assert torch.equal(outputs[0]["hunyuanvideo15/after"], want)
    ulp = torch.finfo(torch.float32).eps * float(want.abs().max())
    assert float((got - want).abs().max()) <= HV15_ULPS * ulp


def test_hunyuanvideo15s_plan_is_declared_by_its_family_and_a_class_without_one_is_named(tmp_path):
    """HunyuanVideo 1.5's class ships no `_cp_plan`; its family declares one (image tokens, text tokens and their
    mask split at the first block, the rotary tables as RoPE returns them, the output gathered). A class with
    neither is refused naming it, before anything distributed is touched."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    assert diffusers.HunyuanVideo15Transformer3DModel._cp_plan is None
    plan = get_family("hunyuanvideo15").cp_plan({})
    split = {**plan["transformer_blocks.0"], **plan["transformer_blocks.*"]}
    assert set(plan["transformer_blocks.0"]) == {"hidden_states", "encoder_hidden_states"}
    assert set(plan["transformer_blocks.*"]) == {"attention_mask"}  # every block is given the whole mask
    assert all(isinstance(v, ContextParallelInput) and v.split_dim == 1 for v in split.values())
    assert all(v.split_output and v.split_dim == 0 for v in plan["rope"].values())
    assert isinstance(plan["proj_out"], ContextParallelOutput)
    assert get_family("wan").cp_plan({}) is None  # diffusers' own plan for Wan is used

    model = diffusers.Kandinsky5Transformer3DModel.from_pretrained(models.kandinsky5(tmp_path / "k5"))
    assert model._cp_plan is None
    with pytest.raises(ValueError, match=r"^Kandinsky5Transformer3DModel has no context-parallel plan") as e:
        enable_context_parallel(model, diffusers.ContextParallelConfig(ulysses_degree=2))
    assert "\n" not in str(e.value)


def test_the_device_count_workaround_patches_only_where_diffusers_divides_by_zero():
    """diffusers 0.42.x divides by ``torch.accelerator.device_count()`` (0 without an accelerator); inside the
    workaround it is at least 1, and put back after, an error or not."""
    import inspect

    from diffusers.models.modeling_utils import ModelMixin

    count = torch.accelerator.device_count
    assert "% torch.accelerator.device_count()" in inspect.getsource(ModelMixin._resolve_parallel_config)
    assert needs_device_count_workaround() == (count() == 0)
    with pytest.raises(RuntimeError, match="inside"), accelerator_count_at_least_one():
        assert torch.accelerator.device_count() >= 1
        raise RuntimeError("inside")
    assert torch.accelerator.device_count is count


def test_without_the_workaround_diffusers_divides_by_zero_on_the_cpu(ranks):
    """The workaround is needed: diffusers' own `enable_parallelism` on the ranks (no accelerator) fails as the
    workaround says, and passes where an accelerator is counted."""
    _, _, reports, _ = ranks
    for report in reports:
        if needs_device_count_workaround():
            assert report["bare"].get("error", "").startswith("ZeroDivisionError"), report["bare"]
        else:
            assert "error" not in report["bare"], report["bare"]
