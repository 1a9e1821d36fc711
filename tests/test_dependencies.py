"""How the packages depend on each other (DESIGN.md), and that a model family is spelled in its module only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "quantize"

#: what only a family's module may spell: its class names, key names and config fields
FAMILY_WORDS = (
    "WanTransformer3DModel",
    "WanModel",
    "Kandinsky5Transformer3DModel",
    "head.modulation",
    "self_attn",
    "cross_attn",
    "condition_embedder",
    "scale_shift_table",
    "img_emb",
    "text_embedding",
    "text_dim",
    "freq_dim",
    "in_visual_dim",
    "visual_transformer_blocks",
    "high_noise_model",
    "transformer_2",
    "wancamctrl",
)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant and name in `path` that is not a docstring, with its line."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
    return out


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if "models" not in p.relative_to(PACKAGE).parts],
    ids=lambda p: p.relative_to(PACKAGE).as_posix(),
)
def test_no_family_is_spelled_outside_its_module(path):
    found = [(line, text) for line, text in _code_strings(path) for word in FAMILY_WORDS if word in text]
    assert not found, f"{path.relative_to(PACKAGE)}: spells a family's names: {found[:3]}"


def test_the_guard_sees_a_family_name_in_code(tmp_path):
    """The check above would fail on a key name in code, and lets one in a docstring pass."""
    probe = tmp_path / "probe.py"
    probe.write_text('"""head.modulation in a docstring is fine."""\nKEY = "blocks.0.self_attn.q"\n')
    assert [t for _, t in _code_strings(probe) if "self_attn" in t] == ["blocks.0.self_attn.q"]
    assert not [t for _, t in _code_strings(probe) if "head.modulation" in t]


def _imported(code: str) -> list[str]:
    script = f"import sys; {code}; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return eval(out)  # a list of module names printed by our own child process


def test_quantize_imports_nothing_of_loaders():
    modules = _imported(
        "import quantize.cli, quantize.run.forward, quantize.run.sensitivity, quantize.check.verify, "
        "quantize.publish.converter"
    )
    assert not [m for m in modules if m == "loaders" or m.startswith("loaders.")]


def test_the_families_import_no_converter_verify_cli_or_format():
    modules = _imported("import quantize.models")
    quantize = [m for m in modules if m.startswith("quantize.")]
    # the package's own modules (a family each, the base, meta) and the errors: nothing of the converter's stages
    assert all(m.startswith("quantize.models") or m == "quantize.errors" for m in quantize), quantize
    assert "torch" not in modules
