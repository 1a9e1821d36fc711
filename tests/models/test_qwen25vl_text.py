"""Qwen2.5-VL's text model alone (a diffusers HunyuanVideo 1.5 pipeline's text encoder): its layout, its namings and
every format it has, each read by its real reader.

The oracles:
- transformers' own `Qwen2_5_VLTextModel`: its parameters (the names the folder holds), its `from_pretrained` (the
  transformers-side formats) and its forward (the reference);
- ComfyUI's Qwen2.5-VL 7B, whose language model `tests/models/test_qwen25vl.py` holds Qwen2.5-VL's ComfyUI file to
  (``benchmarks/comfyui_encoders.py --family qwen25vl-text`` loads our files in the real ComfyUI and ComfyUI-GGUF);
- gguf-py's tensor map for llama.cpp's ``qwen2vl`` (`gguf.get_tensor_name_map`: what llama.cpp's converter names
  each tensor, and what ComfyUI-GGUF's ``LLAMA_SD_MAP`` maps back) and its reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.formats import FORMAT_INFO
from quantize.models import get_family, name_table
from quantize.models.examples.qwen25vl import QWEN25VL_EXAMPLES
from quantize.models.examples.qwen25vl_text import QWEN25VL_TEXT_EXAMPLES
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, last_hidden_state, resident_and_offloaded
from tests.helpers.verify import forward_sqnr

TEXT = get_family("qwen25vl-text")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY, "gguf"]
FOUR_BIT = ("nf4", "comfy_nvfp4")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("qwen25vl-text") / "pipeline"
    run_cli("example", root, "--family", "qwen25vl-text", check=True)
    return root


@pytest.fixture(scope="module")
def reference(source):
    from transformers import Qwen2_5_VLTextModel

    model = Qwen2_5_VLTextModel.from_pretrained(source / "text_encoder", dtype=torch.float32).eval()
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


def test_the_example_is_transformers_own_class_and_comfyuis_language_model():
    """The folder holds `Qwen2_5_VLTextModel`'s own parameters, by name and shape; in ComfyUI's names they are the
    language model of Qwen2.5-VL's ComfyUI file, shape for shape."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    (model,) = QWEN25VL_TEXT_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**fields))
    assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == dict(model.tensors)
    (single,) = QWEN25VL_EXAMPLES.models("tiny", "single")
    language_model = {n: shape for n, shape in single.tensors if n.startswith("model.")}
    assert {TEXT.native_name(n): shape for n, shape in model.tensors} == language_model


def test_the_gguf_names_are_llama_cpps_qwen2vl_names():
    import gguf

    (model,) = QWEN25VL_TEXT_EXAMPLES.models("tiny", "pipeline")
    names = [n for n, _ in model.tensors]
    expected = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, model.config["num_hidden_layers"])
    rename = name_table(TEXT, "gguf", FORMAT_INFO["gguf"], "here").renamer(names, "here")
    assert {n: rename(n) for n in names} == {
        n: expected.get_name(n, try_suffixes=(".weight", ".bias")) for n in names
    }


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory) -> dict[str, Path]:
    return convert_each(source, tmp_path_factory.mktemp("qwen25vl-text-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, source, reference, fmt
):
    from transformers import Qwen2_5_VLTextModel

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], source)
    model = load_quantized(Qwen2_5_VLTextModel, converted[fmt] / "text_encoder", dtype=torch.float32)
    ids, ref = reference
    floor = 12 if fmt in FOUR_BIT else 22
    assert reported > floor and sqnr(ref, last_hidden_state(model, ids)) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    from transformers import Qwen2_5_VLTextModel

    path = converted[fmt] / "text_encoder"
    model = Qwen2_5_VLTextModel.from_pretrained(path, dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert sqnr(ref, last_hidden_state(model, ids)) > (12 if fmt == "nf4" else 18)


@pytest.mark.parametrize("fmt", COMFY)
def test_a_comfy_file_holds_comfyuis_names_and_its_markers(converted, source, fmt):
    (path,) = (converted[fmt] / "text_encoder").glob("*.safetensors")
    with safe_open(path, "pt") as f:
        keys = set(f.keys())
        marker = json.loads(bytes(f.get_tensor("model.layers.1.mlp.down_proj.comfy_quant").numpy()))
        bias = f.get_tensor("model.layers.0.self_attn.k_proj.bias")
    parts = ("comfy_quant", "weight_scale", "weight_scale_2", "input_scale")
    (model,) = QWEN25VL_TEXT_EXAMPLES.models("tiny", "pipeline")
    assert {k for k in keys if k.rsplit(".", 1)[-1] not in parts} == {f"model.{n}" for n, _ in model.tensors}
    assert marker["format"] and bias.dtype == torch.bfloat16  # kept: ComfyUI tells the 7B by this bias


def test_the_gguf_file_is_llama_cpps_qwen2vl_with_its_hyperparameters(converted, source):
    """What llama.cpp's converter writes for a Qwen2.5-VL text model (Qwen2VLModel): the architecture, its
    hyperparameters from config.json (the multimodal rope's sections padded to four), the names, norms in F32."""
    import gguf

    (path,) = (converted["gguf"] / "text_encoder").glob("*.gguf")
    reader = gguf.GGUFReader(path)
    config = read_json(source / "text_encoder" / "config.json")
    assert reader.fields["general.architecture"].contents() == "qwen2vl"
    hparams = {
        k[len("qwen2vl.") :]: reader.fields[k].contents() for k in reader.fields if k.startswith("qwen2vl.")
    }
    assert hparams == {
        "context_length": config["max_position_embeddings"],
        "embedding_length": config["hidden_size"],
        "block_count": config["num_hidden_layers"],
        "feed_forward_length": config["intermediate_size"],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": config["num_key_value_heads"],
        "rope.freq_base": config["rope_theta"],
        "attention.layer_norm_rms_epsilon": pytest.approx(config["rms_norm_eps"]),
        "rope.dimension_sections": [*config["rope_scaling"]["mrope_section"], 0],
    }
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_q.bias"] == "F32"
    assert types["blk.1.ffn_down.weight"] == "Q8_0" and types["token_embd.weight"] == "BF16"
    assert "output.weight" not in types and not any(k.startswith("tokenizer.") for k in reader.fields)


def test_block_offload_streams_the_layers_and_changes_nothing(converted, reference):
    from transformers import Qwen2_5_VLTextModel

    path = converted["gguf"] / "text_encoder"
    ids, _ = reference
    want, got, offloader = resident_and_offloaded(
        Qwen2_5_VLTextModel, path, lambda m: last_hidden_state(m, ids)
    )
    assert offloader.stats.block_copies == len(offloader.model.layers)
    assert torch.equal(got, want)
