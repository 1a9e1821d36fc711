"""Gemma 3 (LTX-2's text encoder): its layouts, its three namings, its tokenizer and every format it has, each read
by its real reader.

The oracles:
- transformers' own `Gemma3ForConditionalGeneration`: its loader's renaming of the stored names (what the class
  holds them as, `CLASS_PREFIXES`), its `from_pretrained` (the loader of the transformers-side formats) and its
  forward (the reference of every output);
- ComfyUI's Gemma 3 12B (``comfy/text_encoders/llama.py`` `Gemma3_12B`, its SigLIP tower ``comfy/clip_model.py``),
  whose state dict `comfyui_state` spells from its source (ComfyUI is not on PyPI;
  ``benchmarks/comfyui_encoders.py --family gemma3`` loads our files in the real one);
- sentencepiece, which tokenizes with the tokenizer each file carries, as ComfyUI's `Gemma3_12BTokenizer` does
  (bos added, no eos).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.models import family_of, get_family
from quantize.models.examples.gemma3 import GEMMA3_EXAMPLES, example_tokenizer, gemma3_config
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, resident_and_offloaded
from tests.helpers.encoders import language_model_hidden_state as last_hidden_state
from tests.helpers.verify import forward_sqnr
from tests.oracles.comfyui_gemma3 import comfyui_state

GEMMA3 = get_family("gemma3")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY]
PROMPTS = ["a cat on a mat", "  the 2 quick   foxes  ", "zebra yak"]
FOUR_BIT = ("nf4", "comfy_nvfp4")


def tokenize(spiece: bytes) -> list[list[int]]:
    """What ComfyUI's Gemma 3 tokenizer (`SPieceTokenizer`, bos added, no eos) gives for `PROMPTS`."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=spiece, add_bos=True, add_eos=False)
    return [sp.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma3")
    for layout in GEMMA3_EXAMPLES.layouts:
        run_cli("example", root / layout, "--family", "gemma3", "--layout", layout, check=True)
    return {layout: root / layout for layout in GEMMA3_EXAMPLES.layouts}


@pytest.fixture(scope="module")
def reference(sources):
    """transformers' Gemma3ForConditionalGeneration of the source (float32) and its last hidden state."""
    from transformers import Gemma3ForConditionalGeneration

    path = sources["pipeline"] / "text_encoder"
    model = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(4, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


# -- names and detection --------------------------------------------------------------------------------------


def test_the_class_holds_the_stored_names_where_transformers_loader_puts_them():
    """Each stored name of the example (google/gemma-3-12b-it's naming) is, under `CLASS_PREFIXES`, the parameter
    transformers' own loader renames it to, and every parameter of the class but its tied head is one of them."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    (model,) = GEMMA3_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = Gemma3ForConditionalGeneration(Gemma3Config(**fields))
    transforms = get_model_conversion_mapping(built)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    own = built.state_dict()
    theirs = {
        n: rename_source_key(n, renamings, converters, built.base_model_prefix, own)[0]
        for n, _ in model.tensors
    }
    assert theirs == GEMMA3.parameter_names(theirs)
    assert {k: tuple(v.shape) for k, v in own.items() if k != "lm_head.weight"} == {
        theirs[n]: shape for n, shape in model.tensors
    }


def test_comfyuis_names_are_its_gemma3_12b_module():
    for preset in ("tiny", "comfyui"):
        (model,) = GEMMA3_EXAMPLES.models(preset, "single")
        named = dict(model.tensors)
        assert named == comfyui_state(GEMMA3_EXAMPLES.presets[preset])
    (model,) = GEMMA3_EXAMPLES.models("tiny", "pipeline")
    assert all(GEMMA3.native_name(n) is not None for n, _ in model.tensors)


def test_a_transformers_side_output_has_its_names_and_a_qwen_like_model_is_not_gemma3():
    """The class's names (an output in transformers' own) are Gemma 3's too; a language model with biased q, k, v and
    no feed-forward norms (Qwen's) is not (the family contract holds each example to its class and names)."""
    (pipeline,) = GEMMA3_EXAMPLES.models("tiny", "pipeline")
    (single,) = GEMMA3_EXAMPLES.models("tiny", "single")
    stored = [n for n, _ in pipeline.tensors]
    assert GEMMA3.naming([GEMMA3.class_name(n) for n in stored]) == "diffusers"  # a transformers-side output
    qwen = [n for n, _ in single.tensors if "feedforward" not in n] + ["model.layers.0.self_attn.q_proj.bias"]
    assert family_of(None, qwen) is not GEMMA3


def test_gguf_is_refused_at_plan_time_naming_the_reader(sources, tmp_path):
    """ComfyUI-GGUF's CLIP loader has no Gemma 3 (its TXT_ARCH_LIST): one line, exit 2, nothing written."""
    proc = run_cli("convert", sources["pipeline"], tmp_path / "out", "--format", "gguf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "Gemma 3 has no GGUF architecture" in line and "TXT_ARCH_LIST" in line
    assert not (tmp_path / "out").exists()


# -- every format, read by its reader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("gemma3-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, sources, reference, fmt
):
    """`verify --forward` runs the language model layer by layer on random token ids against the source's; our
    loader builds Gemma3ForConditionalGeneration from the output (its head tied to the embedding again) and its
    last hidden state is as close to transformers' own on the source as the weights allow."""
    from transformers import Gemma3ForConditionalGeneration

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], sources["pipeline"])
    model = load_quantized(
        Gemma3ForConditionalGeneration, converted[fmt] / "text_encoder", dtype=torch.float32
    )
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    ids, ref = reference
    floor = 10 if fmt in FOUR_BIT else 22
    assert reported > floor and sqnr(ref, last_hidden_state(model, ids)) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    """The transformers-side outputs hold the class's own names (``model.language_model.``), which transformers'
    quantizers match their modules by: its `from_pretrained` reads the quantization_config and runs them."""
    from transformers import Gemma3ForConditionalGeneration

    path = converted[fmt] / "text_encoder"
    with safe_open(next(path.glob("*.safetensors")), "pt") as f:
        assert all(
            k.startswith(("model.language_model.", "model.vision_tower.", "model.multi_")) for k in f.keys()
        )
    model = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert sqnr(ref, last_hidden_state(model, ids)) > (12 if fmt == "nf4" else 18)


