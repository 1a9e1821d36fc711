"""How the packages depend on each other (DESIGN.md), and that a model family is spelled in its module only."""

from __future__ import annotations

import ast
import re
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


# --- the tests: no test module imports another (what they share is in tests/helpers, tests/oracles or a conftest) --

TESTS = Path(__file__).resolve().parent


def _names_a_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


def _test_modules_imported(path: Path) -> list[tuple[int, str]]:
    """Each test module (one named ``test_*`` under tests/) that `path` imports anywhere, with the line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if not node.level and module.split(".")[0] != "tests":
                continue
            # `from tests.x.test_y import z` imports from a test module; `from tests.x import test_y`, the module
            names = [module] if _names_a_test_module(module) else [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if _names_a_test_module(n)]
    return found


def test_no_test_module_imports_another():
    found = [
        f"{path.relative_to(TESTS).as_posix()}:{line}: {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in _test_modules_imported(path)
    ]
    assert not found, (
        f"a test module imports another (move what they share to tests/helpers, or an upstream's copy to "
        f"tests/oracles): {found}"
    )


def test_the_guard_sees_an_import_of_a_test_module(tmp_path):
    """The check above would fail on each way of importing a test module, and lets helpers, oracles and conftests
    pass."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tests.steps.test_lora import make_lora\n"
        "from tests.formats import references, test_gguf\n"
        "import tests.test_plan\n"
        "from .test_encode import _chunk_rows\n"
        "from tests.helpers.lora import write_lora\n"
        "from tests.oracles.comfyui_wan import comfyui_wan\n"
        "from tests.loaders.conftest import same_bytes\n"
        "import tests.diffusers_models\n"
    )
    assert [name for _, name in _test_modules_imported(probe)] == [
        "tests.steps.test_lora",
        "tests.formats.test_gguf",
        "tests.test_plan",
        ".test_encode",
    ]


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
    # the package's own modules (a family each, the base, meta), the errors and the file names a checkpoint holds
    # (`read.files`: which class a config names): nothing of the converter's stages
    base = {"quantize.errors", "quantize.read", "quantize.read.files"}
    assert all(m.startswith("quantize.models") or m in base for m in quantize), quantize
    assert "torch" not in modules


# --- the stage order and cycles, read from the source ----------------------------------------------------------

ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"

