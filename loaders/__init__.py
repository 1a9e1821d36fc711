"""loaders: checkpoints written by `quantize convert`, straight into offload-ready modules.

>>> from loaders import load_quantized, enable_block_offload
>>> # model = load_quantized(WanTransformer3DModel, "Wan2.1-T2V-14B-fp8/transformer", host="mmap")
>>> # enable_block_offload(model, device="cuda", host="pinned")

Every format `quantize convert` writes loads (diffusers-layout safetensors, ComfyUI's files, GGUF), in either
naming of its family. It imports the formats, the families' name tables (and `run.names`, the map a forward
pass reads a native model through) and the checkpoint readers of `quantize`, and nothing else of it.
"""

from .blocks import find_block_lists, find_blocks
from .host import HOST_MODES
from .materialize import CheckpointMismatchError, find_components, load_quantized, parameters_on_meta
from .modules import (
    COMPUTE,
    MODULES,
    ComfyFP8Linear,
    ComfyInt8Linear,
    ComfyMXFP8Linear,
    ComfyNVFP4Linear,
    ComfyW4a4Linear,
    ComfyW4a8Linear,
    Float8Linear,
    FP8ChannelLinear,
    FP8Linear,
    GGUFLinear,
    Int8Linear,
    KernelUnavailable,
    MXFP8Linear,
    NF4Linear,
    NVFP4Linear,
    QuantizedLinear,
    TorchaoFP8Linear,
    TorchaoInt8Linear,
)
from .offload import BlockOffloader, OffloadStats, enable_block_offload

__all__ = [
    "load_quantized",
    "enable_block_offload",
    "BlockOffloader",
    "OffloadStats",
    "CheckpointMismatchError",
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
    # the classes' earlier names: aliases, the same class objects (loaders.modules says which is which)
    "FP8Linear",
    "Int8Linear",
    "Float8Linear",
    "NVFP4Linear",
    "MXFP8Linear",
    "MODULES",
    "COMPUTE",
    "KernelUnavailable",
    "find_components",
    "HOST_MODES",
    "find_block_lists",
    "find_blocks",
    "parameters_on_meta",
]
