"""`quantize upload`: publish a checkpoint to the Hugging Face Hub once verify's integrity checks pass."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ..errors import InputError
from ._console import gb, out, progress_display
from ._render import print_upload_files

__all__ = ["upload_cmd"]


@click.command("upload")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("repo_id")
@click.option(
    "--private", is_flag=True, help="Create the repo private (an existing repo keeps its visibility)."
)
@click.option("--revision", default=None, help="Branch to upload to (created if needed) [default: main].")
@click.option("--message", default=None, help="Commit message.")
@click.option("--dry-run", is_flag=True, help="List what would be sent, with sizes; send nothing.")
def upload_cmd(
    checkpoint: Path, repo_id: str, private: bool, revision: str | None, message: str | None, dry_run: bool
) -> None:
    """Publish CHECKPOINT to the Hugging Face Hub as REPO_ID, after verify's integrity checks pass."""
    from ..check.verify import verify
    from ..publish.hub import upload, upload_files
    from ..read.hub import check_repo_id, has_token

    check_repo_id(repo_id)
    if not dry_run and not has_token():
        raise InputError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (nothing was sent)")
    progress = progress_display("verify", "files and tensors")
    try:
        report = verify(checkpoint, progress=progress)
    finally:
        progress.stop()
    if not report.ok:
        failures = [f for c in report.checks.values() for f in c.failures]
        raise InputError(
            f"{checkpoint}: fails verify's integrity checks ({len(failures)} problem(s), first: {failures[0]}); "
            f"nothing was sent: run `quantize verify {checkpoint}`"
        )
    files = upload_files(checkpoint)
    print_upload_files(checkpoint, repo_id, revision, files)
    if dry_run:
        out.print("dry run: verified, nothing was sent")
        return
    url = upload(checkpoint, repo_id, private=private, revision=revision, message=message)
    total = sum(f.size for f in files)
    out.print(f"uploaded {len(files)} files ({gb(total)}) to {escape(repo_id)}: {escape(url)}")
