"""A small, stdlib-only stand-in for the Hugging Face Hub HTTP API, for tests.

It lets the *real* ``huggingface_hub`` client (checked against 2.4.0) create repos, upload folders
through the classic (non-Xet) LFS protocol and download files, without any network access.

Usage::

    with HubStandIn() as hub:
        env = {
            "HF_ENDPOINT": hub.endpoint,     # read by huggingface_hub.constants at *import* time
            "HF_HUB_DISABLE_XET": "1",       # mandatory: the stand-in speaks LFS "basic" transfer, not Xet
            "HF_TOKEN": hub.token,           # write endpoints and private repos need it
            "HF_HOME": str(tmp_path / "hf_home"),
            "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # `hf` CLI only: no PyPI look-up
        }
        ...
        hub.files("ns/name")  # -> {"path": b"..."} at the head of "main"

Endpoints served (repo_type prefix ``datasets/`` / ``spaces/`` accepted wherever the Hub accepts it):

* ``POST /api/repos/create`` (409 + JSON if the repo exists, like the Hub), ``DELETE /api/repos/delete``
* ``GET  /api/{type}s/{repo}`` and ``/api/{type}s/{repo}/revision/{rev}`` (repo info with ``sha``, ``siblings``;
  ``?blobs=true`` adds size/blobId/lfs)
* ``GET  /api/{type}s/{repo}/tree/{rev}[/{path}]`` (``?recursive=``), ``POST .../paths-info/{rev}``
* ``GET  /api/{type}s/{repo}/refs``, ``GET .../commits/{rev}``
* ``POST /api/{type}s/{repo}/preupload/{rev}`` (upload mode per file), ``POST .../commit/{rev}`` (NDJSON)
* ``POST|DELETE /api/{type}s/{repo}/branch/{branch}``, ``PUT .../settings`` (``{"private": bool}``)
* ``POST /{repo}.git/info/lfs/objects/batch`` (basic transfer) and ``.../objects/verify``
* ``PUT  /__lfs_upload__/{upload_id}``: the "presigned" upload URL handed out by the batch API (the client sends
  no Authorization header there, exactly as with S3; the unguessable id is the credential). sha256 and size of the
  body are checked before the object is stored.
* ``HEAD|GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``/``X-Linked-Size``
  (LFS files), ``Content-Length`` and single ``Range`` support (``ignore_range``: none, as some proxies). LFS files are served directly (200, no CDN
  redirect); the client accepts both.
* ``POST /api/validate-yaml`` (always valid), ``GET /api/whoami-v2``, ``GET /api/agent-harnesses`` (empty registry:
  huggingface_hub fetches it from ``HF_ENDPOINT`` on the first request it builds headers for).

Errors use the headers the client maps to its exception classes: ``X-Error-Code: RepoNotFound`` (->
``RepositoryNotFoundError``), ``RevisionNotFound`` (-> ``RevisionNotFoundError``), ``EntryNotFound`` (->
``RemoteEntryNotFoundError``; also carries ``X-Repo-Commit``). Note: huggingface_hub only maps a bare 401 to
``RepositoryNotFoundError`` for ``https://`` endpoints, so the stand-in always sends the explicit error code.

Semantics that mirror the Hub:

* committing / preuploading to a branch that does not exist answers 404 ``RevisionNotFound`` ("Invalid rev id").
  ``HfApi.upload_folder(revision=...)`` does NOT create the branch itself (only the ``hf upload`` CLI does, via
  ``repo_info`` -> ``RevisionNotFoundError`` -> ``create_branch``): callers must ``create_branch(..., exist_ok=True)``
  first.
* new repos get an initial, empty commit on ``main`` (the real Hub adds a ``.gitattributes``; the stand-in does not,
  so ``files()`` returns exactly what was uploaded).
* upload mode: ``lfs`` for known binary suffixes (``.safetensors``, ``.bin``, ...), for files larger than
  ``lfs_threshold`` (1 MB) and for samples containing NUL bytes; ``regular`` otherwise (and for empty files).
* auth: write endpoints need ``Authorization: Bearer <token>`` (401 otherwise); reads of private repos too
  (401 + ``RepoNotFound`` without a valid token). A wrong token is rejected everywhere with
  ``X-Error-Message: Invalid credentials in Authorization header``.

The request log (``requests``) only keeps method, path (no query string), whether an Authorization header was
present, the ``Range`` asked for (None: the whole file) and the status code; no other header's value is stored.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import secrets
import threading
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote

__all__ = ["HubStandIn"]

_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_ACTIONS = {"revision", "tree", "paths-info", "preupload", "commit", "branch", "refs", "settings", "commits"}
_LFS_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".onnx",
    ".msgpack",
    ".h5",
    ".npy",
    ".npz",
    ".pkl",
    ".pickle",
    ".joblib",
    ".model",
    ".zip",
    ".tar",
    ".gz",
    ".tgz",
    ".7z",
    ".parquet",
    ".arrow",
)
_LFS_JSON = "application/vnd.git-lfs+json"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(eq=False)
class _Entry:
    """One file of a tree (immutable; hashes are computed once)."""

    data: bytes
    lfs: bool

    @property
    def size(self) -> int:
        return len(self.data)

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @cached_property
    def oid(self) -> str:
        """Git blob oid: of the content for regular files, of the LFS pointer for LFS files."""
        return _git_blob_oid(self.pointer if self.lfs else self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid


class _Repo:
    def __init__(self, repo_type: str, repo_id: str, private: bool) -> None:
        self.repo_type = repo_type
        self.repo_id = repo_id
        self.private = private
        self.created_at = _now_iso()
        self.branches: dict[str, str] = {}
        self.commits: list[dict[str, Any]] = []  # oldest first
        self.trees: dict[str, dict[str, _Entry]] = {}  # commit sha -> {path: entry}
        self.lfs: dict[str, bytes] = {}  # sha256 -> content (uploaded LFS objects)
        self._counter = 0

    def new_commit(
        self,
        branch: str,
        message: str,
        tree: dict[str, _Entry],
        paths: list[str],
        deleted: list[str],
        description: str = "",
    ) -> str:
        parent = self.branches.get(branch)
        self._counter += 1
        seed = f"{self.repo_type}/{self.repo_id}\0{parent}\0{branch}\0{message}\0{self._counter}\0{secrets.token_hex(8)}"
        sha = hashlib.sha1(seed.encode()).hexdigest()
        self.trees[sha] = dict(tree)
        self.commits.append(
            {
                "sha": sha,
                "branch": branch,
                "message": message,
                "description": description,
                "paths": sorted(paths),
                "deleted": sorted(deleted),
                "parents": [parent] if parent else [],
                "date": _now_iso(),
            }
        )
        self.branches[branch] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        """Branch name or full commit sha -> commit sha (None if unknown)."""
        if revision in self.branches:
            return self.branches[revision]
        if _COMMIT_RE.fullmatch(revision) and revision in self.trees:
            return revision
        return None

    def commit(self, sha: str) -> dict[str, Any]:
        return next(c for c in self.commits if c["sha"] == sha)


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}  # additional JSON body fields


class HubStandIn:
    """In-memory Hub stand-in served by a ``ThreadingHTTPServer`` in a daemon thread."""

    lfs_threshold = 1_000_000  # bytes; bigger files are uploaded as LFS
    #: answer every download whole (200), as a server or proxy that ignores ``Range`` does
    ignore_range = False

    def __init__(self, token: str = "hf_test_token_not_secret", username: str = "stand-in-user") -> None:
        self.token = token
        self.username = username
        self.endpoint = ""
        self.requests: list[dict] = []
        self.errors: list[str] = []  # unexpected server-side exceptions (tracebacks): should stay empty
        #: a path: any commit that would write it fails with 500 (the connection dropping at the last moment)
        self.fail_commits_touching: str | None = None
        self._lock = threading.RLock()
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._uploads: dict[str, tuple[tuple[str, str], str, int]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> HubStandIn:
        if self._server is not None:
            return self
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="hub-stand-in",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ inspection / seeding
    def repo(self, repo_id: str, repo_type: str = "model") -> dict:
        """Snapshot of a repo: ``{"private", "branches", "commits": [{"sha", "branch", "message", "paths", ...}]}``."""
        with self._lock:
            repo = self._repos[(repo_type, repo_id)]
            return {
                "private": repo.private,
                "branches": dict(repo.branches),
                "commits": copy.deepcopy(repo.commits),
            }

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """The tree at a branch or commit sha: ``{path: content}``. KeyError if unknown."""
        with self._lock:
            repo = self._repos[(repo_type, repo_id)]
            sha = repo.resolve(revision)
            if sha is None:
                raise KeyError(f"unknown revision {revision!r} of {repo_id}")
            return {path: entry.data for path, entry in sorted(repo.trees[sha].items())}

    def add_files(
        self,
        repo_id: str,
        files: dict[str, bytes],
        private: bool = False,
        revision: str = "main",
        repo_type: str = "model",
        message: str = "Seed files",
    ) -> str:
        """Commit ``files`` directly (creating the repo/branch if needed); returns the new commit sha.

        ``private`` only applies when the repo is created here.
        """
        with self._lock:
            repo = self._get_or_create(repo_type, repo_id, private)
            if revision not in repo.branches:
                repo.branches[revision] = repo.branches["main"]
            tree = dict(repo.trees[repo.branches[revision]])
            for path, data in files.items():
                data = bytes(data)
                entry = _Entry(data=data, lfs=self._upload_mode(path, len(data), data[:512]) == "lfs")
                if entry.lfs:
                    repo.lfs[entry.sha256] = data
                tree[path] = entry
            return repo.new_commit(revision, message, tree, list(files), [])

    # ------------------------------------------------------------------ internals
    def _get_or_create(self, repo_type: str, repo_id: str, private: bool) -> _Repo:
        key = (repo_type, repo_id)
        if key not in self._repos:
            repo = _Repo(repo_type, repo_id, private)
            repo.new_commit("main", "initial commit", {}, [], [])
            self._repos[key] = repo
        return self._repos[key]

    def _upload_mode(self, path: str, size: int, sample: bytes) -> str:
        if size == 0:
            return "regular"
        if path.lower().endswith(_LFS_SUFFIXES) or size > self.lfs_threshold or b"\x00" in sample:
            return "lfs"
        return "regular"

    def _repo_url(self, repo: _Repo) -> str:
        return f"{self.endpoint}/{_URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    def _log(self, record: dict) -> None:
        # Never keep the token, even if a caller put it in a URL.
        if self.token and self.token in record["path"]:
            record["path"] = record["path"].replace(self.token, "<redacted>")
        with self._lock:
            self.requests.append(record)


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn  # bound by HubStandIn.start()
    server_version = "HubStandIn/1.0"
    # HTTP/1.0: one request per connection, no keep-alive bookkeeping needed; httpx reconnects transparently.
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ------------------------------------------------------------------ plumbing
    def _handle(self, method: str) -> None:
        raw_path, _, query = self.path.partition("?")
        record = {
            "method": method,
            "path": raw_path,
            "authorized": self.headers.get("Authorization") is not None,
            "range": self.headers.get("Range"),
            "status": None,
        }
        # Logged before anything is answered, and the status is filled in *before* the response is written, so
        # a client that has its answer always finds its request (with status) in the log.
        self._record = record
        self.hub._log(record)
        try:
            self._body = self._read_body()
            self._query = parse_qs(query, keep_blank_values=True)
            self._dispatch(method, raw_path)
        except _HttpError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up once it had read what it needed
            self.close_connection = True
        except Exception:  # pragma: no cover - a bug in the stand-in
            tb = traceback.format_exc()
            self.hub.errors.append(tb)
            try:
                self._send(500, {"error": f"HubStandIn internal error:\n{tb}"})
            except Exception:
                pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                line = self.rfile.readline().strip()
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # CRLF after each chunk
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(
        self,
        status: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> None:
        if isinstance(body, (dict, list)):
            payload = json.dumps(body).encode()
            content_type = content_type or "application/json; charset=utf-8"
        elif body is None:
            payload = b""
        else:
            payload = bytes(body)
            content_type = content_type or "application/octet-stream"
        self._record["status"] = status
        self.send_response(status)
        hdrs = dict(headers or {})
        if content_type:
            hdrs.setdefault("Content-Type", content_type)
        hdrs.setdefault("Content-Length", str(len(payload)))
        trace_id = self.headers.get("X-Amzn-Trace-Id")
        if trace_id:
            hdrs.setdefault("X-Request-Id", trace_id)
        for key, value in hdrs.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and payload:
            self.wfile.write(payload)

    def _error(self, err: _HttpError) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._send(err.status, {"error": err.message, **err.extra}, headers=headers)

    def _json(self) -> Any:
        try:
            return json.loads(self._body or b"null")
        except ValueError as exc:
            raise _HttpError(400, f"Invalid JSON body: {exc}") from exc

    # ------------------------------------------------------------------ auth
    def _auth_state(self) -> str:
        """'anonymous', 'ok' (raises 401 on a wrong token)."""
        header = self.headers.get("Authorization")
        if header is None:
            return "anonymous"
        if header == f"Bearer {self.hub.token}":
            return "ok"
        raise _HttpError(401, "Invalid credentials in Authorization header")

    def _require_write(self) -> None:
        if self._auth_state() != "ok":
            raise _HttpError(401, "Invalid username or password. You must be authenticated to write.")

    def _repo(self, repo_type: str, repo_id: str, write: bool = False) -> _Repo:
        state = self._auth_state()
        if write:
            self._require_write()
        repo = self.hub._repos.get((repo_type, repo_id))
        if repo is None or (repo.private and state != "ok"):
            status = 401 if state != "ok" else 404
            raise _HttpError(status, "Repository not found", code="RepoNotFound")
        return repo

    # ------------------------------------------------------------------ routing
    def _dispatch(self, method: str, raw_path: str) -> None:
        segs = [unquote(s) for s in raw_path.split("/")[1:]]
        hub = self.hub

        if segs[:1] == ["api"]:
            rest = segs[1:]
            if rest == ["agent-harnesses"] and method == "GET":
                return self._send(200, {"standardEnvVars": [], "harnesses": {}})
            if rest == ["validate-yaml"] and method == "POST":
                self._auth_state()
                return self._send(200, {"errors": [], "warnings": []})
            if rest in (["whoami-v2"], ["whoami"]) and method == "GET":
                if self._auth_state() != "ok":
                    raise _HttpError(401, "Invalid username or password.")
                return self._send(
                    200,
                    {
                        "type": "user",
                        "id": "0" * 24,
                        "name": hub.username,
                        "fullname": hub.username,
                        "orgs": [],
                        "auth": {
                            "type": "access_token",
                            "accessToken": {"displayName": "stand-in", "role": "write"},
                        },
                    },
                )
            if rest == ["repos", "create"] and method == "POST":
                return self._create_repo()
            if rest == ["repos", "delete"] and method == "DELETE":
                return self._delete_repo()
            if rest and rest[0] in _REPO_TYPES:
                repo_type = _REPO_TYPES[rest[0]]
                n = self._split_repo_id(repo_type, rest[1:])
                repo_id = "/".join(rest[1 : 1 + n])
                return self._repo_api(method, repo_type, repo_id, rest[1 + n :])
            raise _HttpError(501, f"HubStandIn: unsupported API route {method} {raw_path}")

        if segs[:1] == ["__lfs_upload__"] and len(segs) == 2 and method == "PUT":
            return self._lfs_put(segs[1])

        # /{prefix}{repo}.git/info/lfs/objects/{batch,verify}
        m = re.fullmatch(r"/(?:(datasets|spaces)/)?(.+?)\.git/info/lfs/objects/(batch|verify)", raw_path)
        if m and method == "POST":
            repo_type = _REPO_TYPES[m.group(1) or "models"]
            repo_id = unquote(m.group(2))
            return (
                self._lfs_batch(repo_type, repo_id)
                if m.group(3) == "batch"
                else self._lfs_verify(repo_type, repo_id)
            )

        # /{prefix}{repo}/resolve/{rev}/{path}
        if "resolve" in segs and method in ("GET", "HEAD"):
            idx = segs.index("resolve")
            head = segs[:idx]
            repo_type = "model"
            if head and head[0] in ("datasets", "spaces") and len(head) > 1:
                repo_type = _REPO_TYPES[head[0]]
                head = head[1:]
            if 1 <= len(head) <= 2 and len(segs) >= idx + 3:
                return self._resolve(repo_type, "/".join(head), segs[idx + 1], "/".join(segs[idx + 2 :]))

        raise _HttpError(501, f"HubStandIn: unsupported route {method} {raw_path}")

    def _split_repo_id(self, repo_type: str, rest: list[str]) -> int:
        """How many leading segments of ``rest`` form the repo id (1: 'gpt2', 2: 'ns/name')."""
        repos = self.hub._repos
        if len(rest) >= 2 and (repo_type, "/".join(rest[:2])) in repos:
            return 2
        if rest and (repo_type, rest[0]) in repos and (len(rest) == 1 or rest[1] in _ACTIONS):
            return 1
        if len(rest) >= 2 and rest[1] not in _ACTIONS:
            return 2
        return 1

    def _repo_api(self, method: str, repo_type: str, repo_id: str, action: list[str]) -> None:
        with self.hub._lock:
            if not action and method == "GET":
                return self._repo_info(repo_type, repo_id, None)
            if len(action) == 2 and action[0] == "revision" and method == "GET":
                return self._repo_info(repo_type, repo_id, action[1])
            if len(action) >= 2 and action[0] == "tree" and method == "GET":
                return self._tree(repo_type, repo_id, action[1], "/".join(action[2:]).strip("/"))
            if len(action) == 2 and action[0] == "paths-info" and method == "POST":
                return self._paths_info(repo_type, repo_id, action[1])
            if len(action) == 2 and action[0] == "preupload" and method == "POST":
                return self._preupload(repo_type, repo_id, action[1])
            if len(action) == 2 and action[0] == "commit" and method == "POST":
                return self._commit(repo_type, repo_id, action[1])
            if len(action) == 2 and action[0] == "branch" and method in ("POST", "DELETE"):
                return self._branch(method, repo_type, repo_id, action[1])
            if action == ["refs"] and method == "GET":
                return self._refs(repo_type, repo_id)
            if len(action) == 2 and action[0] == "commits" and method == "GET":
                return self._commits(repo_type, repo_id, action[1])
            if action == ["settings"] and method == "PUT":
                repo = self._repo(repo_type, repo_id, write=True)
                payload = self._json() or {}
                if "private" in payload:
                    repo.private = bool(payload["private"])
                if payload.get("visibility") in ("private", "public"):
                    repo.private = payload["visibility"] == "private"
                return self._send(200, {})
        raise _HttpError(501, f"HubStandIn: unsupported repo route {method} {'/'.join(action)}")

    # ------------------------------------------------------------------ repo management
    def _create_repo(self) -> None:
        self._require_write()
        payload = self._json() or {}
        name = payload.get("name")
        if not isinstance(name, str) or not name or "/" in name:
            raise _HttpError(400, "Invalid repo name")
        organization = payload.get("organization") or self.hub.username
        repo_type = payload.get("type") or "model"
        if repo_type not in _URL_PREFIX:
            raise _HttpError(400, f"Unsupported repo type {repo_type!r}")
        repo_id = f"{organization}/{name}"
        private = payload.get("visibility") == "private" or payload.get("private") is True
        with self.hub._lock:
            if (repo_type, repo_id) in self.hub._repos:
                # The client reads `url` from the 409 body when `exist_ok=True` (hf_api.create_repo).
                existing = self.hub._repos[(repo_type, repo_id)]
                raise _HttpError(
                    409,
                    f"You already created this {repo_type} repo: {repo_id}",
                    extra={"url": self.hub._repo_url(existing)},
                )
            repo = self.hub._get_or_create(repo_type, repo_id, private)
        self._send(200, {"url": self.hub._repo_url(repo), "name": repo_id, "id": repo_id})

    def _delete_repo(self) -> None:
        self._require_write()
        payload = self._json() or {}
        organization = payload.get("organization") or self.hub.username
        repo_id = f"{organization}/{payload.get('name')}"
        with self.hub._lock:
            if self.hub._repos.pop((payload.get("type") or "model", repo_id), None) is None:
                raise _HttpError(404, "Repository not found", code="RepoNotFound")
        self._send(200, {})

    def _revision(self, repo: _Repo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise _HttpError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return sha

    def _repo_info(self, repo_type: str, repo_id: str, revision: str | None) -> None:
        repo = self._repo(repo_type, repo_id)
        sha = self._revision(repo, revision or "main")
        blobs = self._flag("blobs")
        siblings = []
        for path, entry in sorted(repo.trees[sha].items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=entry.size, blobId=entry.oid)
                if entry.lfs:
                    sibling["lfs"] = {
                        "size": entry.size,
                        "sha256": entry.sha256,
                        "pointerSize": len(entry.pointer),
                    }
            siblings.append(sibling)
        author = repo_id.split("/")[0] if "/" in repo_id else None
        info: dict[str, Any] = {
            "_id": hashlib.sha1(f"{repo_type}/{repo_id}".encode()).hexdigest()[:24],
            "id": repo_id,
            "author": author,
            "sha": sha,
            "lastModified": repo.commit(sha)["date"],
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(len(v) for v in repo.lfs.values()),
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        if repo_type == "space":
            info.update(sdk="static", runtime=None)
        self._send(200, info)

    def _flag(self, name: str) -> bool:
        values = self._query.get(name) or []
        return bool(values) and values[-1].lower() in ("1", "true", "yes")

    @staticmethod
    def _file_info(path: str, entry: _Entry) -> dict[str, Any]:
        info: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
        if entry.lfs:
            info["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": len(entry.pointer)}
        return info

    @staticmethod
    def _dir_info(path: str, tree: dict[str, _Entry]) -> dict[str, Any]:
        listing = "".join(f"{p}\0{e.oid}\n" for p, e in sorted(tree.items()) if p.startswith(path + "/"))
        return {
            "type": "directory",
            "oid": hashlib.sha1(listing.encode()).hexdigest(),
            "size": 0,
            "path": path,
        }

    def _tree(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_type, repo_id)
        tree = repo.trees[self._revision(repo, revision)]
        recursive = self._flag("recursive")
        prefix = f"{path}/" if path else ""
        if path and path in tree:
            return self._send(200, [self._file_info(path, tree[path])])
        if path and not any(p.startswith(prefix) for p in tree):
            raise _HttpError(404, f"Entry not found: {path}", code="EntryNotFound")
        files: dict[str, _Entry] = {}
        dirs: set[str] = set()
        for p, entry in tree.items():
            if not p.startswith(prefix):
                continue
            rel = p[len(prefix) :].split("/")
            if len(rel) == 1:
                files[p] = entry
            elif recursive:
                files[p] = entry
                for i in range(1, len(rel)):
                    dirs.add(prefix + "/".join(rel[:i]))
            else:
                dirs.add(prefix + rel[0])
        out = [self._dir_info(d, tree) for d in sorted(dirs)]
        out += [self._file_info(p, e) for p, e in sorted(files.items())]
        out.sort(key=lambda item: item["path"])
        self._send(200, out)

    def _paths_info(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_type, repo_id)
        tree = repo.trees[self._revision(repo, revision)]
        ctype = self.headers.get("Content-Type") or ""
        if "json" in ctype:
            paths = (self._json() or {}).get("paths") or []
        else:
            paths = parse_qs(self._body.decode(), keep_blank_values=True).get("paths", [])
        out = []
        for path in paths:
            path = path.strip("/")
            if path in tree:
                out.append(self._file_info(path, tree[path]))
            elif any(p.startswith(path + "/") for p in tree):
                out.append(self._dir_info(path, tree))
        self._send(200, out)

    def _refs(self, repo_type: str, repo_id: str) -> None:
        repo = self._repo(repo_type, repo_id)

        def ref(name: str, sha: str, kind: str) -> dict:
            return {"name": name, "ref": f"refs/{kind}/{name}" if kind else name, "targetCommit": sha}

        branches = [ref(n, s, "heads") for n, s in repo.branches.items() if not n.startswith("refs/")]
        prs = [ref(n, s, "") for n, s in repo.branches.items() if n.startswith("refs/pr/")]
        body: dict[str, Any] = {"branches": branches, "tags": [], "converts": []}
        if self._flag("include_prs"):
            body["pullRequests"] = prs
        self._send(200, body)

    def _commits(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_type, repo_id)
        sha: str | None = self._revision(repo, revision)
        out = []
        while sha:
            c = repo.commit(sha)
            out.append(
                {
                    "id": c["sha"],
                    "title": c["message"],
                    "message": c["description"],
                    "authors": [{"user": self.hub.username}],
                    "date": c["date"],
                }
            )
            sha = c["parents"][0] if c["parents"] else None
        self._send(200, out)

    def _branch(self, method: str, repo_type: str, repo_id: str, branch: str) -> None:
        repo = self._repo(repo_type, repo_id, write=True)
        if method == "DELETE":
            if branch not in repo.branches or branch == "main":
                raise _HttpError(404, f"Invalid rev id: {branch}", code="RevisionNotFound")
            del repo.branches[branch]
            return self._send(200, {})
        if branch.startswith("refs/"):
            raise _HttpError(400, f"Invalid reference for a branch: {branch}")
        if branch in repo.branches:
            raise _HttpError(409, f"Reference already exists: refs/heads/{branch}")
        starting_point = (self._json() or {}).get("startingPoint") or "main"
        repo.branches[branch] = self._revision(repo, starting_point)
        self._send(200, {})

    # ------------------------------------------------------------------ upload
    def _preupload(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_type, repo_id, write=True)
        head = repo.trees[self._revision(repo, revision)]
        payload = self._json() or {}
        files = []
        for item in payload.get("files") or []:
            path = item["path"]
            sample = base64.b64decode(item.get("sample") or "")
            mode = self.hub._upload_mode(path, int(item.get("size") or 0), sample)
            existing = head.get(path)
            oid = None
            if existing is not None:
                oid = existing.sha256 if existing.lfs else existing.oid
            files.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._send(200, {"files": files, "commitOid": repo.branches.get(revision, revision)})

    def _lfs_batch(self, repo_type: str, repo_id: str) -> None:
        with self.hub._lock:
            repo = self._repo(repo_type, repo_id, write=True)
            payload = self._json() or {}
            if payload.get("operation") != "upload":
                raise _HttpError(422, "HubStandIn: only the LFS 'upload' operation is supported")
            if "basic" not in (payload.get("transfers") or ["basic"]):
                raise _HttpError(422, "HubStandIn: only the LFS 'basic' transfer is supported")
            objects = []
            for obj in payload.get("objects") or []:
                oid, size = obj.get("oid"), obj.get("size")
                if not (
                    isinstance(oid, str) and _SHA256_RE.fullmatch(oid) and isinstance(size, int) and size >= 0
                ):
                    objects.append(
                        {
                            "oid": str(oid),
                            "size": int(size or 0),
                            "error": {"code": 422, "message": "Invalid object"},
                        }
                    )
                    continue
                if oid in repo.lfs and len(repo.lfs[oid]) == size:
                    # Already uploaded: no "actions" => the client skips the upload.
                    objects.append({"oid": oid, "size": size})
                    continue
                upload_id = secrets.token_urlsafe(24)
                self.hub._uploads[upload_id] = ((repo_type, repo_id), oid, size)
                base = self.hub.endpoint
                objects.append(
                    {
                        "oid": oid,
                        "size": size,
                        "authenticated": True,
                        "actions": {
                            "upload": {"href": f"{base}/__lfs_upload__/{upload_id}", "expires_in": 3600},
                            "verify": {
                                "href": f"{base}/{_URL_PREFIX[repo_type]}{quote(repo_id)}.git/info/lfs/objects/verify"
                            },
                        },
                    }
                )
        self._send(
            200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}, content_type=_LFS_JSON
        )

    def _lfs_put(self, upload_id: str) -> None:
        with self.hub._lock:
            target = self.hub._uploads.get(upload_id)
            if target is None:
                raise _HttpError(403, "Unknown or expired upload URL")
            key, oid, size = target
            data = self._body
            if len(data) != size:
                raise _HttpError(400, f"Size mismatch: expected {size} bytes, got {len(data)}")
            if hashlib.sha256(data).hexdigest() != oid:
                raise _HttpError(400, "sha256 mismatch between the uploaded content and the announced oid")
            repo = self.hub._repos.get(key)
            if repo is None:
                raise _HttpError(404, "Repository not found", code="RepoNotFound")
            repo.lfs[oid] = data
            del self.hub._uploads[upload_id]
        self._send(200, None, headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})

    def _lfs_verify(self, repo_type: str, repo_id: str) -> None:
        with self.hub._lock:
            repo = self._repo(repo_type, repo_id, write=True)
            payload = self._json() or {}
            oid, size = payload.get("oid"), payload.get("size")
            if oid not in repo.lfs or len(repo.lfs[oid]) != size:
                raise _HttpError(404, f"LFS object {oid} not found (or wrong size)")
        self._send(200, {"message": "Verified"}, content_type=_LFS_JSON)

    def _commit(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_type, repo_id, write=True)
        create_pr = self._flag("create_pr")
        base_sha = self._revision(repo, revision)
        if not create_pr and revision not in repo.branches:
            raise _HttpError(400, f"Can only commit to a branch, got {revision!r}")
        try:
            lines = [json.loads(line) for line in self._body.decode().splitlines() if line.strip()]
        except ValueError as exc:
            raise _HttpError(400, f"Invalid NDJSON body: {exc}") from exc
        if not lines or lines[0].get("key") != "header":
            raise _HttpError(400, "First NDJSON line must be the commit header")
        header = lines[0]["value"]
        summary = header.get("summary") or ""
        if not summary:
            raise _HttpError(400, "Commit summary is required")
        parent = header.get("parentCommit")
        if parent is not None and parent != base_sha:
            raise _HttpError(412, "A commit has happened since. Please refresh and try again.")

        touched = {(line.get("value") or {}).get("path") for line in lines[1:]}
        if self.hub.fail_commits_touching in touched:
            raise _HttpError(500, "Internal Error - We're working hard to fix this as soon as possible!")
        tree = dict(repo.trees[base_sha])
        changed: list[str] = []
        deleted: list[str] = []
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value") or {}
            path = value.get("path", "")
            if key == "file":
                if value.get("encoding", "base64") != "base64":
                    data = str(value.get("content", "")).encode()
                else:
                    data = base64.b64decode(value.get("content", ""))
                tree[path] = _Entry(data=data, lfs=False)
                changed.append(path)
            elif key == "lfsFile":
                oid = value.get("oid")
                if value.get("algo", "sha256") != "sha256" or oid not in repo.lfs:
                    raise _HttpError(422, f"LFS object {oid} for {path!r} was never uploaded to this repo")
                if value.get("size") is not None and value["size"] != len(repo.lfs[oid]):
                    raise _HttpError(422, f"Size mismatch for LFS file {path!r}")
                tree[path] = _Entry(data=repo.lfs[oid], lfs=True)
                changed.append(path)
            elif key == "deletedFile":
                if path not in tree:
                    raise _HttpError(
                        404, f"A file with this name doesn't exist: {path}", code="EntryNotFound"
                    )
                del tree[path]
                deleted.append(path)
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                gone = [p for p in tree if p.startswith(prefix)]
                if not gone:
                    raise _HttpError(
                        404, f"A folder with this name doesn't exist: {path}", code="EntryNotFound"
                    )
                for p in gone:
                    del tree[p]
                deleted.extend(gone)
            else:
                raise _HttpError(400, f"HubStandIn: unsupported commit operation {key!r}")

        prefix_url = f"{self.hub.endpoint}/{_URL_PREFIX[repo_type]}{repo_id}"
        body: dict[str, Any] = {"success": True}
        if create_pr:
            num = 1 + sum(1 for b in repo.branches if b.startswith("refs/pr/"))
            branch = f"refs/pr/{num}"
            repo.branches[branch] = base_sha
            sha = repo.new_commit(branch, summary, tree, changed, deleted, header.get("description") or "")
            body["pullRequestUrl"] = f"{prefix_url}/discussions/{num}"
        else:
            sha = repo.new_commit(revision, summary, tree, changed, deleted, header.get("description") or "")
        body.update(commitOid=sha, commitUrl=f"{prefix_url}/commit/{sha}")
        self._send(200, body)

    # ------------------------------------------------------------------ download
    def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        with self.hub._lock:
            repo = self._repo(repo_type, repo_id)
            sha = self._revision(repo, revision)
            entry = repo.trees[sha].get(path)
        if entry is None:
            raise _HttpError(
                404, f"Entry not found: {path}", code="EntryNotFound", headers={"X-Repo-Commit": sha}
            )
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{entry.oid}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename="{path.rsplit("/", 1)[-1]}"',
        }
        if entry.lfs:
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
            headers["X-Linked-Size"] = str(entry.size)
        data = entry.data
        status = 200
        range_header = self.headers.get("Range")
        if range_header and not self.hub.ignore_range:
            m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", range_header)
            if not m or (not m.group(1) and not m.group(2)):
                raise _HttpError(416, f"Unsupported Range header: {range_header}")
            size = len(data)
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, end = max(0, size - int(m.group(2))), size - 1
            if start >= size or start > end:
                raise _HttpError(416, "Range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
            data = data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            status = 206
        self._send(status, data, headers=headers, content_type="application/octet-stream")
