"""LoRAs merged into the source weights before quantizing (DESIGN.md "LoRAs merged before quantizing").

For each source tensor the LoRAs touch, the value the recipe converts is

    W' = cast_to_source_dtype(W.float() + Σ strength·(alpha/rank)·(up.float() @ down.float()) + Σ strength·diff.float())

summed in float32 in the order the LoRAs were given (within one LoRA: its up·down term, then its diff) and
cast once, so converting with `--lora` gives byte for byte what converting the merged model (merged in
float32, saved in the source dtype) gives. ``diff_b`` adds to the module's bias, ``diff_m`` to the block's
modulation table (whatever the family calls it in either naming: `models.modulation_names`).

Conventions read (`parse_key`): the prefixes `PREFIXES` or none; ``lora_down``/``lora_up``, ``lora_A``/
``lora_B`` (also with ``.default``); kohya / musubi-tuner module names (``lora_unet_blocks_0_self_attn_q``,
also ``lora_unet__...``); ``.alpha`` of any dtype (missing: alpha = rank); ``.diff``, ``.diff_b``,
``.diff_m``. A LoRA written for a family's diffusers names merges into a source with its original names and the
reverse, through the family's one name table (`models.lora_renamings`). LyCORIS (LoHa,
LoKr) and DoRA weights are refused naming the key.

Streaming: opening a LoRA reads its header and its alpha scalars only. While a tensor is converted, its
transform reads, per row chunk, the matching rows of ``up`` (or ``diff``) and the small ``down``
(rank × in): no LoRA is ever held whole in memory.

>>> LoraSpec.parse("high_noise_model=lightning-high.safetensors:0.8")
LoraSpec(path=PosixPath('lightning-high.safetensors'), strength=0.8, component='high_noise_model')
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import dtypes
from ..errors import InputError
from ..models import lora_prefixes, lora_renamings, modulation_names
from ..read.checkpoint import TensorInfo, read_header, read_rows, read_tensor
from ..read.files import relative_path_problem
from . import BaseStep
from .lora_record import LoraEntry, LoraRecord

if TYPE_CHECKING:
    from ..read.source import SourceFolder

__all__ = [
    "LoraSpec",
    "LoraFile",
    "LoraMerge",
    "UNMATCHED",
    "PREFIXES",
    "parse_key",
    "open_lora",
    "open_loras",
    "recorded_path",
    "find_recorded",
]

#: what `--lora-unmatched` takes: a LoRA key that matches no tensor is an error, or is skipped (and recorded)
UNMATCHED = ("error", "ignore")
#: prefixes LoRA keys carry in the wild, over every model family (stripped, any of them, in any order)
PREFIXES = lora_prefixes()
_KOHYA_PREFIX = "lora_unet_"
#: key ending -> role; the longest endings first
_ROLES = (
    (".lora_A.default.weight", "down"),
    (".lora_B.default.weight", "up"),
    (".lora_down.weight", "down"),
    (".lora_up.weight", "up"),
    (".lora_A.weight", "down"),
    (".lora_B.weight", "up"),
    (".alpha", "alpha"),
    (".diff_b", "diff_b"),
    (".diff_m", "diff_m"),
    (".diff", "diff"),
)
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_LYCORIS = re.compile(r"\.(hada_|lokr_|dora_scale$|lora_magnitude_vector)")
#: role -> the leaf of the source tensor it changes
_LEAF = {"down": "weight", "up": "weight", "diff": "weight", "diff_b": "bias", "diff_m": "modulation"}


# --- what the user asks for --------------------------------------------------------------------


@dataclass(frozen=True)
class LoraSpec:
    """One ``--lora`` argument: a file, its strength, and the one component it is for (None: every one)."""

    path: Path
    strength: float = 1.0
    component: str | None = None

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """``FILE``, ``FILE:STRENGTH``, ``COMPONENT=FILE`` or ``COMPONENT=FILE:STRENGTH``."""
        if Path(text).is_file():  # a file whose name holds ':' or '='
            return cls(Path(text))
        rest, strength = text, 1.0
        head, sep, tail = text.rpartition(":")
        if sep and head and "/" not in tail and not tail.endswith(".safetensors"):
            if not _NUMBER.fullmatch(tail):
                raise InputError(
                    f"`loras` {text!r}: strength {tail!r} is not a number (FILE[:STRENGTH], e.g. style.safetensors:0.8)",
                    parameters=("loras",),
                )
            strength, rest = float(tail), head
        if not math.isfinite(strength):
            raise InputError(f"`loras` {text!r}: strength must be a finite number", parameters=("loras",))
        component, sep, file = rest.partition("=")
        if not sep or "/" in component or not component or Path(rest).is_file():
            component, file = None, rest
        if not file:
            raise InputError(
                f"`loras` {text!r}: no file given (COMPONENT=FILE[:STRENGTH])", parameters=("loras",)
            )
        return cls(Path(file), strength, component)

    def __str__(self) -> str:
        where = f"{self.component}=" if self.component else ""
        return f"{where}{self.path}:{self.strength:g}"


# --- a LoRA file: keys grouped by module, checked, headers only ---------------------------------


def parse_key(key: str) -> tuple[str, bool, str] | None:
    """(module, is a kohya name, role) of a LoRA key, or None for a key of no known convention.

    >>> parse_key("diffusion_model.blocks.0.self_attn.q.lora_down.weight")
    ('blocks.0.self_attn.q', False, 'down')
    >>> parse_key("lora_unet__blocks_0_ffn_0.alpha")
    ('blocks_0_ffn_0', True, 'alpha')
    """
    name = key
    stripped = True
    while stripped:
        stripped = False
        for prefix in PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    for ending, role in _ROLES:
        if name.endswith(ending) and len(name) > len(ending):
            module = name[: -len(ending)]
            if module.startswith(_KOHYA_PREFIX):
                return module[len(_KOHYA_PREFIX) :].lstrip("_"), True, role
            return module, False, role
    return None


@dataclass
class _Module:
    """One module's tensors in a LoRA file."""

    name: str  # in the LoRA's naming, prefix and role removed (kohya's underscored form when `kohya`)
    kohya: bool
    parts: dict[str, TensorInfo] = field(default_factory=dict)  # role -> tensor
    alpha: float | None = None

    def key(self, role: str) -> str:
        return self.parts[role].name

    @property
    def rank(self) -> int:
        return self.parts["down"].shape[0]

    @property
    def scale(self) -> float:
        """alpha / rank (1 when the LoRA stores no alpha)."""
        return 1.0 if self.alpha is None else self.alpha / self.rank


