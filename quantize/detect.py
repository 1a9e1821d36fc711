"""What a source folder holds, and the bundled recipe each format defaults to for it (`convert --format`).

A *layout* is a model family in one folder arrangement and naming, told from config.json and safetensors
headers alone (`detect_layouts`):

- ``wan``: Wan2.1/2.2 with the original names, one model at the root (T2V or I2V);
- ``wan2.2-a14b``: the two experts in ``high_noise_model/`` and ``low_noise_model/``, original names;
- ``lingbot-world``: the same folders, with LingBot-World's camera layers;
- ``wan-diffusers``: a diffusers ``transformer/`` (WanTransformer3DModel), or that folder itself;
- ``wan2.2-a14b-diffusers``: ``transformer/`` and ``transformer_2/``;
- ``kandinsky5``: a diffusers ``transformer/`` (Kandinsky5Transformer3DModel), or that folder itself.

`DEFAULT_RECIPES` names one bundled recipe per layout and format; variants (``wan-fp8-all``, the other
GGUF types) are chosen by name with ``--recipe``. `recipe_for_format` picks it, or explains in one line
why there is none (listing what there is).

>>> DEFAULT_RECIPES["wan2.2-a14b"]["fp8_channel"]
'wan2.2-a14b-fp8'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import Component, open_component
from .errors import InputError
from .formats import FORMAT_INFO
from .layout import bare_model_class, component_class
from .names import wan_naming

__all__ = ["SourceLayout", "DEFAULT_RECIPES", "detect_layouts", "recipe_for_format"]

#: layout -> format -> the bundled recipe `--format` takes
DEFAULT_RECIPES: dict[str, dict[str, str]] = {
    "wan": {
        "fp8_channel": "wan-fp8",
        "torchao_fp8": "wan-torchao-fp8",
        "nf4": "wan-nf4",
        "comfy_fp8": "wan-comfy-fp8",
        "comfy_int8": "wan-comfy-int8",
        "gguf": "wan-gguf-q8_0",
    },
    "wan2.2-a14b": {
        "fp8_channel": "wan2.2-a14b-fp8",
        "comfy_fp8": "wan2.2-a14b-comfy-fp8",
        "gguf": "wan2.2-a14b-gguf-q8_0",
    },
    "lingbot-world": {"fp8_channel": "lingbot-world-fp8", "nf4": "lingbot-world-nf4"},
    "wan-diffusers": {
        "fp8_channel": "wan-diffusers-fp8",
        "torchao_fp8": "wan-diffusers-torchao-fp8",
        "nf4": "wan-diffusers-nf4",
        "comfy_fp8": "wan-diffusers-comfy-fp8",
        "gguf": "wan-diffusers-gguf-q8_0",
    },
    "wan2.2-a14b-diffusers": {"fp8_channel": "wan2.2-a14b-diffusers-fp8"},
    "kandinsky5": {"torchao_fp8": "kandinsky5-torchao-fp8"},
}

_EXPERTS = ("high_noise_model", "low_noise_model")
_CAMERA_MARKS = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer1.")
_WAN_CLASS, _KANDINSKY_CLASS = "WanTransformer3DModel", "Kandinsky5Transformer3DModel"


@dataclass(frozen=True)
class SourceLayout:
    """One layout a source folder matches: its name (a key of `DEFAULT_RECIPES`) and why, in words."""

    name: str
    why: str  # e.g. "Wan2.2 A14B layout, original names, 2 experts"


def _open(folder: Path, rel: str) -> Component | None:
    """The component, or None where `rel` holds no readable one (no folder, no safetensors, loose files that
    form no model: detection looks, and the conversion reports what is wrong with the folder it converts)."""
    where = folder if rel == "." else folder / rel
    if not where.is_dir():
        return None
    try:
        return open_component(folder, rel)
    except InputError:
        return None


def _diffusers_class(comp: Component) -> str | None:
    cls = component_class(comp.dir)
    if cls in (_WAN_CLASS, _KANDINSKY_CLASS):
        return cls
    return _WAN_CLASS if wan_naming(comp.tensors) == "diffusers" else None


def _wan_kind(comp: Component) -> str:
    """T2V, I2V, TI2V, ...: the config's model_type, else told by the image embedder."""
    model_type = (comp.config or {}).get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type.upper()
    return "I2V" if any(n.startswith("img_emb.") for n in comp.tensors) else "T2V"


