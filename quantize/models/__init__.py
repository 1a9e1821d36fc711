"""The model families, one module each, registered here and nowhere else.

A component's family is found by what its config.json names (`Family.diffusers_class`,
`Family.native_classes`), else by its tensor names (`Family.naming`), as llama.cpp's converter finds a
model's class by its config: `family_of`. A format asks for a *role* of names (``source``, ``native``) and
the family answers with its table (`names_for`), or refuses in one line naming both.

>>> family_of("WanModel", []).name, family_of(None, ["visual_transformer_blocks.0.x.weight"]).name
('wan', 'kandinsky5')
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..errors import InputError
from ..read.files import config_class
from .clip_text import CLIP_TEXT
from .clip_vision import CLIP_VISION
from .family import HOOKS, Family, FormatFacts, ModelInputs, SourceLayout
from .gemma3 import GEMMA3
from .gemma3_text import GEMMA3_TEXT
from .gemma4 import GEMMA4
from .gemma4_text import GEMMA4_TEXT
from .hunyuanvideo15 import HUNYUANVIDEO15
from .kandinsky5 import KANDINSKY5
from .kandinsky6 import KANDINSKY6
from .ltx2 import LTX2
from .minimax_h3 import MINIMAX_H3
from .names import (
    IDENTITY,
    ROLES,
    BlockNames,
    Blocks,
    Cut,
    NameTable,
    Rows,
    Split,
    Stack,
    same_but_size_one_dims,
    stack_rows,
)
from .policy import FormatTargets, Policy, Refused
from .qwen3vl import QWEN3VL
from .qwen3vl_text import QWEN3VL_TEXT
from .qwen25vl import QWEN25VL
from .qwen25vl_text import QWEN25VL_TEXT
from .qwen_image import QWEN_IMAGE, QWEN_IMAGE_21
from .skyreels_v2 import SKYREELS_V2
from .t5 import T5
from .tables import name_table, runnable_names, runnable_stacks
from .umt5 import UMT5
from .wan import WAN
from .wan_animate import WAN_ANIMATE
from .wan_animate2 import WAN_ANIMATE2
from .wan_vace import WAN_VACE
from .wan_variants import WAN_CAMERA, WAN_DANCER, WAN_HUMO, WAN_S2V, WAN_SCAIL

if TYPE_CHECKING:
    from ..read.checkpoint import Component

__all__ = [
    "FAMILIES",
    "DEFAULT_FAMILY",
    "ROLES",
    "IDENTITY",
    "Family",
    "FormatFacts",
    "HOOKS",
    "runnable_names",
    "runnable_stacks",
    "NameTable",
    "Rows",
    "Stack",
    "Split",
    "Cut",
    "stack_rows",
    "same_but_size_one_dims",
    "BlockNames",
    "Blocks",
    "SourceLayout",
    "Policy",
    "FormatTargets",
    "Refused",
    "ModelInputs",
    "get_family",
    "family_of",
    "component_family",
    "family_of_class",
    "names_for",
    "own_names",
    "lora_prefixes",
    "lora_renamings",
    "modulation_names",
    "diffusers_classes",
    "registered_classes",
]

#: every family the tool knows, in the order detection asks them
FAMILIES: tuple[Family, ...] = (
    WAN_VACE,
    SKYREELS_V2,
    WAN_ANIMATE2,
    WAN_ANIMATE,
    WAN_S2V,
    WAN_HUMO,
    WAN_CAMERA,
    WAN_SCAIL,
    WAN_DANCER,
    WAN,
    KANDINSKY6,
    KANDINSKY5,
    LTX2,
    HUNYUANVIDEO15,
    MINIMAX_H3,
    QWEN_IMAGE,
    QWEN_IMAGE_21,
    UMT5,
    T5,
    GEMMA3,
    GEMMA3_TEXT,
    GEMMA4,
    GEMMA4_TEXT,
    QWEN25VL,
    QWEN25VL_TEXT,
    QWEN3VL,
    QWEN3VL_TEXT,
    CLIP_TEXT,
    CLIP_VISION,
)
#: the family `quantize example` (and `examples.write_example`) makes when none is named
DEFAULT_FAMILY: str = WAN.name


def get_family(name: str) -> Family:
    """The family registered as `name`; the error lists the known ones."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise InputError(f"unknown model family {name!r} (known: {', '.join(f.name for f in FAMILIES)})")


