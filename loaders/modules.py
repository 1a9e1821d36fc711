"""The quantized Linear modules, one per runtime scheme (one per on-disk format).

Each keeps the format's stored parts as plain tensors (buffers), under the format's own part names
in its state dict, and builds what the computation needs (a torchao `Float8Tensor`, a bitsandbytes
`QuantState`) from them on each call. Nothing the module holds is a tensor subclass, so it deep-copies,
moves with `.to()` while weak references to its tensors exist, pins, and can be re-pointed at a
device buffer by the block offloader, exactly like a plain tensor. The parts keep their stored dtypes
whatever `.to(dtype)` asks (a float8 weight cast to bf16 would be the very copy this package avoids);
the bias follows it like any parameter, and the output has the input's dtype.

Each module has its eager reference next to its fast path: with ``compute="dequantize"`` (or wherever the fast
path does not run: `uses_fast_path`), the weight is decoded by its format to the input's dtype for the call
and used by `F.linear`, exactly what `verify --forward` computes in float32. ``compute="fast"`` (the default)
runs the scheme's kernel where the device has it and it is the faster of the two: on CUDA always; on the CPU
only where `KERNEL_ON_CPU` says so (`make bench`: int8's `_int_mm` beats bf16 there, float8's emulated
`_scaled_mm` is 3-4x slower than decoding the weight). ``compute="kernel"`` runs the kernel wherever it runs at
all, the CPU included (how the tests hold it to its reference there).

| module | format | fast path |
|---|---|---|
| `FP8Linear` | fp8_channel | activations to float8 per row, `torch._scaled_mm` with both row-wise scales |
| `ComfyFP8Linear` | comfy_fp8 | activations to float8 with one dynamic scale, `torch._scaled_mm` with both tensor scales |
| `Int8Linear` | comfy_int8 | activations to int8 per row (ConvRot: rotated first), `torch._int_mm` (int32 accumulate), scaled by both scales |
| `NVFP4Linear` | comfy_nvfp4 | SM100+: activations to NVFP4, block-scaled `torch._scaled_mm`; elsewhere decoded per call |
| `MXFP8Linear` | comfy_mxfp8 | SM100+: activations to MXFP8, block-scaled `torch._scaled_mm`; elsewhere decoded per call |
| `GGUFLinear` | gguf | none: the stored blocks stay as they are, each call decodes the layer (torch decoders) |
| `Float8Linear` | torchao_fp8 | torchao's `Float8Tensor` dispatch |
| `NF4Linear` | nf4 | bitsandbytes (`matmul_4bit`; on the CPU its dequantization) |
| `TorchaoInt8Linear` | torchao_int8 | torchao's int8 linear: activations to int8 per row, `torch._int_mm`, both scales |
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from quantize import dtypes
from quantize.errors import InputError
from quantize.formats import (
    NO_OPTIONS,
    Format,
    FormatOptions,
    comfy_fp8,
    comfy_int8,
    comfy_mxfp8,
    comfy_nvfp4,
    format_info,
    fp8_channel,
    gguf,
    nf4,
    torchao_fp8,
    torchao_int8,
)
from quantize.formats._e4m3 import FP8_DTYPE

from . import bnb, fused
from .emulation import (
    BF16_REDUCED_SUM,
    FP8_FAST_SUM,
    FP32_SUM,
    INT32_SUM,
    Accumulation,
    Emulation,
    emulate_product,
)

__all__ = [
    "QuantizedLinear",
    "FP8Linear",
    "ComfyFP8Linear",
    "Int8Linear",
    "GGUFLinear",
    "Float8Linear",
    "NF4Linear",
    "NVFP4Linear",
    "MXFP8Linear",
    "TorchaoInt8Linear",
    "MODULES",
    "COMPUTE",
    "KernelUnavailable",
    "module_for",
    "set_param",
]

#: how a module computes: the faster of its kernel and its reference on the device ("fast"), its kernel wherever it
#: runs and an error where it does not ("kernel"), or the weight decoded for each call ("dequantize", the eager
#: reference)
COMPUTE = ("fast", "kernel", "dequantize")


class KernelUnavailable(RuntimeError):
    """``compute="kernel"`` where the module's kernel cannot run: one line naming the module, the device, the input's
    dtype and what is missing. ``compute="fast"`` decodes the weight there instead."""


def _attr(part: str) -> str:
    """The attribute holding a part; part names may contain dots (``weight.absmax``), attributes may not."""
    return part.replace(".", "_")


class QuantizedLinear(nn.Module):
    """A Linear whose weight is stored in `FORMAT`'s parts; subclasses define `forward`."""

    FORMAT: ClassVar[Format]
    #: whether its kernel is faster than decoding the weight on the CPU (measured: docs/BENCHMARKS.md, loading)
    KERNEL_ON_CPU: ClassVar[bool] = True

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        options: FormatOptions = NO_OPTIONS,
        compute: str = "fast",
    ):
        super().__init__()
        if compute not in COMPUTE:
            raise ValueError(f"compute must be one of {COMPUTE}, got {compute!r}")
        self.in_features, self.out_features = in_features, out_features
        self.options, self.compute = options, compute
        self.part_attrs: dict[str, str] = {}
        self._late_parts: set[str] = set()  # parts whose size is only known from the checkpoint
        for part, (dtype_name, shape) in self._specs().items():
            held = (0,) if shape is None else dtypes.held_shape(dtype_name, shape)
            empty = torch.empty(held, dtype=dtypes.by_name(dtype_name).torch, device=device)
            self._buffers[_attr(part)] = empty  # as `register_buffer` does: `weight` is the property below
            self.part_attrs[part] = _attr(part)
            if shape is None:
                self._late_parts.add(part)
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
            if bias
            else None
        )

    def _specs(self) -> dict:
        return self.FORMAT.parts((self.out_features, self.in_features), self.options)

    @classmethod
    def like(
        cls, linear: nn.Linear, options: FormatOptions = NO_OPTIONS, compute: str = "fast"
    ) -> QuantizedLinear:
        """An empty (meta) module to take `linear`'s place."""
        return cls(
            linear.in_features,
            linear.out_features,
            linear.bias is not None,
            device="meta",
            options=options,
            compute=compute,
        )

    @classmethod
    def from_weight(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        options: FormatOptions = NO_OPTIONS,
        compute: str = "fast",
    ) -> QuantizedLinear:
        """A module holding the format's encoding of `weight` [out, in] (fp32, fp16 or bf16; encoded on the
        CPU, as `quantize convert` encodes it) and a copy of `bias`: for tests and benchmarks."""
        out_features, in_features = weight.shape
        module = cls(
            in_features, out_features, bias is not None, device="meta", options=options, compute=compute
        )
        for part, t in cls.FORMAT.encode(weight.detach().cpu(), options).items():
            module.set_part(part, t.contiguous())
        if bias is not None:
            module.bias = nn.Parameter(bias.detach().cpu().clone(), requires_grad=False)
        return module

    @property
    def weight(self) -> torch.Tensor:
        """What model code reads of a Linear's weight: a float32 stand-in of its logical shape on its device (one
        element, expanded), never the stored part of that name (float8 values, packed bytes): code that casts its
        input to ``.weight.dtype`` (transformers' T5 before its ``wo``) must not cast it to a storage dtype. The
        parts are `stored()`; the weight's values, `dequantize()`."""
        device = next(iter(self._buffers.values())).device
        one = torch.empty((1, 1), dtype=torch.float32, device=device)
        return one.expand(self.out_features, self.in_features)

    def stored(self) -> dict[str, torch.Tensor]:
        """The parts, by the format's part names."""
        return {part: self._buffers[attr] for part, attr in self.part_attrs.items()}

    def set_part(self, part: str, tensor: torch.Tensor) -> None:
        """Take `tensor` (not a copy) as the stored part `part`; its dtype and shape must be the format's."""
        dtype_name, shape = self._specs()[part]
        if tensor.dtype != dtypes.by_name(dtype_name).torch or (
            shape is not None and tuple(tensor.shape) != dtypes.held_shape(dtype_name, shape)
        ):
            raise ValueError(
                f"{self.FORMAT.NAME} part {part!r} of a [{self.out_features}, {self.in_features}] Linear is "
                f"{dtype_name}{list(shape or [])}, got {tensor.dtype}{list(tensor.shape)}"
            )
        self._buffers[self.part_attrs[part]] = tensor
        self.parts_changed()

    def parts_changed(self) -> None:
        """Called after parts were replaced; a subclass drops what it derived from them."""

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as its format decodes it, in `dtype`."""
        shape = (self.out_features, self.in_features)
        return self.FORMAT.decoded(self.stored(), shape, dtype, options=self.options)

    # -- computing: the fast path where it runs, else the eager reference ------------------------------

    #: whether the scheme has a kernel besides decoding the weight (GGUF has none: its reference is itself)
    HAS_KERNEL: ClassVar[bool] = True
    #: the [out, in] of the layer the once-per-device probe runs the kernel on (dims every kernel takes)
    PROBE_SHAPE: ClassVar[tuple[int, int]] = (64, 128)

    def kernel_problem(self, x: torch.Tensor) -> str | None:
        """Why the scheme's kernel cannot run on `x` (its device, dtype, this layer's shape), or None where it runs
        and its result, probed once per device and dtype, keeps to the emulation (`emulate`)."""
        if not self.HAS_KERNEL:
            return "the scheme has no kernel (its weight is decoded for each call)"
        return self.static_problem(x) or _probe(type(self), x.device, x.dtype)

    def static_problem(self, x: torch.Tensor) -> str | None:
        """What about `x` or this layer (not the device's kernels) keeps the kernel from running; None: nothing."""
        return None if x.dtype in _FLOATS else f"the kernel takes {', '.join(map(str, _FLOATS))} inputs"

    def uses_fast_path(self, x: torch.Tensor) -> bool:
        """Whether a call on `x` runs the scheme's kernel (else: the weight decoded for the call), as `compute` says;
        under ``compute="kernel"``, True or `KernelUnavailable`."""
        if self.compute == "dequantize" or not self.HAS_KERNEL:
            return False
        if self.compute == "fast" and x.device.type == "cpu" and not self.KERNEL_ON_CPU:
            return False
        problem = self.kernel_problem(x)
        if problem is not None and self.compute == "kernel":
            raise KernelUnavailable(
                f"{type(self).__name__} [{self.out_features}, {self.in_features}] on {x.device} with {x.dtype} input "
                f"(torch {torch.__version__}): {problem}; compute='fast' decodes the weight where the kernel cannot run"
            )
        return problem is None

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no fast path")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_fast_path(x):
            return self.fast_forward(x)
        return self.reference_forward(x)

    # -- the kernel's exact emulation (loaders/emulation.py) ----------------------------------------------

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The two operands the kernel multiplies for the 2-D input `rows`, each decoded exactly in float64 with its
        scales: (activations [M, K] quantized as the kernel quantizes them, weight [N, K])."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel")

    def accumulation(self, device: torch.device) -> Accumulation:
        """How the kernel sums its products on `device`."""
        return FP32_SUM

    def kernel_bias(self, x: torch.Tensor) -> torch.Tensor | None:
        """The bias as the kernel adds it (in the input's dtype)."""
        return None if self.bias is None else self.bias.to(x.dtype)

    def kernel_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype the kernel rounds its result to."""
        return x.dtype

    def emulate(self, x: torch.Tensor) -> Emulation:
        """What the kernel computes on `x`, exactly (float64, before its rounding), and the bound a correct kernel's
        output keeps to it: `Emulation.check(module(x), ...)`. The result has `x`'s leading dims."""
        rows = _rows(x, self.in_features)
        a, b = self.kernel_operands(rows)
        bias = self.kernel_bias(x)
        e = emulate_product(a, b, bias, self.kernel_dtype(x), self.accumulation(x.device))
        return e.reshaped((*x.shape[:-1], self.out_features))

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The eager reference: `F.linear` with the weight decoded to the input's dtype (what `verify --forward`
        computes, in float32)."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantize(x.dtype), bias)

    def extra_repr(self) -> str:
        options = "" if self.options == NO_OPTIONS else f", options={self.options.type_name}"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, format={self.FORMAT.NAME}{options}, compute={self.compute}"
        )

    # -- state dict under the format's part names, so that it equals the checkpoint's keys --------

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for part, attr in self.part_attrs.items():
            t = self._buffers[attr]
            destination[prefix + part] = t if keep_vars else t.detach()
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        assign = local_metadata.get("assign_to_params_buffers", False)
        names = {part: attr for part, attr in self.part_attrs.items()}
        if self.bias is not None:
            names["bias"] = "bias"
        for name, attr in names.items():
            key = prefix + name
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            current = self.bias if attr == "bias" else self._buffers[attr]  # `weight` is a stand-in
            shape_ok = name in self._late_parts or value.shape == current.shape
            if not shape_ok or (attr != "bias" and value.dtype != current.dtype):
                error_msgs.append(
                    f"{key}: checkpoint has {value.dtype}{list(value.shape)}, "
                    f"the module needs {current.dtype}{list(current.shape)}"
                )
            elif attr == "bias":
                if assign or current.is_meta:
                    self.bias = nn.Parameter(value, requires_grad=False)
                else:
                    with torch.no_grad():
                        self.bias.copy_(value)
            elif assign or current.is_meta or value.shape != current.shape:  # a late part may change size
                self._buffers[attr] = value
            else:
                with torch.no_grad():
                    current.copy_(value)
        self.parts_changed()
        if strict:
            for key in state_dict:
                if (
                    key.startswith(prefix)
                    and key[len(prefix) :] not in names
                    and "." not in key[len(prefix) :]
                ):
                    unexpected_keys.append(key)

    # -- moving: parts keep their dtype, follow the device ------------------------------------------

    def _apply(self, fn, recurse=True):
        for name, t in self._buffers.items():
            if t is None:
                continue
            probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            self._buffers[name] = fn(t) if probe.dtype == t.dtype else t.to(probe.device)
        if self.bias is not None:
            set_param(self, "bias", fn(self.bias.data))
        return self


