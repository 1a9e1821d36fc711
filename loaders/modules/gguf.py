"""`gguf` at run time: `GGUFLinear`, llama.cpp's GGML blocks kept as stored, the layer decoded for each call.

There is no other kernel: the decoding (in torch; Q8_0 on CUDA by one fused pass) and `F.linear` are its reference
and its fast path at once.
"""

from __future__ import annotations

import torch

from quantize.formats import gguf

from .. import fused
from .base import QuantizedLinear


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
        blocks = self.part(gguf.WEIGHT)
        if self.options.type_name == "Q8_0" and fused.available(blocks.device):
            return fused.q8_0_decode(blocks, dtype)
        return super().dequantize(dtype)
