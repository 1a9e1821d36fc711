"""`quantize_manifest.json`: what a checkpoint was made from, how, and what it holds.

Written last, at the output's root; it lists every other output file with its size and SHA-256,
so the manifest itself is the one file it does not list. It holds no timestamps and no absolute
paths: two conversions of the same source with the same recipe produce the same manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import InputError
from ..names import split_manifest_key
from ..read.files import MANIFEST_NAME, inside_checkpoint
from ..steps import RecordError

__all__ = [
    "FileEntry",
    "TensorEntry",
    "RecipeEntry",
    "CalibrationEntry",
    "SmoothingEntry",
    "Manifest",
    "read_manifest",
]

#: 1: the manifest as it always was; 2: with the recorded steps (`steps`); 3: with static input scales
#: (`calibration`); 4: with NVFP4 smoothing (a calibration's `smoothing` entries). A reader takes every version up to
#: `SCHEMA_VERSION`; a manifest without steps or calibration is written as version 1, byte for byte as before, one
#: without smoothing as the version before it.
SCHEMA_VERSION = 4
STEPS_SCHEMA_VERSION = 2
CALIBRATION_SCHEMA_VERSION = 3
SMOOTHING_SCHEMA_VERSION = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Strict):
    path: str  # relative to the checkpoint (or source) root, POSIX separators
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    _confined = field_validator("path")(inside_checkpoint)


class TensorEntry(_Strict):
    """One quantized tensor: where it came from and how far its dequantized value is from the source."""

    format: str
    shape: list[int]
    source_dtype: str
    pattern: str
    sqnr_db: float | None  # None when the error is exactly zero
    cosine: float
    max_abs_error: float
    type: str | None = (
        None  # the format's type for it (gguf's Q4_K, say); absent for formats with one encoding
    )


class RecipeEntry(_Strict):
    name: str | None
    origin: str
    sha256: str  # of recipe.yaml
    text: str


class InputsEntry(_Strict):
    """A file of forward-pass inputs (`--calibrate`, `--inputs`): its name (no folder), size and SHA-256."""

    file: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    _confined = field_validator("file")(inside_checkpoint)


class SmoothingEntry(_Strict):
    """One NVFP4 Linear's smoothing (``<m>.pre_quant_scale``, `run.calibrate`): AWQ's exponent chosen for it, the
    range of the powers of two its scale holds, and the layer's output SQNR on the calibration inputs, as plain
    NVFP4 and smoothed (None: exact)."""

    alpha: float = Field(ge=0, le=1)
    min_exponent: int
    max_exponent: int
    plain_sqnr_db: float | None
    smoothed_sqnr_db: float | None


class InputScaleEntry(_Strict):
    """One Linear's static input scale: the largest |x| of its input in the calibration pass (times its
    ``pre_quant_scale`` where it is smoothed), and the scale its format made of it (what ``<m>.input_scale``
    holds)."""

    input_amax: float = Field(ge=0, allow_inf_nan=False)
    input_scale: float = Field(gt=0, allow_inf_nan=False)
    #: the layer's smoothing; None: none (no ``pre_quant_scale``)
    smoothing: SmoothingEntry | None = None


class ForwardFigures(_Strict):
    """A component's forward SQNR against the source, its quantized Linears' inputs quantized as the runtime does:
    with a dynamic scale per call, and with the static scales (None: identical outputs)."""

    dynamic_sqnr_db: float | None
    static_sqnr_db: float | None


class CalibrationEntry(_Strict):
    """`convert --calibrate`: the inputs the source's streamed forward ran on, the statistic taken of each
    quantized Linear's input, the scales made of it, and the forward SQNRs measured with them on those inputs."""

    inputs: InputsEntry
    statistic: Literal["amax"] = "amax"
    tensors: dict[str, InputScaleEntry] = Field(
        description="keyed as `tensors`: the Linears that have a scale"
    )
    forward: dict[str, ForwardFigures] = Field(description="keyed by component")
    #: where some layer is smoothed: the component's forward SQNR with the static scales and no smoothing
    unsmoothed_static_sqnr_db: dict[str, float | None] = Field(default_factory=dict)


class ComponentEntry(_Strict):
    path: str  # "." for the root
    quantized: int
    kept: int
    kept_linears: list[str]
    source_bytes: int
    output_bytes: int

    _confined = field_validator("path")(inside_checkpoint)


