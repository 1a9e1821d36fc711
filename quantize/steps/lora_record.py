"""The manifest's record of a LoRA merge (``{"step": "lora", "unmatched": ..., "loras": [...]}``), its card
section and its `inspect` lines: no torch here (the Hub code and `inspect` read manifests without it).

Manifests written before steps recorded themselves hold a top-level ``loras`` list; `from_legacy` reads it
as this record, so they still verify.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..read.files import inside_checkpoint

__all__ = ["KIND", "LoraEntry", "LoraRecord", "RECORD", "from_legacy"]

KIND = "lora"


class LoraEntry(BaseModel):
    """One LoRA merged into the source before quantizing (`convert --lora`), in the order applied."""

    model_config = ConfigDict(extra="forbid")

    file: str  # as given when a relative path inside the working directory, else its file name
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    strength: float
    component: str | None  # the one component it was given for; None: every component
    tensors: dict[str, int]  # component -> source tensors it changed
    ignored: dict[str, list[str]] = Field(
        default_factory=dict,
        description="component -> its keys that matched no tensor (--lora-unmatched ignore)",
    )

    _confined = field_validator("file")(inside_checkpoint)


class LoraRecord(BaseModel):
    """Every LoRA of one conversion, merged in this order."""

    model_config = ConfigDict(extra="forbid")

    step: Literal["lora"] = KIND
    unmatched: Literal["error", "ignore"] = (
        "error"  # what a key matching no tensor did (see `lora.UNMATCHED`)
    )
    loras: list[LoraEntry]


def from_legacy(loras: list) -> dict[str, Any]:
    """The record of a manifest's top-level ``loras`` list (written before steps recorded themselves)."""
    unmatched = "ignore" if any(isinstance(e, dict) and e.get("ignored") for e in loras) else "error"
    return {"step": KIND, "unmatched": unmatched, "loras": loras}


class _Record:
    KIND = KIND

    @staticmethod
    def parse(record: dict[str, Any]) -> LoraRecord:
        try:
            return LoraRecord.model_validate(record)
        except ValidationError as e:
            from . import RecordError

            err = e.errors()[0]
            raise RecordError(tuple(err["loc"]), err["msg"]) from None

    def validate(self, record: dict[str, Any]) -> None:
        self.parse(record)

    def card_lines(self, record: dict[str, Any]) -> list[str]:
        loras = self.parse(record).loras
        out = [
            "## LoRAs merged before quantizing",
            "",
            "Merged into the source weights in float32, in this order, then cast back to the source dtype and "
            "quantized (W' = W + strength·(alpha/rank)·up·down + strength·diff): no LoRA needs loading at run time.",
            "",
            "| LoRA | strength | component | tensors changed | SHA-256 |",
            "|---|---:|---|---:|---|",
        ]
        for lora in loras:
            out.append(
                f"| `{lora.file}` | {lora.strength:g} | {lora.component or 'all'} | {sum(lora.tensors.values())} "
                f"| `{lora.sha256[:16]}…` |"
            )
        for lora in loras:
            for component, keys in lora.ignored.items():
                out += [
                    "",
                    f"{len(keys)} keys of `{lora.file}` match no tensor of `{component}` and were skipped "
                    "(`--lora-unmatched ignore`):",
                    "",
                    *[f"- `{k}`" for k in keys],
                ]
        return out

    def summary_lines(self, record: dict[str, Any]) -> list[str]:
        out = []
        for lora in self.parse(record).loras:
            skipped = sum(len(keys) for keys in lora.ignored.values())
            out.append(
                f"merged LoRA {lora.file} (strength {lora.strength:g}) into {sum(lora.tensors.values())} tensors"
                + (f", skipped {skipped} keys that match no tensor" if skipped else "")
            )
        return out


RECORD = _Record()
