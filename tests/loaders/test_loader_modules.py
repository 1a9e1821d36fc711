"""The quantized Linear modules on their own: numerics against each format's reference, and offload-readiness
(deepcopy, `.to()` with weak references held, dtype moves that must not touch the stored parts)."""

from __future__ import annotations

import copy
import weakref

import pytest
import torch
import torch.nn.functional as F

from loaders import (
    ComfyFP8Linear,
    ComfyW4a4Linear,
    ComfyW4a8Linear,
    Float8Linear,
    FP8Linear,
    GGUFLinear,
    Int8Linear,
    MXFP8Linear,
    NF4Linear,
    NVFP4Linear,
    bnb,
)
from loaders.bnb import quant_state
from loaders.emulation import ulp
from quantize.formats import NO_OPTIONS, ComfyOptions, GgufOptions
from quantize.formats import nf4 as nf4_module
from quantize.formats.fp8_channel import FORMAT as fp8_channel
from quantize.formats.fp8_channel import quantize_rows
from quantize.formats.nf4 import FORMAT as nf4
from quantize.formats.torchao_fp8 import FORMAT as torchao_fp8
from tests.conftest import skip_without_kernel, skip_without_kquant_encoder
from tests.formats.references import torchao_float8 as float8_reference
from tests.loaders.conftest import layer_input as _x
from tests.loaders.conftest import layer_weights as _weights
from tests.loaders.conftest import storage_ids as _storage_ids

MODULES = [FP8Linear, Float8Linear, NF4Linear]


def make(cls, weight: torch.Tensor, bias: torch.Tensor | None, **kw):
    """A module of `cls` holding the format's encoding of `weight`, loaded as the loader does (assign)."""
    out, inp = weight.shape
    module = cls(inp, out, bias is not None, device="meta", **kw)
    state = {part: t for part, t in cls.FORMAT.encode(weight).items()}
    if bias is not None:
        state["bias"] = bias
    module.load_state_dict(state, assign=True)
    return module


def test_fp8_scaled_mm_path_is_per_token_fp8_activations_times_the_stored_weight():
    w, b = _weights()
    m = make(FP8Linear, w, b, compute="kernel")  # on the CPU too, where "fast" decodes instead
    x = _x(dtype=torch.float32)
    skip_without_kernel(m, x)
    assert m.uses_fast_path(x)
    got = m(x)
    # the reference, by hand: x quantized per row (scale = rowmax|x| / 448), both dequantized, multiplied in float64
    rows = x.reshape(-1, 128)
    x_scale = rows.abs().amax(dim=1, keepdim=True) / 448
    x_deq = (rows / x_scale).clamp(-448, 448).to(torch.float8_e4m3fn).double() * x_scale.double()
    w_deq = fp8_channel.decode(fp8_channel.encode(w), torch.float64)
    want = (x_deq @ w_deq.T + b.double()).reshape(2, 10, 96)
    assert got.dtype == torch.float32 and got.shape == (2, 10, 96)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_fp8_scaled_mm_in_bf16_is_within_bf16_rounding_of_the_float32_result():
    w, b = _weights()
    m = make(FP8Linear, w, b, compute="kernel")
    x = _x()
    skip_without_kernel(m, x)
    skip_without_kernel(m, x.float())
    got, wide = m(x), m(x.float())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), wide, rtol=2**-7, atol=2**-7)


def test_fp8_activation_quantization_keeps_zero_rows_finite():
    q, scale = quantize_rows(torch.zeros(3, 32))
    assert torch.equal(scale, torch.ones(3, 1)) and not q.float().any()


@pytest.mark.parametrize("shape", [(96, 128), (40, 24)])
def test_fp8_dequantize_path_equals_linear_with_the_decoded_weight(shape):
    w, b = _weights(*shape)
    m = make(FP8Linear, w, b, compute="dequantize")
    odd = make(FP8Linear, w, b)
    odd.KERNEL_ON_CPU = True  # "fast" takes the kernel wherever it runs
    x = _x(inp=shape[1])
    want = F.linear(x, fp8_channel.decode(fp8_channel.encode(w), torch.bfloat16), b)
    assert torch.equal(m(x), want)
    if shape == (96, 128):
        skip_without_kernel(odd, x)
    assert odd.uses_fast_path(x) == (shape == (96, 128))  # dims not multiples of 16: decoded
    if shape != (96, 128):
        assert torch.equal(odd(x), want)


def test_float8_linear_computes_what_torchaos_float8_tensor_computes():
    w, b = _weights()
    m = make(Float8Linear, w, b, compute="kernel")
    x = _x()
    skip_without_kernel(m, x)
    assert type(m.weight).__name__ == "Float8Tensor"
    assert torch.equal(m(x), F.linear(x, float8_reference(w), b))


