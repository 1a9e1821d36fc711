"""Gemma 4's text model alone (transformers' `Gemma4TextModel`: E2B's / E4B's language model, with its per-layer
embeddings and key-value sharing): its layout, its recipes, its two namings and its tokenizer, each read by its
real reader, and its bad inputs refused.

The oracles:
- transformers' own `Gemma4TextModel`, built and saved by transformers here (its own initialization): its
  parameters and buffers (the names the folder holds), its `from_pretrained` (the loader of the transformers-side
  formats) and its forward (the reference);
- ComfyUI's Gemma 4 (``comfy/text_encoders/gemma4.py`` `Gemma4Transformer` as ``model.``, its
  `TransformerBlockGemma4` with the per-layer input gate, projection and norm), whose names the ComfyUI file holds,
  and its tokenizer, `Tokenizer.from_str` of the file's ``tokenizer_json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantize.models import family_of, get_family
from quantize.models.examples.gemma3_text import GEMMA3_TEXT_EXAMPLES
from quantize.models.examples.gemma4 import example_tokenizer_json
from quantize.models.examples.gemma4_text import GEMMA4_TEXT_EXAMPLES
from quantize.read.detect import detect_layouts
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import run_cli
from tests.helpers.encoders import last_hidden_state
from tests.helpers.verify import forward_sqnr

TEXT, GEMMA3_TEXT = get_family("gemma4-text"), get_family("gemma3-text")
VOCAB = 512
RECIPES = {
    "fp8_channel": "gemma4-text-fp8",
    "torchao_fp8": "gemma4-text-torchao-fp8",
    "torchao_int8": "gemma4-text-torchao-int8",
    "nf4": "gemma4-text-nf4",
    "comfy_fp8": "gemma4-text-comfy-fp8",
    "comfy_int8": "gemma4-text-comfy-int8",
    "comfy_nvfp4": "gemma4-text-comfy-nvfp4",
    "comfy_mxfp8": "gemma4-text-comfy-mxfp8",
    "comfy_w4a8": "gemma4-text-comfy-w4a8",
    "comfy_w4a4": "gemma4-text-comfy-w4a4",
}


def tiny_model():
    """A `Gemma4TextModel` of the tiny preset's config (two global layers, per-layer embeddings of 16, the last
    sharing the first's keys and values), as transformers builds and initializes it."""
    from transformers import Gemma4TextModel

    (model,) = GEMMA4_TEXT_EXAMPLES.models("tiny", "pipeline")
    torch.manual_seed(0)
    return Gemma4TextModel(TEXT.build_model(model.config).config).eval()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """`quantize example --family gemma4-text`: the class's tensors (the first test holds them to transformers'
    own) as a pipeline's ``text_encoder/``, Gemma 4's tokenizer.json in ``tokenizer/``. Its random values are
    the examples' (`examples.gemma4.init`), not transformers' initialization: Gemma 4's attention has no
    1/sqrt(head size), and at the query and key norms' initial 1 a random model's softmax is one-hot, where
    4-bit weights flip which key wins (transformers' own init of this config: nf4 7.7 dB, comfy_fp8 18.6 dB, under
    the family's floors of 12 and 20), where a trained model keeps its logits small."""
    root = tmp_path_factory.mktemp("gemma4-text") / "pipeline"
    run_cli("example", root, "--family", "gemma4-text", check=True)
    assert (root / "tokenizer" / "tokenizer.json").read_bytes() == example_tokenizer_json(VOCAB)
    return root


@pytest.fixture(scope="module")
def reference(source):
    from transformers import Gemma4TextModel

    model = Gemma4TextModel.from_pretrained(source / "text_encoder", dtype=torch.float32).eval()
    ids = torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


# -- names, detection and recipes ------------------------------------------------------------------------------


def test_the_example_is_the_class_and_its_names_are_comfyuis_gemma4_model():
    """The example's tensors are `Gemma4TextModel`'s state (its layer scalars, per-layer embeddings, the KV-sharing
    layers without k_proj, v_proj, k_norm); each has ComfyUI's ``model.`` name."""
    own = {k: tuple(v.shape) for k, v in tiny_model().state_dict().items()}
    for layout in GEMMA4_TEXT_EXAMPLES.layouts:
        (model,) = GEMMA4_TEXT_EXAMPLES.models("tiny", layout)
        assert dict(model.tensors) == own
    assert "layers.1.self_attn.k_proj.weight" not in own and "layers.0.self_attn.v_proj.weight" in own
    assert {TEXT.native_name(n) for n in own} == {f"model.{n}" for n in own}
    assert TEXT.native_name("tokenizer_json") == "tokenizer_json"


def test_detection_keeps_the_gemma3_and_gemma4_text_models_apart():
    (g4,) = GEMMA4_TEXT_EXAMPLES.models("tiny", "pipeline")
    (g3,) = GEMMA3_TEXT_EXAMPLES.models("tiny", "pipeline")
    assert family_of(None, [n for n, _ in g4.tensors]) is TEXT
    assert family_of(None, [n for n, _ in g3.tensors]) is GEMMA3_TEXT
    assert family_of("Gemma3TextModel", [n for n, _ in g4.tensors]) is None


def test_recipes_for_names_the_layout_and_lists_its_derived_recipes(source):
    from quantize.recipes import default_recipes

    assert default_recipes()["gemma4-text"] == RECIPES
    listed = run_cli("recipes", "--for", source, check=True).stdout
    assert "gemma4-text (Gemma 4 text model, a pipeline's text_encoder/ (Gemma4TextModel))" in listed


