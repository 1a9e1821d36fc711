"""The quantized Linear modules, one per on-disk format.

Each keeps the format's stored parts as plain tensors (buffers), under the format's own part names
in its state dict, and builds what the computation needs (a torchao `Float8Tensor`, a bitsandbytes
`QuantState`) from them on each call. Nothing the module holds is a tensor subclass, so it deep-copies,
moves with `.to()` while weak references to its tensors exist, pins, and can be re-pointed at a
device buffer by the block offloader, exactly like a plain tensor. The parts keep their stored dtypes
whatever `.to(dtype)` asks (a float8 weight cast to bf16 would be the very copy this package avoids);
the bias follows it like any parameter, and the output has the input's dtype.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from quantize import dtypes
from quantize.errors import InputError
from quantize.formats import Format, format_info, fp8_channel, nf4, torchao_fp8
from quantize.formats._e4m3 import FP8_DTYPE, FP8_MAX, row_absmax
from quantize.formats._e4m3 import quantize_rows as e4m3_rows

from . import bnb

__all__ = ["QuantizedLinear", "FP8Linear", "Float8Linear", "NF4Linear", "MODULES", "module_for", "set_param"]


def _attr(part: str) -> str:
    """The attribute holding a part; part names may contain dots (``weight.absmax``), attributes may not."""
    return part.replace(".", "_")


class QuantizedLinear(nn.Module):
    """A Linear whose weight is stored in `FORMAT`'s parts; subclasses define `forward`."""

    FORMAT: ClassVar[Format]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.part_attrs: dict[str, str] = {}
        self._late_parts: set[str] = set()  # parts whose size is only known from the checkpoint
        for part, (dtype_name, shape) in self.FORMAT.parts((out_features, in_features)).items():
            empty = torch.empty(shape or (0,), dtype=dtypes.by_name(dtype_name).torch, device=device)
            self.register_buffer(_attr(part), empty)
            self.part_attrs[part] = _attr(part)
            if shape is None:
                self._late_parts.add(part)
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
            if bias
            else None
        )

    @classmethod
    def like(cls, linear: nn.Linear) -> QuantizedLinear:
        """An empty (meta) module to take `linear`'s place."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta")

    def stored(self) -> dict[str, torch.Tensor]:
        """The parts, by the format's part names."""
        return {part: self._buffers[attr] for part, attr in self.part_attrs.items()}

    def set_part(self, part: str, tensor: torch.Tensor) -> None:
        """Take `tensor` (not a copy) as the stored part `part`; its dtype and shape must be the format's."""
        dtype_name, shape = self.FORMAT.parts((self.out_features, self.in_features))[part]
        if tensor.dtype != dtypes.by_name(dtype_name).torch or (
            shape is not None and tuple(tensor.shape) != shape
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
        return self.FORMAT.decode(self.stored(), dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, format={self.FORMAT.NAME}"
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
            value, current = state_dict[key], getattr(self, attr)
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


@functools.cache
def _scaled_mm_rowwise(device: torch.device, out_dtype: torch.dtype) -> bool:
    """Whether `torch._scaled_mm` takes float8 operands with row-wise float32 scales on this device for this
    output dtype: tried once on a 16x16 problem (the CPU has it; which GPUs do depends on the build)."""
    if device.type not in ("cpu", "cuda"):
        return False
    try:
        a = torch.zeros(16, 16, device=device).to(FP8_DTYPE)
        scale = torch.ones(16, 1, device=device)
        torch._scaled_mm(a, a.t(), scale_a=scale, scale_b=scale.t(), out_dtype=out_dtype)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


class FP8Linear(QuantizedLinear):
    """`fp8_channel`: float8_e4m3fn weight, one float32 scale per output channel.

    With `compute="scaled_mm"` (the default) activations are quantized per row (per token) to float8
    on each call, as the checkpoint's config says, and multiplied by `torch._scaled_mm` with both
    row-wise scales where the device has it for the input's dtype (tried once per device: the CPU,
    SM89+ GPUs in bf16) and both dims are multiples of 16; elsewhere, and with `compute="dequantize"`,
    the weight is dequantized to the input's dtype for that call and used by `F.linear`.
    """

    FORMAT = fp8_channel.FORMAT
    COMPUTE = ("scaled_mm", "dequantize")

    def __init__(self, *args, compute: str = "scaled_mm", **kw):
        super().__init__(*args, **kw)
        if compute not in self.COMPUTE:
            raise ValueError(f"compute must be one of {self.COMPUTE}, got {compute!r}")
        self.compute = compute

    def uses_scaled_mm(self, x: torch.Tensor) -> bool:
        return (
            self.compute == "scaled_mm"
            and self.in_features % 16 == 0
            and self.out_features % 16 == 0
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and _scaled_mm_rowwise(x.device, x.dtype)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, scale = self._buffers[fp8_channel.WEIGHT], self._buffers[fp8_channel.SCALE]
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if not self.uses_scaled_mm(x):
            return F.linear(x, self.dequantize(x.dtype), bias)
        rows = x.reshape(-1, self.in_features)
        x_scale, x_q = quantize_rows(rows)
        y = torch._scaled_mm(
            x_q, weight.t(), scale_a=x_scale, scale_b=scale.t(), bias=bias, out_dtype=x.dtype
        )
        return y.reshape(*x.shape[:-1], self.out_features)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row float8 quantization of 2-D activations: (float32 scale [rows, 1], float8 values)."""
    xf = x.float()
    q, scale = e4m3_rows(xf, row_absmax(xf).div_(FP8_MAX))
    return scale, q


class Float8Linear(QuantizedLinear):
    """`torchao_fp8`: torchao's `Float8Tensor` (PerRow weight, dynamic PerRow activations).

    The stored qdata and scale are plain buffers; each call wraps them (no copy) in the `Float8Tensor`
    that diffusers' torchao loader would have put in `.weight`, and `F.linear` dispatches to torchao,
    so the numbers are torchao's own. `.weight` returns that tensor too.
    """

    FORMAT = torchao_fp8.FORMAT

    @property
    def weight(self) -> torch.Tensor:
        return torchao_fp8.to_float8_tensor(self.stored())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight, bias)


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
        """The weight as bitsandbytes dequantizes it for a matmul on the CPU (in the quant state's dtype, bf16)."""
        return bnb.functional().dequantize_4bit(
            self._buffers[nf4.WEIGHT], self._quant_state(), quant_type="nf4"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        if x.device.type == "cpu":
            y = F.linear(x, self._bnb_weight().to(self.compute_dtype), bias)
        else:
            weight = self._buffers[nf4.WEIGHT].t()
            y = bnb.bitsandbytes().matmul_4bit(x, weight, bias=bias, quant_state=self._quant_state())
        return y.to(x_dtype)


#: format name -> the module that computes with it (each class names its format)
MODULES: dict[str, type[QuantizedLinear]] = {
    cls.FORMAT.NAME: cls for cls in (FP8Linear, Float8Linear, NF4Linear)
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
