"""umT5 (Wan's text encoder): its layouts, names, tokenizer and every format, each read by its real reader.

The oracles:
- transformers' own `UMT5EncoderModel` (its state dict: the source names; its `from_pretrained`: the loader of
  the transformers-side formats; its forward: the reference of every output);
- ComfyUI's umT5 module (``comfy/text_encoders/t5.py``, CLIPLoader type ``wan``), whose state dict
  tests/oracles/comfyui_umt5.py spells from its source (ComfyUI is not on PyPI): transformers' names, ``shared`` and
  no ``embed_tokens``, a relative attention bias in every block; its tokenizer is the ``spiece_model`` bytes
  (comfy/text_encoders/wan.py);
- gguf-py's tensor map for llama.cpp's ``t5encoder`` (`gguf.get_tensor_name_map`: what llama.cpp's converter names
  each transformers tensor), and ComfyUI-GGUF's rebuilding of the tokenizer from ``tokenizer.ggml.*``
  (its loader.py, spelled with sentencepiece's own protobuf module in tests/oracles/comfyui_gguf.py);
- sentencepiece, which tokenizes with the tokenizer each file carries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.formats import FORMAT_INFO
from quantize.models import get_family, name_table
from quantize.models.examples.umt5 import UMT5_EXAMPLES, example_tokenizer, umt5_config
from quantize.read.detect import detect_layouts
from quantize.recipes import default_recipes
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.diffusers_models import wan_of_width
from tests.helpers.encoders import convert_each, last_hidden_state, resident_and_offloaded
from tests.helpers.recipes import listed_recipes
from tests.helpers.verify import forward_sqnr
from tests.oracles.comfyui_gguf import comfyui_gguf_tokenizer
from tests.oracles.comfyui_umt5 import comfyui_state

UMT5 = get_family("umt5")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY, "gguf"]
PROMPTS = ["a cat on a mat", "  the 2 quick   foxes  ", "zebra yak"]


def tokenize(spiece: bytes) -> list[list[int]]:
    """What ComfyUI's `SPieceTokenizer` gives for `PROMPTS` with these tokenizer bytes (eos added, no bos)."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=spiece, add_bos=False, add_eos=True)
    return [sp.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("umt5")
    for layout in UMT5_EXAMPLES.layouts:
        run_cli("example", root / layout, "--family", "umt5", "--layout", layout, check=True)
    return {layout: root / layout for layout in UMT5_EXAMPLES.layouts}


@pytest.fixture(scope="module")
def reference(sources):
    """transformers' UMT5EncoderModel of the source (float32) and its last hidden state on fixed token ids."""
    from transformers import UMT5EncoderModel

    model = UMT5EncoderModel.from_pretrained(sources["pipeline"] / "text_encoder", dtype=torch.float32).eval()
    ids = torch.randint(3, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return ids, model(input_ids=ids).last_hidden_state


# -- names and detection --------------------------------------------------------------------------------------


def test_the_example_is_transformers_own_class_and_comfyuis_module():
    """The source names are those of transformers' class built from the example's config (its tied embed_tokens
    left out, as save_pretrained writes them), and ComfyUI's umT5 has the same names and shapes."""
    from transformers import UMT5Config, UMT5EncoderModel

    for preset in ("tiny", "small"):
        (model,) = UMT5_EXAMPLES.models(preset, "pipeline")
        fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
        with torch.device("meta"):
            built = UMT5EncoderModel(UMT5Config(**fields))
        state = {
            k: tuple(v.shape) for k, v in built.state_dict().items() if k != "encoder.embed_tokens.weight"
        }
        assert dict(model.tensors) == state
        c = model.config
        assert state == comfyui_state(
            c["vocab_size"], c["d_model"], c["d_ff"], c["num_heads"], c["d_kv"], c["num_layers"]
        )


def test_the_gguf_names_are_llama_cpps_t5encoder_names():
    """Each transformers tensor's GGUF name is the one gguf-py's map (llama.cpp's converter) gives it."""
    import gguf

    (model,) = UMT5_EXAMPLES.models("tiny", "pipeline")
    names = [n for n, _ in model.tensors]
    expected = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, model.config["num_layers"])
    table = name_table(UMT5, "gguf", FORMAT_INFO["gguf"], "here")
    rename = table.renamer(names, "here")
    assert {n: rename(n) for n in names} == {
        n: expected.get_name(n, try_suffixes=(".weight",)) for n in names
    }
    assert (
        name_table(UMT5, "native", FORMAT_INFO["comfy_fp8"], "here").renamer(names, "here")(names[5])
        == names[5]
    )


def test_its_recipes_and_t5s_plan_on_it_and_beside_wan_format_takes_the_transformers(sources, tmp_path):
    """`recipes --for` lists its own and T5's (the same names; the file's family decides); beside a Wan transformer,
    ``--format`` takes the transformer's recipe and the encoder's is named (the family contract holds each layout to
    its detection and its own recipes)."""
    for layout, where in (("umt5", sources["pipeline"]), ("umt5-single", sources["single"])):
        recipes = listed_recipes(where)
        assert {f"{r}.yaml" for r in default_recipes()[layout].values()} <= set(recipes)
        assert set(recipes) <= {
            f"{r}.yaml"
            for f in (UMT5, get_family("t5"))
            for r in default_recipes().get(layout.replace("umt5", f.name), {}).values()
        }
    wan = tmp_path / "wan"
    wan_of_width(wan / "transformer", width=64)
    (wan / "text_encoder").symlink_to(sources["pipeline"] / "text_encoder")
    assert {lay.name for lay in detect_layouts(wan)} == {"wan-diffusers", "umt5"}
    plan = run_cli("plan", wan, "--format", "comfy_fp8", check=True).stdout
    assert plan.startswith("recipe wan-diffusers-comfy-fp8")
    plan = run_cli("plan", wan, "--recipe", "umt5-comfy-fp8", check=True).stdout
    assert "with bundled:umt5-comfy-fp8.yaml" in plan.splitlines()[0] and "as comfy_fp8" in plan


# -- every format, read by its reader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("umt5-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, sources, reference, fmt
):
    """`verify --forward` runs the encoder layer by layer on random token ids against the source's; our loader
    builds UMT5EncoderModel from the output and its last hidden state is as close to transformers' own on the source
    as the weights allow (T5 casts wo's input to ``wo.weight.dtype``: a quantized wo reports float32, never its
    storage dtype)."""
    from transformers import UMT5EncoderModel

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], sources["pipeline"])
    model = load_quantized(UMT5EncoderModel, converted[fmt] / "text_encoder", dtype=torch.float32)
    ids, ref = reference
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
    floor = 14 if fmt in ("nf4", "comfy_nvfp4") else 24
    assert reported > floor and sqnr(ref, out) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    """The transformers-side outputs are transformers checkpoints: its own `from_pretrained` reads the
    quantization_config (compressed-tensors, torchao, bitsandbytes) and runs them."""
    from transformers import UMT5EncoderModel

    model = UMT5EncoderModel.from_pretrained(converted[fmt] / "text_encoder", dtype=torch.bfloat16).eval()
    ids, ref = reference
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
    assert sqnr(ref, out) > (14 if fmt == "nf4" else 20)