@dataclass
class LoraFile:
    """An opened LoRA: its tensors grouped by module (headers and alphas read, nothing else)."""

    spec: LoraSpec
    size: int
    modules: list[_Module]

    @property
    def path(self) -> Path:
        return self.spec.path

    @property
    def keys(self) -> int:
        return sum(len(m.parts) + (m.alpha is not None) for m in self.modules)


def open_lora(spec: LoraSpec) -> LoraFile:
    """Read and check one LoRA file's header: every key of a known convention, every pair complete, every
    alpha a finite number. Raises `InputError` naming the file and the key."""
    path = spec.path
    if not path.is_file():
        raise InputError(f"{path}: LoRA file not found" if not path.exists() else f"{path}: not a file")
    header = read_header(path)
    if not header.tensors:
        raise InputError(f"{path}: the LoRA holds no tensors")
    modules: dict[tuple[str, bool], _Module] = {}
    alphas: dict[tuple[str, bool], TensorInfo] = {}
    for info in header.tensors.values():
        if _LYCORIS.search(info.name):
            raise InputError(
                f"{path}: key {info.name!r} is a LyCORIS (LoHa/LoKr) or DoRA weight: only LoRA "
                "(lora_down/lora_up, lora_A/lora_B) and .diff keys can be merged"
            )
        parsed = parse_key(info.name)
        if parsed is None:
            raise InputError(
                f"{path}: key {info.name!r} is not a LoRA key of a known convention "
                "(.lora_down/.lora_up/.lora_A/.lora_B.weight, .alpha, .diff, .diff_b, .diff_m)"
            )
        name, kohya, role = parsed
        if info.dtype not in dtypes.FLOAT_DTYPES and role != "alpha":
            raise InputError(
                f"{path}: key {info.name!r} is {info.dtype}; LoRA weights must be F32, F16 or BF16"
            )
        if role == "alpha":
            if (name, kohya) in alphas:
                raise InputError(
                    f"{path}: keys {alphas[(name, kohya)].name!r} and {info.name!r} are the same alpha of module {name!r}"
                )
            alphas[(name, kohya)] = info
            continue
        module = modules.setdefault((name, kohya), _Module(name, kohya))
        if role in module.parts:
            raise InputError(
                f"{path}: keys {module.key(role)!r} and {info.name!r} are the same {role} weight of module {name!r}"
            )
        module.parts[role] = info
    for where, info in alphas.items():
        if where not in modules or "down" not in modules[where].parts:
            raise InputError(
                f"{path}: key {info.name!r} is an alpha for a module with no lora_down/lora_up pair"
            )
        modules[where].alpha = _alpha(path, info)
    for module in modules.values():
        _check_pair(path, module)
    return LoraFile(spec, path.stat().st_size, list(modules.values()))


