"""The checkpoint's name of each of the model's tensors (`_Names`): the model's own, or through its family's table.

A native checkpoint (ComfyUI's, GGUF's, an original release) goes into the diffusers class through the family's one
name table read the other way, stacked tensors (a fused q/k/v) and cut ones (GGUF's split tensors) included; tied
parameters (one tensor under two names) are found here so the match takes each once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from torch import nn

from quantize.models import BlockNames, Family, Split, Stack
from quantize.read.checkpoint import Component
from quantize.run.names import class_names

from .errors import CheckpointMismatchError


@dataclass(frozen=True)
class _Names:
    """The checkpoint's name of each of the model's tensors: the same, or through the family's name table."""

    rename: Callable[[str], str | None]  # model tensor name -> checkpoint name (None: it has none)
    why: str  # what the renaming is, for messages ("" when the names are the model's)
    #: model tensor name -> the checkpoint tensor stacking it (None: not stacked), and that one's `Stack`
    stacked_into: Callable[[str], str | None] = lambda key: None
    stack_of: Callable[[str], Stack | None] = lambda key: None
    #: model tensor name -> the checkpoint tensors it was cut into, each with its `Split` (None: not cut)
    cut_into: Callable[[str], dict[str, Split] | None] = lambda key: None

    def key(self, model_key: str, comp: Component) -> str:
        key = self.rename(model_key)
        if key is None:
            raise CheckpointMismatchError(
                f"{comp.dir}: the model's {model_key!r} has no name in {self.why}: the model does not fit the checkpoint"
            )
        return key

    def module(self, name: str, comp: Component) -> str:
        """The checkpoint's name of the Linear `name` (its weight's name, less ``.weight``)."""
        return self.key(f"{name}.weight", comp)[: -len(".weight")]


_SAME = _Names(lambda key: key, "")


def _checkpoint_names(model: nn.Module, comp: Component, family: Family | None) -> _Names:
    """How the model's tensor names become the checkpoint's: the family's names of the class's parameters first
    (`Family.parameter_names` read backwards: Gemma 3's class holds the stored ``language_model.model.`` as
    ``model.language_model.``), then `_stored_names`."""
    if family is None:
        return _stored_names(model.state_dict(), comp, family)
    to_family = _family_names(model, comp, family)
    names = _stored_names([to_family.get(k, k) for k in model.state_dict()], comp, family)
    if all(k == v for k, v in to_family.items()):
        return names
    return _Names(
        lambda key: names.rename(to_family.get(key, key)),
        names.why or f"the names {family.title}'s checkpoints store",
        lambda key: names.stacked_into(to_family.get(key, key)),
        names.stack_of,
        lambda key: names.cut_into(to_family.get(key, key)),
    )


def _family_names(model: nn.Module, comp: Component, family: Family) -> dict[str, str]:
    """The model's tensor name -> the family's name of it, for each the checkpoint may hold: its stored names,
    read as the family's (through the GGUF or native table where they are those), and the weights a quantized
    Linear's parts hang from (`<module>.weight_scale`: `<module>.weight`)."""
    tables = [t for t in (family.plan.gguf_names, family.names) if t is not None]
    stored = list(comp.tensors)
    candidates = {*stored, *(f"{n.rpartition('.')[0]}.weight" for n in stored if "." in n)}
    candidates |= {d for t in tables for n in list(candidates) if (d := _family_name(t, n)) is not None}
    own = set(model.state_dict())
    return {param: name for name, param in family.parameter_names(sorted(candidates)).items() if param in own}


def _family_name(table: BlockNames, stored: str) -> str | None:
    """The family's name of a stored tensor: through `table`, or the one it was cut from (`BlockNames.cut_from`)."""
    cut = table.cut_from(stored)
    return table.diffusers(stored) if cut is None else cut[0]


def _stored_names(own_names: Iterable[str], comp: Component, family: Family | None) -> _Names:
    """How the class's tensor names (`own_names`, the family's names of them) become the checkpoint's: unchanged
    when both follow one naming, else through the family's name table (a diffusers model from a native
    checkpoint: ComfyUI's, GGUF's; or the reverse)."""
    gguf = None if family is None else family.plan.gguf_names
    if gguf is not None and all(_family_name(gguf, n) is not None for n in comp.tensors):
        arch = family.plan.gguf_architecture
        why = f"llama.cpp's {arch} names, which the checkpoint (a GGUF file) has"
        return _Names(gguf.native, why, cut_into=gguf.splits)
    if family is None or family.names is None:
        return _SAME
    stored = family.naming(comp.tensors)
    own = family.naming(own_names)
    if stored == own or stored not in ("native", "diffusers") or own not in ("native", "diffusers"):
        return _SAME
    if stored == "native":
        return _native_names(family, list(comp.tensors))
    return _Names(
        family.diffusers_name, f"diffusers' {family.diffusers_class} names, which the checkpoint has"
    )


def _native_names(family: Family, stored: list[str]) -> _Names:
    """A native checkpoint's names read through the map a forward pass reads them through (`class_names`): the
    class's tensor -> the checkpoint's tensor that is it, or the stacked one it is rows of. A release may hold apart
    what the native table stacks (a fused projection's parts, each under its own name); a model tensor the
    checkpoint lacks keeps the table's name, for the message."""
    stored = [n for n in stored if not family.carried(n)]  # no part of the class (`_load_one`)
    # a quantized weight is stored as parts hanging from its module (`<module>.<part>`: no `<module>.weight`)
    weights = {f"{'.'.join(p[:i])}.weight" for n in stored if (p := n.split(".")) for i in range(1, len(p))}
    native = class_names(family, [*weights, *stored])

    def stacked_into(key: str) -> str | None:
        return native.stacked.get(key) or (None if key in native.stored else family.names.stacked_into(key))

    return _Names(
        lambda key: native.stored.get(key) or family.native_name(key),
        f"{family.title}'s native names, which the checkpoint has",
        stacked_into,
        lambda key: native.stacks.get(key) or family.names.native_stack(key),
    )


def _tied(model: nn.Module) -> dict[str, str]:
    """Each parameter that is another's (tied: one tensor under two names, as transformers ties an output head to
    its token embedding) -> the name it has first: the checkpoint stores it once, under that name."""
    first: dict[int, str] = {}
    tied = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def _retie(model: nn.Module, tied: Mapping[str, str]) -> None:
    """Tie again what `_tied` found: each loaded parameter's other names given the loaded tensor."""
    for name, source in tied.items():
        owner, _, attr = name.rpartition(".")
        src_owner, _, src_attr = source.rpartition(".")
        model.get_submodule(owner)._parameters[attr] = model.get_submodule(src_owner)._parameters[src_attr]
