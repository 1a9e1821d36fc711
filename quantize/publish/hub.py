"""The Hugging Face Hub as a place to publish to: a verified checkpoint uploaded in one commit.

Fetching a source from the Hub is reading (`read.hub`, which also says what a repo id and a token are). No torch
here; every message from huggingface_hub passes through `read.hub.scrub` first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConversionError, InputError
from ..read.files import MANIFEST_NAME
from ..read.hub import check_repo_id, first_line, has_token, literal, transport_errors
from .manifest import read_manifest

__all__ = ["UploadFile", "upload_files", "upload"]


@dataclass(frozen=True)
class UploadFile:
    path: str  # relative to the checkpoint, POSIX
    size: int


def upload_files(checkpoint: Path) -> list[UploadFile]:
    """What an upload sends: every file the manifest lists, then the manifest itself (last, so that a
    repo holding the manifest holds everything it lists)."""
    manifest = read_manifest(checkpoint)
    files = [UploadFile(f.path, f.size) for f in manifest.output_files]
    files.append(UploadFile(MANIFEST_NAME, (Path(checkpoint) / MANIFEST_NAME).stat().st_size))
    return files


def upload(
    checkpoint: Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    message: str | None = None,
) -> str:
    """Publish a verified checkpoint to `repo_id` (created if needed); returns the commit's URL.

    huggingface_hub's `upload_folder` does the transfer: with hf_xet installed (a dependency of
    huggingface_hub) it is its resumable pipeline (chunks deduplicated, re-running resumes). Every file
    goes in one commit, made only once all the data is up: the repo shows the whole checkpoint or what
    it showed before, never a part (an interrupted upload leaves uploaded chunks unreferenced, and the
    next run reuses them).
    """
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf_errors

    check_repo_id(repo_id)
    if not has_token():
        raise InputError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (nothing was sent)")
    files = [f.path for f in upload_files(checkpoint)]
    message = message or f"Upload {read_manifest(checkpoint).format} checkpoint (dit-quantize)"
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=checkpoint,
            revision=revision,
            allow_patterns=[literal(f) for f in files],
            commit_message=message,
        )
    except (hf_errors.HfHubHTTPError, transport_errors(), OSError) as e:
        raise ConversionError(f"upload to {repo_id} failed: {first_line(e)}") from None
    return str(getattr(info, "commit_url", info))