def open_loras(
    specs: Sequence[LoraSpec | str],
    unmatched: str = "error",
    components: Sequence[str] | None = None,
) -> LoraMerge:
    """The merge of `specs` (or their ``[COMPONENT=]FILE[:STRENGTH]`` texts), every file opened and checked:
    what `convert --lora` and `plan --lora` apply. `components`: the recipe's (a LoRA for another is refused
    at once; `LoraMerge.start` then places them where the source holds them)."""
    specs = [s if isinstance(s, LoraSpec) else LoraSpec.parse(str(s)) for s in specs]
    for spec in specs:
        problem = relative_path_problem(recorded_path(spec.path))
        if problem is not None:
            raise InputError(
                f"`loras` {spec}: the file name {problem}, so the manifest cannot record it: rename it",
                parameters=("loras",),
            )
    return LoraMerge([open_lora(s) for s in specs], unmatched, components)


def _alpha(path: Path, info: TensorInfo) -> float:
    if info.numel != 1:
        raise InputError(f"{path}: key {info.name!r} holds {list(info.shape)} values; an alpha is one number")
    value = float(read_tensor(info).reshape(()).item())  # any dtype: the Lightning LoRAs store int64
    if not math.isfinite(value):
        raise InputError(f"{path}: key {info.name!r} is {value}; an alpha must be a finite number")
    return value


def _check_pair(path: Path, module: _Module) -> None:
    down, up = module.parts.get("down"), module.parts.get("up")
    if (down is None) != (up is None):
        have, missing = ("down", "up") if up is None else ("up", "down")
        raise InputError(
            f"{path}: key {module.key(have)!r} has no matching lora_{missing} weight for module {module.name!r}"
        )
    if down is None:
        return
    if len(down.shape) < 2 or len(up.shape) < 2 or down.shape[0] == 0 or up.shape[1] != down.shape[0]:
        raise InputError(
            f"{path}: module {module.name!r}: lora_up {list(up.shape)} and lora_down {list(down.shape)} do not "
            "make a low-rank product (up is [out, rank], down is [rank, in])"
        )
    if math.prod(up.shape[2:]) != 1:
        raise InputError(f"{path}: key {up.name!r} {list(up.shape)}: a lora_up must be [out, rank]")


# --- the arithmetic, row range by row range ----------------------------------------------------


@dataclass(frozen=True)
class _LowRank:
    """strength·(alpha/rank)·(up @ down) for rows [r0, r1)."""

    up: TensorInfo
    down: TensorInfo
    scale: float

    def add_to(self, acc: torch.Tensor, r0: int, r1: int, rows: int) -> None:
        # A one-row product takes another BLAS path (gemv) than the whole matrix does and may round
        # differently: a lone row is computed as part of two, so every chunking gives the same bits.
        a0 = r0 if r1 - r0 > 1 or rows < 2 else min(r0, rows - 2)
        a1 = max(r1, a0 + 2) if rows >= 2 else r1
        up = read_rows(self.up, a0, a1).float().reshape(a1 - a0, -1)
        down = read_tensor(self.down).float().reshape(self.down.shape[0], -1)
        acc += (up @ down)[r0 - a0 : r1 - a0].mul_(self.scale).reshape(acc.shape)


@dataclass(frozen=True)
class _Diff:
    """strength·diff for rows [r0, r1)."""

    diff: TensorInfo
    strength: float

    def add_to(self, acc: torch.Tensor, r0: int, r1: int, rows: int) -> None:
        acc += read_rows(self.diff, r0, r1).float().mul_(self.strength).reshape(acc.shape)


