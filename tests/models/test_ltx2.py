"""LTX-2: its native names (the release's, ``model.diffusion_model.``-prefixed), its two layouts (the release's one
file holding the transformer with its VAEs, vocoder and text connectors; diffusers' ``transformer/``), its recipes
and every format through the command line.

Oracles: diffusers' own single-file converter (``convert_ltx2_transformer_to_diffusers``) for the name table;
ComfyUI's detection rule (``comfy/model_detection.py``, the 'Lightricks ltxv' branch, with the file's metadata
``config`` it reads) and the state dict its ``LTXAVModel`` builds from what it detects (``comfy/ldm/lightricks/``),
spelled in tests/oracles/comfyui_ltx2.py; ComfyUI-GGUF's ``IMG_ARCH_LIST`` holds ``ltxv``. ComfyUI itself is not
needed.

The tiny example has 48 blocks, as the releases do (the recipes keep blocks 0, 1, 46, 47), 64 wide; ``tiny-2.3``
is LTX-2.3's structure (per-head gated attention, the text cross-attention's adaLN, no caption projection in the
transformer), 128 wide for video and 64 for audio. Oracles for 2.3 beside those: the rename diffusers' own conversion
script adds for it and the config it converts LTX-2.3 with (tests/oracles/diffusers_scripts.py), and ComfyUI's rules
for the switches the release's metadata ``config`` names.

``tiny-2.5`` is LTX-2.5's structure at tiny-2.3's size (2.3's, with no bias in the video feed-forward and the
keyframes' position embedding; its release file holds the transformer and connectors alone, as the published
``ltx-2.5-22b-dev-transformer-bf16.safetensors`` does, 4349 tensors at 22B); its pipeline holds a text encoder
(Gemma 4's tiny example), converted by the same ``--format``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import pytest
import torch
from safetensors import safe_open

from quantize.errors import InputError
from quantize.formats import FORMAT_INFO, format_info
from quantize.models import get_family, name_table, runnable_names
from quantize.models.examples import examples_of
from quantize.models.examples.ltx2 import connectors_config
from quantize.models.ltx2 import LTX23_SWITCHES, LTX25_COMFYUI_SWITCHES, LTX25_SWITCHES, PREFIX
from quantize.plan import make_plan
from quantize.read.checkpoint import TensorInfo, open_component, read_tensor
from quantize.read.detect import detect_layouts
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import load_all, read_json, run_cli
from tests.helpers.recipes import edited_recipe
from tests.oracles.comfyui_ltx2 import comfyui_detects, comfyui_state, unet_part
from tests.oracles.diffusers_scripts import LTX23_SCRIPT_SWITCHES, ltx2_diffusers_names

LTX = get_family("ltx2")
FORMATS = [
    "fp8_channel", "torchao_fp8", "torchao_int8", "nf4",
    "comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "gguf",
]  # fmt: skip
NATIVE_FORMATS = [f for f in FORMAT_INFO if format_info(f).names != "source"]
COMFY_PARTS = (".comfy_quant", ".weight_scale", ".weight_scale_2", ".input_scale", ".weight_s_rel", ".weight_s_channel", ".weight_codebook")  # fmt: skip
LAYOUTS = {"release": "ltx2", "diffusers": "ltx2-diffusers"}
#: the example folders the tests convert: each (preset, layout); ``*-2.3`` the LTX-2.3 structure
SOURCES = {
    "release": ("tiny", "release"), "diffusers": ("tiny", "diffusers"),
    "release-2.3": ("tiny-2.3", "release"), "diffusers-2.3": ("tiny-2.3", "diffusers"),
    "release-2.5": ("tiny-2.5", "release"), "diffusers-2.5": ("tiny-2.5", "diffusers"),
}  # fmt: skip

TINY = dict(
    in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
    audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=4,
    audio_cross_attention_dim=8, num_layers=2, caption_channels=16, rope_type="split",
)  # fmt: skip
#: LTX-2.3's switches as diffusers' conversion script sets them
TINY_23 = TINY | LTX23_SCRIPT_SWITCHES
#: LTX-2.5's, as its published files hold them; and diffusers' other 2.5 switch, the prompt adaLN dropped (the
#: text cross-attention's keys and values cacheable across steps)
TINY_25 = TINY_23 | LTX25_SWITCHES
TINY_25_NO_PROMPT_ADALN = TINY_25 | {"use_prompt_adaln_single": False}


# -- the name table -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [TINY, TINY_23, TINY_25, TINY_25_NO_PROMPT_ADALN],
    ids=["2.0", "2.3", "2.5", "2.5-no-prompt-adaln"],
)
def test_every_diffusers_name_round_trips_through_diffusers_own_converter(config):
    import diffusers

    state = diffusers.LTX2VideoTransformer3DModel(**config).state_dict()
    native = {
        LTX.native_name(k): k for k in state
    }  # the table itself (a diffusers model has no native output)
    assert len(native) == len(state) and all(k.startswith(PREFIX) for k in native)
    assert LTX.native_name("proj_in.weight") == f"{PREFIX}patchify_proj.weight"
    assert LTX.native_name("time_embed.linear.bias") == f"{PREFIX}adaln_single.linear.bias"
    assert LTX.native_name("transformer_blocks.1.audio_to_video_attn.norm_k.weight") == (
        f"{PREFIX}transformer_blocks.1.audio_to_video_attn.k_norm.weight"
    )
    assert ltx2_diffusers_names(native) == native  # diffusers reads each native name back as the class's
    assert {LTX.diffusers_name(k) for k in native} == set(state)
    if config is TINY_23:  # LTX-2.3's own tensors, in the release's names
        assert LTX.native_name("prompt_adaln.linear.weight") == f"{PREFIX}prompt_adaln_single.linear.weight"
        assert LTX.native_name("audio_prompt_adaln.emb.timestep_embedder.linear_1.bias") == (
            f"{PREFIX}audio_prompt_adaln_single.emb.timestep_embedder.linear_1.bias"
        )
        block = f"{PREFIX}transformer_blocks.1"
        assert {f"{block}.video_to_audio_attn.to_gate_logits.weight", f"{block}.audio_prompt_scale_shift_table"} < set(native)  # fmt: skip
        assert not any("caption_projection" in k for k in native)
    if config.get("use_keyframes_abs_pos_embedding"):  # LTX-2.5's: its video feed-forward has no bias
        assert LTX.native_name("keyframes_abs_pos_embedding") == f"{PREFIX}keyframes_abs_pos_embedding"
        assert not any(k.startswith("transformer_blocks.0.ff.") and k.endswith(".bias") for k in state)
        assert ("prompt_adaln.linear.weight" in state) is config.get("use_prompt_adaln_single", True)


@pytest.mark.parametrize("preset", ["tiny", "tiny-2.3", "tiny-2.5"])
def test_the_release_names_are_what_diffusers_reads_of_the_release_and_the_connectors_have_none(preset):
    """diffusers' converter drops the connectors (another component) and leaves the rest of the file alone;
    our table gives each transformer tensor of the release the name the converter gives it, and none to the rest."""
    (release,) = examples_of(LTX).models(preset, "release")
    names = [n for n, _ in release.tensors]
    ours = runnable_names(LTX, names, Path("here"))
    assert {old: new for old, new in ltx2_diffusers_names(names).items() if old.startswith(PREFIX)} == ours
    carried = [n for n in names if LTX.carried(n)]
    # LTX-2.5's file holds the connectors alone beside the transformer (its VAEs and projection are files of their own)
    parts = (
        {"model"}
        if preset == "tiny-2.5"
        else {"model", "text_embedding_projection", "vae", "audio_vae", "vocoder"}
    )
    assert {n.split(".")[0] for n in carried} == parts
    assert all(LTX.diffusers_name(n) is None for n in carried)
    assert not any(LTX.carried(n) for n in ours)


def test_a_tensor_neither_naming_has_is_refused_naming_it_and_diffusers_names_have_no_native_output():
    with pytest.raises(
        InputError,
        match=r"^here: gguf writes LTX-2's native names, which ComfyUI reads, and this model has diffusers'",
    ):
        name_table(LTX, "native", FORMAT_INFO["gguf"]).renamer(["audio_time_embed.linear.weight"], "here")
    with pytest.raises(InputError, match=rf"tensor '{PREFIX}odd.weight' has no counterpart"):
        runnable_names(
            LTX, [f"{PREFIX}audio_adaln_single.linear.weight", f"{PREFIX}odd.weight"], Path("here")
        )


# -- detection and examples ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The tiny examples of both generations in both layouts (`SOURCES`), as `quantize example` writes them."""
    root = tmp_path_factory.mktemp("ltx2")
    for key, (preset, layout) in SOURCES.items():
        run_cli("example", root / key, "--family", "ltx2", "--preset", preset, "--layout", layout, check=True)
    return {key: root / key for key in SOURCES}


