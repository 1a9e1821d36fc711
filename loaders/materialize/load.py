"""`load_quantized`, the entry: each model folder of a checkpoint through the skeleton, the names, the match and
the data, in that order (`_load_one`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from quantize.models import component_family
from quantize.read.checkpoint import Component

from ..host import TensorReader
from ..modules import COMPUTE
from .data import _finish, _groups, _materialize, _source_dtype
from .discovery import _runnable_format, find_component, find_components, open_model_files
from .match import _match
from .names import _checkpoint_names, _retie, _tied
from .skeleton import _check_names_of_no_family, _skeleton


def load_quantized(
    model: type[nn.Module] | nn.Module,
    checkpoint: str | Path,
    host: str = "mmap",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    compute: str = "fast",
) -> nn.Module | dict[str, nn.Module]:
    """Build (or fill) `model` from a checkpoint written by `quantize convert`, ready for inference.

    model: a model class (built from the checkpoint's config.json, e.g. `WanTransformer3DModel`) or an
        `nn.Module` whose parameter names match the checkpoint's, or its family's other naming (filled in place).
    checkpoint: the component directory (``ckpt/transformer``, ``ckpt/high_noise_model``), or a checkpoint
        holding one model; with a class, a checkpoint holding several (``ckpt/`` of Wan2.2 A14B) loads each,
        returned as ``{folder name: model}`` in folder order.
    host: ``"mmap"`` (default: views of the files, paged in on use), ``"pageable"`` or ``"pinned"``.
    device: where the tensors go; None keeps them on the host as `host` says.
    dtype: cast the kept (unquantized) floating tensors to this dtype, except those of the model's
        ``_keep_in_fp32_modules`` (float32), as diffusers does; None keeps the stored dtypes (a GGUF file's
        F32 norms and biases come back in its kept Linears' dtype, the source's, as diffusers would hold
        them). Quantized parts always keep theirs.
    compute: ``"fast"`` (each scheme's kernel where the device has it and it beats decoding there: on the CPU
        int8's, not float8's emulated one), ``"kernel"`` (the kernel wherever it runs at all) or
        ``"dequantize"`` (every quantized layer decodes its weight to the input's dtype for the call: the eager
        reference, what `quantize verify --forward` computes).
    """
    if compute not in COMPUTE:
        raise ValueError(f"compute must be one of {COMPUTE}, got {compute!r}")
    device = torch.device(device) if device is not None else None
    TensorReader(host, device)  # checks `host` before anything is read
    folders = find_components(Path(checkpoint))
    if len(folders) > 1:
        if not isinstance(model, type):
            find_component(Path(checkpoint))  # the error: one module cannot take several models
        comps = [open_model_files(f) for f in folders]
        for comp in comps:  # every header and format checked before any model is built
            _runnable_format(comp)
        return {
            f.name: _load_one(model, comp, host, device, dtype, compute)
            for f, comp in zip(folders, comps, strict=True)
        }
    return _load_one(model, open_model_files(folders[0]), host, device, dtype, compute)


def _load_one(
    model: type[nn.Module] | nn.Module,
    comp: Component,
    host: str,
    device: torch.device | None,
    dtype: torch.dtype | None,
    compute: str,
) -> nn.Module:
    reader = TensorReader(host, device)
    fmt = _runnable_format(comp)
    family = component_family(comp)
    if isinstance(model, type):
        model = _skeleton(model, comp, family)
    elif not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module class or instance, got {type(model).__name__}")
    if family is None:
        _check_names_of_no_family(model, comp)
    names = _checkpoint_names(model, comp, family)
    if family is not None:  # a release's other parts (its VAE), buffers the class computes: not the model's
        comp = replace(comp, tensors={k: t for k, t in comp.tensors.items() if not family.carried(k)})
    tied = _tied(model)
    plan = _match(model, comp, fmt, names, tied)
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype is None:
        dtype = _source_dtype(plan, fmt)
    for group in _groups(model, plan):
        _materialize(model, group, reader, dtype, keep_fp32, compute)
    _retie(model, tied)
    _finish(model, device)
    return model
