"""Qwen2.5-VL (Kandinsky 5's and HunyuanVideo 1.5's text encoder): its layouts, its namings and every format it has,
each read by its real reader.

The oracles:
- transformers' own `Qwen2_5_VLForConditionalGeneration`: its loader's renaming of the stored names
  (`CLASS_PREFIXES`), its `from_pretrained` (the transformers-side formats) and its forward (the reference);
- ComfyUI's Qwen2.5-VL 7B (``comfy/text_encoders/llama.py`` `Qwen25_7BVLI`, its tower ``qwen_vl.py``), whose state
  dict `comfyui_state` spells from its source (``benchmarks/comfyui_encoders.py --family qwen25vl`` loads our files
  in the real one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.models import family_of, get_family
from quantize.models.examples.qwen25vl import QWEN25VL_EXAMPLES, qwen25vl_config
from quantize.read.detect import detect_layouts
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, resident_and_offloaded
from tests.helpers.encoders import language_model_hidden_state as last_hidden_state
from tests.helpers.recipes import listed_recipes
from tests.helpers.verify import forward_sqnr

QWEN = get_family("qwen25vl")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY]
FOUR_BIT = ("nf4", "comfy_nvfp4")


def comfyui_state(s) -> dict[str, tuple[int, ...]]:
    """name -> shape of ComfyUI's Qwen2.5-VL of shape `s` (a `Qwen25VLShape`), read off its source: ``model.`` as
    `Llama2_` (embed_tokens; per layer q, k, v with biases, o without, the gated MLP, two RMSNorms; the final norm)
    and ``visual.`` as `Qwen2VLVisionTransformer` (the Conv3d patch embedding without bias; per block two RMSNorms,
    the fused qkv and proj, the gated MLP, all with biases; the merger's RMSNorm and two Linears). ComfyUI has no
    output head (it ignores a file's ``lm_head``)."""
    h, w, q, kv = s.hidden, s.vision_width, s.heads * s.head_dim, s.kv_heads * s.head_dim
    state = {"model.embed_tokens.weight": (s.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(s.layers):
        p = f"model.layers.{i}.self_attn"
        state |= {f"{p}.q_proj.weight": (q, h), f"{p}.q_proj.bias": (q,), f"{p}.o_proj.weight": (h, q)}
        state |= {
            f"{p}.{m}_proj.{x}": (kv, h) if x == "weight" else (kv,) for m in "kv" for x in ("weight", "bias")
        }
        p = f"model.layers.{i}"
        state |= {f"{p}.mlp.{m}_proj.weight": (s.intermediate, h) for m in ("gate", "up")}
        state |= {f"{p}.mlp.down_proj.weight": (h, s.intermediate)}
        state |= {f"{p}.{n}.weight": (h,) for n in ("input_layernorm", "post_attention_layernorm")}
    state["visual.patch_embed.proj.weight"] = (w, 3, s.temporal_patch, s.patch, s.patch)
    for i in range(s.vision_depth):
        p = f"visual.blocks.{i}"
        state |= {f"{p}.norm1.weight": (w,), f"{p}.norm2.weight": (w,)}
        state |= {f"{p}.attn.qkv.weight": (3 * w, w), f"{p}.attn.qkv.bias": (3 * w,)}
        state |= {f"{p}.attn.proj.weight": (w, w), f"{p}.attn.proj.bias": (w,)}
        for m in ("gate", "up"):
            state |= {
                f"{p}.mlp.{m}_proj.weight": (s.vision_intermediate, w),
                f"{p}.mlp.{m}_proj.bias": (s.vision_intermediate,),
            }
        state |= {f"{p}.mlp.down_proj.weight": (w, s.vision_intermediate), f"{p}.mlp.down_proj.bias": (w,)}
    merged = w * s.merge**2
    state |= {"visual.merger.ln_q.weight": (w,), "visual.merger.mlp.0.weight": (merged, merged)}
    state |= {"visual.merger.mlp.0.bias": (merged,), "visual.merger.mlp.2.weight": (h, merged)}
    state["visual.merger.mlp.2.bias"] = (h,)
    return state


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen25vl")
    for layout in QWEN25VL_EXAMPLES.layouts:
        run_cli("example", root / layout, "--family", "qwen25vl", "--layout", layout, check=True)
    return {layout: root / layout for layout in QWEN25VL_EXAMPLES.layouts}


@pytest.fixture(scope="module")
def reference(sources):
    from transformers import Qwen2_5_VLForConditionalGeneration

    path = sources["pipeline"] / "text_encoder"
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


def test_the_class_holds_the_stored_names_where_transformers_loader_puts_them():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    (model,) = QWEN25VL_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**fields))
    transforms = get_model_conversion_mapping(built)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    own = built.state_dict()
    stored = [n for n, _ in model.tensors]
    theirs = {n: rename_source_key(n, renamings, converters, built.base_model_prefix, own)[0] for n in stored}
    assert theirs == QWEN.parameter_names(stored)
    assert {k: tuple(v.shape) for k, v in own.items()} == {theirs[n]: shape for n, shape in model.tensors}
    assert QWEN.parameter_names(theirs.values()) == {v: v for v in theirs.values()}  # a class-named output's


def test_comfyuis_names_are_its_qwen25_7bvli_module_and_the_stored_ones():
    for preset in ("tiny", "comfyui"):
        (model,) = QWEN25VL_EXAMPLES.models(preset, "single")
        assert {n: s for n, s in model.tensors if n != "lm_head.weight"} == comfyui_state(
            QWEN25VL_EXAMPLES.presets[preset]
        )
        assert all(QWEN.native_name(n) == n for n, _ in model.tensors)


def test_family_by_class_and_by_names_and_the_language_model_alone_is_the_text_models():
    (single,) = QWEN25VL_EXAMPLES.models("tiny", "single")
    names = [n for n, _ in single.tensors]
    assert (
        family_of(CLASS := "Qwen2_5_VLForConditionalGeneration", []) is QWEN
        and family_of(None, names) is QWEN
    )
    # no tower: Qwen2.5-VL's text model (`Qwen2_5_VLTextModel`), in ComfyUI's names
    assert family_of(None, [n for n in names if not n.startswith("visual.")]) is get_family("qwen25vl-text")
    assert QWEN.diffusers_class == CLASS


def test_every_layout_is_detected_and_finds_its_recipes(sources):
    (pipeline,) = detect_layouts(sources["pipeline"])
    (bare,) = detect_layouts(sources["pipeline"] / "text_encoder")
    (single,) = detect_layouts(sources["single"])
    assert (pipeline.name, pipeline.encoder, bare.name, single.name) == (
        "qwen25vl", True, "qwen25vl", "qwen25vl-single",
    )  # fmt: skip
    for layout, where in (("qwen25vl", sources["pipeline"]), ("qwen25vl-single", sources["single"])):
        recipes = listed_recipes(where)
        # its own, each the default of its format (Gemma 3's single-file recipes plan on it too: the same
        # ComfyUI layer names)
        assert {f"{r}.yaml" for r in QWEN.default_recipes[layout].values()} <= set(recipes)
        listed = run_cli("recipes", "--for", where, check=True).stdout
        assert all(f"--format {fmt}" in listed for fmt in QWEN.default_recipes[layout])


def test_gguf_is_refused_at_plan_time_naming_why(sources, tmp_path):
    proc = run_cli("convert", sources["pipeline"], tmp_path / "out", "--format", "gguf")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "Qwen2.5-VL has no GGUF architecture" in line and "mmproj" in line
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("qwen25vl-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, sources, reference, fmt
):
    from transformers import Qwen2_5_VLForConditionalGeneration

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], sources["pipeline"])
    path = converted[fmt] / "text_encoder"
    model = load_quantized(Qwen2_5_VLForConditionalGeneration, path, dtype=torch.float32)
    ids, ref = reference
    floor = 12 if fmt in FOUR_BIT else 22
    assert reported > floor and sqnr(ref, last_hidden_state(model, ids)) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    from transformers import Qwen2_5_VLForConditionalGeneration

    path = converted[fmt] / "text_encoder"
    with safe_open(next(path.glob("*.safetensors")), "pt") as f:
        assert all(k.startswith(("model.language_model.", "model.visual.", "lm_head.")) for k in f.keys())
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert sqnr(ref, last_hidden_state(model, ids)) > (12 if fmt == "nf4" else 18)


