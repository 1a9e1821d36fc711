"""benchmarks/multi_gpu.py, run for real as a multi-GPU machine runs it: `torchrun --standalone --nproc_per_node 2`,
here on two CPU ranks (gloo, ``--device cpu``), over a tiny Wan2.2-A14B-shaped checkpoint written by the CLI: two
experts, ``high_noise_model`` in comfy_int8 (ComfyUI's file, native names) and ``low_noise_model`` in fp8_channel
(diffusers' names). Two runs: FSDP2 over the blocks and the model with Ulysses over both ranks, against rank 0 alone
with block offload; and FSDP2 over the blocks alone, no context parallelism, no baseline. Each distributed output is
also held, here, to the model loaded by `load_quantized` in this process and run on the inputs the script saved."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from tests import diffusers_models as models
from tests.conftest import run_cli
from tests.loaders.conftest import recipe_for

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

from loaders.parallel import fsdp_problem  # noqa: E402

if fsdp_problem() is not None:
    pytest.skip(fsdp_problem(), allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "multi_gpu.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
#: the experts and the format each is converted to
EXPERTS = {"high_noise_model": "comfy_int8", "low_noise_model": "fp8_channel"}
#: a 5-frame 64x64 video: a 2x8x8 latent, 32 tokens after Wan's 1x2x2 patches, 16 a rank
VIDEO = ["--frames", "5", "--height", "64", "--width", "64", "--text-len", "8"]
#: the issue's target: each rank holds at most this share of the blocks' bytes
BLOCK_SHARE = 0.55


@pytest.fixture(scope="module")
def a14b(tmp_path_factory) -> Path:
    """A tiny Wan (3 blocks) converted by the CLI once per expert's format, the two laid out as A14B's experts."""
    root = tmp_path_factory.mktemp("multi-gpu")
    src = root / "src"
    models.wan(src / "transformer", layers=3)
    ckpt = root / "Wan2.2-T2V-A14B-tiny"
    for expert, fmt in EXPERTS.items():
        out = root / fmt
        run_cli("convert", src, out, "--recipe", recipe_for("wan", fmt, root), check=True)
        shutil.copytree(out / "transformer", ckpt / expert)
    return ckpt


def torchrun(*args: str | Path, code: int = 0) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node 2 benchmarks/multi_gpu.py ARGS --device cpu`, one thread a rank,
    which must exit with `code`."""
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*launcher, "--standalone", "--nproc_per_node", "2", str(SCRIPT), *map(str, args)]
    cmd += ["--device", "cpu", "--threads", "1", *VIDEO]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == code, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    return proc


def single_process_output(folder: Path, saved: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The expert loaded by `load_quantized` in this process, run once on the inputs the script saved for it."""
    from diffusers import WanTransformer3DModel

    from loaders import load_quantized

    model = load_quantized(WanTransformer3DModel, folder)
    model.set_attention_backend("native")
    prefix = f"{name}/"
    inputs = {
        k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix) and k != prefix + "output"
    }
    with torch.inference_mode():
        return model(**inputs, return_dict=False)[0].float()


def check_ranks(result: dict) -> None:
    """Two ranks, each holding part of the blocks (at most BLOCK_SHARE of them), together all of them (a little
    more where a tiny tensor, a 0-d buffer, stays whole on each)."""
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    whole = result["bytes"]["blocks"]
    assert whole > 0
    assert sum(r["block_bytes"] for r in ranks) >= whole, ranks
    for r in ranks:
        assert 0 < r["block_bytes"] <= BLOCK_SHARE * whole, r
        assert r["block_fraction"] == round(r["block_bytes"] / whole, 4)
        assert r["peak_step_bytes"] > 0 and r["step_s"] > 0 and len(r["step_times_s"]) == 1


def test_fsdp_and_ulysses_on_two_ranks_equal_one_device(a14b, tmp_path):
    report_path, outputs_path = tmp_path / "report.json", tmp_path / "outputs.safetensors"
    proc = torchrun(a14b, "--steps", "1", "--json", report_path, "--outputs", outputs_path)
    report = json.loads(report_path.read_text())
    assert report["world_size"] == 2 and report["backend"] == "gloo" and report["device"] == "cpu"
    assert report["parallel"] == {
        "fsdp": True,
        "blocks_only": False,
        "ulysses_degree": 2,
        "attention_backend": "native",
        "compute": "fast",
    }
    assert report["inputs"]["latent"] == [16, 2, 8, 8] and report["inputs"]["tokens"] == 32
    assert list(report["models"]) == list(EXPERTS)
    saved = load_file(outputs_path)
    for name, fmt in EXPERTS.items():
        result = report["models"][name]
        assert result["format"] == fmt
        check_ranks(result)
        assert result["ranks_max_abs_diff"] == 0.0
        baseline = result["baseline"]
        assert baseline["host"] == "pageable" and baseline["equal"] and baseline["max_abs_diff"] == 0.0, (
            baseline
        )
        assert torch.equal(saved[f"{name}/output"], single_process_output(a14b / name, saved, name))
        assert name in proc.stdout  # the table, printed by rank 0
    assert proc.stdout.count("output equal") == len(EXPERTS)


def test_fsdp_over_the_blocks_alone(a14b, tmp_path):
    report_path, outputs_path = tmp_path / "report.json", tmp_path / "outputs.safetensors"
    args = ["--expert", "low_noise_model", "--blocks-only", "--no-cp", "--no-baseline", "--steps", "1"]
    torchrun(a14b, *args, "--json", report_path, "--outputs", outputs_path)
    report = json.loads(report_path.read_text())
    assert report["parallel"]["ulysses_degree"] is None and report["parallel"]["blocks_only"]
    (name,) = report["models"]
    result = report["models"][name]
    assert name == "low_noise_model" and "baseline" not in result
    check_ranks(result)
    for r in result["ranks"]:  # the rest is replicated: every rank holds all of it
        assert r["rest_bytes"] == result["bytes"]["rest"]
    saved = load_file(outputs_path)
    assert torch.equal(saved[f"{name}/output"], single_process_output(a14b / name, saved, name))


def test_a_checkpoint_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "Wan2.1-T2V-14B-fp8"
    proc = torchrun(missing, code=1)  # torchrun's own code for a failed rank; the rank's is 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("multi_gpu.py:")]
    assert lines == [f"multi_gpu.py: {missing}: not found"] * 2  # each rank says it, before any waits
    assert (
        "]: Traceback" not in proc.stderr
    )  # no rank's traceback (torchrun reports the failed rank with its own)
    assert "exitcode  : 2" in proc.stderr
