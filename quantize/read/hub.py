"""The Hugging Face Hub as a place to read from: a SOURCE given as a repo id, fetched (only the files a
conversion reads) or found in the cache; its outline, what `--format` detects its layout from without fetching its
weights; what a repo id and a token are, which uploading (`publish.hub`) shares.

Everything goes through huggingface_hub: its cache (`HF_HOME`), its endpoint (`HF_ENDPOINT`), its
offline switch (`HF_HUB_OFFLINE`), its token sources (`HF_TOKEN`, the saved login). No torch here.
A token never appears in what this module returns or raises: every message from huggingface_hub
passes through `scrub` first (`first_line` of an error does).
"""

from __future__ import annotations

import posixpath
import re
import struct
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from ..errors import ConversionError, InputError
from .files import CARD_NAME, CONFIG_NAME, INDEX_SUFFIX, MAX_HEADER_BYTES, PTH_SUFFIX

__all__ = [
    "is_repo_id",
    "has_token",
    "check_repo_id",
    "resolve_source",
    "source_files_wanted",
    "recipe_files",
    "recipe_folders",
    "tokenizer_files",
    "fetch",
    "outline",
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


def recipe_files(recipe, nested: Mapping[str, object] | None = None):
    """The chooser `resolve_source` needs for a conversion under `recipe`: its components' files; where it writes
    native names, the folders a family's native file joins from beside a component (`PlanPolicy.beside`: LTX-2's
    ``connectors/`` beside ``transformer/``); the folders of the `nested` conversions (folder -> its recipe: a
    pipeline's text encoders); and where a format holds a tokenizer, the tokenizer files a family looks for beside
    each of those folders (`models.family.Tokenizer.files`: umT5's ``tokenizer/spiece.model``), where the repo has
    them."""
    nested = dict(nested or {})
    folders = recipe_folders(recipe, nested)
    converted = [
        *((rel, recipe.format) for rel in recipe.components),
        *((rel, r.format) for rel, r in nested.items()),
    ]

    def choose(files: list[str]) -> list[str]:
        wanted = source_files_wanted(files, folders, recipe.copy_other_files)
        present = set(files)
        return sorted({*wanted, *(f for rel, fmt in converted for f in tokenizer_files(rel, fmt, present))})

    return choose


def recipe_folders(recipe, nested: Mapping[str, object] | None = None) -> list[str]:
    """The model folders a conversion under `recipe` reads: its components, the folders a family's native file
    joins from beside them (`PlanPolicy.beside`), and the `nested` conversions' folders."""
    return [*recipe.components, *_beside_folders(recipe), *(nested or {})]


def tokenizer_files(rel: str, fmt: str, present: Collection[str] | None = None) -> list[str]:
    """Where, in the repo, a family's tokenizer is looked for beside the model folder `rel` when `fmt` holds one
    (`plan._tokenizer`), for every family that has one; none outside the repo. With `present` (the repo's files),
    only the first of each family's that the repo has: the one a plan takes (a pipeline's spiece.model, not the
    tokenizer.json beside it). A manifest does not list it among the source files (it may lie outside the
    converted folder: ``../tokenizer/``), so a Hub source is fetched for it by name."""
    from ..formats import format_info

    if format_info(fmt).tokenizer is None:
        return []
    found = []
    for tok in _tokenizers():
        paths = [posixpath.normpath(posixpath.join(rel, f)) for f in tok.files]
        paths = [p for p in paths if not p.startswith("../")]
        found += paths if present is None else [p for p in paths if p in present][:1]
    if present is None:
        return found
    # a tokenizer.json (Gemma 4's own kind) only where no SentencePiece model lies beside it, as the outline takes
    models_in = {posixpath.dirname(p) for p in found if not p.endswith(".json")}
    return [p for p in found if not p.endswith(".json") or posixpath.dirname(p) not in models_in]


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

    with _hub_errors(repo_id, revision):
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


@contextmanager
def _hub_errors(repo_id: str, revision: str | None) -> Iterator[None]:
    """huggingface_hub's errors as one line each: what the user can do about a missing, gated or unreachable
    repo (`InputError`), or a download that failed (`ConversionError`)."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hf_errors

    try:
        yield
    except hf_errors.RepositoryNotFoundError:
        raise InputError(
            f"{repo_id}: no such model repo on {constants.ENDPOINT} (or it is private or gated: set HF_TOKEN)"
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise InputError(f"{repo_id}: no revision {revision!r}") from None
    except hf_errors.LocalEntryNotFoundError:
        raise _not_cached(repo_id) from None
    except hf_errors.HfHubHTTPError as e:
        raise ConversionError(f"{repo_id}: download failed: {first_line(e)}") from None
    except (transport_errors(), OSError) as e:
        raise ConversionError(
            f"{repo_id}: cannot reach the Hub at {constants.ENDPOINT} ({first_line(e)}); "
            "with the files cached, set HF_HUB_OFFLINE=1"
        ) from None


def _not_cached(repo_id: str) -> InputError:
    """Offline, with no snapshot of `repo_id` in the cache: what to do about it."""
    from huggingface_hub import constants

    return InputError(
        f"{repo_id}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: "
        "download it once online, or pass a local folder"
    )


def _tokenizers() -> list:
    """Every family's tokenizer policy (`models.family.Tokenizer`): where a plan looks for a tokenizer file,
    and the tensor a release file holds one as."""
    from ..models import FAMILIES

    return [f.plan.tokenizer for f in FAMILIES if f.plan.tokenizer is not None]


@contextmanager
def outline(repo_id: str, revision: str | None = None, folders: Sequence[str] = ()) -> Iterator[Path]:
    """A local folder that `read.detect`, `plan.make_plan` and `containers.check_headers` read as they read the
    repo downloaded, with none of its weights fetched (`_write_outline`); `folders`: model folders deeper than
    one level to outline too (a recipe's components). Offline (`HF_HUB_OFFLINE=1`), the cached snapshot as it is.
    An `InputError` raised inside names `repo_id` where it would name the folder."""
    from huggingface_hub import constants

    check_repo_id(repo_id)
    if constants.HF_HUB_OFFLINE:
        snapshot = _cached_snapshot(repo_id, revision)
        if snapshot is None:
            raise _not_cached(repo_id)
        with _naming(snapshot, repo_id):
            yield snapshot
        return
    with tempfile.TemporaryDirectory(prefix="quantize-outline-") as tmp:
        root = Path(tmp)
        _write_outline(root, repo_id, revision, folders)
        with _naming(root, repo_id):
            yield root


@contextmanager
def _naming(root: Path, repo_id: str) -> Iterator[None]:
    """An `InputError` raised inside with `repo_id` in place of the folder `root` that stands for it."""
    try:
        yield
    except InputError as e:
        text = str(e)
        for where in {str(root.resolve()), str(root)}:
            text = text.replace(where, repo_id)
        raise InputError(text, parameters=e.parameters) from None


def _write_outline(root: Path, repo_id: str, revision: str | None, folders: Sequence[str]) -> None:
    """Into `root`, nothing into the Hugging Face cache, all at the commit `revision` names now:

    - the repo's config.json files and safetensors indexes at its root, one folder down and in
      `folders`, and the tokenizer files a plan looks for (two folders down at most; a tokenizer.json only where
      no SentencePiece model lies beside it, which a plan takes first), as they are;
    - each safetensors file there as its bytes up to the end of its header (`_header_bytes`: two range requests
      at most) followed by a hole to its size (sparse where the filesystem allows), but for a tokenizer it holds
      as a tensor (`_fill_tokenizer`: Comfy-Org's ``spiece_model``), the one tensor whose data a plan reads;
    - a ``.pth`` in `folders` (its tensor table is inside a pickled zip: no header to outline) linked from the
      cache, downloaded whole. Elsewhere ``.pth`` files hold no model `--format` detects.
    """
    from huggingface_hub import HfApi, hf_hub_download

    with _hub_errors(repo_id, revision):
        info = HfApi().model_info(repo_id, revision=revision)
    commit, files = info.sha, sorted(s.rfilename for s in info.siblings or ())
    deep = tuple(f"{posixpath.normpath(d)}/" for d in folders if d not in (".", ""))
    models = [f for f in files if f.count("/") <= 1 or f.startswith(deep)]
    tokenizer_names = {posixpath.basename(path) for tok in _tokenizers() for path in tok.files}
    # a tokenizer.json is a plan's only where no SentencePiece model lies beside it (which is taken first)
    models_in = {posixpath.dirname(f) for f in files if _tokenizer_model(f, tokenizer_names)}
    small = [f for f in models if f.endswith(INDEX_SUFFIX) or posixpath.basename(f) == CONFIG_NAME]
    small += [
        f
        for f in files
        if f.count("/") <= 2
        and posixpath.basename(f) in tokenizer_names
        and (_tokenizer_model(f, tokenizer_names) or posixpath.dirname(f) not in models_in)
    ]
    for f in sorted(set(small)):
        with _hub_errors(repo_id, revision):
            data = _get(repo_id, f, commit)
        with _writing(root / f):
            (root / f).write_bytes(data)
    for f in models:
        if f.endswith(".safetensors"):
            with _hub_errors(repo_id, revision):
                head, size = _header_bytes(repo_id, f, commit)
            with _writing(root / f), open(root / f, "wb") as out:
                out.write(head)
                out.truncate(size)
            _fill_tokenizer(root / f, repo_id, f, commit, revision)
        elif f.endswith(PTH_SUFFIX) and f.startswith(deep):
            with _hub_errors(repo_id, revision):
                cached = Path(hf_hub_download(repo_id, f, revision=commit))
            with _writing(root / f):
                (root / f).symlink_to(cached)


def _tokenizer_model(path: str, names: Collection[str]) -> bool:
    """Whether repo file `path` is a tokenizer file of one of `names` that is a SentencePiece model (not a
    tokenizer.json, which a plan takes only where there is none)."""
    name = posixpath.basename(path)
    return name in names and not name.endswith(".json")


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Writing `path` of an outline (its folder made first): a local failure is one line naming it, not the Hub."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as e:
        raise ConversionError(f"{path}: cannot write the repo's outline: {e.strerror or e}") from None


def _fill_tokenizer(path: Path, repo_id: str, filename: str, commit: str, revision: str | None) -> None:
    """Each tokenizer the outlined safetensors file at `path` holds as a tensor (`Tokenizer.tensor`), fetched by
    range into its place: a plan reads its data (a GGUF file's tokenizer key-values are made of it). Its place is
    the one `read_header` gives; a header it refuses gets none (the plan says why)."""
    from .checkpoint import read_header  # torch: the callers (detection, the plan) have it loaded already

    try:
        tensors = read_header(path).tensors
    except InputError:
        return
    for name in sorted({tok.tensor for tok in _tokenizers()}):
        info = tensors.get(name)
        if info is None or info.end == info.start:
            continue
        with _hub_errors(repo_id, revision):
            data = _get(repo_id, filename, commit, info.start, info.end - info.start)
        with _writing(path), open(path, "r+b") as out:
            out.seek(info.start)
            out.write(data)


#: what the first request for a safetensors header asks for (huggingface_hub's own figure: most headers fit)
_FIRST_BYTES = 100_000


def _header_bytes(repo_id: str, filename: str, commit: str) -> tuple[bytes, int]:
    """The first bytes of a repo file, up to the end of its safetensors header (the whole file where it is
    shorter than the first request), and the file's size: one range request, two for a header longer than the
    first (as huggingface_hub's `HfApi.parse_safetensors_file_metadata` asks, whose parsed header would not keep
    what `read.checkpoint.read_header` checks)."""
    data, size = _get_sized(repo_id, filename, commit, 0, _FIRST_BYTES)
    if len(data) >= 8:
        (n,) = struct.unpack("<Q", data[:8])
        if len(data) < 8 + n <= min(size, 8 + MAX_HEADER_BYTES):
            data += _get(repo_id, filename, commit, len(data), 8 + n - len(data))
    return data, size


def _get(repo_id: str, filename: str, commit: str, first: int = 0, length: int | None = None) -> bytes:
    """`length` bytes of a repo file from `first` (to its end: None)."""
    return _get_sized(repo_id, filename, commit, first, length)[0]


def _get_sized(
    repo_id: str, filename: str, commit: str, first: int = 0, length: int | None = None
) -> tuple[bytes, int]:
    """`length` bytes of a repo file from `first` (to its end: None), and the file's size: one GET through
    huggingface_hub's session, endpoint, token and timeout, streamed, so that a server that ignores the range
    sends no more than is read. An empty file, or a range past the end, is no bytes."""
    from huggingface_hub import constants, get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    url = hf_hub_url(repo_id, filename, revision=commit)
    headers = build_hf_headers()
    if first or length is not None:
        headers["Range"] = f"bytes={first}-{'' if length is None else first + length - 1}"
    with get_session().stream("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
        total = r.headers.get("Content-Range", "").rpartition("/")[2]
        if r.status_code == 416:  # nothing at `first`: an empty file, or one shorter than asked for
            return b"", int(total) if total.isdigit() else 0
        hf_raise_for_status(r)
        ranged = r.status_code == 206
        size = int(total) if ranged and total.isdigit() else int(r.headers.get("Content-Length") or -1)
        skip = 0 if ranged else first  # a server that ignored the range sends the file from its start
        want = None if length is None else skip + length
        data = bytearray()
        for chunk in r.iter_bytes():
            data += chunk
            if want is not None and len(data) >= want:
                break
    data = bytes(data[skip:want])
    return data, (size if size >= 0 else first + len(data))


def _cached_files(repo_id: str, revision: str | None) -> list[str]:
    """The files of the cached snapshot of `repo_id` at `revision` (a branch, tag or commit); [] if none is cached.

    Offline, huggingface_hub returns a snapshot only when it holds every file the patterns ask for, so the
    patterns are made from what the cache holds, as online they are made from the repo's listing."""
    snapshot = _cached_snapshot(repo_id, revision)
    if snapshot is None:
        return []
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision`, or None."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    ref = storage / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    snapshot = storage / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


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
