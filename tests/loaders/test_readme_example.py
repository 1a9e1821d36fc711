"""The README's loaders example runs as written (in a scratch directory, with the installed `quantize`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import diffusers  # noqa: F401  (a dev dependency: missing is a failure, not a skip)
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow
def test_the_readme_loaders_example_runs(tmp_path):
    text = README.read_text()
    match = re.search(r"<!-- example:loaders -->\n```python\n(.*?)```", text, re.S)
    assert match, "README lost its marked loaders example"
    script = tmp_path / "example.py"
    script.write_text(match.group(1))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FP8ChannelLinear (1, 16, 2, 16, 16) OffloadStats(block_copies=" in proc.stdout
