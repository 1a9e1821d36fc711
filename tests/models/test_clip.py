"""CLIP's towers: the text model (Kandinsky 5's and HunyuanVideo's ``text_encoder_2/``) and the vision model (Wan
2.1 I2V's ``image_encoder/``): their layouts, their formats, each read by its real reader, and the formats no
runtime reads, refused.

The oracles: transformers' own `CLIPTextModel` and `CLIPVisionModel`: their parameters, their `from_pretrained`
(which strips the stored ``text_model.``/``vision_model.`` as transformers 5 does) and their forward (the
reference).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from quantize.models import family_of, get_family
from quantize.models.examples import examples_of
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, resident_and_offloaded
from tests.helpers.verify import forward_sqnr

FORMATS = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
#: family -> its folder in a pipeline, its transformers class, its tower's stored prefix
TOWERS = {
    "clip-text": ("text_encoder_2", "CLIPTextModel", "text_model."),
    "clip-vision": ("image_encoder", "CLIPVisionModel", "vision_model."),
}


def _class(family: str):
    import transformers

    return getattr(transformers, TOWERS[family][1])


def _inputs(family: str, model) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if family == "clip-text":
        return {"input_ids": torch.randint(0, model.config.vocab_size, (2, 12), generator=g)}
    size = model.config.image_size
    return {"pixel_values": torch.randn(2, 3, size, size, generator=g)}


def _outputs(model, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The last hidden state and the pooled output (what Kandinsky 5 and HunyuanVideo read of CLIP-L)."""
    with torch.no_grad():
        out = model(**inputs)
    return out.last_hidden_state.float(), out.pooler_output.float()


