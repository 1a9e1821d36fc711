"""A loaded model on several devices: torch's FSDP2 and diffusers' context parallelism do the work, this module
makes them run on every machine and every family we load and says what each rank holds.

>>> # torchrun --nproc-per-node 2 run.py, in run.py:
>>> # torch.distributed.init_process_group("nccl")  # "gloo" on the CPU
>>> # model = load_quantized(WanTransformer3DModel, "Wan2.1-T2V-14B-fp8/transformer")
>>> # for _, block in find_blocks(model): fully_shard(block)   # FSDP2: 1/N of every block's bytes a rank
>>> # fully_shard(model)
>>> # enable_context_parallel(model, ContextParallelConfig(ulysses_degree=2))

FSDP2 needs nothing of ours: a quantized layer's parts are frozen parameters of their bytes (loaders/README.md),
which `fully_shard` shards and gathers like any other, from the torch that shards non-floating parameters
(`fsdp_problem` says where it cannot); `held_bytes` is what a rank holds.

Nothing here computes: diffusers' hooks split the sequence at the family's plan (its class's ``_cp_plan``, or the
one the family declares where the class has none, `Family.cp_plan`: HunyuanVideo 1.5), its attention dispatch
exchanges the heads (Ulysses all-to-all), and our quantized Linears run on whatever tokens a rank holds. A Linear
works on each token alone, so for every format whose activations are quantized per token (or not at all) the
output under context parallelism is the single-process output exactly (tested on two CPU ranks, every format,
compute "fast", "dequantize" and "kernel", with block offload before or after).

The one exception, and its bound: comfy_fp8 with ``compute="kernel"`` and no calibrated input scale quantizes a
call's activations with one dynamic per-tensor scale, amax|x| / 448 over the tokens *the call holds*: under context
parallelism that is the rank's tokens, not the whole sequence's, so the output is another, equally valid,
quantization of the same activations, not the single-process one (on the tests' tiny Wan: max |diff| 0.02 in bf16).
The bound the tests hold it to: its relative L2 error against the eager reference (``compute="dequantize"``: the
same weights, the activations unquantized) is at most 1.25 times the single-process kernel output's own (measured:
0.0084 against 0.0086; a rank's scale is never coarser than the global one), so that it differs from the
single-process output by no more than the two errors together. A checkpoint written with ``quantize convert
--calibrate`` stores each layer's ``input_scale``, which replaces the dynamic scale: then the output is exact again.

HunyuanVideo 1.5 (`Family.cp_plan`: its first block's image and text tokens split, the text mask at every block, the
rotary tables as RoPE returns them, the output projection gathered): diffusers 0.42.x's attention processor for it
builds a [B, 1, S, S] query-and-key mask from the tokens a rank holds, and Ulysses gathers a mask along the keys only
(SDPA would see [B, 1, S/2, S] against S queries: a size mismatch). Its family says so (`Family.cp_masks_on_keys`),
and under context parallelism the mask goes on as its keys' ([B, 1, 1, S], `_masks_on_keys`; one process is left
as it is): the single-process output to float32 rounding (2 ulps), since each rank holds a share of both streams and
the joint attention sums its keys in another order. The tests pin both, diffusers' own failure included.

The CPU workaround, written once (`accelerator_count_at_least_one`): diffusers 0.42.x's
``ModelMixin._resolve_parallel_config`` picks the rank's device as ``rank % torch.accelerator.device_count()``,
which is 0 on a machine without an accelerator (ZeroDivisionError, even with a mesh given); diffusers'
`enable_parallelism` as first written counted through ``torch.get_device_module(device_type).device_count()``, 1 for the CPU. While `enable_parallelism`
runs, ``torch.accelerator.device_count`` answers at least 1; nothing is patched where an accelerator is present or
where the installed diffusers has no such division. Tested with diffusers 0.42.x (the range the project pins).

Ring attention is not run here: diffusers' ``native`` attention backend returns no log-sum-exp, and the backends
that do need CUDA kernels; Ulysses (``ulysses_degree``) runs everywhere.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from diffusers import ContextParallelConfig

__all__ = [
    "enable_context_parallel",
    "accelerator_count_at_least_one",
    "needs_device_count_workaround",
    "fsdp_problem",
    "held_bytes",
]

#: what diffusers 0.42.x's `_resolve_parallel_config` divides by (the source text the workaround looks for)
_DIVISION = "% torch.accelerator.device_count()"


def needs_device_count_workaround() -> bool:
    """Whether `enable_parallelism` would divide by zero here: no accelerator, and the installed diffusers picks
    the rank's device by ``rank % torch.accelerator.device_count()`` (0.42.x)."""
    if torch.accelerator.device_count() > 0:
        return False
    from diffusers.models.modeling_utils import ModelMixin

    resolve = getattr(ModelMixin, "_resolve_parallel_config", None)
    if resolve is None:
        return False
    try:
        return _DIVISION in inspect.getsource(resolve)
    except (OSError, TypeError):
        return True  # no source installed (a frozen build): assume the division; patching is harmless


