"""Every format `quantize convert` writes, loaded by `load_quantized`, in both namings: a diffusers-layout source
(``transformer/``, its checkpoints written in the source's names, or ComfyUI's and GGUF's in Wan's native names)
and an original-layout Wan source (native names throughout).

- the eager reference (``compute="dequantize"``, float32) computes what `quantize verify --forward` reports,
  to its three decimals, and the fast path (bf16) stays within a few dB of it;
- a Wan2.2 A14B checkpoint (two experts) loads each expert, as its folder alone would;
- a damaged, foreign or mismatched checkpoint is one line naming the file or the tensor;
- the new modules' fast paths are ComfyUI's (comfy-kitchen's eager kernels) bit for bit, GGUF's decoding is
  gguf-py's, and each module deep-copies, moves with weak references held and keeps its stored dtypes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import weakref
from pathlib import Path

import diffusers
import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import loaders.modules
import quantize.run.forward
from loaders import CheckpointMismatchError, QuantizedLinear, load_quantized
from loaders.modules import (
    MODULES,
    ComfyFP8Linear,
    ComfyW4a4Linear,
    ComfyW4a8Linear,
    Float8Linear,
    FP8Linear,
    GGUFLinear,
    Int8Linear,
    TorchaoInt8Linear,
)
from quantize.errors import InputError
from quantize.formats import format_for, format_info, get_format
from quantize.formats.options import ComfyOptions, GgufOptions
from quantize.models import FAMILIES, get_family
from quantize.read.checkpoint import open_component, read_tensor
from quantize.recipes import default_recipes
from quantize.run.forward import forward_sqnr_db, load_inputs
from tests import diffusers_models as models
from tests.conftest import run_cli, skip_without_kernel
from tests.helpers.forward import FAST_MARGIN_DB
from tests.loaders.conftest import (
    FORMATS,
    gguf_tensors,
    layer_input,
    layer_weights,
    same_bytes,
    storage_ids,
)

WAN = get_family("wan")
Wan = diffusers.WanTransformer3DModel

#: the bundled recipe for each format (what `--format` takes), for an original-layout Wan source (native names,
#: the model at the root), and for Wan2.2 A14B's two experts (high_noise_model/, low_noise_model/)
NATIVE_RECIPES = dict(default_recipes()["wan"])
A14B_RECIPES = dict(default_recipes()["wan2.2-a14b"])
assert set(NATIVE_RECIPES) == set(FORMATS) and {"comfy_fp8", "comfy_int8", "gguf"} <= set(A14B_RECIPES)
#: a GGUF Q4_K_M mix (Q4_K, Q6_K for attn1.to_v and ffn.net.2) needs in_features a multiple of 256: a wider model
Q4_K_M = "gguf-q4_k_m"
WIDE_WAN = dict(num_layers=2, attention_head_dim=128, ffn_dim=512)  # dim 256


@pytest.fixture(scope="session")
def native_converted(tmp_path_factory):
    """native_converted(fmt) -> (source root, converted root) of the original-layout tiny Wan2.1 T2V (`quantize
    example --preset tiny --layout t2v`), converted by the format's bundled recipe, each made once."""
    root = tmp_path_factory.mktemp("wan-native")
    src = root / "src"
    run_cli("example", src, "--preset", "tiny", "--layout", "t2v", check=True)
    made: dict[str, Path] = {}

    def get(fmt: str) -> tuple[Path, Path]:
        if fmt not in made:
            made[fmt] = root / fmt
            run_cli("convert", src, made[fmt], "--recipe", NATIVE_RECIPES[fmt], check=True)
        return src, made[fmt]

    return get


@pytest.fixture(scope="session")
def wide_q4_k_m(tmp_path_factory) -> tuple[Path, Path]:
    """(source root, converted root): a dim-256 diffusers-layout Wan converted by wan-diffusers-gguf-q4_k_m."""
    root = tmp_path_factory.mktemp("wan-wide")
    torch.manual_seed(0)
    models.wan_model(**WIDE_WAN).to(torch.bfloat16).save_pretrained(root / "src" / "transformer")
    run_cli("convert", root / "src", root / "out", "--recipe", "wan-diffusers-gguf-q4_k_m", check=True)
    return root / "src", root / "out"


