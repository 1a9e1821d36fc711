"""Wan-Animate-2 (`WanAnimate2Transformer3DModel`) as a family of its own.

Oracles: diffusers' single-file converter for this class, ``convert_wan_animate_2_transformer_to_diffusers``
(``single_file_model.py`` maps ``WanAnimate2Transformer3DModel`` to it), on the release's names; ComfyUI's rule
(a file in Wan's I2V names, its model type ``animate2`` from the file's metadata ``config``) in
tests/oracles/comfyui_wan_animate2.py; ComfyUI-GGUF's ``IMG_ARCH_LIST`` holds ``wan``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import pytest
import torch
from safetensors import safe_open

from quantize.models import family_of, get_family
from quantize.models.examples import examples_of
from quantize.models.examples.wan import wan_tensors
from quantize.models.wan_animate2 import COMFYUI_CONFIG, RELEASE_FILE, RELEASE_NAMES
from quantize.read.checkpoint import open_component, read_tensor
from quantize.read.detect import detect_layouts
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests.conftest import run_cli
from tests.oracles.comfyui_wan_animate2 import comfyui_animate2_class

ANIMATE2 = get_family("wan-animate2")
FORMATS = [
    "fp8_channel", "torchao_fp8", "torchao_int8", "nf4",
    "comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "gguf",
]  # fmt: skip
NATIVE_FORMATS = [f for f in FORMATS if f.startswith("comfy_") or f == "gguf"]
COMFY_PARTS = (".comfy_quant", ".weight_scale", ".weight_scale_2", ".input_scale")
#: kind -> (example layout, detected layout)
LAYOUTS = {"release": ("release", "wan-animate2"), "diffusers": ("diffusers", "wan-animate2-diffusers")}


def _release(preset: str = "tiny") -> list[tuple[str, tuple[int, ...]]]:
    (model,) = examples_of(ANIMATE2).models(preset, "release")
    return model.tensors


# -- the names, through diffusers' own converter, and ComfyUI's ------------------------------------------------


def test_every_release_name_is_what_diffusers_own_converter_makes_of_it_and_the_class_holds():
    import diffusers
    from diffusers.loaders.single_file_utils import convert_wan_animate_2_transformer_to_diffusers

    release = dict(_release())
    oracle = convert_wan_animate_2_transformer_to_diffusers({n: n for n in release})
    assert {n: RELEASE_NAMES.diffusers(n) for n in release} == {old: new for new, old in oracle.items()}
    (model,) = examples_of(ANIMATE2).models("tiny", "diffusers")
    with torch.device("meta"):
        built = diffusers.WanAnimate2Transformer3DModel.from_config(model.config)
    state = {k: tuple(v.shape) for k, v in built.state_dict().items()}
    assert state == {oracle_name: release[old] for oracle_name, old in oracle.items()}
    # and back: each diffusers name's release name, and its ComfyUI name is the release's without the wrapper
    for name in state:
        assert oracle[name] == RELEASE_NAMES.native(name)
        assert ANIMATE2.native_name(name) == RELEASE_NAMES.native(name).replace(".block.", ".", 1)


def test_comfyuis_names_are_wan_i2vs_and_only_the_metadata_tells_animate2():
    """ComfyUI's names of the model are a Wan2.1 I2V's, tensor for tensor: without the metadata ComfyUI builds
    WAN21_I2V; with the family's, WAN_Animate2 (at the dimensions it detects from the tensors)."""
    wan = examples_of(get_family("wan"))
    i2v, _ = wan.layout_shape("tiny", "i2v")
    comfy = {ANIMATE2.native_name(RELEASE_NAMES.diffusers(n)): s for n, s in _release()}
    assert comfy == dict(wan_tensors(i2v))
    assert comfyui_animate2_class(comfy, None)[0] == "WAN21_I2V"
    cls, config = comfyui_animate2_class(comfy, {"config": COMFYUI_CONFIG})
    assert cls == "WAN_Animate2" and (config["dim"], config["num_heads"], config["in_dim"]) == (128, 1, 36)


