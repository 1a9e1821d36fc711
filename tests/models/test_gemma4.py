"""Gemma 4 12B unified (LTX-2.5's text encoder): its layouts, its three namings, its tokenizer and every format it has,
each read by its real reader, and its bad inputs refused.

The oracles:
- transformers' own `Gemma4UnifiedForConditionalGeneration`: its loader's renaming of the stored names (what the
  class holds them as, `CLASS_PREFIXES`), its `save_pretrained` (the names a checkpoint stores), its
  `from_pretrained` (the loader of the transformers-side formats) and its forward (the reference of every output);
- ComfyUI's Gemma 4 12B (``comfy/text_encoders/gemma4.py`` `Gemma4_12B`: `Gemma4Transformer` as ``model.``, the
  encoder-free `Gemma4UnifiedVisionEmbedder` as ``vision_model.``, two `Gemma4RMSNormProjector`), whose state dict
  `comfyui_state` spells from its source, and the rule ``comfy/sd.py`` `detect_te_model` tells it by (ComfyUI is
  not on PyPI; ``benchmarks/comfyui_encoders.py --family gemma4`` loads our files in the real one);
- tokenizers, which tokenizes with the ``tokenizer_json`` each ComfyUI file carries, as ComfyUI's `_Gemma4Tokenizer`
  does (`Tokenizer.from_str`, no special tokens added).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantize.models import family_of, get_family
from quantize.models.examples.gemma3 import GEMMA3_EXAMPLES
from quantize.models.examples.gemma4 import GEMMA4_EXAMPLES, gemma4_config
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, resident_and_offloaded
from tests.helpers.encoders import language_model_hidden_state as last_hidden_state
from tests.helpers.verify import forward_sqnr

GEMMA4, GEMMA3 = get_family("gemma4"), get_family("gemma3")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_nvfp4"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY]
FOUR_BIT = ("nf4", "comfy_nvfp4")
PROMPT = "a cat on a mat"


def comfyui_state(s) -> dict[str, tuple[int, ...]]:
    """name -> shape of ComfyUI's `Gemma4_12B` of `s` (a `Gemma4Shape`), read off ``comfy/text_encoders/gemma4.py``:
    ``model.`` as `Gemma4Transformer` (embed_tokens; per layer `TransformerBlockGemma4`: q, k, o and, unless a
    global layer's value is its key (`attention_k_eq_v`), v without bias, q_norm and k_norm of the layer's head
    size, the gated MLP, four RMSNorms and the ``layer_scalar`` buffer; the final norm),
    `Gemma4UnifiedVisionEmbedder` as ``vision_model.`` (three LayerNorms, the patch Linear, the position table)
    and the image and audio `Gemma4RMSNormProjector`s."""
    h, state = (
        s.hidden,
        {"model.embed_tokens.weight": (s.vocab_size, s.hidden), "model.norm.weight": (s.hidden,)},
    )
    for i in range(s.layers):
        p, wide = f"model.layers.{i}", (i + 1) % 6 == 0 or i == s.layers - 1  # sliding_attention[i % 6]
        head, kv = (s.global_head_dim, s.global_kv_heads) if wide else (s.head_dim, s.kv_heads)
        state |= {
            f"{p}.self_attn.q_proj.weight": (s.heads * head, h),
            f"{p}.self_attn.o_proj.weight": (h, s.heads * head),
        }
        state |= {f"{p}.self_attn.k_proj.weight": (kv * head, h)}
        if not (wide and s.k_eq_v):
            state[f"{p}.self_attn.v_proj.weight"] = (kv * head, h)
        state |= {f"{p}.self_attn.{m}_norm.weight": (head,) for m in "qk"}
        state |= {f"{p}.mlp.{m}_proj.weight": (s.intermediate, h) for m in ("gate", "up")}
        state[f"{p}.mlp.down_proj.weight"] = (h, s.intermediate)
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            state[f"{p}.{norm}_layernorm.weight"] = (h,)
        state[f"{p}.layer_scalar"] = (1,)
    w, patch_dim = s.vision_width, s.patch * s.patch * 3
    state |= {"vision_model.patch_ln1.weight": (patch_dim,), "vision_model.patch_ln1.bias": (patch_dim,)}
    state |= {"vision_model.patch_dense.weight": (w, patch_dim), "vision_model.patch_dense.bias": (w,)}
    state |= {f"vision_model.{m}.{x}": (w,) for m in ("patch_ln2", "pos_norm") for x in ("weight", "bias")}
    state["vision_model.pos_embedding"] = (s.posemb, 2, w)
    state["multi_modal_projector.embedding_projection.weight"] = (h, w)
    state["audio_projector.embedding_projection.weight"] = (h, s.audio)
    return state


def comfyui_tokens(data: bytes) -> list[int]:
    """What ComfyUI's Gemma 4 tokenizer (`_Gemma4Tokenizer`: `Tokenizer.from_str` of the file's tokenizer_json,
    encoded without special tokens) gives for `PROMPT`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(data.decode("utf-8")).encode(PROMPT, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma4")
    for layout in GEMMA4_EXAMPLES.layouts:
        run_cli("example", root / layout, "--family", "gemma4", "--layout", layout, check=True)
    return {layout: root / layout for layout in GEMMA4_EXAMPLES.layouts}


@pytest.fixture(scope="module")
def reference(sources):
    """transformers' Gemma4UnifiedForConditionalGeneration of the source (float32) and its last hidden state."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    path = sources["pipeline"] / "text_encoder"
    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(4, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


# -- names and detection --------------------------------------------------------------------------------------


def test_the_stored_names_are_transformers_own_and_the_class_holds_them_where_its_loader_puts_them():
    """The example's names are what transformers' `save_pretrained` writes of the class (the vision embedder as
    ``model.vision_embedder.``); under `CLASS_PREFIXES` each is the parameter transformers' own loader renames it
    to, and every tensor of the class's state but its tied head is one of them."""
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    (model,) = GEMMA4_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = Gemma4UnifiedForConditionalGeneration(Gemma4UnifiedConfig(**fields))
    transforms = get_model_conversion_mapping(built)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    own = built.state_dict()
    theirs = {
        n: rename_source_key(n, renamings, converters, built.base_model_prefix, own)[0]
        for n, _ in model.tensors
    }
    assert GEMMA4.parameter_names(theirs) == theirs  # each is the class's
    assert GEMMA4.parameter_names([n for n, _ in model.tensors]) == theirs
    assert {k: tuple(v.shape) for k, v in own.items() if k != "lm_head.weight"} == {
        theirs[n]: shape for n, shape in model.tensors
    }
    assert built.config.text_config.layer_types == ["sliding_attention", "full_attention"]


def test_comfyuis_names_are_its_gemma4_12b_module_which_its_detection_picks():
    for preset in ("tiny", "comfyui"):
        (model,) = GEMMA4_EXAMPLES.models(preset, "single")
        assert dict(model.tensors) == comfyui_state(GEMMA4_EXAMPLES.presets[preset])
    (model,) = GEMMA4_EXAMPLES.models("comfyui", "single")
    sd = dict(model.tensors)  # comfy/sd.py detect_te_model: GEMMA_4_12B, not GEMMA_3_12B
    assert (
        "model.layers.0.post_feedforward_layernorm.weight" in sd
        and "model.layers.59.self_attn.q_norm.weight" not in sd
    )
    assert (
        "model.layers.47.self_attn.q_norm.weight" in sd and "model.layers.5.self_attn.v_proj.weight" not in sd
    )


def test_detection_keeps_gemma3_and_gemma4_apart_in_every_naming():
    """Gemma 4's layers are Gemma 3's but for their scalar: each family's example, in each naming, is its own."""
    for examples, family in ((GEMMA4_EXAMPLES, GEMMA4), (GEMMA3_EXAMPLES, GEMMA3)):
        (pipeline,) = examples.models("tiny", "pipeline")
        (single,) = examples.models("tiny", "single")
        stored = [n for n, _ in pipeline.tensors]
        for names in (stored, [family.class_name(n) for n in stored], [n for n, _ in single.tensors]):
            assert family_of(None, names) is family
    (single,) = GEMMA4_EXAMPLES.models("tiny", "single")
    assert family_of("Gemma3ForConditionalGeneration", [n for n, _ in single.tensors]) is None


def test_gguf_is_refused_at_plan_time_naming_the_reader(sources, tmp_path):
    """ComfyUI-GGUF's CLIP loader has no Gemma 4 (its TXT_ARCH_LIST): one line, exit 2, nothing written."""
    proc = run_cli("convert", sources["pipeline"], tmp_path / "out", "--format", "gguf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "Gemma 4 has no GGUF architecture" in line and "TXT_ARCH_LIST" in line
    assert not (tmp_path / "out").exists()


# -- every format, read by its reader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("gemma4-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, sources, reference, fmt
):
    """`verify --forward` runs the language model layer by layer (its layer scalars filled from the checkpoint) on
    random token ids against the source's; our loader builds the class from the output (its head tied to the
    embedding again) and its last hidden state is as close to transformers' own on the source as the weights
    allow."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], sources["pipeline"])
    model = load_quantized(
        Gemma4UnifiedForConditionalGeneration, converted[fmt] / "text_encoder", dtype=torch.float32
    )
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    ids, ref = reference
    floor = 10 if fmt in FOUR_BIT else 20
    assert reported > floor and sqnr(ref, last_hidden_state(model, ids)) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    """The transformers-side outputs hold the class's own names (``model.embed_vision.``, the projection in its
    ``multimodal_embedder.``), which transformers' quantizers match their modules by: its `from_pretrained` reads
    the quantization_config and runs them, its head tied."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    path = converted[fmt] / "text_encoder"
    with safe_open(next(path.glob("*.safetensors")), "pt") as f:
        keys = set(f.keys())
    assert all(
        k.startswith(("model.language_model.", "model.embed_vision.", "model.embed_audio.")) for k in keys
    )
    assert "model.embed_vision.multimodal_embedder.embedding_projection.weight" in keys
    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).eval()
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    ids, ref = reference
    assert sqnr(ref, last_hidden_state(model, ids)) > (10 if fmt == "nf4" else 18)