@pytest.fixture(scope="session")
def a14b(tmp_path_factory):
    """a14b(fmt) -> the converted root of the tiny Wan2.2 A14B example (two experts, native names), made once each."""
    root = tmp_path_factory.mktemp("wan-a14b")
    run_cli("example", root / "src", "--preset", "tiny", "--layout", "a14b", check=True)
    made: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in made:
            made[fmt] = root / fmt
            run_cli("convert", root / "src", made[fmt], "--recipe", A14B_RECIPES[fmt], check=True)
        return made[fmt]

    return get


# -- a. the forward pass, as verify --forward computes it -----------------------------------------


class Reference:
    """The source model in float32 (its stored values, renamed into the diffusers class where native), on the
    inputs verify --forward runs (`load_inputs(None, ...)`: its fixed random ones), and the same model in bf16 as
    diffusers runs it (``_keep_in_fp32_modules`` in float32): the floor a bf16 forward of any checkpoint sits at."""

    def __init__(self, component: Path):
        comp = open_component(component)
        config = {k: v for k, v in comp.config.items() if k != "quantization_config"}
        if config["_class_name"] in WAN.native_classes:
            config = WAN.diffusers_config(config, comp.tensors, comp.dir)
            state = {WAN.diffusers_name(k): read_tensor(info).float() for k, info in comp.tensors.items()}
        else:
            state = {k: read_tensor(info).float() for k, info in comp.tensors.items()}
        model = Wan.from_config(config).eval()
        model.load_state_dict(state, strict=True)
        self.config = config
        self.x = load_inputs(None, WAN, config)
        with torch.no_grad():
            self.want = model(**self.kwargs(torch.float32))[0]
            keep = set(model._keep_in_fp32_modules)
            for name, p in model.named_parameters():
                if not keep & set(name.split(".")):
                    p.data = p.data.to(torch.bfloat16)
            self.bf16_db = forward_sqnr_db(self.want, model(**self.kwargs(torch.bfloat16))[0].float())

    def kwargs(self, dtype: torch.dtype) -> dict:
        x = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.x.items()}
        return WAN.inputs.call(self.config, x)


@pytest.fixture(scope="session")
def reference():
    """reference(source component dir) -> its `Reference`, made once each."""
    made: dict[Path, Reference] = {}

    def get(component: Path) -> Reference:
        if component not in made:
            made[component] = Reference(component)
        return made[component]

    return get


#: formats without a kernel on this machine: GGUF and W4A4 have none (torch has no int4 GEMM); NVFP4's and MXFP8's
#: block-scaled GEMMs need SM100
NO_KERNEL_HERE = {"gguf", "comfy_w4a4", "comfy_nvfp4", "comfy_mxfp8"}
NAMINGS = {"diffusers": [*FORMATS, Q4_K_M], "native": FORMATS}


@pytest.fixture
def checkpoint(request, converted, native_converted, wide_q4_k_m):
    """(format, source root, source component, converted root, converted component) of one naming and format."""
    naming, fmt = request.param
    if naming == "native":
        src, out = native_converted(fmt)
        return fmt, src, src, out, out
    if fmt == Q4_K_M:
        src, out = wide_q4_k_m
        fmt = "gguf"
    else:
        src, out = (p.parent for p in converted("wan", fmt))
    return fmt, src, src / "transformer", out, out / "transformer"


