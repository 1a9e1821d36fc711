"""Gemma 3's text model alone (transformers' `Gemma3TextModel`, a source users hold for LTX-2's text encoder): its
layout, its recipes, its two namings and its tokenizer, each read by its real reader.

The oracles:
- transformers' own `Gemma3TextModel`, built and saved by transformers here (its own initialization): its
  parameters (the names the folder holds), its `from_pretrained` (the loader of the transformers-side formats) and
  its forward (the reference);
- ComfyUI's Gemma 3 12B, whose language model `tests/models/test_gemma3.py` holds Gemma 3's ComfyUI file to (its
  ``model.`` names, and the tokenizer as ``spiece_model``);
- sentencepiece, which tokenizes with the tokenizer the ComfyUI file carries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.models import get_family
from quantize.models.examples.gemma3 import GEMMA3_EXAMPLES, example_tokenizer
from quantize.models.examples.gemma3_text import GEMMA3_TEXT_EXAMPLES
from quantize.read.detect import detect_layouts
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import run_cli
from tests.helpers.encoders import last_hidden_state
from tests.helpers.verify import forward_sqnr

TEXT, GEMMA3 = get_family("gemma3-text"), get_family("gemma3")
VOCAB = 512
RECIPES = {
    "fp8_channel": "gemma3-text-fp8",
    "torchao_fp8": "gemma3-text-torchao-fp8",
    "torchao_int8": "gemma3-text-torchao-int8",
    "nf4": "gemma3-text-nf4",
    "comfy_fp8": "gemma3-text-comfy-fp8",
    "comfy_int8": "gemma3-text-comfy-int8",
    "comfy_nvfp4": "gemma3-text-comfy-nvfp4",
    "comfy_mxfp8": "gemma3-text-comfy-mxfp8",
    "comfy_w4a8": "gemma3-text-comfy-w4a8",
    "comfy_w4a4": "gemma3-text-comfy-w4a4",
}


def tiny_model():
    """A `Gemma3TextModel` of a tiny config, as transformers initializes it (its norms zero: they scale by 1 + w)."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=1024,
        rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return Gemma3TextModel(config).eval()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A pipeline folder: transformers' own save of the text model in ``text_encoder/``, Gemma's tokenizer in
    ``tokenizer/``."""
    root = tmp_path_factory.mktemp("gemma3-text") / "pipeline"
    tiny_model().save_pretrained(root / "text_encoder")
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.model").write_bytes(example_tokenizer(VOCAB))
    return root


@pytest.fixture(scope="module")
def reference(source):
    from transformers import Gemma3TextModel

    model = Gemma3TextModel.from_pretrained(source / "text_encoder", dtype=torch.float32).eval()
    ids = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


# -- names and recipes (the family contract holds the examples to their layouts) --------------------------


def test_the_class_names_are_comfyuis_gemma3_language_model_and_the_example_is_the_class():
    """Each parameter of `Gemma3TextModel` is, in ComfyUI's names, a tensor of the same shape in Gemma 3's ComfyUI
    file, and together they are its whole language model; the example's folder is the class's own parameters."""
    own = {k: tuple(v.shape) for k, v in tiny_model().state_dict().items()}
    (single,) = GEMMA3_EXAMPLES.models("tiny", "single")
    language_model = {n: shape for n, shape in single.tensors if n.startswith("model.")}
    assert {TEXT.native_name(n): shape for n, shape in own.items()} == language_model
    assert TEXT.native_name("spiece_model") == "spiece_model"
    for layout in GEMMA3_TEXT_EXAMPLES.layouts:
        (model,) = GEMMA3_TEXT_EXAMPLES.models("tiny", layout)
        with torch.device("meta"):
            built = TEXT.build_model(model.config)  # transformers' class from its config (rope parameters)
        assert type(built).__name__ == "Gemma3TextModel"
        assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == dict(model.tensors) == own


def test_recipes_for_names_the_layout_and_lists_its_derived_recipes(source):
    from quantize.recipes import default_recipes

    assert default_recipes()["gemma3-text"] == RECIPES
    listed = run_cli("recipes", "--for", source, check=True).stdout
    assert "gemma3-text (Gemma 3 text model, a pipeline's text_encoder/ (Gemma3TextModel))" in listed
    assert all(f"{recipe}.yaml" in listed and f"--format {fmt}" in listed for fmt, recipe in RECIPES.items())


# -- the formats, read by their readers -----------------------------------------------------------------------


def test_fp8_channel_loads_in_transformers_and_our_loader_and_verifies(source, reference, tmp_path):
    """The transformers-side output holds the class's own names: its `from_pretrained` reads the
    compressed-tensors config and runs it, our loader too, and `verify --forward` holds it to the source."""
    from transformers import Gemma3TextModel

    from loaders import load_quantized

    out = tmp_path / "fp8"
    run_cli("convert", source, out, "--format", "fp8_channel", check=True)
    path = out / "text_encoder"
    with safe_open(path / "model.safetensors", "pt") as f:
        assert f.get_tensor("layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("embed_tokens.weight").dtype == torch.float32  # kept, as stored
        assert "spiece_model" not in f.keys()
    assert json.loads((path / "config.json").read_text())["architectures"] == ["Gemma3TextModel"]
    reported = forward_sqnr(out, source)
    ids, ref = reference
    theirs = Gemma3TextModel.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_quantized(Gemma3TextModel, path, dtype=torch.float32)
    # both quantize the activations per token (W8A8), each with its own kernels: each is held to the source
    assert reported > 20 and sqnr(ref, last_hidden_state(theirs, ids)) > 18
    assert sqnr(ref, last_hidden_state(ours, ids)) > 18


def test_comfy_fp8_writes_comfyuis_names_and_the_tokenizer_and_verifies(source, tmp_path):
    import sentencepiece

    out = tmp_path / "comfy"
    run_cli("convert", source, out, "--format", "comfy_fp8", check=True)
    (path,) = (out / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        spiece = bytes(f.get_tensor("spiece_model").numpy())
        marker = json.loads(bytes(f.get_tensor("model.layers.0.self_attn.q_proj.comfy_quant").numpy()))
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
    parts = ("comfy_quant", "weight_scale")
    own = {f"model.{n}" for n in tiny_model().state_dict()}
    assert {k for k in keys if k.rsplit(".", 1)[-1] not in parts} == own | {"spiece_model"}
    assert marker["format"] == "float8_e4m3fn"
    assert spiece == (source / "tokenizer" / "tokenizer.model").read_bytes()
    sp = sentencepiece.SentencePieceProcessor(model_proto=spiece, add_bos=True, add_eos=False)
    assert sp.encode("a cat on a mat")[0] == 2  # Gemma's <bos>, as ComfyUI's Gemma 3 tokenizer adds it
    assert forward_sqnr(out, source) > 20


def test_gguf_is_refused_in_one_line_naming_the_reader(source, tmp_path):
    """ComfyUI-GGUF's CLIP loader has no Gemma 3 (its TXT_ARCH_LIST): one line, exit 2, nothing written."""
    proc = run_cli("convert", source, tmp_path / "out", "--format", "gguf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "Gemma 3 text model has no GGUF architecture" in line and "TXT_ARCH_LIST" in line
    assert not (tmp_path / "out").exists()


def test_the_bare_example_holds_its_tokenizer_and_converts_for_comfyui(tmp_path):
    """`quantize example --family gemma3-text --layout bare`: the class's folder itself, ``tokenizer.model`` inside,
    which the ComfyUI file carries."""
    run_cli("example", tmp_path / "bare", "--family", "gemma3-text", "--layout", "bare", check=True)
    (layout,) = detect_layouts(tmp_path / "bare")
    assert (layout.name, layout.encoder) == ("gemma3-text", False)
    run_cli("convert", tmp_path / "bare", tmp_path / "int8", "--format", "comfy_int8", check=True)
    (path,) = (tmp_path / "int8").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        assert (
            bytes(f.get_tensor("spiece_model").numpy())
            == (tmp_path / "bare" / "tokenizer.model").read_bytes()
        )
        assert "model.layers.1.mlp.down_proj.comfy_quant" in f.keys()