@pytest.mark.parametrize("fmt", COMFY)
def test_a_comfy_file_holds_comfyuis_names_its_markers_and_the_tokenizer(converted, sources, fmt):
    (path,) = (converted[fmt] / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        tokenizer = bytes(f.get_tensor("tokenizer_json").numpy())
        marker = json.loads(bytes(f.get_tensor("model.layers.1.mlp.down_proj.comfy_quant").numpy()))
        assert (
            f.get_tensor("model.layers.1.layer_scalar").dtype == torch.bfloat16
        )  # carried, as ComfyUI loads it
    parts = ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale")
    assert {k for k in keys if k.rsplit(".", 1)[-1] not in parts} == set(
        comfyui_state(GEMMA4_EXAMPLES.presets["tiny"])
    ) | {"tokenizer_json"}
    assert tokenizer == (sources["pipeline"] / "tokenizer" / "tokenizer.json").read_bytes()
    ids = comfyui_tokens(tokenizer)
    assert ids and all(4 <= i < 512 for i in ids)
    assert marker["format"] and not any(
        k.startswith("vision_model.") and k.endswith("comfy_quant") for k in keys
    )


@pytest.mark.parametrize("fmt", ["comfy_int8", "torchao_int8"])
def test_the_single_file_converts_with_its_own_tokenizer_and_a_config_read_off_its_shapes(
    sources, tmp_path, fmt
):
    """Comfy-Org's single file (ComfyUI's names): a ComfyUI format keeps its tokenizer_json; a transformers-side
    format is written in the class's names with the config read off the shapes (each layer's type from its
    q_norm, a global layer's value its key from its missing v_proj), which transformers' `from_pretrained` runs
    as our loader does."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    from loaders import load_quantized

    out = tmp_path / "out"
    run_cli("convert", sources["single"], out, "--format", fmt, check=True)
    reported = forward_sqnr(out, sources["single"])
    assert reported > 20
    (path,) = out.glob("*.safetensors")
    with safe_open(path, "pt") as f:
        assert ("tokenizer_json" in f.keys()) == fmt.startswith("comfy")
    if fmt.startswith("comfy"):
        return
    derived, given = read_json(out / "config.json"), gemma4_config(GEMMA4_EXAMPLES.presets["tiny"])
    for part in ("text_config", "vision_config", "audio_config"):
        assert {k: v for k, v in derived[part].items() if k in given[part]} == given[part], part
    theirs = Gemma4UnifiedForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_quantized(Gemma4UnifiedForConditionalGeneration, out, dtype=torch.float32)
    ids = torch.randint(4, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    assert sqnr(last_hidden_state(ours, ids), last_hidden_state(theirs, ids)) > 30


def test_block_offload_streams_the_language_models_layers_and_changes_nothing(converted, reference):
    """Our loader's block offload copies each language-model layer (its layer scalar with it) in turn, and the
    output is the resident model's."""
    from transformers import Gemma4UnifiedForConditionalGeneration

    ids, _ = reference
    want, got, offloader = resident_and_offloaded(
        Gemma4UnifiedForConditionalGeneration,
        converted["comfy_fp8"] / "text_encoder",
        lambda m: last_hidden_state(m, ids),
    )
    assert offloader.stats.block_copies == len(offloader.model.model.language_model.layers)
    assert torch.equal(got, want)


# -- bad input: one line, exit 2, nothing written -----------------------------------------------------------------


def _refused(proc, out: Path, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert all(n in line for n in needles), line
    assert not out.exists()


def test_a_truncated_single_file_is_refused_naming_it(sources, tmp_path):
    src = tmp_path / "single"
    src.mkdir()
    (original,) = sources["single"].glob("*.safetensors")
    (src / original.name).write_bytes(original.read_bytes()[:-1000])
    _refused(
        run_cli("convert", src, tmp_path / "out", "--format", "comfy_fp8"),
        tmp_path / "out",
        original.name,
        "truncated",
    )


@pytest.mark.parametrize(
    ("layout", "missing"),
    [
        ("single", "model.layers.1.mlp.down_proj.weight"),
        ("pipeline", "model.language_model.layers.0.self_attn.v_proj.weight"),
        ("pipeline", "model.language_model.layers.1.layer_scalar"),
    ],
)
def test_a_missing_layer_tensor_is_refused_naming_it(sources, tmp_path, layout, missing):
    """A layer without one of its tensors (a file cut by hand) is named before anything is written, though its
    global layers lack a v_proj by design."""
    src = tmp_path / "src"
    folder = src / ("text_encoder" if layout == "pipeline" else "")
    folder.mkdir(parents=True)
    for f in sources[layout].rglob("*"):
        if f.is_file() and f.suffix != ".safetensors":
            (src / f.relative_to(sources[layout])).parent.mkdir(parents=True, exist_ok=True)
            (src / f.relative_to(sources[layout])).write_bytes(f.read_bytes())
    (original,) = (sources[layout] / ("text_encoder" if layout == "pipeline" else "")).glob("*.safetensors")
    tensors = load_file(original)
    del tensors[missing]
    save_file(tensors, folder / original.name)
    out = tmp_path / "out"
    _refused(
        run_cli("convert", src, out, "--format", "comfy_int8"),
        out,
        f"no tensor {missing!r}",
        "partial Gemma 4",
    )


def test_a_config_no_family_knows_is_one_line_naming_its_class(sources, tmp_path):
    bare = tmp_path / "text_encoder"
    bare.mkdir()
    for f in (sources["pipeline"] / "text_encoder").iterdir():
        if f.name != "config.json":
            (bare / f.name).symlink_to(f)
    config = read_json(sources["pipeline"] / "text_encoder" / "config.json")
    (bare / "config.json").write_text(json.dumps({**config, "architectures": ["Gemma5ForSomething"]}))
    out = tmp_path / "out"
    _refused(
        run_cli("convert", bare, out, "--format", "comfy_fp8"),
        out,
        f"{bare}: no known layout",
        "config.json names Gemma5ForSomething, which no family is",
    )


def test_a_missing_tokenizer_is_one_line_naming_where_it_was_looked_for(sources, tmp_path):
    bare = tmp_path / "text_encoder"
    bare.mkdir()
    for f in (sources["pipeline"] / "text_encoder").iterdir():
        (bare / f.name).symlink_to(f)
    out = tmp_path / "out"
    _refused(
        run_cli("convert", bare, out, "--format", "comfy_int8"),
        out,
        f"{bare}: Gemma 4's tokenizer is missing",
        f"looked for {bare / 'tokenizer.json'}, {bare / '../tokenizer/tokenizer.json'}",
    )