@pytest.mark.parametrize(
    "checkpoint",
    [(naming, fmt) for naming, formats in NAMINGS.items() for fmt in formats],
    ids=lambda p: "-".join(p),
    indirect=True,
)
def test_the_eager_reference_computes_what_verify_reports_and_the_fast_path_is_close(
    checkpoint, reference, monkeypatch
):
    fmt, src, src_comp, out, out_comp = checkpoint
    outputs = []  # what verify compared: (the source's output, the checkpoint's), float32

    def seen(want, got):
        outputs.append((want, got))
        return forward_sqnr_db(want, got)

    monkeypatch.setattr(quantize.run.forward, "forward_sqnr_db", seen)
    verified = run_cli("verify", out, "--source", src, "--forward", "--json", check=True)
    (reported,) = json.loads(verified.stdout)["forward"].values()
    reported = reported["output_sqnr_db"]
    ref = reference(src_comp)
    in_process = os.environ.get("QUANTIZE_TEST_CLI") != "process"  # else verify ran where nothing is seen
    if in_process:
        ((verify_source, verify_stored),) = outputs
        assert torch.equal(ref.want, verify_source)  # the reference here is verify's

    exact = load_quantized(Wan, out_comp, dtype=torch.float32, compute="dequantize")
    quantized = [m for m in exact.modules() if isinstance(m, QuantizedLinear)]
    layer_format = {m: format_for(get_format(fmt), m.options).NAME for m in quantized}  # a mixed file's own
    assert quantized and all(type(m) is MODULES[layer_format[m]] for m in quantized)
    assert MODULES[fmt] in {type(m) for m in quantized}
    assert {m.compute for m in quantized} == {"dequantize"}
    with torch.no_grad():
        got = exact(**ref.kwargs(torch.float32))[0]
    assert got.dtype == torch.float32
    assert not in_process or torch.equal(got, verify_stored)  # verify's own numbers, bit for bit
    assert round(forward_sqnr_db(ref.want, got), 3) == reported

    # each layer's own kernel on this device, where its scheme has one here (GGUF has none; the block-scaled ones
    # need Blackwell, where "kernel" raises and "fast" decodes)
    compute = "fast" if fmt in NO_KERNEL_HERE else "kernel"
    fast = load_quantized(Wan, out_comp, dtype=torch.bfloat16, compute=compute)
    layers = [m for m in fast.modules() if isinstance(m, QuantizedLinear)]
    for m in layers if compute == "kernel" else ():
        skip_without_kernel(m, torch.zeros(1, m.in_features, dtype=torch.bfloat16))
    runs_kernel = {m.uses_fast_path(torch.zeros(1, m.in_features, dtype=torch.bfloat16)) for m in layers}
    assert runs_kernel == {fmt not in NO_KERNEL_HERE}
    with torch.no_grad():
        y = fast(**ref.kwargs(torch.bfloat16))[0]
    assert y.dtype == torch.bfloat16
    fast_db = forward_sqnr_db(ref.want, y.float())
    assert min(reported, ref.bf16_db) - FAST_MARGIN_DB < fast_db < reported + 1, (reported, ref.bf16_db)


def test_a_gguf_mix_loads_each_layer_in_its_own_type(wide_q4_k_m):
    """wan-diffusers-gguf-q4_k_m: Q6_K for attn1.to_v and ffn.net.2, Q4_K elsewhere, read off the file."""
    _, out = wide_q4_k_m
    model = load_quantized(Wan, out / "transformer")
    types = {n: m.options.type_name for n, m in model.named_modules() if isinstance(m, GGUFLinear)}
    on_file = {
        WAN.diffusers_name(k)[: -len(".weight")]: t
        for k, (t, _) in gguf_tensors(out / "transformer" / "transformer.gguf").items()
        if t not in ("F32", "F16", "BF16")
    }
    assert types == on_file and set(types.values()) == {"Q4_K", "Q6_K"}
    assert all(t == "Q6_K" for n, t in types.items() if n.endswith(("attn1.to_v", "ffn.net.2")))


# -- b. Wan2.2 A14B: two experts --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(A14B_RECIPES))
def test_both_experts_load_from_the_checkpoint_root_as_each_folder_alone(a14b, fmt):
    out = a14b(fmt)
    both = load_quantized(Wan, out)
    assert list(both) == ["high_noise_model", "low_noise_model"]
    states = {}
    for name, model in both.items():
        alone = load_quantized(Wan, out / name)
        assert type(model) is Wan and any(type(m) is MODULES[fmt] for m in model.modules()), name
        mine, theirs = model.state_dict(), alone.state_dict()
        assert mine.keys() == theirs.keys(), name
        assert all(same_bytes(mine[k], theirs[k]) for k in mine), name
        states[name] = mine
    high, low = states.values()
    assert not all(same_bytes(high[k], low[k]) for k in high)  # two models, not one twice
    with pytest.raises(InputError, match=r"holds several models \(high_noise_model, low_noise_model\)"):
        load_quantized(both["low_noise_model"], out)


# -- c. a checkpoint that is damaged, foreign, or for another model ----------------------------------


def _copy(component: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(component, tmp_path / component.name))


