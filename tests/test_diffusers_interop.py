"""Our torchao_fp8, torchao_int8 and nf4 checkpoints load unchanged in diffusers and compute exactly what
diffusers/torchao/bitsandbytes compute for the same model quantized in memory.

Known here: torchao's `quantize_` refuses Float8 without an SM89 GPU, so the in-memory reference applies
`Float8Tensor.from_hp` with the config's arguments to each targeted Linear, as `quantize_` would (its int8 runs on
the CPU: there the reference is `quantize_` itself); diffusers' bitsandbytes quantizer refuses to start without a
GPU, so its `validate_environment` is lifted (and only that).
"""

from __future__ import annotations

import re
from pathlib import Path

import diffusers
import pytest
import torch

from quantize.recipes import load_recipe
from tests import diffusers_models as models
from tests.conftest import load_all, read_json, run_cli
from tests.formats.references import torchao_float8 as float8_reference


def _wan(path: Path) -> Path:
    return models.wan(path)


def _kandinsky(path: Path) -> Path:
    return models.kandinsky5(path)


_wan_inputs, _kandinsky_inputs = models.wan_inputs, models.kandinsky5_inputs


def _targets(recipe: str) -> list[re.Pattern]:
    return [re.compile(p) for p in load_recipe(recipe).recipe.targets]


def _quantize_in_memory_with_torchao(model: torch.nn.Module, recipe: str) -> set[str]:
    """What `quantize_(model, <the config of the recipe's format>)` does to the targets: torchao's own `quantize_`
    for int8 (``Int8DynamicActivationInt8WeightConfig()``); for Float8 (``granularity=PerRow()``) `from_hp`."""
    targets = _targets(recipe)
    done = {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and any(p.fullmatch(name) for p in targets)
    }
    if load_recipe(recipe).recipe.format == "torchao_int8":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        # set_inductor_config=False: the same weights, without changing the process's torch._inductor settings
        config = Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
        quantize_(model, config, filter_fn=lambda module, name: name in done)
    else:
        for name in done:
            module = model.get_submodule(name)
            module.weight = torch.nn.Parameter(float8_reference(module.weight.data), requires_grad=False)
    return done


def _torchao_modules(model: torch.nn.Module) -> dict[str, type]:
    """The modules whose weight is a torchao tensor subclass, and its class."""
    from torchao.utils import TorchAOBaseTensor

    return {
        n: type(m.weight)
        for n, m in model.named_modules()
        if isinstance(getattr(m, "weight", None), TorchAOBaseTensor)
    }


def _sqnr_db(want: torch.Tensor, got: torch.Tensor) -> float:
    want, got = want.double(), got.double()
    return float(10 * torch.log10(want.pow(2).sum() / (want - got).pow(2).sum()))


#: the checkpoint's forward against the unquantized bf16 model; measured: wan 41.0 dB torchao_fp8, 47.2 dB
#: torchao_int8; kandinsky5 inf (its zero-initialized modulation gates every block off, as in diffusers' own init)
MIN_FORWARD_SQNR_DB = 35


@pytest.mark.parametrize(
    "build, cls, recipe, inputs",
    [
        (_wan, "WanTransformer3DModel", "wan-diffusers-torchao-fp8.yaml", _wan_inputs),
        (_kandinsky, "Kandinsky5Transformer3DModel", "kandinsky5-torchao-fp8.yaml", _kandinsky_inputs),
        (_wan, "WanTransformer3DModel", "wan-diffusers-torchao-int8.yaml", _wan_inputs),
    ],
    ids=["wan-fp8", "kandinsky5-fp8", "wan-int8"],
)
def test_torchao_checkpoint_loads_in_diffusers_and_matches_torchao(tmp_path, build, cls, recipe, inputs):
    model_cls = getattr(diffusers, cls)
    src = tmp_path / "src"
    build(src / "transformer")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", recipe, check=True)

    ours = model_cls.from_pretrained(out / "transformer", torch_dtype=torch.bfloat16).eval()
    reference = model_cls.from_pretrained(src / "transformer", torch_dtype=torch.bfloat16).eval()
    plain = model_cls.from_pretrained(src / "transformer", torch_dtype=torch.bfloat16).eval()
    expected = _quantize_in_memory_with_torchao(reference, recipe)
    assert _torchao_modules(ours) == _torchao_modules(reference) and set(_torchao_modules(ours)) == expected
    assert expected
    for name in expected:
        mine, theirs = ours.get_submodule(name).weight, reference.get_submodule(name).weight
        assert mine.dtype == theirs.dtype and mine.block_size == theirs.block_size
        for attr in (*mine.tensor_data_names, *getattr(mine, "optional_tensor_data_names", ())):
            a, b = getattr(mine, attr), getattr(theirs, attr)
            assert (a is None and b is None) or (
                a.dtype == b.dtype
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
            ), (name, attr)
    with torch.no_grad():
        got, want, bf16 = (m(**inputs())[0] for m in (ours, reference, plain))
    assert torch.equal(got, want)
    assert _sqnr_db(bf16, got) > MIN_FORWARD_SQNR_DB, _sqnr_db(bf16, got)
    assert read_json(out / "transformer" / "config.json")["quantization_config"]["quant_method"] == "torchao"


