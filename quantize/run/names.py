"""A native-named model's tensors by the names of its family's diffusers class: the one map through which a forward
pass (`forward.runnable`) and the loader (`loaders.materialize`) read a checkpoint in the family's native names.

Each stored tensor is one of: carried (no part of the class: `Family.carried`), left out; a stack of several of the
class's tensors (a fused projection: `models.runnable_stacks`, cut by `models.stack_rows`); one of the class's
tensors under its other name (`Family.diffusers_name`); or none of the class's (a variant's layer the class does not
implement), left out too: the family refuses it for a forward pass (`models.runnable_names`), the loader as a tensor
that fits nothing. It imports nothing of `quantize` but the families, so that the loader takes it without the
converter.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..models import Family, Stack, runnable_stacks

__all__ = ["ClassNames", "class_names"]


@dataclass(frozen=True)
class ClassNames:
    """A native model's stored tensors and the class's, both ways (module docstring)."""

    #: stored tensor -> the class's tensor it is
    renamed: dict[str, str]
    #: the class's tensor -> the stored tensor that is it (`renamed` read the other way)
    stored: dict[str, str]
    #: stored tensor -> the class's tensors it stacks, by rows (`Stack`)
    stacks: dict[str, Stack]
    #: the class's tensor -> the stored tensor it is rows of
    stacked: dict[str, str]


def class_names(family: Family, stored: Iterable[str]) -> ClassNames:
    """How `family`'s diffusers class finds its tensors among `stored`, a native model's tensor names: each
    renamed through the family's table both ways, a tensor the class lacks left out (tests/run/test_class_names.py
    shows it on a family)."""
    runs = [n for n in stored if not family.carried(n)]
    stacks = runnable_stacks(family, runs)
    renamed = {n: own for n in runs if n not in stacks and (own := family.diffusers_name(n)) is not None}
    return ClassNames(
        renamed,
        {own: name for name, own in renamed.items()},
        stacks,
        {part: name for name, stack in stacks.items() for part, _, _ in stack},
    )