@pytest.mark.parametrize("source", ["release-2.3", "diffusers-2.3", "release-2.5", "diffusers-2.5"])
def test_ltx23_and_25_are_detected_in_both_layouts(sources, source):
    """LTX-2.3's and 2.5's structures are layouts of LTX-2's (the family contract holds the tiny examples of 2.0 to
    the rest)."""
    (found,) = detect_layouts(sources[source])
    assert (found.name, found.family) == (LAYOUTS[SOURCES[source][1]], "ltx2")


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("release", "ltx-2-19b-dev"),
        ("release-2.3", "ltx-2.3-22b-dev"),
        ("release-2.5", "ltx-2.5-22b-dev-transformer-bf16"),
    ],
)
def test_the_release_is_one_file_that_comfyui_builds_exactly_and_diffusers_detects(sources, source, name):
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES

    (path,) = sources[source].glob("*.safetensors")
    assert path.name == f"{name}.safetensors" and not (sources[source] / "config.json").exists()
    with safe_open(path, "pt") as f:
        state, metadata = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}, f.metadata()
    detected = comfyui_detects(state, metadata)
    assert detected["image_model"] == "ltxav" and detected["num_layers"] == 48
    v23 = source.endswith(
        ("2.3", "2.5")
    )  # the switches LTX-2.3's own file names (its metadata config's transformer section)
    assert all(detected.get(k, False) is v23 for k in ("apply_gated_attention", "cross_attention_adaln", "caption_proj_before_connector", "connector_apply_gated_attention"))  # fmt: skip
    if v23:
        assert detected["caption_projection_first_linear"] is False
    # LTX-2.5's: ComfyUI reads the feed-forward's bias off the metadata, the keyframes' off the tensor
    if source.endswith("2.5"):
        assert {k: detected[k] for k in LTX25_COMFYUI_SWITCHES} == LTX25_COMFYUI_SWITCHES
        assert f"{PREFIX}transformer_blocks.0.ff.net.0.proj.bias" not in state
        assert f"{PREFIX}transformer_blocks.0.audio_ff.net.0.proj.bias" in state
    assert comfyui_state(detected) == unet_part(
        state
    )  # ComfyUI builds exactly this transformer and its connectors
    assert any(k in state for k in CHECKPOINT_KEY_NAMES["ltx2"])  # diffusers' single-file detection


