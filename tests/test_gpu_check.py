"""benchmarks/gpu_check.py (`make gpu-check`) on a machine without a GPU: one line saying what it skipped and why,
exit 0, nothing written; and its report, from the records its steps print, as it would be written on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def test_without_cuda_it_says_what_it_skipped_in_one_line_and_writes_nothing(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    shutil.copyfile(REPO / "docs" / "BENCHMARKS.md", doc)
    before, mtime = doc.read_bytes(), doc.stat().st_mtime_ns
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device, on a GPU machine too
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--write", str(doc)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu-check: skipped everything: no CUDA device (torch ")
    assert "sees none" in lines[0]
    assert doc.read_bytes() == before and doc.stat().st_mtime_ns == mtime
    assert list(tmp_path.iterdir()) == [doc]


def _gpu_check(monkeypatch):
    """The script as a module; the sys.path entries it adds (benchmarks/, the repo) go when the test ends."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


PYTEST_OUT = """\
..F.s                                                                    [100%]
FAILED tests/loaders/test_loader_modules.py::test_gpu_forward_matches_the_cpu_forward[dtype0-NF4Linear] - 3 passed
SKIPPED [1] tests/test_pipelines.py:151: needs a GPU driver
3 passed, 1 failed, 1 skipped, 855 deselected in 41.20s
"""


LINEAR = {"shape": [5120, 5120], "tokens": 8192, "sizes": "Wan2.1-14B", "runs": 10}
RAW = {**LINEAR, "lo": 0.5, "hi": 0.6, "tflops": 859.0}


def _row(table: str, **row) -> dict:
    return {"kind": "row", "table": table, "row": row}


#: what the steps print on an H200, one record of each kind of row
RECORDS = [
    _row("h2d", memory="pageable", gbps=24.5, lo=24.0, hi=25.0, runs=5, bytes=1 << 30),
    _row("linear", scheme="bf16 F.linear", kernel="k", **LINEAR, ms=0.5, lo=0.5, hi=0.6, tflops=859.0),
    _row(
        "linear", scheme="FP8Linear", kernel="k", **LINEAR, ms=0.3, lo=0.3, hi=0.4, tflops=1431.0, fast=True,
        sqnr_db=31.2, encode_s=0.4,
    ),
    _row(
        "linear", scheme="NVFP4Linear", kernel="k", **LINEAR, ms=2.0, lo=2.0, hi=2.1, tflops=215.0, fast=False,
        sqnr_db=20.1, encode_s=1.2, lacks="needs SM100+, this is SM90",
    ),
    {"kind": "note", "table": "offload", "text": "Model: 8 of its 40 layers"},
    _row(
        "offload", case="fp8, resident on the GPU", linears="fp8", placement="resident", ms=1000.0, lo=990.0,
        hi=1010.0, runs=3, peak_bytes=16106127360,
    ),
    _row(
        "offload", case="bf16 `nn.Linear`s, resident on the GPU", linears="bf16", placement="resident",
        ms=1400.0, lo=1390.0, hi=1410.0, runs=3, peak_bytes=32212254720,
    ),
    _row(
        "offload", case="pageable", linears="fp8", placement="pageable", ms=1300.0, lo=1290.0, hi=1310.0,
        runs=3, peak_bytes=3221225472, copied=14000000000,
    ),
    _row(
        "offload", case="pinned", linears="fp8", placement="pinned", ms=1050.0, lo=1040.0, hi=1060.0, runs=3,
        peak_bytes=3221225472, copied=14000000000,
    ),
    _row("raw", op="`F.linear`", operands="bf16", fast_accum=None, module=None, **RAW, ms=0.5),
    _row("raw", op="`torch._scaled_mm`", operands="fp8 rows", fast_accum=False, module="FP8Linear", **RAW, ms=0.25),
    _row("raw", op="`torch._scaled_mm`", operands="fp8 rows", fast_accum=True, module=None, **RAW, ms=0.2),
    {"kind": "note", "table": "ckpt", "text": "Source: 2 of 40 blocks"},
    _row(
        "ckpt", format="fp8_channel", convert_s=4.2, out_bytes=1310000000, load_s=1.5, load_peak_bytes=2684354560,
        fast=True, quantized=16, layers=2, ms=120.0, lo=118.0, hi=125.0, runs=3, peak_bytes=3328599654,
    ),
    {"kind": "skip", "what": "NF4Linear", "why": "bitsandbytes has no CUDA backend here"},
]  # fmt: skip


