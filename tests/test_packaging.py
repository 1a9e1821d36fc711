"""What a wheel holds: every package of the source tree, so that a non-editable install imports what the tests do."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_of_the_tree_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("quantize", "loaders")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set(), "packages a wheel would leave out: add them to [tool.setuptools] packages"
    assert listed - found == {"quantize.bundled_recipes"}  # the recipes/ folder, mapped by package-dir
