"""Wan2.2 Animate (`WanAnimateTransformer3DModel`) as a family of its own.

Oracle: diffusers' single-file converter for this class, ``convert_wan_transformer_to_diffusers`` (its
``single_file_model.py`` maps ``WanAnimateTransformer3DModel`` to it; ``convert_wan_animate_2_transformer_to_diffusers``
is for ``WanAnimate2Transformer3DModel``, another model). ComfyUI's rule (``comfy/model_detection.py``, the 'Wan 2.1'
branch: ``model_type`` "animate" by ``face_adapter.fuser_blocks.0.k_norm.weight``; ``comfy/ldm/wan/model_animate.py``
``AnimateWanModel``, which fixes the motion and face encoders) is spelled in tests/oracles/comfyui_wan.py;
ComfyUI-GGUF's ``IMG_ARCH_LIST`` holds ``wan``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import pytest
import torch
from safetensors import safe_open

from quantize.formats import FORMAT_INFO
from quantize.models import family_of, get_family, runnable_names, runnable_stacks
from quantize.models.examples import examples_of
from quantize.models.wan_animate import not_one_to_one
from quantize.plan import make_plan
from quantize.read.checkpoint import TensorInfo, open_component, read_tensor
from quantize.read.gguf import open_gguf_component
from quantize.recipes import default_recipes, load_recipe
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import run_cli
from tests.helpers.forward import FAST_MARGIN_DB, bf16_floor
from tests.helpers.recipes import edited_recipe
from tests.oracles.comfyui_wan import CONVS, comfyui_animate, comfyui_animate_shapes

ANIMATE = get_family("wan-animate")
FORMATS = [
    "fp8_channel", "torchao_fp8", "torchao_int8", "nf4",
    "comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "gguf",
]  # fmt: skip
NATIVE_FORMATS = [f for f in FORMATS if f.startswith("comfy_") or f == "gguf"]
SOURCE_FORMATS = [f for f in FORMATS if f not in NATIVE_FORMATS]
COMFY_PARTS = (".comfy_quant", ".weight_scale", ".weight_scale_2", ".input_scale")
#: kind -> (example layout, detected layout)
LAYOUTS = {"native": ("animate", "wan-animate"), "diffusers": ("diffusers", "wan-animate-diffusers")}


def _infos(model) -> dict[str, TensorInfo]:
    return {n: TensorInfo(n, "BF16", s, Path("x"), 0, 0) for n, s in model.tensors}


# -- the name table, through diffusers' own converter ----------------------------------------------------------


def test_every_name_maps_as_diffusers_own_converter_maps_it():
    """Each release tensor is one of the class's under its converter's name (the motion encoder's biases with
    size-1 dims the class lacks), or linear1_kv, whose row halves are to_k and to_v (`Blocks.stacked`), or a blur
    kernel, which the class computes (`carried`); a diffusers tensor with no one native one is refused by what it
    is, for diffusers -> native only."""
    import diffusers
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    from quantize.models import same_but_size_one_dims, stack_rows
    from quantize.models.examples import examples_of

    (model,) = examples_of(ANIMATE).models("tiny", "animate")
    g = torch.Generator().manual_seed(0)
    native = {n: torch.randn(s, generator=g) for n, s in model.tensors}
    oracle = convert_wan_transformer_to_diffusers(dict(native))
    with torch.device("meta"):
        built = diffusers.WanAnimateTransformer3DModel.from_config(
            ANIMATE.diffusers_config(model.config, _infos(model), Path("x"))
        )
    state = {k: tuple(v.shape) for k, v in built.state_dict().items()}
    kernels = {n for n in native if n.endswith(".kernel")}
    assert set(oracle) == set(state) | kernels and len(kernels) == 14  # the converter leaves the blur kernels
    stacks = runnable_stacks(ANIMATE, list(native))
    renamed = runnable_names(ANIMATE, list(native), Path("x"))
    assert set(renamed) | set(stacks) | kernels == set(native)
    odd = {"kv": 0, "bias": 0, "kernel": 0}
    for name, value in native.items():
        if name in stacks:  # to_k the first half of the rows, to_v the second, as the converter splits it
            for part, ranges in stack_rows(stacks[name], value.shape[0]).items():
                assert torch.equal(oracle[part], torch.cat([value[a:b] for a, b in ranges])), part
            assert [p for p, _, _ in stacks[name]] == [
                name.replace("fuser_blocks.", "").replace("linear1_kv", p) for p in ("to_k", "to_v")
            ]
            odd["kv"] += 1
        elif ANIMATE.carried(name):
            assert name in kernels and name in oracle and name not in state  # no place in diffusers' class
            odd["kernel"] += 1
        else:  # one tensor, one name: the converter's, the same values
            ours = renamed[name]
            assert torch.equal(oracle[ours].reshape(value.shape), value) and ANIMATE.native_name(ours) == name
            if state[ours] != tuple(value.shape):  # [1, C, 1, 1] -> [C]
                assert same_but_size_one_dims(value.shape, state[ours]) and ours.endswith(".act_fn.bias")
                assert value.shape[::2] == (1, 1) and not_one_to_one(ours) is not None
                odd["bias"] += 1
    assert odd == {"kv": 2, "bias": 15, "kernel": 14}
    # the other way: every diffusers tensor has its native tensor, a name or rows of a stack; those that are not
    # one native tensor as they are (the halves, the [C] biases) are refused when writing native names
    for key in state:
        native_name = ANIMATE.native_name(key) or ANIMATE.names.stacked_into(key)
        assert native_name in native, key
        halves = ANIMATE.names.stacked_into(key) is not None
        assert (not_one_to_one(key) is not None) == (halves or state[key] != tuple(native[native_name].shape))
    # the converter the class is not mapped to gives other names (its model, WanAnimate2, has no Wan naming)
    from diffusers.loaders.single_file_utils import convert_wan_animate_2_transformer_to_diffusers

    assert "condition_embedder.time_proj.weight" not in convert_wan_animate_2_transformer_to_diffusers(
        dict(native)
    )


@pytest.mark.parametrize(
    ("config_class", "names", "family"),
    [
        ("WanModel", ["head.modulation", "face_adapter.fuser_blocks.0.linear1_q.weight"], "wan-animate"),
        ("WanModel", ["head.modulation", "blocks.0.self_attn.q.weight"], "wan"),
    ],
)
def test_a_release_naming_wans_class_is_animates_by_its_own_layers(config_class, names, family):
    """A release whose config names Wan's class is Animate's where its face adapter is there (the family contract
    holds each example to its class and names)."""
    assert family_of(config_class, names).name == family


def test_wan_claims_no_animate_model():
    wan = get_family("wan")
    for layout in ("animate", "diffusers"):
        (model,) = examples_of(ANIMATE).models("tiny", layout)
        assert wan.naming(dict(model.tensors)) is None and not wan.owns("WanModel", dict(model.tensors))


# -- examples: what ComfyUI builds ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "small", "14b"])
def test_examples_have_what_comfyui_builds(preset):
    (model,) = examples_of(ANIMATE).models(preset, "animate")
    state, config = dict(model.tensors), model.config
    detected = comfyui_animate(state)
    assert config["_class_name"] == "WanAnimateModel" and detected["in_dim"] == config["in_dim"] == 36
    assert detected["dim"] == config["dim"] and detected["num_heads"] == config["num_heads"]  # 128-wide heads
    assert state["text_embedding.0.weight"][1] == 4096 and state["time_embedding.0.weight"][1] == 256
    assert state["img_emb.proj.1.weight"] == (1280, 1280) and detected["num_layers"] % 5 == 0
    fixed = comfyui_animate_shapes(detected["dim"], detected["num_layers"])
    assert {k: state[k] for k in fixed} == fixed
    if preset == "14b":
        assert (detected["dim"], detected["num_layers"], detected["ffn_dim"]) == (5120, 40, 13824)


def test_the_diffusers_example_is_the_class_built_from_the_release():
    (release,) = examples_of(ANIMATE).models("tiny", "animate")
    (model,) = examples_of(ANIMATE).models("tiny", "diffusers")
    renamed = {ANIMATE.diffusers_name(n) for n, _ in release.tensors} - {None}
    assert model.component == "transformer" and renamed <= {n for n, _ in model.tensors}
    assert model.config["_class_name"] == "WanAnimateTransformer3DModel" and model.config["in_channels"] == 36


# -- layouts, recipes ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """sources["native" | "diffusers"]: the test example (tiny's DiT, a narrow motion encoder: what the forward passes
    here cost), as `quantize example` writes it."""
    root = tmp_path_factory.mktemp("animate")
    made = {}
    for kind, (layout, _) in LAYOUTS.items():
        made[kind] = root / layout
        run_cli(
            "example",
            made[kind],
            "--family",
            "wan-animate",
            "--preset",
            "test",
            "--layout",
            layout,
            check=True,
        )
    return made


#: what each recipe quantizes, spelled again here: (fp8 split, full split) by naming
SPLIT = {
    "native": (
        r"blocks\.\d+\.((self|cross)_attn\.(q|k|v|o|k_img|v_img)|ffn\.0)|face_adapter\.fuser_blocks\.\d+\.linear1_(q|kv)",
        r"blocks\.\d+\.((self|cross)_attn\.(q|k|v|o|k_img|v_img)|ffn\.(0|2))|face_adapter\.fuser_blocks\.\d+\.linear1_(q|kv)",
    ),
    "diffusers": (
        r"blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)|ffn\.net\.0\.proj)|face_adapter\.\d+\.to_[qkv]",
        r"blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)|ffn\.net\.(0\.proj|2))|face_adapter\.\d+\.to_[qkv]",
    ),
}  # fmt: skip
FULL = {name for name, info in FORMAT_INFO.items() if info.block_scaled}  # the block targets (ffn.2) too


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_each_bundled_recipe_quantizes_the_blocks_and_the_adapter_inputs_and_keeps_the_rest(sources, kind):
    layout = LAYOUTS[kind][1]
    for fmt, recipe in default_recipes()[layout].items():
        (cp,) = make_plan(sources[kind], load_recipe(recipe).recipe).components
        linears = {k.removesuffix(".weight") for k, t in cp.component.tensors.items() if k.endswith(".weight") and len(t.shape) == 2}  # fmt: skip
        quantized = {t.module: t for t in cp.tensors if t.quantize}
        want = {m for m in linears if re.fullmatch(SPLIT[kind][fmt in FULL], m)}
        if fmt == "torchao_fp8":  # its dynamic per-row activation scale is 0 on the zero face frame's rows
            want -= {
                m
                for m in want
                if re.fullmatch(r"face_adapter\.(fuser_blocks\.\d+\.linear1_kv|\d+\.to_[kv])", m)
            }
        assert set(quantized) == want, fmt
        kept = linears - set(quantized)
        out = "face_adapter.fuser_blocks.0.linear2" if kind == "native" else "face_adapter.0.to_out"
        assert out in kept and "face_encoder.out_proj" in kept
        assert {m for m in kept if m.startswith("motion_encoder.")} == {m for m in linears if m.startswith("motion_encoder.")}  # fmt: skip
        if fmt == "comfy_nvfp4":
            mxfp8 = {m for m, t in quantized.items() if t.options.type_name == "mxfp8"}
            down = re.compile(r"blocks\.(0\..*|\d+\.ffn\.2)|face_adapter\.fuser_blocks\.0\..*")
            assert mxfp8 == {m for m in quantized if down.fullmatch(m)}


# -- every format -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(kind: str, fmt: str) -> Path:
        if (kind, fmt) not in made:
            out = tmp_path_factory.mktemp(f"animate-{kind}-{fmt}") / "out"
            run_cli("convert", sources[kind], out, "--format", fmt, check=True)
            made[kind, fmt] = out
        return made[kind, fmt]

    return get


def _reference(src: Path):
    """The diffusers-layout source in float32 as WanAnimateTransformer3DModel."""
    import diffusers

    comp = open_component(src, "transformer")
    model = diffusers.WanAnimateTransformer3DModel.from_config(comp.config).eval()
    model.load_state_dict({k: read_tensor(i).float() for k, i in comp.tensors.items()}, strict=True)
    return model


@pytest.fixture(scope="module")
def reference(sources):
    model = _reference(sources["diffusers"])
    x = load_inputs(None, ANIMATE, model.config)
    with torch.no_grad():
        want = model(**ANIMATE.inputs.call(model.config, x))[0]
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        floor = bf16_floor(model, want, ANIMATE.inputs.call(model.config, bf16))
    return model.config, x, want, floor


@pytest.mark.parametrize("fmt", SOURCE_FORMATS)
def test_every_diffusers_format_verifies_with_a_forward_and_our_loader_runs_it(
    sources, converted, reference, fmt
):
    """verify --forward through WanAnimateTransformer3DModel, then our loader's eager reference in float32 gives
    verify's own figure, and its fast path in bf16 stays near it."""
    import diffusers

    from loaders import load_quantized

    out = converted("diffusers", fmt)
    proc = run_cli("verify", out, "--source", sources["diffusers"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    config, x, want, floor = reference
    cls = diffusers.WanAnimateTransformer3DModel
    with torch.no_grad():
        exact = load_quantized(cls, out, dtype=torch.float32, compute="dequantize")
        assert round(forward_sqnr_db(want, exact(**ANIMATE.inputs.call(config, x))[0]), 3) == reported
        fast = load_quantized(cls, out, dtype=torch.bfloat16)
        bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
        y = fast(**ANIMATE.inputs.call(config, bf16))[0].float()
    # below both verify's figure and what bf16 arithmetic alone allows (the floor: the source run in bf16), by
    # FAST_MARGIN_DB at most, as the Wan loaders' test measures it
    fast_db = forward_sqnr_db(want, y)
    assert reported > 15 and min(reported, floor) - FAST_MARGIN_DB < fast_db < reported + 1, (
        reported,
        floor,
        fast_db,
    )


def _native_file(out: Path) -> Path:
    (path,) = [p for p in out.iterdir() if p.suffix in (".safetensors", ".gguf")]
    return path


def _state(path: Path) -> dict[str, tuple[int, ...]]:
    if path.suffix == ".gguf":
        return {t.name: tuple(int(d) for d in reversed(t.shape)) for t in gguf.GGUFReader(path).tensors}
    with safe_open(path, "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.fixture(scope="module")
def release_reference(sources):
    """The release as diffusers runs it: diffusers' class built from the config we derive, loaded in float32 with
    what diffusers' own converter makes of the release's tensors (its blur kernels left out: the class computes
    them), and its output on the family's inputs."""
    import diffusers
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    comp = open_component(sources["native"], ".")
    config = ANIMATE.diffusers_config(comp.config, comp.tensors, comp.dir)
    model = diffusers.WanAnimateTransformer3DModel.from_config(config).eval()
    state = convert_wan_transformer_to_diffusers({k: read_tensor(i).float() for k, i in comp.tensors.items()})
    kernels = {k for k in state if k.endswith(".kernel")}
    assert len(kernels) == 14
    model.load_state_dict({k: v for k, v in state.items() if k not in kernels}, strict=True)
    x = load_inputs(None, ANIMATE, model.config)
    with torch.no_grad():
        want = model(**ANIMATE.inputs.call(model.config, x))[0]
    return model, x, want


def test_the_release_runs_through_our_names_as_diffusers_runs_its_converters_output(
    sources, release_reference
):
    """A forward pass of the release through our table (linear1_kv cut into to_k and to_v, the [1, C, 1, 1] biases
    viewed as [C], the blur kernels left out) is diffusers' class on its own converter's output, bit for bit; and
    the blur filter diffusers computes is the release's (LIA's make_kernel of (1, 3, 3, 1), what Wan-AI's
    checkpoint saves; the example's are random, which no pass reads)."""
    from quantize.run.forward import StreamedModel, runnable, source_weights

    model, x, want = release_reference
    (cp,) = make_plan(sources["native"], load_recipe("wan-animate-fp8").recipe).components
    run = runnable(cp)
    assert set(run.rows) == {f"face_adapter.0.to_{p}.{leaf}" for p in "kv" for leaf in ("weight", "bias")}
    assert not any(ANIMATE.carried(tp.name) for tp in run.plans.values())
    got = StreamedModel(run).forward(load_inputs(None, ANIMATE, run.config), source_weights(run))
    assert torch.equal(got, want)
    k = torch.tensor([1.0, 3.0, 3.0, 1.0])
    k = k[None, :] * k[:, None]
    for block in model.motion_encoder.res_blocks:
        for conv in (block.conv2, block.conv_skip):
            assert torch.equal(conv.blur_kernel, k / k.sum())


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_release_converts_to_every_format_verifies_with_a_forward_and_our_loader_computes_its_figure(
    sources, converted, release_reference, fmt
):
    """verify --forward runs each output of the release (the blur kernels carried as stored), and our loader's
    eager reference in float32 computes the figure it reports, the fused linear1_kv cut into to_k and to_v (nf4's
    too: its halves start on groups of block scales)."""
    import diffusers

    from loaders import load_quantized

    out = converted("native", fmt)
    proc = run_cli("verify", out, "--source", sources["native"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    assert reported > 20
    stored = (open_gguf_component if fmt == "gguf" else open_component)(out)
    source = open_component(sources["native"], ".")
    for name in (n for n in source.tensors if ANIMATE.carried(n)):
        assert torch.equal(
            read_tensor(stored.tensors[name]).float(), read_tensor(source.tensors[name]).float()
        )
    model, x, want = release_reference
    cls = diffusers.WanAnimateTransformer3DModel
    with torch.no_grad():
        exact = load_quantized(cls, out, dtype=torch.float32, compute="dequantize")
        got = exact(**ANIMATE.inputs.call(model.config, x))[0]
    assert round(forward_sqnr_db(want, got), 3) == reported
    assert exact.motion_encoder.conv_in.act_fn.bias.shape == (8,)  # the test preset's narrow encoder


@pytest.fixture(scope="module")
def tiny_release(tmp_path_factory) -> Path:
    """The tiny release, whose motion encoder has ComfyUI's widths (what its detection and build are checked on)."""
    path = tmp_path_factory.mktemp("animate-tiny") / "release"
    run_cli("example", path, "--family", "wan-animate", "--preset", "tiny", "--layout", "animate", check=True)
    return path


@pytest.mark.parametrize("fmt", NATIVE_FORMATS)
def test_comfy_and_gguf_files_hold_what_comfyui_detects_and_builds(tiny_release, tmp_path, fmt):
    (release,) = examples_of(ANIMATE).models("tiny", "animate")
    names = dict(release.tensors)
    run_cli("convert", tiny_release, tmp_path / "out", "--format", fmt, check=True)
    path = _native_file(tmp_path / "out")
    state = _state(path)
    assert {n for n in state if not n.endswith(COMFY_PARTS)} == set(names)  # every native name, no other
    if fmt == "gguf":  # quantized weights are bytes there: the rule reads the kept tensors' shapes
        assert gguf.GGUFReader(path).fields["general.architecture"].contents() == "wan"  # ComfyUI-GGUF's
        assert state[f"{CONVS}.0.1.bias"] == (1, 32, 1, 1)  # F32, as stored: ComfyUI's FusedLeakyReLU
        state = {k: names[k] for k in state}
    else:
        with safe_open(path, "pt") as f:
            markers = {k.removesuffix(".comfy_quant") for k in f.keys() if k.endswith(".comfy_quant")}
        assert "face_adapter.fuser_blocks.0.linear1_kv" in markers
        assert not any(
            m.startswith(("motion_encoder.", "face_encoder.")) or m.endswith("linear2") for m in markers
        )
    detected = comfyui_animate(state)
    assert detected == comfyui_animate(names)
    fixed = comfyui_animate_shapes(detected["dim"], detected["num_layers"])
    assert {k: state[k] for k in fixed} == fixed


def test_native_names_from_the_diffusers_layout_are_refused_naming_the_tensor(sources, tmp_path):
    proc = run_cli("convert", sources["diffusers"], tmp_path / "out", "--format", "comfy_fp8")
    assert proc.returncode == 2 and "written from the original release only" in proc.stderr
    recipe = tmp_path / "gguf.yaml"
    recipe.write_text(
        edited_recipe("wan-animate-diffusers-nf4", format="gguf", type="Q8_0", copy_other_files=False)
    )
    proc = run_cli("convert", sources["diffusers"], tmp_path / "out", "--recipe", recipe)
    assert proc.returncode == 2 and re.search(
        r"'face_adapter\.0\.to_[kv]\.(weight|bias)' is half of", proc.stderr
    )
    assert not (tmp_path / "out").exists()


def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(converted):
    import diffusers

    comp = converted("diffusers", "torchao_fp8") / "transformer"
    model = diffusers.WanAnimateTransformer3DModel.from_pretrained(comp, torch_dtype=torch.bfloat16)
    x = load_inputs(None, ANIMATE, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        y = model(**ANIMATE.inputs.call(model.config, x))[0]
    assert y.shape[2:] == x["hidden_states"].shape[2:] and y.shape[1] == model.config.out_channels
    assert torch.isfinite(y).all() and type(model.face_adapter[0].to_q.weight).__name__ == "Float8Tensor"
    assert type(model.face_adapter[0].to_k.weight).__name__ == "Parameter"  # kept: see the recipe


def test_torchao_fp8_activations_of_the_zero_face_frame_are_nan_in_diffusers(sources, tmp_path):
    """Why the torchao_fp8 recipes keep the face adapter's to_k and to_v: their input's rows of the prepended zero
    face frame are exactly zero, and torchao's dynamic per-row FP8 scale of such a row is 0 (NaN after)."""
    import diffusers

    recipe = tmp_path / "all.yaml"
    name = "wan-animate-diffusers-torchao-fp8"
    targets = load_recipe(name).recipe.targets
    assert r"face_adapter\.\d+\.to_q" in targets
    every = [t.replace(r"face_adapter\.\d+\.to_q", r"face_adapter\.\d+\.to_[qkv]") for t in targets]
    recipe.write_text(edited_recipe(name, targets=every))
    run_cli("convert", sources["diffusers"], tmp_path / "out", "--recipe", recipe, check=True)
    model = diffusers.WanAnimateTransformer3DModel.from_pretrained(
        tmp_path / "out" / "transformer", torch_dtype=torch.bfloat16
    )
    x = load_inputs(None, ANIMATE, model.config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    seen = {}
    model.face_adapter[0].to_k.register_forward_hook(lambda m, i, o: seen.update(x=i[0], y=o))
    with torch.no_grad():
        model(**ANIMATE.inputs.call(model.config, x))
    zero = seen["x"].abs().amax(-1) == 0
    assert zero.any() and torch.equal(zero, ~torch.isfinite(seen["y"]).all(-1))


def test_the_release_gguf_loads_in_diffusers_from_single_file_and_runs(sources, converted):
    """diffusers' converter splits linear1_kv and reshapes the biases: the file loads; and it runs, the motion
    encoder's plain 2-D weights held in F32 (`plain_weights`: as BF16, diffusers' GGUF loader keeps them as packed
    bytes that only its Linears decode)."""
    import diffusers

    model = diffusers.WanAnimateTransformer3DModel.from_single_file(
        str(_native_file(converted("native", "gguf"))), config=str(sources["diffusers"]), subfolder="transformer",
        quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=torch.bfloat16), torch_dtype=torch.bfloat16,
    )  # fmt: skip
    assert type(model.face_adapter[0].to_k.weight).__name__ == "GGUFParameter"
    assert model.face_adapter[0].to_k.weight.shape[0] == model.face_adapter[0].to_v.weight.shape[0]
    assert model.motion_encoder.conv_in.act_fn.bias.shape == (8,)  # the test preset's narrow encoder
    assert (
        model.motion_encoder.motion_network[0].weight.dtype == torch.bfloat16
    )  # F32 in the file, loaded as asked
    x = load_inputs(None, ANIMATE, dict(model.config))
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        y = model(**ANIMATE.inputs.call(dict(model.config), x))[0]
    assert torch.isfinite(y).all()


def test_sensitivity_runs_through_animate_and_proposes_a_recipe(sources, tmp_path):
    proposal = tmp_path / "proposal.yaml"
    proc = run_cli(
        "sensitivity", sources["diffusers"], "--format", "nf4", "--min-forward-sqnr", "25",
        "--write-recipe", proposal, "--top", "3", check=True,
    )  # fmt: skip
    assert load_recipe(str(proposal)).recipe.format == "nf4"
    assert float(re.search(r"forward SQNR of the recipe in [^:]+: ([-\d.]+) dB", proc.stdout)[1]) > 15


def test_sensitivity_runs_through_the_release_and_measures_the_fused_kv_once(
    sources, converted, release_reference
):
    """The release measured as diffusers' class: linear1_kv once, as a whole (on to_k's Linear, whose input to_v
    shares), and the recipe's forward SQNR the one our loader computes on the release converted under it."""
    import diffusers

    from loaders import load_quantized

    proc = run_cli("sensitivity", sources["native"], "--format", "comfy_fp8", "--json", check=True)
    found = json.loads(proc.stdout)
    modules = [layer["module"] for layer in found["layers"]]
    assert modules.count("face_adapter.fuser_blocks.0.linear1_kv") == 1 and len(modules) == len(set(modules))
    model, x, want = release_reference
    with torch.no_grad():
        cls = diffusers.WanAnimateTransformer3DModel
        exact = load_quantized(
            cls, converted("native", "comfy_fp8"), dtype=torch.float32, compute="dequantize"
        )
        got = exact(**ANIMATE.inputs.call(model.config, x))[0]
    assert found["forward_sqnr_db"] == round(forward_sqnr_db(want, got), 3) > 20
