"""The Wan variants only ComfyUI runs (`models.wan_variants`: Wan2.2 S2V, HuMo, the Fun camera models, SCAIL /
SCAIL-2): their releases detected as themselves, converted to ComfyUI's and GGUF's files with their own layers
quantized or kept as the policies say, the formats diffusers would load refused at plan time, a forward pass refused
by name, bad input refused in one line.

Oracle: ComfyUI's detection and the shapes its classes fix (tests/oracles/comfyui_wan_variants.py, spelled from
``comfy/model_detection.py``, ``comfy/supported_models.py`` and ``comfy/ldm/wan/model.py``). The real ComfyUI loading
the files (no missing or unexpected key, every quantized layer of the file's layout) is
``benchmarks/comfyui_families.py --families wan-s2v,wan-humo,wan-camera,wan-scail``.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import pytest
from safetensors import safe_open

from quantize.errors import InputError
from quantize.examples import write_example
from quantize.formats import FORMAT_INFO
from quantize.models import FAMILIES, family_of, get_family
from quantize.models.examples import examples_of
from quantize.plan import make_plan
from quantize.read.checkpoint import open_component
from quantize.recipes import default_recipes, load_recipe
from tests.conftest import run_cli
from tests.oracles.comfyui_wan_variants import comfyui_variant, comfyui_variant_shapes

WAN = get_family("wan")
#: example layout -> (family, the ComfyUI class that detects it)
LAYOUTS = {
    "s2v": ("wan-s2v", "WAN22_S2V"),
    "humo": ("wan-humo", "WAN21_HuMo"),
    "camera-2.1": ("wan-camera", "WAN21_Camera"),
    "camera-2.2": ("wan-camera", "WAN22_Camera"),
    "scail": ("wan-scail", "WAN21_SCAIL"),
    "scail2": ("wan-scail", "WAN21_SCAIL2"),
    "wandancer": ("wan-dancer", "WAN22_WanDancer"),
}
#: family -> (its own layers the bundled recipes quantize, its own layers they keep), as patterns of module names
OWN = {
    "wan-s2v": (
        r"audio_injector\.injector\.\d+\.(q|k|v|o)",
        r"casual_audio_encoder\..*|audio_injector\.injector_adain_layers\..*|cond_encoder|frame_packer\..*|trainable_cond_mask",
    ),
    "wan-humo": (r"blocks\.\d+\.audio_cross_attn_wrapper\.audio_cross_attn\.(q|k|v|o)", r"audio_proj\..*"),
    "wan-camera": (None, r"control_adapter\..*"),
    "wan-scail": (None, r"patch_embedding_(pose|mask)"),
    "wan-dancer": (
        r"music_injector\.injector\.\d+\.(q|k|v|o)",
        r"music_encoder\..*|music_projection|patch_embedding_global|img_emb_refimage\..*|head_global\..*",
    ),
}  # fmt: skip
NATIVE = [name for name, info in FORMAT_INFO.items() if info.names != "source"]
LIBRARY_FORMATS = ["torchao_fp8", "torchao_int8", "nf4"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """layout -> its example release at the tiny preset (ComfyUI's one file, no config.json)."""
    root = tmp_path_factory.mktemp("variants")
    return {
        layout: write_example(root / layout, "tiny", layout, family=family)
        for layout, (family, _) in LAYOUTS.items()
    }


def _shapes(src: Path) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in open_component(src, ".").tensors.items()}


def _one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error:") and "Traceback" not in proc.stderr
    return line


# -- the releases: what ComfyUI builds, detected as the variant alone -------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_example_is_what_comfyui_detects_and_builds(sources, layout):
    family, cls = LAYOUTS[layout]
    state = _shapes(sources[layout])
    assert comfyui_variant(state) == cls
    dim, in_dim = state["head.modulation"][-1], state["patch_embedding.weight"][1]
    layers = len({n.split(".")[1] for n in state if n.startswith("blocks.")})
    own = comfyui_variant_shapes(cls, dim, layers, in_dim)
    assert {n: state.get(n) for n in own} == own
    # the rest is Wan's, every tensor with its name in diffusers' WanTransformer3DModel
    assert [n for n in state if n not in own and WAN.diffusers_name(n) is None] == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_release_is_the_variants_alone_whatever_wan_class_its_config_names(sources, layout):
    family = get_family(LAYOUTS[layout][0])
    names = list(_shapes(sources[layout]))
    assert family_of(None, names) is family and family_of("WanModel", names) is family
    assert [f.name for f in FAMILIES if f.owns(None, names)] == [family.name]
    assert not WAN.owns("WanModel", names) and WAN.naming(names) is None
    assert family.detection.library is None and family.folders.diffusers is None


