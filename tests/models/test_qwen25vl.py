"""Qwen2.5-VL (Kandinsky 5's and HunyuanVideo 1.5's text encoder): its layouts, its namings and every format it has,
each read by its real reader.

The oracles:
- transformers' own `Qwen2_5_VLForConditionalGeneration`: its loader's renaming of the stored names
  (`CLASS_PREFIXES`), its `from_pretrained` (the transformers-side formats) and its forward (the reference);
- ComfyUI's Qwen2.5-VL 7B (``comfy/text_encoders/llama.py`` `Qwen25_7BVLI`, its tower ``qwen_vl.py``), whose state
  dict tests/oracles/comfyui_qwen25vl.py spells from its source (``benchmarks/comfyui_encoders.py --family qwen25vl`` loads our files
  in the real one, and our GGUF pair in ComfyUI-GGUF);
- llama.cpp's converter for the GGUF pair (`llama_cpp_gguf`: ``Qwen2VLModel`` and ``Qwen2VLVisionModel`` of
  ``convert_hf_to_gguf.py``, the names from gguf-py's own tensor maps) and gguf-py's reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantize.formats import get_format
from quantize.models import family_of, get_family
from quantize.models.examples.qwen25vl import QWEN25VL_EXAMPLES, qwen25vl_config
from quantize.recipes import load_recipe
from quantize.run.forward import forward_sqnr_db as sqnr
from tests.conftest import read_json, run_cli
from tests.helpers.encoders import convert_each, resident_and_offloaded
from tests.helpers.encoders import language_model_hidden_state as last_hidden_state
from tests.helpers.recipes import edited_recipe
from tests.helpers.verify import forward_sqnr
from tests.oracles.comfyui_qwen25vl import comfyui_state

QWEN = get_family("qwen25vl")
TRANSFORMERS_SIDE = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
COMFY = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8"]
FORMATS = [*TRANSFORMERS_SIDE, *COMFY, "gguf"]
FOUR_BIT = ("nf4", "comfy_nvfp4")


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


def test_its_language_model_alone_in_comfyuis_names_is_the_text_models():
    """No tower: Qwen2.5-VL's text model (`Qwen2_5_VLTextModel`), in ComfyUI's names (the family contract holds each
    example to its class and names, the whole file asked as Qwen2.5-VL's before the text model's)."""
    (single,) = QWEN25VL_EXAMPLES.models("tiny", "single")
    names = [n for n, _ in single.tensors]
    assert family_of(None, [n for n in names if not n.startswith("visual.")]) is get_family("qwen25vl-text")
    assert QWEN.diffusers_class == "Qwen2_5_VLForConditionalGeneration"


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory) -> dict[str, Path]:
    return convert_each(sources["pipeline"], tmp_path_factory.mktemp("qwen25vl-out"), FORMATS)


def llama_cpp_gguf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What llama.cpp's converter writes of a Qwen2.5-VL's stored tensors, by name: the language model as
    ``Qwen2VLModel`` (every tensor renamed), the tower as ``Qwen2VLVisionModel.modify_tensors`` (its fused qkv as
    its three thirds of rows, renamed as ``q``, ``k``, ``v``; its Conv3d patch embedding as ``[:, :, 0]`` and
    ``[:, :, 1]``, ``v.patch_embd.weight`` and ``.weight.1``), each name from gguf-py's own tensor maps."""
    import gguf

    text = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, 64)
    vision = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 64)
    out = {}
    for name, t in state.items():
        if not name.startswith("visual."):
            out[text.get_name(name, try_suffixes=(".weight", ".bias"))] = t
        elif ".qkv." in name:
            c = t.shape[0] // 3
            for i, x in enumerate("qkv"):
                out[vision.get_name(name.replace("qkv", x), try_suffixes=(".weight", ".bias"))] = t[
                    i * c : (i + 1) * c
                ]
        elif "patch_embed.proj.weight" in name:
            out["v.patch_embd.weight"], out["v.patch_embd.weight.1"] = t[:, :, 0, ...], t[:, :, 1, ...]
        else:
            out[vision.get_name(name, try_suffixes=(".weight", ".bias"))] = t
    return out


