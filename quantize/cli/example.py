"""`quantize example`: a random-weight checkpoint with a model family's real key names, to try the tool on."""

from __future__ import annotations

from pathlib import Path

import click

from ._console import out, quiet_model_imports

__all__ = ["example_cmd"]


def _all(attribute: str) -> list[str]:
    """Every family's example presets or layouts (each family's examples check their own)."""
    from ..models.examples import EXAMPLES

    return list(dict.fromkeys(v for e in EXAMPLES.values() for v in getattr(e, attribute)))


def _default_family() -> str:
    from ..models import DEFAULT_FAMILY

    return DEFAULT_FAMILY


def _families() -> list[str]:
    from ..models import FAMILIES

    return [f.name for f in FAMILIES]


@click.command("example")
@click.argument("output", type=click.Path(path_type=Path))
@click.option(
    "--family",
    type=click.Choice(_families()),
    default=_default_family(),
    show_default=True,
    help="Model family.",
)
@click.option(
    "--preset",
    type=click.Choice(_all("presets")),
    default=None,
    help="Model size [default: the family's own].",
)
@click.option(
    "--layout",
    type=click.Choice(_all("layouts")),
    default=None,
    help="Folder layout and extra layers [default: the family's first: t2v for wan].",
)
@click.option(
    "--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True
)
@click.option("--max-shard-size", default="1GB", show_default=True)
@click.option(
    "--lora",
    "lora",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write a random-weight LoRA (rank 16, every block Linear) for this model to this file.",
)
def example_cmd(
    output: Path,
    family: str,
    preset: str | None,
    layout: str | None,
    dtype: str,
    max_shard_size: str,
    lora: Path | None,
) -> None:
    """Write a random-weight checkpoint with a model family's real key names, to try the tool on."""
    import torch

    from ..errors import OutputExistsError
    from ..examples import write_example, write_example_lora
    from ..models import get_family
    from ..models.examples import examples_of
    from ..read.files import parse_size

    quiet_model_imports()  # a family built from diffusers' own class: what importing it pulls in stays quiet
    chosen = get_family(family)
    examples = examples_of(chosen)
    preset = preset or examples.default_preset
    layout = layout or examples.layouts[0]
    for path in (output, lora):
        if path is not None and path.exists():
            raise OutputExistsError(f"{path}: already exists; remove it or pick another path")
    examples.models(preset, layout)  # an unknown preset or layout of this family, before anything is written
    if lora is not None:
        examples.lora(preset, layout, 16)
    write_example(
        output,
        preset,
        layout,
        family=family,
        dtype=getattr(torch, dtype),
        max_shard_size=parse_size(max_shard_size, "--max-shard-size"),
    )
    out.print(
        f"wrote a {preset} {chosen.title}-shaped {layout} checkpoint ({dtype}, random weights) to {output}"
    )
    if lora is not None:
        write_example_lora(lora, preset, layout, family=family)
        out.print(f"wrote a rank-16 LoRA for it (every block Linear, random weights) to {lora}")
