"""A converted model in a whole diffusers pipeline, each way docs/loaders.md shows, against the bf16 pipeline.

A tiny `WanPipeline` (transformer, `AutoencoderKLWan`, scheduler; no text encoder: prompts are given as
embeddings) is saved as a source; each way of running a converted transformer in it denoises two steps and
decodes frames, compared with the bf16 pipeline's frames by SQNR. The same for a tiny
`Kandinsky5T2VPipeline` (`AutoencoderKLHunyuanVideo`; Qwen and CLIP embeddings given).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.diffusers_models import NO_TEXT, kandinsky5, wan_model, wan_pipeline


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return wan_pipeline(tmp_path_factory.mktemp("pipelines") / "Wan-tiny-Diffusers")


def _run(pipe, output_type: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    # the pipeline casts given embeddings to the transformer's dtype, never to its device: put them there
    embeds = torch.randn(1, 8, 64, generator=g).to(torch.bfloat16).to(pipe._execution_device)
    out = pipe(
        prompt_embeds=embeds,
        negative_prompt_embeds=torch.zeros_like(embeds),
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=1.0,
        output_type=output_type,
        generator=torch.Generator().manual_seed(1),
    ).frames
    return out.float().cpu()


def frames(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    """The denoised latents and the decoded frames of two steps on fixed inputs."""
    return _run(pipe, "latent"), _run(pipe, "pt")


def assert_close_to(reference, got, min_db: float = 35.0) -> None:
    """The frames (dominated by the VAE: an unrelated transformer still gives about 25 dB) and the latents
    (the transformer's own work: an unrelated one gives about 3 dB) both close to the bf16 pipeline's."""
    (ref_latents, ref_frames), (latents, frames_) = reference, got
    assert frames_.shape == ref_frames.shape
    assert min_db < sqnr_db(ref_frames, frames_) < math.inf
    assert min_db - 5 < sqnr_db(ref_latents, latents) < math.inf


def sqnr_db(reference: torch.Tensor, x: torch.Tensor) -> float:
    noise = (reference - x).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(reference.pow(2).sum().item() / noise)


@pytest.fixture(scope="module")
def reference(source) -> torch.Tensor:
    from diffusers import WanPipeline

    return frames(WanPipeline.from_pretrained(source, torch_dtype=torch.bfloat16, **NO_TEXT))


def _convert(source: Path, out: Path, recipe: str) -> Path:
    run_cli("convert", source, out, "--recipe", recipe, check=True)
    return out


def test_an_unrelated_transformer_fails_the_comparison(source, reference):
    """The comparison can fail: another random transformer in the same pipeline."""
    from diffusers import WanPipeline

    torch.manual_seed(5)
    pipe = WanPipeline.from_pretrained(
        source, transformer=wan_model().to(torch.bfloat16), torch_dtype=torch.bfloat16, **NO_TEXT
    )
    with pytest.raises(AssertionError):
        assert_close_to(reference, frames(pipe))


def test_the_converted_pipeline_folder_runs_in_diffusers(source, reference, tmp_path):
    """`WanPipeline.from_pretrained(OUT)`: the recipe copies the VAE, scheduler and model_index.json."""
    from diffusers import WanPipeline
    from torchao.quantization import Float8Tensor

    out = _convert(source, tmp_path / "fp8", "wan-diffusers-torchao-fp8")
    pipe = WanPipeline.from_pretrained(out, torch_dtype=torch.bfloat16, **NO_TEXT)
    assert isinstance(pipe.transformer.blocks[0].attn1.to_q.weight, Float8Tensor)
    assert_close_to(reference, frames(pipe))


#: each format's bundled recipe for a diffusers-layout Wan, and the frames' / latents' SQNR (dB) against the bf16
#: pipeline measured with it (CPU, block offload to the CPU); `assert_close_to` asks for 35 / 30
LOAD_QUANTIZED = {
    "fp8_channel": "wan-diffusers-fp8",  # 48.1 / 45.4
    "torchao_fp8": "wan-diffusers-torchao-fp8",  # 48.5 / 46.2
    "nf4": "wan-diffusers-nf4",  # 47.9 / 38.8
    "comfy_fp8": "wan-diffusers-comfy-fp8",  # 49.0 / 45.0
    "comfy_int8": "wan-diffusers-comfy-int8",  # 48.3 / 49.7
    "gguf": "wan-diffusers-gguf-q8_0",  # 48.7 / 51.3
}


@pytest.mark.parametrize("fmt", list(LOAD_QUANTIZED))
def test_the_source_pipeline_with_load_quantized(fmt, source, reference, tmp_path):
    """The source pipeline, its transformer replaced by `loaders.load_quantized` of the converted one (every
    format: ComfyUI's and GGUF's files renamed from Wan's native names), its blocks streamed by the block
    offloader (to the CPU here; to "cuda" on a GPU)."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from loaders import MODULES, enable_block_offload, load_quantized

    recipe = LOAD_QUANTIZED[fmt]
    out = _convert(source, tmp_path / recipe, recipe)
    transformer = load_quantized(
        WanTransformer3DModel, out / "transformer", host="mmap", dtype=torch.bfloat16
    )
    assert any(type(m) is MODULES[fmt] for m in transformer.blocks.modules())
    offloader = enable_block_offload(transformer, device="cpu", host="pageable")
    pipe = WanPipeline.from_pretrained(source, transformer=transformer, torch_dtype=torch.bfloat16, **NO_TEXT)
    assert_close_to(reference, frames(pipe))
    assert offloader.stats.block_copies > 0  # the blocks did go through the offloader


def test_a_gguf_transformer_in_the_source_pipeline(source, reference, tmp_path):
    """diffusers' GGUF loader on our file, in native Wan names, with the source's config."""
    from diffusers import GGUFQuantizationConfig, WanPipeline, WanTransformer3DModel

    out = _convert(source, tmp_path / "gguf", "wan-diffusers-gguf-q8_0")
    transformer = WanTransformer3DModel.from_single_file(
        out / "transformer" / "transformer.gguf",
        config=str(source),
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16),
        torch_dtype=torch.bfloat16,
    )
    pipe = WanPipeline.from_pretrained(source, transformer=transformer, torch_dtype=torch.bfloat16, **NO_TEXT)
    assert_close_to(reference, frames(pipe))


@pytest.mark.gpu
def test_block_offload_and_nf4_in_diffusers_on_a_gpu(source, reference, tmp_path):
    """On a GPU: the source pipeline with a block-offloaded transformer, and diffusers' own NF4 loading."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from loaders import enable_block_offload, load_quantized

    out = _convert(source, tmp_path / "fp8", "wan-diffusers-fp8")
    transformer = load_quantized(WanTransformer3DModel, out / "transformer", host="pinned")
    enable_block_offload(transformer, device="cuda", host="pinned")
    pipe = WanPipeline.from_pretrained(source, transformer=transformer, torch_dtype=torch.bfloat16, **NO_TEXT)
    pipe.vae.to("cuda")
    # GPU kernels round differently from the CPU reference; an unrelated transformer gives 25 / 3 dB
    assert_close_to(reference, frames(pipe), min_db=30)
    nf4 = _convert(source, tmp_path / "nf4", "wan-diffusers-nf4")
    pipe = WanPipeline.from_pretrained(nf4, torch_dtype=torch.bfloat16, **NO_TEXT).to("cuda")
    assert_close_to(reference, frames(pipe), min_db=30)


# --- Kandinsky 5 ---------------------------------------------------------------------------------

K5_NO_TEXT = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)


def _save_kandinsky5_pipeline(path: Path) -> Path:
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky5T2VPipeline,
        Kandinsky5Transformer3DModel,
    )

    kandinsky5(path / "transformer")
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=16, block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        mid_block_add_attention=False,
    )  # fmt: skip
    transformer = Kandinsky5Transformer3DModel.from_pretrained(path / "transformer")
    with torch.no_grad():  # diffusers starts the output layers at zero: the transformer would change nothing
        for param in transformer.parameters():
            if not param.any():
                param.normal_(0, 0.02)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    Kandinsky5T2VPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler, **K5_NO_TEXT
    ).save_pretrained(path)
    return path


def _run_kandinsky5(pipe, output_type: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    qwen, clip = torch.randn(1, 6, 64, generator=g).bfloat16(), torch.randn(1, 64, generator=g).bfloat16()
    seqlens = torch.tensor([0, 6], dtype=torch.int32)
    out = pipe(
        prompt_embeds_qwen=qwen,
        prompt_embeds_clip=clip,
        prompt_cu_seqlens=seqlens,
        negative_prompt_embeds_qwen=torch.zeros_like(qwen),
        negative_prompt_embeds_clip=torch.zeros_like(clip),
        negative_prompt_cu_seqlens=seqlens,
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=1.0,
        output_type=output_type,
        generator=torch.Generator().manual_seed(1),
    ).frames
    return out.float().cpu()


def test_a_converted_kandinsky5_pipeline_folder_runs_in_diffusers(tmp_path):
    from diffusers import Kandinsky5T2VPipeline, Kandinsky5Transformer3DModel
    from torchao.quantization import Float8Tensor

    source = _save_kandinsky5_pipeline(tmp_path / "Kandinsky5-tiny")

    def run(pipe):
        return _run_kandinsky5(pipe, "latent"), _run_kandinsky5(pipe, "pt")

    reference = run(Kandinsky5T2VPipeline.from_pretrained(source, torch_dtype=torch.bfloat16, **K5_NO_TEXT))
    out = _convert(source, tmp_path / "fp8", "kandinsky5-torchao-fp8")
    pipe = Kandinsky5T2VPipeline.from_pretrained(out, torch_dtype=torch.bfloat16, **K5_NO_TEXT)
    assert any(isinstance(p, Float8Tensor) for p in pipe.transformer.parameters())
    assert_close_to(reference, run(pipe))
    torch.manual_seed(5)
    other = Kandinsky5Transformer3DModel.from_pretrained(source / "transformer", torch_dtype=torch.bfloat16)
    with torch.no_grad():
        for param in other.parameters():
            param.normal_(0, 0.02)
    pipe = Kandinsky5T2VPipeline.from_pretrained(
        source, transformer=other, torch_dtype=torch.bfloat16, **K5_NO_TEXT
    )
    with pytest.raises(AssertionError):  # the comparison can fail
        assert_close_to(reference, run(pipe))


# -- a whole pipeline: its transformer and its text encoder, one --format -------------------------------------


def _with_text_encoder(pipeline: Path) -> Path:
    """The tiny Wan pipeline with a tiny umT5 text encoder in text_encoder/ (its width the transformer's text
    width, 64), listed in model_index.json as diffusers lists a Wan pipeline's."""
    import json

    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    config = UMT5Config(
        vocab_size=128,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
    )
    UMT5EncoderModel(config).to(torch.bfloat16).save_pretrained(pipeline / "text_encoder")
    index = json.loads((pipeline / "model_index.json").read_text())
    index["text_encoder"] = ["transformers", "UMT5EncoderModel"]
    (pipeline / "model_index.json").write_text(json.dumps(index, indent=2))
    return pipeline


def _run_from_ids(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    """Two steps on prompt embeddings the pipeline's own text encoder makes of fixed token ids (no tokenizer)."""
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        embeds = pipe.text_encoder(input_ids=ids).last_hidden_state.to(torch.bfloat16)
    kwargs = dict(
        prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds), height=32, width=32, num_frames=5,
        num_inference_steps=2, guidance_scale=1.0,
    )  # fmt: skip
    latents = pipe(**kwargs, output_type="latent", generator=torch.Generator().manual_seed(1)).frames
    decoded = pipe(**kwargs, output_type="pt", generator=torch.Generator().manual_seed(1)).frames
    return latents.float(), decoded.float()


def test_format_converts_a_whole_pipeline_that_diffusers_loads_and_runs(tmp_path):
    """`convert PIPELINE OUT --format torchao_fp8` (a format both diffusers and transformers load): the transformer
    and the text encoder, each by its bundled
    recipe; the text encoder a checkpoint of its own inside OUT (its manifest, recipe, card), listed in OUT's
    manifest; `verify --source --forward` checks both; `WanPipeline.from_pretrained(OUT)` loads both quantized and
    its frames are the bf16 pipeline's."""
    from diffusers import WanPipeline
    from torchao.quantization import Float8Tensor

    from tests.conftest import read_json

    source = _with_text_encoder(wan_pipeline(tmp_path / "Wan-tiny-Diffusers"))
    out = tmp_path / "fp8"
    said = run_cli("convert", source, out, "--format", "torchao_fp8", check=True).stdout
    assert "recipe wan-diffusers-torchao-fp8" in said and "text_encoder/: recipe umt5-torchao-fp8" in said
    manifest = read_json(out / "quantize_manifest.json")
    assert (
        manifest["nested"] == ["text_encoder"] and manifest["recipe"]["name"] == "wan-diffusers-torchao-fp8"
    )
    assert read_json(out / "text_encoder" / "quantize_manifest.json")["recipe"]["name"] == "umt5-torchao-fp8"
    assert "text_encoder/model.safetensors" in {f["path"] for f in manifest["output_files"]}
    checked = run_cli("verify", out, "--source", source, "--forward", check=True).stdout
    assert "forward in text_encoder: UMT5EncoderModel" in checked
    reference = _run_from_ids(WanPipeline.from_pretrained(source, torch_dtype=torch.bfloat16, tokenizer=None))
    pipe = WanPipeline.from_pretrained(out, torch_dtype=torch.bfloat16, tokenizer=None)
    assert isinstance(pipe.text_encoder.encoder.block[0].layer[0].SelfAttention.q.weight, Float8Tensor)
    assert isinstance(pipe.transformer.blocks[0].attn1.to_q.weight, Float8Tensor)
    assert_close_to(reference, _run_from_ids(pipe), min_db=25)
    # a changed encoder file is found by the pipeline's verify
    (out / "text_encoder" / "model.safetensors").write_bytes(b"0" * 8)
    proc = run_cli("verify", out)
    assert proc.returncode == 1 and "text_encoder/" in proc.stdout


def test_a_hunyuanvideo15_pipeline_converts_with_both_its_text_encoders(tmp_path):
    """HunyuanVideo 1.5's pipeline: Qwen2.5-VL's text model in text_encoder/, byT5 in text_encoder_2/. With
    --format gguf all three are converted and verified; with comfy_fp8 byT5 is said to have no such file (ComfyUI
    reads none) and left out, as ComfyUI's recipes leave out what they do not convert."""
    from tests.conftest import read_json

    source = tmp_path / "HunyuanVideo-1.5-Diffusers"
    run_cli("example", source, "--family", "hunyuanvideo15", "--layout", "diffusers", check=True)
    for family, folder in (("qwen25vl-text", "text_encoder"), ("t5", "text_encoder_2")):
        run_cli("example", tmp_path / family, "--family", family, check=True)
        (tmp_path / family / folder).rename(source / folder)
    planned = run_cli("plan", source, "--format", "gguf", check=True).stdout
    assert "bundled:qwen25vl-text-gguf-q8_0.yaml" in planned and "bundled:t5-gguf-q8_0.yaml" in planned
    said = run_cli("convert", source, tmp_path / "gguf", "--format", "gguf", check=True).stdout
    assert (
        "text_encoder/: recipe qwen25vl-text-gguf-q8_0" in said
        and "text_encoder_2/: recipe t5-gguf-q8_0" in said
    )
    assert read_json(tmp_path / "gguf" / "quantize_manifest.json")["nested"] == [
        "text_encoder",
        "text_encoder_2",
    ]
    checked = run_cli("verify", tmp_path / "gguf", "--source", source, "--forward", check=True).stdout
    assert (
        "forward in text_encoder: Qwen2_5_VLTextModel" in checked
        and "forward in text_encoder_2: T5EncoderModel" in checked
    )
    said = run_cli("convert", source, tmp_path / "comfy", "--format", "comfy_fp8", check=True).stdout
    assert "text_encoder_2/: no bundled comfy_fp8 recipe" in said and "left out" in said
    assert not (tmp_path / "comfy" / "text_encoder_2").exists()
    assert read_json(tmp_path / "comfy" / "quantize_manifest.json")["nested"] == ["text_encoder"]


def test_a_kandinsky5_pipeline_with_its_clip_text_encoder_converts_and_runs_in_diffusers(tmp_path):
    """Kandinsky 5's pipeline with CLIP's text tower in text_encoder_2/ (as transformers 5 saves it: no
    ``text_model.`` prefix), `--format torchao_fp8`: both converted and verified, and
    `Kandinsky5T2VPipeline.from_pretrained(OUT)` loads both quantized; the pooled output of its own CLIP on fixed
    token ids conditions two steps, close to the bf16 pipeline's."""
    import json

    from diffusers import Kandinsky5T2VPipeline
    from torchao.quantization import Float8Tensor
    from transformers import CLIPTextConfig, CLIPTextModel

    source = _save_kandinsky5_pipeline(tmp_path / "Kandinsky5-tiny")
    torch.manual_seed(0)
    config = CLIPTextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        projection_dim=64, bos_token_id=0, eos_token_id=2, pad_token_id=1,
    )  # fmt: skip
    CLIPTextModel(config).to(torch.bfloat16).save_pretrained(source / "text_encoder_2")
    index = json.loads((source / "model_index.json").read_text())
    index["text_encoder_2"] = ["transformers", "CLIPTextModel"]
    (source / "model_index.json").write_text(json.dumps(index, indent=2))
    out = tmp_path / "fp8"
    said = run_cli("convert", source, out, "--format", "torchao_fp8", check=True).stdout
    assert "text_encoder_2/: recipe clip-text-torchao-fp8" in said
    checked = run_cli("verify", out, "--source", source, "--forward", check=True).stdout
    assert "forward in text_encoder_2: CLIPTextModel" in checked

    def run(pipe):
        ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            clip = pipe.text_encoder_2(input_ids=ids).pooler_output.to(torch.bfloat16)
        g = torch.Generator().manual_seed(0)
        qwen, seqlens = torch.randn(1, 6, 64, generator=g).bfloat16(), torch.tensor([0, 6], dtype=torch.int32)
        kwargs = dict(
            prompt_embeds_qwen=qwen, prompt_embeds_clip=clip, prompt_cu_seqlens=seqlens,
            negative_prompt_embeds_qwen=torch.zeros_like(qwen), negative_prompt_embeds_clip=torch.zeros_like(clip),
            negative_prompt_cu_seqlens=seqlens, height=32, width=32, num_frames=5, num_inference_steps=2,
            guidance_scale=1.0,
        )  # fmt: skip
        latents = pipe(**kwargs, output_type="latent", generator=torch.Generator().manual_seed(1)).frames
        decoded = pipe(**kwargs, output_type="pt", generator=torch.Generator().manual_seed(1)).frames
        return latents.float(), decoded.float()

    no_qwen = dict(text_encoder=None, tokenizer=None, tokenizer_2=None)
    reference = run(Kandinsky5T2VPipeline.from_pretrained(source, torch_dtype=torch.bfloat16, **no_qwen))
    pipe = Kandinsky5T2VPipeline.from_pretrained(out, torch_dtype=torch.bfloat16, **no_qwen)
    assert isinstance(pipe.text_encoder_2.encoder.layers[0].self_attn.q_proj.weight, Float8Tensor)
    assert any(isinstance(p, Float8Tensor) for p in pipe.transformer.parameters())
    assert_close_to(reference, run(pipe), min_db=25)


