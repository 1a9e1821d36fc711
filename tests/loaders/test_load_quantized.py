"""`load_quantized` end to end: checkpoints written by the CLI, loaded into diffusers' Wan and Kandinsky 5 classes
(and a plain nn.Module), compared with the checkpoint bit for bit and with the dequantized reference forward."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import diffusers
import pytest
import torch
from safetensors.torch import save_file

from loaders import CheckpointMismatchError, FP8Linear, QuantizedLinear, load_quantized
from loaders.modules import MODULES
from quantize import dtypes
from quantize.errors import InputError
from quantize.formats import FormatOptions, _comfy, format_for, get_format, part_key
from quantize.formats.options import GgufOptions
from tests import diffusers_models as models
from tests.conftest import load_all, run_cli, skip_without_kernel
from tests.loaders.conftest import (
    CASES,
    GGUF_PLAIN,
    MODEL_FORMATS,
    MODELS,
    checkpoint_keys,
    checkpoint_module,
    gguf_tensors,
    model_module,
    same_bytes,
    stored_tensors,
)


def _quantized_modules(checkpoint: Path, fmt) -> dict[str, tuple[dict[str, torch.Tensor], FormatOptions]]:
    """The checkpoint's name of each quantized module -> (its stored parts, the options they are in), read with the
    container's own reader: safetensors, or gguf-py for a GGUF file (each layer's GGML type off the file)."""
    files = sorted(checkpoint.glob("*.gguf"))
    if files:
        return {
            name.removesuffix(".weight"): ({"weight": t}, GgufOptions(ggml_type))
            for name, (ggml_type, t) in gguf_tensors(files[0]).items()
            if ggml_type not in GGUF_PLAIN
        }
    tensors = load_all(checkpoint)
    markers = {k.removesuffix(".comfy_quant"): t for k, t in tensors.items() if k.endswith(".comfy_quant")}
    if (
        markers
    ):  # ComfyUI's: each layer's layout is its marker's (one file may mix them), read as ComfyUI reads it
        found = {}
        for m, marker in markers.items():
            options = _comfy.layout_of_marker(json.loads(marker.numpy().tobytes()))
            parts = format_for(fmt, options).parts((64, 64), options)
            found[m] = ({p: tensors[part_key(m, p)] for p in parts}, options)
        return found
    first = next(iter(fmt.parts((64, 64))))
    dtype = dtypes.by_name(fmt.parts((64, 64))[first][0]).torch
    modules = {
        k.removesuffix("." + first)
        for k, t in tensors.items()
        if k.endswith("." + first) and t.dtype == dtype
    }
    options = fmt.options_type.from_type(None)  # one layout for the whole file (a comfy format's default)
    return {m: ({p: tensors[part_key(m, p)] for p in fmt.parts((64, 64))}, options) for m in modules}


def _sqnr(want: torch.Tensor, got: torch.Tensor) -> float:
    noise = float((want.double() - got.double()).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(want.double().pow(2).sum()) / noise)


def _dequantized_reference(model: str, src: Path, out: Path, fmt) -> torch.nn.Module:
    """The source model as diffusers loads it in bf16, each quantized Linear's weight replaced by its decoded value
    (a checkpoint in native names: each module found through the family's name table)."""
    cls = getattr(diffusers, MODELS[model][0])
    reference = cls.from_pretrained(src, torch_dtype=torch.bfloat16).eval()
    stored = _quantized_modules(out, fmt)
    for name, (parts, options) in stored.items():
        linear = reference.get_submodule(model_module(name, stored, model))
        shape = tuple(linear.weight.shape)
        linear.weight.data = format_for(fmt, options).decoded(parts, shape, torch.bfloat16, options=options)
    return reference


@pytest.mark.parametrize("model, fmt_name", CASES)
@pytest.mark.parametrize("host", ["mmap", "pageable"])
def test_every_format_loads_into_the_model_class_bit_exact(converted, model, fmt_name, host):
    src, out = converted(model, fmt_name)
    fmt = get_format(fmt_name)
    cls_name, _, inputs = MODELS[model]
    loaded = load_quantized(getattr(diffusers, cls_name), out, host=host, dtype=torch.bfloat16)

    assert type(loaded).__name__ == cls_name and not loaded.training
    on_disk = stored_tensors(out)
    stored = _quantized_modules(out, fmt)
    quantized = {n: m for n, m in loaded.named_modules() if isinstance(m, QuantizedLinear)}
    assert stored and {checkpoint_module(n, on_disk, model) for n in quantized} == set(stored)
    for n, m in quantized.items():  # each layer in its own layout's module (a mixed ComfyUI file's differ)
        options = stored[checkpoint_module(n, on_disk, model)][1]
        assert m.options == options and type(m) is MODULES[format_for(fmt, options).NAME]
    # every tensor of the model is one of the checkpoint's, by its name there, and every one of those is given
    keys = checkpoint_keys(loaded, on_disk, model)
    assert sorted(keys.values()) == sorted(on_disk)
    state = loaded.state_dict()
    fp32_modules = set(loaded._keep_in_fp32_modules)
    parts = {part_key(m, p) for m, (ps, _) in stored.items() for p in ps}
    for key, got in state.items():
        want = on_disk[keys[key]]
        if keys[key] in parts or not want.is_floating_point():
            assert same_bytes(got, want), key
        else:  # kept: cast as diffusers' from_pretrained(torch_dtype=bf16) would
            dtype = torch.float32 if fp32_modules & set(key.split(".")) else torch.bfloat16
            assert got.dtype == dtype and torch.equal(got, want.to(dtype)), key

    reference = _dequantized_reference(model, src, out, fmt)
    with torch.no_grad():
        want = reference(**inputs())[0]
        got = loaded(**inputs())[0]
        # activations quantized per call (fp8 per row or per tensor, int8 per row, W4A8 rotated first): a small,
        # bounded error; then
        # the dequantize path, which is the reference exactly
        if fmt_name in ("fp8_channel", "comfy_fp8", "comfy_int8", "comfy_w4a8"):
            assert _sqnr(want, got) > 30
            for m in loaded.modules():
                if isinstance(m, QuantizedLinear):
                    m.compute = "dequantize"
            got = loaded(**inputs())[0]
        if fmt_name in ("torchao_fp8", "torchao_int8"):  # the kernel ("fast" decodes on the CPU): diffusers'
            for m in loaded.modules():
                if isinstance(m, QuantizedLinear):
                    m.compute = "kernel"
                    skip_without_kernel(m, torch.zeros(1, m.in_features, dtype=torch.bfloat16))
            got = loaded(**inputs())[0]
            assert _sqnr(want, got) > 30
            want = (
                getattr(diffusers, cls_name)
                .from_pretrained(out, torch_dtype=torch.bfloat16)
                .eval()(**inputs())[0]
            )
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_dtype_none_keeps_the_stored_dtypes(converted):
    _, out = converted("wan", "fp8_channel")
    loaded = load_quantized(diffusers.WanTransformer3DModel, out)
    on_disk = load_all(out)
    assert all(t.dtype == on_disk[k].dtype for k, t in loaded.state_dict().items())


def _mapped_files() -> set[str]:
    return {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(".safetensors")
    }


def test_mmap_maps_the_shards_and_pageable_reads_them(converted, tmp_path):
    out = tmp_path / "own-copy"  # files no other test has mapped
    shutil.copytree(converted("wan", "nf4")[1], out)
    shards = {str(p.resolve()) for p in out.glob("*.safetensors")}
    paged = load_quantized(diffusers.WanTransformer3DModel, out, host="pageable")
    assert not shards & _mapped_files()
    mapped = load_quantized(diffusers.WanTransformer3DModel, out, host="mmap")
    assert shards <= _mapped_files()
    x = MODELS["wan"][2]()
    with torch.no_grad():
        assert torch.equal(mapped(**x)[0], paged(**x)[0])


def test_pinned_host_needs_cuda(converted):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _, out = converted("wan", "fp8_channel")
    with pytest.raises(ValueError, match="host='pinned' needs CUDA.*'pageable'"):
        load_quantized(diffusers.WanTransformer3DModel, out, host="pinned")


@pytest.mark.parametrize("host", ["mmap", "pageable"])
def test_loading_straight_to_a_device(converted, host):
    _, out = converted("kandinsky5", "nf4")
    loaded = load_quantized(diffusers.Kandinsky5Transformer3DModel, out, host=host, device="meta")
    assert {t.device.type for t in (*loaded.parameters(), *loaded.buffers())} == {"meta"}
    assert loaded.state_dict().keys() == load_all(out).keys()


def test_a_loaded_model_can_be_filled_again_and_refuses_another_format(converted):
    _, out = converted("wan", "nf4")
    model = load_quantized(diffusers.WanTransformer3DModel, out, host="pageable")
    x = MODELS["wan"][2]()
    with torch.no_grad():
        want = model(**x)[0]
    assert load_quantized(model, out, host="mmap") is model
    with torch.no_grad():
        assert torch.equal(model(**x)[0], want)
    _, fp8 = converted("wan", "fp8_channel")
    with pytest.raises(
        CheckpointMismatchError,
        match=r"'blocks\.0\.[\w.]+' is a NF4Linear \(nf4\); the checkpoint stores it as fp8_channel",
    ):
        load_quantized(model, fp8)


class Toy(torch.nn.Module):
    """Not diffusers: a model with original-style names, built by hand."""

    def __init__(self, dim: int = 64, blocks: int = 3):
        super().__init__()
        self.embed = torch.nn.Linear(16, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "norm": torch.nn.LayerNorm(dim),
                    "ffn": torch.nn.Sequential(
                        torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim)
                    ),
                }
            )
            for _ in range(blocks)
        )
        self.head = torch.nn.Linear(dim, 16)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = h + b["ffn"](b["norm"](h))
        return self.head(h)


