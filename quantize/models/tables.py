"""A family's name tables: the renaming each role of names asks of it, and the names a forward pass runs under.

Functions of the family's declared parts (its `names.BlockNames`, `Detection`, `PlanPolicy`), not methods a family
could override: what a family changes is its data and its hooks (`family.HOOKS`, `Family.native_stacks` and
`Family.refuse_native` among them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import InputError
from .family import Family, FormatFacts
from .names import IDENTITY, NameTable, Renamer, Split, Stack, renamed

__all__ = ["name_table", "class_table", "gguf_table", "native_renamer", "runnable_stacks", "runnable_names"]


def name_table(family: Family, role: str, fmt: FormatFacts, where: str = "") -> NameTable:
    """The names format `fmt` writes `family`'s tensors under; `InputError` in one line naming the model (`where`),
    the family and the format when it has no file of that format (`Family.why_no`: refused here, at plan time) or
    no names of that role."""
    at = f"{where}: " if where else ""
    no_file = family.why_no(fmt)
    if no_file is not None:
        raise InputError(f"{at}{no_file}: convert it to another format (quantize recipes --for lists them)")
    if role == "source":
        return class_table(family) if family.class_prefixes else IDENTITY
    if role == "gguf" and family.plan.gguf_names is not None:
        return gguf_table(family)
    if role in ("native", "gguf") and family.names is not None:

        def refusing(make: Callable) -> Callable:
            def checked(names: Sequence[str], where: str):
                family.refuse_native(names, where, fmt.name)
                return make(names, where)

            return checked

        return NameTable(
            f"{family.name}_native",
            refusing(lambda names, where: native_renamer(family, names, where)),
            f"{family.title}'s original names",
            refusing(family.native_stacks),
        )
    raise InputError(
        f"{at}{fmt.name} writes a model's {role} names, and {family.title} has none in this tool yet: "
        f"convert {family.title} to another format (quantize recipes lists them)"
    )


def class_table(family: Family) -> NameTable:
    """The source's names as the family's class holds them (`Family.class_prefixes`): what its library's loader
    and its quantization config (the modules it converts or leaves) read. A release in the native names (ComfyUI's
    Gemma 3 file) is read as the stored names first (its table read the other way); what the family carries beside
    the model (a file's tokenizer) keeps its name."""

    def renamer(names: Sequence[str], where: str) -> Renamer:
        if not (family.detection.native_marks and family.naming(names) == "native"):
            return family.class_name
        lacking = f"has no name in {family.diffusers_class}: it is no part of {family.title}"
        stored = renamed([n for n in names if not family.carried(n)], family.diffusers_name, where, lacking)
        return lambda name: family.class_name(stored[name]) if name in stored else name

    return NameTable(f"{family.name}_class", renamer, f"the names {family.diffusers_class} holds")


def gguf_table(family: Family) -> NameTable:
    """llama.cpp's names (`PlanPolicy.gguf_names`), from the source's: each tensor renamed, or refused naming it."""
    table, arch = family.plan.gguf_names, family.plan.gguf_architecture
    lacking = (
        f"has no name among llama.cpp's {arch} tensors, which a {family.title} GGUF file holds: it is no part "
        f"of {family.title}"
    )

    def renamer(names: Sequence[str], where: str) -> Renamer:
        return renamed(names, table.native, where, lacking).__getitem__

    def splitter(names: Sequence[str], where: str) -> dict[str, Split]:
        return {out: split for n in names for out, split in (table.splits(n) or {}).items()}

    return NameTable(f"{family.name}_gguf", renamer, f"llama.cpp's {arch} names", splitter=splitter)


def native_renamer(family: Family, names: Sequence[str], where: str) -> Renamer:
    """Each tensor's native name, for a model of `family` in either naming (its marks say which); `InputError`
    naming a tensor with none, or a model of both namings."""
    detection = family.detection
    naming = detection.marks_naming(list(names))
    if naming == "mixed":
        mixed = next(n for n in names if n.startswith(detection.diffusers_marks))
        raise InputError(
            f"{where}: tensor {mixed!r} has a diffusers name among {family.title}'s native names: one naming per model"
        )
    if naming == "native":
        return lambda name: name
    if naming is None:
        raise InputError(
            f"{where}: the tensor names are neither {family.title}'s native names nor diffusers' "
            f"{family.diffusers_class} names: this format writes native {family.title} names"
        )
    lacking = (
        f"has no native {family.title} name (not a {family.diffusers_class} tensor diffusers maps from the "
        f"original {family.title} names): this format writes native {family.title} names"
    )
    stacked = {n for stack in family.native_stacks(names, where).values() for n, _, _ in stack}
    # what the release carries, joined from beside the model (`PlanPolicy.beside`), has its native name already
    carried = {n for n in names if family.carried(n)} if family.plan.beside is not None else set()
    table = renamed([n for n in names if n not in stacked | carried], family.native_name, where, lacking)
    return lambda name: name if name in carried else table[name]


# --- the names a forward pass runs under ---------------------------------------------------------------------


def runnable_stacks(family: Family, names: Sequence[str]) -> dict[str, Stack]:
    """Each native tensor of `names` that stacks several of the family's class's (a fused projection) -> its
    `Stack`: what a forward pass cuts it into."""
    if family.names is None:
        return {}
    return {n: stack for n in names if (stack := family.names.native_stack(n)) is not None}


def runnable_names(family: Family, names: Sequence[str], where: Path) -> dict[str, str]:
    """Native tensor name -> the family's class's parameter name, or `InputError` naming one it lacks; the stacked
    ones are left out (`runnable_stacks` says what they are cut into), and so are the carried ones (no part of the
    class). A family whose release has diffusers' names (no native marks) maps each to itself through its table."""
    runs = [n for n in names if not family.carried(n)]
    wanted = "native" if family.detection.native_marks else "diffusers"
    if family.naming(runs) != wanted:
        raise InputError(
            f"{where}: config.json names {'/'.join(family.native_classes) or 'no class'} but the tensors do not "
            f"have {family.title}'s original names: a forward pass cannot run it"
        )
    lacking = (
        f"has no counterpart in diffusers' {family.diffusers_class} (a {family.title} variant it does not "
        "implement): this model cannot be run for a forward pass"
    )
    if family.detection.library is None:  # a variant only ComfyUI runs
        lacking = (
            f"has no counterpart in diffusers, which has no {family.title} class (ComfyUI's "
            f"{family.diffusers_class} runs it): this model cannot be run for a forward pass"
        )
    stacked = runnable_stacks(family, runs)  # cut into the class's tensors instead
    return renamed([n for n in runs if n not in stacked], family.diffusers_name, where, lacking)