# -- the recipes: the variant's attention quantized, its conditioning kept -------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_bundled_recipe_quantizes_the_blocks_and_the_variants_attention_and_keeps_its_conditioning(
    sources, layout
):
    family = LAYOUTS[layout][0]
    quantized_own, kept_own = OWN[family]
    recipes = default_recipes()[family]
    assert sorted(recipes) == sorted(["fp8_channel", *NATIVE])
    for fmt, name in recipes.items():
        plan = make_plan(sources[layout], load_recipe(name).recipe)
        done = {t.name.removesuffix(".weight") for cp in plan.components for t in cp.tensors if t.quantize}
        assert "blocks.0.self_attn.q" in done and "blocks.1.ffn.0" in done, fmt
        assert not any(re.fullmatch(kept_own, m) for m in done), (fmt, sorted(done))
        assert not any(
            m.startswith(("patch_embedding", "text_embedding", "time_", "head.", "img_emb")) for m in done
        )
        if quantized_own is not None:
            own = {m for m in done if re.fullmatch(quantized_own, m)}
            expected = {
                n.removesuffix(".weight")
                for n in _shapes(sources[layout])
                if n.endswith(".weight") and re.fullmatch(quantized_own, n.removesuffix(".weight"))
            }
            assert own == expected and own, fmt


@pytest.mark.parametrize("fmt", LIBRARY_FORMATS)
def test_the_formats_diffusers_would_load_are_refused_at_plan_time_naming_why(sources, tmp_path, fmt):
    out = tmp_path / "out"
    line = _one_line_exit_2(run_cli("convert", sources["s2v"], out, "--format", fmt))
    assert (
        f"no bundled {fmt} recipe for wan-s2v" in line
        and "diffusers (0.42.1) has no Wan2.2 S2V class" in line
    )
    assert not out.exists()
    # a recipe of that format a user writes: refused by the plan, for the same reason
    base = load_recipe(default_recipes()["wan-humo"]["fp8_channel"]).recipe
    donor = next(load_recipe(r[fmt]).recipe for r in default_recipes().values() if fmt in r)
    recipe = type(base).model_validate(base.model_dump() | {"format": fmt, "type": donor.type, "types": {}})
    with pytest.raises(
        InputError, match=rf"no runtime reads HuMo's {fmt} files: diffusers \(0\.42\.1\) has no HuMo class"
    ):
        make_plan(sources["humo"], recipe)


# -- the files: ComfyUI's and GGUF's names, a forward refused by name ------------------------------------------------


def test_the_comfy_and_gguf_files_hold_every_source_tensor_under_its_own_name(sources, tmp_path):
    src = sources["s2v"]
    names = set(_shapes(src))
    out = tmp_path / "comfy"
    run_cli("convert", src, out, "--format", "comfy_fp8", check=True)
    with safe_open(out / "diffusion_model_comfy_fp8.safetensors", "pt") as f:
        stored = set(f.keys())
    parts = (".comfy_quant", ".weight_scale", ".input_scale")
    assert {n for n in stored if not n.endswith(parts)} == names
    assert "audio_injector.injector.11.o.comfy_quant" in stored
    assert "audio_injector.injector_adain_layers.0.linear.comfy_quant" not in stored
    assert run_cli("verify", out, "--source", src).returncode == 0
    readme = (out / "README.md").read_text()
    assert "ComfyUI's WanModel_S2V" in readme and "from None import" not in readme
    # a forward pass: diffusers has no class to run it, said naming a layer it lacks
    line = _one_line_exit_2(run_cli("verify", out, "--source", src, "--forward"))
    assert "has no counterpart in diffusers, which has no Wan2.2 S2V class" in line
    out = tmp_path / "gguf"
    run_cli("convert", sources["camera-2.1"], out, "--format", "gguf", check=True)
    reader = gguf.GGUFReader(out / "diffusion_model.gguf")
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "wan"
    assert {t.name for t in reader.tensors} == set(_shapes(sources["camera-2.1"]))