#: edges known to break the rules, each with who removes it; the check fails on any other, and on one of these that
#: no longer exists (so the list cannot outlive the fix)
KNOWN: set[tuple[str, str]] = set()


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (the folder `root`) by dotted name; a package by its own name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that module `name` imports anywhere (every `import` statement in the file: at the
    top, inside functions, under TYPE_CHECKING), each the deepest module it names (``from . import x`` is module ``x``
    where there is one, else the package), and ``loaders`` where it imports anything of that package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*base, node.module] if node.module else base)
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.add(target)
            elif target.split(".")[0] == "loaders":
                found.add(target.split(".")[0])
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = module_names(root, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def stage_order(text: str) -> list[tuple[str, list[str]]]:
    """The numbered list under ARCHITECTURE.md's "Stage order" heading: (stage, its modules) from the bottom up."""
    section = text.split("## Stage order", 1)[1].split("\n## ", 1)[0]
    stages = []
    for line in section.splitlines():
        m = re.match(r"^(\d+)\. \*\*(\w+)\*\*: (.*)$", line)
        if m:
            assert int(m[1]) == len(stages) + 1, f"stage {m[2]} is numbered {m[1]}"
            stages.append((m[2], re.findall(r"`([\w.]+)`", m[3])))
    return stages


def stage_of(module: str, package: str, stages: list[tuple[str, list[str]]]) -> int | None:
    """The index of the stage that lists `module` or the nearest package holding it (names relative to `package`;
    `package` itself listed by its name stands for its ``__init__`` alone)."""
    best, length = None, -1
    for i, (_, names) in enumerate(stages):
        for listed in names:
            if listed == package:
                full, hit = package, module == package
            else:
                full = f"{package}.{listed}"
                hit = module == full or module.startswith(full + ".")
            if hit and len(full) > length:
                best, length = i, len(full)
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted; [] when the graph has no cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def problems(graph: dict[str, set[str]], package: str, stages, known=frozenset()) -> list[str]:
    """What breaks the rules: a name the stage order lists that is no module, a module no stage holds, an import of
    ``loaders``, an import of a later stage, and import cycles; `known` edges (importer, imported) are left out, and
    each must still exist."""
    found = [
        f"{package}.{listed}: in the stage order, but no such module"
        for _, names in stages
        for listed in names
        if listed != package and f"{package}.{listed}" not in graph
    ]
    found += [
        f"{a} -> {b}: no longer imported, drop it from KNOWN"
        for a, b in sorted(known)
        if b not in graph.get(a, ())
    ]
    graph = {a: {b for b in bs if (a, b) not in known} for a, bs in graph.items()}
    for a in sorted(graph):
        sa = stage_of(a, package, stages)
        if sa is None:
            found.append(f"{a}: in no stage of the stage order")
            continue
        for b in sorted(graph[a]):
            if b == "loaders":
                found.append(f"{a} imports loaders")
                continue
            sb = stage_of(b, package, stages)
            if sb is not None and sb > sa:
                found.append(f"{a} ({stages[sa][0]}) imports {b} ({stages[sb][0]}), a later stage")
    found += [f"import cycle: {' <-> '.join(group)}" for group in cycles(graph)]
    return found


def test_the_stages_import_downwards_only_and_no_module_imports_itself_in_a_circle():
    """docs/ARCHITECTURE.md's stage order holds for every import in quantize/ (inside functions and under
    TYPE_CHECKING too), and no import, however deferred, closes a circle."""
    stages = stage_order(ARCHITECTURE.read_text())
    assert [s for s, _ in stages][:1] == ["base"] and [s for s, _ in stages][-1] == "cli", stages
    graph = import_graph(PACKAGE, "quantize")
    assert problems(graph, "quantize", stages, KNOWN) == []


def test_the_checker_catches_a_cycle_an_upward_import_and_an_unlisted_module(tmp_path):
    """The check above can fail: on a synthetic tree, a circle closed inside a function, an upward import under
    TYPE_CHECKING, an import of loaders, a module no stage holds and a listed name that is no module."""
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from .a import A\n")
    (pkg / "low" / "a.py").write_text("A = 1\n\ndef f():\n    from . import b\n")
    (pkg / "low" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .a import A\nif TYPE_CHECKING:\n    from ..high import H\n"
    )
    (pkg / "high.py").write_text("import loaders.x\nfrom .low import A\nH = A\n")
    (pkg / "stray.py").write_text("")
    doc = "# x\n\n## Stage order\n\n1. **base**: `pkg`\n2. **low**: `low`\n3. **high**: `high`, `gone`\n\n## Next\n"
    stages = stage_order(doc)
    assert stages == [("base", ["pkg"]), ("low", ["low"]), ("high", ["high", "gone"])]
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.low.a"] == {"pkg.low.b"} and graph["pkg.low.b"] == {"pkg.low.a", "pkg.high"}
    assert problems(graph, "pkg", stages) == [
        "pkg.gone: in the stage order, but no such module",
        "pkg.high imports loaders",
        "pkg.low.b (low) imports pkg.high (high), a later stage",
        "pkg.stray: in no stage of the stage order",
        "import cycle: pkg.high <-> pkg.low <-> pkg.low.a <-> pkg.low.b",
    ]
    # an edge known to break the rules is left out (here the upward one: the circle left is a <-> b), and one that
    # no longer exists is reported
    assert problems(graph, "pkg", stages, {("pkg.low.b", "pkg.high"), ("pkg.x", "pkg.y")}) == [
        "pkg.gone: in the stage order, but no such module",
        "pkg.x -> pkg.y: no longer imported, drop it from KNOWN",
        "pkg.high imports loaders",
        "pkg.stray: in no stage of the stage order",
        "import cycle: pkg.low.a <-> pkg.low.b",
    ]
