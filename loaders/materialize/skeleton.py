"""Step 1 of a load, the skeleton: the model class built from the checkpoint's config.json on the meta device.

An original release's config is made the diffusers class's by its family; another family's class, or a class of no
family for a checkpoint of one, is refused naming both, before anything is read.
"""

from __future__ import annotations

from torch import nn

from quantize.errors import InputError
from quantize.models import FAMILIES, Family, family_of
from quantize.models.meta import parameters_on_meta
from quantize.read.checkpoint import Component
from quantize.read.files import config_class

from .errors import CheckpointMismatchError


def _skeleton(cls: type[nn.Module], comp: Component, family: Family | None) -> nn.Module:
    config = {k: v for k, v in comp.config.items() if k != "quantization_config"}
    if family is not None:
        _check_class(cls, comp, family)
        if config_class(config) in family.native_classes and _is_class(cls, family.diffusers_class):
            config = family.diffusers_config(config, comp.tensors, comp.dir)
    try:
        with parameters_on_meta():
            if family is not None and cls.__name__ == family.diffusers_class:
                return family.build_model(config)  # its class as the family builds it (transformers' config)
            if hasattr(cls, "from_config"):
                return cls.from_config(config)
            return cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    except (TypeError, ValueError) as e:
        raise InputError(
            f"{comp.config_path}: cannot build {cls.__name__} from it ({e}): pass the model class the "
            "checkpoint was converted from, or an instance to fill"
        ) from None


def _is_class(cls: type, name: str) -> bool:
    """Whether `cls` is the class called `name`, or a subclass of it."""
    return any(c.__name__ == name for c in cls.__mro__)


def _check_names_of_no_family(model: nn.Module, comp: Component) -> None:
    """A checkpoint no family knows (by its config's class or its names) cannot be a known family's model."""
    own = family_of(None, model.state_dict().keys())
    if own is not None:
        cls = config_class(comp.config)
        known = ", ".join(f.title for f in FAMILIES)
        raise CheckpointMismatchError(
            f"{comp.dir}: its config names {cls!r} and its tensor names (e.g. {next(iter(comp.tensors))!r}) are "
            f"of no model family this tool knows ({known}); the model is a {own.title} model: is this the "
            "checkpoint converted from it?"
        )


def _check_class(cls: type, comp: Component, family: Family) -> None:
    """Refuse another family's diffusers class for this family's checkpoint, naming both."""
    for other in FAMILIES:
        if other is not family and _is_class(cls, other.diffusers_class):
            raise CheckpointMismatchError(
                f"{comp.dir}: a {family.title} checkpoint ({config_class(comp.config)}); {cls.__name__} "
                f"is a {other.title} model: pass {family.diffusers_class}"
            )