def family_of_class(config_class: str | None) -> Family | None:
    """The family whose diffusers class or original release's config class is `config_class`, or None."""
    return next((f for f in FAMILIES if config_class is not None and f.owns(config_class, ())), None)


def family_of(config_class: str | None, names: Iterable[str]) -> Family | None:
    """The family of a model whose config names `config_class` and whose tensors are `names`: by the class
    where the config names one (None where no family is registered by it: a class of no family is no family's,
    whatever marks its names share), else by the names' marks; None when no family knows it."""
    names = list(names)
    if config_class is not None:
        # by the class, each family seeing the names too (a variant's release may name its base's class)
        return next((f for f in FAMILIES if f.owns(config_class, names)), None)
    return next((f for f in FAMILIES if f.naming(names) is not None), None)


def component_family(comp: Component) -> Family | None:
    """The family of an opened component: by the class its config.json names (`read.files.config_class`: diffusers'
    ``_class_name`` or transformers' ``architectures``), else by its tensor names."""
    return family_of(config_class(comp.config), comp.tensors)


def own_names(names: Iterable[str], where: str) -> dict[str, str] | None:
    """Each of `names` -> its family's own name, where they follow another naming a family's releases store
    (`Family.aliases`: Wan's T5 names in its umT5 ``.pth``), else None."""
    names = list(names)
    return next((m for f in FAMILIES if (m := f.own_names(names, where)) is not None), None)


def names_for(role: str, family: Family | None, fmt: FormatFacts, where: str) -> NameTable:
    """The name table format `fmt` (which asks for `role`) writes a model of `family` under; `InputError` when
    the model is of no known family and the role needs one, or the family has no names of that role or no file
    of that format (`Family.why_no`: a Wan variant only ComfyUI runs has no torchao file)."""
    if role not in ROLES:
        raise InputError(f"{fmt.name}: unknown role of names {role!r} (roles: {', '.join(ROLES)})")
    if role == "source" and family is None:
        return IDENTITY
    if family is None:
        known = ", ".join(f.title for f in FAMILIES if f.names is not None)
        raise InputError(
            f"{where}: the tensor names are of no model family this tool knows ({known}): {fmt.name} writes a "
            f"family's {role} names, so it takes only one of those"
        )
    return name_table(family, role, fmt, where)


def lora_prefixes() -> tuple[str, ...]:
    """Every prefix a family's LoRA keys carry in the wild, longest first (each stripped, in any order)."""
    prefixes = {p for f in FAMILIES for p in f.lora.prefixes}
    return tuple(sorted(prefixes, key=lambda p: (-len(p), p)))


def lora_renamings() -> Iterator[tuple[str, object]]:
    """(what it is, rename) for every way a LoRA's names may relate to a model's besides being the same: each
    family's diffusers names -> its native ones, and the reverse."""
    for f in FAMILIES:
        if f.names is not None:
            yield f"diffusers names -> {f.title}'s native names", f.native_name
            yield f"{f.title}'s native names -> diffusers names", f.diffusers_name


def modulation_names() -> tuple[str, ...]:
    """The names a block's modulation table has in any family and naming (what a LoRA's ``diff_m`` adds to)."""
    return tuple(dict.fromkeys(n for f in FAMILIES for n in f.lora.modulation))


def registered_classes() -> frozenset[str]:
    """Every config class a family is registered by (its diffusers class, its release's classes)."""
    return frozenset(c for f in FAMILIES for c in (f.diffusers_class, *f.native_classes))


def diffusers_classes() -> frozenset[str]:
    """The diffusers classes of every family (an output of them is laid out as diffusers models)."""
    return frozenset(f.diffusers_class for f in FAMILIES)
