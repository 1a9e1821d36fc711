"""What an example checkpoint of a family is (`quantize example`): its models' tensor names and shapes, config.json
and file stems, at the dimensions the runtimes fix; random values are written by `quantize.examples`.

A family's examples are one `Examples` subclass in a module of this package, registered in `EXAMPLES`
(`models.examples`): its presets (sizes), its folder layouts, and the models of each. The family itself (its names,
detection, runtime) knows nothing of them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError
from ..family import Family

__all__ = ["ExampleModel", "Examples", "LoraTensor", "byte_fallback_pieces", "diffusers_example", "linear"]

#: one tensor of an example LoRA: (key, shape, dtype as safetensors spells it)
LoraTensor = tuple[str, tuple[int, ...], str]


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
    #: tensors of fixed bytes (uint8, 1-D) after the random ones: what a release holds that is data, not weights
    #: (a text encoder's tokenizer, ComfyUI's ``spiece_model``)
    fixed: Mapping[str, bytes] | None = None
    #: pattern (`re.search` on a tensor's name) -> (mean, std) of its random values, where a model's own
    #: initialization differs from the default (zero mean, 1/sqrt(fan-in) for a matrix, 1 for a vector): what
    #: keeps a random model's forward pass in the regime a trained one works in (T5's unscaled attention)
    init: Mapping[str, tuple[float, float]] | None = None
    #: one file whatever its size (a single-file release), not shards of `--max-shard-size`
    one_file: bool = False


class Examples(abc.ABC):
    """A family's example checkpoints: `presets` (``--preset``), `layouts` (``--layout``, the first the default)."""

    family: Family
    presets: Mapping[str, Any]
    layouts: tuple[str, ...]
    default_preset: str = "tiny"

    def shape(self, preset: str, layout: str) -> Any:
        """The preset's shape; `InputError` naming the family's presets and layouts for an unknown one."""
        if preset not in self.presets or layout not in self.layouts:
            raise InputError(
                f"{self.family.title} examples: preset {preset!r}, layout {layout!r}: presets "
                f"{', '.join(self.presets)}, layouts {', '.join(self.layouts)}"
            )
        return self.presets[preset]

    @abc.abstractmethod
    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """The models of an example checkpoint, with the dimensions the runtimes fix."""

    def files(self, layout: str) -> dict[str, str | bytes]:
        """Other files of an example release of `layout` (relative path -> text or bytes): what sits beside the
        model (a tokenizer, say), which a recipe's `copy_other_files` copies."""
        return {}

    def preset_files(self, preset: str, layout: str) -> dict[str, str | bytes]:
        """The other files of the `preset`'s example of `layout` (what `quantize example` writes beside the
        models): the layout's (`files`) unless a preset holds another model's (LTX-2.5's pipeline, its text
        encoder's tokenizer)."""
        return self.files(layout)

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        """(key, shape, dtype) of a LoRA for `models(preset, layout)`, as this family's LoRAs are written."""
        raise InputError(f"{self.family.title} has no example LoRA")


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def byte_fallback_pieces(specials: list[tuple[str, str]], size: int) -> list[tuple[str, float, int]]:
    """The pieces of an example SentencePiece tokenizer with byte fallback, as umT5's and Gemma's: `specials`
    ((piece, sentencepiece type name) in id order), the 256 byte pieces, then ``▁``, the letters and the digits
    alone and after ``▁``, and two-letter pieces, to `size` pieces at most (for `read.spiece.write_spiece`)."""
    from ...read.spiece import PIECE_TYPES

    pieces = [(piece, 0.0, PIECE_TYPES[kind]) for piece, kind in specials]
    pieces += [(f"<0x{b:02X}>", 0.0, PIECE_TYPES["BYTE"]) for b in range(256)]
    words = ["▁", *_LETTERS, *"0123456789", *(f"▁{c}" for c in _LETTERS)]
    words += [a + b for a in _LETTERS for b in _LETTERS]
    count = max(size - len(pieces), 0)
    return pieces + [(w, -1.0 - i / 100, PIECE_TYPES["NORMAL"]) for i, w in enumerate(words[:count])]


def linear(name: str, out: int, inp: int, bias: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    """A Linear's tensors: ``<name>.weight`` [out, inp] and, with `bias`, ``<name>.bias`` [out]."""
    specs = [(f"{name}.weight", (out, inp))]
    if bias:
        specs.append((f"{name}.bias", (out,)))
    return specs


def diffusers_example(
    family: Family, native: list[tuple[str, tuple[int, ...]]], config: dict
) -> ExampleModel:
    """A diffusers ``transformer/`` of `family`'s class for an original model (`native` tensors, `config`): the
    class built on meta from the config the family derives, its state dict's names and shapes."""
    import torch

    from ...read.checkpoint import TensorInfo

    diffusers = _diffusers(family)
    infos = {n: TensorInfo(n, "BF16", shape, Path("example"), 0, 0) for n, shape in native}
    built = family.diffusers_config(config, infos, Path("example"))
    with torch.device("meta"):
        model = getattr(diffusers, family.diffusers_class).from_config(built)
    tensors = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    return ExampleModel("transformer", tensors, {**built, **_extra(model.config, built)})


def _diffusers(family: Family):
    try:
        import diffusers
    except ImportError:
        raise InputError(
            f"{family.title} diffusers examples are built from diffusers' own class: pip install "
            "'dit-quantize[diffusers]'"
        ) from None
    return diffusers


def _extra(config, built: dict) -> dict:
    """What diffusers' config adds to the one we built (its defaults), so that config.json is the class's own."""
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in dict(config).items()
        if not k.startswith("_") and k not in built
    }
