"""Which parts of a model are its transformer blocks: the unit of loading and of offloading."""

from __future__ import annotations

from torch import nn

__all__ = ["find_block_lists", "find_blocks"]


def find_block_lists(model: nn.Module, names: list[str] | None = None) -> list[tuple[str, nn.ModuleList]]:
    """The model's lists of transformer blocks, as (attribute path, ModuleList), in model order.

    `names` picks them (``["blocks"]``); otherwise a diffusers model's ``_repeated_blocks`` class names
    say which ModuleLists hold blocks (Wan: ``blocks``; Kandinsky 5: ``text_transformer_blocks`` and
    ``visual_transformer_blocks``), and failing that, the outermost ModuleLists of two or more modules
    of one class that hold parameters.
    """
    if names is not None:
        found = []
        for name in names:
            module = model.get_submodule(name) if name else model
            if not isinstance(module, nn.ModuleList):
                raise ValueError(f"{name!r} is a {type(module).__name__}, not an nn.ModuleList of blocks")
            found.append((name, module))
        return found
    repeated = set(getattr(model, "_repeated_blocks", None) or ())
    found = _outermost(model, lambda ml: bool(repeated) and all(type(b).__name__ in repeated for b in ml))
    return found or _outermost(model, _uniform)


def find_blocks(model: nn.Module, names: list[str] | None = None) -> list[tuple[str, nn.Module]]:
    """Every block, as (qualified name, module), list by list."""
    return [
        (f"{prefix}.{i}", block)
        for prefix, ml in find_block_lists(model, names)
        for i, block in enumerate(ml)
    ]


def _uniform(ml: nn.ModuleList) -> bool:
    return len(ml) >= 2 and len({type(b) for b in ml}) == 1 and any(True for _ in ml[0].parameters())


def _outermost(model: nn.Module, accept) -> list[tuple[str, nn.ModuleList]]:
    found: list[tuple[str, nn.ModuleList]] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix, _ in found):
            continue
        if isinstance(module, nn.ModuleList) and len(module) and accept(module):
            found.append((name, module))
    return found