def _toy_checkpoint(tmp_path: Path, fmt: str) -> Path:
    torch.manual_seed(0)
    toy = Toy().to(torch.bfloat16)
    src = tmp_path / "toy"
    src.mkdir()
    save_file({k: v.contiguous() for k, v in toy.state_dict().items()}, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"dim": 64}))
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(f"name: toy\nformat: {fmt}\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n")
    out = tmp_path / "toy-q"
    run_cli("convert", src, out, "--recipe", recipe, check=True)
    return out


def test_an_nn_module_instance_is_filled_in_place(tmp_path):
    out = _toy_checkpoint(tmp_path, "fp8_channel")
    model = Toy()
    assert load_quantized(model, out, host="pageable") is model
    assert [type(b["ffn"][0]) for b in model.blocks] == [FP8Linear] * 3
    assert type(model.blocks[0]["ffn"][2]) is torch.nn.Linear and model.head.weight.dtype == torch.bfloat16

    reference = Toy().to(torch.bfloat16)
    reference.load_state_dict({k: v for k, v in load_all(out).items() if "ffn.0" not in k}, strict=False)
    for i, b in enumerate(reference.blocks):
        b["ffn"][0].weight.data = model.blocks[i]["ffn"][0].dequantize(torch.bfloat16)
        b["ffn"][0].bias.data = model.blocks[i]["ffn"][0].bias.data
    for m in model.modules():
        if isinstance(m, FP8Linear):
            m.compute = "dequantize"
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))