@pytest.mark.parametrize("fmt", COMFY)
def test_a_comfy_file_holds_comfyuis_names_its_markers_and_the_tokenizer(converted, sources, fmt):
    (path,) = (converted[fmt] / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        spiece = bytes(f.get_tensor("spiece_model").numpy())
        marker = json.loads(bytes(f.get_tensor("model.layers.1.mlp.down_proj.comfy_quant").numpy()))
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16  # ComfyUI's compute dtype
    expected = comfyui_state(GEMMA3_EXAMPLES.presets["tiny"])
    parts = ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale")
    assert {k for k in keys if k.rsplit(".", 1)[-1] not in parts} == set(expected) | {"spiece_model"}
    assert spiece == (sources["pipeline"] / "tokenizer" / "tokenizer.model").read_bytes()
    assert tokenize(spiece) == tokenize(example_tokenizer(512)) and tokenize(spiece)[0][0] == 2  # <bos>
    assert marker["format"] and not any(
        k.startswith("vision_model.") and k.endswith("comfy_quant") for k in keys
    )


def test_the_single_file_converts_with_its_own_tokenizer_and_a_config_read_off_its_shapes(
    converted, sources, tmp_path
):
    run_cli("convert", sources["single"], tmp_path / "fp8", "--format", "comfy_fp8", check=True)
    run_cli("verify", tmp_path / "fp8", "--source", sources["single"], "--forward", check=True)
    (single,) = (tmp_path / "fp8").glob("*.safetensors")
    (pipeline,) = (converted["comfy_fp8"] / "text_encoder").glob("*.safetensors")
    with safe_open(single, "pt") as s, safe_open(pipeline, "pt") as p:
        assert set(s.keys()) == set(p.keys())
        assert torch.equal(s.get_tensor("spiece_model"), p.get_tensor("spiece_model"))
    derived, given = (
        read_json(tmp_path / "fp8" / "config.json"),
        gemma3_config(GEMMA3_EXAMPLES.presets["tiny"]),
    )
    for part in ("text_config", "vision_config"):
        assert {k: v for k, v in derived[part].items() if k in given[part]} == given[part]
    assert (
        derived["mm_tokens_per_image"] == 256 != given["mm_tokens_per_image"]
    )  # the 12B's: the shapes hide it


def test_a_missing_tokenizer_is_one_line_naming_where_it_was_looked_for(sources, tmp_path):
    bare = tmp_path / "text_encoder"
    bare.mkdir()
    for f in (sources["pipeline"] / "text_encoder").iterdir():
        (bare / f.name).symlink_to(f)
    proc = run_cli("convert", bare, tmp_path / "out", "--format", "comfy_int8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{bare}: Gemma 3's tokenizer is missing" in line
    assert f"looked for {bare / 'tokenizer.model'}, {bare / '../tokenizer/tokenizer.model'}" in line
    assert not (tmp_path / "out").exists()


def test_block_offload_streams_the_language_models_layers_and_changes_nothing(converted, reference):
    from transformers import Gemma3ForConditionalGeneration

    path = converted["comfy_int8"] / "text_encoder"
    ids, _ = reference
    want, got, offloader = resident_and_offloaded(
        Gemma3ForConditionalGeneration, path, lambda m: last_hidden_state(m, ids)
    )
    # no image, no SigLIP
    assert offloader.stats.block_copies == len(offloader.model.model.language_model.layers)
    assert torch.equal(got, want)


def test_sensitivity_runs_the_language_model_and_its_proposal_verifies(sources, tmp_path):
    """`quantize sensitivity` fills the class through its own names (`Family.parameter_names`) and measures each
    Linear; a conversion under its proposal verifies at the target."""
    proposal = tmp_path / "gemma3-proposed.yaml"
    proc = run_cli(
        "sensitivity", sources["pipeline"], "--recipe", "gemma3-comfy-fp8", "--min-forward-sqnr", "30",
        "--write-recipe", proposal, check=True,
    )  # fmt: skip
    assert "language_model.model.layers.1.mlp.down_proj" in proc.stdout and proposal.exists()
    run_cli("convert", sources["pipeline"], tmp_path / "o", "--recipe", proposal, check=True)
    reported = forward_sqnr(tmp_path / "o", sources["pipeline"])
    assert reported >= 30


@pytest.mark.parametrize("fmt", ["torchao_int8", "nf4"])
def test_the_single_file_converts_to_transformers_formats_in_the_class_names(sources, tmp_path, fmt):
    """Comfy-Org's single file holds ComfyUI's names: a transformers-side format is written in the names the class
    holds, with the config read off its shapes; `verify --forward` holds it to the source, and transformers'
    `from_pretrained` loads it (without the file's tokenizer tensor) and computes what our
    loader computes of it."""
    from transformers import Gemma3ForConditionalGeneration

    from loaders import load_quantized

    out = tmp_path / "out"
    run_cli("convert", sources["single"], out, "--format", fmt, check=True)
    reported = forward_sqnr(out, sources["single"])
    with safe_open(out / "model.safetensors", "pt") as f:
        prefixes = ("model.language_model.", "model.vision_tower.", "model.multi_modal_projector.")
        assert all(k.startswith(prefixes) for k in f.keys())
    theirs = Gemma3ForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_quantized(Gemma3ForConditionalGeneration, out, dtype=torch.float32)
    ids = torch.randint(4, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    assert reported > (12 if fmt == "nf4" else 22)
    assert sqnr(last_hidden_state(ours, ids), last_hidden_state(theirs, ids)) > 30


def test_an_encoder_config_no_family_knows_is_one_line_naming_its_class(sources, tmp_path):
    bare = tmp_path / "text_encoder"
    bare.mkdir()
    for f in (sources["pipeline"] / "text_encoder").iterdir():
        if f.name != "config.json":
            (bare / f.name).symlink_to(f)
    config = read_json(sources["pipeline"] / "text_encoder" / "config.json")
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["Gemma9ForSomething"]}))
    proc = run_cli("convert", bare, tmp_path / "out", "--format", "comfy_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert (
        f"{bare}: no known layout" in line
        and "config.json names Gemma9ForSomething, which no family is" in line
    )
    assert not (tmp_path / "out").exists()
