"""No pickle anywhere: our code never calls it, and nothing a whole session runs unpickles anything.

A pickle runs code when it is read; a checkpoint from the Hub is untrusted input. Everything here reads
safetensors, JSON and YAML (safe_load) only, but for one call: Wan's umT5 ships as a ``.pth``, which
`quantize/read/pth.py` opens with torch's weights-only unpickler over a memory map (``torch.load(weights_only=True,
mmap=True)``: tensors and plain containers, no class, no function, no code). That call, with those two arguments as
written constants, is the only one admitted, and a session of our usual commands opens no ``.pth`` at all.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "quantize", ROOT / "loaders"]
#: modules that unpickle (or load code or objects from bytes)
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
#: calls that unpickle: torch.load and its kin, numpy with allow_pickle, yaml's unsafe loaders
FORBIDDEN_CALLS = {
    "torch.load",
    "torch.serialization.load",
    "torch.jit.load",
    "torch.package.PackageImporter",
    "np.load",
    "numpy.load",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "pd.read_pickle",
    "pandas.read_pickle",
}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


#: the one module that may call torch.load, and what each of its calls must pass, as constants
WEIGHTS_ONLY_READER = "quantize/read/pth.py"
WEIGHTS_ONLY = {"weights_only": True, "mmap": True}


def _weights_only(call: ast.Call) -> bool:
    """Whether a call passes ``weights_only=True`` and ``mmap=True`` as written constants (no ``**kwargs``)."""
    given = {k.arg: k.value.value for k in call.keywords if k.arg and isinstance(k.value, ast.Constant)}
    return all(given.get(k) is v for k, v in WEIGHTS_ONLY.items()) and all(k.arg for k in call.keywords)


def _violations(path: Path, root: Path = ROOT) -> list[str]:
    """Each forbidden import or call in the file at `path`, as `path relative to root:line: what` (`torch.load`
    admitted in `WEIGHTS_ONLY_READER` alone, called with `WEIGHTS_ONLY`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    admitted = {
        id(node.func)
        for node in ast.walk(tree)
        if path.relative_to(root).as_posix() == WEIGHTS_ONLY_READER
        and isinstance(node, ast.Call)
        and _dotted(node.func) == "torch.load"
        and _weights_only(node)
    }
    for node in ast.walk(tree):
        if id(node) in admitted:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):  # a call, or a reference passed on
            name = _dotted(node)
            if name in FORBIDDEN_CALLS:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
            continue
        else:
            continue
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES or name in FORBIDDEN_CALLS:
                found.append(f"{path.relative_to(root)}:{node.lineno}: import {name}")
    return found


def test_no_module_of_ours_imports_pickle_or_calls_torch_load():
    files = [p for package in PACKAGES for p in sorted(package.rglob("*.py"))]
    assert len(files) > 20
    violations = [v for f in files for v in _violations(f)]
    assert violations == []


def test_the_one_weights_only_reader_is_admitted_with_its_arguments_alone(tmp_path):
    """The reader's call passes; the same call elsewhere, or there without either argument, or with them from a
    variable, does not."""
    reader = tmp_path / WEIGHTS_ONLY_READER
    reader.parent.mkdir(parents=True)
    ok = "import torch\nx = torch.load(p, map_location='cpu', weights_only=True, mmap=True)\n"
    reader.write_text(ok)
    assert _violations(reader, root=tmp_path) == []
    for bad in (
        "torch.load(p, weights_only=True)",
        "torch.load(p, weights_only=w, mmap=True)",
        "torch.load(p, **k)",
    ):
        reader.write_text(f"import torch\nx = {bad}\n")
        assert _violations(reader, root=tmp_path) == [f"{WEIGHTS_ONLY_READER}:2: torch.load"], bad
    elsewhere = tmp_path / "quantize" / "read" / "other.py"
    elsewhere.write_text(ok)
    assert _violations(elsewhere, root=tmp_path) == ["quantize/read/other.py:2: torch.load"]


def test_the_scanner_catches_what_it_must(tmp_path):
    """The scan above cannot pass by being blind. The probe is a module of a private copy of the package's
    place (never written into the package, which other test processes scan at the same time)."""
    bad = tmp_path / "quantize" / "_scan_probe.py"
    bad.parent.mkdir()
    bad.write_text(
        "import pickle\nfrom torch import load\nimport torch\nx = torch.load('a.pt')\ny = yaml.load(s)\n"
    )
    found = _violations(bad, root=tmp_path)
    assert sorted(found) == [
        "quantize/_scan_probe.py:1: import pickle",
        "quantize/_scan_probe.py:2: import torch.load",
        "quantize/_scan_probe.py:4: torch.load",
        "quantize/_scan_probe.py:5: yaml.load",
    ]


# Installed as `sitecustomize` in every Python process of the session (the CLI's included): logs any unpickling
# (the "pickle.find_class" audit event), and any pickle-format checkpoint opened.
_AUDIT = """
import os, sys
_LOG = os.environ["NO_PICKLE_LOG"]
_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

def _hook(event, args):
    if event == "pickle.find_class":
        what = f"unpickled {args[0]}.{args[1]}"
    elif event == "open" and isinstance(args[0], str) and args[0].endswith(_SUFFIXES):
        what = f"opened {args[0]}"
    else:
        return
    with open(_LOG, "a") as f:
        f.write(f"{sys.argv[0]}: {what}\\n")

sys.addaudithook(_hook)
"""


RECIPES = ("wan-fp8", "wan-nf4", "wan-torchao-fp8")


@pytest.mark.slow
def test_a_whole_session_unpickles_nothing(tmp_path):
    import diffusers  # noqa: F401  (a dev dependency: missing is a failure, not a skip)

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_AUDIT)
    log = tmp_path / "pickle.log"
    log.touch()
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "NO_PICKLE_LOG": str(log),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    work = tmp_path / "work"
    work.mkdir()
    readme = (ROOT / "README.md").read_text()
    example = readme.split("<!-- example:loaders -->\n```python\n", 1)[1].split("```", 1)[0]
    (work / "example.py").write_text(example)
    steps = [
        ["quantize", "example", "wan", "--preset", "tiny"],
        *(["quantize", "convert", "wan", r, "-r", r] for r in ("wan-fp8", "wan-nf4", "wan-torchao-fp8")),
        # verify re-encodes the source: bitsandbytes' and torchao's readers (fp8_channel's is ours alone)
        *(["quantize", "verify", r, "--source", "wan"] for r in ("wan-nf4", "wan-torchao-fp8")),
        ["quantize", "inspect", "wan-nf4"],
        [sys.executable, "example.py"],  # diffusers model, conversion, our loader, block offload, a forward
    ]
    for step in steps:
        proc = subprocess.run(step, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{step}: {proc.stderr[-2000:]}"
    probe = subprocess.run(
        [sys.executable, "-c", "import pickle; pickle.loads(pickle.dumps(complex(1, 2)))"], env=env
    )
    assert probe.returncode == 0
    lines = log.read_text().splitlines()
    assert lines and all("builtins.complex" in line for line in lines), (
        lines
    )  # only the probe's, which proves the hook works
