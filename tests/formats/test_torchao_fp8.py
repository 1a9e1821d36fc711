"""torchao_fp8: read back by torchao, its zero-row difference, metadata and config as torchao/diffusers write them.
Bit-exactness to torchao's own Float8Tensor.from_hp and the shared checks are `test_contract.py`'s."""

from __future__ import annotations

import json

import pytest
import torch

from quantize.formats import torchao_fp8 as ao_module
from quantize.formats._torchao import torchao
from quantize.formats.base import UnsupportedShapeError
from tests.conftest import skip_without_kernel
from tests.formats.references import torchao_float8 as reference

ao_fmt = ao_module.FORMAT


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_decode_is_torchaos_dequantize(dtype):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(96, 160, generator=g) * 0.03).to(dtype)
    w[5, 7] = 3.0  # an outlier
    w[9] = 1e-3 * torch.randn(160, generator=g).to(dtype)  # a row of small values
    assert torch.equal(ao_fmt.decode(ao_fmt.encode(w), torch.bfloat16), reference(w).dequantize())


def test_zero_row_is_finite_where_torchao_gives_nan():
    w = torch.randn(32, 32).to(torch.bfloat16)
    w[4] = 0
    ref = reference(w)
    assert ref.qdata[4].float().isnan().all()  # torchao divides 0 by 0
    parts = ao_fmt.encode(w)
    assert parts["_weight_scale"][4].item() == 1.0 and torch.equal(ao_fmt.decode(parts)[4], torch.zeros(32))
    others = torch.arange(32) != 4
    assert torch.equal(parts["_weight_qdata"].view(torch.uint8)[others], ref.qdata.view(torch.uint8)[others])


def test_stored_parts_rebuild_a_float8_tensor_that_matches_torchao():
    from loaders import Float8Linear

    w = torch.randn(48, 64).to(torch.bfloat16)
    ours = ao_module.to_float8_tensor(ao_fmt.encode(w))
    ref = reference(w)
    x = torch.randn(5, 64).to(torch.bfloat16)
    skip_without_kernel(
        Float8Linear.from_weight(w, compute="kernel"), x
    )  # torchao's CPU product is _scaled_mm's
    assert type(ours) is type(ref)
    assert torch.equal(torch.nn.functional.linear(x, ours), torch.nn.functional.linear(x, ref))


def test_shapes_scaled_mm_cannot_take_are_refused():
    with pytest.raises(UnsupportedShapeError, match="multiples of 16"):
        ao_fmt.parts((24, 64))
    assert ao_fmt.parts((32, 64)) == {
        "_weight_qdata": ("F8_E4M3", (32, 64)),
        "_weight_scale": ("F32", (32, 1)),
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
    assert {k: json.loads(v) for k, v in ours.items()} == {k: json.loads(v) for k, v in metadata.items()}
    assert {"blocks.0.q._weight_qdata", "blocks.0.q._weight_scale"} <= set(data)


def test_quantization_config_is_diffusers_torchao_config():
    import diffusers

    ao = torchao()
    cfg = ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())
    kept = ["proj_out", "blocks.0.ffn.net.2"]
    assert (
        ao_fmt.quantization_config(kept)
        == diffusers.TorchAoConfig(cfg, modules_to_not_convert=sorted(kept)).to_dict()
    )


def test_serialized_forms_are_torchaos_own_string_for_string():
    """The format writes torchao's JSON without importing torchao: the same strings its encoders give."""
    ao = torchao()
    for in_features in (16, 1536, 13824):
        probe = ao_module.to_float8_tensor(
            {
                ao_module.QDATA: torch.zeros(1, in_features, dtype=torch.float8_e4m3fn),
                ao_module.SCALE: torch.ones(1, 1),
            }
        )
        assert ao_module._weight_json(in_features) == json.dumps(probe, cls=ao.JSONEncoder)
    theirs = ao.config_to_dict(ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow()))
    assert json.dumps(ao_fmt.quantization_config([])["quant_type"]["default"]) == json.dumps(theirs)


def test_converting_to_torchao_fp8_does_not_import_torchao(tmp_path):
    import subprocess
    import sys

    from quantize.examples import write_example

    src = tmp_path / "src"
    write_example(src, "tiny", "t2v")
    code = (
        "import sys; from quantize.cli import main\n"
        f"try: main(['convert', {str(src)!r}, {str(tmp_path / 'out')!r}, '--recipe', 'wan-torchao-fp8.yaml'])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchao'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip().splitlines()[-1] == "[]"
