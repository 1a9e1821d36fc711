"""benchmarks/gpu_check.py (`make gpu-check`) on a machine without a GPU: one line saying what it skipped and why,
exit 0, nothing written; and its report, from the records its steps print, as it would be written on a GPU."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
    stdout = "\n".join(
        g.RECORD + line
        for line in (
            '{"kind": "row", "table": "h2d", "row": {"memory": "pageable", "gbps": 24.5, "lo": 24.0, "hi": 25.0, '
            '"runs": 5, "bytes": 1073741824}}',
            '{"kind": "row", "table": "linear", "row": {"scheme": "bf16 F.linear", "kernel": "k", "shape": [5120, 5120], '
            '"tokens": 8192, "sizes": "Wan2.1-14B", "ms": 0.5, "lo": 0.5, "hi": 0.6, "runs": 10, "tflops": 859.0}}',
            '{"kind": "row", "table": "linear", "row": {"scheme": "FP8Linear", "kernel": "k", "shape": [5120, 5120], '
            '"tokens": 8192, "sizes": "Wan2.1-14B", "ms": 0.3, "lo": 0.3, "hi": 0.4, "runs": 10, "tflops": 1431.0, '
            '"fast": true, "sqnr_db": 31.2, "encode_s": 0.4}}',
            '{"kind": "note", "table": "offload", "text": "Model: 8 of its 40 layers"}',
            '{"kind": "row", "table": "offload", "row": {"case": "resident on the GPU", "ms": 1000.0, "lo": 990.0, '
            '"hi": 1010.0, "runs": 3, "peak_bytes": 16106127360}}',
            '{"kind": "row", "table": "offload", "row": {"case": "pinned", "ms": 1050.0, "lo": 1040.0, "hi": 1060.0, '
            '"runs": 3, "peak_bytes": 3221225472, "copied": 14000000000}}',
            '{"kind": "skip", "what": "NF4Linear", "why": "bitsandbytes has no CUDA backend here"}',
            "not JSON",
        )
    )
    for record in g.records_in(stdout + "\nplain output\n"):
        findings.take(record)
    assert capsys.readouterr().out == "gpu-check: skipped NF4Linear: bitsandbytes has no CUDA backend here\n"
    assert findings.figures == 5

    body = g.report(
        tests, findings, "GPU: NVIDIA H200", "python benchmarks/gpu_check.py --write docs/BENCHMARKS.md"
    )
    assert (
        "| FP8Linear | k | [5120, 5120] | yes | 0.300 (0.300 - 0.400) | 0.60x | 1.43e+03 | 31.2 | 0.40 |"
        in body
    )
    assert "| pinned | 1050 (1040 - 1060) | 1.05x | 3.00 | 14.00 |" in body
    assert "Target: offloaded step <= 1.1x resident: pinned 1.05x: met." in body
    assert "- Model: 8 of its 40 layers" in body and "- GPU: NVIDIA H200" in body
    assert body.splitlines()[-1] == "Skipped: NF4Linear: bitsandbytes has no CUDA backend here."

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
