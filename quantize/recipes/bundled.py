"""The bundled recipes: every derived one (`derive`) and the curated files of ``recipes/`` (per-layer mixes such as
the K-quant ``_M`` types and ConvRot, ``-all`` variants, worked examples), each loadable by name.

A file of ``recipes/`` named as a derived recipe is its worked example: the same recipe, kept as a file to copy
(a test holds the two equal). Names end in ``.yaml`` as files do; ``--recipe wan-fp8`` and ``wan-fp8.yaml`` are one.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from ..errors import InputError
from .derive import derived_names, derived_recipe
from .schema import LoadedRecipe, parse_recipe, recipe_yaml

__all__ = [
    "bundled_names",
    "bundled_recipe",
    "bundled_text",
    "curated_recipes",
    "load_recipe",
    "bundled_recipes",
]

_BUNDLED_PACKAGE = "quantize.bundled_recipes"


@functools.cache
def curated_recipes() -> dict[str, str]:
    """The files of ``recipes/``: file name -> text. Installed, they are package data; in a checkout run without
    installing (``python -m quantize.cli`` with the repository on PYTHONPATH), the checkout's folder."""
    try:
        root = resources.files(_BUNDLED_PACKAGE)
    except ModuleNotFoundError:
        root = Path(__file__).resolve().parents[2] / "recipes"
    return {
        p.name: p.read_text()
        for p in sorted(root.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".yaml")
    }


@functools.cache
def bundled_names() -> tuple[str, ...]:
    """Every bundled recipe's file name (``wan-fp8.yaml``), derived or curated, sorted."""
    return tuple(sorted({f"{n}.yaml" for n in derived_names()} | set(curated_recipes())))


def _file(name: str) -> str:
    return name if name.endswith(".yaml") else f"{name}.yaml"


def bundled_text(name: str) -> str:
    """The YAML of bundled recipe `name` (``.yaml`` optional): a curated file's text, or the derived recipe's."""
    file = _file(name)
    if file in curated_recipes():
        return curated_recipes()[file]
    derived = derived_names().get(file.removesuffix(".yaml"))
    if derived is None:
        raise InputError(_unknown(name))
    return recipe_yaml(derived_recipe(*derived))


def bundled_recipe(name: str) -> LoadedRecipe:
    """The bundled recipe `name` (``.yaml`` optional), never a local file; the error says where the list is."""
    file = _file(name)
    origin = f"bundled:{file}"
    if file in curated_recipes():
        return LoadedRecipe(recipe=parse_recipe(curated_recipes()[file], origin), origin=origin)
    derived = derived_names().get(file.removesuffix(".yaml"))
    if derived is None:
        raise InputError(_unknown(name))
    return LoadedRecipe(recipe=derived_recipe(*derived), origin=origin)


def bundled_recipes() -> dict[str, str]:
    """Every bundled recipe's file name -> its YAML (`bundled_text`)."""
    return {name: bundled_text(name) for name in bundled_names()}


def _unknown(ref: str) -> str:
    import difflib

    close = difflib.get_close_matches(_file(Path(ref).name), bundled_names(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"no bundled recipe {ref!r}{hint} (quantize recipes lists the {len(bundled_names())} bundled ones)"


def load_recipe(ref: str | Path) -> LoadedRecipe:
    """A local file if `ref` names one, else the bundled recipe of that name (``.yaml`` optional)."""
    path = Path(ref)
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: cannot read recipe: {e}") from None
        return LoadedRecipe(recipe=parse_recipe(text, str(path)), origin=str(path))
    file = _file(path.name)
    if str(ref) in (file, file.removesuffix(".yaml")) and file in bundled_names():
        return bundled_recipe(file)
    raise InputError(f"recipe {str(ref)!r}: no such file, and {_unknown(str(ref))}")