def _truncated_gguf(converted, tmp_path):
    """The GGUF file cut in its data, 10 bytes into the middle tensor: that tensor (or a later one) is named."""
    comp = _copy(converted("wan", "gguf")[1], tmp_path)
    path = comp / "transformer.gguf"
    tensors = gguf.GGUFReader(path).tensors
    middle = sorted(tensors, key=lambda t: t.data_offset)[len(tensors) // 2]
    cut = middle.data_offset + 10
    os.truncate(path, cut)
    past = {t.name for t in tensors if t.data_offset + t.n_bytes > cut}
    return comp, InputError, r"transformer\.gguf: tensor '([\w.]+)' at offset \d+ .*past the end", past


def _truncated_comfy(converted, tmp_path):
    comp = _copy(converted("wan", "comfy_fp8")[1], tmp_path)
    path = comp / "transformer_comfy_fp8.safetensors"
    os.truncate(path, path.stat().st_size - 1000)
    return (
        comp,
        InputError,
        r"transformer_comfy_fp8\.safetensors: tensor data ends at byte \d+ .*: truncated",
        None,
    )


def _foreign(fmt: str, name: str, start: bytes = b""):
    def make(converted, tmp_path):
        comp = _copy(converted("wan", fmt)[1], tmp_path)
        data = start + np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
        (comp / name).write_bytes(data[:4096])
        return comp, InputError, re.escape(f"{name}: "), None

    return make


def _rewritten(change, config_class: str | None = None):
    """A copy of the comfy_fp8 file (Wan's native names) with `change(tensors)` applied, its metadata kept."""

    def make(converted, tmp_path):
        comp = _copy(converted("wan", "comfy_fp8")[1], tmp_path)
        path = comp / "transformer_comfy_fp8.safetensors"
        with safe_open(path, "pt") as f:
            metadata = f.metadata()
        tensors = load_file(path)
        message = change(tensors)
        save_file(tensors, path, metadata=metadata)
        if config_class is not None:
            config = json.loads((comp / "config.json").read_text())
            (comp / "config.json").write_text(json.dumps({**config, "_class_name": config_class}))
        return comp, CheckpointMismatchError, message, None

    return make


def _renamed(tensors):
    """A kept tensor under a name no table knows: the model's tensor it was is missing."""
    tensors["head.mystery.weight"] = tensors.pop("head.head.weight")
    return r"the model's 'proj_out\.weight' \('head\.head\.weight' in the checkpoint's names\) \[64, 64\] is not in"


def _extra(tensors):
    """One more tensor, of no model."""
    tensors["mystery.weight"] = torch.zeros(3)
    return r"1 checkpoint tensor\(s\) fit nothing in WanTransformer3DModel, e\.g\. 'mystery\.weight'"


def _every_name_foreign(tensors):
    """Names of no family (and a config class of none): nothing to rename through."""
    for key in list(tensors):
        tensors["model." + key] = tensors.pop(key)
    known = re.escape(", ".join(f.title for f in FAMILIES))
    return (
        r"its config names 'SomeTransformer' and its tensor names \(e\.g\. 'model\.[^']+'\) are of no model family "
        rf"this tool knows \({known}\); the model is a Wan model"
    )


BAD = {
    "truncated-gguf": _truncated_gguf,
    "truncated-comfy": _truncated_comfy,
    "random-bytes.gguf": _foreign("gguf", "transformer.gguf"),
    "random-bytes-with-gguf-magic.gguf": _foreign("gguf", "transformer.gguf", b"GGUF\x03\x00\x00\x00"),
    "random-bytes.safetensors": _foreign("comfy_int8", "transformer_comfy_int8.safetensors"),
    "a-tensor-renamed": _rewritten(_renamed),
    "an-unknown-tensor": _rewritten(_extra),
    "names-of-no-family": _rewritten(_every_name_foreign, config_class="SomeTransformer"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_checkpoint_is_one_line_naming_the_file_or_tensor(converted, tmp_path, case):
    comp, error, message, named = BAD[case](converted, tmp_path)
    with pytest.raises(error, match=message) as e:
        load_quantized(Wan, comp)
    assert "\n" not in str(e.value) and str(comp) in str(e.value)
    if named is not None:  # the tensor named is one the cut left incomplete
        assert re.search(message, str(e.value))[1] in named


def test_a_folder_with_a_gguf_and_a_safetensors_file_is_refused_naming_both(converted, tmp_path):
    comp = _copy(converted("wan", "gguf")[1], tmp_path)
    shutil.copy(converted("wan", "comfy_fp8")[1] / "transformer_comfy_fp8.safetensors", comp)
    with pytest.raises(
        InputError, match=r"holds both transformer\.gguf and transformer_comfy_fp8\.safetensors"
    ):
        load_quantized(Wan, comp)


def test_a_gguf_file_loaded_as_stored_runs_in_its_sources_dtype(converted):
    """GGUF keeps norms, biases and the patch embedding in F32 and kept Linears in BF16: `dtype=None` gives the
    F32 ones back in BF16 (the model's `_keep_in_fp32_modules` in float32, as diffusers holds them), so it runs."""
    model = load_quantized(Wan, converted("wan", "gguf")[1])
    assert (
        model.patch_embedding.weight.dtype == torch.bfloat16 and model.proj_out.weight.dtype == torch.bfloat16
    )
    assert model.scale_shift_table.dtype == torch.float32  # kept in float32, as diffusers keeps it
    x = {
        k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v
        for k, v in models.wan_inputs().items()
    }
    with torch.no_grad():
        out = model(**x)[0]
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())


@pytest.mark.parametrize(
    "naming, fmt", [("diffusers", "comfy_fp8"), ("diffusers", "gguf"), ("native", "comfy_int8")]
)
def test_a_model_class_of_another_family_is_named_with_the_right_one(
    converted, native_converted, naming, fmt
):
    comp = converted("wan", fmt)[1] if naming == "diffusers" else native_converted(fmt)[1]
    config_class = "WanTransformer3DModel" if naming == "diffusers" else "WanModel"
    with pytest.raises(
        CheckpointMismatchError,
        match=rf"a Wan checkpoint \({config_class}\); Kandinsky5Transformer3DModel is a Kandinsky 5 model: "
        "pass WanTransformer3DModel",
    ) as e:
        load_quantized(diffusers.Kandinsky5Transformer3DModel, comp)
    assert "\n" not in str(e.value)


def test_a_wan_class_for_a_kandinsky5_checkpoint_is_named_too(converted):
    with pytest.raises(
        CheckpointMismatchError, match=r"WanTransformer3DModel is a Wan model: pass Kandinsky5"
    ):
        load_quantized(Wan, converted("kandinsky5", "nf4")[1])


@pytest.mark.parametrize("fmt", ["comfy_fp8", "comfy_int8", "gguf"])
def test_a_format_no_module_runs_is_one_line_naming_it_and_what_runs_it(converted, monkeypatch, fmt):
    monkeypatch.delitem(loaders.modules.MODULES, fmt)
    runs_in = ", ".join(format_info(fmt).runs_in)
    with pytest.raises(
        InputError, match=rf"a {fmt} checkpoint runs in {runs_in}, not in loaders \(it loads "
    ) as e:
        load_quantized(Wan, converted("wan", fmt)[1])
    assert "\n" not in str(e.value) and fmt not in str(e.value).partition("it loads")[2]


# -- d. the modules: ComfyUI's and gguf-py's numbers, and offload-readiness ---------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _layer(out: int, inp: int, rows: int, dtype: torch.dtype, seed: int = 0):
    """A random weight [out, in], bias (bf16, as loaded) and input [2, rows, in] in `dtype` with one all-zero row."""
    g = torch.Generator().manual_seed(seed)
    w, b = torch.randn(out, inp, generator=g), torch.randn(out, generator=g).to(torch.bfloat16)
    x = torch.randn(2, rows, inp, generator=g).to(dtype)
    x[0, rows // 2] = 0
    return w, b, x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(96, 128, 10), (12, 20, 7), (33, 45, 5)], ids=lambda s: "x".join(map(str, s))
)
def test_int8_linear_is_comfy_kitchens_eager_int8_linear_bit_for_bit(shape, dtype):
    from comfy_kitchen.backends.eager.quantization import int8_linear

    w, b, x = _layer(*shape, dtype)
    for bias in (b, None):
        m = Int8Linear.from_weight(w, bias)
        skip_without_kernel(m, x)
        assert m.uses_fast_path(x)
        parts = m.stored()
        want = int8_linear(x, parts["weight"], parts["weight_scale"], m.bias, out_dtype=x.dtype)
        got = m(x)
        assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape, group", [((96, 256, 10), 256), ((24, 64, 7), 64), ((40, 48, 5), 16)], ids=lambda s: str(s)
)
def test_w4a8_linear_is_comfy_kitchens_eager_w4a8_linear_bit_for_bit(shape, group, dtype):
    """The kernel against comfy-kitchen's eager ``w4a8_int8_linear`` on our parts, and against ComfyUI's `F.linear` on
    the `QuantizedTensor` its loader builds of them (comfy/ops.py), in every ConvRot group."""
    from comfy_kitchen.backends.eager.w4a8_int8 import w4a8_int8_linear
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.w4a8_int8 import AsymW4A8Int8Layout

    options = ComfyOptions("asym_w4a8_int8", convrot_group=group)
    w, b, x = _layer(*shape, dtype)
    for bias in (b, None):
        m = ComfyW4a8Linear.from_weight(w, bias, options)
        skip_without_kernel(m, x)
        assert m.uses_fast_path(x)
        p = m.stored()
        got = m(x)
        bias_in = None if bias is None else m.bias.to(dtype)
        want = w4a8_int8_linear(
            x, p["weight"], p["weight_s_rel"], p["weight_s_channel"], p["weight_codebook"], bias=bias_in,
            group_size=16, convrot_groupsize=group, out_dtype=dtype,
        )  # fmt: skip
        assert got.dtype == dtype and torch.equal(got, want)
        params = AsymW4A8Int8Layout.Params(
            scale=p["weight_s_rel"], s_channel=p["weight_s_channel"], codebook=p["weight_codebook"],
            group_size=16, convrot_groupsize=group, orig_dtype=dtype, orig_shape=tuple(w.shape),
        )  # fmt: skip
        comfyui = F.linear(x, QuantizedTensor(p["weight"], "AsymW4A8Int8Layout", params), bias_in)
        assert torch.equal(got, comfyui)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [256, 64, 16])
