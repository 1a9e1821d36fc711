"""What a source folder holds, and the bundled recipe each format defaults to for it (`convert --format`).

A *layout* is a model family in one folder arrangement and naming, told from config.json and safetensors
headers alone: each family says which of its layouts a folder matches (`models.Family.layouts`), and names
one bundled recipe per layout and format (`recipes.default_recipes`, derived from `Family.policies`); variants (``wan-fp8-all``, the other
GGUF types) are chosen by name with ``--recipe``. `recipe_for_format` picks it, or explains in one line
why there is none (listing what there is).

>>> DEFAULT_RECIPES["wan2.2-a14b"]["fp8_channel"]
'wan2.2-a14b-fp8'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError
from ..formats import FORMAT_INFO
from ..models import FAMILIES, SourceLayout, get_family, registered_classes
from ..recipes import default_recipes, layout_formats
from .checkpoint import Component, open_component
from .files import component_class
from .source import under_own_names

__all__ = [
    "SourceLayout",
    "DEFAULT_RECIPES",
    "detect_layouts",
    "check_format",
    "recipe_for_format",
    "encoder_recipes",
    "unknown_class",
]

#: layout -> format -> the bundled recipe `--format` takes (`recipes.default_recipes`)
DEFAULT_RECIPES: dict[str, dict[str, str]] = default_recipes()


def _open(folder: Path, rel: str, unreadable: list[InputError]) -> Component | None:
    """The component, or None where `rel` holds no readable one (no folder, no safetensors, loose files that
    form no model: detection looks, and the conversion reports what is wrong with the folder it converts); what
    made a folder with files unreadable (a truncated file, a bad header) is added to `unreadable`."""
    where = folder if rel == "." else folder / rel
    if not where.is_dir():
        return None
    try:
        return under_own_names(open_component(folder, rel))
    except InputError as e:
        if any(where.glob("*.safetensors")):  # files of a model that cannot be read, not a folder of no model
            unreadable.append(e)
        return None


def detect_layouts(folder: Path, unreadable: list[InputError] | None = None) -> list[SourceLayout]:
    """Every layout `folder` matches, asking each family (usually one; none for a folder of another kind; more
    than one for a folder that holds two kinds of model). `unreadable`, when given, gets why each component
    folder that holds files could not be read."""
    folder = Path(folder)
    if folder.is_file():  # one checkpoint file: its one model, at the root
        return _file_layouts(folder, unreadable)
    if not folder.is_dir():
        raise InputError(f"{folder}: source directory not found")
    opened: dict[str, Component | None] = {}
    problems = [] if unreadable is None else unreadable

    def open_(rel: str) -> Component | None:
        if rel not in opened:
            opened[rel] = _open(folder, rel, problems)
        return opened[rel]

    registered = registered_classes()
    return [layout for family in FAMILIES for layout in family.layouts(folder, open_, registered)]


def _file_layouts(path: Path, unreadable: list[InputError] | None) -> list[SourceLayout]:
    """The layouts of one checkpoint file given as SOURCE: those of its model at the root (no config.json is
    its own, and nothing beside it is part of it)."""
    try:
        comp = under_own_names(open_component(path.parent, ".", path.name))
    except InputError as e:
        if unreadable is None:
            raise
        unreadable.append(e)
        return []
    opened = {".": comp}
    registered = registered_classes()
    return [lay for family in FAMILIES for lay in family.layouts(path.parent, opened.get, registered)]


def _layout_words(layouts: Sequence[SourceLayout]) -> str:
    return "; ".join(f"{lay.name} ({lay.why})" for lay in layouts)


def unknown_class(folder: Path) -> str:
    """`` (its config.json names X, which no family is)`` when the folder's own or a component's config names a
    class no family is registered by (an encoder this tool does not know), else ``""``."""
    for rel in (".", "transformer", "text_encoder", "text_encoder_2"):
        cls = component_class(folder / rel)
        if cls is not None and cls not in registered_classes():
            return f" (its {rel + '/' if rel != '.' else ''}config.json names {cls}, which no family is)"
    return ""


def check_format(fmt: str) -> None:
    """`fmt` is a format's name, or one line listing them."""
    if fmt not in FORMAT_INFO:
        raise InputError(
            f"`fmt` {fmt!r} is not a format (formats: {', '.join(sorted(FORMAT_INFO))})", parameters=("fmt",)
        )


def recipe_for_format(folder: Path, fmt: str) -> tuple[str, SourceLayout]:
    """The bundled recipe `--format fmt` takes for `folder`, and the layout that decided it.

    Raises `InputError` in one line: an unknown format, a folder of no known layout or of several, or no
    bundled recipe of that format for the layout (listing the recipes there are for it)."""
    check_format(fmt)
    unreadable: list[InputError] = []
    layouts = detect_layouts(folder, unreadable)
    if not layouts and unreadable:  # a truncated file, say: that is the fault, not the layout
        raise unreadable[0]
    if not layouts:
        known = ", ".join(f.title for f in FAMILIES)
        named = unknown_class(folder)
        raise InputError(
            f"{folder}: no known layout (of {known}: original names at the root or in expert folders, a diffusers "
            "transformer/, a transformers text_encoder/, or such a folder itself)"
            f"{named}: pick a recipe with `recipe` (quantize recipes lists them)",
            parameters=("recipe",),
        )
    candidates = [(DEFAULT_RECIPES[lay.name].get(fmt), lay) for lay in layouts]
    chosen = [(r, lay) for r, lay in candidates if r is not None]
    if chosen and all(lay.encoder for _, lay in chosen) and not all(lay.encoder for lay in layouts):
        chosen = []  # a pipeline whose transformer has no such file: its reason, not its text encoder's recipe
    if len(chosen) > 1 and sum(not lay.encoder for _, lay in chosen) == 1:
        chosen = [(r, lay) for r, lay in chosen if not lay.encoder]  # a pipeline: its transformer
    if len(chosen) == 1:
        return chosen[0]
    if len(chosen) > 1:
        names = ", ".join(f"{r} ({lay.name})" for r, lay in chosen)
        raise InputError(
            f"{folder}: holds more than one kind of model ({_layout_words(layouts)}): candidates {names}; "
            "pick one with `recipe`",
            parameters=("recipe",),
        )
    there = sorted({f"{r} ({f})" for lay in layouts for f, r in DEFAULT_RECIPES[lay.name].items()})
    info = FORMAT_INFO[fmt]
    reasons = {
        why
        for lay in layouts
        if (
            why := get_family(lay.family).why_no(info, info.names != "source")
            or layout_formats(lay.name)[fmt]
        )
    }
    raise InputError(
        f"{folder}: no bundled {fmt} recipe for {_layout_words(layouts)}"
        f"{''.join(f' ({why})' for why in sorted(reasons))}; for this layout there are: "
        f"{', '.join(there)} (or write a recipe: quantize recipes NAME prints one to start from)"
    )


def encoder_recipes(folder: Path, fmt: str) -> dict[str, tuple[str | None, SourceLayout]]:
    """A pipeline's text encoders beside the transformer `--format fmt` converts (`recipe_for_format` chose a
    layout that is not an encoder's): each encoder's folder -> the bundled recipe of `fmt` for it and its layout,
    the recipe None where there is none (its folder is then copied as it is). Empty for anything but a local
    pipeline folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    layouts = detect_layouts(folder)
    if not any(not lay.encoder for lay in layouts):
        return {}
    found = {
        get_family(lay.family).folders.encoder: (DEFAULT_RECIPES[lay.name].get(fmt), lay)
        for lay in layouts
        if lay.encoder
    }
    return dict(sorted(found.items()))
