"""MiniMax-H3: its native names (the single-file release's, which ComfyUI reads) against diffusers' own single-file
converter, its two layouts (the release's one file, diffusers' ``transformer/``), its recipes, the formats each
layout converts to and the ones refused, the forward pass and our loader on both namings.

The oracle of the name table is ``diffusers.loaders.single_file_utils.convert_minimax_h3_transformer_checkpoint_to_
diffusers`` (``qkv_layout="stacked"``, the release's); ComfyUI's detection rule (``comfy/model_detection.py``, the
'MiniMax H3' branch) is spelled in tests/oracles/comfyui_minimax_h3.py. ComfyUI itself is not needed (nor on PyPI).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from quantize.models import get_family, stack_rows
from quantize.models.examples import examples_of
from quantize.plan import make_plan
from quantize.read.checkpoint import open_component, read_tensor
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import load_all, read_json, run_cli
from tests.oracles.comfyui_minimax_h3 import COMFYUI_DEFAULTS, comfyui_minimax

MM = get_family("minimax-h3")
ORIGINAL_FORMATS = [
    "fp8_channel",
    "torchao_fp8",
    "torchao_int8",
    "nf4",
    "comfy_fp8",
    "comfy_int8",
    "comfy_nvfp4",
    "comfy_mxfp8",
]
DIFFUSERS_FORMATS = ORIGINAL_FORMATS[:4]
COMFY = ORIGINAL_FORMATS[4:]
LAYOUT = {"original": "minimax-h3", "diffusers": "minimax-h3-diffusers"}


# -- diffusers' converter, the oracle of the name table ------------------------------------------------------------


def oracle(native: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    return convert_minimax_h3_transformer_checkpoint_to_diffusers(dict(native), config, qkv_layout="stacked")


def _random_native(preset: str) -> dict[str, torch.Tensor]:
    (model,) = examples_of(MM).models(preset, "original")
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(shape, generator=g) for n, shape in model.tensors}


def _config_of(native: dict[str, torch.Tensor]) -> dict:
    from quantize.read.checkpoint import TensorInfo

    infos = {n: TensorInfo(n, "F32", tuple(t.shape), Path("x"), 0, 0) for n, t in native.items()}
    return MM.diffusers_config({}, infos, Path("x"))


# -- the name table against the oracle ---------------------------------------------------------------------------


def test_every_native_name_the_oracle_maps_one_to_one_is_the_tables_and_the_fused_ones_are_qkv_and_fc1():
    import diffusers

    native = _random_native("tiny")
    config = _config_of(native)
    converted = oracle(native, config)
    built = diffusers.MiniMaxH3Transformer3DModel.from_config(config).state_dict()
    assert {k: tuple(v.shape) for k, v in converted.items()} == {k: tuple(v.shape) for k, v in built.items()}
    by_id = {id(t): n for n, t in native.items()}
    one_to_one = {by_id[id(t)]: d for d, t in converted.items() if id(t) in by_id}
    for n, d in one_to_one.items():
        assert MM.diffusers_name(n) == d and MM.native_name(d) == n
    rest = set(native) - set(one_to_one)
    fused = {n for n in rest if n != "rope.inv_freq"}
    assert fused == {
        n
        for n in native
        if re.fullmatch(r"(token_refiner\.)?blocks\.\d+\.(attn\.qkv_proj|mlp\.fc1)\.weight", n)
    }
    assert "rope.inv_freq" not in converted and MM.carried("rope.inv_freq")  # diffusers computes it
    # each fused tensor, cut by the table's row ranges, is the oracle's tensors exactly
    for n in fused:
        stack = MM.names.native_stack(n)
        assert MM.diffusers_name(n) is None and stack is not None
        for d, ranges in stack_rows(stack, native[n].shape[0]).items():
            assert torch.equal(torch.cat([native[n][a:b] for a, b in ranges]), converted[d]), (n, d)
            assert MM.names.stacked_into(d) == n
    # and every diffusers tensor is one of the two
    assert set(converted) == set(one_to_one.values()) | {
        d for n in fused for d in stack_rows(MM.names.native_stack(n), native[n].shape[0])
    }


# -- examples ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "small", "33b"])
def test_examples_have_the_names_and_shapes_comfyui_detects_and_diffusers_builds(preset):
    (original,) = examples_of(MM).models(preset, "original")
    state = dict(original.tensors)
    detected = comfyui_minimax(state)
    assert (detected["latents_dim"], detected["audio_latents_dim"], detected["text_dim"]) == (24, 32, 5120)
    assert detected["timestep_input_dim"] == 256
    assert (
        6 * detected["rope_inv_freq_len"] <= detected["attention_head_dim"]
    )  # the rotated channels fit a head
    if preset == "33b":
        assert detected == COMFYUI_DEFAULTS
    assert original.component == "." and original.config is None and original.stem == "minimax_h3_bf16"
    (diffusers_model,) = examples_of(MM).models(preset, "diffusers")
    assert diffusers_model.component == "transformer"
    assert diffusers_model.config["_class_name"] == "MiniMaxH3Transformer3DModel"
    # the release's tensors, through the table (fused ones cut), are the class's; rope.inv_freq aside
    through = {d for n in state if (stack := MM.names.native_stack(n)) for d, _, _ in stack}
    through |= {MM.diffusers_name(n) for n in state if not MM.names.native_stack(n) and not MM.carried(n)}
    assert through == {n for n, _ in diffusers_model.tensors}


# -- the sources, detection and recipes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mm")
    for layout in ("original", "diffusers"):
        run_cli(
            "example",
            root / layout,
            "--family",
            "minimax-h3",
            "--preset",
            "small",
            "--layout",
            layout,
            check=True,
        )
    return {"original": root / "original", "diffusers": root / "diffusers"}


def test_the_original_example_is_one_file_with_no_config(sources):
    assert sorted(p.name for p in sources["original"].iterdir()) == [
        "example.json",
        "minimax_h3_bf16.safetensors",
    ]


def test_the_config_read_off_the_release_is_the_diffusers_examples(sources):
    comp = open_component(sources["original"], ".")
    config = MM.diffusers_config({}, comp.tensors, comp.dir)
    assert config == read_json(sources["diffusers"] / "transformer" / "config.json") | {
        "_class_name": config["_class_name"]
    }


#: what every MiniMax-H3 recipe quantizes, written out again here: each main block's attention, SwiGLU and AdaLN
QUANTIZED = {
    "original": re.compile(r"blocks\.\d+\.(attn\.(qkv_proj|out_proj)|mlp\.(fc1|fc2)|adaln_proj\.linear)"),
    "diffusers": re.compile(
        r"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2)|adaln_proj\.linear)"
    ),
}


@pytest.mark.parametrize(
    ("layout", "fmt"),
    [("original", f) for f in ORIGINAL_FORMATS] + [("diffusers", f) for f in DIFFUSERS_FORMATS],
)
def test_each_bundled_recipe_quantizes_the_blocks_and_keeps_the_rest(sources, layout, fmt):
    recipe = load_recipe(default_recipes()[LAYOUT[layout]][fmt]).recipe
    (cp,) = make_plan(sources[layout], recipe).components
    linears = {
        k.removesuffix(".weight")
        for k, t in cp.component.tensors.items()
        if k.endswith(".weight") and len(t.shape) == 2
    }
    quantized = {t.module: t for t in cp.tensors if t.quantize}
    assert set(quantized) == {m for m in linears if QUANTIZED[layout].fullmatch(m)}
    assert len(quantized) == 4 * (5 if layout == "original" else 7)
    kept = {m for m in linears - set(quantized) if not re.match(r"token_refiner\.", m)}
    assert kept == (
        {"video_patch_proj", "audio_patch_proj", "condition_proj", "time_embedder.proj_in", "time_embedder.proj_out",
         "final_layer.adaln_proj.linear", "final_layer.video_out", "final_layer.audio_out"}
        if layout == "original"
        else {"proj_in", "audio_proj_in", "context_embedder", "time_embedder.linear_1", "time_embedder.linear_2",
              "norm_out.linear", "proj_out", "audio_proj_out"}
    )  # fmt: skip
    assert any(m.startswith("token_refiner.") for m in linears - set(quantized))  # the refiner: kept
    if fmt == "comfy_nvfp4":  # MXFP8 for the SwiGLU's down projection and the AdaLN modulation
        types = {m: t.options.type_name for m, t in quantized.items()}
        assert {m for m, t in types.items() if t == "mxfp8"} == {
            m for m in quantized if m.endswith(("fc2", "adaln_proj.linear"))
        }
        assert {t for t in types.values()} == {"mxfp8", "nvfp4"}


# -- what is refused, through the command line -----------------------------------------------------------------------


def _one_error(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("fmt", COMFY)
def test_comfy_formats_refuse_a_diffusers_named_model_at_plan_time(sources, fmt, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"format: {fmt}\ncomponents: [transformer]\ntargets: ['transformer_blocks\\.\\d+\\.attn\\.to_out\\.0']\n"
    )
    for command in (
        ("plan", sources["diffusers"], "--recipe", recipe),
        ("convert", sources["diffusers"], tmp_path / "o", "--recipe", recipe),
    ):
        line = _one_error(run_cli(*command))
        assert f"{sources['diffusers'] / 'transformer'}: {fmt} writes MiniMax-H3's native names" in line
        assert "rope.inv_freq" in line and "convert the original release" in line
    assert not (tmp_path / "o").exists()
    line = _one_error(run_cli("convert", sources["diffusers"], tmp_path / "o", "--format", fmt))
    assert f"no bundled {fmt} recipe for minimax-h3-diffusers" in line
    assert "files are written from the original release only" in line and "rope.inv_freq" in line  # why


@pytest.mark.parametrize("layout", ["original", "diffusers"])
def test_gguf_is_refused_at_plan_time_in_either_layout(sources, layout, tmp_path):
    recipe = tmp_path / "g.yaml"
    comp, target = ("transformer", "transformer_blocks") if layout == "diffusers" else (".", "blocks")
    recipe.write_text(
        f"format: gguf\ncomponents: ['{comp}']\ntype: Q8_0\ntargets: ['{target}\\.\\d+\\.mlp\\.fc2|{target}\\.\\d+\\.ff\\.net\\.2']\n"
    )
    line = _one_error(run_cli("plan", sources[layout], "--recipe", recipe))
    assert (
        "MiniMax-H3 has no GGUF architecture (ComfyUI-GGUF's loader reads only the architectures of its IMG_ARCH_LIST"
        in line
    )
    line = _one_error(run_cli("convert", sources[layout], tmp_path / "o", "--format", "gguf"))
    assert f"no bundled gguf recipe for {LAYOUT[layout]}" in line and "no GGUF architecture" in line


def test_a_pruned_release_converts_but_is_not_run(tmp_path):
    """ComfyUI's pruned "curve" files (adaln_t_table, no time embedder): diffusers' class has no such model, so a
    forward pass (sensitivity, verify --forward) refuses it in one line naming the tensor."""
    from quantize.examples import write_random_checkpoint

    (model,) = examples_of(MM).models("tiny", "original")
    tensors = [(n, s) for n, s in model.tensors if not n.startswith("time_embedder.")] + [
        ("adaln_t_table", (64, 64))
    ]
    write_random_checkpoint(tmp_path / "pruned", tensors, stem="minimax_h3_pruned")
    line = _one_error(run_cli("sensitivity", tmp_path / "pruned", "--format", "comfy_fp8"))
    assert "tensor 'adaln_t_table' has no counterpart in diffusers' MiniMaxH3Transformer3DModel" in line
    run_cli("convert", tmp_path / "pruned", tmp_path / "out", "--format", "comfy_fp8", check=True)


# -- conversions, verify --forward, diffusers and our loader -------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(layout: str, fmt: str) -> Path:
        if (layout, fmt) not in made:
            out = tmp_path_factory.mktemp(f"mm-{layout}-{fmt}") / "out"
            run_cli("convert", sources[layout], out, "--format", fmt, check=True)
            made[layout, fmt] = out
        return made[layout, fmt]

    return get


def _reference(sources):
    """diffusers' class with the source's weights in float32 (the release's through the oracle), and the inputs."""
    import diffusers

    comp = open_component(sources["original"], ".")
    native = {k: read_tensor(i).float() for k, i in comp.tensors.items()}
    config = MM.diffusers_config({}, comp.tensors, comp.dir)
    model = diffusers.MiniMaxH3Transformer3DModel.from_config(config).eval()
    model.load_state_dict(oracle(native, config), strict=True)
    return model, load_inputs(None, MM, model.config)


@pytest.mark.parametrize("fmt", DIFFUSERS_FORMATS)
def test_diffusers_outputs_verify_with_a_forward_and_our_loader_runs_them(sources, converted, fmt):
    import diffusers

    from loaders import QuantizedLinear, load_quantized

    out = converted("diffusers", fmt)
    proc = run_cli("verify", out, "--source", sources["diffusers"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    cls = diffusers.MiniMaxH3Transformer3DModel
    reference = cls.from_pretrained(sources["diffusers"] / "transformer", torch_dtype=torch.float32).eval()
    x = load_inputs(None, MM, reference.config)
    with torch.no_grad():
        want = reference(**MM.inputs.call(reference.config, x))[0]
        exact = load_quantized(cls, out / "transformer", dtype=torch.float32, compute="dequantize")
        assert any(isinstance(m, QuantizedLinear) for m in exact.modules())
        assert round(forward_sqnr_db(want, exact(**MM.inputs.call(reference.config, x))[0]), 3) == reported
        fast = load_quantized(cls, out / "transformer", dtype=torch.bfloat16)
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        y = fast(**MM.inputs.call(reference.config, bf16))[0].float()
    assert reported - 6 < forward_sqnr_db(want, y) < reported + 3, reported


def test_the_torchao_output_loads_in_diffusers_from_pretrained_and_runs(sources, converted):
    import diffusers

    comp = converted("diffusers", "torchao_fp8") / "transformer"
    model = diffusers.MiniMaxH3Transformer3DModel.from_pretrained(comp, torch_dtype=torch.bfloat16)
    x = load_inputs(None, MM, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        video, audio = model(**MM.inputs.call(model.config, x))
    assert video.shape == x["hidden_states"].shape and audio.shape == x["audio_hidden_states"].shape
    assert torch.isfinite(video).all() and torch.isfinite(audio).all()
    assert type(model.transformer_blocks[0].attn.to_q.weight).__name__ == "Float8Tensor"


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_nvfp4", "fp8_channel", "torchao_fp8", "nf4"])
def test_release_outputs_verify_with_a_forward_and_our_loader_cuts_their_fused_tensors(
    sources, converted, fmt
):
    """The release's output (its own names, qkv_proj and fc1 fused): verify --forward runs it through diffusers'
    class, and our loader builds that class from it, whose output is verify's figure against the oracle's model;
    nf4's fused weights cut too (`Nf4.cut_rows`), and run in bitsandbytes' own dequantization."""
    import diffusers

    from loaders import load_quantized

    out = converted("original", fmt)
    proc = run_cli("verify", out, "--source", sources["original"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    assert read_json(out / "config.json")["_class_name"] == "MiniMaxH3Transformer3DModel"
    reference, x = _reference(sources)
    with torch.no_grad():
        want = reference(**MM.inputs.call(reference.config, x))[0]
        exact = load_quantized(
            diffusers.MiniMaxH3Transformer3DModel, out, dtype=torch.float32, compute="dequantize"
        )
        got = exact(**MM.inputs.call(reference.config, x))[0]
        if fmt == "nf4":
            fast = load_quantized(diffusers.MiniMaxH3Transformer3DModel, out, dtype=torch.bfloat16)
            assert type(fast.transformer_blocks[0].attn.to_q).__name__ == "NF4Linear"
            bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
            y = fast(**MM.inputs.call(reference.config, bf16))[0].float()
            assert reported - 6 < forward_sqnr_db(want, y) < reported + 3, reported
    assert round(forward_sqnr_db(want, got), 3) == reported


@pytest.mark.parametrize("fmt", COMFY)
def test_comfy_files_hold_what_comfyui_detects_and_their_markers(sources, converted, fmt):
    out = converted("original", fmt)
    (path,) = out.glob("*.safetensors")
    stored = load_all(out)
    source = load_all(sources["original"])
    markers = {
        k.removesuffix(".comfy_quant"): json.loads(bytes(t.tolist()))
        for k, t in stored.items()
        if k.endswith(".comfy_quant")
    }
    assert set(markers) == {
        m for m in (k.removesuffix(".weight") for k in source) if QUANTIZED["original"].fullmatch(m)
    }
    shapes = {k: tuple(v.shape) for k, v in stored.items()}
    assert comfyui_minimax(shapes) == comfyui_minimax({k: tuple(v.shape) for k, v in source.items()})
    kept = {k: v for k, v in stored.items() if k.rpartition(".")[0] not in markers}
    assert kept and all(torch.equal(v, source[k]) for k, v in kept.items())  # rope.inv_freq among them
    assert "rope.inv_freq" in kept


def test_sensitivity_runs_on_both_layouts_and_proposes_a_recipe(sources, tmp_path):
    for layout, recipe in (("original", "minimax-h3-comfy-nvfp4"), ("diffusers", "minimax-h3-diffusers-nf4")):
        proposal = tmp_path / f"{layout}.yaml"
        proc = run_cli(
            "sensitivity", sources[layout], "--recipe", recipe, "--min-forward-sqnr", "20",
            "--write-recipe", proposal, "--top", "3", check=True,
        )  # fmt: skip
        assert re.search(r"forward SQNR of the recipe in \S+: [\d.]+ dB", proc.stdout)
        assert load_recipe(str(proposal)).recipe.format == load_recipe(recipe).recipe.format


def test_our_loader_refuses_in_one_line_a_fused_nf4_weight_cut_inside_a_group_of_block_scales(tmp_path):
    """The tiny example's q, k and v are 96 rows of 128: 12288 weights, where nf4 codes its block scales in groups
    of 16384 (the release's, 7168 x 5376, and the small example's fall on groups)."""
    import diffusers

    from loaders import CheckpointMismatchError, load_quantized

    source, out, recipe = tmp_path / "tiny", tmp_path / "out", tmp_path / "qkv-nf4.yaml"
    run_cli("example", source, "--family", "minimax-h3", "--preset", "tiny", check=True)
    # its out_proj (96 inputs) is no nf4 width: q, k and v alone
    recipe.write_text("name: qkv-nf4\nformat: nf4\ntargets: ['blocks\\.\\d+\\.attn\\.qkv_proj']\n")
    run_cli("convert", source, out, "--recipe", recipe, check=True)
    with pytest.raises(CheckpointMismatchError) as e:
        load_quantized(diffusers.MiniMaxH3Transformer3DModel, out)
    (line,) = str(e.value).splitlines()
    assert "'blocks.0.attn.qkv_proj.weight' (nf4) stacks several of the model's Linears" in line
    assert (
        "cannot be cut into 'transformer_blocks.0.attn.to_q': nf4 codes a weight's block scales in groups of "
        "16384 weights, and row 96 of [288, 128] (12288 weights in) is inside one"
    ) in line
