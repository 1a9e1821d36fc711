"""Which folders of a checkpoint hold a model, their files opened (headers only), and the format each declares.

Before any model is built: a folder of several models (Wan2.2 A14B's experts) is told apart from one model's
folder, and a checkpoint whose format no module here runs is refused by name (`_runnable_format`).
"""

from __future__ import annotations

from pathlib import Path

from quantize.errors import InputError
from quantize.formats import Format, format_of_config
from quantize.read.checkpoint import CONFIG_NAME, Component, open_component
from quantize.read.files import read_json_object
from quantize.read.gguf import open_gguf_component

from ..modules import module_for

_MODEL_FILES = ("*.safetensors", "*.gguf")


def _holds_model(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in _MODEL_FILES)


def find_components(checkpoint: Path) -> list[Path]:
    """The model folders of a checkpoint: `checkpoint` itself when it holds a model's files (safetensors or
    GGUF), else each subfolder holding them and a config.json; of a pipeline's folders, only its quantized models
    (those whose config.json declares a `quantization_config`: Wan2.2 A14B's two experts, not its VAE)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        what = (
            "a file: pass the folder holding it and its config.json" if checkpoint.is_file() else "not found"
        )
        raise InputError(f"{checkpoint}: {what}")
    if _holds_model(checkpoint):
        return [checkpoint]
    found = sorted(
        d for d in checkpoint.iterdir() if d.is_dir() and _holds_model(d) and (d / CONFIG_NAME).is_file()
    )
    if not found:
        raise InputError(f"{checkpoint}: no *.safetensors or *.gguf here or in a model subfolder")
    quantized = [d for d in found if _declares_quantization(d / CONFIG_NAME)]
    return quantized or found  # none quantized: each is refused by name when it is loaded


def _declares_quantization(config: Path) -> bool:
    try:
        return "quantization_config" in read_json_object(config)
    except InputError:
        return True  # an unreadable config is named when the folder is loaded


def find_component(checkpoint: Path) -> Path:
    """The component directory: `checkpoint` itself when it holds a model's files, else its one model subfolder."""
    found = find_components(checkpoint)
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise InputError(
            f"{checkpoint}: holds several models ({names}): pass the one to load, e.g. {found[0]}, "
            "or a model class to load each"
        )
    return found[0]


def open_model_files(folder: Path) -> Component:
    """One model's folder read (headers only): its GGUF file (with its companion: a vision tower's mmproj), or its
    safetensors shards; never both."""
    gguf, safetensors = sorted(folder.glob("*.gguf")), sorted(folder.glob("*.safetensors"))
    if gguf and safetensors:
        raise InputError(
            f"{folder}: holds both {gguf[0].name} and {safetensors[0].name}: one model a folder (move one out)"
        )
    return open_gguf_component(folder) if gguf else open_component(folder)


def _runnable_format(comp: Component) -> Format:
    """The checkpoint's format, which a module here must run (else one line naming it, before anything is built)."""
    fmt = _checkpoint_format(comp)
    try:
        module_for(fmt)
    except InputError as e:
        raise InputError(f"{comp.dir}: {e}") from None
    return fmt


def _checkpoint_format(comp: Component) -> Format:
    where = comp.config_path
    if comp.config is None:
        raise InputError(f"{where}: not found: a checkpoint written by `quantize convert` has one")
    qc = comp.config.get("quantization_config")
    if qc is None:
        raise InputError(
            f"{where}: has no quantization_config: not a quantized checkpoint (convert it first)"
        )
    return format_of_config(qc, str(where))
