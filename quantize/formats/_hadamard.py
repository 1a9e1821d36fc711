"""ConvRot's rotation: the normalized regular Hadamard matrix of a group of 4, 16, 64 or 256 inputs, applied along
the last dim of a weight (offline) or of an activation (each call), as ComfyUI's ConvRot layouts do (int8 ConvRot,
W4A8, W4A4: comfy-kitchen's ``_build_hadamard`` / ``_rotate_weight``).

H_g = H4 ⊗ … ⊗ H4 / sqrt(g) (m = log4 g factors; H4 = the all-ones matrix less twice the anti-diagonal: symmetric,
so H_g is its own inverse). comfy-kitchen rotates a weight with a float32 matrix product, whose last bit depends
on how the BLAS blocks it (rows, threads); `rotate` computes the same product in float64 by a fixed sequence of
additions (m 4-point butterflies; every product w·(±1/sqrt g) is exact) and rounds once: the same bits on every
machine, for any row chunk. `rotate_activations` is the runtime's: a matrix product in x's dtype.

`group_for` is the one rule for a layer's group: the largest group that divides its input width, no larger than
the layout allows (256: what ComfyUI assumes when a marker gives none).

>>> group_for(5120), group_for(4304), group_for(100)
(256, 16, 4)
"""

from __future__ import annotations

import functools

import torch

__all__ = ["GROUPS", "DEFAULT_GROUP", "group_for", "rotate", "rotate_activations", "hadamard"]

#: the group sizes comfy-kitchen builds a regular Hadamard matrix for (powers of 4), largest first
GROUPS = (256, 64, 16, 4)
#: ComfyUI's default group (a marker without ``convrot_groupsize``)
DEFAULT_GROUP = 256
#: float64 values `rotate` works on at a time on the CPU (1 MiB: its passes stay in a core's cache)
_BLOCK = 1 << 17


def group_for(width: int, largest: int = DEFAULT_GROUP, multiple_of: int = 1) -> int | None:
    """The largest ConvRot group of `GROUPS` no larger than `largest` that divides `width`, where `width` is also a
    multiple of `multiple_of` (a layout's own constraint: W4A8 needs in % 16, W4A4 in % 64); None: none fits."""
    if width <= 0 or width % multiple_of:
        return None
    return next((g for g in GROUPS if g <= largest and width % g == 0), None)


def _stages(group: int) -> int:
    stages = {g: i for i, g in enumerate(reversed(GROUPS), start=1)}.get(group)
    if stages is None:
        raise ValueError(f"a ConvRot group is one of {', '.join(map(str, GROUPS))}; got {group}")
    return stages


def rotate(x: torch.Tensor, group: int = DEFAULT_GROUP) -> torch.Tensor:
    """x·H_g in groups of `group` along the last dim, computed in float64 and rounded once to x's dtype (see the
    module docstring). Each 4-point stage is y_e = ((x_0 + x_1) + x_2) + x_3 - 2·x_(3-e). ValueError if the last dim
    is not whole groups.

    >>> rotate(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), 4).tolist()
    [[0.5, 0.5, 0.5, -0.5]]
    """
    m = _stages(group)
    *lead, n = x.shape
    if n % group:
        raise ValueError(f"ConvRot rotates groups of {group}; the last dim is {n}")
    groups = x.reshape(-1, group)
    out = torch.empty(groups.shape, dtype=x.dtype, device=x.device)
    step = max(1, _BLOCK // group) if x.device.type == "cpu" else max(1, groups.shape[0])
    # a block of rows at a time, in cache: the same operations on each value as on the whole
    for g0 in range(0, groups.shape[0], step):
        y = groups[g0 : g0 + step].to(torch.float64, copy=True)  # (it becomes a stage's output)
        y = y.view(-1, *([4] * m))  # an input's index in base 4, high digit first
        spare = torch.empty_like(y)
        for axis in range(1, m + 1):
            x0, x1, x2, x3 = y.unbind(axis)
            total = (x0 + x1).add_(x2).add_(x3)
            for e, other in enumerate((x3, x2, x1, x0)):  # 2·x is exact: one rounding, as -2·x + total
                torch.sub(total, other, alpha=2.0, out=spare.select(axis, e))
            y, spare = spare, y
        out[g0 : g0 + step] = y.div_(float(2**m)).view(-1, group)
    return out.view(*lead, n)


def rotate_activations(x: torch.Tensor, group: int = DEFAULT_GROUP) -> torch.Tensor:
    """x·H_g in groups of `group` along the last dim, as ComfyUI rotates a ConvRot layer's input (comfy-kitchen's
    ``_rotate_activation``): a matrix product in x's dtype with the normalized matrix (exact in it), summed as the
    BLAS sums."""
    h = hadamard(group, x.device, x.dtype)
    return torch.matmul(x.reshape(-1, x.shape[-1] // group, group), h).reshape(x.shape)


@functools.cache
def hadamard(group: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """H_g (`rotate` of the identity), in `dtype` on `device`."""
    return rotate(torch.eye(group, dtype=torch.float64), group).to(device, dtype)
