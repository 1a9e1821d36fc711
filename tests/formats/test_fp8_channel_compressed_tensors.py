"""fp8_channel interop: compressed-tensors validates our quantization_config and, model-free on the CPU, decompresses
every quantized Linear of a converted checkpoint to exactly our dequantized weights."""

from __future__ import annotations

import compressed_tensors  # noqa: F401  (a dev dependency: missing, the tests must fail, not skip)
import torch

from quantize.formats import fp8_channel
from tests.conftest import load_all, read_json, run_cli


def test_compressed_tensors_reads_our_checkpoint(wan_tiny, tmp_path):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    out = tmp_path / "out"
    run_cli("convert", wan_tiny, out, "--recipe", "wan-fp8.yaml", check=True)
    config = QuantizationConfig.model_validate(read_json(out / "config.json")["quantization_config"])
    assert config.quantization_status == QuantizationStatus.COMPRESSED
    (scheme,) = config.config_groups.values()
    compressor = BaseCompressor.get_value_from_registry(config.format)

    stored = load_all(out)
    modules = sorted(k.removesuffix(".weight_scale") for k in stored if k.endswith(".weight_scale"))
    linears = {k.removesuffix(".weight") for k, v in stored.items() if k.endswith(".weight") and v.dim() == 2}
    assert set(config.ignore) == linears - set(modules)  # the kept Linears, and only them
    for m in modules:
        state = {"weight": stored[f"{m}.weight"], "weight_scale": stored[f"{m}.weight_scale"]}
        theirs = compressor.decompress(state, scheme)["weight"]
        assert torch.equal(theirs.float(), fp8_channel.FORMAT.decode(state)), m
        # and their compressor, given our scale, reproduces our fp8 bytes from the source weight
        source = load_all(wan_tiny)[f"{m}.weight"].float()
        again = compressor.compress({"weight": source, "weight_scale": state["weight_scale"]}, scheme)[
            "weight"
        ]
        assert torch.equal(again.view(torch.uint8), state["weight"].view(torch.uint8)), m
