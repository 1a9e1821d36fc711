"""Prove ``tests/hub_server.HubStandIn`` against the REAL huggingface_hub client (2.4.0).

How the client is pointed at the stand-in
-----------------------------------------
``huggingface_hub.constants`` reads ``HF_ENDPOINT`` / ``HF_HUB_DISABLE_XET`` / ``HF_HOME`` at *import* time, and the
module is already imported in this process. The in-process tests therefore:

* pass ``endpoint=hub.endpoint`` and ``token=...`` explicitly to ``HfApi`` / ``snapshot_download`` /
  ``hf_hub_download`` and an explicit ``cache_dir``;
* monkeypatch ``constants.HF_HUB_DISABLE_XET = True`` (read at call time by ``is_xet_available()``: selects the
  legacy LFS upload path instead of the Xet pipeline), ``constants.ENDPOINT`` *together with*
  ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (``hf_hub_url`` only swaps in ``endpoint=`` when the template starts
  with ``constants.ENDPOINT``; ``/api/agent-harnesses`` is also fetched from ``constants.ENDPOINT``), and the token /
  registry paths, so that nothing reads or writes the developer's real ``~/.cache/huggingface``.

``test_env_vars_only_in_subprocess`` additionally runs the client in a fresh interpreter configured purely through
environment variables (HF_ENDPOINT, HF_HUB_DISABLE_XET=1, HF_TOKEN, HF_HOME), which is how CLI subprocesses use it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_server import HubStandIn

REPO = "stand-in-org/tiny-model"

# huggingface_hub's own LFS upload (`lfs._upload_single_part`) passes the file as `data=` to httpx2.
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")


@pytest.fixture
def hub():
    with HubStandIn() as server:
        yield server
        # Invariants checked after every test.
        assert server.token not in repr(server.requests)
        assert server.errors == [], server.errors[0]


@pytest.fixture
def client_env(hub, tmp_path, monkeypatch):
    """Point the already-imported huggingface_hub at the stand-in (see module docstring)."""
    home = tmp_path / "hf_home"
    home.mkdir()
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json"))
    return home


@pytest.fixture
def api(hub, client_env) -> HfApi:
    return HfApi(endpoint=hub.endpoint, token=hub.token)


@pytest.fixture
def model_folder(tmp_path) -> tuple[Path, dict[str, bytes]]:
    folder = tmp_path / "to_upload"
    files = {
        "model.safetensors": os.urandom(3 * 1024 * 1024),
        "transformer/config.json": b'{"hidden_size": 8, "num_layers": 2}\n',
        "README.md": b"---\nlicense: mit\n---\n# tiny model\n",
    }
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder, files


def _calls(hub: HubStandIn, method: str, fragment: str) -> list[dict]:
    return [r for r in hub.requests if r["method"] == method and fragment in r["path"]]


def test_create_repo_twice_with_exist_ok(hub, api):
    url = api.create_repo(REPO, repo_type="model", private=False, exist_ok=True)
    assert url.repo_id == REPO
    assert url.endswith(f"/{REPO}")
    again = api.create_repo(REPO, repo_type="model", private=False, exist_ok=True)
    assert again.repo_id == REPO
    assert [r["status"] for r in _calls(hub, "POST", "/api/repos/create")] == [200, 409]
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_repo(REPO)  # exist_ok=False -> the 409 surfaces
    assert exc.value.response.status_code == 409

    state = hub.repo(REPO)
    assert state["private"] is False
    assert list(state["branches"]) == ["main"]
    assert hub.files(REPO) == {}

    api.create_repo("stand-in-org/secret", private=True, exist_ok=True)
    assert hub.repo("stand-in-org/secret")["private"] is True


def test_upload_folder_legacy_lfs_path(hub, api, model_folder):
    folder, files = model_folder
    api.create_repo(REPO, exist_ok=True)
    info = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="Add tiny model")

    assert hub.files(REPO) == files
    state = hub.repo(REPO)
    assert info.oid == state["branches"]["main"]
    last = state["commits"][-1]
    assert (last["sha"], last["branch"], last["message"]) == (info.oid, "main", "Add tiny model")
    assert last["paths"] == sorted(files)
    assert info.repo_url.repo_id == REPO

    # The classic protocol was used: preupload -> LFS batch -> PUT to the upload URL -> verify -> commit.
    assert _calls(hub, "POST", f"/api/models/{REPO}/preupload/main")
    assert _calls(hub, "POST", f"/{REPO}.git/info/lfs/objects/batch")
    puts = _calls(hub, "PUT", "/__lfs_upload__/")
    assert len(puts) == 1 and puts[0]["status"] == 200
    assert puts[0]["authorized"] is False  # like a presigned S3 URL: no Authorization header is sent there
    assert _calls(hub, "POST", f"/{REPO}.git/info/lfs/objects/verify")
    assert _calls(hub, "POST", f"/api/models/{REPO}/commit/main")[0]["authorized"] is True

    # Repo info reflects the commit; the big file is LFS, the small text files are regular.
    model = api.model_info(REPO, files_metadata=True)
    assert model.sha == info.oid
    siblings = {s.rfilename: s for s in model.siblings}
    assert set(siblings) == set(files)
    assert siblings["model.safetensors"].lfs is not None
    assert siblings["model.safetensors"].lfs.size == len(files["model.safetensors"])
    assert siblings["transformer/config.json"].lfs is None
    assert siblings["transformer/config.json"].size == len(files["transformer/config.json"])

    # Same folder again: preupload reports the remote oids, nothing is re-uploaded and no empty commit is made.
    again = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="Same again")
    assert again.oid == info.oid
    assert len(_calls(hub, "PUT", "/__lfs_upload__/")) == 1
    assert len(hub.repo(REPO)["commits"]) == len(state["commits"])


def test_upload_folder_to_new_branch(hub, api, model_folder, tmp_path):
    folder, files = model_folder
    api.create_repo(REPO, exist_ok=True)
    main_sha = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="main").oid

    extra = tmp_path / "extra"
    (extra / "transformer").mkdir(parents=True)
    (extra / "transformer" / "config.json").write_bytes(b'{"hidden_size": 16}\n')
    (extra / "notes.txt").write_bytes(b"v1 notes\n")

    # Like the Hub: HfApi.upload_folder(revision=...) does not create the branch (only `hf upload` does).
    with pytest.raises(RevisionNotFoundError):
        api.upload_folder(repo_id=REPO, folder_path=extra, revision="v1", commit_message="v1")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(REPO, revision="v1")

    api.create_branch(REPO, branch="v1", exist_ok=True)
    api.create_branch(REPO, branch="v1", exist_ok=True)  # 409 handled by the client
    info = api.upload_folder(repo_id=REPO, folder_path=extra, revision="v1", commit_message="v1 update")

    state = hub.repo(REPO)
    assert state["branches"] == {"main": main_sha, "v1": info.oid}
    assert state["commits"][-1]["branch"] == "v1"
    expected_v1 = {**files, "transformer/config.json": b'{"hidden_size": 16}\n', "notes.txt": b"v1 notes\n"}
    assert hub.files(REPO, revision="v1") == expected_v1
    assert hub.files(REPO, revision="main") == files
    assert hub.files(REPO, revision=main_sha) == files
    assert api.repo_info(REPO, revision="v1").sha == info.oid
    assert {b.name for b in api.list_repo_refs(REPO).branches} == {"main", "v1"}


def test_snapshot_download_allow_patterns(hub, api, model_folder, tmp_path):
    folder, files = model_folder
    (folder / "transformer" / "weights.safetensors").write_bytes(os.urandom(70_000))
    files["transformer/weights.safetensors"] = (folder / "transformer" / "weights.safetensors").read_bytes()
    api.create_repo(REPO, exist_ok=True)
    sha = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="add").oid

    cache = tmp_path / "cache"
    snap = snapshot_download(
        REPO,
        revision=None,
        allow_patterns=["transformer/*"],
        cache_dir=cache,
        endpoint=hub.endpoint,
        token=hub.token,
    )
    snap = Path(snap)
    assert snap == cache.resolve() / "models--stand-in-org--tiny-model" / "snapshots" / sha
    got = {p.relative_to(snap).as_posix(): p.read_bytes() for p in snap.rglob("*") if p.is_file()}
    assert got == {k: v for k, v in files.items() if k.startswith("transformer/")}
    assert (cache / "models--stand-in-org--tiny-model" / "refs" / "main").read_text() == sha
    assert _calls(hub, "GET", f"/api/models/{REPO}/tree/{sha}")  # 2.4.0 lists the tree at the resolved commit


def test_hf_hub_download_big_file(hub, api, model_folder, tmp_path):
    folder, files = model_folder
    api.create_repo(REPO, exist_ok=True)
    sha = api.upload_folder(repo_id=REPO, folder_path=folder, commit_message="add").oid

    cache = tmp_path / "cache"
    path = hf_hub_download(REPO, "model.safetensors", cache_dir=cache, endpoint=hub.endpoint, token=hub.token)
    assert Path(path).read_bytes() == files["model.safetensors"]
    assert Path(path).parent.name == sha
    # Pinned to the commit sha, and a nested regular file.
    path = hf_hub_download(
        REPO, "transformer/config.json", revision=sha, cache_dir=cache, endpoint=hub.endpoint, token=hub.token
    )
    assert Path(path).read_bytes() == files["transformer/config.json"]
    assert _calls(hub, "HEAD", f"/{REPO}/resolve/main/model.safetensors")

    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.bin", cache_dir=cache, endpoint=hub.endpoint, token=hub.token)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/nothing", "x.json", cache_dir=cache, endpoint=hub.endpoint, token=hub.token)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("nobody/nothing")


def test_seeded_private_repo_needs_token(hub, api, tmp_path):
    sha = hub.add_files(
        "stand-in-org/private", {"a.json": b"{}", "w.safetensors": b"\x00" * 10}, private=True
    )
    assert hub.repo("stand-in-org/private")["branches"]["main"] == sha
    anonymous = HfApi(endpoint=hub.endpoint, token=False)
    cache = tmp_path / "cache"

    with pytest.raises(RepositoryNotFoundError):
        anonymous.model_info("stand-in-org/private")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("stand-in-org/private", "a.json", cache_dir=cache, endpoint=hub.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("stand-in-org/private", cache_dir=cache, endpoint=hub.endpoint, token=False)
    assert any(r["status"] == 401 and not r["authorized"] for r in hub.requests)

    assert api.model_info("stand-in-org/private").sha == sha
    path = hf_hub_download(
        "stand-in-org/private", "w.safetensors", cache_dir=cache, endpoint=hub.endpoint, token=hub.token
    )
    assert Path(path).read_bytes() == b"\x00" * 10


def test_writes_need_the_right_token(hub, api, model_folder):
    folder, _ = model_folder
    anonymous = HfApi(endpoint=hub.endpoint, token=False)
    wrong = HfApi(endpoint=hub.endpoint, token="hf_wrong_token")

    with pytest.raises(HfHubHTTPError) as exc:
        anonymous.create_repo(REPO)
    assert exc.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as exc:
        wrong.create_repo(REPO)
    assert exc.value.response.status_code == 401
    assert hub._repos == {}

    api.create_repo(REPO)
    for client in (anonymous, wrong):
        with pytest.raises(HfHubHTTPError) as exc:
            client.upload_folder(repo_id=REPO, folder_path=folder, commit_message="nope")
        assert exc.value.response.status_code == 401
        with pytest.raises(HfHubHTTPError):
            client.create_branch(REPO, branch="nope")
    assert hub.files(REPO) == {}
    assert list(hub.repo(REPO)["branches"]) == ["main"]
    assert "hf_wrong_token" not in repr(hub.requests)


def test_env_vars_only_in_subprocess(hub, tmp_path):
    """The configuration a CLI subprocess gets: nothing but environment variables."""
    (tmp_path / "up" / "sub").mkdir(parents=True)
    (tmp_path / "up" / "sub" / "w.safetensors").write_bytes(b"\x01\x02" * 1000)
    (tmp_path / "up" / "a.txt").write_text("hello\n")
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download
        api = HfApi()
        api.create_repo("org/env-only", private=True, exist_ok=True)
        api.create_repo("org/env-only", private=True, exist_ok=True)
        sha = api.upload_folder(repo_id="org/env-only", folder_path=sys.argv[1], commit_message="env").oid
        snap = snapshot_download("org/env-only", allow_patterns=["*.txt"])
        assert sorted(x.name for x in Path(snap).rglob("*") if x.is_file()) == ["a.txt"], "snapshot"
        p = hf_hub_download("org/env-only", "sub/w.safetensors")
        assert Path(p).read_bytes() == b"\\x01\\x02" * 1000, "content"
        print(sha)
        """
    )
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_DISABLE_XET": "1",
        "HF_TOKEN": hub.token,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_OIDC_RESOURCE",
        "HUGGINGFACE_CO_STAGING",
    ):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "up")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == hub.repo("org/env-only")["branches"]["main"]
    assert hub.repo("org/env-only")["private"] is True
    assert hub.files("org/env-only") == {"sub/w.safetensors": b"\x01\x02" * 1000, "a.txt": b"hello\n"}
    assert (tmp_path / "hf_home" / "hub" / "models--org--env-only").is_dir()
