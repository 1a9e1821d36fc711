"""T5's encoder (HunyuanVideo 1.5's byT5, a diffusers pipeline's ``text_encoder_2/``): its layouts, its formats,
each read by its real reader, and the formats no runtime reads, refused.

The oracles:
- transformers' own `T5EncoderModel`: its parameters, its `from_pretrained` (the transformers-side formats) and its
  forward (the reference);
- gguf-py's tensor map for llama.cpp's ``t5encoder`` and its reader (``benchmarks/comfyui_encoders.py --family t5``
  loads our GGUF file in the real ComfyUI-GGUF, beside a Qwen2.5-VL file, as HunyuanVideo 1.5's pair).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantize.models import get_family
from quantize.models.examples.t5 import T5_EXAMPLES, t5_config
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, last_hidden_state
from tests.helpers.verify import forward_sqnr

T5 = get_family("t5")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
FORMATS = [*TRANSFORMERS_SIDE, "gguf"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("t5")
    for layout in T5_EXAMPLES.layouts:
        run_cli("example", root / layout, "--family", "t5", "--layout", layout, check=True)
    return {layout: root / layout for layout in T5_EXAMPLES.layouts}


@pytest.fixture(scope="module")
def reference(sources):
    from transformers import T5EncoderModel

    model = T5EncoderModel.from_pretrained(sources["pipeline"] / "text_encoder_2", dtype=torch.float32).eval()
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


def test_the_example_is_transformers_own_class_with_one_relative_attention_bias():
    from transformers import T5Config, T5EncoderModel

    (model,) = T5_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = T5EncoderModel(T5Config(**fields))
    own = {k: tuple(v.shape) for k, v in built.state_dict().items() if k != "encoder.embed_tokens.weight"}
    assert own == dict(model.tensors)
    assert sum("relative_attention_bias" in n for n, _ in model.tensors) == 1


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_int8"])
def test_comfyuis_formats_are_refused_at_plan_time_saying_why(sources, tmp_path, fmt):
    # by --format, and by a recipe of that format that matches its tensors (umT5's, given the bare folder)
    bare = sources["pipeline"] / "text_encoder_2"
    for source, args in (
        (sources["single"], ("--format", fmt)),
        (bare, ("--recipe", f"umt5-{fmt.replace('_', '-')}")),
    ):
        proc = run_cli("convert", source, tmp_path / "out", *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "no runtime reads T5 encoder's" in line and "hunyuan_video_15" in line
        assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("t5-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_our_loader_runs_it(
    converted, sources, reference, fmt
):
    from transformers import T5EncoderModel

    from loaders import load_quantized

    reported = forward_sqnr(converted[fmt], sources["pipeline"])
    model = load_quantized(T5EncoderModel, converted[fmt] / "text_encoder_2", dtype=torch.float32)
    ids, ref = reference
    floor = 14 if fmt == "nf4" else 24
    assert reported > floor and sqnr(ref, last_hidden_state(model, ids)) > floor


@pytest.mark.parametrize("fmt", TRANSFORMERS_SIDE)
def test_transformers_from_pretrained_loads_and_runs_the_output(converted, reference, fmt):
    from transformers import T5EncoderModel

    model = T5EncoderModel.from_pretrained(converted[fmt] / "text_encoder_2", dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert sqnr(ref, last_hidden_state(model, ids)) > (14 if fmt == "nf4" else 20)


def test_the_gguf_file_is_llama_cpps_t5encoder_without_a_tokenizer(converted, sources):
    import gguf

    (path,) = (converted["gguf"] / "text_encoder_2").glob("*.gguf")
    reader = gguf.GGUFReader(path)
    config = read_json(sources["pipeline"] / "text_encoder_2" / "config.json")
    assert reader.fields["general.architecture"].contents() == "t5encoder"
    assert reader.fields["t5encoder.block_count"].contents() == config["num_layers"]
    assert not any(k.startswith("tokenizer.") for k in reader.fields)  # ComfyUI bundles byT5's
    names = {t.name: t.tensor_type.name for t in reader.tensors}
    expected = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, config["num_layers"])
    (model,) = T5_EXAMPLES.models("tiny", "pipeline")
    assert set(names) == {expected.get_name(n, try_suffixes=(".weight",)) for n, _ in model.tensors}
    assert names["enc.blk.0.attn_rel_b.weight"] == "F32" and names["enc.blk.1.ffn_down.weight"] == "Q8_0"


@pytest.mark.parametrize("fmt", ["gguf", "fp8_channel"])
def test_the_single_file_converts_with_a_config_read_off_its_shapes(sources, reference, tmp_path, fmt):
    """Comfy-Org's file to GGUF and to a transformers format, which `T5EncoderModel.from_pretrained` loads: the
    examples draw each tensor from its name, so the file holds the pipeline's weights and the derived config
    must give the pipeline's output."""
    from transformers import T5EncoderModel

    run_cli("convert", sources["single"], tmp_path / "q", "--format", fmt, check=True)
    run_cli("verify", tmp_path / "q", "--source", sources["single"], "--forward", check=True)
    derived = read_json(tmp_path / "q" / "config.json")
    given = t5_config(T5_EXAMPLES.presets["tiny"])
    assert {k: v for k, v in derived.items() if k != "quantization_config"} == {
        k: v for k, v in given.items() if k != "dtype"
    }
    if fmt != "gguf":
        model = T5EncoderModel.from_pretrained(tmp_path / "q", dtype=torch.bfloat16).eval()
        ids, ref = reference
        assert sqnr(ref, last_hidden_state(model, ids)) > 20
