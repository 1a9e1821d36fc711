"""The Hub, through the real huggingface_hub client in CLI subprocesses, against a stand-in Hub API on 127.0.0.1.

Those runs are processes of their own (`run_process`): huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE
and HF_HUB_DISABLE_XET once, when imported. Conversions and verifies of local folders run in this process.

The stand-in speaks the classic LFS upload protocol, so these runs set HF_HUB_DISABLE_XET=1; with hf_xet
(the default) huggingface_hub's `upload_folder` uses its resumable Xet pipeline instead, same calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.utils import validate_repo_id

from tests.conftest import load_all, read_json, run_cli, run_process, wan_fp8_modules
from tests.helpers.hub import fetched as _fetched
from tests.helpers.hub import files_of as _files
from tests.hub_server import HubStandIn

SOURCE_CARD = "---\nlicense: apache-2.0\npipeline_tag: text-to-video\ntags: [video]\n---\n# Wan tiny\n"


@pytest.fixture(scope="module")
def converted_once(wan_tiny, tmp_path_factory) -> Path:
    """The tiny Wan with a model card, converted once for the module. Read-only: `converted` copies it."""
    src = tmp_path_factory.mktemp("hub") / "src"
    shutil.copytree(wan_tiny, src)
    (src / "README.md").write_text(SOURCE_CARD)
    out = src.parent / "Wan-tiny-fp8"
    run_cli("convert", src, out, "-r", "wan-fp8", check=True)
    return out


@pytest.fixture
def converted(converted_once, tmp_path) -> Path:
    """A copy of the converted checkpoint of the test's own (some change it), beside a copy of its source."""
    shutil.copytree(converted_once.parent / "src", tmp_path / "src")
    return Path(shutil.copytree(converted_once, tmp_path / "Wan-tiny-fp8"))


def _assert_no_token(hub: HubStandIn, *texts: str) -> None:
    for text in (*texts, repr(hub.requests)):
        assert hub.token not in text


# -- the model card --------------------------------------------------------------------------------