def set_param(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Point parameter `name` at `value` without swapping tensors, so weak references to it cannot stop the move."""
    param = module._parameters[name]
    if torch._has_compatible_shallow_copy_type(param, value):
        param.data = value
    else:  # e.g. to or from the meta device: a new Parameter, as nn.Module._apply makes there
        module._parameters[name] = nn.Parameter(value, requires_grad=False)


_FLOATS = (torch.bfloat16, torch.float16, torch.float32)

#: (module class, device, input dtype) -> why its kernel does not run there (None: it runs, and keeps to its emulation)
_PROBED: dict[tuple[type, torch.device, torch.dtype], str | None] = {}


def _probe(cls: type[QuantizedLinear], device: torch.device, dtype: torch.dtype) -> str | None:
    """Run `cls`'s kernel once on this device and dtype, on a seeded layer of `PROBE_SHAPE` and 16 rows, and hold its
    result to the emulation: None where it runs and keeps to it, else what went wrong (the error's first line, or by
    how much it left the bound). A kernel that returns the wrong numbers is as missing as one that raises."""
    key = (cls, device, dtype)
    if key not in _PROBED:
        _PROBED[key] = _try_kernel(cls, device, dtype)
    return _PROBED[key]


def _try_kernel(cls: type[QuantizedLinear], device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type not in ("cpu", "cuda"):
        return f"no kernel on {device.type}"
    g = torch.Generator().manual_seed(0)
    out_features, in_features = cls.PROBE_SHAPE
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g).to(dtype)
    x = torch.randn(16, in_features, generator=g).to(dtype)
    try:
        layer = cls.from_weight(w, b).to(device)
        y = layer.fast_forward(x.to(device))
    except Exception as e:  # RuntimeError, NotImplementedError, TypeError, ValueError: no such kernel here
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no message'}"
    excess = layer.emulate(x.to(device)).excess(y)
    if excess > 1.0:
        return f"its result leaves the exact emulation's bound ({excess:.3g}x) on a probe layer"
    return None


def _rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    return x.reshape(-1, in_features)


def _fp8_problem(layer: QuantizedLinear, x: torch.Tensor) -> str | None:
    """What the float8 `_scaled_mm` needs of a layer and its input: dims multiples of 16, a float input."""
    if layer.in_features % 16 or layer.out_features % 16:
        return f"float8 _scaled_mm needs both dims multiples of 16, the layer is [{layer.out_features}, {layer.in_features}]"
    return QuantizedLinear.static_problem(layer, x)


def _fast_accumulation(device: torch.device) -> bool:
    """Whether the float8 GEMMs accumulate fast: on CUDA (Hopper's FP8 tensor cores keep about 14 bits of the sum
    there, the price of twice bf16's rate, as torchao's inference kernels pay it); the CPU ignores the flag."""
    return device.type == "cuda"


def _fp8_accumulation(device: torch.device) -> Accumulation:
    return FP8_FAST_SUM if _fast_accumulation(device) else FP32_SUM


def _decoded(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantized values times their scales, exactly, in float64."""
    return q.double() * scale.double()


def _scaled_mm_with_bias(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`torch._scaled_mm` with the bias fused, but on CUDA with a float32 output, which refuses a bias ("Bias is
    not supported when out_dtype is set to Float32"): there it is added after, as torchao does. Fast accumulation
    on CUDA (`_fast_accumulation`)."""
    bias = None if bias is None else bias.to(out_dtype)
    fused_bias = bias is None or not (a.is_cuda and out_dtype == torch.float32)
    fast = _fast_accumulation(a.device)
    kw = dict(scale_a=scale_a, scale_b=scale_b, bias=bias if fused_bias else None, out_dtype=out_dtype)
    if scale_a.dim() == 0 and scale_b.dim() == 0:
        y = _tensorwise_scaled_mm(a, b, use_fast_accum=fast, **kw)
    else:
        y = torch._scaled_mm(a, b, use_fast_accum=fast, **kw)
    return y if fused_bias else y + bias


def _tensorwise_scaled_mm(a, b, *, scale_a, scale_b, bias, out_dtype, use_fast_accum=False) -> torch.Tensor:
    """One scale per operand, the op comfy-kitchen's `TensorCoreFP8Layout` linear calls (reference:
    ``comfy_kitchen.scaled_mm_v2.scaled_mm_v2``): `F.scaled_mm` with tensor-wise recipes where torch has it (2.10
    on), else `torch._scaled_mm`. The two are separate kernels that may sum in another order on some CPUs, so the
    float32 outputs agree with ComfyUI's bit for bit only through the same one."""
    if not hasattr(F, "scaled_mm"):
        return torch._scaled_mm(
            a,
            b,
            scale_a=scale_a,
            scale_b=scale_b,
            bias=bias,
            out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )
    tensorwise = F.ScalingType.TensorWise
    return F.scaled_mm(
        a,
        b,
        scale_a=scale_a,
        scale_recipe_a=tensorwise,
        scale_b=scale_b,
        scale_recipe_b=tensorwise,
        bias=bias,
        output_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
    )


class FP8Linear(QuantizedLinear):
    """`fp8_channel`: float8_e4m3fn weight, one float32 scale per output channel.

    Fast path: activations quantized per row (per token) to float8 on each call, as the checkpoint's config
    says (`fp8_channel.quantize_rows`; on CUDA by one fused pass, `fused.fp8_rows`, bit for bit the same), and
    multiplied by `torch._scaled_mm` with both row-wise scales, bias fused, fast accumulation on CUDA, where the
    device has it for the input's dtype (probed once per device: the CPU from torch 2.13, SM89+ GPUs) and both
    dims are multiples of 16.
    """

    FORMAT = fp8_channel.FORMAT
    KERNEL_ON_CPU = False  # the CPU's _scaled_mm is emulated: 3.4x a bf16 step, decoding about 1x

    def static_problem(self, x: torch.Tensor) -> str | None:
        return _fp8_problem(self, x)

    def accumulation(self, device: torch.device) -> Accumulation:
        return _fp8_accumulation(device)

    def quantized_input(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if fused.available(rows.device):
            return fused.fp8_rows(rows)
        return fp8_channel.quantize_rows(rows)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self._buffers[fp8_channel.WEIGHT], self._buffers[fp8_channel.SCALE]
        x_q, x_scale = self.quantized_input(_rows(x, self.in_features))
        y = _scaled_mm_with_bias(x_q, weight.t(), x_scale, scale.t(), self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = fp8_channel.quantize_rows(rows)
        return _decoded(x_q, x_scale), _decoded(
            self._buffers[fp8_channel.WEIGHT], self._buffers[fp8_channel.SCALE]
        )


class ComfyFP8Linear(QuantizedLinear):
    """`comfy_fp8`: float8_e4m3fn weight with one float32 scale for the whole tensor (ComfyUI's "fp8 scaled").

    Fast path, as comfy-kitchen's `TensorCoreFP8Layout` runs the layer: the activations of the call are quantized
    with one scale by ``quantize_per_tensor_fp8`` (`comfy_fp8.quantize_tensor`: times the reciprocal in the
    input's dtype, clamped, cast; on CUDA by the fused `fused.fp8_tensor`, bit for bit the same), then
    `torch._scaled_mm` with both tensor scales, bias fused, output in the input's dtype (fast accumulation on
    CUDA); where the device has a tensor-wise `_scaled_mm` for that dtype and both dims are multiples of 16.
    The scale: the layer's stored ``input_scale`` where the checkpoint has one (`convert --calibrate`; ComfyUI
    passes it as ``scale=`` too, and an input beyond its amax is clamped), else a dynamic one, ``amax|x| / 448``
    taken in the input's dtype and held in float32 (comfy-kitchen's default; an all-zero input gets 1, where
    comfy-kitchen's would divide by zero. ComfyUI's own FP8 layout takes the scale 1 for a layer without
    ``input_scale``). The eager reference quantizes no activation, with a static scale or without: it is the
    weight's decoding alone, what `verify --forward` proves.
    """

    FORMAT = comfy_fp8.FORMAT
    KERNEL_ON_CPU = (
        False  # as FP8Linear; ComfyUI too decodes float8 weights where the device has no FP8 compute
    )

    def static_problem(self, x: torch.Tensor) -> str | None:
        if self._buffers[comfy_fp8.WEIGHT].dtype != FP8_DTYPE:
            return "the kernel multiplies float8_e4m3fn weights, this layer's are float8_e5m2"
        return _fp8_problem(self, x)

    def accumulation(self, device: torch.device) -> Accumulation:
        return _fp8_accumulation(device)

    def quantized_input(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        static = self._buffers.get(comfy_fp8.INPUT_SCALE)  # a part only where the options have it
        if fused.available(rows.device):
            return fused.fp8_tensor(rows, static)
        return comfy_fp8.quantize_tensor(rows, static)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self._buffers[comfy_fp8.WEIGHT], self._buffers[comfy_fp8.SCALE]
        x_q, x_scale = self.quantized_input(_rows(x, self.in_features))
        y = _scaled_mm_with_bias(x_q, weight.t(), x_scale, scale.float(), self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = comfy_fp8.quantize_tensor(rows, self._buffers.get(comfy_fp8.INPUT_SCALE))
        return _decoded(x_q, x_scale), _decoded(
            self._buffers[comfy_fp8.WEIGHT], self._buffers[comfy_fp8.SCALE]
        )


class Int8Linear(QuantizedLinear):
    """`comfy_int8`: int8 weight, one float32 scale per output row; W8A8.

    Fast path, comfy-kitchen's eager ``int8_linear`` (what ComfyUI calls for a `TensorWiseINT8Layout` weight;
    bit for bit on the CPU, tested): the activations of the call are quantized per row to int8
    (`comfy_int8.quantize_rows`; ConvRot: rotated first, `comfy_int8.rotate_activations`), multiplied by
    `torch._int_mm` with int32 accumulation, and scaled back in float32 by the product of both scales, cast to
    the input's dtype, then the bias added in it. Runs wherever `torch._int_mm` does (the CPU;
    CUDA GPUs from Turing on, rows padded to what cuBLASLt takes). On CUDA the quantization and the epilogue are
    one fused pass each (`fused.int8_rows`, `fused.int8_epilogue`: bit for bit the eager ones).
    """

    FORMAT = comfy_int8.FORMAT

    def accumulation(self, device: torch.device) -> Accumulation:
        return INT32_SUM

    def _input_rows(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, self.in_features).contiguous()
        if self.FORMAT.layout(self.options).convrot:  # X·Wᵀ = (X·H)·(W·H)ᵀ: the stored weight is W·H
            rows = comfy_int8.rotate_activations(rows)
        return rows

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self._buffers[comfy_int8.WEIGHT], self._buffers[comfy_int8.SCALE]
        rows = self._input_rows(x)
        if fused.available(rows.device):
            x_q, x_scale = fused.int8_rows(rows)
            y = _int8_product(x_q, weight, x_scale, scale, self.bias, x.dtype, "comfy")
            return y.reshape(*x.shape[:-1], self.out_features)
        x_q, x_scale = comfy_int8.quantize_rows(rows)
        acc = int_mm(x_q, weight.t())
        y = acc.float().mul_(x_scale * scale.reshape(1, -1)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = comfy_int8.quantize_rows(self._input_rows(x))
        weight, scale = self._buffers[comfy_int8.WEIGHT], self._buffers[comfy_int8.SCALE]
        return _decoded(x_q, x_scale), _decoded(weight, scale.reshape(-1, 1))


#: how the fused int8 paths multiply on CUDA: "triton" (`fused.int8_mm`: the GEMM with the epilogue in it, the
#: int32 sums never written) or "int_mm" (cuBLASLt's `torch._int_mm`, then `fused.int8_epilogue` in one pass over
#: the int32 sums). Bit for bit the same numbers; `make gpu-check` times both: on an H200 at Wan 14B's shapes,
#: 0.98-1.03x bf16 against 1.09-1.23x (docs/BENCHMARKS.md)
INT8_GEMM = "triton"


def _int8_product(x_q, weight, x_scale, w_scale, bias, out_dtype, style: str) -> torch.Tensor:
    """The fused int8 product of `style`'s epilogue, by the GEMM `INT8_GEMM` names."""
    if INT8_GEMM == "triton":
        return fused.int8_mm(x_q, weight, x_scale, w_scale, bias, out_dtype, style)
    return fused.int8_epilogue(int_mm(x_q, weight.t()), x_scale, w_scale, bias, out_dtype, style)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int32 [m, n] = int8 a [m, k] @ int8 b [k, n] by `torch._int_mm`; on CUDA, the rows and the inner dim are
    padded with zeros to what cuBLASLt takes (m > 16 and a multiple of 8, k and n multiples of 8), which changes
    no sum."""
    if a.device.type != "cuda":
        return torch._int_mm(a, b)
    m, k = a.shape
    n = b.shape[1]
    pm, pk, pn = max(32, -(-m // 8) * 8), -(-k // 8) * 8, -(-n // 8) * 8
    if (pm, pk) != (m, k):
        a = F.pad(a, (0, pk - k, 0, pm - m))
    if (pk, pn) != (k, n):  # padded as the [n, k] weight, then viewed back: b stays column-major (cuBLASLt's)
        b = F.pad(b.t(), (0, pk - k, 0, pn - n)).t()
    return torch._int_mm(a, b)[:m, :n]


class GGUFLinear(QuantizedLinear):
    """`gguf`: one GGML block type per layer (its `GgufOptions`), the stored rows of blocks kept as they are
    (uint8 [out, row bytes]) on the host and on the device.

    Every call decodes the layer's weight to the input's dtype (gguf-py's values: Q8_0, the K-quants and the
    _0 / _1 types in torch, on the layer's device; Q8_0 on CUDA by one fused pass, `fused.q8_0_decode`, bit for
    bit the torch decoder) and runs `F.linear`: one layer in high precision at a time, never the model. There is
    no other kernel; its reference is itself.
    """

    FORMAT = gguf.FORMAT
    HAS_KERNEL = False

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        blocks = self._buffers[gguf.WEIGHT]
        if self.options.type_name == "Q8_0" and fused.available(blocks.device):
            return fused.q8_0_decode(blocks, dtype)
        return super().dequantize(dtype)


class Float8Linear(QuantizedLinear):
    """`torchao_fp8`: torchao's `Float8Tensor` (PerRow weight, dynamic PerRow activations).

    The stored qdata and scale are plain buffers; each call wraps them (no copy) in the `Float8Tensor`
    that diffusers' torchao loader would have put in `.weight`, and `F.linear` dispatches to torchao,
    so the numbers are torchao's own (its mm config accumulates fast). `.weight` returns that tensor too.
    """

    FORMAT = torchao_fp8.FORMAT
    KERNEL_ON_CPU = False  # torchao's CPU path for Float8Tensor: 3.8x a bf16 step, decoding about 1x

    @property
    def weight(self) -> torch.Tensor:
        return torchao_fp8.to_float8_tensor(self.stored())

    def accumulation(self, device: torch.device) -> Accumulation:
        return _fp8_accumulation(device)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight, bias)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weight = self.weight  # torchao's own activation quantizer, with the weight's act_quant_kwargs
        x_q = torchao_fp8.quantize_activation(rows, weight)
        return _decoded(x_q.qdata, x_q.scale), _decoded(weight.qdata, weight.scale)


class NF4Linear(QuantizedLinear):
    """`nf4`: bitsandbytes' 4-bit NormalFloat with double quantization.

    The quant state's fixed fields (shape, nested offset...) are parsed once, when the parts are set;
    each call builds bitsandbytes' `QuantState` from the buffers on their device, with no host round
    trip. On the CPU the weight is dequantized for the call and used by `F.linear` (what
    `bitsandbytes.matmul_4bit` does there); elsewhere `matmul_4bit` runs. The input is computed in
    `compute_dtype` (bf16, the checkpoint's `bnb_4bit_compute_dtype`) and the output returned in the
    input's dtype, as bitsandbytes' `Linear4bit` does.
    """

    FORMAT = nf4.FORMAT
    compute_dtype = torch.bfloat16

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._fields: dict | None = None
        self.register_buffer("nested_offset", torch.zeros((), device=kw.get("device")), persistent=False)

    def parts_changed(self) -> None:
        packed = self._buffers[_attr(nf4.QUANT_STATE)]
        if packed.is_meta:
            self._fields = None
            return
        self._fields = nf4.state_fields(packed)
        offset = torch.tensor(float(self._fields["nested_offset"]), dtype=torch.float32)
        self._buffers["nested_offset"] = offset.to(packed.device)

    def _quant_state(self):
        if self._fields is None:
            raise RuntimeError("NF4Linear has no weight yet: load it with loaders.load_quantized")
        return bnb.quant_state(self.stored(), self._fields, self._buffers["nested_offset"])

    def _bnb_weight(self) -> torch.Tensor:
        """The weight as bitsandbytes dequantizes it for a matmul (in the quant state's dtype, bf16)."""
        return bnb.functional().dequantize_4bit(
            self._buffers[nf4.WEIGHT], self._quant_state(), quant_type="nf4"
        )

    def static_problem(self, x: torch.Tensor) -> str | None:
        if x.device.type == "cuda" and (problem := bnb.cuda_problem()) is not None:
            return problem
        return super().static_problem(x)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        x_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        if x.device.type == "cpu":
            y = F.linear(x, self._bnb_weight().to(self.compute_dtype), bias)
        else:
            weight = self._buffers[nf4.WEIGHT].t()
            y = bnb.bitsandbytes().matmul_4bit(x, weight, bias=bias, quant_state=self._quant_state())
        return y.to(x_dtype)

    def kernel_bias(self, x: torch.Tensor) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.to(self.compute_dtype)

    def accumulation(self, device: torch.device) -> Accumulation:
        return BF16_REDUCED_SUM if device.type == "cuda" else FP32_SUM

    def kernel_dtype(self, x: torch.Tensor) -> torch.dtype:
        return self.compute_dtype  # computed in bf16, then widened or kept in the input's dtype

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rows.to(self.compute_dtype).double(), self._bnb_weight().double()


class TorchaoInt8Linear(QuantizedLinear):
    """`torchao_int8`: torchao's `Int8Tensor` (int8 weight, one float32 scale per output row); W8A8.

    Fast path, torchao's own linear for the `Int8Tensor` diffusers' loader puts in `.weight` (bit for bit on the
    CPU, tested): the activations of the call quantized per row in their dtype as torchao's `from_hp` does
    (`torchao_int8.quantize_rows`), multiplied by `int_mm` (int32 accumulation; on CUDA padded, the weight never
    copied), times the activation scales in float32, cast to the input's dtype, times the weight scales in
    float32, the bias added, cast back. Runs wherever `torch._int_mm` does. `.weight` is that `Int8Tensor`. On
    CUDA the quantization and the epilogue are one fused pass each (`fused.int8_rows_torchao`,
    `fused.int8_epilogue`: bit for bit the eager ones).
    """

    FORMAT = torchao_int8.FORMAT
    KERNEL_ON_CPU = False  # measured: 1.7-2.2x a bf16 Linear on the CPU, decoding about 1x

    @property
    def weight(self) -> torch.Tensor:
        return torchao_int8.to_int8_tensor(self.stored())

    def accumulation(self, device: torch.device) -> Accumulation:
        return INT32_SUM

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self._buffers[torchao_int8.QDATA], self._buffers[torchao_int8.SCALE]
        rows = _rows(x, self.in_features)
        if fused.available(rows.device):
            x_q, x_scale = fused.int8_rows_torchao(rows)
            y = _int8_product(x_q, weight, x_scale, scale, self.bias, x.dtype, "torchao")
            return y.reshape(*x.shape[:-1], self.out_features)
        x_q, x_scale = torchao_int8.quantize_rows(rows)
        y = (int_mm(x_q, weight.t()).float() * x_scale).to(x.dtype) * scale.reshape(-1)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q, x_scale = torchao_int8.quantize_rows(rows)
        weight, scale = self._buffers[torchao_int8.QDATA], self._buffers[torchao_int8.SCALE]
        return _decoded(x_q, x_scale), _decoded(weight, scale.reshape(-1, 1))


def _block_scaled_problem(layer: QuantizedLinear, x: torch.Tensor, layout: str) -> str | None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return "the block-scaled kernel takes bf16 or fp16 inputs"
    if layer.in_features % 32:
        return (
            f"the block-scaled kernel needs in_features a multiple of 32, the layer has {layer.in_features}"
        )
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) < (10, 0):
        return f"block-scaled {layout} _scaled_mm needs a Blackwell GPU (SM100+)"
    return None


class NVFP4Linear(QuantizedLinear):
    """`comfy_nvfp4`: E2M1 weight with E4M3 block scales (per 16 inputs) and one float32 scale.

    Fast path (Blackwell, SM100+: FP4 tensor cores), as ComfyUI runs the layer there: the activations of the call
    are quantized to NVFP4 by the format's own encoder (its tensor scale the stored ``input_scale`` where the
    checkpoint has one, `convert --calibrate`, else dynamic), and `torch._scaled_mm` multiplies
    the two with both block-scale layouts as cuBLAS reads them, the product of the tensor scales applied after.
    Elsewhere (the CPU, GPUs before Blackwell) the weight is decoded for each call, as ComfyUI does.
    """

    FORMAT = comfy_nvfp4.FORMAT
    PROBE_SHAPE = (128, 128)

    def static_problem(self, x: torch.Tensor) -> str | None:
        return _block_scaled_problem(self, x, "nvfp4")

    def _encoded_input(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        static = self._buffers.get(comfy_nvfp4.INPUT_SCALE)  # a part only where the options have it
        return comfy_nvfp4.FORMAT.encode(rows, **({} if static is None else {"scale": static}))

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, self.in_features)
        a = self._encoded_input(rows)
        w = self.stored()
        y = torch._scaled_mm(
            a[comfy_nvfp4.WEIGHT].view(torch.float4_e2m1fn_x2),
            w[comfy_nvfp4.WEIGHT].view(torch.float4_e2m1fn_x2).t(),
            scale_a=a[comfy_nvfp4.SCALE].reshape(-1),  # the tiled scales flattened, as torchao passes them
            scale_b=w[comfy_nvfp4.SCALE].reshape(-1),
            out_dtype=torch.float32,
        )
        y = y[: rows.shape[0], : self.out_features].mul_(
            a[comfy_nvfp4.SCALE_2] * w[comfy_nvfp4.SCALE_2].float()
        )
        y = y.to(x.dtype) if self.bias is None else (y + self.bias.float()).to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self._encoded_input(rows)
        shape = (rows.shape[0], self.in_features)
        return self.FORMAT.decoded(a, shape, torch.float64), self.dequantize(torch.float64)


class MXFP8Linear(QuantizedLinear):
    """`comfy_mxfp8`: float8_e4m3fn weight with E8M0 block scales (per 32 inputs).

    Fast path (Blackwell, SM100+): the activations of the call are quantized to MXFP8 by the format's own
    encoder and `torch._scaled_mm` multiplies the two with their tiled E8M0 scales. Elsewhere the weight is
    decoded for each call, as ComfyUI does.
    """

    FORMAT = comfy_mxfp8.FORMAT
    PROBE_SHAPE = (128, 128)

    def static_problem(self, x: torch.Tensor) -> str | None:
        return _block_scaled_problem(self, x, "mxfp8")

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x, self.in_features)
        a = comfy_mxfp8.FORMAT.encode(rows)
        w = self.stored()
        y = torch._scaled_mm(
            a[comfy_mxfp8.WEIGHT],
            w[comfy_mxfp8.WEIGHT].t(),
            scale_a=a[comfy_mxfp8.SCALE].view(torch.float8_e8m0fnu).reshape(-1),
            scale_b=w[comfy_mxfp8.SCALE].view(torch.float8_e8m0fnu).reshape(-1),
            out_dtype=x.dtype,
        )[: rows.shape[0], : self.out_features]
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def kernel_operands(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = comfy_mxfp8.FORMAT.encode(rows)
        shape = (rows.shape[0], self.in_features)
        return self.FORMAT.decoded(a, shape, torch.float64), self.dequantize(torch.float64)


MODULES: dict[str, type[QuantizedLinear]] = {
    cls.FORMAT.NAME: cls
    for cls in (
        FP8Linear,
        ComfyFP8Linear,
        Int8Linear,
        GGUFLinear,
        Float8Linear,
        NF4Linear,
        TorchaoInt8Linear,
        NVFP4Linear,
        MXFP8Linear,
    )
}


def module_for(fmt: Format) -> type[QuantizedLinear]:
    """The quantized Linear for `fmt`; a format without one cannot be loaded here (the error says what runs it)."""
    try:
        return MODULES[fmt.NAME]
    except KeyError:
        runs_in = ", ".join(format_info(fmt.NAME).runs_in)
        raise InputError(
            f"a {fmt.NAME} checkpoint runs in {runs_in}, not in loaders (it loads {', '.join(sorted(MODULES))})"
        ) from None
