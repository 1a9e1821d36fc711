"""The tests' two ways of running the CLI: `run_cli` (in this process) must answer as `run_process` (the console
script) does, and leave this process as it found it."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

import tests.conftest
from tests.conftest import run_cli, run_process


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],  # a usage error before any command runs
        ["recipes"],  # a table
        ["plan", "{src}", "-r", "wan-fp8"],
        ["convert", "{src}", "{out}", "-r", "no-such-recipe.yaml"],  # an input error, exit 2
        ["--debug", "convert", "{src}", "{out}", "-r", "nope.yaml"],  # with its traceback
        ["verify", "{out}"],  # a missing checkpoint
    ],
    ids=["usage", "recipes", "plan", "input-error", "debug", "missing"],
)
def test_in_process_answers_as_the_console_script(wan_tiny, tmp_path, args):
    argv = [a.format(src=wan_tiny, out=tmp_path / "out") for a in args]
    here, there = run_cli(*argv), run_process(*argv)
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)
    assert here.stdout or here.stderr  # something was compared


def test_a_run_leaves_this_process_as_it_was(wan_tiny, tmp_path):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    environ = dict(os.environ)
    debug = run_cli(
        "--debug", "convert", wan_tiny, tmp_path / "o", "-r", "nope.yaml", env={"QUANTIZE_X": "1"}
    )
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # not main's, not SIG_IGN
    assert dict(os.environ) == environ
    # --debug was this run's only: the next one's error has no traceback, its usage error no stale command
    plain = run_cli("convert", wan_tiny, tmp_path / "o", "-r", "nope.yaml")
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1
    usage = run_cli("frobnicate")
    assert usage.stderr == run_process("frobnicate").stderr


def test_variables_read_at_import_need_a_process():
    with pytest.raises(ValueError, match=r"\['HF_ENDPOINT'\] are read when huggingface_hub is imported"):
        run_cli("recipes", env={"HF_ENDPOINT": "http://127.0.0.1:1"})


def test_a_thread_left_running_fails_the_call(monkeypatch):
    """In a process of its own, a command that returns with a thread still running would never exit."""
    import quantize.cli

    stop = threading.Event()

    def main(argv):
        threading.Thread(target=stop.wait, name="left-behind").start()
        sys.exit(0)

    monkeypatch.setattr(quantize.cli, "main", main)
    monkeypatch.setattr(tests.conftest, "THREAD_GRACE", 0.1)
    try:
        with pytest.raises(AssertionError, match=r"left threads running.*\['left-behind'\]"):
            run_cli("recipes")
    finally:
        stop.set()