def detect_layouts(folder: Path) -> list[SourceLayout]:
    """Every layout `folder` matches, from config.json files and safetensors headers (usually one; none for a
    folder of another kind; more than one for a folder that holds two kinds of model)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: source directory not found")
    found = []
    experts = [_open(folder, rel) for rel in _EXPERTS]
    if all(c is not None and wan_naming(c.tensors) == "native" for c in experts):
        if any(n.startswith(_CAMERA_MARKS) for c in experts for n in c.tensors):
            found.append(
                SourceLayout(
                    "lingbot-world", "LingBot-World layout, original names, 2 experts with camera layers"
                )
            )
        else:
            found.append(SourceLayout("wan2.2-a14b", "Wan2.2 A14B layout, original names, 2 experts"))
    transformer = _open(folder, "transformer")
    if transformer is not None:
        cls = _diffusers_class(transformer)
        if cls == _KANDINSKY_CLASS:
            found.append(SourceLayout("kandinsky5", f"Kandinsky 5, diffusers layout ({cls} in transformer/)"))
        elif cls == _WAN_CLASS and _open(folder, "transformer_2") is not None:
            found.append(
                SourceLayout(
                    "wan2.2-a14b-diffusers",
                    "Wan2.2 A14B, diffusers layout, 2 experts (transformer, transformer_2)",
                )
            )
        elif cls == _WAN_CLASS:
            found.append(SourceLayout("wan-diffusers", f"Wan, diffusers layout ({cls} in transformer/)"))
    root = _open(folder, ".")
    if root is not None:
        bare = bare_model_class(folder)  # what the conversion takes as a bare component folder
        if wan_naming(root.tensors) == "native":
            kind = _wan_kind(root)
            found.append(SourceLayout("wan", f"Wan2.1/2.2 {kind}, original names, one model at the root"))
        elif bare == _KANDINSKY_CLASS:
            found.append(SourceLayout("kandinsky5", f"Kandinsky 5, a bare {bare} folder"))
        elif bare == _WAN_CLASS:
            found.append(SourceLayout("wan-diffusers", f"Wan, a bare {bare} folder (diffusers names)"))
    return found


def _layout_words(layouts: Sequence[SourceLayout]) -> str:
    return "; ".join(f"{lay.name} ({lay.why})" for lay in layouts)


def recipe_for_format(folder: Path, fmt: str) -> tuple[str, SourceLayout]:
    """The bundled recipe `--format fmt` takes for `folder`, and the layout that decided it.

    Raises `InputError` in one line: an unknown format, a folder of no known layout or of several, or no
    bundled recipe of that format for the layout (listing the recipes there are for it)."""
    if fmt not in FORMAT_INFO:
        raise InputError(f"--format {fmt!r} is not a format (formats: {', '.join(sorted(FORMAT_INFO))})")
    layouts = detect_layouts(folder)
    if not layouts:
        raise InputError(
            f"{folder}: no known layout (Wan with original names at the root or in high_noise_model/ and "
            "low_noise_model/, a diffusers transformer/ of Wan or Kandinsky 5, or such a folder itself): "
            "pick a recipe with --recipe (quantize recipes lists them)"
        )
    candidates = [(DEFAULT_RECIPES[lay.name].get(fmt), lay) for lay in layouts]
    chosen = [(r, lay) for r, lay in candidates if r is not None]
    if len(chosen) == 1:
        return chosen[0]
    if len(chosen) > 1:
        names = ", ".join(f"{r} ({lay.name})" for r, lay in chosen)
        raise InputError(
            f"{folder}: holds more than one kind of model ({_layout_words(layouts)}): candidates {names}; pick one with --recipe"
        )
    there = sorted({f"{r} ({f})" for lay in layouts for f, r in DEFAULT_RECIPES[lay.name].items()})
    raise InputError(
        f"{folder}: no bundled {fmt} recipe for {_layout_words(layouts)}; for this layout there are: "
        f"{', '.join(there)} (or write a recipe: quantize recipes NAME prints one to start from)"
    )
