"""loaders: checkpoints written by `quantize convert`, straight into offload-ready modules.

>>> from loaders import load_quantized, enable_block_offload
>>> # model = load_quantized(WanTransformer3DModel, "Wan2.1-T2V-14B-fp8/transformer", host="mmap")
>>> # enable_block_offload(model, device="cuda", host="pinned")

It imports the formats and the checkpoint reader of `quantize`, and nothing else of it.
"""

from .blocks import find_block_lists, find_blocks
from .host import HOST_MODES
from .materialize import CheckpointMismatchError, load_quantized, parameters_on_meta
from .modules import MODULES, Float8Linear, FP8Linear, NF4Linear, QuantizedLinear
from .offload import BlockOffloader, OffloadStats, enable_block_offload

__all__ = [
    "load_quantized",
    "enable_block_offload",
    "BlockOffloader",
    "OffloadStats",
    "CheckpointMismatchError",
    "QuantizedLinear",
    "FP8Linear",
    "Float8Linear",
    "NF4Linear",
    "MODULES",
    "HOST_MODES",
    "find_block_lists",
    "find_blocks",
    "parameters_on_meta",
]
