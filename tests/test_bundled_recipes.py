"""Each bundled recipe applied to a small model with the key names it is written for.

The expected split is spelled out here independently of the recipe files, as DESIGN.md and the
recipe descriptions state it, so a recipe that drifts from its promise fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from quantize.plan import make_plan
from quantize.recipes import load_recipe
from tests.conftest import load_all, run_cli
from tests.diffusers_models import wan_of_width


def _split(source: Path, recipe: str) -> dict[str, set[str]]:
    plan = make_plan(source, load_recipe(recipe).recipe)
    return {cp.rel: {t.module for t in cp.tensors if t.quantize} for cp in plan.components}


def _linears(directory: Path) -> set[str]:
    return {
        k.removesuffix(".weight")
        for k, v in load_all(directory).items()
        if k.endswith(".weight") and v.dim() == 2
    }


WAN_ORIGINAL_QUANTIZED = re.compile(r"blocks\.\d+\.((self_attn|cross_attn)\.(q|k|v|o|k_img|v_img)|ffn\.0)")
WAN_DIFFUSERS_QUANTIZED = re.compile(
    r"blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)|ffn\.net\.0\.proj)"
)


@pytest.mark.parametrize("layout", ["t2v", "i2v"])
def test_wan_fp8_original_names(make_wan, layout):
    src = make_wan(layout)
    linears = _linears(src)
    expected = {m for m in linears if WAN_ORIGINAL_QUANTIZED.fullmatch(m)}
    assert _split(src, "wan-fp8.yaml") == {".": expected}
    kept = linears - expected
    # what the recipe promises to keep: embeddings, time_projection, head, ffn.2 (and the I2V img_emb)
    assert {
        "text_embedding.0",
        "time_embedding.0",
        "time_projection.1",
        "head.head",
        "blocks.0.ffn.2",
    } <= kept
    if layout == "i2v":
        assert {"blocks.0.cross_attn.k_img", "blocks.1.cross_attn.v_img"} <= expected
        assert {"img_emb.proj.1", "img_emb.proj.3"} <= kept


def test_wan_fp8_all_quantizes_ffn2_too(make_wan):
    src = make_wan("t2v")
    (split,) = _split(src, "wan-fp8-all.yaml").values()
    assert split == {m for m in _linears(src) if m.startswith("blocks.")}


@pytest.mark.parametrize("recipe", ["wan2.2-a14b-fp8.yaml", "lingbot-world-fp8.yaml"])
def test_two_expert_recipes(make_wan, recipe):
    layout = "lingbot" if recipe.startswith("lingbot") else "a14b"
    src = make_wan(layout)
    split = _split(src, recipe)
    assert set(split) == {"high_noise_model", "low_noise_model"}
    for comp, quantized in split.items():
        linears = _linears(src / comp)
        assert quantized == {m for m in linears if WAN_ORIGINAL_QUANTIZED.fullmatch(m)}
        if layout == "lingbot":
            camera = {m for m in linears if "cam_" in m or "wancamctrl" in m or "c2ws" in m}
            assert len(camera) == 2 * 4 + 3 and not camera & quantized


@pytest.mark.parametrize("image_dim", [None, 32])
def test_wan_diffusers_fp8(tmp_path, image_dim):
    src = tmp_path / "Wan-Diffusers"
    wan_of_width(src / "transformer", image_dim)
    linears = _linears(src / "transformer")
    expected = {m for m in linears if WAN_DIFFUSERS_QUANTIZED.fullmatch(m)}
    assert _split(src, "wan-diffusers-fp8.yaml") == {"transformer": expected}
    kept = linears - expected
    assert {
        "proj_out",
        "blocks.0.ffn.net.2",
        "condition_embedder.time_proj",
        "condition_embedder.text_embedder.linear_1",
    } <= kept
    if image_dim:
        assert {"blocks.0.attn2.add_k_proj", "blocks.1.attn2.add_v_proj"} <= expected


def test_wan_a14b_diffusers_fp8(tmp_path):
    src = tmp_path / "Wan2.2-A14B-Diffusers"
    wan_of_width(src / "transformer", seed=0)
    wan_of_width(src / "transformer_2", seed=1)
    split = _split(src, "wan2.2-a14b-diffusers-fp8.yaml")
    assert set(split) == {"transformer", "transformer_2"}
    for comp, quantized in split.items():
        assert quantized == {m for m in _linears(src / comp) if WAN_DIFFUSERS_QUANTIZED.fullmatch(m)}


def test_dequantized_diffusers_forward_stays_close_to_bf16(tmp_path):
    """Convert a diffusers Wan with the CLI, load the dequantized weights, compare one forward."""
    from diffusers import WanTransformer3DModel

    from quantize.formats.fp8_channel import FORMAT as fp8

    src = tmp_path / "Wan-Diffusers"
    wan_of_width(src / "transformer")
    (src / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    out = tmp_path / "Wan-Diffusers-fp8"
    run_cli("convert", src, out, "--recipe", "wan-diffusers-fp8.yaml", check=True)
    assert (out / "model_index.json").is_file()

    stored = load_all(out / "transformer")
    state = {}
    for key, t in stored.items():
        if key.endswith(".weight_scale"):
            continue
        module = key.removesuffix(".weight")
        if f"{module}.weight_scale" in stored:
            state[key] = fp8.decode({"weight": t, "weight_scale": stored[f"{module}.weight_scale"]})
        else:
            state[key] = t.float()
    assert len(stored) - len(state) == 2 * 9  # 9 quantized Linears a block

    reference = WanTransformer3DModel.from_pretrained(src / "transformer", torch_dtype=torch.float32).eval()
    quantized = WanTransformer3DModel.from_config(reference.config).eval()
    quantized.load_state_dict(state, strict=True)

    g = torch.Generator().manual_seed(0)
    inputs = dict(
        hidden_states=torch.randn(1, 4, 2, 8, 8, generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, 24, generator=g),
        return_dict=False,
    )
    with torch.no_grad():
        ref = reference(**inputs)[0]
        got = quantized(**inputs)[0]
    sqnr = 10 * torch.log10(ref.pow(2).sum() / (ref - got).pow(2).sum())
    cosine = torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), dim=0)
    print(f"forward SQNR {float(sqnr):.1f} dB, cosine {float(cosine):.5f}")
    assert sqnr > 30 and cosine > 0.999, (float(sqnr), float(cosine))
    assert not torch.equal(ref, got)  # the weights really were quantized


WAN_ORIGINAL_ALL_BLOCK_LINEARS = re.compile(
    r"blocks\.\d+\.((self_attn|cross_attn)\.(q|k|v|o|k_img|v_img)|ffn\.(0|2))"
)
WAN_DIFFUSERS_ALL_BLOCK_LINEARS = re.compile(
    r"blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)|ffn\.net\.(0\.proj|2))"
)


@pytest.mark.parametrize(
    "recipe, layout, expected",
    [
        ("wan-torchao-fp8.yaml", "t2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-torchao-fp8.yaml", "i2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-torchao-int8.yaml", "t2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-torchao-int8.yaml", "i2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-nf4.yaml", "t2v", WAN_ORIGINAL_ALL_BLOCK_LINEARS),
        ("wan-nf4.yaml", "i2v", WAN_ORIGINAL_ALL_BLOCK_LINEARS),
        ("lingbot-world-nf4.yaml", "lingbot", WAN_ORIGINAL_ALL_BLOCK_LINEARS),
    ],
)
def test_torchao_and_nf4_recipes_on_original_names(make_wan, recipe, layout, expected):
    src = make_wan(layout)
    for comp, quantized in _split(src, recipe).items():
        linears = _linears(src / comp)
        assert quantized == {m for m in linears if expected.fullmatch(m)}
        assert not {m for m in quantized if "cam_" in m or "wancamctrl" in m or "c2ws" in m}


@pytest.mark.parametrize(
    "recipe, expected",
    [
        ("wan-diffusers-torchao-fp8.yaml", WAN_DIFFUSERS_QUANTIZED),
        ("wan-diffusers-torchao-int8.yaml", WAN_DIFFUSERS_QUANTIZED),
        ("wan-diffusers-nf4.yaml", WAN_DIFFUSERS_ALL_BLOCK_LINEARS),
    ],
)
def test_torchao_and_nf4_recipes_on_diffusers_names(tmp_path, recipe, expected):
    src = tmp_path / "Wan-Diffusers"
    wan_of_width(src / "transformer", image_dim=64, width=64)
    linears = _linears(src / "transformer")
    assert _split(src, recipe) == {"transformer": {m for m in linears if expected.fullmatch(m)}}


@pytest.mark.parametrize(
    "recipe, layout, expected",
    [
        ("wan-comfy-fp8.yaml", "t2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-comfy-fp8.yaml", "i2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-comfy-int8.yaml", "i2v", WAN_ORIGINAL_QUANTIZED),
        ("wan-comfy-fp8-all.yaml", "t2v", WAN_ORIGINAL_ALL_BLOCK_LINEARS),
        ("wan2.2-a14b-comfy-fp8.yaml", "a14b", WAN_ORIGINAL_QUANTIZED),
        ("wan2.2-a14b-comfy-int8.yaml", "a14b", WAN_ORIGINAL_QUANTIZED),
    ],
)
def test_comfy_recipes_on_original_names(make_wan, recipe, layout, expected):
    src = make_wan(layout)
    split = _split(src, recipe)
    assert set(split) == ({"high_noise_model", "low_noise_model"} if layout == "a14b" else {"."})
    for comp, quantized in split.items():
        assert quantized == {m for m in _linears(src / comp) if expected.fullmatch(m)}


@pytest.mark.parametrize("recipe", ["wan-diffusers-comfy-fp8.yaml", "wan-diffusers-comfy-int8.yaml"])
@pytest.mark.parametrize("image_dim", [None, 64])
def test_the_diffusers_comfy_recipes_take_the_diffusers_split_and_write_native_names(
    tmp_path, image_dim, recipe
):
    src = tmp_path / "Wan-Diffusers"
    wan_of_width(src / "transformer", image_dim=image_dim, width=64)
    linears = _linears(src / "transformer")
    expected = {m for m in linears if WAN_DIFFUSERS_QUANTIZED.fullmatch(m)}
    assert _split(src, recipe) == {"transformer": expected}
    (cp,) = make_plan(src, load_recipe(recipe).recipe).components
    assert {t.output_module for t in cp.quantized()} == {
        m for m in (t.output_module for t in cp.tensors) if WAN_ORIGINAL_QUANTIZED.fullmatch(m)
    }


@pytest.mark.parametrize(
    "recipe, layout",
    [
        ("wan-gguf-q8_0.yaml", "t2v"),
        ("wan-gguf-q8_0.yaml", "i2v"),
        ("wan-gguf-q6_k.yaml", "t2v"),
        ("wan-gguf-q5_k_m.yaml", "t2v"),
        ("wan-gguf-q4_k_m.yaml", "i2v"),
        ("wan2.2-a14b-gguf-q8_0.yaml", "a14b"),
        ("wan2.2-a14b-gguf-q4_k_m.yaml", "a14b"),
    ],
)
def test_gguf_recipes_quantize_every_block_linear_and_raise_ffn_down_and_v_in_the_m_mixes(
    make_wan, recipe, layout
):
    src = make_wan(layout, preset="small")
    plan = make_plan(src, load_recipe(recipe).recipe)
    for cp in plan.components:
        linears = _linears(src / cp.rel)
        quantized = {t.module: t.qtype for t in cp.quantized()}
        assert set(quantized) == {m for m in linears if WAN_ORIGINAL_ALL_BLOCK_LINEARS.fullmatch(m)} - (
            {m for m in linears if "_img" in m} if "a14b" in recipe else set()
        )
        base = load_recipe(recipe).recipe.type
        for module, qtype in quantized.items():
            raised = recipe.endswith("_m.yaml") and re.fullmatch(
                r"blocks\.\d+\.(ffn\.2|self_attn\.v)", module
            )
            assert qtype == ("Q6_K" if raised else base), module


@pytest.mark.parametrize("recipe", ["wan-diffusers-gguf-q8_0.yaml", "wan-diffusers-gguf-q4_k_m.yaml"])
def test_diffusers_gguf_recipes_match_their_original_named_twins(tmp_path, recipe):
    src = tmp_path / "Wan-Diffusers"
    wan_of_width(src / "transformer", width=256)
    (cp,) = make_plan(src, load_recipe(recipe).recipe).components
    twin = load_recipe(recipe.replace("diffusers-", "")).recipe
    quantized = {t.output_module: t.qtype for t in cp.quantized()}
    assert set(quantized) == {
        m for m in (t.output_module for t in cp.tensors) if WAN_ORIGINAL_ALL_BLOCK_LINEARS.fullmatch(m)
    }
    for module, qtype in quantized.items():
        raised = twin.types and re.fullmatch(r"blocks\.\d+\.(ffn\.2|self_attn\.v)", module)
        assert qtype == ("Q6_K" if raised else twin.type), module
