"""Names: the one place tensor, module, part and manifest keys are spelled, and the name tables.

- A tensor's *module name* is its name without a trailing ``.weight`` (``blocks.0.ffn.0.weight`` ->
  ``blocks.0.ffn.0``), its full name for anything else (biases, ``scale_shift_table``). Recipe patterns
  are matched against it, and a quantized weight's parts are stored as ``<module>.<part>``.
- A *name table* maps a source tensor name to the name it has in the output. It is applied once, at
  plan time (`plan.TensorPlan.outputs` then holds every output key); converter, verify, forward and the
  manifest read the keys from there. Today's formats write the source's own names (`IDENTITY`); a format
  that writes another naming scheme (ComfyUI's native Wan names, say) names its table in the format table.
- The manifest keys tensors as ``<component>/<output tensor name>`` (`manifest_key`, `split_manifest_key`).

No torch here: recipes and the format table use it before torch is imported.

>>> module_name("blocks.0.ffn.0.weight"), part_key("blocks.0.ffn.0", "weight_scale")
('blocks.0.ffn.0', 'blocks.0.ffn.0.weight_scale')
>>> split_manifest_key(manifest_key("transformer", "proj_out.weight"))
('transformer', 'proj_out.weight')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import InputError

__all__ = [
    "WEIGHT_SUFFIX",
    "module_name",
    "part_key",
    "manifest_key",
    "split_manifest_key",
    "NameTable",
    "IDENTITY",
    "NAME_TABLES",
    "get_name_table",
]

WEIGHT_SUFFIX = ".weight"


def module_name(tensor_name: str) -> str:
    """The name recipe patterns match and quantized parts hang from: without ``.weight``, else the tensor name."""
    return tensor_name[: -len(WEIGHT_SUFFIX)] if tensor_name.endswith(WEIGHT_SUFFIX) else tensor_name


def part_key(module: str, part: str) -> str:
    """The checkpoint key of one part of a quantized module, e.g. ``blocks.0.ffn.0.weight_scale``."""
    return f"{module}.{part}"


def manifest_key(component: str, tensor: str) -> str:
    """How the manifest keys a tensor: ``<component>/<output tensor name>`` (component ``.`` for the root)."""
    return f"{component}/{tensor}"


def split_manifest_key(key: str) -> tuple[str, str]:
    """(component, tensor name) of a manifest key; component names may hold ``/``, tensor names never do."""
    component, sep, tensor = key.rpartition("/")
    if not sep or not component or not tensor:
        raise InputError(f"manifest tensor key {key!r} is not '<component>/<tensor name>'")
    return component, tensor


@dataclass(frozen=True)
class NameTable:
    """A renaming of source tensor names into the output's naming scheme (applied at plan time)."""

    name: str
    rename: Callable[[str], str]
    description: str

    def output_name(self, source_tensor: str) -> str:
        return self.rename(source_tensor)


IDENTITY = NameTable("source", lambda name: name, "the source's own names")

#: name table name -> table; the format table says which one each format writes
NAME_TABLES: dict[str, NameTable] = {IDENTITY.name: IDENTITY}


def get_name_table(name: str) -> NameTable:
    try:
        return NAME_TABLES[name]
    except KeyError:
        raise InputError(f"unknown name table {name!r} (known: {', '.join(sorted(NAME_TABLES))})") from None
