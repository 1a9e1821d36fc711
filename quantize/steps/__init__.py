"""Per-tensor steps: what changes a source tensor's rows on the way in (LoRA merging), and how a step that
must be reproducible records itself in the manifest and is rebuilt from that record.

A step (`TensorStep`, given to `plan.make_plan` / `convert(steps=...)`) is told the resolved source
(`start`), gives each component's tensors their transforms (`transforms_for`), refuses what it never used
(`finish`), and returns its manifest record once the plan is made (`record`; None: nothing to record). A
record is a JSON object whose ``step`` names its kind; `RECORDS` maps each kind to the module that reads it:
its torch-free `StepRecord` (validation, the card's section, `inspect`'s lines) and, for verify, how the step
is rebuilt from it (`rebuild`). Converter, pipeline, verify and the card go through this module only: a new
recorded step is a module and a row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InputError

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo
    from ..read.source import SourceFolder
    from ..read.tensor_source import Transform

__all__ = [
    "TensorStep",
    "BaseStep",
    "check_order",
    "StepRecord",
    "Rebuilt",
    "RecordError",
    "RECORDS",
    "step_record",
    "check_records",
    "rebuild",
    "card_lines",
    "summary_lines",
]


class TensorStep(Protocol):
    """A per-tensor step given to the plan (a set of LoRAs, say); `BaseStep` gives the hooks a step may leave."""

    #: files the step reads (never copied into the output as the source's other files)
    inputs: Sequence[Path]
    #: whether it records itself in the manifest (verify rebuilds it and applies it before the steps it is
    #: given, so a conversion gives such steps first: the plan refuses another order)
    RECORDED: bool

    def start(self, source: SourceFolder) -> None:
        """Called once before any component is planned, with the source as resolved (its components as they
        lie: a bare component folder is the root)."""
        ...

    def transforms_for(self, component: str, tensors: Mapping[str, TensorInfo]) -> Mapping[str, Transform]:
        """The changes to apply to the source tensors of `component` (``.`` for the root), by tensor name;
        raise `InputError` for what cannot apply to them."""
        ...

    def finish(self) -> None:
        """Called once every component is planned: raise `InputError` for what matched nothing."""
        ...

    def record(self, sha256: Callable[[Path], str]) -> dict[str, Any] | None:
        """The manifest's record of this step (``{"step": KIND, ...}``), from the plan it took part in;
        `sha256(path)` hashes an input file. None: a step that verify need not rebuild."""
        ...


class BaseStep:
    """The defaults of a `TensorStep`: no input files, nothing to place or refuse, nothing recorded. A step
    subclasses it and gives `transforms_for`."""

    inputs: Sequence[Path] = ()
    RECORDED: bool = False

    def start(self, source: SourceFolder) -> None:
        return None

    def transforms_for(self, component: str, tensors: Mapping[str, TensorInfo]) -> Mapping[str, Transform]:
        raise NotImplementedError(f"{type(self).__name__}: a step gives transforms_for")

    def finish(self) -> None:
        return None

    def record(self, sha256: Callable[[Path], str]) -> dict[str, Any] | None:
        return None


def check_order(steps: Sequence[TensorStep]) -> None:
    """Steps that record themselves come first: verify rebuilds them from the manifest and applies them before
    the steps it is given, and float32 sums in another order are another model."""
    for before, after in zip(steps, steps[1:], strict=False):
        if after.RECORDED and not before.RECORDED:
            raise InputError(
                f"`steps`: {type(after).__name__} records itself in the manifest and comes after "
                f"{type(before).__name__}, which does not: give the recorded steps first (verify applies them "
                "first)",
                parameters=("steps",),
            )


class StepRecord(Protocol):
    """What is known of one kind of record without torch (the kind's record module provides it)."""

    KIND: str

    def validate(self, record: dict[str, Any]) -> None:
        """Raise `RecordError` saying where and what is wrong with `record` (a path that leaves the checkpoint)."""
        ...

    def card_lines(self, record: dict[str, Any]) -> list[str]:
        """The model card's section on this step."""
        ...

    def summary_lines(self, record: dict[str, Any]) -> list[str]:
        """One line per thing the step did, for `inspect`."""
        ...


class Rebuilt(Protocol):
    """A recorded step rebuilt by verify: the step, and the checks that it is the one the checkpoint records."""

    step: TensorStep

    def provenance(self, sha256: Callable[[Path], str]) -> list[tuple[str, bool, str]]:
        """(check, ok, failure message) that the inputs found are the recorded ones; `sha256` hashes a file."""
        ...

    def after_plan(self) -> list[tuple[str, str, bool, str]]:
        """(category, check, ok, failure message) once the source is planned with the step again."""
        ...


#: record kind -> (its torch-free record module, the module that rebuilds the step)
RECORDS: dict[str, tuple[str, str]] = {"lora": (f"{__name__}.lora_record", f"{__name__}.lora")}


class RecordError(ValueError):
    """A step record that is not valid: where in the record (`loc`, as pydantic spells locations) and what."""

    def __init__(self, loc: tuple, msg: str):
        super().__init__(f"{'.'.join(map(str, loc))}: {msg}")
        self.loc, self.msg = loc, msg


def _kind(record: dict[str, Any]) -> str:
    kind = record.get("step") if isinstance(record, dict) else None
    if not isinstance(kind, str) or kind not in RECORDS:
        raise InputError(f"manifest step {kind!r} is not a recorded step (known: {', '.join(RECORDS)})")
    return kind


def step_record(record: dict[str, Any]) -> StepRecord:
    """The record module of `record`'s kind (imports no torch)."""
    return importlib.import_module(RECORDS[_kind(record)][0]).RECORD


def check_records(records: Sequence[dict[str, Any]]) -> None:
    """Every record is of a known kind and valid; `RecordError` naming the first that is not, where (its index,
    then the place inside it) and what."""
    for i, record in enumerate(records):
        try:
            kind = step_record(record)
        except InputError as e:
            raise RecordError((i, "step"), str(e)) from None
        try:
            kind.validate(record)
        except RecordError as e:
            raise RecordError((i, *e.loc), e.msg) from None


def rebuild(
    record: dict[str, Any], source: Path, files: Sequence[Path], components: Sequence[str] | None
) -> Rebuilt:
    """The step `record` describes, rebuilt on `source` (its input files found among `files`, at the recorded
    place, or beside or inside the source), for `components` as the checkpoint lists them."""
    module = importlib.import_module(RECORDS[_kind(record)][1])
    return module.rebuild(record, source, files, components)


def card_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for record in records:
        out += ["", *step_record(record).card_lines(record)]
    return out


def summary_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    return [line for record in records for line in step_record(record).summary_lines(record)]
