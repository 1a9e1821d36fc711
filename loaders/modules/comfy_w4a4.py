"""`comfy_w4a4` at run time: `ComfyW4a4Linear`, ComfyUI's ConvRot W4A4 (packed signed int4, one float32 scale per
row, the weight rotated in ConvRot groups).

ComfyUI multiplies it on int4 tensor cores (comfy-kitchen's CUDA GEMM, SM75+). torch has no int4 GEMM this package
could call, so here the weight is decoded for each call on every device (`comfy_w4a4.FORMAT.decode`: the codes times
their scales, rotated back), one layer in high precision at a time, as GGUF's layers are.
"""

from __future__ import annotations

from quantize.formats import comfy_w4a4

from .base import QuantizedLinear


class ComfyW4a4Linear(QuantizedLinear):
    """`comfy_w4a4`: int4 codes two a byte (int8 [out, in/2]), one float32 scale per row, ConvRot-rotated in the
    layer's group (its options: the marker's ``convrot_groupsize``).

    Every call decodes the weight to the input's dtype and runs `F.linear`: there is no other kernel here, so its
    reference is its fast path. (ComfyUI's int4 GEMM also quantizes each call's input to int4 after rotating it:
    what it computes differs from this decoded forward by that rounding of the activations.)
    """

    FORMAT = comfy_w4a4.FORMAT
    HAS_KERNEL = False
