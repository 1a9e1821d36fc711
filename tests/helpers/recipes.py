"""Recipe texts the recipe and plan tests share, and the bundled recipes `quantize recipes --for` lists."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

#: the smallest valid recipe: one format, one target (blocks' ffn.0), every other field its default
MINIMAL = "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n"


def listed_recipes(source: Path) -> list[str]:
    """The bundled recipes (file names) `quantize recipes --for SOURCE` lists as fitting it, sorted."""
    listed = run_cli("recipes", "--for", source, check=True).stdout
    return sorted(line.split("│")[1].strip() for line in listed.splitlines() if ".yaml" in line)