def test_the_report_from_its_steps_records(tmp_path, capsys, monkeypatch):
    g = _gpu_check(monkeypatch)
    counts, failures = g.parse_pytest(PYTEST_OUT)
    assert counts == {"passed": 3, "failed": 1, "skipped": 1, "deselected": 855}
    assert failures == [PYTEST_OUT.splitlines()[1]]
    tests = g.TestRun(counts, 41.2, False, 1, failures)
    assert tests.failed == 1 and tests.summary() == "3 GPU tests passed, 1 failed, 1 skipped"
    assert g.TestRun({}, 150.0, True, None, []).failed == 1  # did not finish: not a pass
    assert g.TestRun({"deselected": 855}, 9.0, False, 5, []).failed == 0  # no GPU test collected

    findings = g.Findings()
    stdout = "\n".join([*(g.RECORD + json.dumps(r) for r in RECORDS), g.RECORD + "not JSON", "plain output"])
    for record in g.records_in(stdout):
        findings.take(record)
    assert capsys.readouterr().out == "gpu-check: skipped NF4Linear: bitsandbytes has no CUDA backend here\n"
    assert findings.figures == 12

    body = g.report(
        tests, findings, "GPU: NVIDIA H200", "python benchmarks/gpu_check.py --write docs/BENCHMARKS.md"
    )
    assert "- GPU: NVIDIA H200" in body
    headings = [ln.split(" (")[0].split(":")[0] for ln in body.splitlines() if ln.startswith("### ")]
    assert headings == [
        "### Host-to-device copies",
        "### One forward step",
        "### Real checkpoints",
        "### Quantized Linear forward at Wan2.1-14B shapes",
        "### Raw GEMMs on ready operands at Wan2.1-14B shapes",
    ]
    # the quantized Linears: NVFP4 below Blackwell decodes by design, which its fast-path cell says
    assert (
        "| FP8Linear | k | [5120, 5120] | yes | 0.300 (0.300 - 0.400) | 0.60x | 1.43e+03 | 31.2 | 0.40 |"
        in body
    )
    assert (
        "| NVFP4Linear | k | [5120, 5120] | no: decodes (needs SM100+) | 2.000 (2.000 - 2.100) | 4.00x |"
        in body
    )
    # each step against the fp8 resident one and the bf16 resident one
    assert "- Model: 8 of its 40 layers" in body
    assert "| fp8, resident on the GPU | 1000 (990 - 1010) | 1.00x | 0.71x | 15.00 | - |" in body
    assert (
        "| bf16 `nn.Linear`s, resident on the GPU | 1400 (1390 - 1410) | 1.40x | 1.00x | 30.00 | - |" in body
    )
    assert "| pageable | 1300 (1290 - 1310) | 1.30x | 0.93x | 3.00 | 14.00 |" in body
    assert "| pinned | 1050 (1040 - 1060) | 1.05x | 0.75x | 3.00 | 14.00 |" in body
    assert (
        "- Target: offloaded step <= 1.1x resident: pageable 1.30x: **not met**; pinned 1.05x: met." in body
    )
    assert (
        "- Target: fp8 step <= 0.80x the bf16 resident step: resident 0.71x: met; pinned 0.75x: met." in body
    )
    # the raw GEMMs against bf16 F.linear at their shape; the module that calls one, against it
    assert "| `F.linear` | bf16 | - | [5120, 5120] | 0.500 (0.500 - 0.600) | 1.00x | 859 | - |" in body
    assert (
        "| `torch._scaled_mm` | fp8 rows | False | [5120, 5120] | 0.250 (0.500 - 0.600) | 0.50x | 859 | "
        "FP8Linear 1.20x |" in body
    )
    assert (
        "| `torch._scaled_mm` | fp8 rows | True | [5120, 5120] | 0.200 (0.500 - 0.600) | 0.40x | 859 | - |"
        in body
    )
    # the real checkpoints
    assert "- Source: 2 of 40 blocks" in body
    assert "| fp8_channel | 2 | 16 | yes | 4.2 | 1.31 | 1.5 | 120 (118 - 125) | 3.10 | 2.50 |" in body
    assert body.splitlines()[-1] == "Skipped: NF4Linear: bitsandbytes has no CUDA backend here."

    # an older record of the offload step (no linears / placement fields) still reads
    old = g.Findings()
    old.take(_row("offload", case="resident on the GPU", ms=1000.0, lo=990.0, hi=1010.0, runs=3))
    old.take(_row("offload", case="pinned", ms=1050.0, lo=1040.0, hi=1060.0, runs=3, copied=1))
    assert "pinned 1.05x: met." in "\n".join(g.offload_lines(old))
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nbefore\n")
    g.update_section(doc, body, (g.START, g.END))
    g.update_section(doc, body, (g.START, g.END))  # replaced, not appended twice
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n") and text.count(g.START) == 1 and text.count(g.END) == 1


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # killed, not yet reaped by whoever inherited it


