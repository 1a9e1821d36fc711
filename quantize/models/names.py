"""A family's names: the tables that rename a component's tensors between its namings, as data.

``source`` names are as stored; ``native`` names are the original release's (what ComfyUI and GGUF readers expect;
a text encoder's GGUF file has llama.cpp's, the role ``gguf``);
``diffusers`` names are those of the diffusers class. `BlockNames` is one family's diffusers <-> native table, read
both ways; `Blocks` one list of repeated blocks in it; `Rows` the rows of a diffusers module inside a native tensor
that stacks several (a fused projection); `NameTable` the renaming a format's role asks for, applied once at plan
time. No torch at import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import InputError

__all__ = [
    "ROLES",
    "Renamer",
    "Stack",
    "Stacker",
    "Split",
    "Splitter",
    "Cut",
    "NameTable",
    "Rows",
    "stack_rows",
    "same_but_size_one_dims",
    "IDENTITY",
    "Blocks",
    "BlockNames",
    "renamed",
]

#: the roles of names a format may ask for: as stored; the original release's (ComfyUI's); a GGUF reader's (the
#: native ones for a DiT, llama.cpp's for a text encoder: `PlanPolicy.gguf_names`)
ROLES = ("source", "native", "gguf")

Renamer = Callable[[str], str]

#: one tensor made of several: its equal row ranges in order, each (tensor name, part, parts) = the rows of part
#: `part` of `parts` equal ranges of that tensor (the whole: part 0 of 1). A fused projection's native weight is
#: the stack of diffusers' to_q, to_k and to_v: ((".to_q.weight", 0, 1), (".to_k.weight", 0, 1), ...)
Stack = tuple[tuple[str, int, int], ...]
#: (component's tensor names, where) -> each output tensor made by stacking source tensors -> its `Stack`
Stacker = Callable[[Sequence[str], str], dict[str, Stack]]


#: one tensor cut from another: (tensor name, dim, part, parts) = part `part` of `parts` equal ranges of that
#: tensor's dim `dim`; a range of one along a dim other than the first loses that dim (a Conv3d's two temporal
#: taps as two Conv2d kernels, as llama.cpp's converter writes Qwen2-VL's patch embedding)
Split = tuple[str, int, int, int]
#: (component's tensor names, where) -> each output tensor cut from a source tensor -> its `Split`
Splitter = Callable[[Sequence[str], str], dict[str, Split]]


def _no_stacks(names: Sequence[str], where: str) -> dict[str, Stack]:
    return {}


def _no_splits(names: Sequence[str], where: str) -> dict[str, Split]:
    return {}


@dataclass(frozen=True)
class NameTable:
    """A renaming of source tensor names into the output's names (applied once, at plan time).

    `renamer(names, where)` looks at a component's tensor names (which naming they follow) and returns the
    renaming for that component, or raises `InputError` naming `where` when they have no form in this table.
    `stacker(names, where)` gives the output tensors that stack several source tensors' rows (a native fused
    projection written from diffusers' separate ones); `splitter(names, where)` the output tensors cut from one
    source tensor (llama.cpp's separate q, k and v of a fused ``qkv``); neither's sources are renamed one by one.
    """

    name: str
    renamer: Callable[[Sequence[str], str], Renamer]
    description: str
    stacker: Stacker = _no_stacks
    splitter: Splitter = _no_splits


def _identity(names: Sequence[str], where: str) -> Renamer:
    return lambda name: name


def stack_rows(stack: Stack, rows: int) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each tensor of `stack` -> the row ranges of the stacked tensor (`rows` rows) that hold it, in its own row
    order: what a stacked tensor is cut into to give each of its tensors back.

    >>> stack_rows(((".v", 1, 2), (".q", 0, 1), (".v", 0, 2)), 6)
    {'.v': ((4, 6), (0, 2)), '.q': ((2, 4),)}
    """
    if rows % len(stack):
        raise ValueError(f"{rows} rows do not split into {len(stack)} equal parts")
    n = rows // len(stack)
    ranges: dict[str, dict[int, tuple[int, int]]] = {}
    for i, (name, part, _parts) in enumerate(stack):
        ranges.setdefault(name, {})[part] = (i * n, (i + 1) * n)
    return {name: tuple(by_part[p] for p in sorted(by_part)) for name, by_part in ranges.items()}


def same_but_size_one_dims(stored: Sequence[int], wanted: Sequence[int]) -> bool:
    """Whether a stored tensor of shape `stored` holds a parameter of shape `wanted` as it is but for size-1
    dimensions (a bias stored [1, C, 1, 1] for one of [C]): the same values in the same order, so a view of it
    is the parameter. The rule a forward pass (`run.forward`) and `loaders` put such a tensor into the class by;
    any other difference in shape is a mismatch.

    >>> same_but_size_one_dims((1, 32, 1, 1), (32,)), same_but_size_one_dims((2, 16), (32,))
    (True, False)
    """
    return tuple(d for d in stored if d != 1) == tuple(d for d in wanted if d != 1)


#: the names as stored: what every family (and a model of no known family) has
IDENTITY = NameTable("source", _identity, "the source's own names")

_LEAVES = (".weight", ".bias")


@dataclass(frozen=True)
class Blocks:
    """One list of repeated blocks in a name table: its prefix in each naming (``blocks`` in both for Wan;
    a family may call them otherwise natively), and inside block N each diffusers module or other tensor ->
    its native one."""

    diffusers: str
    native: str
    modules: Mapping[str, str]
    tensors: Mapping[str, str] = field(default_factory=dict)
    #: native module -> the diffusers rows it stacks, in order (a fused projection; `Rows`)
    stacked: Mapping[str, tuple[Rows, ...]] = field(default_factory=dict)
    #: diffusers module -> the native modules its equal row ranges are, in order (a fused projection written as
    #: its parts: Qwen2-VL's ``attn.qkv`` as llama.cpp's ``attn_q``, ``attn_k``, ``attn_v``)
    split: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Cut:
    """A tensor written as several: its `len(names)` equal ranges along `dim`, in order, each under its name
    (`Split`)."""

    names: tuple[str, ...]
    dim: int = 0


@dataclass(frozen=True)
class Rows:
    """Rows of one diffusers module's tensors in a stacked native one: part `part` of `parts` equal row ranges
    (the whole: part 0 of 1). MiniMax-H3's native ``mlp.fc1`` is diffusers' ``ff.net.0.proj`` with its halves
    swapped: ``(Rows("ff.net.0.proj", 1, 2), Rows("ff.net.0.proj", 0, 2))``."""

    module: str
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class BlockNames:
    """A family's diffusers <-> native name table as data: modules and other tensors outside the repeated
    blocks, and each list of blocks (`Blocks`), each diffusers name -> its native name. Read both ways."""

    root_modules: Mapping[str, str]
    root_tensors: Mapping[str, str]
    blocks: tuple[Blocks, ...]
    #: diffusers tensor outside the blocks -> the native tensors it is cut into (`Cut`)
    root_cuts: Mapping[str, Cut] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def inverse(table: Mapping[str, str]) -> dict[str, str]:
            return {v: k for k, v in table.items()}

        # (prefix pattern, prefix to write, modules, tensors), for each direction
        forward = [(_prefix(b.diffusers), b.native, b.modules, b.tensors) for b in self.blocks]
        backward = [
            (_prefix(b.native), b.diffusers, inverse(b.modules), inverse(b.tensors)) for b in self.blocks
        ]
        object.__setattr__(self, "_to_native", (forward, self.root_modules, self.root_tensors))
        object.__setattr__(
            self, "_to_diffusers", (backward, inverse(self.root_modules), inverse(self.root_tensors))
        )
        # diffusers module (in a block) -> the native module stacking it, for each list of blocks
        object.__setattr__(
            self,
            "_stacked_in",
            [
                (_prefix(b.diffusers), b.native, {r.module: m for m, rows in b.stacked.items() for r in rows})
                for b in self.blocks
            ],
        )

    def native(self, diffusers_name: str) -> str | None:
        """The native name of a diffusers tensor name, or None when it has none."""
        return _rename(diffusers_name, *self._to_native)

    def diffusers(self, native_name: str) -> str | None:
        """The diffusers name of a native tensor name, or None: `native` read the other way."""
        return _rename(native_name, *self._to_diffusers)

    def native_stack(self, native_name: str) -> Stack | None:
        """The diffusers tensors a stacked native tensor is made of (`Stack`), or None: not a stacked one."""
        for b in self.blocks:
            found = _block_module(b.native, native_name)
            rows = None if found is None else b.stacked.get(found[1])
            if rows:
                n, _, leaf = found
                return tuple((f"{b.diffusers}.{n}.{r.module}{leaf}", r.part, r.parts) for r in rows)
        return None

    def splits(self, diffusers_name: str) -> dict[str, Split] | None:
        """The native tensors a diffusers tensor is cut into, each with its `Split`, or None: not a cut one.

        >>> t = BlockNames({}, {}, (Blocks("b", "blk", {}, split={"qkv": ("q", "k")}),), {"c.w": Cut(("x", "y"), 2)})
        >>> t.splits("b.3.qkv.bias"), t.splits("c.w")["y"]
        ({'blk.3.q.bias': ('b.3.qkv.bias', 0, 0, 2), 'blk.3.k.bias': ('b.3.qkv.bias', 0, 1, 2)}, ('c.w', 2, 1, 2))
        """
        cut = self.root_cuts.get(diffusers_name)
        if cut is not None:
            return {n: (diffusers_name, cut.dim, i, len(cut.names)) for i, n in enumerate(cut.names)}
        for b in self.blocks:
            found = _block_module(b.diffusers, diffusers_name)
            parts = None if found is None else b.split.get(found[1])
            if parts:
                n, _, leaf = found
                return {
                    f"{b.native}.{n}.{m}{leaf}": (diffusers_name, 0, i, len(parts))
                    for i, m in enumerate(parts)
                }
        return None

    def cut_from(self, native_name: str) -> Split | None:
        """The `Split` a native tensor is of a diffusers one (`splits` read the other way), or None: not a cut one.

        >>> t = BlockNames({}, {}, (Blocks("b", "blk", {}, split={"qkv": ("q", "k")}),), {"c.w": Cut(("x", "y"), 2)})
        >>> t.cut_from("blk.3.k.weight"), t.cut_from("x"), t.cut_from("blk.3.o.weight")
        (('b.3.qkv.weight', 0, 1, 2), ('c.w', 2, 0, 2), None)
        """
        for name, cut in self.root_cuts.items():
            if native_name in cut.names:
                return name, cut.dim, cut.names.index(native_name), len(cut.names)
        for b in self.blocks:
            found = _block_module(b.native, native_name)
            if found is None:
                continue
            n, piece, leaf = found
            for module, parts in b.split.items():
                if piece in parts:
                    return f"{b.diffusers}.{n}.{module}{leaf}", 0, parts.index(piece), len(parts)
        return None

    def stacked_into(self, diffusers_name: str) -> str | None:
        """The stacked native tensor a diffusers tensor is part of, or None."""
        for pattern, native_prefix, stacked in self._stacked_in:
            block = pattern.fullmatch(diffusers_name)
            if block is None:
                continue
            for leaf in _LEAVES:
                if block[2].endswith(leaf) and block[2].removesuffix(leaf) in stacked:
                    return f"{native_prefix}.{block[1]}.{stacked[block[2].removesuffix(leaf)]}{leaf}"
        return None


def _prefix(block: str) -> re.Pattern:
    return re.compile(rf"{re.escape(block)}\.(\d+)\.(.+)")


def _block_module(blocks: str, name: str) -> tuple[str, str, str] | None:
    """(block number, module, leaf) of tensor `name` inside the blocks under `blocks` (``blocks.3.attn.qkv.bias``:
    ``("3", "attn.qkv", ".bias")``), or None: not a module's weight or bias there."""
    block = _prefix(blocks).fullmatch(name)
    if block is None:
        return None
    leaf = next((leaf for leaf in _LEAVES if block[2].endswith(leaf)), None)
    return None if leaf is None else (block[1], block[2].removesuffix(leaf), leaf)


def _rename(
    name: str, blocks, root_modules: Mapping[str, str], root_tensors: Mapping[str, str]
) -> str | None:
    for pattern, prefix, modules, tensors in blocks:
        block = pattern.fullmatch(name)
        if block:
            return _leaf(block[2], f"{prefix}.{block[1]}.", modules, tensors)
    return _leaf(name, "", root_modules, root_tensors)


def _leaf(rest: str, prefix: str, modules: Mapping[str, str], tensors: Mapping[str, str]) -> str | None:
    if rest in tensors:
        return prefix + tensors[rest]
    for leaf in _LEAVES:
        if rest.endswith(leaf) and rest[: -len(leaf)] in modules:
            return prefix + modules[rest[: -len(leaf)]] + leaf
    return None


def renamed(names: Sequence[str], rename: Callable[[str], str | None], where, lacking: str) -> dict[str, str]:
    """Each of `names` -> its name under `rename`; `InputError` for the first it has none for (`lacking` says why)."""
    renamed = {}
    for name in names:
        new = rename(name)
        if new is None:
            raise InputError(f"{where}: tensor {name!r} {lacking}")
        renamed[name] = new
    return renamed