def test_every_conversion_writes_a_model_card_the_hub_reads(converted, wan_tiny):
    card = ModelCard.load(converted / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0"  # carried over from the source's card
    assert data["pipeline_tag"] == "text-to-video"
    assert {"quantized", "fp8", "fp8-channel", "compressed-tensors"} <= set(data["tags"])
    assert "base_model" not in data  # a local source names no Hub repo
    text = card.text
    manifest = read_json(converted / "quantize_manifest.json")
    quantized = wan_fp8_modules(wan_tiny)  # the source, less its README
    others = len(load_all(wan_tiny)) - len(quantized)
    # what was quantized and kept, per component
    assert f"| `.` | WanModel | {len(quantized)} | {others} |" in text
    sqnr = sorted(t["sqnr_db"] for t in manifest["tensors"].values())
    assert f"| SQNR (dB) | {sqnr[0]:.2f} |" in text
    assert "load_quantized(" in text and "## Provenance" in text
    listed = {f["path"] for f in manifest["output_files"]}
    assert "README.md" in listed  # hashed like every other file
    assert run_cli("verify", converted).returncode == 0


def test_the_card_is_the_same_for_the_same_source_and_recipe(converted, tmp_path):
    again = tmp_path / "elsewhere" / "other-name"
    again.parent.mkdir()
    run_cli("convert", tmp_path / "src", again, "-r", "wan-fp8", check=True)
    assert (again / "README.md").read_bytes() == (converted / "README.md").read_bytes()


# -- upload ----------------------------------------------------------------------------------------


def test_upload_sends_every_file_byte_identical_in_one_commit(converted, hub, hub_env):
    proc = run_process("upload", converted, "someone/Wan-tiny-fp8", "--private", env=hub_env)
    assert proc.returncode == 0, proc.stderr
    arrived = hub.files("someone/Wan-tiny-fp8")
    assert arrived == _files(converted)
    assert hub.repo("someone/Wan-tiny-fp8")["private"] is True
    commits = [c for c in hub.repo("someone/Wan-tiny-fp8")["commits"] if c["paths"]]
    assert len(commits) == 1 and set(commits[0]["paths"]) == set(arrived)  # all or nothing
    assert f"uploaded {len(arrived)} files" in proc.stdout
    _assert_no_token(hub, proc.stdout, proc.stderr)


def test_an_upload_that_fails_at_the_last_moment_leaves_the_repo_as_it_was(converted, hub, hub_env, tmp_path):
    """The connection drops as the commit is made: the Hub still shows the previous checkpoint, whole."""
    run_process("upload", converted, "someone/tiny", env=hub_env, check=True)
    before = hub.files("someone/tiny")
    newer = tmp_path / "newer"
    shutil.copytree(converted, newer)
    manifest = json.loads((newer / "quantize_manifest.json").read_text())
    (newer / "recipe.yaml").write_text((newer / "recipe.yaml").read_text() + "# edited\n")
    manifest["recipe"]["text"] = (newer / "recipe.yaml").read_text()
    entry = next(f for f in manifest["output_files"] if f["path"] == "recipe.yaml")
    entry["size"] = (newer / "recipe.yaml").stat().st_size
    entry["sha256"] = manifest["recipe"]["sha256"] = hashlib.sha256(
        (newer / "recipe.yaml").read_bytes()
    ).hexdigest()
    (newer / "quantize_manifest.json").write_text(json.dumps(manifest, indent=2))
    hub.fail_commits_touching = "quantize_manifest.json"
    proc = run_process("upload", newer, "someone/tiny", env=hub_env)
    hub.fail_commits_touching = None
    assert proc.returncode == 1 and "upload to someone/tiny failed" in proc.stderr
    assert hub.files("someone/tiny") == before


def test_upload_to_a_new_branch_leaves_main_alone(converted, hub, hub_env):
    run_process("upload", converted, "someone/tiny", env=hub_env, check=True)
    main_before = hub.files("someone/tiny")
    commits = len(hub.repo("someone/tiny")["commits"])
    run_process("upload", converted, "someone/tiny", "--revision", "v1", env=hub_env, check=True)
    assert hub.files("someone/tiny", "v1") == main_before == hub.files("someone/tiny")
    assert hub.repo("someone/tiny")["branches"].keys() == {"main", "v1"}
    assert len(hub.repo("someone/tiny")["commits"]) >= commits


def test_dry_run_lists_files_and_sizes_and_sends_nothing(converted, hub, hub_env):
    proc = run_process("upload", converted, "someone/tiny", "--dry-run", env=hub_env)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: verified, nothing was sent" in proc.stdout
    shard = next(converted.glob("*.safetensors"))
    assert shard.name in proc.stdout and f"{shard.stat().st_size / 1e6:.2f} MB" in proc.stdout
    assert hub.requests == []


def test_a_checkpoint_that_fails_verify_is_not_sent(converted, hub, hub_env):
    shard = next(converted.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    proc = run_process("upload", converted, "someone/tiny", env=hub_env)
    assert proc.returncode == 2
    assert "fails verify's integrity checks" in proc.stderr and "nothing was sent" in proc.stderr
    assert hub.requests == []


@pytest.mark.slow
def test_no_token_or_a_wrong_one_is_a_clean_error_that_never_shows_it(converted, hub, hub_env, tmp_path):
    proc = run_process("upload", converted, "someone/tiny", env={**hub_env, "HF_TOKEN": ""})
    assert proc.returncode == 2 and "no Hugging Face token" in proc.stderr and hub.requests == []
    wrong = "hf_WrongTokenValue0123456789"
    proc = run_process("upload", converted, "someone/tiny", env={**hub_env, "HF_TOKEN": wrong})
    assert proc.returncode == 1 and "upload to someone/tiny failed" in proc.stderr
    assert wrong not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: upload to someone/tiny failed: ")
    debug = run_process("--debug", "upload", converted, "someone/tiny", env={**hub_env, "HF_TOKEN": wrong})
    assert debug.returncode == 1 and "Traceback" in debug.stderr  # the traceback is scrubbed too
    assert wrong not in debug.stdout + debug.stderr


def test_a_bad_repo_id_is_refused_before_anything(converted, hub, hub_env):
    proc = run_process("upload", converted, "not a repo id", "--dry-run", env=hub_env)
    assert proc.returncode == 2 and "'not a repo id': not a Hub repo id (expected org/name)" in proc.stderr
    assert "verify:" not in proc.stderr and hub.requests == []


# -- SOURCE as a Hub repo id -----------------------------------------------------------------------


def _seed_diffusers_repo(hub: HubStandIn, tmp_path: Path) -> dict[str, bytes]:
    from tests import diffusers_models as models

    folder = tmp_path / "repo"
    models.wan(folder / "transformer")
    (folder / "vae").mkdir()
    (folder / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"\0" * 4096)  # never needed
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (folder / "README.md").write_text(SOURCE_CARD)
    files = _files(folder)
    hub.add_files("Wan-AI/Wan-tiny-Diffusers", files)
    return files


def _transformer_only(tmp_path: Path) -> Path:
    recipe = tmp_path / "transformer-only.yaml"
    recipe.write_text(
        "name: transformer-only\nformat: fp8_channel\ncomponents: [transformer]\n"
        "targets: ['blocks\\.\\d+\\.(attn1|attn2)\\.(to_q|to_k|to_v|to_out\\.0)', 'blocks\\.\\d+\\.ffn\\.net\\.0\\.proj']\n"
    )
    return recipe


@pytest.mark.slow
def test_convert_from_a_repo_id_fetches_only_what_the_recipe_needs(hub, hub_env, tmp_path):
    files = _seed_diffusers_repo(hub, tmp_path)
    recipe = _transformer_only(tmp_path)
    out = tmp_path / "from-hub"
    proc = run_process("convert", "Wan-AI/Wan-tiny-Diffusers", out, "-r", recipe, env=hub_env)
    assert proc.returncode == 0, proc.stderr
    fetched = {
        r["path"].split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests if "/resolve/" in r["path"]
    }
    assert fetched == {
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "README.md",
    }
    manifest = read_json(out / "quantize_manifest.json")
    assert manifest["source"]["name"] == "Wan-AI/Wan-tiny-Diffusers"
    card = ModelCard.load(out / "README.md").data.to_dict()
    assert card["base_model"] == "Wan-AI/Wan-tiny-Diffusers" and card["base_model_relation"] == "quantized"
    assert card["library_name"] == "diffusers" and card["license"] == "apache-2.0"
    validate_repo_id(card["base_model"])
    assert ModelCard(ModelCard.load(out / "README.md").content).data.to_dict() == card  # round-trips

    # the same conversion from a local copy of the repo writes the same tensors
    local = tmp_path / "local"
    for rel, data in files.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    run_cli("convert", local, tmp_path / "from-local", "-r", recipe, check=True)
    ours, theirs = load_all(out / "transformer"), load_all(tmp_path / "from-local" / "transformer")
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)

    # verify and plan take the repo id too; offline, the cache serves it with the Hub gone
    assert run_process("verify", out, "--source", "Wan-AI/Wan-tiny-Diffusers", env=hub_env).returncode == 0
    hub.stop()
    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    proc = run_process("plan", "Wan-AI/Wan-tiny-Diffusers", "-r", recipe, env=offline)
    assert proc.returncode == 0, proc.stderr
    proc = run_process("convert", "Wan-AI/Other-model", tmp_path / "x", "-r", recipe, env=offline)
    assert proc.returncode == 2
    assert (
        "Wan-AI/Other-model: not in the Hugging Face cache" in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr
    )
    assert not (tmp_path / "x").exists()


def test_an_ltx2_pipeline_repo_converts_to_comfyui_with_its_connectors_fetched(hub, hub_env, tmp_path):
    """A native-named format of a diffusers LTX-2 pipeline joins its connectors/ (`PlanPolicy.beside`): from the
    Hub, the conversion fetches that folder beside transformer/, and writes what the local folder gives."""
    folder = tmp_path / "repo"
    run_cli("example", folder, "--family", "ltx2", "--layout", "pipeline", check=True)
    hub.add_files("Lightricks/LTX-tiny-Diffusers", _files(folder))
    out = tmp_path / "from-hub"
    proc = run_process(
        "convert", "Lightricks/LTX-tiny-Diffusers", out, "-r", "ltx2-diffusers-comfy-fp8", env=hub_env
    )
    assert proc.returncode == 0, proc.stderr
    fetched = {
        r["path"].split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests if "/resolve/" in r["path"]
    }
    assert {"connectors/config.json", "connectors/diffusion_pytorch_model.safetensors"} <= fetched
    run_cli("convert", folder, tmp_path / "from-local", "-r", "ltx2-diffusers-comfy-fp8", check=True)
    ours, theirs = load_all(out / "transformer"), load_all(tmp_path / "from-local" / "transformer")
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)