@pytest.mark.parametrize("fmt", COMFY)
def test_a_comfy_file_holds_comfyuis_names_its_markers_and_the_tokenizer(converted, sources, fmt):
    (path,) = (converted[fmt] / "text_encoder").glob("*.safetensors")
    assert path.name == f"text_encoder_{fmt}.safetensors"
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        spiece = bytes(f.get_tensor("spiece_model").numpy())
        marker = json.loads(
            bytes(f.get_tensor("encoder.block.0.layer.0.SelfAttention.q.comfy_quant").numpy())
        )
    config = read_json(sources["pipeline"] / "text_encoder" / "config.json")
    expected = comfyui_state(
        config["vocab_size"], config["d_model"], config["d_ff"], config["num_heads"], config["d_kv"], 2
    )
    weights = {k for k in keys if k.endswith(".weight")}
    assert weights == set(expected)  # every tensor ComfyUI's module has, and no other
    assert keys - weights == {"spiece_model"} | {
        k
        for k in keys
        if k.rsplit(".", 1)[-1] in ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale")
    }
    assert spiece == (sources["pipeline"] / "tokenizer" / "spiece.model").read_bytes()
    assert tokenize(spiece) == tokenize(example_tokenizer(config["vocab_size"]))
    assert marker["format"]


def test_the_gguf_file_is_llama_cpps_t5encoder_and_comfyui_gguf_rebuilds_the_tokenizer(converted, sources):
    import gguf

    (path,) = (converted["gguf"] / "text_encoder").glob("*.gguf")
    reader = gguf.GGUFReader(path)
    config = read_json(sources["pipeline"] / "text_encoder" / "config.json")
    assert reader.fields["general.architecture"].contents() == "t5encoder"
    hparams = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("t5encoder.")}
    assert hparams["t5encoder.embedding_length"] == config["d_model"]
    assert hparams["t5encoder.block_count"] == config["num_layers"]
    assert hparams["t5encoder.attention.relative_buckets_count"] == 32
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["enc.blk.0.attn_rel_b.weight"] == "F32" and types["enc.blk.0.attn_norm.weight"] == "F32"
    assert types["enc.blk.1.ffn_down.weight"] == "Q8_0" and types["token_embd.weight"] == "BF16"
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == config["vocab_size"] and tokens[-1] == f"[PAD{config['vocab_size'] - 1}]"
    source = (sources["pipeline"] / "tokenizer" / "spiece.model").read_bytes()
    assert tokenize(comfyui_gguf_tokenizer(path)) == tokenize(source)