class Manifest(_Strict):
    schema_version: int = 1
    tool: dict[str, str]
    libraries: dict[str, str]
    format: str
    recipe: RecipeEntry
    source: dict[str, str]  # {"name": basename or repo id}
    source_files: list[FileEntry]
    components: list[ComponentEntry]
    tensors: dict[str, TensorEntry] = Field(description="keyed by '<component>/<tensor name>'")
    output_files: list[FileEntry]
    #: the recorded per-tensor steps, in the order applied (`steps`: each a JSON object naming its kind)
    steps: list[dict[str, Any]] = Field(default_factory=list)
    #: the static input scales of `convert --calibrate`; None: every input scale is dynamic
    calibration: CalibrationEntry | None = None
    #: folders of this checkpoint that are checkpoints of their own, each with its manifest, recipe and card (a
    #: pipeline's text encoders converted beside its transformer: `convert(..., nested=...)`); their files are
    #: listed here too, and `verify` checks each against the source's folder of the same name
    nested: list[str] = Field(default_factory=list)

    _nested_inside = field_validator("nested")(lambda paths: [inside_checkpoint(p) for p in paths])

    @model_validator(mode="before")
    @classmethod
    def _legacy_loras(cls, data: Any) -> Any:
        """A manifest written before steps recorded themselves keeps its LoRAs in a top-level ``loras`` list: read
        as the LoRA step's record (its errors located in ``loras`` as the file has it)."""
        if isinstance(data, dict) and isinstance(data.get("loras"), list) and "steps" not in data:
            from ..steps import RecordError, check_records
            from ..steps.lora_record import from_legacy

            loras = data["loras"]
            steps = [from_legacy(loras)] if loras else []
            try:
                check_records(steps)
            except RecordError as e:
                raise RecordError(e.loc[1:], e.msg) from None  # (0, "loras", i, ...) -> ("loras", i, ...)
            data = {k: v for k, v in data.items() if k != "loras"}
            data["steps"] = steps
        return data

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"schema version {version} is newer than this dit-quantize reads ({SCHEMA_VERSION}): upgrade it"
            )
        return version

    @field_validator("steps")
    @classmethod
    def _steps_known(cls, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from ..steps import check_records

        check_records(steps)
        return steps

    @model_validator(mode="after")
    def _steps_schema(self) -> Manifest:
        """A manifest with recorded steps is of the version that has them."""
        if self.steps and self.schema_version < STEPS_SCHEMA_VERSION:
            self.schema_version = STEPS_SCHEMA_VERSION
        return self

    @model_validator(mode="after")
    def _calibration_schema(self) -> Manifest:
        """A manifest with input scales (and smoothing) is of the version that has them."""
        if self.calibration is not None and self.schema_version < CALIBRATION_SCHEMA_VERSION:
            self.schema_version = CALIBRATION_SCHEMA_VERSION
        smoothed = self.calibration is not None and any(
            e.smoothing is not None for e in self.calibration.tensors.values()
        )
        if smoothed and self.schema_version < SMOOTHING_SCHEMA_VERSION:  # a reader of 3 refuses its fields
            self.schema_version = SMOOTHING_SCHEMA_VERSION
        return self

    @model_validator(mode="after")
    def _tensor_keys(self) -> Manifest:
        components = [c.path for c in self.components]
        for key in self.tensors:
            try:
                split_manifest_key(key, components)
            except InputError as e:
                raise ValueError(str(e)) from None
        if self.calibration is not None:
            for key in self.calibration.tensors:
                if key not in self.tensors:
                    raise ValueError(f"calibration.tensors: {key!r} is not a quantized tensor of `tensors`")
            for rel in [*self.calibration.forward, *self.calibration.unsmoothed_static_sqnr_db]:
                if rel not in components:
                    raise ValueError(f"calibration.forward: {rel!r} is not a component")
        return self

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        for entry in data["tensors"].values():
            if entry["type"] is None:  # formats with one encoding: the manifest as it always was
                del entry["type"]
        if not data["steps"]:  # a conversion without recorded steps: the manifest as it always was
            del data["steps"]
        if data["calibration"] is None:  # every input scale dynamic: the manifest as it always was
            del data["calibration"]
        else:  # no layer smoothed: the calibration as it always was
            for entry in data["calibration"]["tensors"].values():
                if entry["smoothing"] is None:
                    del entry["smoothing"]
            if not data["calibration"]["unsmoothed_static_sqnr_db"]:
                del data["calibration"]["unsmoothed_static_sqnr_db"]
        if not data["nested"]:  # one model's checkpoint: the manifest as it always was
            del data["nested"]
        return json.dumps(data, indent=2, sort_keys=False) + "\n"


def read_manifest(checkpoint: Path) -> Manifest:
    path = Path(checkpoint) / MANIFEST_NAME
    try:
        return Manifest.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{path}: not found: is {checkpoint} a checkpoint written by `quantize convert`?"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        loc, msg = tuple(err["loc"]), err["msg"]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, RecordError):  # a step's record: where inside it, and what
            loc, msg = (*loc, *cause.loc), cause.msg
        raise InputError(f"{path}: invalid manifest at {'.'.join(map(str, loc))}: {msg}") from None