# -- a checkpoint that does not fit ------------------------------------------------------------------


def _wan_model(**changes):
    return models.wan_model(**{"num_layers": 3, **changes})


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"ffn_dim": 256},
            r"'blocks\.0\.ffn\.net\.0\.proj' \[256, 64\] in fp8_channel needs F8_E4M3\[256, 64\]",
        ),
        (
            {"num_layers": 2},
            r"checkpoint tensor\(s\) fit nothing in WanTransformer3DModel, e\.g\. 'blocks\.2\.",
        ),
        ({"num_layers": 4}, r"the model's 'blocks\.3\.[\w.]+' \[[\d, ]+\] is not in the checkpoint"),
    ],
    ids=["wider-ffn", "fewer-blocks", "more-blocks"],
)
def test_a_checkpoint_for_another_model_is_refused_naming_the_key(converted, changes, message):
    _, out = converted("wan", "fp8_channel")
    with pytest.raises(CheckpointMismatchError, match=message):
        load_quantized(_wan_model(**changes), out)


def _tampered(out: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "tampered"
    copy.mkdir()
    tensors = load_all(out)
    change(tensors)
    save_file(tensors, copy / "diffusion_pytorch_model.safetensors")
    (copy / "config.json").write_text((out / "config.json").read_text())
    return copy


def test_a_part_of_the_wrong_dtype_or_a_missing_part_is_named(converted, tmp_path):
    _, out = converted("wan", "fp8_channel")
    key = "blocks.1.attn1.to_q.weight_scale"

    def widen(t):
        t[key] = t[key].to(torch.bfloat16)

    with pytest.raises(CheckpointMismatchError, match=rf"'{key}' is BF16\[64, 1\]; .* needs F32\[64, 1\]"):
        load_quantized(diffusers.WanTransformer3DModel, _tampered(out, tmp_path, widen))

    def drop(t):
        del t[key]

    (tmp_path / "tampered").rename(tmp_path / "first")
    with pytest.raises(CheckpointMismatchError, match=rf"'{key}' is missing"):
        load_quantized(diffusers.WanTransformer3DModel, _tampered(out, tmp_path, drop))


def test_an_unquantized_checkpoint_is_refused(converted):
    src, _ = converted("wan", "fp8_channel")
    with pytest.raises(
        InputError, match=r"config\.json: has no quantization_config: not a quantized checkpoint"
    ):
        load_quantized(diffusers.WanTransformer3DModel, src)


def test_a_checkpoint_with_several_models_loads_each_into_a_class_and_asks_an_instance_which(
    converted, tmp_path
):
    _, out = converted("wan", "fp8_channel")
    for name in ("transformer", "transformer_2"):
        (tmp_path / "two" / name).mkdir(parents=True)
        for f in out.iterdir():
            (tmp_path / "two" / name / f.name).symlink_to(f)
    instance = load_quantized(diffusers.WanTransformer3DModel, out)
    with pytest.raises(InputError, match=r"holds several models \(transformer, transformer_2\)"):
        load_quantized(instance, tmp_path / "two")
    both = load_quantized(diffusers.WanTransformer3DModel, tmp_path / "two")
    assert list(both) == ["transformer", "transformer_2"]
    on_disk = load_all(out)
    # each model of the two; the model named; the one model, found
    for where, loaded in (
        *both.items(),
        *(
            (w, load_quantized(diffusers.WanTransformer3DModel, w))
            for w in (tmp_path / "two" / "transformer_2", out.parent)
        ),
    ):
        assert type(loaded) is diffusers.WanTransformer3DModel and not loaded.training, where
        state = loaded.state_dict()
        assert set(state) == set(on_disk), where
        for key, want in on_disk.items():  # the checkpoint's tensors, as stored (dtype=None keeps them)
            got = state[key]
            assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), key