@pytest.mark.parametrize(
    "preset", ["tiny", "small", "19b", "tiny-2.3", "22b", "tiny-2.5", "comfyui-2.5", "22b-2.5"]
)
def test_examples_have_the_dimensions_comfyui_fixes(preset):
    """32 heads (ComfyUI's attention_head_dim = to_k rows // 32), 128 latent channels; the 19B without metadata is
    exactly what ComfyUI's defaults build (the release's own dimensions); LTX-2.3's structure only with it (ComfyUI
    reads no tensor for its switches)."""
    (model,) = examples_of(LTX).models(preset, "release")
    state = dict(model.tensors)
    detected = comfyui_detects(state, dict(model.metadata))
    assert comfyui_state(detected) == unet_part(state)
    assert comfyui_detects(state, None)["attention_head_dim"] == detected["attention_head_dim"]
    if preset == "19b":
        assert comfyui_state(comfyui_detects(state, None)) == unet_part(state)
        assert detected["cross_attention_dim"] == 4096 and detected["attention_head_dim"] == 128
    if (
        preset == "22b"
    ):  # ltx-2.3-22b-dev's dimensions: the 19B's, its connectors 32 heads of 128 / 64, 8 layers
        assert {k: detected[k] for k in ("cross_attention_dim", "attention_head_dim", "audio_connector_attention_head_dim", "connector_num_layers")} == {  # fmt: skip
            "cross_attention_dim": 4096, "attention_head_dim": 128, "audio_connector_attention_head_dim": 64,
            "connector_num_layers": 8,
        }  # fmt: skip
    if preset in ("tiny-2.3", "22b", "tiny-2.5", "comfyui-2.5", "22b-2.5"):
        assert comfyui_state(comfyui_detects(state, None)) != unet_part(state)
    # ltx-2.5-22b-dev-transformer-bf16.safetensors as published: 4349 tensors, the keyframes' row [1, 4096]
    if preset == "22b-2.5":
        assert len(state) == 4349 and state[f"{PREFIX}keyframes_abs_pos_embedding"] == (1, 4096)


@pytest.mark.parametrize("version", ["", "-2.3", "-2.5"])
def test_the_config_read_off_the_release_builds_diffusers_class_with_every_transformer_tensor_in_place(
    sources, version
):
    import diffusers

    comp = open_component(sources[f"release{version}"], ".")
    config = LTX.diffusers_config({}, comp.tensors, comp.dir)
    with torch.device("meta"):
        built = diffusers.LTX2VideoTransformer3DModel.from_config(config)
    renamed = {LTX.diffusers_name(k): t.shape for k, t in comp.tensors.items() if not LTX.carried(k)}
    assert renamed == {k: tuple(v.shape) for k, v in built.state_dict().items()}
    diffusers_config = json.loads(
        (sources[f"diffusers{version}"] / "transformer" / "config.json").read_text()
    )
    assert {k: diffusers_config[k] for k in config} == config
    # the structure's switches and the text widths as diffusers' own conversion sets them for the generation
    switches = {k: config[k] for k in LTX23_SWITCHES}
    assert switches == (LTX23_SWITCHES if version else {k: not v for k, v in LTX23_SWITCHES.items()})
    assert config["caption_channels"] == (3840 if version else 64) and config["use_prompt_adaln_single"]
    assert (config["num_attention_heads"], config["attention_head_dim"]) == ((32, 4) if version else (32, 2))
    v25 = (
        version == "-2.5"
    )  # its switches read off the tensors: no video feed-forward bias, the keyframes' row
    assert {k: config[k] for k in LTX25_SWITCHES} == (LTX25_SWITCHES if v25 else {k: not v for k, v in LTX25_SWITCHES.items()})  # fmt: skip
    assert config["audio_ff_bias"]


# -- the bundled recipes ----------------------------------------------------------------------------------------