def _seed_wan_pipeline_with_umt5(hub: HubStandIn, tmp_path: Path) -> Path:
    """A Wan pipeline repo: the transformer, umT5 in text_encoder/ with its tokenizer/, and a VAE no format
    converts; the local folder it was made of."""
    from tests import diffusers_models as models

    folder = tmp_path / "repo"
    models.wan(folder / "transformer")
    run_cli("example", tmp_path / "umt5", "--family", "umt5", check=True)
    for rel in ("text_encoder", "tokenizer"):
        (tmp_path / "umt5" / rel).rename(folder / rel)
    (folder / "vae").mkdir()
    (folder / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"\0" * 4096)  # never needed
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (folder / "README.md").write_text(SOURCE_CARD)
    hub.add_files("Wan-AI/Wan-tiny-Diffusers", _files(folder))
    return folder


@pytest.mark.slow
def test_format_on_a_repo_id_reads_its_outline_and_fetches_the_pipeline_s_encoders(hub, hub_env, tmp_path):
    """`convert REPO OUT --format gguf` on a Wan pipeline repo: the layout is read off configs and safetensors
    headers (range requests: no weights fetched to choose), then the transformer, the umT5 in text_encoder/ and
    its tokenizer/spiece.model are fetched, and nothing else (no VAE); OUT is what the local folder gives, byte
    for byte, and `verify --source REPO` checks both."""
    folder = _seed_wan_pipeline_with_umt5(hub, tmp_path)

    def fresh_cache(name: str) -> dict[str, str]:
        return {**hub_env, "HF_HUB_CACHE": str(tmp_path / f"cache-{name}")}

    out = tmp_path / "from-hub"
    proc = run_process("convert", "Wan-AI/Wan-tiny-Diffusers", out, "--format", "gguf", env=hub_env)
    assert proc.returncode == 0, proc.stderr
    assert "text_encoder/: recipe umt5-gguf-q8_0: umT5" in proc.stdout
    assert _fetched(hub) == {
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/spiece.model",
        "README.md",
    }
    assert _fetched(hub, ranges=True) == {
        "transformer/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
    }
    manifest = read_json(out / "quantize_manifest.json")
    assert (
        manifest["nested"] == ["text_encoder"] and manifest["source"]["name"] == "Wan-AI/Wan-tiny-Diffusers"
    )
    local = tmp_path / "from-local"
    run_cli("convert", folder, local, "--format", "gguf", check=True)
    for rel in ("transformer", "text_encoder"):
        gguf = sorted(p.relative_to(out).as_posix() for p in (out / rel).glob("*.gguf"))
        assert gguf and all((out / f).read_bytes() == (local / f).read_bytes() for f in gguf), rel
    # which recipes fit the repo: each planned on its outline (a tokenizer for the formats that hold one)
    hub.requests.clear()
    fitting = run_process("recipes", "--for", "Wan-AI/Wan-tiny-Diffusers", env={**hub_env, "COLUMNS": "200"})
    assert fitting.returncode == 0, fitting.stderr
    assert "Wan-AI/Wan-tiny-Diffusers: umt5 (umT5" in fitting.stdout
    assert all(
        f"{name}.yaml" in fitting.stdout
        for name in ("wan-diffusers-gguf-q8_0", "umt5-gguf-q8_0", "umt5-comfy-fp8")
    )
    assert not any(f.endswith(".safetensors") for f in _fetched(hub))
    # plan is a dry run on the outline too: no weights fetched, the GGUF headers made (the tokenizer read)
    hub.requests.clear()
    planned = run_process("plan", "Wan-AI/Wan-tiny-Diffusers", "--format", "gguf", env=fresh_cache("plan"))
    assert planned.returncode == 0, planned.stderr
    assert "Wan-AI/Wan-tiny-Diffusers/text_encoder with bundled:umt5-gguf-q8_0.yaml" in planned.stdout
    assert not any(f.endswith(".safetensors") for f in _fetched(hub))
    # verify fetches what the manifests list, the nested one's included, into a cache of its own
    hub.requests.clear()
    proc = run_process(
        "verify", out, "--source", "Wan-AI/Wan-tiny-Diffusers", "--json", env=fresh_cache("verify")
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {(c["category"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    assert (
        checks["parity", "text_encoder/: requantize"]["passed"] > 0
        and checks["provenance", "text_encoder/: source sha256"]["ok"]
    )
    assert {"text_encoder/model.safetensors", "transformer/diffusion_pytorch_model.safetensors"} <= _fetched(
        hub
    )
    # offline, --format and plan read the cached snapshot
    hub.stop()
    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    planned = run_process("plan", "Wan-AI/Wan-tiny-Diffusers", "--format", "gguf", env=offline)
    assert planned.returncode == 0, planned.stderr
    assert "recipe wan-diffusers-gguf-q8_0" in planned.stdout
    assert "Wan-AI/Wan-tiny-Diffusers/text_encoder with bundled:umt5-gguf-q8_0.yaml" in planned.stdout


@pytest.mark.parametrize("ignore_range", [False, True], ids=["ranges", "server-ignores-ranges"])
def test_the_outline_of_a_repo_reads_as_its_files_do(hub, hub_env, tmp_path, ignore_range):
    """Each safetensors file of a repo's outline is read by `read_header` as the file itself is, or refused with
    the same words: a header longer than the first range request (a second one fetches the rest), a file shorter
    than it (one request), an empty file, a truncated one and one that is no safetensors; a tokenizer stored as a
    tensor holds its bytes, the rest of the data is a hole (no disk). The same from a server that ignores
    ``Range`` (each answer read only as far as needed)."""
    import torch
    from safetensors.torch import save_file

    hub.ignore_range = ignore_range
    folder = tmp_path / "repo"
    folder.mkdir()
    save_file({f"t{i:05d}.weight": torch.zeros(1) for i in range(3000)}, folder / "big_header.safetensors")
    save_file({"w": torch.ones(4, 4)}, folder / "small.safetensors")
    (folder / "empty.safetensors").write_bytes(b"")
    (folder / "sub").mkdir()
    save_file({"w": torch.ones(256, 1024)}, folder / "sub" / "model.safetensors")
    (folder / "sub" / "truncated.safetensors").write_bytes(
        (folder / "sub" / "model.safetensors").read_bytes()[:-4]
    )
    spiece = torch.arange(300, dtype=torch.uint8)
    save_file(
        {"w": torch.ones(256, 1024), "spiece_model": spiece}, folder / "sub" / "tokenizer_inside.safetensors"
    )
    cut = (folder / "sub" / "tokenizer_inside.safetensors").read_bytes()[:-100]
    (folder / "sub" / "tokenizer_cut.safetensors").write_bytes(cut)  # spiece_model runs past the end
    (folder / "not_safetensors.safetensors").write_bytes(b"PK\x03\x04 a zip")
    hub.add_files("Some/headers", _files(folder))
    code = """
import json, sys
from pathlib import Path
from quantize.errors import InputError
from quantize.read.checkpoint import read_header
from quantize.read.hub import outline

def read(path):
    try:
        h = read_header(path)
        return [h.data_start, {k: [t.dtype, t.shape, t.start, t.end] for k, t in h.tensors.items()}]
    except InputError as e:
        return str(e).replace(str(path), "FILE")

def tokenizer(path):
    try:
        t = read_header(path).tensors.get("spiece_model")
    except InputError:
        return None
    return None if t is None else list(path.read_bytes()[t.start:t.end])

local = Path(sys.argv[1])
with outline("Some/headers") as root:
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    print(json.dumps({
        f: [read(root / f), read(local / f), tokenizer(root / f), (root / f).stat().st_blocks * 512] for f in files
    }))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, **hub_env},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert sorted(seen) == sorted(_files(folder))
    assert all(outlined == read for outlined, read, _, _ in seen.values()), seen
    refused = ("sub/truncated.safetensors", "sub/tokenizer_cut.safetensors", "not_safetensors.safetensors")
    assert all("truncated" in seen[f][0] for f in refused[:2]) and isinstance(seen[refused[2]][0], str)
    assert "not a safetensors file (0 bytes" in seen["empty.safetensors"][0]
    assert len(seen["big_header.safetensors"][0][1]) == 3000  # a header of more than 100 kB
    assert seen["sub/tokenizer_inside.safetensors"][2] == spiece.tolist()
    assert seen["sub/model.safetensors"][3] < 1 << 20  # 1 MiB of data, a hole on disk
    if not ignore_range:

        def asked(name):
            return [r["range"] for r in hub.requests if r["path"].endswith("/" + name)]

        assert len(asked("big_header.safetensors")) == 2 and len(asked("small.safetensors")) == 1
        assert (
            len(asked("tokenizer_inside.safetensors")) == 2 and len(asked("tokenizer_cut.safetensors")) == 1
        )


def test_plan_on_a_repo_reads_a_tokenizer_stored_as_a_tensor_and_no_weights(hub, hub_env, tmp_path):
    """A repo holding Comfy-Org's single umT5 file (its tokenizer inside, as the tensor ``spiece_model``): `plan
    --format gguf` on its outline reads that tensor by range (the GGUF header holds it as key-values) and no
    weights, and plans what the local file plans, to the byte."""
    folder = tmp_path / "repo"
    run_cli("example", folder, "--family", "umt5", "--layout", "single", check=True)
    hub.add_files("Comfy-Org/umt5-single", _files(folder))
    proc = run_process("plan", "Comfy-Org/umt5-single", "--format", "gguf", env={**hub_env, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    local = run_cli("plan", folder, "--format", "gguf", env={"COLUMNS": "200"}, check=True)

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.splitlines()]  # a title is padded to the table's width

    assert lines(proc.stdout) == lines(local.stdout.replace(str(folder), "Comfy-Org/umt5-single"))
    assert "umt5-single-gguf-q8_0" in proc.stdout and "1.66 MB" in proc.stdout.splitlines()[-1]
    assert not any(f.endswith(".safetensors") for f in _fetched(hub))
    ranged = [(r["path"].rsplit("/", 1)[1], r["range"]) for r in hub.requests if r["range"]]
    assert len(ranged) == 2, ranged  # the header, then spiece_model
    # plan --recipe on a repo whose model lies two folders down: the recipe's folder is outlined at any depth
    deep = tmp_path / "deep"
    (deep / "models" / "umt5").mkdir(parents=True)
    (folder / "umt5_xxl_fp16.safetensors").rename(deep / "models" / "umt5" / "model.safetensors")
    hub.add_files("Some/deep", _files(deep))
    recipe = tmp_path / "deep.yaml"
    printed = yaml.safe_load(run_cli("recipes", "umt5-single-comfy-fp8", check=True).stdout)
    recipe.write_text(yaml.safe_dump({**printed, "components": ["models/umt5"]}))
    hub.requests.clear()
    proc = run_process("plan", "Some/deep", "-r", recipe, env={**hub_env, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "models/umt5" in proc.stdout and not any(f.endswith(".safetensors") for f in _fetched(hub))


def test_offline_after_an_outline_the_repo_is_not_cached(hub, hub_env, tmp_path):
    """An outline writes nothing into the Hugging Face cache: offline afterwards, the repo is said not to be
    cached (not planned on half a snapshot)."""
    _seed_diffusers_repo(hub, tmp_path)
    assert run_process("recipes", "--for", "Wan-AI/Wan-tiny-Diffusers", env=hub_env).returncode == 0
    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    proc = run_process("plan", "Wan-AI/Wan-tiny-Diffusers", "--format", "fp8_channel", env=offline)
    assert proc.returncode == 2 and "Wan-AI/Wan-tiny-Diffusers: not in the Hugging Face cache" in proc.stderr


def test_format_on_a_repo_id_that_no_family_knows_names_the_repo(hub, hub_env, tmp_path):
    """--format on a repo of no known layout: one line naming the repo (not the outline's temporary folder),
    exit 2, nothing written; its weights were never fetched."""
    folder = tmp_path / "repo"
    (folder / "vae").mkdir(parents=True)
    (folder / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLWan"}))
    run_cli("example", tmp_path / "umt5", "--family", "umt5", check=True)
    (tmp_path / "umt5" / "text_encoder" / "model.safetensors").rename(folder / "vae" / "model.safetensors")
    hub.add_files("Some/vae-only", _files(folder))
    proc = run_process("convert", "Some/vae-only", tmp_path / "x", "--format", "fp8_channel", env=hub_env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        proc.stderr.startswith("error: Some/vae-only: no known layout")
        and "quantize-outline" not in proc.stderr
    )
    assert _fetched(hub) == {"vae/config.json"} and not (tmp_path / "x").exists()


def test_an_unknown_repo_or_path_is_one_clean_line(hub, hub_env, tmp_path):
    proc = run_process("convert", "Nobody/no-such-model", tmp_path / "x", "-r", "wan-fp8", env=hub_env)
    assert proc.returncode == 2 and "Nobody/no-such-model: no such model repo" in proc.stderr
    proc = run_process("convert", tmp_path / "missing-folder", tmp_path / "x", "-r", "wan-fp8", env=hub_env)
    assert (
        proc.returncode == 2 and "source not found: neither a folder, a file nor a Hub repo id" in proc.stderr
    )
    assert not (tmp_path / "x").exists()


def test_the_hub_code_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, quantize.read.hub, quantize.publish.hub; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_python_api_takes_a_repo_id_and_writes_what_the_cli_writes(hub, hub_env, tmp_path):
    """`quantize.convert("org/name", ...)`: the API resolves the repo, claims OUT and hashes, as the CLI does."""
    _seed_diffusers_repo(hub, tmp_path)
    recipe = _transformer_only(tmp_path)
    api_out, cli_out = tmp_path / "from-api", tmp_path / "from-cli"
    code = (
        "import sys; from quantize import convert; "
        "m = convert('Wan-AI/Wan-tiny-Diffusers', sys.argv[1], sys.argv[2], workers=1); "
        "print(m.source['name'], len(m.source_files))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(api_out), str(recipe)],
        capture_output=True,
        text=True,
        env={**os.environ, **hub_env},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Wan-AI/Wan-tiny-Diffusers", "2"]  # the transformer's config and shard
    run_process("convert", "Wan-AI/Wan-tiny-Diffusers", cli_out, "-r", recipe, env=hub_env, check=True)
    assert _files(api_out) == _files(cli_out)  # manifest and card included: the same conversion
