"""The quantized Linear modules, one per runtime scheme (one per on-disk format): the registry and the names.

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
| `FP8ChannelLinear` | fp8_channel | activations to float8 per row, `torch._scaled_mm` with both row-wise scales |
| `ComfyFP8Linear` | comfy_fp8 | activations to float8 with one dynamic scale, `torch._scaled_mm` with both tensor scales |
| `ComfyInt8Linear` | comfy_int8 | activations to int8 per row (ConvRot: rotated first), `torch._int_mm` (int32 accumulate), scaled by both scales |
| `ComfyNVFP4Linear` | comfy_nvfp4 | SM100+: activations to NVFP4, block-scaled `torch._scaled_mm`; elsewhere decoded per call |
| `ComfyMXFP8Linear` | comfy_mxfp8 | SM100+: activations to MXFP8, block-scaled `torch._scaled_mm`; elsewhere decoded per call |
| `ComfyW4a8Linear` | comfy_w4a8 | activations rotated and to int8 per row, `torch._int_mm` (int32 accumulate) on the 4-bit codes decoded to int8, scaled by both row scales |
| `ComfyW4a4Linear` | comfy_w4a4 | none (torch has no int4 GEMM): the packed int4 weight decoded and rotated back per call |
| `GGUFLinear` | gguf | none: the stored blocks stay as they are, each call decodes the layer (torch decoders) |
| `TorchaoFP8Linear` | torchao_fp8 | torchao's `Float8Tensor` dispatch |
| `NF4Linear` | nf4 | bitsandbytes (`matmul_4bit`; on the CPU its dequantization) |
| `TorchaoInt8Linear` | torchao_int8 | torchao's int8 linear: activations to int8 per row, `torch._int_mm`, both scales |

Each scheme is the module of its format's name (`fp8_channel.py` holds `FP8ChannelLinear`), beside what they share:
`base.py` (`QuantizedLinear`, `COMPUTE`, `KernelUnavailable`, `set_param`, the once-per-device probe) and `gemm.py`
(the `torch._scaled_mm` / `torch._int_mm` calls and what each needs of a layer). The registry, `MODULES` by format
name and `module_for`, is here and nowhere else.

The classes' earlier names stay importable, from here and from `loaders`, as aliases (the same class objects):
`FP8Linear` is `FP8ChannelLinear`, `Int8Linear` is `ComfyInt8Linear`, `Float8Linear` is `TorchaoFP8Linear`,
`NVFP4Linear` is `ComfyNVFP4Linear`, `MXFP8Linear` is `ComfyMXFP8Linear`. So is the setting
``loaders.modules.INT8_GEMM`` (which GEMM the fused int8 paths run on CUDA): read and set here, it is
`gemm.INT8_GEMM`, where the products read it.
"""

from __future__ import annotations

import sys
import types

from quantize.errors import InputError
from quantize.formats import Format, format_info

from . import gemm
from .base import COMPUTE, KernelUnavailable, QuantizedLinear, set_param
from .comfy_fp8 import ComfyFP8Linear
from .comfy_int8 import ComfyInt8Linear
from .comfy_mxfp8 import ComfyMXFP8Linear
from .comfy_nvfp4 import ComfyNVFP4Linear
from .comfy_w4a4 import ComfyW4a4Linear
from .comfy_w4a8 import ComfyW4a8Linear
from .fp8_channel import FP8ChannelLinear
from .gemm import int_mm as int_mm  # public before the split (the fused kernels' tests use it)
from .gguf import GGUFLinear
from .nf4 import NF4Linear
from .torchao_fp8 import TorchaoFP8Linear
from .torchao_int8 import TorchaoInt8Linear

__all__ = [
    "QuantizedLinear",
    "FP8ChannelLinear",
    "ComfyFP8Linear",
    "ComfyInt8Linear",
    "GGUFLinear",
    "TorchaoFP8Linear",
    "NF4Linear",
    "ComfyNVFP4Linear",
    "ComfyMXFP8Linear",
    "ComfyW4a4Linear",
    "ComfyW4a8Linear",
    "TorchaoInt8Linear",
    # the earlier names, aliases of the classes above
    "FP8Linear",
    "Int8Linear",
    "Float8Linear",
    "NVFP4Linear",
    "MXFP8Linear",
    "MODULES",
    "COMPUTE",
    "KernelUnavailable",
    "module_for",
    "set_param",
]

# -- the earlier names: aliases, the same class objects ---------------------------------------------------------

FP8Linear = FP8ChannelLinear
Int8Linear = ComfyInt8Linear
Float8Linear = TorchaoFP8Linear
NVFP4Linear = ComfyNVFP4Linear
MXFP8Linear = ComfyMXFP8Linear

# -- the registry -----------------------------------------------------------------------------------------------

MODULES: dict[str, type[QuantizedLinear]] = {
    cls.FORMAT.NAME: cls
    for cls in (
        FP8ChannelLinear,
        ComfyFP8Linear,
        ComfyInt8Linear,
        GGUFLinear,
        TorchaoFP8Linear,
        NF4Linear,
        TorchaoInt8Linear,
        ComfyNVFP4Linear,
        ComfyMXFP8Linear,
        ComfyW4a4Linear,
        ComfyW4a8Linear,
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


# -- a setting that lives in a submodule, read and set through the package --------------------------------------


class _Package(types.ModuleType):
    """This package's module object: ``loaders.modules.INT8_GEMM`` reads and sets `gemm.INT8_GEMM`, the setting the
    int8 products read, so that setting it here (`make gpu-check` times both GEMMs so) still chooses the GEMM."""

    @property
    def INT8_GEMM(self) -> str:
        return gemm.INT8_GEMM

    @INT8_GEMM.setter
    def INT8_GEMM(self, value: str) -> None:
        gemm.INT8_GEMM = value


sys.modules[__name__].__class__ = _Package