def test_w4a4_linear_decodes_as_comfy_kitchen_dequantizes_and_computes_with_it(group, dtype, monkeypatch):
    """No int4 GEMM here: every call decodes (comfy-kitchen's ``dequantize_convrot_w4a4_weight`` of the stored parts,
    bit for bit where its rotation is ours) and runs `F.linear` with it; "kernel" decodes too (there is none)."""
    from comfy_kitchen.backends.eager import convrot_w4a4 as ck

    from quantize.formats import _hadamard

    monkeypatch.setattr(ck, "_rotate_weight", lambda w, h, g: _hadamard.rotate(w, g))
    options = ComfyOptions("convrot_w4a4", convrot_group=group)
    w, b, x = _layer(40, 256, 6, dtype)
    for compute in ("fast", "kernel"):
        m = ComfyW4a4Linear.from_weight(w, b, options, compute=compute)
        assert not m.uses_fast_path(x) and m.options.group == group
        p = m.stored()
        want = ck.dequantize_convrot_w4a4_weight(p["weight"], p["weight_scale"], group)
        assert torch.equal(m.dequantize(), want)
        assert torch.equal(m(x), F.linear(x, want.to(dtype), b.to(dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(96, 128, 10), (12, 20, 7), (33, 45, 5)], ids=lambda s: "x".join(map(str, s))
)
def test_torchao_int8_linear_is_torchaos_int8_tensor_linear_bit_for_bit(shape, dtype):
    """The kernel against torchao's own `F.linear` on the `Int8Tensor` diffusers loads (per-row activations in the
    input's dtype, `_int_mm`, both scales); an all-zero input row included."""
    w, b, x = _layer(*shape, dtype)
    for bias in (b, None):
        m = TorchaoInt8Linear.from_weight(w, bias, compute="kernel")
        skip_without_kernel(m, x)
        assert m.uses_fast_path(x) and type(m.weight).__name__ == "Int8Tensor"
        want = F.linear(x, m.weight, None if bias is None else bias.to(dtype))
        got = m(x)
        assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torchao_int8_linear_on_cuda_is_torchaos_too(dtype):
    """On CUDA: our `int_mm` (padded, the weight column-major) against torchao's cuBLAS path, 24 rows x 96 -> 128."""
    w, b, x = _layer(128, 96, 12, dtype)
    m = TorchaoInt8Linear.from_weight(w, b, compute="kernel").to("cuda")
    x = x.cuda()
    assert m.uses_fast_path(x)
    assert torch.equal(m(x), F.linear(x, m.weight, m.bias.to(dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(96, 128, 10), (16, 32, 3), (48, 64, 1)], ids=lambda s: "x".join(map(str, s))
)
def test_comfy_fp8_linear_is_comfy_kitchens_tensor_core_fp8_linear_bit_for_bit(shape, dtype):
    from comfy_kitchen.tensor import QuantizedTensor, TensorCoreFP8Layout

    w, b, x = _layer(*shape, dtype)
    m = ComfyFP8Linear.from_weight(w, b, compute="kernel")  # on the CPU too, where "fast" decodes instead
    skip_without_kernel(m, x)
    assert m.uses_fast_path(x)
    parts = m.stored()
    weight = QuantizedTensor(
        parts["weight"],
        "TensorCoreFP8Layout",
        TensorCoreFP8Layout.Params(
            scale=parts["weight_scale"], orig_dtype=x.dtype, orig_shape=tuple(parts["weight"].shape)
        ),
    )
    x2d = x.reshape(-1, x.shape[-1])
    want = F.linear(QuantizedTensor.from_float(x2d, "TensorCoreFP8Layout"), weight, m.bias.to(dtype))
    got = m(x)
    assert got.dtype == dtype and got.shape == (*x.shape[:-1], shape[0])
    assert torch.equal(got.reshape(-1, shape[0]), want)


def test_comfy_fp8_linear_off_its_fast_path_and_on_a_zero_input():
    """Dims not multiples of 16: "fast" decodes the weight, exactly ("kernel" refuses); an all-zero input: the bias
    (scale 1, no 0/0)."""
    w, b, x = _layer(40, 24, 5, torch.bfloat16)
    m = ComfyFP8Linear.from_weight(w, b)
    m.KERNEL_ON_CPU = True  # "fast" would take the kernel here, were the dims its
    assert not m.uses_fast_path(x)
    assert torch.equal(m(x), F.linear(x, m.dequantize(torch.bfloat16), b))
    w, b, x = _layer(32, 64, 4, torch.bfloat16)
    m = ComfyFP8Linear.from_weight(w, b, compute="kernel")
    skip_without_kernel(m, x)
    assert m.uses_fast_path(x) and torch.equal(m(torch.zeros_like(x)), b.expand(2, 4, 32))


@pytest.mark.parametrize(
    "cls, kernel_on_cpu",
    [
        (FP8Linear, False),
        (ComfyFP8Linear, False),
        (Float8Linear, False),
        (Int8Linear, True),
        (TorchaoInt8Linear, False),
    ],
)
def test_fast_runs_the_kernel_on_the_cpu_only_where_it_beats_decoding(cls, kernel_on_cpu):
    """`make bench` (docs/BENCHMARKS.md): float8's emulated CPU `_scaled_mm` and torchao's CPU path cost 3-4x a
    bf16 step, decoding about 1x; int8's `_int_mm` is as fast as bf16. "fast" takes the faster, "kernel" the kernel."""
    w, b, x = _layer(32, 64, 4, torch.bfloat16)
    fast, kernel = cls.from_weight(w, b), cls.from_weight(w, b, compute="kernel")
    skip_without_kernel(kernel, x)
    assert fast.uses_fast_path(x) == kernel_on_cpu and kernel.uses_fast_path(x)
    assert torch.equal(fast(x), kernel(x) if kernel_on_cpu else fast.reference_forward(x))


GGUF_TYPES = list(GgufOptions.TYPES)  # Q8_0, the K-quants, the _0 / _1 types


@pytest.mark.parametrize("ggml_type", GGUF_TYPES)
def test_gguf_linear_decodes_as_gguf_py_and_computes_with_it(ggml_type):
    w, b, x = _layer(24, 512, 6, torch.bfloat16)
    m = GGUFLinear.from_weight(w, b, GgufOptions(ggml_type))
    blocks = m.stored()["weight"]
    assert blocks.dtype == torch.uint8 and m.options.type_name == ggml_type
    want = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType[ggml_type])
    want = torch.from_numpy(np.ascontiguousarray(want, dtype=np.float32))
    assert want.shape == w.shape and torch.equal(m.dequantize(), want)
    assert torch.equal(m.dequantize(torch.bfloat16), want.to(torch.bfloat16))
    assert torch.equal(m(x), F.linear(x, want.to(torch.bfloat16), b))


def _module(cls, options=None):
    """A module of `cls` from `layer_weights`' layer (in_features 256: a K-quant's block)."""
    w, b = layer_weights(96, 256)
    if cls is GGUFLinear:
        return GGUFLinear.from_weight(w, b, options)
    return cls.from_weight(w, b)


NEW_MODULES = [
    pytest.param(ComfyFP8Linear, None, id="ComfyFP8Linear"),
    pytest.param(Int8Linear, None, id="Int8Linear"),
    pytest.param(TorchaoInt8Linear, None, id="TorchaoInt8Linear"),
    pytest.param(GGUFLinear, GgufOptions("Q8_0"), id="GGUFLinear-Q8_0"),
    pytest.param(GGUFLinear, GgufOptions("Q4_K"), id="GGUFLinear-Q4_K"),
    pytest.param(ComfyW4a8Linear, None, id="ComfyW4a8Linear"),
    pytest.param(ComfyW4a4Linear, None, id="ComfyW4a4Linear"),
]


@pytest.mark.parametrize("cls, options", NEW_MODULES)
def test_state_dict_keys_are_the_formats_part_names(cls, options):
    m = _module(cls, options)
    parts = cls.FORMAT.parts((96, 256), *(() if options is None else (options,)))
    assert set(m.state_dict()) == set(parts) | {"bias"}


@pytest.mark.parametrize("cls, options", NEW_MODULES)
def test_deepcopy_copies_the_stored_parts_and_nothing_wider(cls, options):
    m = _module(cls, options)
    clone = copy.deepcopy(m)
    assert storage_ids(clone).isdisjoint(storage_ids(m))
    assert clone.options == m.options and type(clone) is cls
    for (name, t), (_, u) in zip(m.state_dict().items(), clone.state_dict().items(), strict=True):
        assert same_bytes(t, u), name
    biggest = max(t.numel() * t.element_size() for t in clone.state_dict().values())
    assert biggest < 96 * 256 * 2  # nothing in the copy holds the weight in bf16
    x = layer_input(inp=256)
    assert torch.equal(clone(x), m(x))


@pytest.mark.parametrize("cls, options", NEW_MODULES)
def test_to_moves_while_weak_references_to_every_tensor_are_held(cls, options):
    m = _module(cls, options)
    x = layer_input(inp=256)
    before = m(x)
    refs = [weakref.ref(t) for t in (*m.buffers(), *m.parameters())]  # noqa: F841 (held across the moves)
    m.to("cpu")
    m.to(torch.bfloat16)
    assert torch.equal(m(x), before)
    m.to("meta")
    assert all(t.is_meta for t in (*m.buffers(), *m.parameters()))


@pytest.mark.parametrize("cls, options", NEW_MODULES)
def test_to_dtype_moves_the_bias_but_never_the_stored_parts(cls, options):
    m = _module(cls, options)
    before = {k: t.clone() for k, t in m.state_dict().items() if k != "bias"}
    m.to(torch.bfloat16)
    assert all(same_bytes(m.state_dict()[k], t) for k, t in before.items())
    assert m.bias.dtype == torch.bfloat16
    m.to(torch.float16)
    m.float()
    assert all(same_bytes(m.state_dict()[k], t) for k, t in before.items())
    assert m.bias.dtype == torch.float32


@pytest.mark.parametrize("cls, options", NEW_MODULES)
def test_parts_are_frozen_byte_parameters_read_back_typed_without_a_copy(cls, options):
    """What FSDP2 shards and what "the first floating parameter" rules (diffusers' `ModelMixin.dtype`) read: each
    part is a frozen uint8 parameter `<part>_bytes`, its typed view the stored part (same memory), never floating; a
    cast of those bytes is refused in one line rather than read as values."""
    m = _module(cls, options)
    parts = cls.FORMAT.parts((96, 256), *(() if options is None else (options,)))
    held = {n: p for n, p in m.named_parameters() if n != "bias"}
    assert set(held) == {p.replace(".", "_") + "_bytes" for p in parts}
    assert all(p.dtype == torch.uint8 and not p.requires_grad for p in held.values())
    for part, t in m.stored().items():
        assert t.data_ptr() == held[part.replace(".", "_") + "_bytes"].data_ptr()
        assert t.nbytes == held[part.replace(".", "_") + "_bytes"].nbytes
    assert [p.dtype for p in m.parameters() if p.is_floating_point()] == [m.bias.dtype]
    name = next(iter(held))
    m._parameters[name] = torch.nn.Parameter(held[name].to(torch.bfloat16), requires_grad=False)
    with pytest.raises(TypeError, match=rf"'{name}' was cast to torch.bfloat16: .* param_dtype unset"):
        m(layer_input(inp=256))
