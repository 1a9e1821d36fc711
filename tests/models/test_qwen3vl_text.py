"""Qwen3-VL's text model alone (`Qwen3VLTextModel`): its layout, its names and the formats transformers reads, each
read by its real reader; ComfyUI's and GGUF refused, and why.

The oracles: transformers' own `Qwen3VLTextModel` (its parameters: the names the folder holds; its `from_pretrained`
and its forward, the reference) and the whole Qwen3-VL's example, whose language model it is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from quantize.models import get_family
from quantize.models.examples.qwen3vl import QWEN3VL_EXAMPLES
from quantize.models.examples.qwen3vl_text import QWEN3VL_TEXT_EXAMPLES
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, last_hidden_state
from tests.helpers.verify import forward_sqnr

TEXT = get_family("qwen3vl-text")
FORMATS = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("qwen3vl-text") / "pipeline"
    run_cli("example", root, "--family", "qwen3vl-text", check=True)
    return root


@pytest.fixture(scope="module")
def reference(source):
    from transformers import Qwen3VLTextModel

    model = Qwen3VLTextModel.from_pretrained(source / "text_encoder", dtype=torch.float32).eval()
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    return ids, last_hidden_state(model, ids)


def test_the_example_is_transformers_own_class_and_qwen3vls_language_model():
    from transformers import Qwen3VLTextConfig, Qwen3VLTextModel

    (model,) = QWEN3VL_TEXT_EXAMPLES.models("tiny", "pipeline")
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = Qwen3VLTextModel(Qwen3VLTextConfig(**fields))
    assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == dict(model.tensors)
    (whole,) = QWEN3VL_EXAMPLES.models("tiny", "pipeline")
    language_model = {n: s for n, s in whole.tensors if n.startswith("model.language_model.")}
    assert {TEXT.native_name(n): s for n, s in model.tensors} == language_model


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory) -> dict[str, Path]:
    return convert_each(source, tmp_path_factory.mktemp("qwen3vl-text-out"), FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_and_transformers_from_pretrained_runs_it(converted, source, reference, fmt):
    from transformers import Qwen3VLTextModel

    from loaders import load_quantized

    floor = 12 if fmt == "nf4" else 22
    reported = forward_sqnr(converted[fmt], source)
    ours = load_quantized(Qwen3VLTextModel, converted[fmt] / "text_encoder", dtype=torch.float32)
    theirs = Qwen3VLTextModel.from_pretrained(converted[fmt] / "text_encoder", dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert reported > floor and sqnr(ref, last_hidden_state(ours, ids)) > floor
    assert sqnr(ref, last_hidden_state(theirs, ids)) > (12 if fmt == "nf4" else 18)


@pytest.mark.parametrize(
    ("fmt", "said"),
    [
        ("comfy_fp8", "ComfyUI's CLIPLoader tells a Qwen3-VL only by its vision tower's DeepStack mergers"),
        ("gguf", "Qwen3-VL text model has no GGUF architecture (ComfyUI-GGUF's CLIP loader"),
    ],
)
def test_comfyui_and_gguf_files_are_refused_naming_the_reader(source, tmp_path, fmt, said):
    proc = run_cli("convert", source, tmp_path / "out", "--format", fmt)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert said in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ("truncate", "but the file has"),
        ("unknown-class", "config.json names Qwen9VLTextModel, which no family is"),
    ],
)
def test_a_broken_folder_is_one_line_and_nothing_is_written(source, tmp_path, edit, said):
    bad = tmp_path / "text_encoder"
    shutil.copytree(source / "text_encoder", bad)
    weights = bad / "model.safetensors"
    if edit == "truncate":
        weights.write_bytes(weights.read_bytes()[:-1000])
    else:
        config = read_json(bad / "config.json")
        (bad / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen9VLTextModel"]}))
    proc = run_cli("convert", bad, tmp_path / "out", "--format", "torchao_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert said in line and str(bad) in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("gone", "said"),
    [
        ("layers.1.mlp.down_proj.weight", "no tensor 'layers.1.mlp.down_proj.weight', which block 0 has"),
        ("layers.1.", "no tensor 'layers.1.input_layernorm.weight', which the config's 2 blocks need"),
    ],
)
def test_the_family_refuses_a_folder_that_lacks_a_layer_tensor_naming_it(source, gone, said):
    """Its config read for a run (`Family.diffusers_config`, what a forward pass builds the class from) holds the
    folder to its config's layers: a partial folder is refused naming the first tensor it lacks."""
    from quantize.errors import InputError
    from quantize.read.checkpoint import open_component

    comp = open_component(source, "text_encoder")
    tensors = {k: v for k, v in comp.tensors.items() if not k.startswith(gone)}
    with pytest.raises(InputError, match=f"{said}: a partial Qwen3-VL text model checkpoint"):
        TEXT.diffusers_config(comp.config, tensors, comp.where)
