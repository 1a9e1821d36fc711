"""A layout's quantization policy: what its bundled recipes quantize, what they keep and why, declared once.

A family declares one `Policy` per layout (`Family.policies`); `recipes.derive` makes the bundled recipe of every
(layout, format) from it and the format's own facts (`formats.FORMAT_INFO`: its checks, whether it scales blocks of
inputs, its type for sensitive layers), named ``<layout>-<format suffix>``. A new format or family writes no YAML.

>>> p = Policy(what="a DiT", targets=(r"blocks\\.\\d+\\.q",), quantized="q", kept="the rest")
>>> p.targets_for("fp8_channel", block_scaled=False)
('blocks\\\\.\\\\d+\\\\.q',)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Policy", "FormatTargets", "Refused"]


@dataclass(frozen=True)
class FormatTargets:
    """One format's own targets in a layout (a runtime's limit), and why, in words the description gives."""

    targets: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Refused:
    """Formats a layout has no bundled recipe of (beyond those its family has no file of), and why: by name, or by
    the role of names they write (``native``, ``gguf``: a diffusers model that has no release names)."""

    why: str
    formats: tuple[str, ...] = ()
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    """What the bundled recipes of one layout quantize and keep.

    `targets` is what every format quantizes; a format that scales each block of a row's inputs (nf4, MXFP8,
    NVFP4, GGUF) quantizes `block_targets` instead where given (the down projections whose GELU outliers a per-row
    scale spreads over a row). A format with a type for sensitive layers (NVFP4 -> MXFP8) stores `sensitive` in it.
    `exceptions` give a format its own targets; `checks` raise or lower a format's thresholds."""

    #: the layout in words: what a source of it holds ("Wan2.1/2.2 DiT (original key names, shards at the root)")
    what: str
    targets: tuple[str, ...]
    #: the quantized layers, in words (the description's "Quantized:")
    quantized: str
    #: what stays in high precision and why, in words (the description's "Kept:")
    kept: str
    #: the subfolders it converts; None: the source's root (the recipe leaves the field out)
    components: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    block_targets: tuple[str, ...] | None = None
    #: what `block_targets` adds, in words
    block_why: str = ""
    sensitive: tuple[str, ...] = ()
    sensitive_why: str = ""
    exceptions: Mapping[str, FormatTargets] = field(default_factory=dict)
    #: format -> thresholds that replace the format's own (`recipes.Checks` fields)
    checks: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    refused: tuple[Refused, ...] = ()
    #: a diffusers-layout output copies the source's other files (a pipeline's VAE, text encoder); off for a text
    #: encoder, whose pipeline's transformer would be copied unconverted
    copy_other_files: bool = True
    #: one more sentence for every recipe of the layout
    note: str = ""

    def targets_for(self, fmt: str, block_scaled: bool) -> tuple[str, ...]:
        """The patterns format `fmt` quantizes (`block_scaled`: it scales blocks of inputs)."""
        if fmt in self.exceptions:
            return self.exceptions[fmt].targets
        if block_scaled and self.block_targets is not None:
            return self.block_targets
        return self.targets

    def refusal(self, fmt: str, names: str) -> str | None:
        """Why the layout has no bundled recipe of format `fmt`, which writes names of role `names` (None: it has
        one, where its family has such files)."""
        return next((r.why for r in self.refused if fmt in r.formats or names in r.names), None)
