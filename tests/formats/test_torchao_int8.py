"""torchao_int8: read back by torchao, its zero rows, metadata and config as torchao/diffusers write them, and the
reference held to torchao's own `quantize_`. Bit-exactness to `Int8Tensor.from_hp` and the shared checks are
`test_contract.py`'s; diffusers loading a converted Wan and running it is `test_diffusers_interop.py`'s."""

from __future__ import annotations

import json

import pytest
import torch

from quantize.errors import InputError
from quantize.formats import format_of_config, get_format
from quantize.formats import torchao_int8 as ao_module
from quantize.formats._torchao import torchao
from tests.formats.references import torchao_int8_tensor as reference

ao_fmt = ao_module.FORMAT


def _weight(dtype: torch.dtype, shape: tuple[int, int] = (96, 160)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=g) * 0.03
    w[5, 7] = 3.0  # an outlier
    w[9] = 1e-3 * torch.randn(shape[1], generator=g)  # a row of small values
    w[11] = 1e-30  # a row below the scale's floor
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_decode_is_torchaos_dequantize(dtype):
    w = _weight(dtype)
    assert torch.equal(ao_fmt.decode(ao_fmt.encode(w), torch.bfloat16), reference(w).dequantize())
    assert torch.equal(ao_fmt.decode(ao_fmt.encode(w)), reference(w).dequantize(torch.float32))