@pytest.mark.parametrize("layout", ["release", "diffusers"])
def test_wan_and_wan_animate_claim_neither_layout_and_animate2_claims_no_animate_model(layout):
    names = [n for m in examples_of(ANIMATE2).models("tiny", layout) for n, _ in m.tensors]
    for other in ("wan", "wan-animate"):
        assert get_family(other).naming(names) is None and not get_family(other).owns("WanModel", names)
    for animate_layout in ("animate", "diffusers"):
        (animate,) = examples_of(get_family("wan-animate")).models("tiny", animate_layout)
        assert ANIMATE2.naming(dict(animate.tensors)) is None
        assert family_of(None, dict(animate.tensors)).name == "wan-animate"
    # Wan's own I2V, in ComfyUI's names (which Animate-2's ComfyUI file has too) is Wan's
    (i2v,) = examples_of(get_family("wan")).models("tiny", "i2v")
    assert family_of(None, dict(i2v.tensors)).name == "wan"


# -- the layouts, every format ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("animate2")
    made = {}
    for kind, (layout, _) in LAYOUTS.items():
        made[kind] = root / layout
        run_cli(
            "example",
            made[kind],
            "--family",
            "wan-animate2",
            "--preset",
            "tiny",
            "--layout",
            layout,
            check=True,
        )
    return made


def test_each_example_is_its_layout(sources):
    for kind, (_, detected) in LAYOUTS.items():
        (found,) = detect_layouts(sources[kind])
        assert (found.family, found.name) == ("wan-animate2", detected)
    assert [p.name for p in sources["release"].glob("*.safetensors")] == [RELEASE_FILE]
    assert not (sources["release"] / "config.json").exists()


