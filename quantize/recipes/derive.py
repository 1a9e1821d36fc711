"""The bundled recipe of a (layout, format): made from the layout's `models.Policy` and the format's facts.

A family declares once per layout what is quantized, what stays and why (`Family.policies`); a format declares
its default checks, the type of its bundled recipes, whether it scales blocks of inputs and the type it keeps
sensitive layers in (`formats.FORMAT_INFO`). `derived_recipe` joins the two; its name is
``<layout>-<format suffix>``. Which formats a layout has: every format its family has files of (`Family.why_no`)
that the policy does not refuse (`Policy.refused`).

>>> layout, names = next(iter(default_recipes().items()))
>>> all(name == f"{layout}-{FORMAT_INFO[fmt].recipe_suffix}" for fmt, name in names.items())
True
>>> derived_recipe(layout, "fp8_channel").format
'fp8_channel'
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from ..errors import InputError
from ..formats import FORMAT_INFO
from ..formats.info import FormatInfo
from ..models import FAMILIES, Family, Policy
from .schema import Recipe

__all__ = ["layout_policies", "layout_formats", "default_recipes", "derived_recipe", "derived_names"]


@functools.cache
def layout_policies() -> dict[str, tuple[Family, Policy]]:
    """Layout -> its family and policy, over every family (a layout is declared by one family only)."""
    found: dict[str, tuple[Family, Policy]] = {}
    for family in FAMILIES:
        for layout, policy in family.policies.items():
            if layout in found:
                raise ValueError(
                    f"layout {layout!r} is declared by {found[layout][0].name} and {family.name}"
                )
            found[layout] = (family, policy)
    return found


def _why_not(family: Family, policy: Policy, info: FormatInfo) -> str | None:
    """Why the layout has no bundled recipe of format `info` (None: it has one)."""
    return family.why_no(info) or policy.refusal(info.name, info.names)


def layout_formats(layout: str) -> dict[str, str | None]:
    """Format -> why layout `layout` has no bundled recipe of it (None: it has one), every format in turn."""
    family, policy = _layout(layout)
    return {fmt: _why_not(family, policy, info) for fmt, info in FORMAT_INFO.items()}


@functools.cache
def default_recipes() -> dict[str, dict[str, str]]:
    """Layout -> format -> the bundled recipe `convert --format` takes, over every family's layouts."""
    return {
        layout: {
            fmt: _name(layout, FORMAT_INFO[fmt]) for fmt, why in layout_formats(layout).items() if why is None
        }
        for layout in layout_policies()
    }


def derived_names() -> dict[str, tuple[str, str]]:
    """Every derived recipe's name -> its (layout, format)."""
    return {
        name: (layout, fmt)
        for layout, by_format in default_recipes().items()
        for fmt, name in by_format.items()
    }


def _name(layout: str, info: FormatInfo) -> str:
    return f"{layout}-{info.recipe_suffix}"


def _layout(layout: str) -> tuple[Family, Policy]:
    try:
        return layout_policies()[layout]
    except KeyError:
        raise InputError(f"no layout {layout!r} (known: {', '.join(layout_policies())})") from None


@functools.cache
def derived_recipe(layout: str, fmt: str) -> Recipe:
    """The bundled recipe of `layout` in format `fmt`; `InputError` saying why where the layout has none."""
    family, policy = _layout(layout)
    info = FORMAT_INFO[fmt]
    why = _why_not(family, policy, info)
    if why is not None:
        raise InputError(f"layout {layout} has no bundled {fmt} recipe: {why}")
    data: dict[str, object] = {
        "name": _name(layout, info),
        "description": _description(family, policy, info),
        "format": fmt,
        "targets": list(policy.targets_for(fmt, info.block_scaled)),
    }
    if policy.components is not None:
        data["components"] = list(policy.components)
    if policy.ignore:
        data["ignore"] = list(policy.ignore)
    if info.recipe_type is not None:
        data["type"] = info.recipe_type
    if info.sensitive_type is not None and policy.sensitive:
        data["types"] = dict.fromkeys(policy.sensitive, info.sensitive_type)
    if policy.copy_other_files and info.diffusers_layout:
        data["copy_other_files"] = True
    data["checks"] = _checks(info, family.recipe_checks, policy.checks)
    return Recipe.model_validate(data)


def _checks(info: FormatInfo, *overrides: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The format's thresholds, then the family's and the layout's for that format on top."""
    checks = dict(info.checks)
    for by_format in overrides:
        checks.update(by_format.get(info.name, {}))
    return checks


def _description(family: Family, policy: Policy, info: FormatInfo) -> str:
    """The recipe's description from the policy's words and the format's."""
    lines = [f"{policy.what} to {info.words}."]
    quantized = f"Quantized: {policy.quantized}"
    exception = policy.exceptions.get(info.name)
    if exception is not None:
        quantized += f"; {exception.why}"
    elif info.block_scaled and policy.block_targets is not None:
        quantized += f"; {policy.block_why}"
    lines.append(quantized + ".")
    if info.sensitive_type is not None and policy.sensitive:
        lines.append(f"Stored as {info.sensitive_type} instead: {policy.sensitive_why}.")
    lines.append(f"Kept: {policy.kept}.")
    if info.diffusers_layout and not policy.copy_other_files and policy.components not in (None, (".",)):
        folders = ", ".join(f"{c}/" for c in policy.components)
        lines.append(
            f"Writes {folders} alone (copy_other_files is off, so the pipeline's other models are not copied "
            "unconverted)."
        )
    if policy.note:
        lines.append(policy.note)
    return "\n".join(lines) + "\n"