@pytest.fixture(scope="module", params=list(TOWERS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def sources(family, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp(family)
    for layout in ("pipeline", "single"):
        run_cli("example", root / layout, "--family", family, "--layout", layout, check=True)
    return {"pipeline": root / "pipeline", "single": root / "single"}


@pytest.fixture(scope="module")
def reference(family, sources):
    folder = sources["pipeline"] / TOWERS[family][0]
    model = _class(family).from_pretrained(folder, dtype=torch.float32).eval()
    inputs = _inputs(family, model)
    return inputs, _outputs(model, inputs)


@pytest.fixture(scope="module")
def converted(family, sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp(f"{family}-out"), FORMATS)


def test_the_examples_are_transformers_own_classes_as_their_checkpoints_store_them(family):
    """The pipeline example holds the class's parameters under the tower's stored prefix (what transformers 4
    saved and the released pipelines hold); the single file adds ComfyUI's projection."""
    folder, _, prefix = TOWERS[family]
    examples = examples_of(family)
    (model,) = examples.models("tiny", "pipeline")
    cls = _class(family)
    fields = {k: v for k, v in model.config.items() if k not in ("architectures", "model_type", "dtype")}
    with torch.device("meta"):
        built = cls(cls.config_class(**fields))
    assert {prefix + k: tuple(v.shape) for k, v in built.state_dict().items()} == dict(model.tensors)
    assert model.component == folder
    (single,) = examples.models("tiny", "single")
    assert {n for n, _ in single.tensors} - {n for n, _ in model.tensors} == {
        "text_projection.weight" if family == "clip-text" else "visual_projection.weight"
    }


def test_each_tower_is_told_in_transformers_5s_names_and_a_whole_clip_model_by_neither(family):
    """As transformers 5's class holds them (an output's names, the stored prefix stripped), each tower is its
    family's; a whole CLIPModel (both towers) is neither's (the family contract holds each example to its class,
    names and layouts)."""
    (single,) = examples_of(family).models("tiny", "single")
    names = [n for n, _ in single.tensors]
    assert (
        family_of(None, [n.split(".", 1)[1] for n in names if n.startswith(("text_", "vision_"))]).name
        == family
    )
    (text,) = examples_of("clip-text").models("tiny", "single")
    (vision,) = examples_of("clip-vision").models("tiny", "single")
    assert (
        family_of(None, [n for n, _ in (*text.tensors, *vision.tensors)]) is None
    )  # CLIPModel: neither tower


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_int8", "gguf"])
def test_comfyuis_formats_and_gguf_are_refused_at_plan_time_saying_why(family, sources, tmp_path, fmt):
    proc = run_cli("convert", sources["single"], tmp_path / "out", "--format", fmt)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    title = get_family(family).title
    if fmt == "gguf":
        assert f"{title} has no GGUF architecture" in line and "TXT_ARCH_LIST" in line
    else:
        assert f"no runtime reads {title}'s {fmt} files" in line and "manual_cast" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_streamed_forward_and_both_loaders_run_it(
    family, converted, sources, reference, fmt
):
    """`verify --forward`; our `load_quantized` and transformers' `from_pretrained`, each against the bf16
    source's last hidden state and pooled output (text: 4-bit weights compound through a causal tower whose
    residual stream the layers dominate, 13 dB in nf4)."""
    from loaders import load_quantized

    folder = TOWERS[family][0]
    floor = {"nf4": 11}.get(fmt, 20)
    assert forward_sqnr(converted[fmt], sources["pipeline"]) > floor
    inputs, (hidden, pooled) = reference
    ours = load_quantized(_class(family), converted[fmt] / folder, dtype=torch.float32)
    theirs = _class(family).from_pretrained(converted[fmt] / folder, dtype=torch.bfloat16).eval()
    for model in (ours, theirs):
        got_hidden, got_pooled = _outputs(model, inputs)
        assert sqnr(hidden, got_hidden) > floor and sqnr(pooled, got_pooled) > floor


def test_block_offload_runs_the_towers_layers_and_changes_nothing(family, converted, reference):
    folder = TOWERS[family][0]
    inputs, _ = reference
    path = converted["fp8_channel"] / folder
    want, got, offloader = resident_and_offloaded(_class(family), path, lambda m: _outputs(m, inputs))
    assert offloader.stats.block_copies == len(offloader.model.encoder.layers)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_single_file_converts_with_a_config_read_off_its_shapes(family, sources, reference, tmp_path):
    """Comfy-Org's file: transformers' class from the config the tool writes, its projection kept beside."""
    run_cli("convert", sources["single"], tmp_path / "q", "--format", "torchao_int8", check=True)
    run_cli("verify", tmp_path / "q", "--source", sources["single"], "--forward", check=True)
    derived = read_json(tmp_path / "q" / "config.json")
    (model,) = examples_of(family).models("tiny", "pipeline")
    assert {k: v for k, v in derived.items() if k != "quantization_config"} == {
        k: v for k, v in model.config.items() if k != "dtype"
    }
    # the examples draw each tensor from its name: the file holds the pipeline's weights, so the derived config
    # (the activation, the heads) must give the pipeline's outputs
    loaded = _class(family).from_pretrained(tmp_path / "q", dtype=torch.float32).eval()
    inputs, (hidden, pooled) = reference
    got_hidden, got_pooled = _outputs(loaded, inputs)
    assert sqnr(hidden, got_hidden) > 25 and sqnr(pooled, got_pooled) > 25


@pytest.mark.parametrize(("family_name", "preset"), [("clip-text", "clip-l"), ("clip-vision", "vit-h")])
def test_the_real_towers_configs_are_read_off_their_shapes(family_name, preset):
    """CLIP ViT-L/14's text tower (quick GELU, 12 heads of 64) and OpenCLIP ViT-H/14's vision tower (GELU, 16
    heads of 80): what their released config.json says, read off Comfy-Org's files' shapes alone."""
    examples = examples_of(family_name)
    (pipeline,), (single,) = examples.models(preset, "pipeline"), examples.models(preset, "single")
    tensors = {n: SimpleNamespace(shape=shape) for n, shape in single.tensors}
    derived = get_family(family_name).diffusers_config({}, tensors, Path("one.safetensors"))
    assert derived == {k: v for k, v in pipeline.config.items() if k != "dtype"}


def test_a_pipelines_image_encoder_is_converted_beside_its_transformer(tmp_path):
    """`convert PIPELINE OUT --format fp8_channel` of a Wan pipeline with an image encoder (Wan 2.1 I2V's): the
    transformer and the CLIP vision tower, each by its recipe, the tower a checkpoint of its own in OUT."""
    from tests.diffusers_models import wan_pipeline

    source = wan_pipeline(tmp_path / "Wan-I2V")
    run_cli("example", tmp_path / "clip", "--family", "clip-vision", check=True)
    (tmp_path / "clip" / "image_encoder").rename(source / "image_encoder")
    said = run_cli("convert", source, tmp_path / "out", "--format", "fp8_channel", check=True).stdout
    assert "image_encoder/: recipe clip-vision-fp8" in said
    assert read_json(tmp_path / "out" / "quantize_manifest.json")["nested"] == ["image_encoder"]
    checked = run_cli("verify", tmp_path / "out", "--source", source, "--forward", check=True).stdout
    assert "forward in image_encoder: CLIPVisionModel" in checked


def test_a_file_whose_config_cannot_be_read_off_is_refused_before_any_work(tmp_path):
    """One line naming the file and what it lacks, exit 2, no output: a vision tower without its class embedding,
    and one whose positions are no square grid of patches."""
    from safetensors.torch import save_file

    (single,) = examples_of("clip-vision").models("tiny", "single")
    tensors = {n: torch.zeros(shape, dtype=torch.bfloat16) for n, shape in single.tensors}
    no_class = {n: t for n, t in tensors.items() if n != "vision_model.embeddings.class_embedding"}
    positions = "vision_model.embeddings.position_embedding.weight"
    not_square = {**tensors, positions: tensors[positions][:4].clone()}
    for stem, file_tensors, said in (
        ("no_class", no_class, "no tensor 'vision_model.embeddings.class_embedding'"),
        ("not_square", not_square, "4 position embeddings are not a square grid"),
    ):
        path = tmp_path / f"{stem}.safetensors"
        save_file(file_tensors, path)
        proc = run_cli("convert", path, tmp_path / "out", "--format", "fp8_channel")
        (line,) = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and line.startswith(f"error: {path}: ") and said in line, proc.stderr
        assert not (tmp_path / "out").exists()
