"""Names: the one place tensor, module, part and manifest keys are spelled, and the name tables.

- A tensor's *module name* is its name without a trailing ``.weight`` (``blocks.0.ffn.0.weight`` ->
  ``blocks.0.ffn.0``), its full name for anything else (biases, ``scale_shift_table``). Recipe patterns
  are matched against it, and a quantized weight's parts are stored as ``<module>.<part>``.
- A *name table* maps a component's source tensor names to the names they have in the output
  (`IDENTITY`; `WAN_NATIVE`: Wan's original names, from diffusers names or as they are). It is applied
  once, at plan time (`plan.TensorPlan.outputs` then holds every output key); converter, verify, forward and the
  manifest read the keys from there. Each format names its table in the format table.
- The manifest keys tensors as ``<component>/<output tensor name>`` (`manifest_key`, `split_manifest_key`).

No torch here: recipes and the format table use it before torch is imported.

>>> module_name("blocks.0.ffn.0.weight"), part_key("blocks.0.ffn.0", "weight_scale")
('blocks.0.ffn.0', 'blocks.0.ffn.0.weight_scale')
>>> split_manifest_key(manifest_key("transformer", "proj_out.weight"), ["transformer"])
('transformer', 'proj_out.weight')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
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
    "WAN_NATIVE",
    "wan_native_name",
    "wan_diffusers_name",
    "wan_naming",
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


Renamer = Callable[[str], str]


@dataclass(frozen=True)
class NameTable:
    """A renaming of source tensor names into the output's naming scheme (applied at plan time).

    `renamer(names, where)` looks at a component's tensor names (which scheme they follow) and returns the
    renaming for that component, or raises `InputError` naming `where` when the names have no form in the
    table's scheme.
    """

    name: str
    renamer: Callable[[Sequence[str], str], Renamer]
    description: str


def _identity(names: Sequence[str], where: str) -> Renamer:
    return lambda name: name


IDENTITY = NameTable("source", _identity, "the source's own names")


# --- Wan: diffusers names -> the original ("native") names ComfyUI, GGUF files and LoRAs use -------------
#
# The inverse of diffusers' `convert_wan_transformer_to_diffusers` (diffusers.loaders.single_file_utils),
# which the tests use as the oracle. Note the swap: diffusers' `norm2` (cross-attention norm, with weights)
# is native `norm3`, and diffusers' parameter-free `norm3` is native `norm2`.

#: diffusers module (outside the blocks) -> native module
_WAN_ROOT_MODULES = {
    "patch_embedding": "patch_embedding",
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.image_embedder.norm1": "img_emb.proj.0",
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    "condition_embedder.image_embedder.norm2": "img_emb.proj.4",
    "proj_out": "head.head",
}
#: diffusers tensor names that are not `<module>.weight|bias` -> native
_WAN_ROOT_TENSORS = {"scale_shift_table": "head.modulation"}
#: diffusers module inside block N (`blocks.N.<this>`) -> native module inside block N
_WAN_BLOCK_MODULES = {
    **{f"attn1.{d}": f"self_attn.{n}" for d, n in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"))},
    "attn1.to_out.0": "self_attn.o",
    "attn1.norm_q": "self_attn.norm_q",
    "attn1.norm_k": "self_attn.norm_k",
    **{f"attn2.{d}": f"cross_attn.{n}" for d, n in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"))},
    "attn2.to_out.0": "cross_attn.o",
    "attn2.norm_q": "cross_attn.norm_q",
    "attn2.norm_k": "cross_attn.norm_k",
    "attn2.add_k_proj": "cross_attn.k_img",
    "attn2.add_v_proj": "cross_attn.v_img",
    "attn2.norm_added_k": "cross_attn.norm_k_img",
    "norm1": "norm1",
    "norm2": "norm3",
    "norm3": "norm2",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
}
_WAN_BLOCK_TENSORS = {"scale_shift_table": "modulation"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")
_LEAVES = (".weight", ".bias")


def wan_native_name(diffusers_name: str) -> str | None:
    """The native Wan name of a diffusers `WanTransformer3DModel` tensor name, or None when it has none.

    >>> wan_native_name("blocks.3.attn2.add_k_proj.weight"), wan_native_name("scale_shift_table")
    ('blocks.3.cross_attn.k_img.weight', 'head.modulation')
    """
    return _rename(
        diffusers_name, _WAN_ROOT_MODULES, _WAN_ROOT_TENSORS, _WAN_BLOCK_MODULES, _WAN_BLOCK_TENSORS
    )


def _rename(name: str, root_modules, root_tensors, block_modules, block_tensors) -> str | None:
    block = _BLOCK.fullmatch(name)
    prefix, rest, modules, tensors = (
        (f"blocks.{block[1]}.", block[2], block_modules, block_tensors)
        if block
        else ("", name, root_modules, root_tensors)
    )
    if rest in tensors:
        return prefix + tensors[rest]
    for leaf in _LEAVES:
        if rest.endswith(leaf) and rest[: -len(leaf)] in modules:
            return prefix + modules[rest[: -len(leaf)]] + leaf
    return None


def _inverse(table: dict[str, str]) -> dict[str, str]:
    return {native: diffusers for diffusers, native in table.items()}


_NATIVE_ROOT_MODULES, _NATIVE_BLOCK_MODULES = _inverse(_WAN_ROOT_MODULES), _inverse(_WAN_BLOCK_MODULES)
_NATIVE_ROOT_TENSORS, _NATIVE_BLOCK_TENSORS = _inverse(_WAN_ROOT_TENSORS), _inverse(_WAN_BLOCK_TENSORS)


def wan_diffusers_name(native_name: str) -> str | None:
    """The diffusers `WanTransformer3DModel` name of a native Wan tensor name, or None: `wan_native_name` inverted
    (the same table read the other way).

    >>> wan_diffusers_name("blocks.3.norm3.weight"), wan_diffusers_name("head.modulation")
    ('blocks.3.norm2.weight', 'scale_shift_table')
    """
    return _rename(
        native_name, _NATIVE_ROOT_MODULES, _NATIVE_ROOT_TENSORS, _NATIVE_BLOCK_MODULES, _NATIVE_BLOCK_TENSORS
    )


#: tensors only a diffusers-named Wan has, and only a native-named one has (how a component's scheme is told)
_WAN_DIFFUSERS_MARKS = ("condition_embedder.", "blocks.0.attn1.")
_WAN_NATIVE_MARKS = ("head.modulation", "blocks.0.self_attn.")


def wan_naming(names: Iterable[str]) -> str | None:
    """Which Wan naming a model's tensor names follow: ``native``, ``diffusers``, ``mixed``, or None (not Wan).

    >>> wan_naming(["head.modulation", "blocks.0.self_attn.q.weight"]), wan_naming(["proj_out.weight"])
    ('native', None)
    """
    names = list(names)
    native = any(n.startswith(_WAN_NATIVE_MARKS) for n in names)
    diffusers = any(n.startswith(_WAN_DIFFUSERS_MARKS) for n in names)
    return "mixed" if native and diffusers else "native" if native else "diffusers" if diffusers else None


def _wan_native(names: Sequence[str], where: str) -> Renamer:
    naming = wan_naming(names)
    if naming == "mixed":
        mixed = next(n for n in names if n.startswith(_WAN_DIFFUSERS_MARKS))
        raise InputError(
            f"{where}: tensor {mixed!r} has a diffusers name among Wan's native names: one naming per model"
        )
    if naming == "native":
        return lambda name: name  # already native (Wan2.1/2.2, A14B experts, LingBot-World)
    if naming is None:
        raise InputError(
            f"{where}: the tensor names are neither Wan's native names nor diffusers' WanTransformer3DModel names "
            "(e.g. no head.modulation, no condition_embedder): this format writes native Wan names, "
            "so it takes only a Wan model"
        )
    renamed = {}
    for name in names:
        native = wan_native_name(name)
        if native is None:
            raise InputError(
                f"{where}: tensor {name!r} has no native Wan name (not a WanTransformer3DModel tensor diffusers "
                "maps from the original Wan names): this format writes native Wan names"
            )
        renamed[name] = native
    return renamed.__getitem__


WAN_NATIVE = NameTable("wan_native", _wan_native, "Wan's original names (ComfyUI, GGUF), from either naming")

#: name table name -> table; the format table says which one each format writes
NAME_TABLES: dict[str, NameTable] = {t.name: t for t in (IDENTITY, WAN_NATIVE)}


def get_name_table(name: str) -> NameTable:
    try:
        return NAME_TABLES[name]
    except KeyError:
        raise InputError(f"unknown name table {name!r} (known: {', '.join(sorted(NAME_TABLES))})") from None
