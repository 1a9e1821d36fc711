"""Kandinsky 6: told from Kandinsky 5 (whose block names it shares), its one layout (diffusers' ``transformer/``),
its recipes' split, every format its runtimes read through the command line and back through diffusers'
``from_pretrained``, the formats no runtime reads refused at plan time, a whole pipeline with its Qwen2.5-VL encoder,
and bad input.

No oracle of native names: diffusers 0.42.1 has no single-file converter of Kandinsky 6's original release, and
ComfyUI 187eda8e no Kandinsky 6 model; the class itself (`diffusers.Kandinsky6Transformer3DModel`) is the reference.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from quantize.errors import InputError
from quantize.models import family_of, get_family, runnable_names
from quantize.plan import make_plan
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import load_all, read_json, run_cli

K6 = get_family("kandinsky6")
K5 = get_family("kandinsky5")
FORMATS = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
REFUSED = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "gguf"]

#: a tiny Kandinsky 6 with the released switches; the audio branch narrower than the video's
TINY = dict(
    model_dim=64, ff_dim=128, time_dim=32, num_text_blocks=1, num_visual_blocks=2, axes_dims=(8, 12, 12),
    model_dim_a=32, ff_dim_a=64, time_dim_a=32, in_text_dim=64, in_text_dim2=32, text_token_padding=True,
    ca_rope=True, cross_gates=True, fix_modulation=True, visual_token_type_num_embeddings=2,
)  # fmt: skip


def _one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


# -- telling it from Kandinsky 5 ------------------------------------------------------------------------------


def test_its_tensors_are_kandinsky6s_by_class_and_by_names_never_kandinsky5s():
    """Kandinsky 5 shares ``visual_transformer_blocks.0.``: before this family, its marks claimed a Kandinsky 6
    model without config.json, and its config was no known layout."""
    import diffusers

    with torch.device("meta"):
        names = list(diffusers.Kandinsky6Transformer3DModel(**TINY).state_dict())
    assert family_of("Kandinsky6Transformer3DModel", names) is K6 and family_of(None, names) is K6
    assert K5.naming(names) is None and not K5.owns(None, names)
    # every name is in the table, itself (the only naming of Kandinsky 6 the tool knows)
    assert all(K6.native_name(n) == n and K6.diffusers_name(n) == n for n in names)
    assert runnable_names(K6, names, Path("here")) == {n: n for n in names}
    # Kandinsky 5's own names stay Kandinsky 5's
    with torch.device("meta"):
        k5 = diffusers.Kandinsky5Transformer3DModel(
            model_dim=64,
            ff_dim=128,
            time_dim=32,
            axes_dims=(8, 12, 12),
            num_text_blocks=1,
            num_visual_blocks=1,
        )
    k5 = list(k5.state_dict())
    assert family_of(None, k5) is K5 and K6.naming(k5) is None


def test_the_super_resolution_transformer_is_no_familys():
    """`Kandinsky6SRTransformer3DModel` (a text-free DiT of Kandinsky 5's block names): no layout of this tool, by
    its class or by its names (Kandinsky 5's marks would claim it)."""
    import diffusers

    with torch.device("meta"):
        sr = diffusers.Kandinsky6SRTransformer3DModel(
            in_visual_dim=4, out_visual_dim=4, time_dim=32, model_dim=64, ff_dim=128, num_visual_blocks=1,
            axes_dims=(8, 12, 12),
        )  # fmt: skip
    names = list(sr.state_dict())
    assert any(n.startswith("visual_transformer_blocks.0.") for n in names)
    assert family_of(None, names) is None and family_of("Kandinsky6SRTransformer3DModel", names) is None


def test_a_tensor_the_class_lacks_is_refused_naming_it():
    names = ["video_text_embeddings.in_layer.weight", "visual_transformer_blocks.0.lora.weight"]
    with pytest.raises(
        InputError, match="tensor 'visual_transformer_blocks.0.lora.weight' has no counterpart"
    ):
        runnable_names(K6, names, Path("here"))


# -- the example, its recipes -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The tiny example (diffusers' class's names and config), as `quantize example` writes it."""
    root = tmp_path_factory.mktemp("k6") / "ti2va"
    run_cli("example", root, "--family", "kandinsky6", check=True)
    return root


#: what every Kandinsky 6 recipe quantizes, written out again here: the attention projections of the text blocks,
#: of both decoder blocks and the cross-modal attentions, and the feed-forward's input of every block
QUANTIZED = re.compile(
    r"((video|audio)_text_transformer_blocks\.\d+\.attn|visual_transformer_blocks\.\d+\.((video|audio)_dec_block\."
    r"(self|cross)_attention|(va|av)_cross_attention))\.(to_query|to_key|to_value|out_layer)"
    r"|((video|audio)_text_transformer_blocks\.\d+|visual_transformer_blocks\.\d+\.(video|audio)_dec_block)"
    r"\.feed_forward\.net\.0\.proj"
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_bundled_recipe_quantizes_the_attention_and_feed_forward_input_of_both_branches(source, fmt):
    assert set(default_recipes()["kandinsky6"]) == set(FORMATS)
    (cp,) = make_plan(source, load_recipe(default_recipes()["kandinsky6"][fmt]).recipe).components
    linears = {k.removesuffix(".weight") for k, t in cp.component.tensors.items() if k.endswith(".weight") and len(t.shape) == 2}  # fmt: skip
    quantized = {t.module for t in cp.tensors if t.quantize}
    assert cp.rel == "transformer" and quantized == {m for m in linears if QUANTIZED.fullmatch(m)}
    # 2 text blocks (4 + 1 each); 2 fused blocks: 2 decoder blocks (8 + 1 each) and 2 cross-modal attentions (4 each)
    assert len(quantized) == 2 * 5 + 2 * (2 * 9 + 2 * 4)
    per_block = ("feed_forward.net.2", "visual_modulation.out_layer")
    assert linears - quantized == {
        "visual_embeddings.in_layer", "visual_token_type_embeddings", "out_layer.modulation.out_layer",
        "out_layer.out_layer", "audio_embeddings.in_layer", "audio_out_layer.modulation.out_layer",
        "audio_out_layer.out_layer",
        *(f"{b}_{m}" for b in ("video", "audio") for m in (
            "time_embeddings.timestep_embedder.linear_1", "time_embeddings.timestep_embedder.linear_2",
            "text_embeddings.in_layer", "pooled_text_embeddings.in_layer",
            "text_transformer_blocks.0.text_modulation.out_layer", "text_transformer_blocks.0.feed_forward.net.2")),
        *(f"visual_transformer_blocks.{i}.{m}" for i in range(2) for m in ("va_modulation.out_layer", "av_modulation.out_layer")),
        *(f"visual_transformer_blocks.{i}.{d}_dec_block.{m}" for i in range(2) for d in ("video", "audio") for m in per_block),
    }  # fmt: skip


@pytest.mark.parametrize("fmt", REFUSED)
def test_the_formats_no_runtime_reads_are_refused_at_plan_time_naming_the_runtime(source, tmp_path, fmt):
    runtime = (
        "ComfyUI-GGUF has no kandinsky6 architecture"
        if fmt == "gguf"
        else "no Kandinsky 6 in ComfyUI 187eda8e"
    )
    line = _one_line_exit_2(run_cli("convert", source, tmp_path / "o", "--format", fmt))
    assert f"no bundled {fmt} recipe for kandinsky6" in line and runtime in line
    # a recipe of that format, as a user would write it
    recipe = tmp_path / "r.yaml"
    kind = "type: Q8_0\n" if fmt == "gguf" else ""
    recipe.write_text(f"format: {fmt}\n{kind}components: [transformer]\ntargets: ['visual_transformer_blocks\\.\\d+\\.video_dec_block\\.self_attention\\.to_query']\n")  # fmt: skip
    for command in (
        ("plan", source, "--recipe", recipe),
        ("convert", source, tmp_path / "o", "--recipe", recipe),
    ):
        line = _one_line_exit_2(run_cli(*command))
        assert f"{source / 'transformer'}: " in line and runtime in line
    assert not (tmp_path / "o").exists()


# -- every format, through the command line and diffusers' from_pretrained -------------------------------------


@pytest.fixture
def bnb_on_cpu(monkeypatch):
    """Lift diffusers' GPU gate of its bitsandbytes quantizer (and nothing else), as tests/test_diffusers_interop.py."""
    from diffusers.quantizers.bitsandbytes.bnb_quantizer import BnB4BitDiffusersQuantizer

    monkeypatch.setattr(BnB4BitDiffusersQuantizer, "validate_environment", lambda self, *a, **k: None)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_forward_and_loads_in_diffusers_or_our_loader(
    source, tmp_path, bnb_on_cpu, fmt
):
    """verify --forward (both branches run: audio latents given) holds the recipe's threshold; our loader's eager
    reference in float32 gives verify's figure; diffusers' `from_pretrained` loads the torchao and nf4 outputs
    quantized and runs the video and audio outputs close to it."""
    import diffusers

    from loaders import QuantizedLinear, load_quantized

    out = tmp_path / "out"
    run_cli("convert", source, out, "--format", fmt, check=True)
    proc = run_cli("verify", out, "--source", source, "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    assert reported > (
        load_recipe(default_recipes()["kandinsky6"][fmt]).recipe.checks.min_forward_sqnr_db or 20
    )
    cls, comp = diffusers.Kandinsky6Transformer3DModel, out / "transformer"
    reference = cls.from_pretrained(source / "transformer", torch_dtype=torch.float32).eval()
    x = load_inputs(None, K6, reference.config)
    assert "audio_hidden_states" in x and "visual_token_type_ids" in x
    with torch.no_grad():
        want = reference(**K6.inputs.call(reference.config, x))
        exact = load_quantized(cls, comp, dtype=torch.float32, compute="dequantize")
        assert any(isinstance(m, QuantizedLinear) for m in exact.modules())
        assert round(forward_sqnr_db(want[0], exact(**K6.inputs.call(reference.config, x))[0]), 3) == reported
        if fmt == "fp8_channel":
            return  # compressed-tensors: diffusers has no loader of it
        on_cpu = {"device_map": {"": "cpu"}} if fmt == "nf4" else {}  # bitsandbytes' quantizer asks a device
        model = cls.from_pretrained(comp, torch_dtype=torch.bfloat16, **on_cpu).eval()
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        video, audio = model(**K6.inputs.call(model.config, bf16))
    weight = model.visual_transformer_blocks[0].audio_dec_block.self_attention.to_query.weight
    kind = {"torchao_fp8": "Float8Tensor", "torchao_int8": "Int8Tensor", "nf4": "Params4bit"}[fmt]
    assert type(weight).__name__ == kind
    assert (
        type(model.visual_transformer_blocks[0].video_dec_block.feed_forward.net[2].weight).__name__
        == "Parameter"
    )
    assert reported - 6 < forward_sqnr_db(want[0], video.float()) < reported + 3, reported
    assert forward_sqnr_db(want[1], audio.float()) > reported - 10


NO_TEXT = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)


def _pipeline(source: Path, path: Path) -> Path:
    """A tiny `Kandinsky6TI2VAPipeline` as its save_pretrained writes it: the example's transformer, a tiny
    HunyuanVideo VAE and the scheduler (prompts are given as embeddings), with Qwen2.5-VL's example in
    text_encoder/, listed in model_index.json as the pipeline lists it."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky6TI2VAPipeline,
        Kandinsky6Transformer3DModel,
    )

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=16, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        mid_block_add_attention=False,
    )  # fmt: skip
    transformer = Kandinsky6Transformer3DModel.from_pretrained(
        source / "transformer", torch_dtype=torch.bfloat16
    )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    Kandinsky6TI2VAPipeline(transformer=transformer, vae=vae, scheduler=scheduler, **NO_TEXT).save_pretrained(
        path
    )
    run_cli("example", path.parent / "qwen", "--family", "qwen25vl", check=True)
    (path.parent / "qwen" / "text_encoder").rename(path / "text_encoder")
    index = read_json(path / "model_index.json")
    index["text_encoder"] = ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    (path / "model_index.json").write_text(json.dumps(index, indent=2))
    return path


def _latents(pipe) -> torch.Tensor:
    """Two steps on fixed Qwen and CLIP embeddings, video alone (no audio VAE): the denoised latents."""
    g = torch.Generator().manual_seed(0)
    qwen, clip = torch.randn(1, 6, 3584, generator=g).bfloat16(), torch.randn(1, 768, generator=g).bfloat16()
    return pipe(
        prompt_embeds=qwen, pooled_prompt_embeds=clip, negative_prompt_embeds=torch.zeros_like(qwen),
        negative_pooled_prompt_embeds=torch.zeros_like(clip), height=32, width=32, num_frames=5,
        num_inference_steps=2, guidance_scale=1.0, sample_audio=False, output_type="latent",
        generator=torch.Generator().manual_seed(1),
    ).frames.float()  # fmt: skip


def test_a_pipeline_with_its_qwen25vl_text_encoder_converts_with_one_format_and_runs_in_diffusers(
    source, tmp_path
):
    """`Kandinsky6TI2VAPipeline`'s transformer/ and Qwen2.5-VL's text_encoder/: `--format torchao_fp8` converts both,
    each by its bundled recipe, and verify passes; the pipeline's `from_pretrained(OUT)` loads the transformer
    quantized and its two steps stay close to the bf16 pipeline's. A format the transformer has no file of is
    refused, nothing written."""
    from diffusers import Kandinsky6TI2VAPipeline
    from torchao.quantization import Float8Tensor

    pipe = _pipeline(source, tmp_path / "Kandinsky-6-tiny")
    out = tmp_path / "fp8"
    said = run_cli("convert", pipe, out, "--format", "torchao_fp8", check=True).stdout
    assert "recipe kandinsky6-torchao-fp8" in said and "text_encoder/: recipe qwen25vl-torchao-fp8" in said
    assert read_json(out / "quantize_manifest.json")["nested"] == ["text_encoder"]
    assert run_cli("verify", out, "--source", pipe).returncode == 0  # each format's forward: the test above
    with torch.no_grad():
        want = _latents(Kandinsky6TI2VAPipeline.from_pretrained(pipe, torch_dtype=torch.bfloat16, **NO_TEXT))
        loaded = Kandinsky6TI2VAPipeline.from_pretrained(out, torch_dtype=torch.bfloat16, **NO_TEXT)
        assert isinstance(
            loaded.transformer.visual_transformer_blocks[0].va_cross_attention.to_key.weight, Float8Tensor
        )
        assert 25 < forward_sqnr_db(want, _latents(loaded)) < math.inf
    _one_line_exit_2(run_cli("convert", pipe, tmp_path / "comfy", "--format", "comfy_fp8"))
    assert not (tmp_path / "comfy").exists()


# -- bad input --------------------------------------------------------------------------------------------------


def test_a_truncated_file_is_one_line_naming_it_and_nothing_is_written(source, tmp_path):
    src = tmp_path / "cut"
    shutil.copytree(source, src)
    (shard,) = (src / "transformer").glob("*.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--format", "torchao_fp8"))
    assert shard.name in line and "truncated" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("dropped", "said"),
    [
        ("visual_transformer_blocks.1.audio_dec_block.cross_attention.to_key.weight", "is missing: the other visual_transformer_blocks"),
        ("audio_text_transformer_blocks.0.", "no tensor of audio_text_transformer_blocks.0: config.json's num_text_blocks is 1"),
    ],
)  # fmt: skip
def test_a_missing_block_tensor_is_one_line_naming_it_and_nothing_is_written(source, tmp_path, dropped, said):
    from safetensors.torch import save_file

    src = tmp_path / "cut"
    shutil.copytree(source, src)
    (shard,) = (src / "transformer").glob("*.safetensors")
    state = {k: v for k, v in load_all(src / "transformer").items() if not k.startswith(dropped)}
    save_file(state, shard, metadata={"format": "pt"})
    line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--format", "nf4"))
    assert said in line and (dropped in line or dropped.endswith("."))
    assert not (tmp_path / "o").exists()
