"""The recipe schema: YAML that says which Linears of which components become which format.

A recipe is validated before any tensor is read; unknown keys are errors at every level.
Defaults are filled in one visible step (the field defaults below), so that
``load_recipe_text(dump_recipe(r)) == r``.

>>> r = parse_recipe("format: fp8_channel\\ntargets: ['blocks\\\\.\\\\d+\\\\.ffn\\\\.0']\\n")
>>> r.components, r.keep_dtype
(['.'], 'source')
"""

from __future__ import annotations

import difflib
import re
from pathlib import PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import InputError
from ..formats import FORMAT_INFO, FORMATS

__all__ = [
    "Recipe",
    "Checks",
    "LoadedRecipe",
    "parse_recipe",
    "dump_recipe",
    "recipe_yaml",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Checks(_Strict):
    """Thresholds that `quantize verify` enforces for every quantized tensor."""

    min_sqnr_db: float | None = None
    min_cosine: float | None = Field(default=None, ge=-1.0, le=1.0)
    min_forward_sqnr_db: float | None = None  # `verify --forward`; 20 dB when not set


_ONE_FORMAT = (
    "a recipe has one format, for every target of every component: diffusers and compressed-tensors load one "
    "quantization_config per model, so a model mixing formats would not load; for two formats, write two recipes"
)


class Recipe(_Strict):
    format: str
    targets: list[str] = Field(min_length=1)
    name: str | None = None
    description: str = ""
    components: list[str] = Field(default_factory=lambda: ["."], min_length=1)
    ignore: list[str] = Field(default_factory=list)
    keep_dtype: Literal["source", "bfloat16", "float32"] = "source"
    copy_other_files: bool = False
    checks: Checks = Field(default_factory=Checks)
    #: for a format with types (gguf's GGML types, the comfy formats' layouts): the type of every quantized tensor,
    #: unless one of `types` matches; each names the format's options for a tensor (`formats.options`), built and
    #: checked here. A comfy format's own first layout when left out.
    type: str | None = None
    #: pattern -> type, the first match deciding (an `_M` mix: Q4_K with Q6_K where it matters; a mixed ComfyUI
    #: file: nvfp4 with mxfp8 or int8 layers), or ``kept`` (as an `ignore` entry would)
    types: dict[str, str] = Field(default_factory=dict)

    @field_validator("format", mode="before")
    @classmethod
    def _one_format(cls, v: object) -> object:
        if isinstance(v, (list, dict)):
            raise ValueError(_ONE_FORMAT)
        return v

    @field_validator("targets", mode="before")
    @classmethod
    def _targets_without_formats(cls, v: object) -> object:
        if isinstance(v, dict):
            raise ValueError(f"a list of patterns, not a mapping: {_ONE_FORMAT}")
        return v

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v not in FORMATS:
            raise ValueError(f"unknown format {v!r} (known: {', '.join(sorted(FORMATS))})")
        return v

    @field_validator("ignore", mode="before")
    @classmethod
    def _empty_ignore(cls, v: object) -> object:
        return [] if v is None else v  # `ignore:` left empty in YAML

    @field_validator("targets", "ignore")
    @classmethod
    def _valid_patterns(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p:
                raise ValueError("empty pattern")
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"bad regular expression '{p}': {e}") from None
        if len(set(v)) != len(v):
            raise ValueError("a pattern is listed twice")
        return v

    @field_validator("components")
    @classmethod
    def _relative_components(cls, v: list[str]) -> list[str]:
        normalized = []
        for c in v:
            p = PurePosixPath(c)
            if not c or p.is_absolute() or ".." in p.parts or "\\" in c:
                raise ValueError(f"component {c!r} must be a subfolder of the source, or '.'")
            normalized.append(p.as_posix())  # "a/", "./a" -> "a"; "./" -> "."
        if len(set(normalized)) != len(normalized):
            raise ValueError("a component is listed twice")
        for a in normalized:
            for b in normalized:
                if a != b and (a == "." or PurePosixPath(b).is_relative_to(a)):
                    raise ValueError(f"component {b!r} lies inside component {a!r}")
        return normalized

    @model_validator(mode="after")
    def _types_fit_the_format(self) -> Recipe:
        info = FORMAT_INFO[self.format]
        options = info.options
        known = options.TYPES
        if not known:
            if self.type is not None or self.types:
                raise ValueError(
                    f"format {self.format} has one encoding: 'type' and 'types' are for gguf and the comfy formats"
                )
            return self
        try:
            if self.type is not None and self.type not in known:  # its own; `types` may name the others
                raise ValueError(self.type)
            options.from_type(self.type)
        except ValueError:
            if self.type is None:
                raise ValueError(f"format {self.format} needs 'type', one of {', '.join(known)}") from None
            raise ValueError(
                f"type: unknown {self.format} type {self.type!r} (known: {', '.join(known)})"
            ) from None
        if info.fixes_kept_dtypes and self.keep_dtype != "source":
            raise ValueError(
                f"format {self.format} decides what kept tensors become: keep_dtype must be 'source'"
            )
        accepted = options.accepted()
        for pattern, t in self.types.items():
            if t not in accepted:
                raise ValueError(
                    f"types['{pattern}']: unknown {self.format} type {t!r} (known: {', '.join(accepted)})"
                )
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"bad regular expression '{pattern}' in types: {e}") from None
        return self

    @model_validator(mode="after")
    def _target_not_ignored(self) -> Recipe:
        both = sorted(set(self.targets) & set(self.ignore))
        if both:
            raise ValueError(f"pattern '{both[0]}' is in both targets and ignore")
        return self


