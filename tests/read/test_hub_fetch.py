"""`read.hub`: the Hub as a place to read from (what a conversion fetches of a repo), and the token scrubbing every
message from huggingface_hub passes through. Fetching and uploading against a stand-in Hub: tests/publish/test_hub.py (a module name of its own: pytest imports test files by name)."""

from __future__ import annotations

from quantize.read.hub import is_repo_id, literal, scrub, source_files_wanted


def test_scrub_removes_tokens():
    assert (
        scrub("Authorization: Bearer hf_abcDEF123456 rejected") == "Authorization: Bearer hf_<token> rejected"
    )


def test_files_wanted_for_a_recipe():
    files = [
        "README.md",
        "model_index.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
        "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
        "transformer/diffusion_pytorch_model.safetensors.index.json",
        "transformer/notes.txt",
        "transformer_2/config.json",
        "vae/diffusion_pytorch_model.safetensors",
    ]
    assert source_files_wanted(files, ["transformer"], everything=False) == [
        "README.md",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
        "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
        "transformer/diffusion_pytorch_model.safetensors.index.json",
    ]
    assert source_files_wanted(files, ["."], everything=False) == ["README.md"]
    assert source_files_wanted(files, ["transformer"], everything=True) == sorted(files)


def test_a_repo_id_is_org_slash_name_and_no_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_repo_id("Wan-AI/Wan2.1-T2V-1.3B") and not is_repo_id("not a repo id")
    (tmp_path / "Wan-AI" / "local").mkdir(parents=True)
    assert not is_repo_id("Wan-AI/local")  # a folder of that name is a folder


def test_a_file_name_is_matched_literally():
    assert literal("a[1]*.json") == "a[[]1[]][*].json"