def test_nf4_linear_computes_linear_with_bitsandbytes_dequantized_weight():
    w, b = _weights()
    m = make(NF4Linear, w, b)
    x = _x(dtype=torch.float32)
    parts = nf4.encode(w)
    bnb_weight = bnb.functional().dequantize_4bit(
        parts[nf4_module.WEIGHT], quant_state(parts), quant_type="nf4"
    )
    got = m(x)
    assert got.dtype == torch.float32  # computed in bf16 (the compute dtype), returned in the input's dtype
    assert torch.equal(got, F.linear(x.to(torch.bfloat16), bnb_weight, b).float())


def test_nf4_linear_is_close_to_bitsandbytes_linear4bit():
    """bitsandbytes' own Linear4bit on this CPU (its packed AVX512-BF16 kernel where present): the same layer."""
    import bitsandbytes as bnb

    w, b = _weights()
    ref = bnb.nn.Linear4bit(128, 96, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4")
    ref.weight = bnb.nn.Params4bit(
        w, requires_grad=False, quant_type="nf4", blocksize=64, compress_statistics=True
    )
    ref.weight._quantize("cpu")
    ref.bias = torch.nn.Parameter(b, requires_grad=False)
    x = _x()
    with torch.no_grad():
        want = ref(x)
    got = make(NF4Linear, w, b)(x)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("cls", [c for c in MODULES if "weight" in c.FORMAT.parts((96, 128))])
def test_weight_reads_as_a_float32_linear_weight_and_the_stored_part_is_in_the_state_dict(cls):
    """Model code reads ``.weight`` of a Linear for its dtype and device (transformers' T5 casts wo's input to
    ``wo.weight.dtype``): it is a float32 stand-in of the logical shape, on the module's device, never the stored
    part of that name (float8 values, packed bytes), which the state dict still holds under ``weight``."""
    w, b = _weights()
    m = make(cls, w, b)
    assert (m.weight.dtype, tuple(m.weight.shape), m.weight.device) == (
        torch.float32,
        tuple(w.shape),
        w.device,
    )
    assert m.weight.untyped_storage().nbytes() == 4  # one element, expanded
    assert torch.equal(m.state_dict()["weight"], cls.FORMAT.encode(w)["weight"])


@pytest.mark.parametrize("cls", MODULES)
def test_state_dict_keys_are_the_formats_part_names(cls):
    w, b = _weights()
    m = make(cls, w, b)
    state = m.state_dict()
    assert set(state) == set(cls.FORMAT.parts(tuple(w.shape))) | {"bias"}
    encoded = cls.FORMAT.encode(w)
    for part, t in encoded.items():
        assert state[part].dtype == t.dtype and torch.equal(state[part], t), part
    # and loads back, by copy, into a module that has storage already
    other = make(cls, *_weights(seed=5))
    other.load_state_dict(state)
    x = _x()
    assert torch.equal(other(x), m(x))


@pytest.mark.parametrize("cls", MODULES)
def test_load_state_dict_names_a_wrong_part(cls):
    w, b = _weights()
    state = make(cls, w, b).state_dict()
    first = next(iter(cls.FORMAT.parts(tuple(w.shape))))
    state[first] = torch.zeros(3, dtype=torch.uint8)
    target = make(cls, w, b)
    with pytest.raises(RuntimeError, match=rf"{first}: checkpoint has torch.uint8\[3\]"):
        target.load_state_dict(state)


@pytest.mark.parametrize("cls", MODULES)
def test_deepcopy_copies_the_stored_parts_and_nothing_wider(cls):
    w, b = _weights()
    m = make(cls, w, b)
    clone = copy.deepcopy(m)
    assert _storage_ids(clone).isdisjoint(_storage_ids(m))
    for (name, t), (_, u) in zip(m.state_dict().items(), clone.state_dict().items(), strict=True):
        assert t.dtype == u.dtype and torch.equal(t, u), name
    # no tensor in the copy holds the weight in a high precision: the widest is the bias or a scale
    biggest = max(t.numel() * t.element_size() for t in clone.state_dict().values())
    assert biggest < w.numel() * 2
    x = _x()
    assert torch.equal(clone(x), m(x))


@pytest.mark.parametrize("cls", MODULES)
def test_to_dtype_moves_the_bias_but_never_the_stored_parts(cls):
    w, b = _weights()
    m = make(cls, w, b)
    before = {k: (t.dtype, t.clone()) for k, t in m.state_dict().items() if k != "bias"}
    m.to(torch.float16)
    m.to(torch.bfloat16)
    m.float()
    for k, (dtype, value) in before.items():
        assert m.state_dict()[k].dtype == dtype and torch.equal(m.state_dict()[k], value), k
    assert m.bias.dtype == torch.float32


def test_a_torchao_weight_with_a_weak_reference_cannot_move():
    """The failure that stopped Kandinsky 5 FP8 from offloading: torchao's Float8Tensor in a Linear, a weakref held."""
    w, _ = _weights()
    linear = torch.nn.Linear(128, 96, bias=False)
    linear.weight = torch.nn.Parameter(float8_reference(w), requires_grad=False)
    ref = weakref.ref(linear.weight)
    with pytest.raises(RuntimeError, match="Couldn't swap"):
        linear.to("cpu")
    assert ref() is not None


@pytest.mark.parametrize("cls", MODULES)
def test_to_moves_while_weak_references_to_every_tensor_are_held(cls):
    w, b = _weights()
    m = make(cls, w, b)
    x = _x()
    before = m(x)
    refs = [weakref.ref(t) for t in (*m.buffers(), *m.parameters())]  # noqa: F841 (held across the moves)
    m.to("cpu")
    m.to(torch.bfloat16)
    assert torch.equal(m(x), before)
    m.to("meta")
    assert all(t.is_meta for t in (*m.buffers(), *m.parameters()))


@pytest.mark.parametrize("cls", MODULES)
def test_set_part_refuses_a_part_of_the_wrong_dtype_or_shape(cls):
    m = cls(128, 96, True, device="meta")
    part, (_, shape) = next(iter(cls.FORMAT.parts((96, 128)).items()))
    with pytest.raises(ValueError, match=rf"part {part!r} of a \[96, 128\] Linear is .*got torch.bfloat16"):
        m.set_part(part, torch.zeros(shape, dtype=torch.bfloat16))


cuda = pytest.mark.gpu  # skipped without a CUDA device (tests/conftest.py)

#: the kernels' numbers on each device are held to their exact emulations in test_kernel_emulation.py; what is
#: left here: the decoded weight is the same wherever it is decoded, and the dequantize path on the GPU is F.linear
#: with it
SCHEMES = [
    pytest.param(FP8Linear, NO_OPTIONS, id="fp8_channel"),
    pytest.param(Float8Linear, NO_OPTIONS, id="torchao_fp8"),
    pytest.param(NF4Linear, NO_OPTIONS, id="nf4"),
    pytest.param(ComfyFP8Linear, NO_OPTIONS, id="comfy_fp8"),
    pytest.param(Int8Linear, NO_OPTIONS, id="comfy_int8"),
    pytest.param(Int8Linear, ComfyOptions("int8_convrot"), id="comfy_int8-convrot"),
    pytest.param(NVFP4Linear, NO_OPTIONS, id="comfy_nvfp4"),
    pytest.param(MXFP8Linear, NO_OPTIONS, id="comfy_mxfp8"),
    pytest.param(ComfyW4a4Linear, ComfyOptions("convrot_w4a4", convrot_group=64), id="comfy_w4a4-g64"),
    pytest.param(ComfyW4a8Linear, ComfyOptions("asym_w4a8_int8", convrot_group=64), id="comfy_w4a8-g64"),
    *(
        pytest.param(GGUFLinear, GgufOptions(t), id=f"gguf-{t}")
        for t in ("Q8_0", "Q6_K", "Q4_K", "Q5_1", "Q4_0")
    ),
]


@cuda
@pytest.mark.parametrize("cls, options", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_gpu_decodes_the_cpus_weight_and_its_dequantize_path_is_linear_with_it(cls, options, dtype):
    """On the GPU the weight decodes to the CPU's values exactly (a GGUF layer's blocks, Q8_0's fused decode
    included), and ``compute="dequantize"`` is `F.linear` with that weight, to float32 accumulation."""
    if isinstance(options, GgufOptions):
        skip_without_kquant_encoder(options.type_name)
    w, b = _weights(256, 512)
    m = cls.from_weight(w, b, options, compute="dequantize")
    decoded = m.dequantize(dtype)
    m.to("cuda")
    assert torch.equal(m.dequantize(dtype).cpu(), decoded)
    x = _x(rows=24, inp=512, dtype=dtype)
    got = m(x.cuda()).cpu()
    want = F.linear(x.double(), decoded.double(), b.double())
    bound = ulp(want, dtype) + 512 * 2.0**-24 * F.linear(
        x.double().abs(), decoded.double().abs(), b.double().abs()
    )
    assert got.dtype == dtype and bool(((got.double() - want).abs() <= bound).all())


def test_set_part_and_dequantize_agree_with_the_format():
    """`set_part` (the loader's path) and the stored parts agree; `dequantize` is the format's decode."""
    w, b = _weights()
    m = FP8Linear(128, 96, True, device="meta")
    for part, t in fp8_channel.encode(w).items():
        m.set_part(part, t)
    m.bias = torch.nn.Parameter(b, requires_grad=False)
    assert torch.equal(m.dequantize(), fp8_channel.decode(fp8_channel.encode(w)))
    assert torch.equal(make(Float8Linear, w, b).dequantize(), torchao_fp8.decode(torchao_fp8.encode(w)))
    assert torch.equal(make(NF4Linear, w, b).dequantize(), nf4.decode(nf4.encode(w)))
