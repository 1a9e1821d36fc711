"""How far a bf16 forward of a converted model may fall below its float32 reference (the loaders' and the
families' tests)."""

from __future__ import annotations

import torch

from quantize.run.forward import forward_sqnr_db

#: how far below min(verify's SQNR, the bf16 floor) the fast path's bf16 forward may fall. Measured on these
#: models (floor 44.6 dB diffusers-layout, 45.9 the dim-256 one, 47.5 native): 0.1-0.3 dB (nf4, diffusers
#: comfy_int8 and gguf q8_0), 1.3 (q4_k_m), 2.3 (native gguf q8_0), 3.1-4.2 dB (fp8 or int8 activations per call:
#: fp8_channel, torchao_fp8, comfy_fp8, native comfy_int8)
FAST_MARGIN_DB = 6.0


def bf16_floor(model, want: torch.Tensor, bf16_inputs: dict) -> float:
    """The SQNR of the float32 `model` run in bf16 as diffusers runs it (``_keep_in_fp32_modules`` in float32)
    against its float32 output `want`; `model` is left in bf16."""
    keep = set(model._keep_in_fp32_modules or ())
    for name, p in model.named_parameters():
        if not keep & set(name.split(".")):
            p.data = p.data.to(torch.bfloat16)
    return forward_sqnr_db(want, model(**bf16_inputs)[0].float())