@pytest.mark.parametrize(
    "tell", [{"model_type": "flow_rvs"}, {"causal_ar": True}], ids=["flowrvs", "causal-ar"]
)
def test_a_wan_told_by_its_metadata_alone_keeps_it_in_every_file(tmp_path, tell):
    """FlowRVS and the causal AR T2V are Wan's tensors with a metadata ``config`` ComfyUI reads: carried."""
    import json

    from safetensors.torch import load_file, save_file

    wan = write_example(tmp_path / "wan", "tiny", "t2v", family="wan")
    tensors = {k: v for f in sorted(wan.glob("*.safetensors")) for k, v in load_file(f).items()}
    src = tmp_path / "release"
    src.mkdir()
    config = json.dumps({"transformer": tell})
    save_file(tensors, src / "wan2.1_variant_bf16.safetensors", metadata={"format": "pt", "config": config})
    assert family_of(None, list(tensors)) is WAN
    for fmt, file in (("comfy_fp8", "diffusion_model_comfy_fp8.safetensors"), ("fp8_channel", None)):
        out = tmp_path / fmt
        run_cli("convert", src, out, "--format", fmt, check=True)
        (path,) = [out / file] if file else list(out.glob("*.safetensors"))
        with safe_open(path, "pt") as f:
            assert f.metadata()["config"] == config
    run_cli("convert", src, tmp_path / "gguf", "--format", "gguf", check=True)
    field = gguf.GGUFReader(tmp_path / "gguf" / "diffusion_model.gguf").fields["config"]
    assert bytes(field.parts[field.data[0]]).decode() == config


# -- bad input: one line, exit 2, nothing written ----------------------------------------------------------------


def _copy(src: Path, dest: Path, drop: str | None = None) -> Path:
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    (file,) = src.glob("*.safetensors")
    tensors = {k: v for k, v in load_file(file).items() if drop is None or not k.startswith(drop)}
    save_file(tensors, dest / file.name, metadata={"format": "pt"})
    return dest / file.name


@pytest.mark.parametrize("layout", ["s2v", "humo", "camera-2.1", "scail", "wandancer"])
def test_a_truncated_release_is_one_line_naming_the_file(sources, tmp_path, layout):
    file = _copy(sources[layout], tmp_path / "cut")
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)
    line = _one_line_exit_2(run_cli("convert", file.parent, tmp_path / "o", "--format", "comfy_fp8"))
    assert file.name in line and "truncated" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("layout", "dropped", "said"),
    [
        ("scail2", "blocks.1.cross_attn.k_img.weight", "which blocks.0 has: a partial SCAIL release"),
        ("s2v", "audio_injector.injector.11.", "which audio_injector.injector.0 has: a partial Wan2.2 S2V release"),
        ("humo", "blocks.1.audio_cross_attn_wrapper.audio_cross_attn.k.weight", "which blocks.0 has: a partial HuMo release"),
        ("camera-2.1", "blocks.1.ffn.2.bias", "which blocks.0 has: a partial Wan Fun Camera release"),
        ("wandancer", "music_injector.injector.7.", "which music_injector.injector.0 has: a partial WanDancer release"),
        ("wandancer", "music_encoder.1.", "which music_encoder.0 has: a partial WanDancer release"),
    ],
)  # fmt: skip
def test_a_release_missing_a_block_tensor_is_one_line_naming_it(sources, tmp_path, layout, dropped, said):
    file = _copy(sources[layout], tmp_path / "partial", dropped)
    for fmt in ("comfy_nvfp4", "gguf"):
        line = _one_line_exit_2(run_cli("convert", file.parent, tmp_path / "o", "--format", fmt))
        assert said in line and f"'{dropped}" in line
        assert not (tmp_path / "o").exists()


def test_a_config_no_family_owns_is_one_line(sources, tmp_path):
    file = _copy(sources["camera-2.2"], tmp_path / "other")
    (file.parent / "config.json").write_text('{"_class_name": "SomeOtherModel"}')
    line = _one_line_exit_2(run_cli("convert", file.parent, tmp_path / "o", "--format", "comfy_fp8"))
    assert "no model family this tool knows" in line
    assert not (tmp_path / "o").exists()


def test_examples_are_registered_with_a_layout_per_comfyui_class():
    families = ("wan-s2v", "wan-humo", "wan-camera", "wan-scail", "wan-dancer")
    layouts = {lay for f in families for lay in examples_of(f).layouts}
    assert layouts == set(LAYOUTS)
