"""A text encoder's tokenizer as `convert` writes it into the runtimes' files (umT5's, through the real CLI):

- a tokenizer that is no SentencePiece model is refused at plan time, before anything is written, for the
  ComfyUI file (its ``spiece_model`` tensor) as for the GGUF one (its ``tokenizer.ggml.*`` key-values): ComfyUI
  would fail loading the file;
- a pipeline whose ``tokenizer/`` holds transformers 5's tokenizer.json alone converts: both files hold the
  SentencePiece model rebuilt from it, which sentencepiece's processor (ComfyUI's `SPieceTokenizer`; ComfyUI-GGUF's
  rebuilding of it from the key-values) tokenizes with as with the original spiece.model; one SentencePiece cannot
  reproduce is refused naming the file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sentencepiece
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.conftest import run_cli
from tests.helpers.encoders import comfyui_gguf_tokenizer

PROMPTS = ["a cat on a mat", "  the 2 quick   foxes  ", "zebra yak", "é, ü and 中文: bytes"]


def tokenize(model: bytes) -> list[list[int]]:
    sp = sentencepiece.SentencePieceProcessor(model_proto=model, add_bos=False, add_eos=True)
    return [sp.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("umt5")
    for layout in ("pipeline", "single"):
        run_cli("example", root / layout, "--family", "umt5", "--layout", layout, check=True)
    return {"pipeline": root / "pipeline", "single": root / "single"}


def _copy(folder: Path, to: Path) -> Path:
    return Path(shutil.copytree(folder, to))


def _refused(proc, path: Path, out: Path, *words: str) -> str:
    """The call exited 2 with one line naming `path` (and `words`), and wrote nothing."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert str(path) in line and all(w in line for w in words), line
    assert not out.exists()
    return line


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_int8", "gguf"])
def test_a_spiece_model_that_is_garbage_is_refused_before_anything_is_written(examples, tmp_path, fmt):
    source = _copy(examples["pipeline"], tmp_path / "pipeline")
    spiece = source / "tokenizer" / "spiece.model"
    spiece.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0)).byte().numpy().tobytes()
    )
    out = tmp_path / "out"
    _refused(
        run_cli("convert", source / "text_encoder", out, "--format", fmt),
        spiece,
        out,
        "not a SentencePiece model",
    )
    _refused(
        run_cli("plan", source / "text_encoder", "--format", fmt), spiece, out, "not a SentencePiece model"
    )


def test_a_tokenizer_tensor_that_is_garbage_is_refused_naming_the_file_and_tensor(examples, tmp_path):
    """Comfy-Org's single file carries its tokenizer as the tensor ``spiece_model``: bytes there that are no
    SentencePiece model are refused too, rather than copied into the output."""
    (file,) = _copy(examples["single"], tmp_path / "single").glob("*.safetensors")
    tensors = load_file(file)
    tensors["spiece_model"] = torch.full((2048,), 0xFF, dtype=torch.uint8)
    save_file(tensors, file)
    out = tmp_path / "out"
    proc = run_cli("convert", file, out, "--format", "comfy_fp8")
    _refused(proc, file, out, "spiece_model", "not a SentencePiece model")


def _tokenizer_json_alone(examples, folder: Path) -> tuple[Path, bytes]:
    """The example pipeline with its tokenizer/ as transformers 5 saves it: tokenizer.json (and its config), no
    spiece.model; the original spiece.model's bytes."""
    from transformers import AutoTokenizer

    source = _copy(examples["pipeline"], folder)
    original = (source / "tokenizer" / "spiece.model").read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(source / "tokenizer")
    shutil.rmtree(source / "tokenizer")
    tokenizer.save_pretrained(source / "tokenizer")
    assert sorted(p.name for p in (source / "tokenizer").iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    return source, original


def test_a_pipeline_whose_tokenizer_is_a_tokenizer_json_alone_converts_for_comfyui_and_gguf(
    examples, tmp_path
):
    source, original = _tokenizer_json_alone(examples, tmp_path / "pipeline")
    run_cli("convert", source / "text_encoder", tmp_path / "comfy", "--format", "comfy_fp8", check=True)
    with safe_open(tmp_path / "comfy" / "umt5_comfy_fp8.safetensors", "pt") as f:
        spiece = bytes(f.get_tensor("spiece_model").numpy())
    assert tokenize(spiece) == tokenize(original)
    run_cli("verify", tmp_path / "comfy", "--source", source / "text_encoder", check=True)
    run_cli("convert", source / "text_encoder", tmp_path / "gguf", "--format", "gguf", check=True)
    assert tokenize(comfyui_gguf_tokenizer(tmp_path / "gguf" / "umt5.gguf")) == tokenize(original)
    # a spiece.model beside it is the original: taken first, as it is
    (source / "tokenizer" / "spiece.model").write_bytes(original)
    run_cli("convert", source / "text_encoder", tmp_path / "beside", "--format", "comfy_fp8", check=True)
    with safe_open(tmp_path / "beside" / "umt5_comfy_fp8.safetensors", "pt") as f:
        assert bytes(f.get_tensor("spiece_model").numpy()) == original


def test_a_tokenizer_json_sentencepiece_cannot_reproduce_is_refused_naming_it(examples, tmp_path):
    source, _ = _tokenizer_json_alone(examples, tmp_path / "pipeline")
    path = source / "tokenizer" / "tokenizer.json"
    doc = json.loads(path.read_text())
    doc["normalizer"] = {"type": "Lowercase"}
    path.write_text(json.dumps(doc))
    for fmt in ("comfy_fp8", "gguf"):
        out = tmp_path / fmt
        proc = run_cli("convert", source / "text_encoder", out, "--format", fmt)
        _refused(proc, path, out, "Lowercase", "cannot reproduce faithfully")