@contextlib.contextmanager
def accelerator_count_at_least_one() -> Iterator[None]:
    """``torch.accelerator.device_count()`` answers max(1, n) inside the block, where diffusers needs it
    (`needs_device_count_workaround`); elsewhere a no-op. Restored on the way out, error or not."""
    if not needs_device_count_workaround():
        yield
        return
    count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: max(1, count())
    try:
        yield
    finally:
        torch.accelerator.device_count = count


def enable_context_parallel(model: torch.nn.Module, config: ContextParallelConfig, **kwargs: object) -> None:
    """Turn on diffusers' context parallelism over `model` (``model.enable_parallelism(config=config, ...)``),
    torch.distributed initialized: the class's own ``_cp_plan``, else its family's (`Family.cp_plan`), else
    `ValueError` naming the class. `kwargs` go to `enable_parallelism` (an explicit ``cp_plan=`` wins)."""
    from quantize.models import family_of_class

    family = family_of_class(type(model).__name__)
    if "cp_plan" not in kwargs and getattr(model, "_cp_plan", None) is None:
        kwargs["cp_plan"] = _family_plan(model, family)
    if family is not None and family.cp_masks_on_keys():
        _masks_on_keys(type(model))
    with accelerator_count_at_least_one():
        model.enable_parallelism(config=config, **kwargs)


def _masks_on_keys(cls: type) -> None:
    """Under context parallelism, hand the attention of `cls`'s module a query-and-key mask ([B, 1, S, S], a query
    sees a key where both are valid) as its keys' mask ([B, 1, 1, S]: any valid query's row), which Ulysses gathers
    whole; a call without a parallel config (one process) is left as it is. Wraps the module's
    ``dispatch_attention_fn`` once (`Family.cp_masks_on_keys`)."""
    import sys

    module = sys.modules[cls.__module__]
    dispatch = getattr(module, "dispatch_attention_fn", None)
    if dispatch is None:
        raise ValueError(
            f"{cls.__name__}'s module calls no dispatch_attention_fn: its masks cannot go on as keys'"
        )
    if getattr(dispatch, "masks_on_keys", False):
        return

    def on_keys(*args, attn_mask=None, parallel_config=None, **kwargs):
        if (
            parallel_config is not None
            and attn_mask is not None
            and attn_mask.ndim == 4
            and attn_mask.shape[-2] > 1
        ):
            attn_mask = attn_mask.any(dim=-2, keepdim=True)
        return dispatch(*args, attn_mask=attn_mask, parallel_config=parallel_config, **kwargs)

    on_keys.masks_on_keys = True
    module.dispatch_attention_fn = on_keys


def _family_plan(model: torch.nn.Module, family) -> dict:
    """The context-parallel plan `model`'s family declares for its class, or `ValueError` naming the class."""
    name = type(model).__name__
    plan = None if family is None else family.cp_plan(dict(model.config))
    if plan is None:
        raise ValueError(
            f"{name} has no context-parallel plan: neither diffusers (its _cp_plan) nor its family declares one; "
            f"pass enable_context_parallel(model, config, cp_plan=...) (diffusers' ContextParallelInput/Output)"
        )
    return plan


def fsdp_problem() -> str | None:
    """Why torch's FSDP2 (`fully_shard`) cannot shard a loaded model here, or None where it can.

    A quantized layer's parts are parameters of their bytes (uint8), and FSDP2 shards non-floating parameters from
    the change that made it support them (pytorch#177948, March 2026: torch 2.12 on; tested with 2.13). Before it,
    `fully_shard` fails on any such parameter ("only Tensors of floating point dtype can require gradients"); the
    same change keeps a `MixedPrecisionPolicy`'s cast off them. Read off that change's own code, so a build that
    carries it counts whatever its version says."""
    if not torch.distributed.is_available():
        return f"torch {torch.__version__} is built without torch.distributed"
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    try:
        supported = "is_floating_point" in inspect.getsource(FSDPParam.init_dtype_attrs)
    except (OSError, TypeError):  # no source installed: the version says
        supported = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 12)
    if supported:
        return None
    return (
        f"torch {torch.__version__}'s FSDP2 cannot shard non-floating parameters, which hold our quantized parts: "
        "use torch 2.12 or later (pytorch#177948)"
    )


def held_bytes(modules) -> tuple[int, int]:
    """(bytes this rank holds, bytes of the whole) of the parameters and buffers of `modules` (each counted once):
    a parameter FSDP2 sharded counts its local shard, so the first over the second is the rank's share."""
    from torch.distributed.tensor import DTensor

    held = whole = 0
    seen: set[int] = set()
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            if id(t) in seen:
                continue
            seen.add(id(t))
            local = t.to_local() if isinstance(t, DTensor) else t
            held += local.numel() * local.element_size()
            whole += t.numel() * t.element_size()
    return held, whole