class LoadedRecipe(BaseModel):
    """A recipe with where it came from."""

    model_config = ConfigDict(frozen=True)
    recipe: Recipe
    origin: str  # a file path, or "bundled:NAME.yaml"


def _field_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "recipe"


def parse_recipe(text: str, origin: str = "recipe") -> Recipe:
    """Validate recipe YAML text; any problem is one `InputError` line naming the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise InputError(f"{origin}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError(f"{origin}: nested too deeply to be a recipe") from None
    if not isinstance(data, dict):
        raise InputError(f"{origin}: a recipe is a YAML mapping with at least 'format' and 'targets'")
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        # an unknown key explains a missing one (a typo), so it is reported first
        err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
        field = _field_path(err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(err["loc"])
            close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            msg = f"unknown key {field!r}{hint} (allowed: {', '.join(allowed)})"
        elif err["type"] == "too_short":
            msg = f"field {field!r} must list at least one entry"
        elif err["type"] == "missing":
            msg = f"missing required field {field!r}"
        else:
            text = err["msg"].removeprefix("Value error, ")
            msg = f"field {field!r}: {text}" if err["loc"] else text
        raise InputError(f"{origin}: {msg}") from None


def _allowed_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] = Checks if loc and loc[0] == "checks" and len(loc) > 1 else Recipe
    return list(model.model_fields)


def dump_recipe(recipe: Recipe) -> str:
    """The recipe as used, every default filled in, as YAML."""
    data = recipe.model_dump(mode="json")
    if recipe.type is None:  # only formats with types have them
        del data["type"]
    if not recipe.types:
        del data["types"]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


class _Literal(str):
    """A string YAML writes as a literal block (a description of several lines)."""


def _literal(dumper: yaml.SafeDumper, text: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")


class _RecipeDumper(yaml.SafeDumper):
    pass


_RecipeDumper.add_representer(_Literal, _literal)


def recipe_yaml(recipe: Recipe) -> str:
    """The recipe as a user reads and copies it: the fields it sets (defaults left out), the description as a
    block; it parses back to the same recipe (`parse_recipe`)."""
    data = recipe.model_dump(mode="json", exclude_defaults=True)
    order = ("name", "description", "format", "type", "components", "targets", "ignore", "types")
    data = {k: data[k] for k in (*order, *data) if k in data}
    if "description" in data:
        data["description"] = _Literal(data["description"].rstrip("\n") + "\n")
    return yaml.dump(data, Dumper=_RecipeDumper, sort_keys=False, allow_unicode=True, width=120)
