"""What every text-encoder family shares: transformers' class, run on token ids, found in a pipeline's
``text_encoder/``, in a bare folder of that class, or as one release file with no config.json.

A text encoder is a `TextEncoder` subclass that sets the parts (`Family`) and, of the hooks, its config read off a
release's shapes (`diffusers_config`) and where its token count lives (`token_inputs`); the layouts, the class
built from its config and a release's config come from here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..read.files import config_class
from .family import Family, ModelInputs, SourceLayout, count_blocks, lacking_in_blocks

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["TextEncoder", "token_inputs", "own_config", "complete_blocks"]

_KEYS = ("input_ids",)
#: a pass's random token ids: one sequence of this many
TOKENS = 16


def token_inputs(vocab_size: Callable[[dict], int], module: str = "", **call: object) -> ModelInputs:
    """A pass of a text encoder: ``input_ids`` (random ones below `vocab_size(config)`), the call's other keyword
    arguments `call`, on the submodule `module` ("": the whole model)."""

    def shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
        return {"input_ids": ((None, None),)}

    def random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
        import torch

        return {"input_ids": torch.randint(0, vocab_size(config), (1, TOKENS), generator=g)}

    return ModelInputs(
        keys=lambda config: _KEYS,
        shapes=shapes,
        random=random,
        call=lambda config, t: dict(t, return_dict=False, **call),
        accepts=_KEYS,
        module=module,
    )


def own_config(family: Family, config: dict, where: Path) -> dict:
    """The folder's own config, for a text model that ships in transformers' layout only, with its config (a
    language model alone: no release file to read one off); `InputError` naming the folder where there is none."""
    if not config:
        raise InputError(
            f"{where}: a {family.title} needs its config.json ({family.diffusers_class}'s): none here"
        )
    return dict(config)


def complete_blocks(
    family: Family, tensors: Collection[str], where: Path, counts: Mapping[str, int] | None = None
) -> None:
    """Every block of each of the family's lists of blocks (`names.Blocks`, by the class's names) holds what its
    block 0 holds, and each list `counts` names (its prefix -> its config's number of blocks) has that many blocks:
    `InputError` naming the first tensor a partial checkpoint lacks. A release's shapes say nothing of a block they
    were not read off, so a file without one of its tensors would convert to one its runtimes cannot fill."""
    names = list(tensors)
    for blocks in family.names.blocks if family.names is not None else ():
        prefix = f"{blocks.diffusers}."
        wanted = (counts or {}).get(blocks.diffusers)
        lacking = lacking_in_blocks(names, prefix, wanted)
        if lacking is not None:
            index = int(lacking.removeprefix(prefix).split(".", 1)[0])
            held = (
                "block 0 has" if index < count_blocks(names, prefix) else f"the config's {wanted} blocks need"
            )
            raise InputError(
                f"{where}: no tensor {lacking!r}, which {held}: a partial {family.title} checkpoint"
            )


class TextEncoder(Family):
    """A transformers text encoder (`Detection.library` ``transformers``)."""

    #: the ComfyUI INT8 files of an encoder are held to 25 dB per weight (a DiT's to 30): trained language
    #: models' rows hold outliers that one scale per row spreads
    recipe_checks = {"comfy_int8": {"min_sqnr_db": 25, "min_cosine": 0.998}}

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """A pipeline's ``text_encoder/`` (`Folders.encoder`) or a bare folder naming the class (`Folders.diffusers`);
        one file of its tensors with no config.json at the root (`Folders.release`): in its native names where it
        has them (`Detection.native_marks`), else in its own."""
        found, f, cls = [], self.folders, self.diffusers_class
        encoder = open_(f.encoder)
        if encoder is not None and config_class(encoder.config) == cls:
            found.append(
                self.layout(f"{self.title}, a pipeline's {f.encoder}/ ({cls})", f.diffusers, encoder=True)
            )
        root = open_(".")
        if root is not None:
            if config_class(root.config) == cls:
                found.append(
                    self.layout(
                        f"{self.title}, a bare {cls} folder (the names its checkpoints store)", f.diffusers
                    )
                )
            elif f.release is not None and not root.config and self._is_release_file(root.tensors):
                found.append(self.layout(f.release_why, f.release))
        return found

    def _is_release_file(self, names) -> bool:
        naming = self.naming(names)
        return naming == "native" if self.detection.native_marks else naming is not None

    def build_model(self, config: dict):
        """transformers' class (`Detection.diffusers_class`) of its own config class built from `config` (a copy:
        transformers' configs rewrite nested dicts, the rope parameters, in place)."""
        import transformers

        cls = getattr(transformers, self.diffusers_class)
        fields = {
            k: copy.deepcopy(v)
            for k, v in config.items()
            if k not in ("architectures", "model_type", "dtype")
        }
        return cls(cls.config_class(**fields))

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """A release file ships no config.json: what is converted from it is written with transformers' config
        read off its tensors (`diffusers_config`)."""
        return self.diffusers_config({}, tensors, where)