def gguf_tensors(path: Path) -> tuple[dict[str, object], dict[str, tuple[str, torch.Tensor]]]:
    """A GGUF file's key-values and each tensor's (type, float32 values in torch's order), as gguf-py reads them."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    fields = {k: reader.fields[k].contents() for k in reader.fields if not k.startswith("GGUF.")}
    tensors = {
        t.name: (
            t.tensor_type.name,
            torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape(
                tuple(reversed(t.shape.tolist()))
            ),
        )
        for t in reader.tensors
    }
    return fields, tensors


def test_the_gguf_pair_is_what_llama_cpps_converter_writes(converted, sources):
    """Two files: the language model as llama.cpp's qwen2vl with its hyperparameters, the tower as its mmproj
    (architecture clip, general.type mmproj) with its clip.* ones, named so that ComfyUI-GGUF finds it beside the
    first; between them every tensor llama.cpp's converter writes, under its names, each kept one bit for bit
    (its qkv's thirds and the Conv3d's taps cut as llama.cpp cuts them), the Linears of the language model in
    Q8_0."""
    from safetensors.torch import load_file

    folder = converted["gguf"] / "text_encoder"
    assert sorted(p.name for p in folder.glob("*.gguf")) == ["mmproj-text_encoder.gguf", "text_encoder.gguf"]
    text_kv, text = gguf_tensors(folder / "text_encoder.gguf")
    vision_kv, vision = gguf_tensors(folder / "mmproj-text_encoder.gguf")
    config = read_json(sources["pipeline"] / "text_encoder" / "config.json")
    t, v = config["text_config"], config["vision_config"]
    assert (
        text_kv["general.architecture"] == "qwen2vl"
        and text_kv["qwen2vl.block_count"] == t["num_hidden_layers"]
    )
    assert text_kv["qwen2vl.rope.dimension_sections"] == [*t["rope_scaling"]["mrope_section"], 0]
    assert {k: v for k, v in vision_kv.items() if k.startswith("clip.")} == {
        "clip.has_vision_encoder": True,
        "clip.vision.projection_dim": t["hidden_size"],
        "clip.vision.image_size": 560,  # llama.cpp's default where the config has none
        "clip.vision.patch_size": v["patch_size"],
        "clip.vision.embedding_length": v["hidden_size"],
        "clip.vision.feed_forward_length": v["intermediate_size"],
        "clip.vision.block_count": v["depth"],
        "clip.vision.attention.head_count": v["num_heads"],
        "clip.vision.image_mean": pytest.approx([0.48145466, 0.4578275, 0.40821073]),
        "clip.vision.image_std": pytest.approx([0.26862954, 0.26130258, 0.27577711]),
        "clip.projector_type": "qwen2.5vl_merger",
        "clip.use_silu": True,
        "clip.vision.n_wa_pattern": v["fullatt_block_indexes"][0] + 1,
        "clip.vision.attention.layer_norm_epsilon": pytest.approx(t["rms_norm_eps"]),
    }
    assert (vision_kv["general.architecture"], vision_kv["general.type"]) == ("clip", "mmproj")
    # llama.cpp's file types: MOSTLY_Q8_0; MOSTLY_BF16 for the tower, kept as stored (bf16)
    assert (text_kv["general.file_type"], vision_kv["general.file_type"]) == (7, 32)
    expected = llama_cpp_gguf(load_file(sources["pipeline"] / "text_encoder" / "model.safetensors"))
    assert set(text) | set(vision) == set(expected) and not set(text) & set(vision)
    assert all(n.startswith(("v.", "mm.")) for n in vision)
    for name, (kind, values) in {**text, **vision}.items():
        if kind in ("F32", "BF16"):
            assert torch.equal(values, expected[name].float()), name
        else:
            assert kind == "Q8_0" and name.startswith("blk.") and values.shape == expected[name].shape, name
    assert vision["v.patch_embd.weight"][0] == "F32"  # as llama.cpp forces it


def test_the_loader_joins_the_towers_cut_tensors_back_bit_for_bit(converted, sources):
    from safetensors.torch import load_file
    from transformers import Qwen2_5_VLForConditionalGeneration

    from loaders import load_quantized

    model = load_quantized(Qwen2_5_VLForConditionalGeneration, converted["gguf"] / "text_encoder")
    state = model.state_dict()
    stored = load_file(sources["pipeline"] / "text_encoder" / "model.safetensors")
    tower = {n: t for n, t in stored.items() if n.startswith("visual.")}
    assert tower and all(torch.equal(state[f"model.{n}"], t) for n, t in tower.items())


@pytest.mark.parametrize("layout", ["pipeline", "single"])
def test_a_forward_pass_joins_the_cut_tensors_of_the_plan_again(sources, tmp_path, layout):
    """The streamed forward's weights of a tensor the conversion cut: its pieces decoded from the output, joined,
    are the source's stored values (a pass of the tower would run on them), from the class's layout and from ComfyUI's
    single file alike."""
    from quantize.containers import get_container
    from quantize.plan import make_plan
    from quantize.recipes import load_recipe
    from quantize.run.forward import runnable, source_weights, stored_weights

    out = tmp_path / "gguf"
    run_cli("convert", sources[layout], out, "--format", "gguf", check=True)
    recipe = {"pipeline": "qwen25vl-gguf-q8_0", "single": "qwen25vl-single-gguf-q8_0"}[layout]
    (cp,) = make_plan(sources[layout], load_recipe(recipe).recipe).components
    run = runnable(cp)
    stored = stored_weights(run, get_container("gguf_file").open_stored(out, cp.rel), get_format("gguf"))
    (path,) = sources[layout].rglob("*.safetensors")
    with safe_open(path, "pt") as f:
        for name in (
            "visual.patch_embed.proj.weight",
            "visual.blocks.1.attn.qkv.weight",
            "visual.blocks.0.attn.qkv.bias",
        ):
            want = f.get_tensor(name).float()  # as stored: the join is held to the source, not to itself
            assert name in run.cuts and torch.equal(stored(name), want), name
            assert torch.equal(source_weights(run)(name), want), name


def test_a_tower_llama_cpp_cannot_describe_is_refused_before_any_work(sources, tmp_path):
    """llama.cpp's mmproj holds one window-attention pattern (full attention every n-th block): a config whose
    full-attention blocks are not evenly spaced is refused in one line naming the model, at plan time."""
    import shutil

    bad = tmp_path / "pipeline"
    shutil.copytree(sources["pipeline"], bad)
    config = read_json(bad / "text_encoder" / "config.json")
    config["vision_config"]["fullatt_block_indexes"] = [0, 3]
    (bad / "text_encoder" / "config.json").write_text(json.dumps(config))
    for command in ("plan", "convert"):
        proc = run_cli(
            command,
            bad,
            *(["--format", "gguf"] if command == "plan" else [tmp_path / "out", "--format", "gguf"]),
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert (
            f"{bad / 'text_encoder'}: vision_config fullatt_block_indexes [0, 3] are not evenly spaced"
            in line
        )
    assert "convert:" not in proc.stderr + proc.stdout and not (tmp_path / "out").exists()


def test_a_target_on_a_tensor_the_gguf_cuts_is_refused_in_one_line(sources, tmp_path):
    """The tower's fused qkv is written as three tensors, kept as stored (the loader and a pass join them again):
    a recipe quantizing it is refused at plan time, naming the tensor and its pieces."""
    recipe = tmp_path / "r.yaml"
    targets = [r"visual\.blocks\.\d+\.attn\.qkv", *load_recipe("qwen25vl-gguf-q8_0").recipe.targets]
    recipe.write_text(edited_recipe("qwen25vl-gguf-q8_0", targets=targets))
    proc = run_cli("convert", sources["pipeline"], tmp_path / "out", "--recipe", recipe)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert (
        "hits tensor 'visual.blocks.0.attn.qkv.weight', which llama.cpp's qwen2vl names write as 3 tensors"
        in line
    )
    assert "v.blk.0.attn_q.weight" in line and not (tmp_path / "out").exists()


def test_an_mmproj_file_that_repeats_a_tensor_or_is_another_models_is_refused_naming_both(
    converted, tmp_path
):
    import shutil

    import gguf
    import numpy as np

    folder = tmp_path / "text_encoder"
    shutil.copytree(converted["gguf"] / "text_encoder", folder)
    writer = gguf.GGUFWriter(folder / "mmproj-text_encoder.gguf", "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    from transformers import Qwen2_5_VLForConditionalGeneration

    from loaders import load_quantized
    from quantize.errors import InputError

    with pytest.raises(
        InputError, match="mmproj-text_encoder.gguf: tensor 'output_norm.weight' is in text_encoder.gguf"
    ):
        load_quantized(Qwen2_5_VLForConditionalGeneration, folder)
    (folder / "mmproj-text_encoder.gguf").rename(folder / "mmproj-other.gguf")  # another model's: not its own
    with pytest.raises(
        InputError, match="mmproj-other.gguf beside text_encoder.gguf: a GGUF component is one"
    ):
        load_quantized(Qwen2_5_VLForConditionalGeneration, folder)


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


@pytest.mark.parametrize("fmt", ["comfy_int8", "gguf"])
def test_the_single_file_converts_with_a_config_read_off_its_shapes(converted, sources, tmp_path, fmt):
    run_cli("convert", sources["single"], tmp_path / "out", "--format", fmt, check=True)
    run_cli("verify", tmp_path / "out", "--source", sources["single"], "--forward", check=True)
    derived = read_json(tmp_path / "out" / "config.json")
    given = qwen25vl_config(QWEN25VL_EXAMPLES.presets["tiny"])
    assert {k: v for k, v in derived.items() if k != "quantization_config"} == {
        k: v for k, v in given.items() if k != "dtype"
    }


@pytest.mark.parametrize("fmt", ["fp8_channel", "torchao_fp8"])
def test_the_single_file_converts_to_transformers_formats_in_the_class_names(
    sources, reference, tmp_path, fmt
):
    """Comfy-Org's single file (the stored names, the same model as the example pipeline's): a transformers-side
    format is written in the names the class holds, with the config read off its shapes, and transformers'
    `from_pretrained` loads and runs it."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    out = tmp_path / "out"
    run_cli("convert", sources["single"], out, "--format", fmt, check=True)
    reported = forward_sqnr(out, sources["single"])
    with safe_open(out / "model.safetensors", "pt") as f:
        assert all(k.startswith(("model.language_model.", "model.visual.", "lm_head.")) for k in f.keys())
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, dtype=torch.bfloat16).eval()
    ids, ref = reference
    assert reported > 22 and sqnr(ref, last_hidden_state(model, ids)) > 18


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
