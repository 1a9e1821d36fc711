"""`quantize verify`: prove a converted checkpoint; exit 1 when a check fails."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import click

from ._console import progress_display, quiet_model_imports
from ._options import inputs_option
from ._render import print_verify

__all__ = ["verify_cmd"]


@click.command("verify")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option(
    "--source",
    default=None,
    help="The source checkpoint (a folder or a Hub repo id): adds provenance and parity checks.",
)
@click.option(
    "--forward", is_flag=True, help="Also compare one forward pass of the source and the quantized model."
)
@inputs_option("With --forward: the")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--workers", type=int, default=None, help="Threads hashing and comparing [default: all cores].")
@click.option(
    "--lora",
    "step_files",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    metavar="FILE",
    help="A LoRA the checkpoint was made with, when it is not where the manifest says (found by SHA-256).",
)
def verify_cmd(
    checkpoint: Path,
    source: str | None,
    forward: bool,
    inputs: Path | None,
    as_json: bool,
    workers: int | None,
    step_files: tuple[Path, ...],
) -> int:
    """Prove CHECKPOINT: hashes and layout; with --source, provenance and per-tensor parity. Exit 1 if a check fails."""
    if forward:
        quiet_model_imports()
    from ..check.verify import verify
    from ..process import tune_for_streaming

    tune_for_streaming()
    if source is not None:
        from ..read.hub import resolve_source

        listed = _source_files(checkpoint)
        source, _, _ = resolve_source(source, lambda files: sorted(listed & set(files)))

    progress = progress_display("verify", "files and tensors") if not as_json else None
    try:
        report = verify(
            checkpoint,
            source,
            forward=forward,
            inputs=inputs,
            workers=workers,
            progress=progress,
            step_files=step_files,
        )
    finally:
        if progress is not None:
            progress.stop()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_verify(checkpoint, report, source, forward)
    return 0 if report.ok else 1


def _source_files(checkpoint: Path, rel: str = ".") -> set[str]:
    """The source files the manifests of `checkpoint` list (those of its nested checkpoints under their folders),
    and the tokenizer files its format reads beside its components (`read.hub.tokenizer_files`), as paths in the
    source: what a Hub source is fetched for."""
    from ..publish.manifest import read_manifest
    from ..read.hub import tokenizer_files

    manifest = read_manifest(checkpoint)
    files = {posixpath.normpath(posixpath.join(rel, f.path)) for f in manifest.source_files}
    for comp in manifest.components:
        files |= set(tokenizer_files(posixpath.normpath(posixpath.join(rel, comp.path)), manifest.format))
    for folder in manifest.nested:
        files |= _source_files(checkpoint / folder, posixpath.join(rel, folder))
    return files
