"""bitsandbytes at run time: its package, imported quietly and only when an NF4 layer first computes, and
the `QuantState` it multiplies with, built from the stored `nf4` parts.

The format (`quantize.formats.nf4`) only writes and reads those parts; running them is the loader's.
"""

from __future__ import annotations

import functools

import torch

from quantize.formats import nf4
from quantize.formats._quiet import silenced

__all__ = ["bitsandbytes", "functional", "quant_state", "cuda_problem"]


@functools.cache
def bitsandbytes():
    """The `bitsandbytes` package (for `matmul_4bit`), imported quietly."""
    with silenced("bitsandbytes"):
        import bitsandbytes

    return bitsandbytes


@functools.cache
def cuda_problem() -> str | None:
    """Why bitsandbytes cannot multiply on CUDA here (no package, no CUDA backend, no native library for this
    CUDA), or None where it can."""
    try:
        bitsandbytes()
        import bitsandbytes.cextension as cext
    except Exception as e:  # ImportError, RuntimeError, OSError: a package or library that does not load
        return f"bitsandbytes does not import ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
    backend = getattr(cext, "BNB_BACKEND", "CUDA")
    mock = getattr(cext, "ErrorHandlerMockBNBNativeLibrary", None)
    missing = mock is not None and isinstance(getattr(cext, "lib", None), mock)
    if backend != "CUDA" or missing:
        return f"bitsandbytes has no CUDA backend here (backend {backend}{', no native library' if missing else ''})"
    return None


@functools.cache
def functional():
    """`bitsandbytes.functional` (`QuantState`, `dequantize_4bit`), imported quietly."""
    with silenced("bitsandbytes"):
        import bitsandbytes.functional as F

    return F


def quant_state(
    parts: dict[str, torch.Tensor], fields: dict | None = None, offset: torch.Tensor | None = None
):
    """bitsandbytes' `QuantState` from the stored parts, on their device, as `Linear4bit` builds it when loading.

    `fields` (from `nf4.state_fields`) and `offset` (the nested offset as a 0-d float32 tensor on the parts'
    device) can be given by a caller that keeps them, to avoid a device-to-host read of the JSON part on every call.
    """
    F = functional()
    fields = fields if fields is not None else nf4.state_fields(parts[nf4.QUANT_STATE])
    absmax = parts[nf4.ABSMAX]
    if offset is None:
        offset = torch.tensor(float(fields["nested_offset"]), device=absmax.device)
    nested = F.QuantState(
        absmax=parts[nf4.NESTED_ABSMAX],
        code=parts[nf4.NESTED_QUANT_MAP],
        blocksize=fields["nested_blocksize"],
        dtype=getattr(torch, fields["nested_dtype"]),
    )
    return F.QuantState(
        absmax=absmax,
        shape=torch.Size(fields["shape"]),
        code=parts[nf4.QUANT_MAP],
        blocksize=fields["blocksize"],
        quant_type=fields["quant_type"],
        dtype=getattr(torch, fields["dtype"]),
        offset=offset,
        state2=nested,
    )