def test_the_single_file_converts_with_its_own_tokenizer_to_the_same_files(converted, sources, tmp_path):
    """Comfy-Org's single file carries its tokenizer (``spiece_model``): its ComfyUI file keeps it as it is, its
    GGUF file holds it as key-values, and both equal the pipeline's, whose weights are the same; a transformers-side
    output leaves it out, so that transformers' loaders (torchao's, which fails on a stray tensor) read it."""
    from transformers import UMT5EncoderModel

    run_cli("convert", sources["single"], tmp_path / "int8", "--format", "torchao_int8", check=True)
    with safe_open(tmp_path / "int8" / "model.safetensors", "pt") as f:
        assert "spiece_model" not in f.keys()
    UMT5EncoderModel.from_pretrained(tmp_path / "int8")
    for fmt in ("comfy_fp8", "gguf"):
        run_cli("convert", sources["single"], tmp_path / fmt, "--format", fmt, check=True)
        run_cli("verify", tmp_path / fmt, "--source", sources["single"], "--forward", check=True)
    with (
        safe_open(tmp_path / "comfy_fp8" / "umt5_comfy_fp8.safetensors", "pt") as single,
        safe_open(
            converted["comfy_fp8"] / "text_encoder" / "text_encoder_comfy_fp8.safetensors", "pt"
        ) as pipeline,
    ):
        assert set(single.keys()) == set(pipeline.keys())
        assert torch.equal(single.get_tensor("spiece_model"), pipeline.get_tensor("spiece_model"))
    assert tokenize(comfyui_gguf_tokenizer(tmp_path / "gguf" / "umt5.gguf")) == tokenize(
        comfyui_gguf_tokenizer(converted["gguf"] / "text_encoder" / "text_encoder.gguf")
    )
    config = read_json(tmp_path / "gguf" / "config.json")
    assert {k: config[k] for k in ("d_model", "d_ff", "num_layers", "num_heads", "d_kv", "vocab_size")} == {
        k: umt5_config(UMT5_EXAMPLES.presets["tiny"])[k]
        for k in ("d_model", "d_ff", "num_layers", "num_heads", "d_kv", "vocab_size")
    }