def _pipeline(path: Path, transformer: str, encoders: dict[str, str]) -> Path:
    """A pipeline folder of the examples: family `transformer`'s ``transformer/`` and each encoder family's
    ``text_encoder/`` moved into the folder named for it (what diffusers' pipeline holds there)."""
    run_cli("example", path, "--family", transformer, "--layout", "diffusers", check=True)
    for family, folder in encoders.items():
        run_cli("example", path.parent / family, "--family", family, check=True)
        (path.parent / family / "text_encoder").rename(path / folder)
    return path


def test_a_qwen_image_21_pipeline_converts_with_its_qwen3vl_encoder(tmp_path):
    """Qwen-Image 2.1's pipeline (`QwenImage21Pipeline`: the transformer, Qwen3-VL in text_encoder/): one
    `--format torchao_fp8` converts both, each by its bundled recipe, and `verify --forward` runs both. A ComfyUI
    format is refused for the whole folder naming the runtime that lacks the transformer (no Qwen-Image 2.1 in
    that ComfyUI), not converted as the text encoder alone; nothing is written."""
    from tests.conftest import read_json

    source = _pipeline(tmp_path / "Qwen-Image-2.1", "qwen-image-21", {"qwen3vl": "text_encoder"})
    said = run_cli("convert", source, tmp_path / "fp8", "--format", "torchao_fp8", check=True).stdout
    assert "recipe qwen-image-21-torchao-fp8" in said and "text_encoder/: recipe qwen3vl-torchao-fp8" in said
    assert read_json(tmp_path / "fp8" / "quantize_manifest.json")["nested"] == ["text_encoder"]
    checked = run_cli("verify", tmp_path / "fp8", "--source", source, "--forward", check=True).stdout
    assert (
        "forward in text_encoder: Qwen3VLForConditionalGeneration" in checked
        and "QwenImage21Transformer2DModel" in checked
    )
    refused = run_cli("convert", source, tmp_path / "comfy", "--format", "comfy_fp8")
    assert refused.returncode == 2 and "no Qwen-Image 2.1 model" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "comfy").exists()


def test_a_qwen_image_pipeline_becomes_gguf_files_with_its_qwen25vl_encoder(tmp_path):
    """Qwen-Image's pipeline (`QwenImagePipeline`: Qwen2.5-VL in text_encoder/) with `--format gguf`: the
    transformer's file (architecture ``qwen_image``, what ComfyUI-GGUF reads) and the encoder's pair (text and
    mmproj), all verified."""
    import gguf

    source = _pipeline(tmp_path / "Qwen-Image", "qwen-image", {"qwen25vl": "text_encoder"})
    said = run_cli("convert", source, tmp_path / "gguf", "--format", "gguf", check=True).stdout
    assert "recipe qwen-image-gguf-q8_0" in said and "text_encoder/: recipe qwen25vl-gguf-q8_0" in said
    run_cli("verify", tmp_path / "gguf", "--source", source, check=True)
    arch = gguf.GGUFReader(tmp_path / "gguf" / "transformer" / "transformer.gguf").fields[
        "general.architecture"
    ]
    assert arch.contents() == "qwen_image"
    assert len(list((tmp_path / "gguf" / "text_encoder").glob("*.gguf"))) == 2
