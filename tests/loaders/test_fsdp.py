"""torch's FSDP2 (`fully_shard`) over models from `load_quantized`, on two CPU ranks (gloo) spawned here: every
format, sharded over each block then the model with nothing else to call, runs the single-process output bit for
bit, each rank holding about half of the blocks' bytes (the quantized parts are parameters of their bytes, which
FSDP2 shards); a group per quantized Linear (a weight gathered with its scales alone) too; and FSDP2 with diffusers'
context parallelism (Ulysses over the same two ranks) on top.

One spawn for the module: each rank runs every case and writes its outputs (safetensors) and figures (json).
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
import torch

if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is absent: no CPU ranks to run", allow_module_level=True)

from loaders.parallel import fsdp_problem, held_bytes

if fsdp_problem() is not None:
    pytest.skip(fsdp_problem(), allow_module_level=True)

import diffusers
from safetensors.torch import load_file, save_file

from tests import diffusers_models as models
from tests.loaders.conftest import FORMATS

WORLD = 2
#: how each case shards: over the blocks then the model; a group per quantized Linear; blocks and Ulysses; blocks
#: with a mixed-precision policy casting parameters to bf16 (a user's training habit)
LAYOUTS = ("blocks", "linears", "blocks+cp", "blocks+mp")
#: the largest share of the blocks' bytes a rank may hold (FSDP2 pads each parameter to a multiple of the ranks)
MOST_HELD = 0.55


# -- what each rank runs ----------------------------------------------------------------------------------------


def _blocks(model):
    from loaders import find_blocks

    return [block for _, block in find_blocks(model)]


def _shard(model: torch.nn.Module, layout: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from loaders import QuantizedLinear

    policy = {}
    if layout == "blocks+mp":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)}
    if layout == "linears":
        for module in [m for m in model.modules() if isinstance(m, QuantizedLinear)]:
            fully_shard(module)
    else:
        for block in _blocks(model):
            fully_shard(block, **policy)
    fully_shard(model, **policy)
    if layout == "blocks+cp":
        from diffusers import ContextParallelConfig

        from loaders.parallel import enable_context_parallel

        enable_context_parallel(model, ContextParallelConfig(ulysses_degree=WORLD))


def _run_case(case: dict) -> dict:
    from loaders import load_quantized

    def load():
        return load_quantized(
            diffusers.WanTransformer3DModel, case["path"], dtype=torch.bfloat16, compute=case["compute"]
        )

    with torch.no_grad():
        single = load()
        if case["layout"] == "blocks+mp":  # what the policy does to the floating parameters, in one process
            single.to(torch.bfloat16)
        want = single(**models.wan_inputs(0))[0]
        model = load()
        _shard(model, case["layout"])
        dtype = str(model.dtype)  # diffusers' ModelMixin.dtype: the first floating parameter's
        got = model(**models.wan_inputs(0))[0]
    held, whole = held_bytes(_blocks(model))
    return {"got": got.contiguous(), "want": want.contiguous()}, {
        "held": held,
        "whole": whole,
        "dtype": dtype,
    }


def _rank(rank: int, where: str) -> None:
    torch.set_num_threads(1)
    root = Path(where)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank, world_size=WORLD
    )
    from diffusers.models.attention_dispatch import attention_backend

    cases = json.loads((root / "cases.json").read_text())
    outputs, report = {}, {}
    for case_id, case in cases.items():
        try:
            with attention_backend("native"):
                tensors, figures = _run_case(case)
            outputs.update({f"{case_id}/{k}": v for k, v in tensors.items()})
            report[case_id] = figures
        except Exception:
            report[case_id] = {"error": traceback.format_exc()}
    save_file(outputs, str(root / f"outputs-{rank}.safetensors"))
    (root / f"report-{rank}.json").write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


# -- the cases, and one spawn for them all ----------------------------------------------------------------------


def _id(fmt: str, compute: str, layout: str) -> str:
    return f"{fmt}-{compute}-{layout}"


CASES = [
    *[(fmt, compute, "blocks") for fmt in FORMATS for compute in ("fast", "dequantize")],
    *[(fmt, "fast", "linears") for fmt in FORMATS],
    *[(fmt, "fast", "blocks+cp") for fmt in FORMATS],
    ("comfy_fp8", "dequantize", "blocks+mp"),
]


@pytest.fixture(scope="module")
def ranks(converted, tmp_path_factory):
    """Every case on two spawned ranks: (rank 0's and rank 1's outputs, their reports)."""
    root = tmp_path_factory.mktemp("fsdp")
    cases = {
        _id(fmt, compute, layout): {
            "path": str(converted("wan", fmt)[1]),
            "compute": compute,
            "layout": layout,
        }
        for fmt, compute, layout in CASES
    }
    (root / "cases.json").write_text(json.dumps(cases))
    torch.multiprocessing.start_processes(_rank, args=(str(root),), nprocs=WORLD, start_method="spawn")
    outputs = [load_file(str(root / f"outputs-{r}.safetensors")) for r in range(WORLD)]
    reports = [json.loads((root / f"report-{r}.json").read_text()) for r in range(WORLD)]
    return outputs, reports


def _case(ranks, case_id: str) -> list[tuple[dict, dict]]:
    outputs, reports = ranks
    for report in reports:
        assert "error" not in report[case_id], report[case_id].get("error")
    return [
        ({k.split("/")[1]: v for k, v in out.items() if k.startswith(case_id + "/")}, report[case_id])
        for out, report in zip(outputs, reports, strict=True)
    ]


EXACT = [c for c in CASES if c[2] != "blocks+mp"]


@pytest.mark.parametrize("fmt, compute, layout", EXACT, ids=[_id(*c) for c in EXACT])
def test_a_sharded_model_runs_the_single_process_output_exactly(ranks, fmt, compute, layout):
    for out, _ in _case(ranks, _id(fmt, compute, layout)):
        assert torch.equal(out["got"], out["want"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_rank_holds_about_half_the_blocks_bytes_and_dtype_stays_the_compute_dtype(ranks, fmt):
    ranked = _case(ranks, _id(fmt, "fast", "blocks"))
    for _, figures in ranked:
        assert figures["held"] <= MOST_HELD * figures["whole"], figures
        assert figures["dtype"] == "torch.bfloat16"
    # the shards add up to the whole, padding aside
    assert sum(f["held"] for _, f in ranked) >= ranked[0][1]["whole"]


def test_a_mixed_precision_policy_never_casts_the_stored_bytes(ranks):
    """`MixedPrecisionPolicy(param_dtype=bf16)` (needless: the weights are in their compute dtype) casts the
    floating parameters alone: the output is the single-process model's with its floating parameters in bf16
    (`model.to(torch.bfloat16)`, the kept float32 ones cast too), exactly; the parts' bytes are never cast."""
    for out, _ in _case(ranks, _id("comfy_fp8", "dequantize", "blocks+mp")):
        assert torch.equal(out["got"], out["want"])
