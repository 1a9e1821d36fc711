"""Names: the one place tensor, module, part and manifest keys are spelled.

- A tensor's *module name* is its name without a trailing ``.weight`` (``blocks.0.ffn.0.weight`` ->
  ``blocks.0.ffn.0``), its full name for anything else (biases, ``scale_shift_table``). Recipe patterns
  are matched against it, and a quantized weight's parts are stored as ``<module>.<part>``.
- A *name table* (`models.NameTable`) maps a component's source tensor names to the names they have in the
  output: the format asks for a role of names (``source``, ``native``) and the component's model family
  answers (`models.names_for`). It is applied once, at plan time (`plan.TensorPlan.outputs` then holds every
  output key); converter, verify, forward and the manifest read the keys from there.
- The manifest keys tensors as ``<component>/<output tensor name>`` (`manifest_key`, `split_manifest_key`).

No torch here: recipes and the format table use it before torch is imported.

>>> module_name("blocks.0.ffn.0.weight"), part_key("blocks.0.ffn.0", "weight_scale")
('blocks.0.ffn.0', 'blocks.0.ffn.0.weight_scale')
>>> split_manifest_key(manifest_key("transformer", "proj_out.weight"), ["transformer"])
('transformer', 'proj_out.weight')
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import InputError

__all__ = [
    "WEIGHT_SUFFIX",
    "module_name",
    "part_key",
    "manifest_key",
    "split_manifest_key",
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


def split_manifest_key(key: str, components: Iterable[str]) -> tuple[str, str]:
    """(component, tensor name) of a manifest key, given the checkpoint's components: the longest component
    that prefixes it (a tensor name may hold ``/`` too, so the key alone cannot say where the component ends)."""
    owners = [c for c in components if key.startswith(f"{c}/") and len(key) > len(c) + 1]
    if not owners:
        raise InputError(
            f"manifest tensor key {key!r} is not '<component>/<tensor name>' for a listed component"
        )
    component = max(owners, key=len)
    return component, key[len(component) + 1 :]
