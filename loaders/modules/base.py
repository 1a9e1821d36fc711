"""What every quantized Linear shares: `QuantizedLinear` and the once-per-device probe of its kernel.

`QuantizedLinear` keeps a format's stored parts as frozen parameters holding their bytes (uint8: what FSDP2 shards and
gathers in any group, what no dtype cast or "first floating parameter" rule touches), reads them back typed under the
format's part names (so the state dict is the checkpoint's keys, in its dtypes), moves with `.to()` keeping their
stored dtypes, and chooses per call between the scheme's kernel (`fast_forward`) and its eager reference (the weight
decoded for the call); whether a kernel runs on a device is probed once per class, device and dtype, its result held
to the exact emulation (`loaders/emulation.py`). The schemes (one module per format beside this one) define what
differs: their kernel, its operands, its accumulation.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from quantize import dtypes
from quantize.formats import NO_OPTIONS, Format, FormatOptions

from ..emulation import FP32_SUM, Accumulation, Emulation, emulate_product

_REQUIRED = object()

#: how a module computes: the faster of its kernel and its reference on the device ("fast"), its kernel wherever it
#: runs and an error where it does not ("kernel"), or the weight decoded for each call ("dequantize", the eager
#: reference)
COMPUTE = ("fast", "kernel", "dequantize")


class KernelUnavailable(RuntimeError):
    """``compute="kernel"`` where the module's kernel cannot run: one line naming the module, the device, the input's
    dtype and what is missing. ``compute="fast"`` decodes the weight there instead."""


def _attr(part: str) -> str:
    """The parameter holding a part's bytes, ``<part>_bytes``: part names may contain dots (``weight.absmax``),
    attributes may not, and ``weight`` is the class's stand-in, which FSDP2 would read (`getattr`) for the part."""
    return part.replace(".", "_") + "_bytes"


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
        self._part_types: dict[
            str, tuple[torch.dtype, tuple[int, ...]]
        ] = {}  # attr -> the part's dtype, shape
        self._late_parts: set[str] = set()  # parts whose size is only known from the checkpoint
        for part, (dtype_name, shape) in self._specs().items():
            held = (0,) if shape is None else dtypes.held_shape(dtype_name, shape)
            self.part_attrs[part] = _attr(part)
            self._hold(_attr(part), torch.empty(held, dtype=dtypes.by_name(dtype_name).torch, device=device))
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

    def _hold(self, attr: str, tensor: torch.Tensor) -> None:
        """Keep `tensor` (not a copy) as the part at `attr`: a frozen parameter of its bytes (`as_bytes`), its dtype
        and shape noted to read it back (`part`). `weight` is the property below, not this parameter's name."""
        self._part_types[attr] = (tensor.dtype, tuple(tensor.shape))
        self._parameters[attr] = nn.Parameter(as_bytes(tensor), requires_grad=False)

    def part(self, part: str, default=_REQUIRED) -> torch.Tensor | None:
        """The stored part `part` in its format's dtype and shape: a view of the bytes held, never a copy. A part the
        layer's options leave out is `default` where one is given (an error otherwise)."""
        attr = self.part_attrs.get(part)
        if attr is None:
            if default is _REQUIRED:
                raise KeyError(f"{self.FORMAT.NAME} layer has no part {part!r}")
            return default
        return self._typed(attr)

    def _typed(self, attr: str) -> torch.Tensor:
        held = self._parameters[attr]
        dtype, shape = self._part_types[attr]
        if held.dtype != torch.uint8:
            raise TypeError(
                f"{type(self).__name__} parameter {attr!r} was cast to {held.dtype}: its stored bytes are gone. A stored "
                "part is never cast (FSDP2: leave MixedPrecisionPolicy's param_dtype unset, the weights are "
                "already in their compute dtype)"
            )
        return held.view(dtype).view(shape)

    @property
    def weight(self) -> torch.Tensor:
        """What model code reads of a Linear's weight: a float32 stand-in of its logical shape on its device (one
        element, expanded), never the stored part of that name (float8 values, packed bytes): code that casts its
        input to ``.weight.dtype`` (transformers' T5 before its ``wo``) must not cast it to a storage dtype. The
        parts are `stored()`; the weight's values, `dequantize()`."""
        device = self._parameters[next(iter(self.part_attrs.values()))].device
        one = torch.empty((1, 1), dtype=torch.float32, device=device)
        return one.expand(self.out_features, self.in_features)

    def stored(self) -> dict[str, torch.Tensor]:
        """The parts, by the format's part names."""
        return {part: self._typed(attr) for part, attr in self.part_attrs.items()}

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
        self._hold(self.part_attrs[part], tensor)
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
            destination[prefix + part] = self._typed(attr).detach()
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
            current = self.bias if attr == "bias" else self._typed(attr)  # `weight` is a stand-in
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
                self._hold(attr, value)
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
        for attr in self.part_attrs.values():  # bytes: follow the device (pinning, sharing), never a dtype
            held = self._parameters[attr].data
            probe = fn(torch.empty(0, dtype=held.dtype, device=held.device))
            set_param(self, attr, fn(held) if probe.dtype == held.dtype else held.to(probe.device))
        for name, t in self._buffers.items():  # what a scheme derived from its parts (NF4's nested offset)
            if t is None:
                continue
            probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            self._buffers[name] = fn(t) if probe.dtype == t.dtype else t.to(probe.device)
        if self.bias is not None:
            set_param(self, "bias", fn(self.bias.data))
        return self


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bytes as uint8, a view (no copy): its last dim times its itemsize, a scalar's as one row. A part's
    bytes are what FSDP2 shards and all-gathers (a group of float8 alone fails gloo's all-gather; bytes never do)."""
    return (tensor if tensor.dim() else tensor.reshape(1)).view(torch.uint8)


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


def _decoded(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantized values times their scales, exactly, in float64."""
    return q.double() * scale.double()
