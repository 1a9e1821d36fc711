"""`quantize inspect`: a converted checkpoint's format, components, sizes and kept layers."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ._render import inspect_summary, print_inspect

__all__ = ["inspect_cmd"]


@click.command("inspect")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect_cmd(checkpoint: Path, as_json: bool) -> None:
    """Format, components, sizes and kept layers of a converted CHECKPOINT (from its manifest)."""
    from ..publish.manifest import read_manifest

    m = read_manifest(checkpoint)
    summary = inspect_summary(checkpoint, m)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    print_inspect(checkpoint, m, summary)