def test_the_reference_is_what_quantize_applies_to_a_linear():
    """`references.torchao_int8_tensor` spells `from_hp` with the config's arguments; torchao's own `quantize_` of a
    bf16 Linear (on the CPU it runs) gives the same tensor. set_inductor_config=False only spares the process
    torchao's global inductor settings; it changes nothing of the weight."""
    from torchao.quantization import quantize_

    w = _weight(torch.bfloat16, (48, 64))
    linear = torch.nn.Linear(64, 48, bias=False, dtype=torch.bfloat16)
    linear.weight.data = w.clone()
    quantize_(linear, torchao().Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    theirs, ref = linear.weight, reference(w)
    assert type(theirs) is type(ref) and theirs.dtype == ref.dtype == torch.bfloat16
    for name in ("qdata", "scale", "zero_point"):
        assert torch.equal(getattr(theirs, name), getattr(ref, name)), name
    assert theirs.block_size == ref.block_size == [1, 64] and theirs.act_quant_kwargs == ref.act_quant_kwargs


def test_zero_rows_get_torchaos_floor_scale_and_exact_zeros():
    """torchao clamps a zero scale to float32's eps (no 0/0, unlike its Float8Tensor): the format takes it as is."""
    w = torch.randn(32, 32).to(torch.bfloat16)
    w[4] = 0
    parts, ref = ao_fmt.encode(w), reference(w)
    assert ref.scale[4].item() == torch.finfo(torch.float32).eps and not ref.qdata[4].any()
    assert torch.equal(parts["_weight_scale"], ref.scale) and torch.equal(parts["_weight_qdata"], ref.qdata)
    assert torch.equal(ao_fmt.decode(parts)[4], torch.zeros(32))


def test_the_extremes_round_as_torchao_rounds_them():
    """scale = amax / 127.5: the row's -amax is -127.5 steps (half to even: -128), +amax clamps to 127."""
    w = torch.tensor([[1.0, -127.5], [127.5, -1.0], [0.0, 0.0]])
    parts, ref = ao_fmt.encode(w), reference(w)
    assert parts["_weight_qdata"].tolist() == [[1, -128], [127, -1], [0, 0]]
    assert torch.equal(parts["_weight_qdata"], ref.qdata) and torch.equal(parts["_weight_scale"], ref.scale)


def test_stored_parts_rebuild_an_int8_tensor_that_matches_torchao():
    w = torch.randn(48, 64).to(torch.bfloat16)
    ours = ao_module.to_int8_tensor(ao_fmt.encode(w))
    ref = reference(w)
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert type(ours) is type(ref) and ours.block_size == ref.block_size and ours.dtype == ref.dtype
    assert torch.equal(torch.nn.functional.linear(x, ours), torch.nn.functional.linear(x, ref))


def test_every_shape_is_held():
    """torchao quantizes any 2-D weight (its CUDA matmul falls back where cuBLAS cannot take the shape)."""
    assert ao_fmt.parts((24, 20)) == {
        "_weight_qdata": ("I8", (24, 20)),
        "_weight_scale": ("F32", (24, 1)),
        "_weight_zero_point": ("I8", (24, 1)),
    }


def test_metadata_is_what_torchao_flatten_writes():
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    w = torch.randn(32, 64).to(torch.bfloat16)
    state = {
        "blocks.0.q.weight": reference(w),
        "blocks.0.q.bias": torch.zeros(32),
        "scale_shift_table": torch.zeros(1, 2, 3),
    }
    data, metadata = flatten_tensor_state_dict(state)
    ours = ao_fmt.checkpoint_metadata(
        [
            ("blocks.0.q.weight", (32, 64), ao_fmt.options_type.from_type(None)),
            ("blocks.0.q.bias", None, None),
            ("scale_shift_table", None, None),
        ]
    )
    assert ours == metadata  # string for string
    parts = ao_fmt.encode(w)
    assert {k for k in data if k.startswith("blocks.0.q._")} == {f"blocks.0.q.{p}" for p in parts}
    for part, t in parts.items():
        assert data[f"blocks.0.q.{part}"].dtype == t.dtype and torch.equal(data[f"blocks.0.q.{part}"], t)


def test_quantization_config_is_diffusers_torchao_config():
    import diffusers

    kept = ["proj_out", "blocks.0.ffn.net.2"]
    cfg = torchao().Int8DynamicActivationInt8WeightConfig()
    assert (
        ao_fmt.quantization_config(kept)
        == diffusers.TorchAoConfig(cfg, modules_to_not_convert=sorted(kept)).to_dict()
    )
    explicit = torchao().Int8DynamicActivationInt8WeightConfig(granularity=torchao().PerRow())
    assert ao_fmt.quantization_config([]) == diffusers.TorchAoConfig(explicit).to_dict()


def test_serialized_forms_are_torchaos_own_string_for_string():
    """The format writes torchao's JSON without importing torchao: the same strings its encoders give."""
    ao = torchao()
    for in_features in (16, 1536, 13824):
        probe = ao_module.to_int8_tensor(ao_fmt.encode(torch.zeros(1, in_features)))
        assert ao_module._weight_json(in_features) == json.dumps(probe, cls=ao.JSONEncoder)
    theirs = ao.config_to_dict(ao.Int8DynamicActivationInt8WeightConfig())
    assert json.dumps(ao_fmt.quantization_config([])["quant_type"]["default"]) == json.dumps(theirs)


def test_the_two_torchao_formats_are_told_apart_by_their_config_class():
    for name in ("torchao_fp8", "torchao_int8"):
        fmt = get_format(name)
        assert format_of_config(fmt.quantization_config(["proj_out"]), "config.json") is fmt
    other = ao_fmt.quantization_config([])
    other["quant_type"]["default"]["_type"] = "Int4WeightOnlyConfig"
    with pytest.raises(InputError) as e:
        format_of_config(other, "out/config.json")
    assert str(e.value) == (
        "out/config.json: quantization_config.quant_type.default._type is 'Int4WeightOnlyConfig' for quant_method "
        "'torchao'; known: Float8DynamicActivationFloat8WeightConfig (torchao_fp8), "
        "Int8DynamicActivationInt8WeightConfig (torchao_int8)"
    )


def test_converting_to_torchao_int8_does_not_import_torchao(tmp_path):
    import subprocess
    import sys

    from quantize.examples import write_example

    src = tmp_path / "src"
    write_example(src, "tiny", "t2v")
    code = (
        "import sys; from quantize.cli import main\n"
        f"try: main(['convert', {str(src)!r}, {str(tmp_path / 'out')!r}, '--recipe', 'wan-torchao-int8.yaml'])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchao'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip().splitlines()[-1] == "[]"