@pytest.fixture(scope="module")
def converted(sources, tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(kind: str, fmt: str) -> Path:
        if (kind, fmt) not in made:
            out = tmp_path_factory.mktemp(f"animate2-{kind}-{fmt}") / "out"
            run_cli("convert", sources[kind], out, "--format", fmt, check=True)
            made[kind, fmt] = out
        return made[kind, fmt]

    return get


@pytest.fixture(scope="module")
def reference(sources):
    """The release as diffusers runs it: the class built from the config read off its shapes, loaded with what
    diffusers' own converter makes of its tensors, in float32, and its output on the family's inputs."""
    import diffusers
    from diffusers.loaders.single_file_utils import convert_wan_animate_2_transformer_to_diffusers

    comp = open_component(sources["release"], ".")
    state = convert_wan_animate_2_transformer_to_diffusers(
        {k: read_tensor(i).float() for k, i in comp.tensors.items()}
    )
    config = ANIMATE2.release_config(_infos(state), comp.dir)
    model = diffusers.WanAnimate2Transformer3DModel.from_config(config).eval()
    model.load_state_dict(state, strict=True)
    x = load_inputs(None, ANIMATE2, dict(model.config))
    with torch.no_grad():
        (want,) = model(**_diffusers_call(dict(model.config), x))
    return model, x, torch.stack(want)


def _diffusers_call(config: dict, x: dict) -> dict:
    """The family's pass arguments for diffusers' own class (which returns its list of samples)."""
    return {k: v for k, v in ANIMATE2.inputs.call(config, x).items() if k != "stacked"}


def _infos(state: dict[str, torch.Tensor]):
    from quantize.read.checkpoint import TensorInfo

    return {n: TensorInfo(n, "F32", tuple(t.shape), Path("x"), 0, 0) for n, t in state.items()}


#: the formats run forward here (each of the others plans in the family contract; torchao_fp8 loads in diffusers
#: below): one of each scheme and naming, what the suite's time allows
FORWARD_FORMATS = ["fp8_channel", "nf4", "comfy_fp8", "comfy_nvfp4", "gguf"]


@pytest.mark.parametrize("fmt", FORWARD_FORMATS)
def test_the_release_converts_and_verify_runs_it_as_diffusers_class(sources, converted, reference, fmt):
    """verify --forward runs each output of the release (the reference pass: every Linear once) against the
    release, and for the formats in diffusers' names our loader's eager reference, given diffusers' class,
    computes the figure it reports (ComfyUI's names are Wan's, with no mark of this family for the loader to read
    them by: those files are ComfyUI's, whose detection the ComfyUI test reads)."""
    import diffusers

    from loaders import load_quantized

    out = converted("release", fmt)
    proc = run_cli("verify", out, "--source", sources["release"], "--forward", "--json", check=True)
    (reported,) = [v["output_sqnr_db"] for v in json.loads(proc.stdout)["forward"].values()]
    assert reported > 20
    if fmt in NATIVE_FORMATS:
        return
    model, x, want = reference
    with torch.no_grad():
        exact = load_quantized(
            diffusers.WanAnimate2Transformer3DModel, out, dtype=torch.float32, compute="dequantize"
        )
        (got,) = exact(**_diffusers_call(dict(model.config), x))  # diffusers' own output, a list
    assert round(forward_sqnr_db(want, torch.stack(got)), 3) == reported


def _native_file(out: Path) -> Path:
    (path,) = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".gguf")]
    return path


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_nvfp4", "gguf"])
def test_comfy_and_gguf_files_are_what_comfyui_builds_as_wan_animate2(converted, fmt):
    """Wan's I2V names, no other, and the metadata that makes ComfyUI build WAN_Animate2 (a GGUF file's as a
    string key-value, which ComfyUI-GGUF hands ComfyUI as the file's metadata)."""
    release = {ANIMATE2.native_name(RELEASE_NAMES.diffusers(n)): s for n, s in _release()}
    path = _native_file(converted("release", fmt))
    if fmt == "gguf":
        reader = gguf.GGUFReader(path)
        assert reader.fields["general.architecture"].contents() == "wan"
        metadata = {"config": reader.fields["config"].contents()}
        names = {t.name for t in reader.tensors}
    else:
        with safe_open(path, "pt") as f:
            metadata, names = f.metadata(), set(f.keys())
    assert {n for n in names if not n.endswith(COMFY_PARTS)} == set(release)
    assert comfyui_animate2_class(release, metadata)[0] == "WAN_Animate2"


def test_the_diffusers_layout_writes_comfyuis_file_as_the_release_does(converted):
    """Names one to one: diffusers' transformer/ gives ComfyUI's file with the release's tensors (names, shapes,
    dtypes: the two examples' random values differ) and its metadata."""
    with safe_open(_native_file(converted("release", "comfy_int8")), "pt") as a:
        from_release, meta = {k: a.get_tensor(k) for k in a.keys()}, a.metadata()
    with safe_open(_native_file(converted("diffusers", "comfy_int8")), "pt") as b:
        from_diffusers = {k: b.get_tensor(k) for k in b.keys()}
        assert b.metadata()["config"] == meta["config"] == COMFYUI_CONFIG
    assert from_release.keys() == from_diffusers.keys()
    assert all(
        (from_release[k].shape, from_release[k].dtype) == (from_diffusers[k].shape, from_diffusers[k].dtype)
        for k in from_release
    )


@pytest.mark.parametrize(("kind", "fmt"), [("release", "torchao_fp8"), ("diffusers", "torchao_int8")])
def test_a_torchao_output_loads_in_diffusers_from_pretrained_and_runs(converted, kind, fmt):
    """The release's output too: config.json read off its shapes, the file under diffusers' own name."""
    import diffusers

    out = converted(kind, fmt)
    comp = out / "transformer" if kind == "diffusers" else out
    model = diffusers.WanAnimate2Transformer3DModel.from_pretrained(comp, torch_dtype=torch.bfloat16)
    config = dict(model.config)
    x = load_inputs(None, ANIMATE2, config)
    x = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in x.items()}
    with torch.no_grad():
        ((y,),) = model(**_diffusers_call(config, x))
    assert y.shape == x["hidden_states"][0].shape and torch.isfinite(y).all()
    assert type(model.blocks[0].self_attn.to_q.weight).__name__ != "Parameter"
    assert type(model.blocks[0].ffn[2].weight).__name__ == "Parameter"  # kept: ffn.2 (GELU's outliers)


