"""Wan's variants as families of their own: Wan2.1 VACE (`WanVACETransformer3DModel`), SkyReels-V2
(`SkyReelsV2Transformer3DModel`), and Wan2.2 TI2V-5B (a layout and preset of Wan itself).

Oracles: diffusers' own single-file converter (``convert_wan_transformer_to_diffusers``, which covers VACE), and for
SkyReels-V2's fps layers, which that converter leaves as they are, the table of diffusers'
``scripts/convert_skyreelsv2_to_diffusers.py`` (tests/oracles/diffusers_scripts.py). ComfyUI's Wan detection rule
(``comfy/model_detection.py``: the 'Wan 2.1' branch and its VACE test) is spelled in tests/oracles/comfyui_wan.py;
ComfyUI-GGUF's ``IMG_ARCH_LIST`` holds ``wan``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import gguf
import pytest
import torch
from safetensors import safe_open

from quantize.formats import FORMAT_INFO
from quantize.models import family_of, get_family, name_table
from quantize.models.examples import examples_of
from quantize.plan import make_plan
from quantize.read.checkpoint import TensorInfo, open_component, read_tensor
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import run_cli
from tests.helpers.forward import FAST_MARGIN_DB, bf16_floor
from tests.oracles.comfyui_wan import comfyui_wan
from tests.oracles.diffusers_scripts import SKYREELS_FPS

WAN, VACE, SKY = get_family("wan"), get_family("wan-vace"), get_family("skyreels-v2")
FORMATS = [
    "fp8_channel", "torchao_fp8", "torchao_int8", "nf4",
    "comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "gguf",
]  # fmt: skip
#: what a ComfyUI file holds beside each quantized layer's weight
COMFY_PARTS = (".comfy_quant", ".weight_scale", ".weight_scale_2", ".input_scale")
NATIVE_FORMATS = [f for f in FORMATS if f.startswith("comfy_") or f == "gguf"]
#: family -> (example layout of the release, its detected layout), (diffusers example layout, detected layout)
LAYOUTS = {
    "wan-vace": {"native": ("vace", "wan-vace"), "diffusers": ("diffusers", "wan-vace-diffusers")},
    "skyreels-v2": {"native": ("df", "skyreels-v2"), "diffusers": ("diffusers", "skyreels-v2-diffusers")},
}

TINY_WAN = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=32, in_channels=16, out_channels=16,
    text_dim=64, freq_dim=64, ffn_dim=128, num_layers=4,
)  # fmt: skip


def tiny_vace():
    import diffusers

    return diffusers.WanVACETransformer3DModel(**TINY_WAN, vace_layers=[0, 2], vace_in_channels=96)


def tiny_skyreels():
    import diffusers

    return diffusers.SkyReelsV2Transformer3DModel(**TINY_WAN, inject_sample_info=True)


# -- the name tables ----------------------------------------------------------------------------------------


def test_vace_names_round_trip_through_diffusers_own_converter():
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    state = tiny_vace().state_dict()
    rename = name_table(VACE, "native", FORMAT_INFO["comfy_fp8"]).renamer(list(state), "here")
    native = {rename(k): v for k, v in state.items()}
    assert len(native) == len(state)
    assert rename("vace_blocks.0.proj_in.weight") == "vace_blocks.0.before_proj.weight"
    assert rename("vace_blocks.1.proj_out.bias") == "vace_blocks.1.after_proj.bias"
    assert (
        rename("vace_blocks.1.norm2.weight") == "vace_blocks.1.norm3.weight"
    )  # Wan's swap, in VACE blocks too
    assert rename("vace_blocks.1.scale_shift_table") == "vace_blocks.1.modulation"
    assert "vace_blocks.1.before_proj.weight" not in native  # block 0 alone has it
    back = convert_wan_transformer_to_diffusers(dict(native))
    assert set(back) == set(state) and all(back[k] is state[k] for k in state)
    assert {VACE.diffusers_name(k): v for k, v in native.items()}.keys() == state.keys()


def test_skyreels_names_round_trip_through_diffusers_converter_and_its_fps_table():
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    state = tiny_skyreels().state_dict()
    rename = name_table(SKY, "native", FORMAT_INFO["gguf"]).renamer(list(state), "here")
    native = {rename(k): v for k, v in state.items()}
    assert {k for k in native if k.startswith("fps_")} == {
        "fps_embedding.weight",
        *(f"{m}.{p}" for m in SKYREELS_FPS for p in ("weight", "bias")),
    }
    back = convert_wan_transformer_to_diffusers(dict(native))
    for old, new in SKYREELS_FPS.items():  # what the converter leaves as is
        for p in ("weight", "bias"):
            back[f"{new}.{p}"] = back.pop(f"{old}.{p}")
    assert set(back) == set(state) and all(back[k] is state[k] for k in state)


def test_a_skyreels_model_without_fps_layers_still_has_native_names():
    import diffusers

    state = diffusers.SkyReelsV2Transformer3DModel(**TINY_WAN).state_dict()
    rename = name_table(SKY, "native", FORMAT_INFO["comfy_int8"]).renamer(list(state), "here")
    assert {rename(k) for k in state} == {WAN.native_name(k) for k in state}


# -- detection ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config_class", "names", "family"),
    [
        ("WanModel", ["head.modulation", "vace_blocks.0.self_attn.q.weight"], "wan-vace"),
        ("WanModel", ["head.modulation", "fps_embedding.weight"], "skyreels-v2"),
        ("WanModel", ["head.modulation", "blocks.0.self_attn.q.weight"], "wan"),
    ],
)
def test_a_variants_release_naming_wans_class_is_the_variants_by_its_own_layers(config_class, names, family):
    """A release whose config names Wan's class is the variant's where its own layers are there (the family contract
    holds each example to its class and names)."""
    assert family_of(config_class, names).name == family


def test_wan_claims_no_variant_model():
    for model in (*examples_of(VACE).models("tiny", "vace"), *examples_of(SKY).models("tiny", "df")):
        assert WAN.naming(dict(model.tensors)) is None and not WAN.owns("WanModel", dict(model.tensors))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """sources[family, "native" | "diffusers"]: the tiny example, as `quantize example` writes it."""
    root = tmp_path_factory.mktemp("variants")
    made = {}
    for family, layouts in LAYOUTS.items():
        for kind, (layout, _) in layouts.items():
            out = root / f"{family}-{layout}"
            run_cli("example", out, "--family", family, "--preset", "tiny", "--layout", layout, check=True)
            made[family, kind] = out
    return made


# -- examples: the dimensions the runtimes fix -----------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "small", "1.3b", "14b"])
def test_vace_examples_have_what_comfyui_builds(preset):
    (model,) = examples_of(VACE).models(preset, "vace")
    state, config = dict(model.tensors), model.config
    detected = comfyui_wan(state)
    assert config["_class_name"] == "VaceWanModel" and detected["model_type"] == "vace"
    assert detected["dim"] == config["dim"] and detected["num_heads"] == config["num_heads"]  # 128-wide heads
    assert state["text_embedding.0.weight"][1] == 4096 and state["time_embedding.0.weight"][1] == 256
    assert detected["vace_in_dim"] == config["vace_in_dim"] == 96
    # ComfyUI adds the hints every num_layers // vace_layers blocks from 0: the config says the same places
    n = detected["vace_layers"]
    assert config["vace_layers"] == list(range(0, detected["num_layers"], detected["num_layers"] // n))
    if preset == "14b":
        assert config["vace_layers"] == [0, 5, 10, 15, 20, 25, 30, 35]
    if preset == "1.3b":
        assert config["vace_layers"] == list(range(0, 30, 2))


def test_the_ti2v_example_is_what_comfyui_detects_as_wan22_ti2v():
    """Wan2.2 TI2V-5B: dim 3072, 30 layers, 48 channels in and out (ComfyUI's WAN22_T2V is told by out_dim 48)."""
    (model,) = examples_of(WAN).models("5b", "ti2v")
    detected = comfyui_wan(dict(model.tensors))
    assert detected == dict(dim=3072, out_dim=48, num_heads=24, ffn_dim=14336, num_layers=30, in_dim=48,
                            model_type="t2v")  # fmt: skip
    assert model.config["model_type"] == "ti2v" and model.config["in_dim"] == model.config["out_dim"] == 48


def test_ti2v_inputs_carry_one_timestep_per_token_and_run(tmp_path):
    import diffusers

    (model,) = examples_of(WAN).models("tiny", "ti2v")
    infos = {n: TensorInfo(n, "BF16", s, Path("x"), 0, 0) for n, s in model.tensors}
    config = WAN.diffusers_config(model.config, infos, Path("x"))
    x = WAN.inputs.random(config, torch.Generator().manual_seed(0))
    tokens = math.prod(x["hidden_states"].shape[2:]) // 4
    assert x["timestep"].shape == (1, tokens)
    m = diffusers.WanTransformer3DModel.from_config(config)
    with torch.no_grad():
        y = m(**WAN.inputs.call(config, x))[0]
    assert y.shape == x["hidden_states"].shape and torch.isfinite(y).all()


def test_a_skyreels_t2v_release_builds_skyreels_class_with_every_tensor_in_place():
    """A T2V release has Wan's model and names (it plans and runs as Wan's, the family contract holds); SkyReels-V2's
    own config read off it builds SkyReels-V2's class, every tensor in place."""
    import diffusers

    fam = SKY
    (model,) = examples_of(fam).models("tiny", "t2v")
    infos = {n: TensorInfo(n, "BF16", shape, Path("x"), 0, 0) for n, shape in model.tensors}
    config = fam.diffusers_config(model.config, infos, Path("x"))
    with torch.device("meta"):
        built = getattr(diffusers, fam.diffusers_class).from_config(config)
    renamed = {fam.diffusers_name(n): shape for n, shape in model.tensors}
    assert renamed == {k: tuple(v.shape) for k, v in built.state_dict().items()}


# -- the bundled recipes, on the tiny models ---------------------------------------------------------------------

#: what each recipe quantizes, spelled again here: (fp8 split, full split) by naming
SPLIT = {
    "native": (
        r"(vace_)?blocks\.\d+\.((self|cross)_attn\.(q|k|v|o)|ffn\.0)",
        r"(vace_)?blocks\.\d+\.((self|cross)_attn\.(q|k|v|o)|ffn\.(0|2))",
    ),
    "diffusers": (
        r"(vace_)?blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0)|ffn\.net\.0\.proj)",
        r"(vace_)?blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0)|ffn\.net\.(0\.proj|2))",
    ),
}
FULL = {"nf4", "comfy_nvfp4", "comfy_mxfp8", "gguf"}


@pytest.mark.parametrize("family", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["native", "diffusers"])
def test_each_bundled_recipe_quantizes_the_blocks_and_keeps_the_rest(sources, family, kind):
    layout = LAYOUTS[family][kind][1]
    for fmt in FORMATS:
        (cp,) = make_plan(
            sources[family, kind], load_recipe(default_recipes()[layout][fmt]).recipe
        ).components
        linears = {
            k.removesuffix(".weight")
            for k, t in cp.component.tensors.items()
            if k.endswith(".weight") and len(t.shape) == 2
        }
        quantized = {t.module: t for t in cp.tensors if t.quantize}
        assert set(quantized) == {m for m in linears if re.fullmatch(SPLIT[kind][fmt in FULL], m)}, fmt
        kept = linears - set(quantized)
        if family == "wan-vace":
            proj = ("before_proj", "after_proj") if kind == "native" else ("proj_in", "proj_out")
            assert {
                f"vace_blocks.0.{proj[0]}",
                f"vace_blocks.0.{proj[1]}",
                f"vace_blocks.1.{proj[1]}",
            } <= kept
            assert any(m.startswith("vace_blocks.1.") for m in quantized)
        else:
            fps = (
                ("fps_projection.0", "fps_projection.2")
                if kind == "native"
                else ("fps_projection.net.0.proj", "fps_projection.net.2")
            )
            assert set(fps) <= kept and "fps_embedding" not in quantized
        if fmt == "comfy_nvfp4":
            mxfp8 = {m for m, t in quantized.items() if t.options.type_name == "mxfp8"}
            down = re.compile(r"(vace_)?blocks\.(0\..*|\d+\.ffn\.(2|net\.2))")
            assert mxfp8 == {m for m in quantized if down.fullmatch(m)}
    # fmt: skip


# -- every format, through the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    made: dict[tuple[str, str, str], Path] = {}

    def get(family: str, kind: str, fmt: str) -> Path:
        if (family, kind, fmt) not in made:
            out = tmp_path_factory.mktemp(f"{family}-{kind}-{fmt}") / "out"
            run_cli("convert", sources[family, kind], out, "--format", fmt, check=True)
            made[family, kind, fmt] = out
        return made[family, kind, fmt]

    return get


def _reference(fam, src: Path, kind: str):
    """The source in float32 as the family's diffusers class, and its config."""
    import diffusers

    comp = open_component(src, "." if kind == "native" else "transformer")
    state = {k: read_tensor(i).float() for k, i in comp.tensors.items()}
    config = {k: v for k, v in comp.config.items() if k != "quantization_config"}
    if kind == "native":
        config = fam.diffusers_config(config, comp.tensors, comp.dir)
        state = {fam.diffusers_name(k): v for k, v in state.items()}
    model = getattr(diffusers, fam.diffusers_class).from_config(config).eval()
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize("family", list(LAYOUTS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_verifies_with_a_forward_and_our_loader_runs_it(sources, converted, family, fmt):
    """The release layout's output: verify --forward (through the variant's diffusers class), then our loader's
    eager reference in float32 gives verify's own figure, and its fast path in bf16 stays near it."""
    import diffusers

    from loaders import load_quantized

    fam = get_family(family)
    out = converted(family, "native", fmt)
    proc = run_cli("verify", out, "--source", sources[family, "native"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    reference = _reference(fam, sources[family, "native"], "native")
    cls = getattr(diffusers, fam.diffusers_class)
    x = load_inputs(None, fam, reference.config)
    with torch.no_grad():
        want = reference(**fam.inputs.call(reference.config, x))[0]
        exact = load_quantized(cls, out, dtype=torch.float32, compute="dequantize")
        got = exact(**fam.inputs.call(reference.config, x))[0]
        assert round(forward_sqnr_db(want, got), 3) == reported
        fast = load_quantized(cls, out, dtype=torch.bfloat16)
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        y = fast(**fam.inputs.call(reference.config, bf16))[0].float()
        floor = bf16_floor(reference, want, fam.inputs.call(reference.config, bf16))
    # the bf16 forward sits below both what verify measured and what bf16 arithmetic alone allows (the floor:
    # the unquantized source run in bf16), by FAST_MARGIN_DB at most, as the Wan loaders' test measures it
    assert (
        reported > 15 and min(reported, floor) - FAST_MARGIN_DB < forward_sqnr_db(want, y) < reported + 1
    ), (
        reported,
        floor,
    )


def _native_file(out: Path, kind: str) -> Path:
    comp = out if kind == "native" else out / "transformer"
    (path,) = [p for p in comp.iterdir() if p.suffix in (".safetensors", ".gguf")]
    return path


def _state(path: Path) -> dict[str, tuple[int, ...]]:
    if path.suffix == ".gguf":
        reader = gguf.GGUFReader(path)
        return {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    with safe_open(path, "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("family", list(LAYOUTS))
@pytest.mark.parametrize("fmt", NATIVE_FORMATS)
def test_comfy_and_gguf_files_of_either_layout_hold_what_comfyui_detects(sources, converted, family, fmt):
    fam = get_family(family)
    (release,) = examples_of(fam).models("tiny", LAYOUTS[family]["native"][0])
    want = comfyui_wan(dict(release.tensors))
    for kind in ("native", "diffusers"):
        out = converted(family, kind, fmt)
        path = _native_file(out, kind)
        state = _state(path)
        if (
            fmt == "gguf"
        ):  # GGUF stores quantized weights as bytes: the detection reads the kept tensors' shapes
            kv = gguf.GGUFReader(path).fields["general.architecture"]
            assert kv.contents() == "wan"  # in ComfyUI-GGUF's IMG_ARCH_LIST
            state = {k: dict(release.tensors)[k] for k in state}
        # every native name, no other (beside a ComfyUI layer's own parts: its scales and marker)
        assert {n for n in state if not n.endswith(COMFY_PARTS)} == {n for n, _ in release.tensors}
        assert comfyui_wan(state) == want
        if fmt != "gguf":
            with safe_open(path, "pt") as f:
                markers = {k.removesuffix(".comfy_quant") for k in f.keys() if k.endswith(".comfy_quant")}
            assert markers and not any(
                "before_proj" in m or "after_proj" in m or "fps_" in m for m in markers
            )
        if kind == "diffusers":
            assert run_cli("verify", out, "--source", sources[family, kind]).returncode == 0


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(converted, family):
    import diffusers

    fam = get_family(family)
    comp = converted(family, "diffusers", "torchao_fp8") / "transformer"
    model = getattr(diffusers, fam.diffusers_class).from_pretrained(comp, torch_dtype=torch.bfloat16)
    x = load_inputs(None, fam, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        y = model(**fam.inputs.call(model.config, x))[0]
    assert y.shape == x["hidden_states"].shape and torch.isfinite(y).all()
    assert type(model.blocks[0].attn1.to_q.weight).__name__ == "Float8Tensor"


def test_the_vace_gguf_loads_in_diffusers_from_single_file_and_runs_close_to_bf16(sources, converted):
    import diffusers

    src = sources["wan-vace", "diffusers"]
    path = _native_file(converted("wan-vace", "diffusers", "gguf"), "diffusers")
    model = diffusers.WanVACETransformer3DModel.from_single_file(
        str(path), config=str(src), subfolder="transformer",
        quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.bfloat16), torch_dtype=torch.bfloat16,
    )  # fmt: skip
    reference = _reference(VACE, src, "diffusers")
    x = load_inputs(None, VACE, reference.config)
    with torch.no_grad():
        want = reference(**VACE.inputs.call(reference.config, x))[0]
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        y = model(**VACE.inputs.call(reference.config, bf16))[0].float()
    assert forward_sqnr_db(want, y) > 25


def test_a_skyreels_gguf_loads_in_diffusers_from_single_file_and_runs_close_to_bf16(tmp_path):
    """A SkyReels-V2 T2V / I2V model (no fps layers: diffusers' single-file converter, Wan's, does not map a DF
    model's fps_projection, so diffusers' from_single_file leaves it unloaded; ComfyUI-GGUF and our loader read it)."""
    import diffusers

    torch.manual_seed(0)
    reference = diffusers.SkyReelsV2Transformer3DModel(**TINY_WAN).eval()
    src, out = tmp_path / "src", tmp_path / "out"
    reference.to(torch.bfloat16).save_pretrained(src / "transformer")
    reference.float()
    run_cli("convert", src, out, "--format", "gguf", check=True)
    model = diffusers.SkyReelsV2Transformer3DModel.from_single_file(
        str(_native_file(out, "diffusers")), config=str(src), subfolder="transformer",
        quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.bfloat16), torch_dtype=torch.bfloat16,
    )  # fmt: skip
    assert type(model.blocks[0].attn1.to_q.weight).__name__ == "GGUFParameter"
    x = load_inputs(None, SKY, reference.config)
    with torch.no_grad():
        want = reference(**SKY.inputs.call(reference.config, x))[0]
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        y = model(**SKY.inputs.call(reference.config, bf16))[0].float()
    assert forward_sqnr_db(want, y) > 25


@pytest.mark.parametrize(
    ("family", "recipe"), [("wan-vace", "wan-vace-comfy-nvfp4"), ("skyreels-v2", "skyreels-v2-comfy-nvfp4")]
)
def test_sensitivity_runs_through_the_variant_and_proposes_a_recipe(sources, tmp_path, family, recipe):
    proposal = tmp_path / "proposal.yaml"
    proc = run_cli(
        "sensitivity", sources[family, "native"], "--recipe", recipe, "--min-forward-sqnr", "30",
        "--write-recipe", proposal, "--top", "3", check=True,
    )  # fmt: skip
    assert load_recipe(str(proposal)).recipe.format == "comfy_nvfp4"
    assert math.isfinite(
        float(re.search(r"forward SQNR of the recipe in [^:]+: ([-\d.]+) dB", proc.stdout)[1])
    )