# -- the formats, read by their readers -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["torchao_int8", "nf4"])
def test_transformers_from_pretrained_loads_and_runs_the_output(source, reference, tmp_path, fmt):
    """The transformers-side output holds the class's own names: its `from_pretrained` reads the quantization
    config and runs it (the layer scalars and per-layer embeddings as stored), and `verify --forward` holds it to
    the source."""
    from transformers import Gemma4TextModel

    out = tmp_path / fmt
    run_cli("convert", source, out, "--format", fmt, check=True)
    path = out / "text_encoder"
    with safe_open(path / "model.safetensors", "pt") as f:
        assert "tokenizer_json" not in f.keys()
        assert torch.equal(
            f.get_tensor("layers.1.layer_scalar"),
            load_file(source / "text_encoder" / "model.safetensors")["layers.1.layer_scalar"],
        )
    assert json.loads((path / "config.json").read_text())["architectures"] == ["Gemma4TextModel"]
    reported = forward_sqnr(out, source)
    ids, ref = reference
    theirs = Gemma4TextModel.from_pretrained(path, dtype=torch.bfloat16).eval()
    floor = 10 if fmt == "nf4" else 20
    assert reported > floor and sqnr(ref, last_hidden_state(theirs, ids)) > floor - 2


def test_comfy_fp8_writes_comfyuis_names_and_the_tokenizer_and_verifies(source, tmp_path):
    from tokenizers import Tokenizer

    out = tmp_path / "comfy"
    run_cli("convert", source, out, "--format", "comfy_fp8", check=True)
    (path,) = (out / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        tokenizer = bytes(f.get_tensor("tokenizer_json").numpy())
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("model.embed_tokens_per_layer.weight").dtype == torch.bfloat16  # kept
    parts = ("comfy_quant", "weight_scale")
    own = {f"model.{n}" for n in tiny_model().state_dict()}
    assert {k for k in keys if k.rsplit(".", 1)[-1] not in parts} == own | {"tokenizer_json"}
    assert not any("per_layer" in k and k.endswith("comfy_quant") for k in keys)
    assert "model.layers.1.self_attn.k_proj.weight" not in keys
    assert tokenizer == (source / "tokenizer" / "tokenizer.json").read_bytes()
    assert Tokenizer.from_str(tokenizer.decode()).encode("a cat").ids
    assert forward_sqnr(out, source) > 20


def test_gguf_is_refused_in_one_line_naming_the_reader(source, tmp_path):
    proc = run_cli("convert", source, tmp_path / "out", "--format", "gguf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "Gemma 4 text model has no GGUF architecture" in line and "TXT_ARCH_LIST" in line
    assert not (tmp_path / "out").exists()


def test_the_bare_example_holds_its_tokenizer_and_converts_for_comfyui(tmp_path):
    run_cli("example", tmp_path / "bare", "--family", "gemma4-text", "--layout", "bare", check=True)
    (layout,) = detect_layouts(tmp_path / "bare")
    assert (layout.name, layout.encoder) == ("gemma4-text", False)
    run_cli("convert", tmp_path / "bare", tmp_path / "int8", "--format", "comfy_int8", check=True)
    (path,) = (tmp_path / "int8").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        assert (
            bytes(f.get_tensor("tokenizer_json").numpy())
            == (tmp_path / "bare" / "tokenizer.json").read_bytes()
        )
        assert "model.layers.1.mlp.down_proj.comfy_quant" in f.keys()


# -- bad input: one line, exit 2, nothing written -----------------------------------------------------------------


@pytest.mark.parametrize(
    "missing", ["layers.0.self_attn.k_proj.weight", "layers.1.per_layer_projection.weight"]
)
def test_a_missing_layer_tensor_is_refused_naming_it_though_shared_layers_lack_keys(
    source, tmp_path, missing
):
    src = tmp_path / "src"
    (src / "text_encoder").mkdir(parents=True)
    (src / "tokenizer").symlink_to(source / "tokenizer")
    (src / "text_encoder" / "config.json").symlink_to(source / "text_encoder" / "config.json")
    tensors = load_file(source / "text_encoder" / "model.safetensors")
    del tensors[missing]
    save_file(tensors, src / "text_encoder" / "model.safetensors")
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "--format", "comfy_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"no tensor {missing!r}" in line and "partial Gemma 4 text model" in line
    assert not out.exists()


def test_a_truncated_file_is_refused_naming_it(source, tmp_path):
    src = tmp_path / "src"
    (src / "text_encoder").mkdir(parents=True)
    (src / "tokenizer").symlink_to(source / "tokenizer")
    (src / "text_encoder" / "config.json").symlink_to(source / "text_encoder" / "config.json")
    data = (source / "text_encoder" / "model.safetensors").read_bytes()
    (src / "text_encoder" / "model.safetensors").write_bytes(data[:-1000])
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "--format", "comfy_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "model.safetensors" in line and "truncated" in line
    assert not out.exists()


def test_a_config_no_family_knows_is_one_line_naming_its_class(source, tmp_path):
    bare = tmp_path / "text_encoder"
    bare.mkdir()
    (bare / "model.safetensors").symlink_to(source / "text_encoder" / "model.safetensors")
    config = json.loads((source / "text_encoder" / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["Gemma5TextModel"]}))
    out = tmp_path / "out"
    proc = run_cli("convert", bare, out, "--format", "comfy_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert (
        f"{bare}: no known layout" in line and "config.json names Gemma5TextModel, which no family is" in line
    )
    assert not out.exists()