#: what every LTX-2 recipe quantizes, written out again: blocks 2..45, the six attentions' projections, both FFNs
QUANTIZED = {
    "release": re.compile(
        r"model\.diffusion_model\.transformer_blocks\.([2-9]|[1-3]\d|4[0-5])\.((audio_)?attn[12]|audio_to_video_attn"
        r"|video_to_audio_attn)\.(to_q|to_k|to_v|to_out\.0)|model\.diffusion_model\.transformer_blocks\.([2-9]|[1-3]\d|"
        r"4[0-5])\.(audio_)?ff\.net\.(0\.proj|2)"
    ),
    "diffusers": re.compile(
        r"transformer_blocks\.([2-9]|[1-3]\d|4[0-5])\.((audio_)?attn[12]|audio_to_video_attn|video_to_audio_attn)\."
        r"(to_q|to_k|to_v|to_out\.0)|transformer_blocks\.([2-9]|[1-3]\d|4[0-5])\.(audio_)?ff\.net\.(0\.proj|2)"
    ),
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_each_bundled_recipe_quantizes_the_middle_blocks_and_keeps_the_rest(sources, source):
    layout = SOURCES[source][1]
    for fmt, recipe in default_recipes()[LAYOUTS[layout]].items():
        if layout == "diffusers" and fmt in NATIVE_FORMATS:
            continue  # a transformer/ alone is refused them; with connectors/ beside: the pipeline tests below
        (cp,) = make_plan(sources[source], load_recipe(recipe).recipe).components
        assert cp.rel == ("." if layout == "release" else "transformer")
        quantized = {t.module: t for t in cp.tensors if t.quantize}
        linears = {k.removesuffix(".weight") for k, t in cp.component.tensors.items() if k.endswith(".weight") and len(t.shape) == 2}  # fmt: skip
        assert set(quantized) == {m for m in linears if QUANTIZED[layout].fullmatch(m)}, fmt
        assert len(quantized) == 44 * (6 * 4 + 4)
        assert not any(LTX.carried(t.name) for t in cp.tensors if t.quantize)
        if source.endswith(
            ("2.3", "2.5")
        ):  # LTX-2.3's gates and prompt adaLN are there, kept as every adaLN is
            gates = {
                m for m in linears if m.endswith(".to_gate_logits") and ".transformer_blocks." in f".{m}"
            }
            prompt = {m for m in linears if re.search(r"(^|\.)(audio_)?prompt_adaln(_single)?\.", m)}
            assert len(gates) == 48 * 6 and len(prompt) == 2 * 3 and not (gates | prompt) & set(quantized), (
                fmt
            )
            tables = {t.name for t in cp.tensors if t.name.endswith("prompt_scale_shift_table")}
            assert len(tables) == 48 * 2 and not any(t.quantize for t in cp.tensors if t.name in tables)
        if fmt == "comfy_nvfp4":
            mxfp8 = {m for m, t in quantized.items() if t.options.type_name == "mxfp8"}
            assert mxfp8 == {m for m in quantized if m.endswith("ff.net.2")} and len(mxfp8) == 88


# -- every format, through the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(layout: str, fmt: str) -> Path:
        if (layout, fmt) not in made:
            out = tmp_path_factory.mktemp(f"ltx2-{layout}-{fmt}") / "out"
            run_cli("convert", sources[layout], out, "--format", fmt, check=True)
            made[layout, fmt] = out
        return made[layout, fmt]

    return get


@pytest.fixture(scope="module")
def references(sources):
    """A release (`SOURCES` key) in float32 as diffusers' class, and its output on the family's inputs."""
    import diffusers

    made = {}

    def get(source: str = "release"):
        if source not in made:
            comp = open_component(sources[source], ".")
            config = LTX.diffusers_config({}, comp.tensors, comp.dir)
            model = diffusers.LTX2VideoTransformer3DModel.from_config(config).eval()
            model.load_state_dict(
                {LTX.diffusers_name(k): read_tensor(i).float() for k, i in comp.tensors.items() if not LTX.carried(k)},
                strict=True,
            )  # fmt: skip
            x = load_inputs(None, LTX, model.config)
            with torch.no_grad():
                want = model(**LTX.inputs.call(model.config, x))[0]
            made[source] = model, x, want
        return made[source]

    return get


@pytest.fixture(scope="module")
def reference(references):
    """The LTX-2.0 release's (`references`)."""
    return references("release")


def _output_file(out: Path, layout: str) -> Path:
    comp = out if layout.startswith("release") else out / "transformer"
    (path,) = [p for p in comp.iterdir() if p.suffix in (".safetensors", ".gguf")]
    return path


@pytest.mark.parametrize("source", ["release", "release-2.3"])  # LTX-2.5's: by diffusers and the real ComfyUI
@pytest.mark.parametrize("fmt", ["comfy_fp8", "gguf"])
def test_verify_forward_runs_the_release_and_our_loader_computes_its_figure(
    sources, converted, references, fmt, source
):
    import diffusers

    from loaders import load_quantized

    out = converted(source, fmt)
    proc = run_cli("verify", out, "--source", sources[source], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    print(f"{source} {fmt}: forward SQNR {reported} dB")
    model, x, want = references(source)
    with torch.no_grad():
        exact = load_quantized(
            diffusers.LTX2VideoTransformer3DModel, out, dtype=torch.float32, compute="dequantize"
        )
        got = exact(**LTX.inputs.call(model.config, x))[0]
    assert reported > 20 and round(forward_sqnr_db(want, got), 3) == reported


@pytest.mark.parametrize("fmt", FORMATS)
def test_our_loader_runs_every_format_of_the_release_and_the_other_parts_are_carried_bit_for_bit(sources, converted, reference, fmt):  # fmt: skip
    import diffusers

    from loaders import QuantizedLinear, load_quantized

    out = converted("release", fmt)
    model, x, want = reference
    with torch.no_grad():
        loaded = load_quantized(
            diffusers.LTX2VideoTransformer3DModel, out, dtype=torch.float32, compute="dequantize"
        )
        assert any(isinstance(m, QuantizedLinear) for m in loaded.modules())
        got = loaded(**LTX.inputs.call(model.config, x))[0]
    assert forward_sqnr_db(want, got) > 15
    path = _output_file(out, "release")
    source = load_all(sources["release"])
    carried = {k: v for k, v in source.items() if LTX.carried(k)}
    if fmt == "gguf":  # every tensor is there; what GGUF stores as F32 holds the same values
        reader = gguf.GGUFReader(path)
        stored = {t.name: t for t in reader.tensors}
        for k, v in carried.items():
            t = stored[k]
            if t.tensor_type == gguf.GGMLQuantizationType.F32:
                assert torch.equal(torch.from_numpy(t.data.copy()).reshape(v.shape), v.float()), k
        return
    with safe_open(path, "pt") as f:
        assert f.metadata()["config"] == safe_open(next(sources["release"].glob("*.safetensors")), "pt").metadata()["config"]  # fmt: skip
        assert all(torch.equal(f.get_tensor(k), v) for k, v in carried.items())


@pytest.mark.parametrize(
    ("source", "fmt"),
    [("release", f) for f in NATIVE_FORMATS] + [("release-2.3", f) for f in ("comfy_fp8", "gguf")] + [("release-2.5", "comfy_fp8")],
)  # fmt: skip
def test_comfy_and_gguf_files_of_the_release_hold_what_comfyui_detects(sources, converted, fmt, source):
    (release,) = examples_of(LTX).models(SOURCES[source][0], "release")
    want = comfyui_detects(dict(release.tensors), dict(release.metadata))
    path = _output_file(converted(source, fmt), source)
    if fmt == "gguf":
        reader = gguf.GGUFReader(path)
        assert reader.fields["general.architecture"].contents() == "ltxv"  # in ComfyUI-GGUF's IMG_ARCH_LIST
        state = {t.name: dict(release.tensors)[t.name] for t in reader.tensors}  # shapes as the source's
        # what ComfyUI-GGUF (since its PR #399) hands ComfyUI as the file's metadata: its string key-values
        metadata = {
            k: f.contents() for k, f in reader.fields.items() if f.types == [gguf.GGUFValueType.STRING]
        }
        assert metadata["config"] == release.metadata["config"]  # carried: ComfyUI builds the model from it
    else:
        with safe_open(path, "pt") as f:
            state = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            markers = {k.removesuffix(".comfy_quant") for k in f.keys() if k.endswith(".comfy_quant")}
            metadata = f.metadata()
        assert metadata["config"] == release.metadata["config"]  # carried: ComfyUI builds the model from it
        assert (
            markers == {m for m in markers if QUANTIZED["release"].fullmatch(m)} and len(markers) == 44 * 28
        )
        # the layers' markers are the file's tensors alone: ComfyUI's Load Diffusion Model would apply a
        # `_quantization_metadata` again after stripping model.diffusion_model., under names its model lacks
        assert "_quantization_metadata" not in metadata
    names = {n for n in state if not n.endswith(COMFY_PARTS)}
    assert names == {n for n, _ in release.tensors}  # the whole release, every name as it was
    assert comfyui_detects(state, metadata) == want
    if fmt != "gguf":
        # ComfyUI builds the same model from it: every unet tensor there, a quantized weight of its layer's shape
        source = dict(release.tensors)
        unet_state = {
            k: source[k] if k.removesuffix(".weight") in markers else shape
            for k, shape in state.items()
            if k.startswith(PREFIX) and not k.endswith(COMFY_PARTS)
        }
        assert comfyui_state(want) == unet_state


@pytest.mark.parametrize("fmt", NATIVE_FORMATS)
def test_the_diffusers_layout_is_refused_comfyui_and_gguf_at_plan_time_saying_why(sources, tmp_path, fmt):
    """ComfyUI's model holds the text connectors, which diffusers keeps outside transformer/: a file made from
    it with no connectors/ beside it would load with them missing. Refused by --format and by a recipe of one's
    own, nothing written."""
    out = tmp_path / "out"
    proc = run_cli("convert", sources["diffusers"], out, "--format", fmt)
    assert proc.returncode == 2 and "(in connectors/, not found beside it)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
    recipe = tmp_path / "own.yaml"
    gguf_type = {"type": "Q8_0"} if fmt == "gguf" else {}
    recipe.write_text(edited_recipe("ltx2-diffusers-fp8", format=fmt, copy_other_files=False, **gguf_type))
    proc = run_cli("convert", sources["diffusers"], out, "--recipe", recipe)
    assert (
        proc.returncode == 2 and "this model has diffusers' LTX2VideoTransformer3DModel names" in proc.stderr
    )
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("source", ["diffusers", "diffusers-2.5"])
def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(converted, source):
    import diffusers

    comp = converted(source, "torchao_fp8") / "transformer"
    model = diffusers.LTX2VideoTransformer3DModel.from_pretrained(comp, torch_dtype=torch.bfloat16)
    x = {k: v.to(torch.bfloat16) for k, v in load_inputs(None, LTX, model.config).items()}
    call = LTX.inputs.call(model.config, x)
    if source.endswith(
        "2.5"
    ):  # its keyframes' position, on the first latent frame; no video feed-forward bias
        assert (
            model.config.use_keyframes_abs_pos_embedding
            and model.transformer_blocks[2].ff.net[2].bias is None
        )
        mask = torch.zeros(1, x["hidden_states"].shape[1], 1, dtype=torch.bfloat16)
        call["video_keyframes_mask"] = mask.index_fill(1, torch.tensor([0]), 1.0)
    with torch.no_grad():
        video, audio = model(**call)
    assert video.shape == x["hidden_states"].shape and audio.shape == x["audio_hidden_states"].shape
    assert torch.isfinite(video).all() and torch.isfinite(audio).all()
    assert type(model.transformer_blocks[2].attn1.to_q.weight).__name__ == "Float8Tensor"
    assert type(model.transformer_blocks[0].attn1.to_q.weight).__name__ == "Parameter"  # block 0 kept


def test_the_gguf_loads_in_diffusers_from_single_file_and_runs_close_to_the_source(
    converted, reference, tmp_path
):
    import diffusers

    model, x, want = reference
    config = tmp_path / "config" / "transformer"
    config.mkdir(parents=True)
    (config / "config.json").write_text(json.dumps(dict(model.config)))
    loaded = diffusers.LTX2VideoTransformer3DModel.from_single_file(
        str(_output_file(converted("release", "gguf"), "release")), config=str(config.parent), subfolder="transformer",
        quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.bfloat16), torch_dtype=torch.bfloat16,
    )  # fmt: skip
    bf16 = {k: v.to(torch.bfloat16) for k, v in x.items()}
    with torch.no_grad():
        y = loaded(**LTX.inputs.call(model.config, bf16))[0].float()
    assert forward_sqnr_db(want, y) > 20


def test_sensitivity_runs_on_the_release_and_proposes_a_recipe(sources, tmp_path):
    proposal = tmp_path / "proposal.yaml"
    proc = run_cli(
        "sensitivity", sources["release"], "--recipe", "ltx2-comfy-int8", "--min-forward-sqnr", "40",
        "--write-recipe", proposal, "--top", "3", check=True,
    )  # fmt: skip
    assert "forward SQNR of the recipe" in proc.stdout
    assert load_recipe(str(proposal)).recipe.format == "comfy_int8"


def test_a_release_that_is_not_one_is_named(tmp_path):
    infos = {f"{PREFIX}audio_adaln_single.linear.weight": TensorInfo("x", "BF16", (6, 1), Path("x"), 0, 0)}
    with pytest.raises(InputError, match=rf"no tensor '{PREFIX}patchify_proj.weight': not an LTX-2 release"):
        LTX.diffusers_config({}, infos, tmp_path)


# -- a diffusers pipeline (transformer/ and connectors/) to ComfyUI's and GGUF files ---------------------------------

#: diffusers' conversion script's connector renames (scripts/convert_ltx2_to_diffusers.py,
#: LTX_2_0_CONNECTORS_KEYS_RENAME_DICT, applied by str.replace in order, the release's prefix stripped first) and the
#: ones its 2.3 conversion adds for the per-modality text projections
CONNECTOR_RENAMES = {
    "connectors.": "",
    "video_embeddings_connector": "video_connector",
    "audio_embeddings_connector": "audio_connector",
    "transformer_1d_blocks": "transformer_blocks",
    "text_embedding_projection.aggregate_embed": "text_proj_in",
    "text_embedding_projection.video_aggregate_embed": "video_text_proj_in",
    "text_embedding_projection.audio_aggregate_embed": "audio_text_proj_in",
    "q_norm": "norm_q",
    "k_norm": "norm_k",
}
CONNECTOR_PARTS = (
    f"{PREFIX}video_embeddings_connector.", f"{PREFIX}audio_embeddings_connector.", "text_embedding_projection."
)  # fmt: skip


def pipeline_of_release(release: Path, preset: str, out: Path) -> Path:
    """The diffusers pipeline folder diffusers' own conversion makes of an example release: ``transformer/`` through
    its single-file converter (`diffusers_converts`), ``connectors/`` through its script's renames, each with its
    config; the same tensors, bytes for bytes. The connectors' names are held to `LTX2TextConnectors`' own."""
    import torch
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from safetensors.torch import save_file

    (path,) = release.glob("*.safetensors")
    with safe_open(path, "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    own = [k for k in stored if k.startswith(PREFIX) and not k.startswith(CONNECTOR_PARTS)]
    transformer = {new: stored[old] for old, new in ltx2_diffusers_names([k[len(PREFIX):] for k in own]).items() for old in [PREFIX + old]}  # fmt: skip
    connectors = {}
    for k in (k for k in stored if k.startswith(CONNECTOR_PARTS)):
        new = k.removeprefix(PREFIX)
        for a, b in CONNECTOR_RENAMES.items():
            new = new.replace(a, b)
        connectors[new] = stored[k]
    config = connectors_config(examples_of("ltx2").presets[preset])
    with torch.device("meta"):
        built = LTX2TextConnectors(**{k: v for k, v in config.items() if not k.startswith("_")})
    assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == {
        k: tuple(v.shape) for k, v in connectors.items()
    }
    infos = {k: TensorInfo(k, "BF16", tuple(v.shape), path, 0, 0) for k, v in stored.items()}
    for folder, tensors, cfg in (
        ("transformer", transformer, LTX.release_config(infos, path)),
        ("connectors", connectors, config),
    ):
        (out / folder).mkdir(parents=True)
        save_file(tensors, str(out / folder / "diffusion_pytorch_model.safetensors"), {"format": "pt"})
        (out / folder / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("source", ["release", "release-2.3"])
@pytest.mark.parametrize("fmt", ["comfy_fp8", "gguf"])
def test_a_pipeline_with_its_connectors_converts_to_the_releases_comfy_and_gguf_files(
    sources, converted, tmp_path, source, fmt
):
    """A diffusers pipeline (transformer/ and connectors/, as diffusers converts the release) gives the ComfyUI and
    GGUF file the release gives, tensor for tensor and byte for byte (the connectors and the text projection under
    the release's names, carried), but for the release's VAEs and vocoder, which the pipeline keeps in folders of
    their own; its metadata config, made of the two configs, is the release's (what ComfyUI builds the model from).
    `verify` proves it against the pipeline."""
    preset = SOURCES[source][0]
    pipeline = pipeline_of_release(sources[source], preset, tmp_path / "pipeline")
    out = tmp_path / "out"
    run_cli("convert", pipeline, out, "--format", fmt, check=True)
    run_cli("verify", out, "--source", pipeline, check=True)
    released = converted(source, fmt)
    ours, theirs = _file_tensors(out), _file_tensors(released)
    carried_elsewhere = ("vae.", "audio_vae.", "vocoder.")
    assert set(ours) == {k for k in theirs if not k.startswith(carried_elsewhere)}
    assert all(ours[k] == theirs[k] for k in ours)
    assert _transformer_config(out) == _transformer_config(released)
    # the connectors' config.json, which the file's metadata config is made of, is a source file of the manifest
    listed = {f["path"] for f in read_json(out / "quantize_manifest.json")["source_files"]}
    assert {"connectors/config.json", "connectors/diffusion_pytorch_model.safetensors"} <= listed
    config = read_json(pipeline / "connectors" / "config.json")
    (pipeline / "connectors" / "config.json").write_text(
        json.dumps({**config, "video_connector_num_attention_heads": 1})
    )
    proc = run_cli("verify", out, "--source", pipeline)
    assert proc.returncode == 1 and "connectors/config.json" in proc.stdout, proc.stdout


@pytest.mark.parametrize("preset", ["tiny", "tiny-2.3"])
def test_the_pipeline_examples_connectors_are_diffusers_own_class(preset):
    """`quantize example --layout pipeline` writes connectors/ as `LTX2TextConnectors` of its config holds it."""
    import torch
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    transformer, connectors = examples_of(LTX).models(preset, "pipeline")
    assert (transformer.component, connectors.component) == ("transformer", "connectors")
    with torch.device("meta"):
        built = LTX2TextConnectors.from_config(connectors.config)
    assert {k: tuple(v.shape) for k, v in built.state_dict().items()} == dict(connectors.tensors)


def test_a_transformer_without_its_connectors_beside_is_still_refused(sources, tmp_path):
    pipeline = pipeline_of_release(sources["release"], "tiny", tmp_path / "pipeline")
    import shutil

    shutil.rmtree(pipeline / "connectors")
    proc = run_cli("convert", pipeline, tmp_path / "out", "--format", "comfy_fp8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "(in connectors/, not found beside it)" in line and not (tmp_path / "out").exists()


def _file_tensors(out: Path) -> dict[str, bytes]:
    """Every tensor of an output's one ComfyUI or GGUF file, as its stored bytes."""
    (path,) = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".gguf") and p.parent.name != "."]
    if path.suffix == ".gguf":
        reader = gguf.GGUFReader(path)
        return {t.name: bytes(t.data.tobytes()) for t in reader.tensors}
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k).reshape(-1).view(torch.uint8).numpy().tobytes() for k in f.keys()}