def test_verify_finds_a_tokenizer_changed_since_the_conversion(converted, sources, tmp_path):
    """The tokenizer a file holds is checked against the source's: a GGUF file's header (its key-values, the
    tokenizer's among them) must be the plan's byte for byte, a ComfyUI file's ``spiece_model`` tensor the
    source's bytes. One piece renamed in the pipeline's tokenizer/ fails both, naming what differs."""
    import shutil

    from quantize.read.spiece import read_spiece, write_spiece

    source = Path(shutil.copytree(sources["pipeline"], tmp_path / "pipeline", symlinks=True))
    spiece = source / "tokenizer" / "spiece.model"
    for fmt in ("gguf", "comfy_fp8"):
        run_cli("verify", converted[fmt], "--source", source, check=True)
    pieces = [(p.piece, p.score, p.type) for p in read_spiece(spiece).pieces]
    pieces[5] = ("▁renamed", pieces[5][1], pieces[5][2])
    spiece.write_bytes(write_spiece(pieces))
    gguf = run_cli("verify", converted["gguf"], "--source", source)
    assert gguf.returncode == 1 and "key-value 'tokenizer.ggml.tokens' is not the plan's" in gguf.stdout
    comfy = run_cli("verify", converted["comfy_fp8"], "--source", source)
    assert comfy.returncode == 1 and "spiece_model" in comfy.stdout, comfy.stdout


def test_a_missing_tokenizer_is_one_line_naming_where_it_was_looked_for(sources, tmp_path):
    bare = tmp_path / "text_encoder"
    bare.mkdir()
    for f in (sources["pipeline"] / "text_encoder").iterdir():
        (bare / f.name).symlink_to(f)
    for fmt in ("comfy_fp8", "gguf"):
        proc = run_cli("convert", bare, tmp_path / fmt, "--format", fmt)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert f"{bare}: umT5's tokenizer is missing" in line
        assert f"looked for {bare / 'spiece.model'}, {bare / '../tokenizer/spiece.model'}" in line
        assert not (tmp_path / fmt).exists()
    run_cli("convert", bare, tmp_path / "fp8", "--format", "fp8_channel", check=True)  # no tokenizer needed


def test_sensitivity_measures_the_encoder_and_proposes_a_recipe_verify_proves(sources, tmp_path):
    """`quantize sensitivity` runs the encoder streamed like a transformer: each Linear's output SQNR, a proposal
    reaching the target, which a conversion under it verifies."""
    proposal = tmp_path / "umt5-proposed.yaml"
    proc = run_cli(
        "sensitivity", sources["pipeline"], "--recipe", "umt5-comfy-fp8", "--min-forward-sqnr", "30",
        "--write-recipe", proposal, check=True,
    )  # fmt: skip
    assert "encoder.block.0.layer.1.DenseReluDense.wo" in proc.stdout and proposal.exists()
    run_cli("convert", sources["pipeline"], tmp_path / "o", "--recipe", proposal, check=True)
    reported = forward_sqnr(tmp_path / "o", sources["pipeline"])
    assert reported >= 30


@pytest.mark.parametrize("fmt", ["gguf", "comfy_fp8"])
def test_block_offload_runs_the_encoders_blocks_and_changes_nothing(converted, reference, fmt):
    """`enable_block_offload` finds the encoder's blocks (``encoder.block``) and streams them; the output is the
    resident model's, bit for bit."""
    from transformers import UMT5EncoderModel

    ids, _ = reference
    path = converted[fmt] / "text_encoder"
    want, got, offloader = resident_and_offloaded(UMT5EncoderModel, path, lambda m: last_hidden_state(m, ids))
    assert offloader.stats.block_copies == len(offloader.model.encoder.block)
    assert torch.equal(got, want)
