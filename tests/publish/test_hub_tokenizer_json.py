"""A umT5 pipeline repo on the Hub (the stand-in of tests/publish/test_hub.py, the real huggingface_hub client in
CLI processes) whose tokenizer/ is a tokenizer.json: fetched, planned and converted as the local folder is; where
a spiece.model lies beside it, only the spiece.model is fetched (a plan takes it first)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sentencepiece
from safetensors import safe_open

from tests.conftest import run_cli, run_process
from tests.helpers.hub import fetched as _fetched
from tests.helpers.hub import files_of as _files

REPO = "Some/umt5-tiny"


def _pipeline(tmp_path: Path, spiece_too: bool) -> tuple[Path, bytes]:
    """The umT5 example pipeline with its tokenizer/ as transformers 5 saves it (tokenizer.json), and the
    original spiece.model beside it where `spiece_too`; the original's bytes."""
    from transformers import AutoTokenizer

    folder = tmp_path / "repo"
    run_cli("example", folder, "--family", "umt5", "--layout", "pipeline", check=True)
    original = (folder / "tokenizer" / "spiece.model").read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    shutil.rmtree(folder / "tokenizer")
    tokenizer.save_pretrained(folder / "tokenizer")
    if spiece_too:
        (folder / "tokenizer" / "spiece.model").write_bytes(original)
    return folder, original


def _ids(model: bytes) -> list[list[int]]:
    sp = sentencepiece.SentencePieceProcessor(model_proto=model, add_eos=True)
    return [sp.encode(p) for p in ("a cat on a mat", "  zebra   yak ", "é 中")]


@pytest.mark.parametrize("spiece_too", [False, True], ids=["tokenizer.json alone", "spiece.model beside"])
def test_a_repo_whose_tokenizer_is_a_tokenizer_json_plans_and_converts(hub, hub_env, tmp_path, spiece_too):  # noqa: F811
    folder, original = _pipeline(tmp_path, spiece_too)
    hub.add_files(REPO, _files(folder))
    taken, left = "tokenizer/spiece.model", "tokenizer/tokenizer.json"
    if not spiece_too:
        taken, left = left, None
    planned = run_process("plan", REPO, "--format", "gguf", env=hub_env)
    assert planned.returncode == 0, planned.stderr
    assert taken in _fetched(hub) and left not in _fetched(hub)
    hub.requests.clear()
    out = tmp_path / "out"
    proc = run_process(
        "convert", REPO, out, "--format", "comfy_fp8", env={**hub_env, "HF_HUB_CACHE": str(tmp_path / "c2")}
    )
    assert proc.returncode == 0, proc.stderr
    assert taken in _fetched(hub) and left not in _fetched(hub)
    name = "text_encoder/text_encoder_comfy_fp8.safetensors"
    with safe_open(out / name, "pt") as f:
        spiece = bytes(f.get_tensor("spiece_model").numpy())
    assert _ids(spiece) == _ids(original)
    local = tmp_path / "local"
    run_cli("convert", folder, local, "--format", "comfy_fp8", check=True)
    assert (out / name).read_bytes() == (local / name).read_bytes()