def test_loaders_import_no_converter_or_cli():
    # the formats, the families' name tables (and run.names, the map of a native model's tensors a forward pass reads
    # too) and the checkpoint readers (safetensors, GGUF), and what they are made of (names: the part-key rule;
    # ggml_types: the GGML type table the formats read; read.files: which files form a component)
    allowed = (
        "formats",
        "models",
        "run.names",
        "read.checkpoint",
        "read.gguf",
        "read.files",
        "dtypes",
        "errors",
        "names",
        "ggml_types",
    )
    code = (
        "import sys, loaders; "
        f"allowed = {allowed!r}; "
        "bad = sorted(m for m in sys.modules if m.startswith('quantize.') and m not in ('quantize.read', "
        "'quantize.run') and not any("
        "m[len('quantize.'):] == a or m[len('quantize.'):].startswith(a + '.') for a in allowed)); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_class_that_cannot_be_built_from_the_config_is_named(converted):
    _, out = converted("wan", "fp8_channel")
    with pytest.raises(InputError, match=r"config\.json: cannot build Toy from it \(.*unexpected keyword"):
        load_quantized(Toy, out)


@pytest.mark.parametrize("fmt_name", MODEL_FORMATS["wan"])
def test_a_loaded_block_deep_copies_as_stored(converted, fmt_name):
    """What an offload manager does to make its staging buffers: copy.deepcopy(block). No bf16 weight appears."""
    import copy

    _, out = converted("wan", fmt_name)
    model = load_quantized(diffusers.WanTransformer3DModel, out, host="mmap", dtype=torch.bfloat16)
    block = model.blocks[1]
    clone = copy.deepcopy(block)
    theirs, ours = clone.state_dict(), block.state_dict()
    assert theirs.keys() == ours.keys()
    for key, t in ours.items():
        assert same_bytes(theirs[key], t), key
        assert theirs[key].untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or not t.numel()
    quantized = [m for m in clone.modules() if type(m) is MODULES[fmt_name]]
    assert quantized and all(
        t.dtype not in (torch.bfloat16, torch.float16) for m in quantized for t in m.buffers()
    )