def test_the_release_output_in_diffusers_names_is_the_class_with_its_config(converted):
    out = converted("release", "fp8_channel")
    config = json.loads((out / "config.json").read_text())
    assert config["_class_name"] == "WanAnimate2Transformer3DModel" and config["num_layers"] == 2
    assert [p.name for p in out.glob("*.safetensors")] == ["diffusion_pytorch_model.safetensors"]
    names = set(open_component(out, ".").tensors)
    assert "blocks.1.self_attn.to_q.weight" in names and not any(".block." in n for n in names)


def test_comfyuis_own_file_converts_as_a_wan_i2v_keeping_the_metadata_that_makes_it_animate2(tmp_path):
    """Comfy-Org's ``wan_animate_2_bf16.safetensors`` is a Wan2.1 I2V by its names (the Wan family's, which this
    tool tells by names alone) and Animate-2 by its metadata: Wan's files carry the ``config`` entry, so ComfyUI
    builds WAN_Animate2 from the output as from the file."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "comfy"
    run_cli("example", src, "--family", "wan", "--preset", "tiny", "--layout", "i2v", check=True)
    (f,) = src.glob("*.safetensors")
    save_file(load_file(f), f, metadata={"format": "pt", "config": COMFYUI_CONFIG})
    (found,) = detect_layouts(src)
    assert (found.family, found.name) == ("wan", "wan")
    run_cli("convert", src, tmp_path / "out", "--format", "comfy_fp8", check=True)
    with safe_open(_native_file(tmp_path / "out"), "pt") as out:
        state = {k: tuple(out.get_slice(k).get_shape()) for k in out.keys() if not k.endswith(COMFY_PARTS)}
        assert comfyui_animate2_class(state, out.metadata())[0] == "WAN_Animate2"


# -- bad input: one line, exit 2, nothing written --------------------------------------------------------------


def _one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


def _copy_release(sources, dest: Path, edit=None) -> Path:
    from safetensors.torch import load_file, save_file

    dest.mkdir()
    tensors = load_file(sources["release"] / RELEASE_FILE)
    if edit is not None:
        edit(tensors)
    save_file(tensors, dest / RELEASE_FILE)
    return dest


def test_a_truncated_release_is_one_line_naming_the_file(sources, tmp_path):
    src = _copy_release(sources, tmp_path / "cut")
    f = src / RELEASE_FILE
    with open(f, "r+b") as h:
        h.truncate(f.stat().st_size // 2)
    line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--format", "comfy_fp8"))
    assert RELEASE_FILE in line and "truncated" in line
    assert not (tmp_path / "o").exists()


def test_a_release_missing_a_block_tensor_is_one_line_naming_it(sources, tmp_path):
    src = _copy_release(sources, tmp_path / "partial", lambda t: t.pop("blocks.1.block.ffn.2.weight"))
    for fmt in ("comfy_fp8", "torchao_fp8"):
        line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--format", fmt))
        assert "'blocks.1.block.ffn.2.weight'" in line and "partial Wan-Animate-2" in line
        assert not (tmp_path / "o").exists()


def test_a_config_naming_a_class_no_family_owns_is_one_line_naming_it(sources, tmp_path):
    src = _copy_release(sources, tmp_path / "other")
    (src / "config.json").write_text(json.dumps({"_class_name": "WanAnimate3Model"}))
    line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--format", "comfy_fp8"))
    assert re.search(r"names WanAnimate3Model, which no family is", line)
    line = _one_line_exit_2(run_cli("convert", src, tmp_path / "o", "--recipe", "wan-animate2-comfy-fp8"))
    assert not (tmp_path / "o").exists()
