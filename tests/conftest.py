"""Shared fixtures: small checkpoints with real key names, and the CLI, run in this process or in its own.

`run_cli` calls `quantize.cli.main(argv)` here, its output captured (a second or two less per call than a
process: no interpreter, torch or diffusers to start); `run_process` runs the installed console script, for
what only a process shows (signals, a kill, imports a process must not make, environment variables read at
import, output that depends on what the process imported before)."""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.examples import write_example

QUANTIZE = str(Path(sys.executable).with_name("quantize"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, saying why, where torch sees no CUDA device."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not torch.cuda.is_available():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session")
def wan_tiny(tmp_path_factory) -> Path:
    """A tiny Wan2.1 T2V checkpoint (original names, bf16, sharded with an index). Read-only: copy before changing."""
    root = tmp_path_factory.mktemp("wan-tiny")
    return write_example(root / "Wan2.1-T2V-tiny", "tiny", "t2v", max_shard_size=1_100_000)  # 3 shards


@pytest.fixture
def make_wan(tmp_path):
    """Build a Wan-shaped checkpoint: make_wan(layout="t2v", dtype=torch.bfloat16, preset="tiny", ...)."""

    def make(
        layout: str = "t2v",
        dtype: torch.dtype = torch.bfloat16,
        preset: str = "tiny",
        name: str | None = None,
        **kw,
    ) -> Path:
        path = tmp_path / (name or f"wan-{layout}-{str(dtype).removeprefix('torch.')}")
        return write_example(path, preset, layout, dtype=dtype, **kw)

    return make


#: what the console script ran with: wide lines, as a log or a pipe gets them (rich reads it when the consoles are
#: made, so run_cli imports the CLI with it set)
CLI_ENV = {"COLUMNS": "200"}
#: environment variables that huggingface_hub reads once, when imported: run_cli cannot honour them
_READ_AT_IMPORT = ("HF_",)


def run_cli(*args: str | Path, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `quantize ARGS` in this process, as the console script would: `quantize.cli.main(argv)` with stdout
    and stderr captured (not terminals), the exit code from its SystemExit, `env` set for the call; a thread
    it leaves running fails the call (it would keep a process from exiting).

    Whatever the call changes in this process is put back afterwards: the environment (the CLI sets
    DIFFUSERS_VERBOSITY), the SIGINT/SIGTERM handlers (main installs its own, then ignores both), the CLI's
    settings (--debug), the levels of existing loggers, torch's thread count, the collector's frozen objects.
    QUANTIZE_TEST_CLI=process makes it run_process, to tell a difference of the two apart from a bug."""
    if os.environ.get("QUANTIZE_TEST_CLI") == "process":  # every CLI call of the suite a process, to compare
        return run_process(*args, check=check, env=env)
    argv = [str(a) for a in args]
    late = sorted(k for k in env or {} if k.startswith(_READ_AT_IMPORT))
    if late:
        raise ValueError(f"{late} are read when huggingface_hub is imported: use run_process")
    with _restored_process_state(), _captured() as (stdout, stderr):
        os.environ.update({**CLI_ENV, **(env or {})})
        from quantize.cli import main  # first imported here: its consoles see CLI_ENV and no terminal

        with _restored_cli_settings():
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = _exit_status(e.code, stderr)
    proc = subprocess.CompletedProcess(["quantize", *argv], code, _text(stdout), _text(stderr))
    _check(proc, check)
    return proc


def run_process(
    *args: str | Path, check: bool = False, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """Run the installed `quantize` console script in a process of its own, as a user would (`kwargs` go to
    subprocess.run: preexec_fn, timeout)."""
    proc = subprocess.run(
        [QUANTIZE, *map(str, args)],
        capture_output=True,
        text=True,
        **{"timeout": 600, **kwargs},
        env=process_env(env),
    )
    _check(proc, check)
    return proc


def process_env(env: dict | None = None) -> dict[str, str]:
    """The environment the console script runs with: this one, CLI_ENV, then `env`."""
    return {**os.environ, **CLI_ENV, **(env or {})}


def _check(proc: subprocess.CompletedProcess, check: bool) -> None:
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(proc.args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")


def _exit_status(code, stderr: io.TextIOWrapper) -> int:
    """What a process exiting with SystemExit(code) returns: None is 0, a message is printed and 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=stderr)
    return 1


def _pipe() -> io.TextIOWrapper:
    """A stream like the pipe a process writes to: UTF-8 text over bytes, not a terminal, no file descriptor."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    """What was written, read as subprocess.run(text=True) reads a pipe (universal newlines)."""
    stream.flush()
    return stream.buffer.getvalue().decode().replace("\r\n", "\n").replace("\r", "\n")


@contextmanager
def _captured() -> Iterator[tuple[io.TextIOWrapper, io.TextIOWrapper]]:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = pipes = _pipe(), _pipe()
    try:
        yield pipes
    finally:
        sys.stdout, sys.stderr = saved


@contextmanager
def _restored_process_state() -> Iterator[None]:
    environ = dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    loggers = {name: lg.level for name, lg in _loggers().items()}
    frozen = gc.get_freeze_count()
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    running = set(threading.enumerate())
    try:
        yield
        _assert_no_thread_left(running)  # a process would not exit while one runs
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if os.environ != environ:
            os.environ.clear()
            os.environ.update(environ)
        for name, lg in _loggers().items():
            if name in loggers:
                lg.setLevel(loggers[name])
        if frozen == 0 and gc.get_freeze_count():
            gc.unfreeze()  # the CLI freezes what it imported; this process's later garbage must stay collectable
        if threads is not None and sys.modules["torch"].get_num_threads() != threads:
            sys.modules["torch"].set_num_threads(threads)


#: seconds a thread the command started may take to finish after it returned
THREAD_GRACE = 10.0


def _assert_no_thread_left(before: set[threading.Thread]) -> None:
    left = [t for t in threading.enumerate() if t not in before and not t.daemon]
    for t in left:
        t.join(timeout=THREAD_GRACE)
    alive = sorted(t.name for t in left if t.is_alive())
    if alive:
        raise AssertionError(f"the command left threads running, which would keep its process alive: {alive}")


def _loggers() -> dict[str, logging.Logger]:
    found = {
        name: lg for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)
    }
    return {**found, "": logging.getLogger()}


@contextmanager
def _restored_cli_settings() -> Iterator[None]:
    """The CLI's module-level settings dicts (`state`: --debug, the command invoked) as they were before."""
    settings = {}
    for name, module in list(sys.modules.items()):
        if name == "quantize.cli" or name.startswith("quantize.cli."):
            for attr in ("state", "_state"):
                value = getattr(module, attr, None)
                if isinstance(value, dict):
                    settings[id(value)] = (value, dict(value))
    try:
        yield
    finally:
        for value, saved in settings.values():
            value.clear()
            value.update(saved)


def load_all(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file directly in `directory`, opened with safetensors itself."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                assert key not in tensors, f"{key} in two shards"
                tensors[key] = f.get_tensor(key)
    return tensors


#: the Linears that wan-fp8 (and the recipes split like it) quantize, in Wan's original names: the attention
#: projections and the FFN's first layer of every block (the recipe's own patterns, written out again here)
WAN_FP8_TARGETS = re.compile(r"blocks\.\d+\.((self_attn|cross_attn)\.(q|k|v|o|k_img|v_img)|ffn\.0)")


def wan_fp8_modules(directory: Path) -> set[str]:
    """The modules of the checkpoint in `directory` that wan-fp8 quantizes, found from its tensors' names and
    shapes (not from our plan): what a test on that fixture counts, whatever its preset."""
    return {
        name.removesuffix(".weight")
        for name, t in load_all(directory).items()
        if name.endswith(".weight")
        and t.dim() == 2
        and WAN_FP8_TARGETS.fullmatch(name.removesuffix(".weight"))
    }


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def skip_without_kernel(module, x: torch.Tensor) -> None:
    """Skip, saying why, where `module`'s kernel does not run on `x` here (an older torch without a CPU kernel: the
    floor's CPU `_scaled_mm` has no row-wise scales and no bf16 output), instead of failing on what is missing."""
    problem = module.kernel_problem(x)
    if problem is not None:
        pytest.skip(
            f"{type(module).__name__} has no kernel on {x.device} for {x.dtype} with torch {torch.__version__}: {problem}"
        )


def skip_without_kquant_encoder(ggml_type: str) -> None:
    """Skip where the K-quants' encoder (ggml's own quantizer, through ggml-python) is not installed (the GPU
    machine's bundle has no ggml-python: it builds from source)."""
    import importlib.util

    if ggml_type.endswith("_K") and importlib.util.find_spec("ggml") is None:
        pytest.skip(f"{ggml_type} needs ggml's own quantizer: ggml-python is not installed")