def _transformer_config(out: Path) -> dict:
    """The ``transformer`` section of the metadata config the output's file carries (GGUF: its ``config`` key)."""
    (path,) = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".gguf")]
    if path.suffix == ".gguf":
        text = gguf.GGUFReader(path).fields["config"].contents()
    else:
        with safe_open(path, "pt") as f:
            text = f.metadata()["config"]
    return json.loads(text)["transformer"]


# -- LTX-2.5: its pipeline (transformer/, connectors/, text_encoder/) by one --format; bad releases -----------------


@pytest.fixture(scope="module")
def pipeline_25(tmp_path_factory) -> Path:
    """`quantize example --preset tiny-2.5 --layout pipeline`: transformer/, connectors/ (the text projection
    included, as diffusers keeps it), and the preset's text encoder in text_encoder/ with its tokenizer."""
    out = tmp_path_factory.mktemp("ltx25") / "pipeline"
    run_cli("example", out, "--family", "ltx2", "--preset", "tiny-2.5", "--layout", "pipeline", check=True)
    return out


@pytest.mark.parametrize("fmt", ["comfy_fp8", "gguf"])
def test_one_format_makes_the_ltx25_pipeline_the_releases_file_with_its_connectors_and_converts_its_encoder(
    sources, converted, pipeline_25, tmp_path, fmt
):
    """The pipeline's transformer and connectors become the release's one file (its names and metadata config, the
    text projection beside them at the root, which ComfyUI's diffusion model loader leaves to the text encoder's),
    what ComfyUI builds LTXAV of exactly; the same --format converts its text encoder where that has such a file."""
    out = tmp_path / "out"
    said = run_cli("convert", pipeline_25, out, "--format", fmt, check=True).stdout
    (release,) = examples_of(LTX).models("tiny-2.5", "release")
    ours = _file_tensors(out / "transformer")
    projection = {n for n in ours if n.startswith("text_embedding_projection.")}
    assert {n for n in ours if not n.endswith(COMFY_PARTS)} == {n for n, _ in release.tensors} | projection
    assert (
        len(projection) == 4
        and _transformer_config(out / "transformer") == json.loads(release.metadata["config"])["transformer"]
    )
    encoder = read_json(out / "quantize_manifest.json").get("nested", [])
    if fmt == "comfy_fp8":  # ComfyUI's Gemma 4 file of the encoder beside it
        assert "text_encoder/: recipe gemma4-comfy-fp8" in said and encoder == ["text_encoder"]
        path = _output_file(out, "pipeline")
        with safe_open(path, "pt") as f:
            state, metadata = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}, f.metadata()
        assert comfyui_state(comfyui_detects(state, metadata)) == {
            k: v for k, v in unet_part(state).items() if not k.endswith(COMFY_PARTS)
        } | {k: dict(release.tensors)[k] for k in unet_part(state) if k + ".comfy_quant" in state}  # fmt: skip
    else:  # ComfyUI-GGUF reads no Gemma 4: left out, saying why
        assert "text_encoder/: no bundled gguf recipe for Gemma 4" in said and not encoder


