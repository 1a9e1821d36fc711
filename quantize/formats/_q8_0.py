"""GGML's Q8_0 decoded in torch, bit for bit as ggml and gguf-py decode it.

A Q8_0 block is 32 values stored in 34 bytes: ``d`` (float16, little-endian), then 32 int8 ``qs``; a value is
``qs · d``, one float32 product. gguf-py decodes it in numpy through a split and two dtype copies; reading
the int8 values in place is about 4x faster, and the error figures decode every Q8_0 weight a conversion
writes. (Encoding stays with ggml's own C quantizer: torch is no faster at it.)
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "BLOCK_BYTES", "dequantize"]

BLOCK = 32
BLOCK_BYTES = 2 + BLOCK


def dequantize(q: torch.Tensor) -> torch.Tensor:
    """float32 rows [rows, cols] of Q8_0 bytes `q` (uint8 [rows, cols / 32 · 34])."""
    rows = q.shape[0]
    blocks = q.reshape(rows, -1, BLOCK_BYTES)
    d = blocks[:, :, :2].contiguous().view(torch.float16).float()  # [rows, blocks, 1]
    return blocks[:, :, 2:].view(torch.int8).float().mul_(d).view(rows, -1)
