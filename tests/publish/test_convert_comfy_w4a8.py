"""A ComfyUI W4A8 file end to end through the command line: each layer's ConvRot group fitted to its width and in its
marker, streamed in row chunks (the codebook from strided rows across them) to the same bytes, requantized by `verify`,
read as ComfyUI's loader reads it (comfy-kitchen's layout decodes and multiplies our parts), run by our loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from quantize.formats import ComfyOptions, _hadamard, comfy_w4a8, get_format
from tests.conftest import load_all, run_cli

fmt = get_format("comfy_w4a8")
RECIPE = """format: comfy_w4a8
targets:
- blocks\\.\\d+\\.(self_attn|cross_attn)\\.(q|k|v|o)
- blocks\\.\\d+\\.ffn\\.(0|2)
"""


def _file(out: Path) -> Path:
    (path,) = out.glob("*.safetensors")
    return path


def _comfyui_reads(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """The file's tensors and, per module, its marker's JSON, read as comfy/ops.py reads them."""
    with safe_open(path, "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    markers = {
        k.removesuffix(".comfy_quant"): json.loads(t.numpy().tobytes())
        for k, t in state.items()
        if k.endswith(".comfy_quant")
    }
    return state, markers


def test_a_w4a8_file_streams_verifies_and_is_read_as_comfyui_reads_it(wan_tiny, tmp_path, monkeypatch):
    import quantize.encode as chunking
    from quantize import convert

    recipe = tmp_path / "w4a8.yaml"
    recipe.write_text(RECIPE)
    # the codebook of each weight from 10 rows strided over it (over its chunks, streamed)
    monkeypatch.setattr(comfy_w4a8, "CODEBOOK_SAMPLE", 10 * 128)
    convert(wan_tiny, tmp_path / "whole", recipe, workers=1)
    encoded: list[int] = []
    encode = fmt.encode
    monkeypatch.setattr(fmt, "encode", lambda w, *a, **kw: encoded.append(w.shape[0]) or encode(w, *a, **kw))
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 3 * 128 * 4)  # three rows of its 128-wide weights
    convert(wan_tiny, tmp_path / "chunked", recipe, workers=2)
    assert max(encoded) <= 3
    assert _file(tmp_path / "chunked").read_bytes() == _file(tmp_path / "whole").read_bytes()
    monkeypatch.undo()

    out = tmp_path / "whole"
    proc = run_cli("verify", out, "--source", wan_tiny, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {(c["category"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}

    from comfy_kitchen.backends.eager import w4a8_int8 as ckw
    from comfy_kitchen.tensor import QuantizedTensor
    from comfy_kitchen.tensor.w4a8_int8 import AsymW4A8Int8Layout

    state, markers = _comfyui_reads(_file(out))
    source = load_all(wan_tiny)
    assert markers and checks[("parity", "requantize")]["passed"] == len(markers)
    groups = set()
    for module, marker in markers.items():
        w = source[f"{module}.weight"].float()
        group = _hadamard.group_for(w.shape[1], multiple_of=16)
        assert marker == {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": group}, module
        groups.add(group)
        options = ComfyOptions("asym_w4a8_int8", convrot_group=group)
        parts = {p: state[f"{module}.{p}"] for p in fmt.parts(tuple(w.shape), options)}
        # comfy/ops.py `_load_quantized_module`: weight_s_rel, weight_s_channel, weight_codebook, the marker's sizes
        params = AsymW4A8Int8Layout.Params(
            scale=parts["weight_s_rel"],
            s_channel=parts["weight_s_channel"],
            codebook=parts["weight_codebook"],
            group_size=marker["group_size"],
            convrot_groupsize=marker["convrot_groupsize"],
            orig_dtype=torch.float32,
            orig_shape=tuple(w.shape),
        )
        weight = QuantizedTensor(parts["weight"].to(torch.int8), "AsymW4A8Int8Layout", params)
        ours = fmt.decode(parts, options=options)
        x = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(0))
        y = F.linear(x, weight)  # ComfyUI's eager W4A8: int8 grid, activations rotated and to int8 per row
        assert float((y - x @ ours.T).pow(2).sum() / (x @ ours.T).pow(2).sum()) < 1e-3, module
        with pytest.MonkeyPatch.context() as patch:  # its rotation ours: its decoding is ours, bit for bit
            patch.setattr(ckw, "rotate_int8_convrot_weight", lambda t, g: _hadamard.rotate(t, g))
            assert torch.equal(weight.dequantize(), ours), module
    assert groups == {64, 256}  # the 128-wide layers' and ffn.2's (256 inputs)

    # our loader: every quantized layer a ComfyW4a8Linear in its group, its int8 kernel close to its reference
    import diffusers

    from loaders import ComfyW4a8Linear, load_quantized

    model = load_quantized(diffusers.WanTransformer3DModel, out, compute="kernel")
    layers = [m for m in model.modules() if isinstance(m, ComfyW4a8Linear)]
    assert len(layers) == len(markers) and {m.options.group for m in layers} == {64, 256}
    for m in layers[:2]:
        x = torch.randn(9, m.in_features, generator=torch.Generator().manual_seed(1))
        got, want = m(x), m.reference_forward(x)
        assert float((got - want).pow(2).sum() / want.pow(2).sum()) < 1e-3  # int8 activations
