"""Converted checkpoints of tiny diffusers models in every format, made once per session with the CLI, and
the checkpoint's tensors read back by the formats' own readers (safetensors, gguf-py), under the model's names."""

from __future__ import annotations

from pathlib import Path

import diffusers  # noqa: F401  (a dev dependency: missing, the loaders' tests must fail, not skip)
import gguf
import numpy as np
import pytest
import torch

from loaders.modules import QuantizedLinear
from quantize.models import get_family
from quantize.recipes import bundled_text, default_recipes
from tests import diffusers_models as models
from tests.conftest import load_all, run_cli

#: the formats written in the source's own names (diffusers layout: sharded safetensors)
SOURCE_NAMED = ["fp8_channel", "torchao_fp8", "torchao_int8", "nf4"]
#: the formats written as one file in the family's native names (ComfyUI's safetensors, GGUF)
NATIVE_NAMED = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "comfy_w4a4", "comfy_w4a8", "gguf"]
FORMATS = SOURCE_NAMED + NATIVE_NAMED
MODELS = {
    "wan": ("WanTransformer3DModel", lambda p: models.wan(p, layers=3), models.wan_inputs),
    "kandinsky5": (
        "Kandinsky5Transformer3DModel",
        lambda p: models.kandinsky5(p, text_blocks=1, visual_blocks=3),
        models.kandinsky5_inputs,
    ),
}
#: the formats each model converts to: Kandinsky 5 has no GGUF architecture ComfyUI-GGUF reads
MODEL_FORMATS = {"wan": FORMATS, "kandinsky5": [f for f in FORMATS if f != "gguf"]}
#: (model, format) for every checkpoint a model has
CASES = [(model, fmt) for model, formats in MODEL_FORMATS.items() for fmt in formats]
_WAN_RECIPES = {
    "fp8_channel": "wan-diffusers-fp8",
    "torchao_fp8": "wan-diffusers-torchao-fp8",
    "torchao_int8": "wan-diffusers-torchao-int8",
    "nf4": "wan-diffusers-nf4",
    "comfy_fp8": "wan-diffusers-comfy-fp8",
    "comfy_int8": "wan-diffusers-comfy-int8",
    "comfy_nvfp4": "wan-diffusers-comfy-nvfp4",  # mixed: MXFP8 in the first block and ffn.net.2
    "comfy_mxfp8": "wan-diffusers-comfy-mxfp8",
    "comfy_w4a4": "wan-diffusers-comfy-w4a4",
    "comfy_w4a8": "wan-diffusers-comfy-w4a8",
    "gguf": "wan-diffusers-gguf-q8_0",
}


def recipe_for(model: str, fmt: str, where: Path) -> Path:
    """The bundled recipe for this model and format (Kandinsky 5's diffusers-layout default for it)."""
    if model == "wan":
        name = _WAN_RECIPES[fmt]
    else:
        if fmt not in MODEL_FORMATS[model]:
            raise ValueError(f"Kandinsky 5 has no GGUF architecture: no {fmt} checkpoint of it")
        name = default_recipes()["kandinsky5"][fmt]
    text = bundled_text(name)
    path = where / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """converted(model, fmt) -> (source component dir, converted component dir), built once each."""
    made: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(model: str, fmt: str) -> tuple[Path, Path]:
        if (model, fmt) not in made:
            root = tmp_path_factory.mktemp(f"{model}-{fmt}")
            src = root / "src"
            MODELS[model][1](src / "transformer")
            out = root / "out"
            run_cli("convert", src, out, "--recipe", recipe_for(model, fmt, root), check=True)
            made[model, fmt] = (src / "transformer", out / "transformer")
        return made[model, fmt]

    return get


# -- the checkpoint, read back ----------------------------------------------------------------------

#: the GGML types that are plain numbers (a kept tensor), not rows of blocks
GGUF_PLAIN = ("F32", "F16", "BF16", "F64")


def gguf_tensors(path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """Every tensor of a GGUF file as gguf-py's reader gives it: name -> (GGML type name, tensor), F32 and F16 as
    themselves, BF16 viewed as bfloat16, a block type as its rows' bytes (uint8 [rows, row bytes])."""
    found = {}
    for t in gguf.GGUFReader(path).tensors:
        data = torch.from_numpy(np.array(t.data))
        if t.tensor_type.name == "BF16":
            data = data.view(torch.bfloat16)
        found[t.name] = (t.tensor_type.name, data)
    return found


def stored_tensors(component: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a converted model folder under the checkpoint's names: its GGUF file (gguf-py), else its
    safetensors files (safetensors)."""
    files = sorted(Path(component).glob("*.gguf"))
    if files:
        (path,) = files
        return {name: t for name, (_, t) in gguf_tensors(path).items()}
    return load_all(component)


def checkpoint_module(name: str, stored, family: str = "wan") -> str:
    """The checkpoint's name of the model's Linear `name` in a checkpoint whose tensor names are `stored`: the same,
    or, in the family's native names, its weight's native name less ``.weight``."""
    fam = get_family(family)
    if fam.names is None or fam.naming(stored) != "native":
        return name
    return fam.native_name(name + ".weight")[: -len(".weight")]


def model_module(stored_name: str, stored, family: str = "wan") -> str:
    """`checkpoint_module` read the other way: the model's name of the checkpoint's Linear `stored_name`."""
    fam = get_family(family)
    if fam.names is None or fam.naming(stored) != "native":
        return stored_name
    return fam.diffusers_name(stored_name + ".weight")[: -len(".weight")]


def checkpoint_keys(model: torch.nn.Module, stored, family: str = "wan") -> dict[str, str]:
    """Each state-dict key of `model` -> its key in the checkpoint whose tensor names are `stored`: the same, or,
    for a checkpoint in the family's native names, through the family's name table; a quantized Linear's parts
    (which the table does not list) by its module's name (`checkpoint_module`), then the part."""
    fam = get_family(family)
    state = model.state_dict()
    if fam.names is None or fam.naming(stored) != "native":
        return {key: key for key in state}
    quantized = [name for name, m in model.named_modules() if isinstance(m, QuantizedLinear)]
    keys = {}
    for key in state:
        module = next((m for m in quantized if key.startswith(m + ".")), None)
        if module is None:
            keys[key] = fam.native_name(key)
        else:
            keys[key] = checkpoint_module(module, stored, family) + key[len(module) :]
    return keys


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same dtype, shape and bytes (a 0-d float32 scale too, NaNs compared as bits)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def layer_weights(out: int = 96, inp: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear layer's random weight (`out` x `inp`) and bias, in bf16."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g).to(torch.bfloat16), torch.randn(out, generator=g).to(
        torch.bfloat16
    )


def layer_input(rows: int = 10, inp: int = 128, dtype=torch.bfloat16, seed: int = 1) -> torch.Tensor:
    """A random input for such a layer: a batch of two, `rows` tokens of `inp` features each."""
    return torch.randn(2, rows, inp, generator=torch.Generator().manual_seed(seed)).to(dtype)


def storage_ids(module: torch.nn.Module) -> set[int]:
    """The storages of `module`'s non-empty parameters and buffers (a copy that shares none has none of them)."""
    return {t.untyped_storage().data_ptr() for t in (*module.buffers(), *module.parameters()) if t.numel()}
