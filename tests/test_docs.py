"""The docs hold to the code.

Every generated part of README.md and docs/*.md is what `docs/make_docs.py` renders from the registries now (a
family, layout, format, recipe field or command added without regenerating fails here); every relative link of the
docs resolves, anchors included; docs/BENCHMARKS.md holds only what the benchmark scripts write; the README stays a
five-minute read.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 15 * 1024  # bytes


def _make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "docs" / "make_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE_DOCS = _make_docs()
#: the pages whose links are checked: ours, and the pages they link to that link back
PAGES = sorted(
    {ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")},
    key=lambda p: p.relative_to(ROOT).as_posix(),
)


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple[str, str]]:
    return MAKE_DOCS.rendered()


@pytest.mark.parametrize("rel", sorted(MAKE_DOCS.PARTS))
def test_each_generated_part_is_what_the_registries_render(rendered, rel):
    now, wanted = rendered[rel]
    for marker in MAKE_DOCS.PARTS[rel]:
        start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
        part = now.split(start, 1)[1].split(end, 1)[0]
        fresh = wanted.split(start, 1)[1].split(end, 1)[0]
        assert part == fresh, f"{rel}: {marker} is out of date; run .venv/bin/python docs/make_docs.py"
    assert now == wanted


def test_the_check_mode_says_nothing_is_stale_and_writes_nothing(capsys):
    before = {p: p.read_bytes() for p in PAGES}
    assert MAKE_DOCS.main(["--check"]) == 0, capsys.readouterr().err
    assert {p: p.read_bytes() for p in PAGES} == before


def test_the_readme_is_short():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes: the reference belongs in docs/"


def _outside_code(text: str) -> str:
    """`text` without fenced blocks and inline code spans (links inside them are examples, not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    anchors = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not re.match(r"#{1,6} ", line):
            continue
        slug = MAKE_DOCS.slug(line.lstrip("#").strip())
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _outside_code(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that lead nowhere: {broken}"


def test_benchmarks_hold_only_what_the_scripts_write():
    """Outside the scripts' marked sections only the page's header: history belongs in CHANGELOG.md."""
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    sections = re.findall(r"<!-- bench:([\w.-]+):start -->.*?<!-- bench:\1:end -->", text, re.S)
    starts, ends = text.count(":start -->"), text.count(":end -->")
    assert sections and len(sections) == len(set(sections)) == starts == ends
    rest = re.sub(r"<!-- bench:([\w.-]+):start -->.*?<!-- bench:\1:end -->", "", text, flags=re.S)
    tail = rest[text.index("<!-- bench:") :]  # the header before the first section stays as it is
    assert not tail.strip(), f"prose between or after the benchmark sections: {tail.strip()[:200]!r}"
