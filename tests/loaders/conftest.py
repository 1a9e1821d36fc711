"""Converted checkpoints of tiny diffusers models in every format, made once per session with the CLI."""

from __future__ import annotations

from pathlib import Path

import diffusers  # noqa: F401  (a dev dependency: missing, the loaders' tests must fail, not skip)
import pytest

from quantize.recipes import bundled_recipes
from tests import diffusers_models as models
from tests.conftest import run_cli

FORMATS = ["fp8_channel", "torchao_fp8", "nf4"]
MODELS = {
    "wan": ("WanTransformer3DModel", lambda p: models.wan(p, layers=3), models.wan_inputs),
    "kandinsky5": (
        "Kandinsky5Transformer3DModel",
        lambda p: models.kandinsky5(p, text_blocks=1, visual_blocks=3),
        models.kandinsky5_inputs,
    ),
}
_WAN_RECIPES = {
    "fp8_channel": "wan-diffusers-fp8",
    "torchao_fp8": "wan-diffusers-torchao-fp8",
    "nf4": "wan-diffusers-nf4",
}


def recipe_for(model: str, fmt: str, where: Path) -> Path:
    """The bundled recipe for this model and format; Kandinsky 5's is torchao's with the format changed."""
    if model == "wan":
        name = _WAN_RECIPES[fmt]
        text = bundled_recipes()[name + ".yaml"]
    else:
        name = f"kandinsky5-{fmt}"
        text = bundled_recipes()["kandinsky5-torchao-fp8.yaml"]
        text = text.replace("name: kandinsky5-torchao-fp8", f"name: {name}").replace(
            "format: torchao_fp8", f"format: {fmt}"
        )
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