def test_a_step_past_its_time_guard_is_killed_with_what_it_started_and_keeps_what_it_printed(
    tmp_path, monkeypatch
):
    g = _gpu_check(monkeypatch)
    pid_file = tmp_path / "pid"
    child = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        f'print({g.RECORD!r} + \'{{"kind": "note", "table": "h2d", "text": "partial"}}\', flush=True)\n'
        "time.sleep(60)\n"
    )
    done = g.run_bounded([sys.executable, "-c", child], timeout=3)
    assert done.rc is None and done.seconds < 30
    assert g.records_in(done.stdout) == [{"kind": "note", "table": "h2d", "text": "partial"}]
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)


def test_a_raw_op_that_raises_is_one_skip_line_naming_its_shapes(capsys, monkeypatch):
    g = _gpu_check(monkeypatch)
    refused = g.RAW_OPS[2]  # row-wise `_scaled_mm` with use_fast_accum=True

    def calls(shape, tokens, device):
        def no():
            raise RuntimeError("use_fast_accum is not supported with row-wise scales\nmore")

        return {g.RAW_BASELINE: lambda: None, refused: no}

    monkeypatch.setattr(g, "raw_calls", calls)
    g.step_raw(g.TINY, "cpu")
    records = g.records_in(capsys.readouterr().out)
    rows = [r["row"] for r in records if r["kind"] == "row"]
    assert [(r["op"], r["shape"]) for r in rows] == [("`F.linear`", list(s)) for s in g.TINY.linear_shapes]
    assert [r for r in records if r["kind"] == "skip"] == [
        {
            "kind": "skip",
            "what": "raw torch._scaled_mm row-wise use_fast_accum=True [256, 256], [512, 256], [256, 512]",
            "why": "RuntimeError: use_fast_accum is not supported with row-wise scales",
        }
    ]


def test_the_blackwell_schemes_time_their_decoding_elsewhere_and_say_so_once(capsys, monkeypatch):
    g = _gpu_check(monkeypatch)
    g.step_linear(g.scheme_named("MXFP8Linear"), g.TINY, "cpu")
    records = g.records_in(capsys.readouterr().out)
    rows = [r["row"] for r in records if r["kind"] == "row"]
    assert len(rows) == len(g.TINY.linear_shapes)
    assert all(r["fast"] is False and r["lacks"] == "needs SM100+, this is the CPU" for r in rows)
    assert {g.fast_path_cell(r) for r in rows} == {"no: decodes (needs SM100+)"}
    assert [(r["what"], r["why"]) for r in records if r["kind"] == "skip"] == [
        ("MXFP8Linear fast kernel", "it needs SM100+, this is the CPU: its decoding was timed")
    ]


def _step(*args: str, timeout: float = 300) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--step", *args, "--device", "cpu", "--tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = [ln for ln in done.stdout.splitlines() if ln.startswith("@gpu-check ")]
    return [json.loads(ln.removeprefix("@gpu-check ")) for ln in out]


@pytest.mark.slow
def test_the_offload_step_times_the_fp8_model_and_its_bf16_twin_on_the_cpu():
    records = _step("offload")
    rows = [r["row"] for r in records if r["kind"] == "row"]
    assert [(r["linears"], r["placement"]) for r in rows] == [
        ("fp8", "resident"),
        ("bf16", "resident"),
        ("fp8", "pageable"),
    ]
    assert rows[1]["linear_bytes"] > 0 and rows[2]["copied"] > 0  # the fp8 Linears back in place after
    assert [r["what"] for r in records if r["kind"] == "skip"] == ["block offload from pinned memory"]


@pytest.mark.slow
def test_the_checkpoint_step_converts_loads_and_runs_both_formats_on_the_cpu(tmp_path):
    records = _step("ckpt", "--work", str(tmp_path))
    assert [r for r in records if r["kind"] == "skip"] == []
    (note,) = [r["text"] for r in records if r["kind"] == "note"]
    assert "with its first 2 blocks" in note and "--recipe wan-comfy-int8.yaml" in note
    rows = {r["row"]["format"]: r["row"] for r in records if r["kind"] == "row"}
    assert list(rows) == ["fp8_channel", "comfy_int8"]
    for row in rows.values():
        assert row["layers"] == 2 and row["quantized"] > 0 and row["ms"] > 0 and row["out_bytes"] > 0
    assert rows["comfy_int8"]["fast"] is True  # int8's kernel runs on the CPU; fp8's decodes there
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]  # each output removed once measured
