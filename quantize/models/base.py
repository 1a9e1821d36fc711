"""A model family: everything the tool knows about one family of video DiTs, in one object.

A family (`Family`) says how its checkpoints are recognized (the config classes it is registered by, the
tensor-name marks of each naming, its folder layouts), its names by *role* (``source``: as stored;
``native``: the original release's names, which ComfyUI and GGUF readers expect; ``diffusers``), the
diffusers class that runs it and how a forward pass's inputs are made from its config, its GGUF
``general.architecture``, what the card says of it, its LoRA key prefixes, its example checkpoints
(`quantize example`) and its default bundled recipe per layout and format.

Converter, verify, forward, the card and the loaders ask the family of a component (`models.family_of`);
none of them spells a family's key name, class or config field. A new family is one module of this package
and one entry of `models.FAMILIES`.

No torch at import: recipes, detection and the card read families before torch is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "ROLES",
    "Renamer",
    "Stack",
    "Stacker",
    "NameTable",
    "Rows",
    "stack_rows",
    "same_but_size_one_dims",
    "IDENTITY",
    "Blocks",
    "BlockNames",
    "SourceLayout",
    "ModelInputs",
    "ExampleModel",
    "Family",
]

#: the roles of names a format may ask for: as stored, or the original release's (ComfyUI's, GGUF's)
ROLES = ("source", "native")

Renamer = Callable[[str], str]

#: one tensor made of several: its equal row ranges in order, each (tensor name, part, parts) = the rows of part
#: `part` of `parts` equal ranges of that tensor (the whole: part 0 of 1). A fused projection's native weight is
#: the stack of diffusers' to_q, to_k and to_v: ((".to_q.weight", 0, 1), (".to_k.weight", 0, 1), ...)
Stack = tuple[tuple[str, int, int], ...]
#: (component's tensor names, where) -> each output tensor made by stacking source tensors -> its `Stack`
Stacker = Callable[[Sequence[str], str], dict[str, Stack]]


def _no_stacks(names: Sequence[str], where: str) -> dict[str, Stack]:
    return {}


@dataclass(frozen=True)
class NameTable:
    """A renaming of source tensor names into the output's names (applied once, at plan time).

    `renamer(names, where)` looks at a component's tensor names (which naming they follow) and returns the
    renaming for that component, or raises `InputError` naming `where` when they have no form in this table.
    `stacker(names, where)` gives the output tensors that stack several source tensors' rows (a native fused
    projection written from diffusers' separate ones); their sources are not renamed one by one.
    """

    name: str
    renamer: Callable[[Sequence[str], str], Renamer]
    description: str
    stacker: Stacker = _no_stacks


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
            block = _prefix(b.native).fullmatch(native_name)
            if block is None:
                continue
            for leaf in _LEAVES:
                rows = b.stacked.get(block[2].removesuffix(leaf)) if block[2].endswith(leaf) else None
                if rows:
                    prefix = f"{b.diffusers}.{block[1]}."
                    return tuple((f"{prefix}{r.module}{leaf}", r.part, r.parts) for r in rows)
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


@dataclass(frozen=True)
class SourceLayout:
    """One layout a source folder matches: its name (a key of the family's `default_recipes`) and why, in words."""

    name: str
    why: str  # e.g. "Wan2.2 A14B layout, original names, 2 experts"
    family: str = ""  # the family's registry name


@dataclass(frozen=True)
class ModelInputs:
    """What one forward pass of a family's diffusers class takes: the tensors a calibration file gives (`keys`,
    by the forward's argument names, from the config), the shapes each may have (`shapes`: a name -> the shape
    patterns it may take, ``None`` for a free dimension), random ones shaped from the config, and the call's
    keyword arguments."""

    keys: Callable[[dict], tuple[str, ...]]
    shapes: Callable[[dict], dict[str, tuple[tuple[int | None, ...], ...]]]
    random: Callable[[dict, torch.Generator], dict[str, torch.Tensor]]
    call: Callable[[dict, dict[str, torch.Tensor]], dict]  # (config, tensors) -> the forward's kwargs
    accepts: tuple[str, ...]  # every tensor a pass of this class may take, whatever the config


@dataclass(frozen=True)
class ExampleModel:
    """One model of an example checkpoint: its folder (``.``: the root), tensors (name, shape) in module order,
    config.json (None: a release that has none), and the stem of its safetensors file names."""

    component: str
    tensors: list[tuple[str, tuple[int, ...]]]
    config: dict | None
    stem: str = "diffusion_pytorch_model"
    #: the file's ``__metadata__`` beside ``format`` as the release writes it (LTX-2's ``config``), or None
    metadata: Mapping[str, str] | None = None


class Family:
    """What the tool knows of one model family. Subclasses set the attributes and override what differs."""

    #: registry name (``quantize example --family``, `SourceLayout.family`)
    name: str = ""
    #: how messages and the card call it
    title: str = ""
    #: the diffusers class that runs it (config ``_class_name`` of its diffusers checkpoints)
    diffusers_class: str = ""
    #: config ``_class_name`` of the original release (Wan's ``WanModel``); run as `diffusers_class`
    native_classes: tuple[str, ...] = ()
    #: diffusers <-> native names; None: the family has no native names apart from the diffusers ones
    names: BlockNames | None = None
    #: tensor-name prefixes that only its native / only its diffusers naming has (how a component's naming is told)
    native_marks: tuple[str, ...] = ()
    diffusers_marks: tuple[str, ...] = ()
    #: GGUF ``general.architecture`` (what ComfyUI-GGUF and llama.cpp tools read); None: no GGUF output
    gguf_architecture: str | None = None
    #: why it has none, in words (what the refusal at plan time says): which reader lacks it
    no_gguf_why: str = "no GGUF reader this tool writes for knows it"
    #: prefixes its LoRA keys carry in the wild (stripped, any of them, in any order)
    lora_prefixes: tuple[str, ...] = ()
    #: what a block's modulation table is called in its namings (a LoRA's ``diff_m`` adds to it)
    modulation_names: tuple[str, ...] = ()
    #: layout -> format -> the bundled recipe `convert --format` takes
    default_recipes: Mapping[str, Mapping[str, str]] = {}
    #: example presets (`quantize example --preset`) and folder layouts (`--layout`)
    presets: Mapping[str, Any] = {}
    example_layouts: tuple[str, ...] = ()
    default_preset: str = "tiny"
    #: what the card says on two experts (None: the family has none)
    experts_note: str | None = None
    #: name prefixes (in either naming) of 2-D weights the runtimes use as plain parameters, not as Linear layers
    #: (Wan Animate's motion encoder: StyleGAN2's "equalized" layers scale them per call): never quantized, and
    #: kept as any other non-Linear tensor is (a GGUF reader hands them to torch as they are stored: F32)
    plain_weights: tuple[str, ...] = ()
    #: name prefixes of tensors a release's one file holds beside the model (LTX-2's VAE, vocoder, text connectors):
    #: carried as stored, no part of `diffusers_class` (a forward pass and the loader leave them out)
    carried_parts: tuple[str, ...] = ()
    #: patterns (`re.fullmatch`) of single tensors a release saves that `diffusers_class` computes itself and holds
    #: none of (Wan Animate's blur filters, constant buffers): carried as `carried_parts` are
    carried_tensors: tuple[str, ...] = ()
    #: keys of a source file's ``__metadata__`` its runtimes read (LTX-2's ``config``): carried into the output files
    carried_metadata: tuple[str, ...] = ()
    #: why a model in diffusers' names has no output in the native names (ComfyUI's and GGUF's files, which the
    #: release converts to), in words: what its runtimes need that diffusers' layout does not hold (None: it has).
    #: Such a model is refused at plan time for those formats (`name_table`), and `why_no` says so
    diffusers_not_native_why: str | None = None

    # --- recognizing it ------------------------------------------------------------------------

    def naming(self, names: Iterable[str]) -> str | None:
        """Which of its namings `names` follow: ``native``, ``diffusers``, ``mixed``, or None (neither)."""
        names = list(names)
        native = bool(self.native_marks) and any(n.startswith(self.native_marks) for n in names)
        diffusers = bool(self.diffusers_marks) and any(n.startswith(self.diffusers_marks) for n in names)
        return "mixed" if native and diffusers else "native" if native else "diffusers" if diffusers else None

    def owns(self, config_class: str | None, names: Iterable[str]) -> bool:
        """Whether a model whose config names `config_class` (None: no config) and tensors `names` is one of its."""
        if config_class is not None:
            return config_class == self.diffusers_class or config_class in self.native_classes
        return self.naming(names) is not None

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        """Every layout of this family that `folder` matches; `open_(rel)` opens a component folder (None where
        there is no readable one). By default: a diffusers ``transformer/`` of its class, or such a folder itself."""
        found = []
        transformer = open_("transformer")
        if transformer is not None and self._is_diffusers(transformer):
            found.append(
                self.layout(f"{self.title}, diffusers layout ({self.diffusers_class} in transformer/)")
            )
        root = open_(".")
        if root is not None and root.config and root.config.get("_class_name") == self.diffusers_class:
            found.append(self.layout(f"{self.title}, a bare {self.diffusers_class} folder"))
        return found

    def layout(self, why: str, name: str | None = None) -> SourceLayout:
        return SourceLayout(name or self.name, why, self.name)

    def _is_diffusers(self, comp: Component) -> bool:
        """A diffusers model of this family: its config names the class, or names no class a family is
        registered by and its tensors have this family's diffusers names."""
        from . import family_of_class

        cls = (comp.config or {}).get("_class_name")
        if isinstance(cls, str) and family_of_class(cls) is not None:
            return cls == self.diffusers_class
        return self.naming(comp.tensors) == "diffusers"

    def plain_weight(self, name: str) -> bool:
        """Whether tensor `name` is a 2-D weight its runtimes use as a plain parameter (`plain_weights`)."""
        return bool(self.plain_weights) and name.startswith(self.plain_weights)

    def carried(self, name: str) -> bool:
        """Whether tensor `name` is carried as stored and is no part of `diffusers_class`: a part of the release
        beside the model (`carried_parts`), or a tensor the class computes itself (`carried_tensors`)."""
        if self.carried_parts and name.startswith(self.carried_parts):
            return True
        return any(re.fullmatch(p, name) for p in self.carried_tensors)

    # --- names -----------------------------------------------------------------------------------

    def native_name(self, diffusers_name: str) -> str | None:
        return None if self.names is None else self.names.native(diffusers_name)

    def diffusers_name(self, native_name: str) -> str | None:
        return None if self.names is None else self.names.diffusers(native_name)

    def name_table(self, role: str, fmt: str, where: str = "") -> NameTable:
        """The names format `fmt` writes this family's tensors under; `InputError` in one line naming the model
        (`where`), the family and the format when it has no names of that role."""
        if role == "source":
            return IDENTITY
        if role == "native" and self.names is not None:

            def refusing(make: Callable) -> Callable:
                def checked(names: Sequence[str], where: str):
                    self._refuse_diffusers_as_native(names, where, fmt)
                    return make(names, where)

                return checked

            return NameTable(
                f"{self.name}_native",
                refusing(self._native_renamer),
                f"{self.title}'s original names",
                refusing(self._native_stacks),
            )
        raise InputError(
            f"{where + ': ' if where else ''}{fmt} writes a model's {role} names, and {self.title} has none in this tool yet: "
            f"convert {self.title} to another format (quantize recipes lists them)"
        )

    def _refuse_diffusers_as_native(self, names: Sequence[str], where: str, fmt: str) -> None:
        """`InputError` for a diffusers-named model when the family has no native output of one
        (`diffusers_not_native_why`), naming the model and the format."""
        if self.diffusers_not_native_why is not None and self.naming(names) == "diffusers":
            raise InputError(
                f"{where}: {fmt} writes {self.title}'s native names, which ComfyUI reads, and this model has "
                f"diffusers' {self.diffusers_class} names: {self.diffusers_not_native_why}"
            )

    def _native_renamer(self, names: Sequence[str], where: str) -> Renamer:
        naming = self.naming(names)
        if naming == "mixed":
            mixed = next(n for n in names if n.startswith(self.diffusers_marks))
            raise InputError(
                f"{where}: tensor {mixed!r} has a diffusers name among {self.title}'s native names: "
                "one naming per model"
            )
        if naming == "native":
            return lambda name: name
        if naming is None:
            raise InputError(
                f"{where}: the tensor names are neither {self.title}'s native names nor diffusers' "
                f"{self.diffusers_class} names: this format writes native {self.title} names"
            )
        lacking = (
            f"has no native {self.title} name (not a {self.diffusers_class} tensor diffusers maps from the "
            f"original {self.title} names): this format writes native {self.title} names"
        )
        stacked = {n for stack in self._native_stacks(names, where).values() for n, _, _ in stack}
        return _renamed([n for n in names if n not in stacked], self.native_name, where, lacking).__getitem__

    def _native_stacks(self, names: Sequence[str], where: str) -> dict[str, Stack]:
        """The native tensors a diffusers-named model's tensors stack into (its fused projections), each with
        its `Stack` of those tensors; `InputError` naming one a stack lacks."""
        if self.names is None or self.naming(names) != "diffusers":
            return {}
        present, stacks = set(names), {}
        for name in names:
            native = self.names.stacked_into(name)
            if native is None or native in stacks:
                continue
            stack = self.names.native_stack(native)
            lacking = next((n for n, _, _ in stack if n not in present), None)
            if lacking is not None:
                raise InputError(
                    f"{where}: tensor {lacking!r} is missing: {self.title}'s native {native!r} stacks it with "
                    f"{name!r}"
                )
            stacks[native] = stack
        return stacks

    def runnable_stacks(self, names: Sequence[str]) -> dict[str, Stack]:
        """Each native tensor of `names` that stacks several of the diffusers class's (a fused projection) ->
        its `Stack`: what a forward pass cuts it into."""
        if self.names is None:
            return {}
        return {n: stack for n in names if (stack := self.names.native_stack(n)) is not None}

    def runnable_names(self, names: Sequence[str], where: Path) -> dict[str, str]:
        """Native tensor name -> the diffusers class's parameter name, or `InputError` naming one it lacks; the
        stacked ones are left out (`runnable_stacks` says what they are cut into), and so are the carried ones
        (`carried`: no part of the class)."""
        if self.naming(names) != "native":
            raise InputError(
                f"{where}: config.json names {'/'.join(self.native_classes)} but the tensors do not have "
                f"{self.title}'s original names: a forward pass cannot run it"
            )
        lacking = (
            f"has no counterpart in diffusers' {self.diffusers_class} (a {self.title} variant it does not "
            "implement): this model cannot be run for a forward pass"
        )
        stacked = self.runnable_stacks(names)  # cut into the class's tensors instead (`runnable_stacks`)
        runs = [n for n in names if n not in stacked and not self.carried(n)]
        return _renamed(runs, self.diffusers_name, where, lacking)

    def why_no(self, fmt: str) -> str | None:
        """Why this family has no output in format `fmt`, in words (None: no such reason): what `convert --format`
        says of a layout with no bundled recipe of it (GGUF without an architecture; a native-named format from
        diffusers' layout, `diffusers_not_native_why`)."""
        from ..formats import format_info

        if fmt == "gguf" and self.gguf_architecture is None:
            return f"{self.title} has no GGUF architecture ({self.no_gguf_why})"
        if self.diffusers_not_native_why is not None and format_info(fmt).names == "native":
            return f"{self.title}'s {fmt} files are written from the original release only: {self.diffusers_not_native_why}"
        return None

    # --- running it ------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        """What one forward pass of `diffusers_class` takes."""
        raise NotImplementedError(f"{self.title}: no forward pass inputs")

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`diffusers_class`'s config for a native config.json (one of `native_classes`), what the config does not
        say read off the tensor shapes."""
        raise InputError(f"{where}: {self.title} has no original config this tool can run")

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The config.json of a release that ships none (`diffusers_class`'s, read off the tensor shapes): what a
        checkpoint converted from it is written with, so that it loads as that class. None: no such release."""
        return None

    # --- the card --------------------------------------------------------------------------------

    def pipeline_tag(self, config: dict) -> str | None:
        """The Hub pipeline tag of a model with this config (text-to-video, image-to-video), or None."""
        return None

    # --- examples --------------------------------------------------------------------------------

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """The models of an example checkpoint (`quantize example`), with the dimensions the runtimes fix."""
        raise InputError(f"{self.title} has no example checkpoints")

    def example_files(self) -> dict[str, str]:
        """Other files of an example release (relative path -> text): what sits beside the DiT (a tokenizer's
        config, say), which a recipe's `copy_other_files` copies."""
        return {}

    def example_lora(self, preset: str, layout: str, rank: int) -> list[tuple[str, tuple[int, ...], str]]:
        """(key, shape, dtype) of a LoRA for `example(preset, layout)`, as this family's LoRAs are written."""
        raise InputError(f"{self.title} has no example LoRA")


def _renamed(
    names: Sequence[str], rename: Callable[[str], str | None], where, lacking: str
) -> dict[str, str]:
    """Each of `names` -> its name under `rename`; `InputError` for the first it has none for (`lacking` says why)."""
    renamed = {}
    for name in names:
        new = rename(name)
        if new is None:
            raise InputError(f"{where}: tensor {name!r} {lacking}")
        renamed[name] = new
    return renamed
