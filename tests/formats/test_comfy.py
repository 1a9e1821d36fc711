"""comfy_fp8 and comfy_int8: read back by comfy-kitchen's layouts, their markers, rounding and zero weights.
Bit-exactness to comfy-kitchen's quantizers and the shared checks are `test_contract.py`'s.

comfy-kitchen (ComfyUI's kernel library, its pure eager backend on the CPU) is a test dependency only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comfy_kitchen.backends.eager import quantization as ck
from comfy_kitchen.tensor import QuantizedTensor
from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout
from comfy_kitchen.tensor.int8 import TensorWiseINT8Layout

from quantize.formats import _comfy
from quantize.formats.comfy_fp8 import FORMAT as comfy_fp8
from quantize.formats.comfy_int8 import FORMAT as comfy_int8


def _weight(shape, dtype, seed=0, outlier=True):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
    if outlier:
        w[3, 5] = 0.9  # one large value: the per-tensor scale is set by it
    return w.to(dtype)


def test_int8_gives_an_all_zero_row_comfy_kitchens_floor_scale():
    w = _weight((96, 160), torch.bfloat16, seed=1)
    w[7] = 0  # an all-zero row
    parts = comfy_int8.encode(w)
    assert bool((parts["weight"][7] == 0).all()) and torch.equal(
        parts["weight_scale"][7], torch.tensor([1e-30])
    )


def test_int8_rounds_half_to_even_as_comfy_kitchen():
    w = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -127.0]])  # scale exactly 1
    q = comfy_int8.encode(w)["weight"]
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, 126, -127]]
    assert torch.equal(q, ck.quantize_int8_rowwise(w)[0])


@pytest.mark.parametrize(
    "fmt, layout",
    [
        (comfy_fp8, TensorCoreFP8Layout),
        (comfy_int8, TensorWiseINT8Layout),
    ],
)
def test_comfy_kitchens_layout_reads_our_parts_as_we_decode_them(fmt, layout):
    """Our parts wrapped in comfy-kitchen's QuantizedTensor: its dequantize() and F.linear on the CPU."""
    w = _weight((64, 96), torch.bfloat16, seed=2)
    parts = fmt.encode(w)
    params = layout.Params(scale=parts["weight_scale"], orig_dtype=torch.float32, orig_shape=tuple(w.shape))
    qt = QuantizedTensor(parts["weight"], layout.__name__, params)
    ours = fmt.decode(parts, torch.float32)
    assert torch.equal(qt.dequantize(), ours)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(3))
    bias = torch.randn(64, generator=torch.Generator().manual_seed(4))
    if fmt is comfy_int8:  # an int8 matmul: the activations are quantized per row too (comfy-kitchen's way)
        xq, xs = ck.quantize_int8_rowwise(x)
        x = xq.float() * xs
    assert torch.allclose(F.linear(x, qt, bias), F.linear(x, ours, bias), rtol=1e-5, atol=1e-5)
    # in bf16, as ComfyUI computes: within bf16 rounding of our float32 decoding
    params16 = layout.Params(
        scale=parts["weight_scale"], orig_dtype=torch.bfloat16, orig_shape=tuple(w.shape)
    )
    deq16 = QuantizedTensor(parts["weight"], layout.__name__, params16).dequantize()
    assert deq16.dtype == torch.bfloat16 and torch.allclose(deq16.float(), ours, rtol=2**-7, atol=0)


@pytest.mark.parametrize("fmt", [comfy_fp8, comfy_int8])
def test_the_marker_is_what_comfyui_reads(fmt):
    parts = fmt.encode(_weight((16, 32), torch.bfloat16, outlier=False))
    marker = parts["comfy_quant"]
    assert marker.dtype == torch.uint8 and marker.dim() == 1
    assert _comfy.read_marker(marker) == {"format": fmt.LAYOUT}
    import json

    assert json.loads(marker.numpy().tobytes()) == {"format": fmt.LAYOUT}  # ComfyUI's own reading (ops.py)
    (dt, shape) = fmt.parts((16, 32))["comfy_quant"]
    assert (dt, shape) == ("U8", (marker.numel(),))


@pytest.mark.parametrize("fmt", [comfy_fp8, comfy_int8])
def test_an_all_zero_weight_gets_a_finite_scale_and_zeros(fmt):
    parts = fmt.encode(torch.zeros(16, 32, dtype=torch.bfloat16))
    assert bool(torch.isfinite(parts["weight_scale"]).all())
    assert not parts["weight"].float().any() and not fmt.decode(parts).any()


def _activations(dtype, seed=5) -> torch.Tensor:
    """Rows of each magnitude from float16's subnormals to large values, one of them all zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 320, generator=g) * 10.0 ** torch.arange(-6, 6, 2).float().view(-1, 1)
    x[2] = 0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_the_activation_quantizers_are_comfy_kitchens_in_the_inputs_dtype(dtype):
    """What ComfyUI does to each call's input, in its dtype: int8 per row (`quantize_int8_rowwise`), float8 with one
    scale (`TensorCoreFP8Layout.quantize`, dynamic or static), ConvRot's rotation (`_rotate_activation`)."""
    from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_activation

    from quantize.formats import comfy_fp8 as fp8_module
    from quantize.formats import comfy_int8 as int8_module

    x = _activations(dtype)
    q, scale = int8_module.quantize_rows(x)
    want_q, want_scale = ck.quantize_int8_rowwise(x)
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
    x = x[3:]  # an all-zero tensor: our scale is 1, comfy-kitchen divides by zero
    for static in (None, torch.tensor(0.37)):
        q, scale = fp8_module.quantize_tensor(x, static)
        want_q, params = TensorCoreFP8Layout.quantize(x, scale=static)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, params.scale)
    h = _build_hadamard(256, dtype=torch.float64)
    x = _activations(dtype)[:, :256]
    assert torch.equal(int8_module.rotate_activations(x), _rotate_activation(x, h, 256))
