"""Shared fixtures: small checkpoints with real key names, and the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.synthetic import write_wan_example

QUANTIZE = str(Path(sys.executable).with_name("quantize"))


@pytest.fixture(scope="session")
def wan_tiny(tmp_path_factory) -> Path:
    """A tiny Wan2.1 T2V checkpoint (original names, bf16, sharded with an index). Read-only: copy before changing."""
    root = tmp_path_factory.mktemp("wan-tiny")
    return write_wan_example(root / "Wan2.1-T2V-tiny", "tiny", "t2v", max_shard_size=150_000)


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
        return write_wan_example(path, preset, layout, dtype=dtype, **kw)

    return make


def run_cli(*args: str | Path, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed `quantize` console script in a subprocess, as a user would."""
    proc = subprocess.run(
        [QUANTIZE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"quantize {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def load_all(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file directly in `directory`, opened with safetensors itself."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                assert key not in tensors, f"{key} in two shards"
                tensors[key] = f.get_tensor(key)
    return tensors


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