@dataclass(frozen=True)
class _Merge:
    """Every LoRA term of one source tensor, added in float32 in order, cast back once (a `source.Transform`)."""

    label: str
    terms: tuple[_LowRank | _Diff, ...]
    rows: int

    def apply(self, rows: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        acc = rows.to(torch.float32, copy=True)
        for term in self.terms:
            term.add_to(acc, r0, r1, self.rows)
        return acc.to(rows.dtype)


# --- matching a LoRA's names to a component's tensors ------------------------------------------

Rename = Callable[[str], "str | None"]
#: how a LoRA's names may relate to the source's: the same naming, or a family's diffusers names on its native
#: names and the reverse
_NAMINGS: tuple[tuple[str, Rename], ...] = (("the source's names", lambda name: name), *lora_renamings())
#: the names a block's modulation table has (``diff_m`` adds to it), over every family and naming
_MODULATION_ALIASES = modulation_names()


@dataclass(frozen=True)
class _Target:
    """One source tensor a module of a LoRA changes, in the LoRA's naming."""

    module: _Module
    leaf: str  # weight, bias, modulation
    roles: tuple[str, ...]  # ("down", "up") and/or ("diff",); ("diff_b",); ("diff_m",)

    @property
    def keys(self) -> list[str]:
        return [self.module.key(r) for r in self.roles]


def _targets(lora: LoraFile) -> list[_Target]:
    out = []
    for m in lora.modules:
        by_leaf: dict[str, list[str]] = {}
        for role in m.parts:
            by_leaf.setdefault(_LEAF[role], []).append(role)
        out += [_Target(m, leaf, tuple(roles)) for leaf, roles in by_leaf.items()]
    return out


def _kohya_modules(tensors: Mapping[str, TensorInfo]) -> dict[str, str | None]:
    """kohya's underscored module name -> the dotted one, for every module of the component in any naming
    (None where two dotted names share an underscored form)."""
    found: dict[str, str | None] = {}
    for name in tensors:
        for _, rename in _NAMINGS:
            other = rename(name)
            if other is None or "." not in other:
                continue
            dotted = other.rsplit(".", 1)[0]
            key = dotted.replace(".", "_")
            found[key] = dotted if found.get(key, dotted) == dotted else None
    return found


def _source_name(
    target: _Target, kohya: Mapping[str, str | None], rename: Rename, tensors: Mapping[str, TensorInfo]
) -> str | None:
    """The source tensor `target` changes under naming `rename`, or None when it is not in `tensors`."""
    module = target.module.name
    if target.module.kohya:
        module = kohya.get(module)
        if module is None:
            return None
    leaves = _MODULATION_ALIASES if target.leaf == "modulation" else (target.leaf,)
    for leaf in leaves:
        renamed = rename(f"{module}.{leaf}" if module else leaf)
        if renamed in tensors:
            return renamed
    return None


@dataclass
class _Resolved:
    """One LoRA on one component: the source tensor each target changes, and the targets matching nothing."""

    matched: dict[str, list[_Target]]  # source tensor name -> targets
    unmatched: list[_Target]


def _resolve(lora: LoraFile, tensors: Mapping[str, TensorInfo]) -> _Resolved:
    """Match with the naming that matches the most targets (the source's own first)."""
    targets = _targets(lora)
    kohya = _kohya_modules(tensors)
    best: _Resolved | None = None
    for _, rename in _NAMINGS:
        matched: dict[str, list[_Target]] = {}
        unmatched = []
        for t in targets:
            name = _source_name(t, kohya, rename, tensors)
            if name is None:
                unmatched.append(t)
            else:
                matched.setdefault(name, []).append(t)
        if best is None or len(unmatched) < len(best.unmatched):
            best = _Resolved(matched, unmatched)
    return best


def _terms(lora: LoraFile, target: _Target, info: TensorInfo, where: str) -> list[_LowRank | _Diff]:
    """The terms of `target` on source tensor `info`, shapes checked."""
    m, strength, terms = target.module, lora.spec.strength, []
    shape = list(info.shape)
    if "down" in target.roles:
        up, down = m.parts["up"], m.parts["down"]
        fits = len(info.shape) >= 2 and up.shape[0] == info.shape[0]
        fits = fits and math.prod(down.shape[1:]) == math.prod(info.shape[1:])
        if not fits:
            raise InputError(
                f"{lora.path}: keys {up.name!r} {list(up.shape)} and {down.name!r} {list(down.shape)} do not fit "
                f"tensor {info.name!r} {shape} of {where}: is the LoRA made for this model?"
            )
        terms.append(_LowRank(up, down, strength * m.scale))
    for role in ("diff", "diff_b", "diff_m"):
        if role in target.roles:
            diff = m.parts[role]
            if list(diff.shape) != shape:
                raise InputError(
                    f"{lora.path}: key {diff.name!r} {list(diff.shape)} does not fit tensor {info.name!r} {shape} "
                    f"of {where}: is the LoRA made for this model?"
                )
            terms.append(_Diff(diff, strength))
    return terms


# --- the step the plan applies -----------------------------------------------------------------


@dataclass
class LoraMerge(BaseStep):
    """The LoRAs of one conversion, merged in order: a `steps.TensorStep` that records itself.

    After planning, `touched[i]` holds, per component, how many source tensors LoRA i changes, and
    `ignored[i]` the keys it skipped per component (with `unmatched="ignore"`).
    """

    RECORDED = True

    loras: list[LoraFile]
    unmatched: str = "error"
    components: Sequence[str] | None = None  # the recipe's: a LoRA for another component is refused at once
    touched: list[dict[str, int]] = field(init=False)
    ignored: list[dict[str, list[str]]] = field(init=False)

    @property
    def inputs(self) -> list[Path]:
        return [lora.path for lora in self.loras]

    def __post_init__(self) -> None:
        if self.unmatched not in UNMATCHED:
            raise InputError(
                f"`lora_unmatched` must be one of {', '.join(UNMATCHED)}, got {self.unmatched!r}",
                parameters=("lora_unmatched",),
            )
        self.loras = list(self.loras)
        self.touched = [{} for _ in self.loras]
        self.ignored = [{} for _ in self.loras]
        if self.components is not None:
            for lora in self.loras:
                self._check_component(lora, self.components)

    @staticmethod
    def _check_component(lora: LoraFile, components: Sequence[str]) -> None:
        if lora.spec.component is not None and lora.spec.component not in components:
            raise InputError(
                f"`loras` {lora.spec}: component {lora.spec.component!r} is not one the recipe converts "
                f"({', '.join(components)})",
                parameters=("loras",),
            )

    def transforms_for(self, component: str, tensors: Mapping[str, TensorInfo]) -> dict[str, _Merge]:
        where = "the model" if component == "." else f"component {component!r}"
        terms: dict[str, list] = {}
        labels: dict[str, list[str]] = {}
        for i, lora in enumerate(self.loras):
            if lora.spec.component not in (None, component):
                continue
            resolved = _resolve(lora, tensors)
            self.ignored[i].pop(component, None)  # planned again (verify): counted afresh
            if resolved.unmatched:
                if self.unmatched == "error" or not resolved.matched:
                    raise InputError(
                        _unmatched_message(lora, resolved, tensors, where), parameters=("lora_unmatched",)
                    )
                self.ignored[i][component] = sorted(k for t in resolved.unmatched for k in t.keys)
            for name, targets in resolved.matched.items():
                if len(targets) > 1:
                    a, b = targets[0].keys[0], targets[1].keys[0]
                    raise InputError(
                        f"{lora.path}: keys {a!r} and {b!r} both change tensor {name!r} of {where}"
                    )
                terms.setdefault(name, []).extend(_terms(lora, targets[0], tensors[name], where))
                labels.setdefault(name, []).append(lora.path.name)
            self.touched[i][component] = len(resolved.matched)
        return {
            name: _Merge(f"LoRA {' + '.join(labels[name])}", tuple(ts), _rows(tensors[name]))
            for name, ts in terms.items()
        }

    def start(self, source: SourceFolder) -> None:
        """Before planning: a LoRA given for the component a bare source folder is (a ``transformer/`` converted
        as the root) is for the root."""
        if source.bare:
            for i, lora in enumerate(self.loras):
                if lora.spec.component is not None:
                    spec = dataclasses.replace(lora.spec, component=source.where(lora.spec.component))
                    self.loras[i] = dataclasses.replace(lora, spec=spec)
            self.components = source.components

    def record(self, sha256: Callable[[Path], str]) -> dict:
        """The manifest's record (`steps.lora_record.LoraRecord`): each LoRA in order, with what it changed."""
        entries = [
            LoraEntry(
                file=recorded_path(lora.path),
                size=lora.size,
                sha256=sha256(lora.path),
                strength=lora.spec.strength,
                component=lora.spec.component,
                tensors=touched,
                ignored=ignored,
            )
            for lora, touched, ignored in zip(self.loras, self.touched, self.ignored, strict=True)
        ]
        return LoraRecord(unmatched=self.unmatched, loras=entries).model_dump(mode="json")

    def finish(self) -> None:
        """A LoRA for one component that no planned component was (only without `components`)."""
        for lora, touched in zip(self.loras, self.touched, strict=True):
            if lora.spec.component is not None and not touched:
                raise InputError(
                    f"`loras` {lora.spec}: component {lora.spec.component!r} was not converted",
                    parameters=("loras",),
                )


def _rows(info: TensorInfo) -> int:
    return info.shape[0] if info.shape else 1


def _unmatched_message(
    lora: LoraFile, resolved: _Resolved, tensors: Mapping[str, TensorInfo], where: str
) -> str:
    key, first = min((k, t) for t in resolved.unmatched for k in t.keys)
    close = difflib.get_close_matches(f"{first.module.name}.{first.leaf}", list(tensors), n=1, cutoff=0.0)
    more = sum(len(t.keys) for t in resolved.unmatched) - 1
    if not resolved.matched:
        return (
            f"{lora.path}: none of its keys matches a tensor of {where} (e.g. {key!r}; closest tensor: "
            f"{close[0]!r}): is the LoRA made for this model?"
        )
    return (
        f"{lora.path}: key {key!r} matches no tensor of {where} (closest: {close[0]!r}"
        f"{f'; {more} more keys match nothing' if more else ''}): is the LoRA made for this model? "
        "(`lora_unmatched` ignore skips such keys, and the manifest lists them)"
    )


# --- provenance: where the manifest says a LoRA was, and finding it again ---------------------


def recorded_path(path: Path) -> str:
    """How the manifest records a LoRA's place: as given when a relative path inside the working directory,
    else its file name only (no absolute paths, nothing of the converting machine's layout)."""
    path = Path(path)
    if path.is_absolute() or ".." in path.parts:
        return path.name
    return path.as_posix()


def find_recorded(file: str, sha256: str, given: Mapping[Path, str], places: Sequence[Path]) -> Path:
    """The LoRA the manifest records as `file` with `sha256`: one of `given` (path -> its SHA-256) that matches,
    else the recorded path (relative to the working directory), else its file name in each of `places`.
    Raises `InputError` when it is in none of them."""
    for path, digest in given.items():
        if digest == sha256:
            return Path(path)
    candidates = [Path(file), *(Path(p) / Path(file).name for p in places)]
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise InputError(
        f"LoRA {file!r} the checkpoint was made with is not at {looked}"
        + (" and no `step_files` given has its SHA-256" if given else "")
        + ": give it with `step_files` FILE",
        parameters=("step_files",),
    )


# --- verify: the merge rebuilt from the manifest's record -------------------------------------


@dataclass
class _Rebuilt:
    """The LoRAs a checkpoint records, found again and opened as the conversion applied them (`steps.Rebuilt`)."""

    step: LoraMerge
    record: LoraRecord
    paths: list[Path]

    def provenance(self, sha256: Callable[[Path], str]) -> list[tuple[str, bool, str]]:
        """The LoRAs re-applied are the ones the checkpoint was made with."""
        out = []
        for entry, path in zip(self.record.loras, self.paths, strict=True):
            ok = sha256(path) == entry.sha256
            failure = (
                "" if ok else f"{path}: SHA-256 differs from that of LoRA {entry.file!r} in the manifest"
            )
            out.append(("LoRA sha256", ok, failure))
        return out

    def after_plan(self) -> list[tuple[str, str, bool, str]]:
        """Each LoRA changed the tensors, and skipped the keys, that the manifest says."""
        out = []
        for entry, touched, ignored in zip(
            self.record.loras, self.step.touched, self.step.ignored, strict=True
        ):
            ok = touched == entry.tensors and ignored == entry.ignored
            failure = (
                ""
                if ok
                else f"LoRA {entry.file!r}: changes {touched} tensors and skips {ignored} keys now; the manifest "
                f"says {entry.tensors} and {entry.ignored}"
            )
            out.append(("parity", "LoRAs", ok, failure))
        return out


def rebuild(record: dict, source: Path, files: Sequence[Path], components: Sequence[str] | None) -> _Rebuilt:
    """The merge `record` describes: each LoRA found (one of `files` with its SHA-256, the recorded path, or its
    name beside or inside `source`) and opened with the recorded strength, component and unmatched policy."""
    from ..read.hashing import sha256_file

    rec = LoraRecord.model_validate(record)
    hashes = {Path(path): sha256_file(Path(path)) for path in files}
    paths = [find_recorded(e.file, e.sha256, hashes, [source, source.parent]) for e in rec.loras]
    specs = [LoraSpec(p, e.strength, e.component) for p, e in zip(paths, rec.loras, strict=True)]
    return _Rebuilt(LoraMerge([open_lora(s) for s in specs], rec.unmatched, components), rec, paths)
