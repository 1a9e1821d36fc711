"""The model card (`README.md`) every conversion writes: Hub metadata, what was done, how well, how to load it.

It is generated from the manifest (counts, sizes, error figures, recipe) and a few facts about the
source (model class, pipeline, the license of the source's own card: `CardFacts.of` the plan), with no timestamp, so two
conversions of the same source with the same recipe write the same card. The front matter is
rendered by huggingface_hub's `ModelCardData`, so the Hub reads it as it writes it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from ..formats import format_info
from ..formats.options import COMFY_RUNTIMES
from ..models import Family, diffusers_classes, family_of_class
from ..models.family import CardWords
from ..read.files import config_class
from ..steps import card_lines as step_card_lines
from .manifest import Manifest

if TYPE_CHECKING:
    from ..plan import Plan

__all__ = ["CardFacts", "pipeline_tag", "render_card"]


@dataclass
class CardFacts:
    """What the card says beyond the manifest."""

    classes: dict[str, str | None] = field(
        default_factory=dict
    )  # component -> the class its config.json names
    pipeline_tag: str | None = None
    base_model: str | None = None  # a Hub repo id
    source_metadata: dict = field(default_factory=dict)  # the front matter of the source's README.md
    model_files: list[str] = field(
        default_factory=list
    )  # the files holding the models, relative to the output
    family: Family | None = None  # the model family of the components (what ComfyUI and GGUF notes say)

    @classmethod
    def of(cls, plan: Plan, base_model: str | None, source_metadata: dict) -> CardFacts:
        """The facts of a conversion under `plan`: its components' classes, pipeline and family; `base_model`
        and the source card's front matter (`read.source.SourceFolder.card_metadata`) as given."""
        return cls(
            classes={cp.rel: config_class(cp.component.config) for cp in plan.components},
            pipeline_tag=pipeline_tag([cp.component.config for cp in plan.components]),
            base_model=base_model,
            source_metadata=source_metadata,
            family=next((cp.family for cp in plan.components if cp.family is not None), None),
        )


def pipeline_tag(configs: list[dict | None]) -> str | None:
    """text-to-video or image-to-video where each config's family says which (`Family.pipeline_tag`: a model_type, an image
    embedder), else None."""
    tags = set()
    for config in configs:
        family = family_of_class(config_class(config))
        tag = None if family is None else family.pipeline_tag(config)
        if tag is not None:
            tags.add(tag)
    return tags.pop() if len(tags) == 1 else None


def _metadata(manifest: Manifest, facts: CardFacts) -> str:
    from huggingface_hub import ModelCardData

    info = format_info(manifest.format)
    source = facts.source_metadata
    extra = {k: source[k] for k in ("license_name", "license_link") if isinstance(source.get(k), str)}
    data = ModelCardData(
        base_model=facts.base_model,
        base_model_relation="quantized" if facts.base_model else None,
        library_name=_model_library(manifest, facts),
        license=source.get("license") if isinstance(source.get("license"), str) else None,
        pipeline_tag=facts.pipeline_tag,
        tags=["quantized", info.tag, manifest.format.replace("_", "-"), info.layout_library, "dit-quantize"],
        **extra,
    )
    return data.to_yaml()


def _words(family: Family | None) -> CardWords:
    """What the card says of the model's family (a model of none: what it says of a transformer)."""
    return family.card if family is not None else CardWords()


def _model_library(manifest: Manifest, facts: CardFacts) -> str | None:
    """The library whose ``from_pretrained`` loads the output's models (diffusers; transformers for a text
    encoder), or None: not laid out as that library's models (a ComfyUI file is not, whatever its source)."""
    if not (format_info(manifest.format).diffusers_layout and facts.classes):
        return None
    if not all(c in diffusers_classes() for c in facts.classes.values()):
        return None
    libraries = {family_of_class(c).detection.library for c in facts.classes.values()}
    return libraries.pop() if len(libraries) == 1 else None


def _diffusers_layout(manifest: Manifest, facts: CardFacts) -> bool:
    return _model_library(manifest, facts) is not None


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**8 else f"{n / 1e6:.2f} MB"