@pytest.mark.parametrize("fmt", COMFY)
def test_a_comfy_file_holds_comfyuis_names_and_its_markers(converted, fmt):
    (path,) = (converted[fmt] / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        marker = json.loads(bytes(f.get_tensor("model.layers.1.mlp.down_proj.comfy_quant").numpy()))
        bias = f.get_tensor("model.layers.0.self_attn.k_proj.bias")
    parts = ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale")
    expected = set(comfyui_state(QWEN25VL_EXAMPLES.presets["tiny"])) | {"lm_head.weight"}
    assert {k for k in keys if k.rsplit(".", 1)[-1] not in parts} == expected
    assert marker["format"] and bias.dtype == torch.bfloat16  # kept: ComfyUI tells the 7B by this bias
    assert not any(k.startswith("visual.") and k.endswith("comfy_quant") for k in keys)


def test_the_single_file_converts_with_a_config_read_off_its_shapes(converted, sources, tmp_path):
    run_cli("convert", sources["single"], tmp_path / "fp8", "--format", "comfy_int8", check=True)
    run_cli("verify", tmp_path / "fp8", "--source", sources["single"], "--forward", check=True)
    derived = read_json(tmp_path / "fp8" / "config.json")
    given = qwen25vl_config(QWEN25VL_EXAMPLES.presets["tiny"])
    assert {k: v for k, v in derived.items() if k != "quantization_config"} == {
        k: v for k, v in given.items() if k != "dtype"
    }


def test_block_offload_streams_the_language_models_layers_and_changes_nothing(converted, reference):
    from transformers import Qwen2_5_VLForConditionalGeneration

    path = converted["comfy_fp8"] / "text_encoder"
    ids, _ = reference
    want, got, offloader = resident_and_offloaded(
        Qwen2_5_VLForConditionalGeneration, path, lambda m: last_hidden_state(m, ids)
    )
    # the language model's layers, and at most the prefetch of the next list's first block (the tower's)
    layers = len(offloader.model.model.language_model.layers)
    assert layers <= offloader.stats.block_copies <= layers + 1
    assert torch.equal(got, want)
