"""The Hugging Face Hub as a place to read from: a SOURCE given as a repo id, fetched (only the files a
conversion reads) or found in the cache; what a repo id and a token are, which uploading (`publish.hub`) shares.

Everything goes through huggingface_hub: its cache (`HF_HOME`), its endpoint (`HF_ENDPOINT`), its
offline switch (`HF_HUB_OFFLINE`), its token sources (`HF_TOKEN`, the saved login). No torch here.
A token never appears in what this module returns or raises: every message from huggingface_hub
passes through `scrub` first (`first_line` of an error does).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path, PurePosixPath

from ..errors import ConversionError, InputError
from .files import CARD_NAME, CONFIG_NAME, INDEX_SUFFIX

__all__ = [
    "is_repo_id",
    "has_token",
    "check_repo_id",
    "resolve_source",
    "source_files_wanted",
    "recipe_files",
    "fetch",
    "scrub",
    "first_line",
    "literal",
    "transport_errors",
]

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_TOKEN = re.compile(r"hf_[A-Za-z0-9]{6,}")


def scrub(text: str) -> str:
    """`text` with anything that looks like a Hugging Face token, or is the configured one, replaced."""
    token = _configured_token()
    if token:
        text = text.replace(token, "<token>")
    return _TOKEN.sub("hf_<token>", text)


def _configured_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # a token file that cannot be read is no token
        return None


def check_repo_id(repo_id: str) -> None:
    """Refuse what cannot be a Hub model repo id, before anything is done."""
    if not _REPO_ID.match(repo_id):
        raise InputError(f"{repo_id!r}: not a Hub repo id (expected org/name)")


def has_token() -> bool:
    """Whether huggingface_hub finds a token (HF_TOKEN, the saved login)."""
    return _configured_token() is not None


def is_repo_id(text: str) -> bool:
    """`org/name`, and no local path of that name exists."""
    return bool(_REPO_ID.match(text)) and not Path(text).exists()


def source_files_wanted(files: list[str], components: list[str], everything: bool) -> list[str]:
    """Of a repo's `files`, those a conversion reads: each component's safetensors, index and config.json,
    plus the root README.md (for the card's license); every file when `everything` (copy_other_files)."""
    if everything:
        return sorted(files)
    dirs = {"" if rel == "." else PurePosixPath(rel).as_posix() for rel in components}
    wanted = []
    for f in files:
        folder, name = posixpath.split(f)
        own = folder in dirs and (
            name.endswith(".safetensors") or name.endswith(INDEX_SUFFIX) or name == CONFIG_NAME
        )
        if own or f == CARD_NAME:
            wanted.append(f)
    return sorted(wanted)


def recipe_files(recipe):
    """The chooser `resolve_source` needs for a conversion under `recipe`: its components' files, and where it
    writes native names, the folders a family's native file joins from beside a component (`PlanPolicy.beside`:
    LTX-2's ``connectors/`` beside ``transformer/``), where the repo has them."""
    folders = [*recipe.components, *_beside_folders(recipe)]
    return lambda files: source_files_wanted(files, folders, recipe.copy_other_files)


def _beside_folders(recipe) -> list[str]:
    """The sibling folders of the recipe's components that some family joins to them in native-named files."""
    from ..formats import format_info
    from ..models import FAMILIES

    if format_info(recipe.format).names == "source":
        return []
    beside = {f.plan.beside.folder for f in FAMILIES if f.plan.beside is not None}
    parents = {posixpath.dirname(rel) for rel in recipe.components if rel != "."}
    return sorted(posixpath.join(parent, folder) for parent in parents for folder in beside)


def fetch(repo_id: str, choose, revision: str | None = None) -> Path:
    """Download (or find in the cache) the files `choose(all files in the repo)` returns; the snapshot folder.

    Offline (`HF_HUB_OFFLINE=1`) the cached snapshot is used as it is, and must exist.
    """
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub import errors as hf_errors

    try:
        offline = constants.HF_HUB_OFFLINE
        files = (
            _cached_files(repo_id, revision)
            if offline
            else HfApi().list_repo_files(repo_id, revision=revision)
        )
        wanted = choose(files)
        if not wanted and not offline:
            raise InputError(
                f"{repo_id}: holds none of the files the conversion needs (of {len(files)} files)"
            )
        patterns = [literal(f) for f in wanted]
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=offline)
        )
    except hf_errors.RepositoryNotFoundError:
        raise InputError(
            f"{repo_id}: no such model repo on {constants.ENDPOINT} (or it is private or gated: set HF_TOKEN)"
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise InputError(f"{repo_id}: no revision {revision!r}") from None
    except hf_errors.LocalEntryNotFoundError:
        raise InputError(
            f"{repo_id}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: "
            "download it once online, or pass a local folder"
        ) from None
    except hf_errors.HfHubHTTPError as e:
        raise ConversionError(f"{repo_id}: download failed: {first_line(e)}") from None
    except (transport_errors(), OSError) as e:
        raise ConversionError(
            f"{repo_id}: cannot reach the Hub at {constants.ENDPOINT} ({first_line(e)}); "
            "with the files cached, set HF_HUB_OFFLINE=1"
        ) from None


def _cached_files(repo_id: str, revision: str | None) -> list[str]:
    """The files of the cached snapshot of `repo_id` at `revision` (a branch, tag or commit); [] if none is cached.

    Offline, huggingface_hub returns a snapshot only when it holds every file the patterns ask for, so the
    patterns are made from what the cache holds, as online they are made from the repo's listing."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    ref = storage / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    snapshot = storage / "snapshots" / commit
    if not commit or not snapshot.is_dir():
        return []
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def transport_errors() -> type[Exception]:
    """The HTTP client's own errors (connection refused, name not resolved, timeouts): huggingface_hub 2.x
    uses httpx2 (older releases: httpx)."""
    try:
        import httpx2 as client
    except ImportError:  # pragma: no cover - depends on the huggingface_hub release
        import httpx as client
    return client.HTTPError


def first_line(e: BaseException) -> str:
    """The first line of an error's message, scrubbed (its type's name when it has none)."""
    text = scrub(str(e)).strip()
    return (text.splitlines() or [type(e).__name__])[0]


def literal(name: str) -> str:
    """An fnmatch pattern that matches exactly `name`."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def resolve_source(text: str | Path, choose=None) -> tuple[Path, str, str | None]:
    """(local folder, name for the manifest, Hub repo id or None) for a SOURCE argument: a folder or `org/name`.

    `choose(files) -> files` picks what to download from a repo (default: everything).
    """
    path = Path(text)
    if path.exists() or not is_repo_id(str(text)):
        if not path.is_dir() and not path.is_file():
            raise InputError(
                f"{text}: source not found: neither a folder, a file nor a Hub repo id (org/name)"
            )
        return path, path.absolute().name, None
    repo_id = str(text)
    return fetch(repo_id, choose or sorted), repo_id, repo_id