def render_card(manifest: Manifest, facts: CardFacts) -> str:
    """The README.md text for a checkpoint described by `manifest`."""
    words = format_info(manifest.format).words
    card = _words(facts.family)
    title = f"{manifest.source['name']} ({manifest.format})"
    lines = ["---", _metadata(manifest, facts).rstrip(), "---", "", f"# {title}", ""]
    lines += [
        f"`{manifest.source['name']}` with its {card.weights} weights quantized offline to {words} by "
        f"dit-quantize {manifest.tool['version']}, recipe "
        f"`{manifest.recipe.name or manifest.recipe.origin}`. {card.kept}",
        "",
        "| component | model class | quantized Linears | other tensors | size before | size after |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for c in manifest.components:
        cls = facts.classes.get(c.path) or "-"
        lines.append(
            f"| `{c.path}` | {cls} | {c.quantized} | {c.kept} | {_gb(c.source_bytes)} | {_gb(c.output_bytes)} |"
        )
    lines += step_card_lines(manifest.steps)
    for rel in manifest.nested:
        lines += [
            "",
            f"`{rel}/` is quantized too: a checkpoint of its own beside these (its `README.md`, recipe and "
            "manifest), which `quantize verify .` checks with the rest.",
        ]
    lines += _calibration_section(manifest)
    lines += [
        "",
        *_quantized_section(manifest, facts.family),
        "",
        *_parity_section(manifest),
        "",
        *_loading_section(manifest, facts),
    ]
    lines += [
        "",
        "## Provenance",
        "",
        f"`quantize_manifest.json` records the tool and library versions ({_versions(manifest)}), the recipe "
        "(also in `recipe.yaml`) with its SHA-256, every source file and every file here with size and "
        "SHA-256, and each quantized tensor's error figures. `quantize verify .` checks all of it; with "
        "`--source` it also re-quantizes the source and compares bit for bit.",
        "",
    ]
    return "\n".join(lines)


def _calibration_section(manifest: Manifest) -> list[str]:
    """`convert --calibrate`: which layers hold a static input scale, from what, and what it measured."""
    cal = manifest.calibration
    if cal is None:
        return []

    def db(x: float | None) -> str:
        return "identical" if x is None else f"{x:.2f} dB"

    out = [
        "",
        "## Static input scales",
        "",
        f"{len(cal.tensors)} FP8/NVFP4 Linears hold an `input_scale` (float32): the amax of the layer's input in "
        f"one streamed forward pass of the source on `{cal.inputs.file}` (SHA-256 `{cal.inputs.sha256[:12]}…`), "
        "divided by the range of its encoding (448 for e4m3, 448·6 for NVFP4). ComfyUI quantizes each call's "
        "input with it instead of computing a scale; an input beyond that amax is clamped.",
        "",
        "| component | forward SQNR, inputs quantized with these scales | with a dynamic scale per call |",
        "|---|---:|---:|",
    ]
    out += [
        f"| `{rel}` | {db(f.static_sqnr_db)} | {db(f.dynamic_sqnr_db)} |" for rel, f in cal.forward.items()
    ]
    out += ["", f"(Measured against the source on `{cal.inputs.file}` itself.)"]
    return out + _smoothing_section(manifest)


#: the smoothed layers a card lists, by their gain
_CARD_SMOOTHED = 20


def _smoothing_section(manifest: Manifest) -> list[str]:
    """`convert --calibrate`'s smoothing: which NVFP4 layers hold a ``pre_quant_scale``, and both figures."""
    cal = manifest.calibration
    smoothed = {k: e.smoothing for k, e in cal.tensors.items() if e.smoothing is not None}
    if not smoothed:
        return []

    def db(x: float | None) -> str:
        return "exact" if x is None else f"{x:.2f} dB"

    def gain(item) -> float:
        s = item[1]
        return math.inf if s.smoothed_sqnr_db is None else s.smoothed_sqnr_db - (s.plain_sqnr_db or 0.0)

    out = [
        "",
        "### Smoothing",
        "",
        f"{len(smoothed)} NVFP4 Linears hold a `pre_quant_scale` (float32, one power of two per input channel): "
        "ComfyUI multiplies each call's input by it before the layer, which stores the weight divided by it "
        "(AWQ's rule, mean|x|^-alpha, as ModelOpt exports it). Each layer's alpha was chosen on its inputs in "
        f"`{cal.inputs.file}` by the layer's output error; a layer is smoothed only where that beats plain NVFP4.",
        "",
    ]
    for rel, plain in cal.unsmoothed_static_sqnr_db.items():
        out.append(
            f"Forward SQNR of `{rel}` with static scales: {db(cal.forward[rel].static_sqnr_db)} smoothed, "
            f"{db(plain)} without smoothing."
        )
    out += [
        "",
        "| layer | alpha | exponents | output SQNR, plain NVFP4 | smoothed |",
        "|---|---:|---:|---:|---:|",
    ]
    ranked = sorted(smoothed.items(), key=gain, reverse=True)
    out += [
        f"| `{key}` | {s.alpha:.2f} | {s.min_exponent}..{s.max_exponent} | {db(s.plain_sqnr_db)} | "
        f"{db(s.smoothed_sqnr_db)} |"
        for key, s in ranked[:_CARD_SMOOTHED]
    ]
    if len(ranked) > _CARD_SMOOTHED:
        out += ["", f"(The {_CARD_SMOOTHED} that gained most; every one is in `quantize_manifest.json`.)"]
    return out


def _quantized_section(manifest: Manifest, family: Family | None) -> list[str]:
    recipe = yaml.safe_load(manifest.recipe.text) or {}
    out = [
        "## What was quantized, and what was kept",
        "",
        "Linear weights matching the recipe's targets:",
        "",
    ]
    out += [f"- `{p}`" for p in recipe.get("targets", [])]
    if recipe.get("ignore"):
        out += ["", "except those matching:", "", *[f"- `{p}`" for p in recipe["ignore"]]]
    kept = sorted({k for c in manifest.components for k in c.kept_linears})
    out += [
        "",
        f"{len(kept)} Linear layers are kept in high precision (listed in each config.json's `quantization_config`), "
        f"as is {_words(family).kept_tensors}.",
    ]
    return out


def _parity_section(manifest: Manifest) -> list[str]:
    sqnr = [t.sqnr_db for t in manifest.tensors.values() if t.sqnr_db is not None]
    cosine = [t.cosine for t in manifest.tensors.values()]
    out = ["## Parity", ""]
    if not manifest.tensors:
        return [*out, "No tensor was quantized."]
    out += [
        "Each quantized weight, dequantized, against the source weight:",
        "",
        "| | min | median | max |",
        "|---|---:|---:|---:|",
    ]
    if sqnr:
        out.append(f"| SQNR (dB) | {min(sqnr):.2f} | {statistics.median(sqnr):.2f} | {max(sqnr):.2f} |")
    out.append(
        f"| cosine similarity | {min(cosine):.6f} | {statistics.median(cosine):.6f} | {max(cosine):.6f} |"
    )
    checks = (yaml.safe_load(manifest.recipe.text) or {}).get("checks") or {}
    if checks:
        set_checks = [f"`{k}: {v}`" for k, v in checks.items() if v is not None]
        if set_checks:
            out += ["", "Recipe checks (verify enforces them): " + ", ".join(set_checks) + "."]
    return out


def _loading_section(manifest: Manifest, facts: CardFacts) -> list[str]:
    comp = manifest.components[0].path if manifest.components else "."
    cls = facts.classes.get(comp) or "the model class"
    name = (
        "path/to/this-checkpoint"  # the card does not depend on where the output goes: same input, same bytes
    )
    folder = name if comp == "." else f"{name}/{comp}"
    out = ["## How to load", "", f"`{name}` below is this folder, or the Hub repo it was uploaded to.", ""]
    info = format_info(manifest.format)
    library = _model_library(manifest, facts)
    if info.diffusers_needs is not None and library is not None:
        needs = info.diffusers_needs
        sub = "" if comp == "." else f', subfolder="{comp}"'
        dtype = "torch_dtype" if library == "diffusers" else "dtype"
        out += [
            f"With {library} and {needs}:",
            "",
            "```python",
            "import torch",
            f"from {library} import {cls}",
            f'model = {cls}.from_pretrained("{name}"{sub}, {dtype}=torch.bfloat16)',
            "```",
            "",
        ]
    if info.card_note is not None:
        out += [info.card_note, ""]
    if "comfyui" in info.runs_in:
        out += _comfyui_section(facts.model_files, facts.family)
        out += _comfy_layouts(manifest)
    if "comfyui-gguf" in info.runs_in:
        out += _gguf_section(facts.model_files, manifest, facts.family)
    if "loaders" not in info.runs_in:
        return out
    family = facts.family
    # a family no library's class runs (`Detection.library` None: ComfyUI's alone) is built by the caller
    runs_as = family.diffusers_class if family is not None and family.detection.library else None
    if runs_as:  # the family's diffusers class takes either naming (the loader renames through the family)
        build = [f"from {facts.family.detection.library} import {runs_as}", ""]
        target = runs_as
    elif _diffusers_layout(manifest, facts):
        build = [f"from diffusers import {cls}", ""]
        target = cls
    else:  # not a diffusers class: the caller builds the model whose parameter names match
        if family is not None and family.detection.library is None:
            cls = f"ComfyUI's {family.diffusers_class}"
        build = [f"model = ...  # an instance of the model class the checkpoint came from ({cls})"]
        target = "model"
    out += [
        "With dit-quantize's loader (any of its formats, CPU or GPU, no bf16 copy of a quantized layer; blocks "
        "streamed to the GPU one at a time):",
        "",
        "```python",
        "import torch",
        "from loaders import enable_block_offload, load_quantized",
        *build,
        f'model = load_quantized({target}, "{folder}", host="mmap", dtype=torch.bfloat16)',
        'enable_block_offload(model, device="cuda", host="pinned")',
        "```",
    ]
    return out


def _comfyui_section(files: list[str], family: Family | None) -> list[str]:
    """Where each model file goes in ComfyUI, and the node that loads it."""
    title = family.title if family is not None else "the model"
    out = [
        f"In ComfyUI: {_words(family).comfyui}; the per-layer `comfy_quant` markers tell "
        f"ComfyUI the layout. Keys are {title}'s native names, one file per model:",
        "",
    ]
    out += [f"- `{f}`" for f in files]
    if len(files) > 1 and family is not None and family.card.experts_note:
        out += ["", family.card.experts_note]
    return [*out, ""]


def _comfy_layouts(manifest: Manifest) -> list[str]:
    """The ComfyUI layouts the file holds (one file may mix them), how many layers each, which ComfyUI reads
    them and where they run fast."""
    counts = Counter(t.type for t in manifest.tensors.values() if t.type in COMFY_RUNTIMES)
    out = ["| layout | layers | read by | fast on |", "|---|---|---|---|"]
    for layout, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        reader, fast = COMFY_RUNTIMES[layout]
        out.append(f"| `{layout}` | {n} | {reader} | {fast} |")
    note = "Elsewhere ComfyUI (and dit-quantize's loader) decode each layer's weight to the compute dtype at its call."
    return [*out, "", note, ""] if counts else []


def _gguf_section(files: list[str], manifest: Manifest, family: Family | None) -> list[str]:
    """Where each GGUF file goes in ComfyUI-GGUF, and how diffusers loads it (a diffusers family's)."""
    types = sorted({t.type for t in manifest.tensors.values() if t.type})
    title = family.title if family is not None else "the model"
    cls = family.diffusers_class if family is not None else "the model class"
    arch = family.plan.gguf_architecture if family is not None else None
    named = (
        f"llama.cpp's {arch} names"
        if family is not None and family.plan.gguf_names
        else f"{title}'s native names"
    )
    out = [
        f"One GGUF file per model (GGML types {', '.join(types)}; {named}; `general.architecture` {arch}):",
        "",
        *[f"- `{f}`" for f in files],
        "",
        f"In ComfyUI with ComfyUI-GGUF: {_words(family).comfyui_gguf}.",
        "",
    ]
    if family is not None and family.detection.library != "diffusers":
        return out
    out += [
        "In diffusers (`config`: a folder, local or a Hub repo, holding the diffusers config.json of the same "
        "model size and kind in `transformer/`; one call per file for two experts):",
        "",
        "```python",
        "import torch",
        f"from diffusers import GGUFQuantizationConfig, {cls}",
        f"model = {cls}.from_single_file(",
        f'    "path/to/this-checkpoint/{files[0] if files else "diffusion_model.gguf"}",',
        f'    config="path/to/the-diffusers-{title}-of-this-size",  # its transformer/config.json fits this file',
        '    subfolder="transformer",',
        "    quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16),",
        "    torch_dtype=torch.bfloat16,",
        ")",
        "```",
        "",
    ]
    return out


def _versions(manifest: Manifest) -> str:
    return ", ".join(f"{k} {v}" for k, v in manifest.libraries.items())