def test_one_format_converts_the_ltx25_pipelines_transformer_and_text_encoder_for_the_libraries(
    pipeline_25, tmp_path
):
    out = tmp_path / "out"
    run_cli("convert", pipeline_25, out, "--format", "torchao_fp8", check=True)
    assert read_json(out / "quantize_manifest.json")["nested"] == ["text_encoder"]
    for comp in ("transformer", "text_encoder"):
        manifest = read_json((out / comp / "quantize_manifest.json") if comp != "transformer" else out / "quantize_manifest.json")  # fmt: skip
        assert any(c["quantized"] for c in manifest["components"]), comp
    assert (out / "connectors" / "config.json").exists() and (out / "tokenizer" / "tokenizer.json").exists()


def test_a_duration_head_held_beside_the_transformer_is_carried_under_either_prefix():
    """LTX-2.5's duration head is a file of its own (ComfyUI's ModelPatchLoader reads it); a file holding it beside
    the transformer keeps it as stored: no diffusers name, never converted."""
    for name in (f"{PREFIX}duration_head.attention_pooler.query_tokens", "duration_head.mlp_out.weight"):
        assert LTX.carried(name) and LTX.diffusers_name(name) is None


def _broken_release(sources, tmp_path: Path, edit: str) -> Path:
    """The tiny-2.5 release, truncated, or without one tensor of block 7."""
    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    (path,) = sources["release-2.5"].glob("*.safetensors")
    target = bad / path.name
    if edit == "truncated":
        target.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        with safe_open(path, "pt") as f:
            state = {
                k: f.get_tensor(k) for k in f.keys() if k != f"{PREFIX}transformer_blocks.7.ff.net.2.weight"
            }
            save_file(state, target, metadata=f.metadata())
    return bad


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ("truncated", "ltx-2.5-22b-dev-transformer-bf16.safetensors: tensor data ends at byte"),
        (
            "missing",
            f"no tensor '{PREFIX}transformer_blocks.7.ff.net.2.weight', which block 0 has: a partial LTX-2",
        ),
    ],
)
@pytest.mark.parametrize("fmt", ["comfy_fp8", "torchao_fp8"])
def test_a_broken_ltx25_release_is_one_line_exit_2_and_nothing_is_written(sources, tmp_path, edit, said, fmt):
    bad = _broken_release(sources, tmp_path, edit)
    proc = run_cli("convert", bad, tmp_path / "out", "--format", fmt)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert said in line and str(bad) in line, line
    assert not (tmp_path / "out").exists()