KANDINSKY_KEPT = re.compile(
    r"(time_embeddings|text_embeddings|pooled_text_embeddings|visual_embeddings)\..*"  # embeddings
    r"|.*modulation.*"  # every modulation layer
    r"|out_layer\.out_layer"  # the final output layer
    r"|(text|visual)_transformer_blocks\.\d+\.feed_forward\.out_layer"
)


def test_kandinsky5_recipe_quantizes_exactly_the_layers_of_the_kandinsky5_fp8_work(tmp_path):
    from quantize.plan import make_plan

    src = tmp_path / "src"
    _kandinsky(src / "transformer")
    (cp,) = make_plan(src, load_recipe("kandinsky5-torchao-fp8.yaml").recipe).components
    linears = {
        k.removesuffix(".weight")
        for k, v in load_all(src / "transformer").items()
        if k.endswith(".weight") and v.dim() == 2
    }
    expected = {m for m in linears if not KANDINSKY_KEPT.fullmatch(m)}
    assert {t.module for t in cp.quantized()} == expected
    config = read_json(src / "transformer" / "config.json")
    # text blocks: q, k, v, out, ffn-in; visual blocks: two attentions + ffn-in
    assert len(expected) == 5 * config["num_text_blocks"] + 9 * config["num_visual_blocks"]
    assert {
        "visual_transformer_blocks.0.feed_forward.out_layer",
        "out_layer.out_layer",
        "visual_embeddings.in_layer",
    } <= set(cp.kept_linears())


@pytest.fixture
def bnb_on_cpu(monkeypatch):
    """Lift diffusers' GPU gate of its bitsandbytes quantizer (and nothing else)."""
    import bitsandbytes  # noqa: F401  (a dev dependency: missing is a failure, not a skip)
    from diffusers.quantizers.bitsandbytes.bnb_quantizer import BnB4BitDiffusersQuantizer

    monkeypatch.setattr(BnB4BitDiffusersQuantizer, "validate_environment", lambda self, *a, **k: None)


@pytest.fixture
def one_thread():
    """bitsandbytes' nested offset is a mean whose last bit depends on torch's thread count; we take it on one."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_nf4_equals_what_diffusers_writes_and_loads_back(tmp_path, bnb_on_cpu, one_thread):
    src = tmp_path / "src"
    _wan(src / "transformer")
    out = tmp_path / "out"
    run_cli("convert", src, out, "--recipe", "wan-diffusers-nf4.yaml", check=True)
    config = read_json(out / "transformer" / "config.json")["quantization_config"]
    kept = config["llm_int8_skip_modules"]

    bnb_config = diffusers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        llm_int8_skip_modules=kept,
    )
    assert config == bnb_config.to_dict()
    reference = diffusers.WanTransformer3DModel.from_pretrained(
        src / "transformer",
        quantization_config=bnb_config,
        torch_dtype=torch.bfloat16,
        device_map={"": "cpu"},
    ).eval()
    reference.save_pretrained(tmp_path / "diffusers-nf4")

    theirs, ours = load_all(tmp_path / "diffusers-nf4"), load_all(out / "transformer")
    quantized_keys = {
        k for k in theirs if ".weight." in k or (k.endswith(".weight") and theirs[k].dtype == torch.uint8)
    }
    assert len(quantized_keys) == 2 * 10 * 6  # 2 blocks x 10 Linears x 6 stored parts
    for key in quantized_keys:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    for key in (
        set(theirs) - quantized_keys
    ):  # kept tensors: the same values (diffusers keeps some modules in fp32)
        assert torch.equal(ours[key].to(theirs[key].dtype), theirs[key]), key
    assert set(ours) == set(theirs)

    loaded = diffusers.WanTransformer3DModel.from_pretrained(
        out / "transformer", torch_dtype=torch.bfloat16, device_map={"": "cpu"}
    ).eval()
    import bitsandbytes as bnb

    assert isinstance(loaded.blocks[0].ffn.net[2].weight, bnb.nn.Params4bit)
    with torch.no_grad():
        assert torch.equal(loaded(**_wan_inputs())[0], reference(**_wan_inputs())[0])
