"""A model whose config.json names a class no family is registered by is no family's, whatever tensor-name marks
it shares with one: diffusers' real Kandinsky6SRTransformer3DModel (Kandinsky 6's super-resolution DiT) has
Kandinsky 5's ``visual_transformer_blocks.`` and is not Kandinsky 5 (its blocks hold other layers). Detection says
"no known layout" naming the class, through the real CLI (`recipes --for`, `convert --format`), and the family
lookups the plan and loaders use find none."""

from __future__ import annotations

import pytest

from quantize.models import component_family, family_of, get_family
from quantize.read.checkpoint import open_component
from quantize.read.detect import detect_layouts
from tests.conftest import run_cli

CLASS = "Kandinsky6SRTransformer3DModel"


@pytest.fixture(scope="module")
def kandinsky6(tmp_path_factory):
    """A pipeline folder holding a tiny diffusers Kandinsky6SRTransformer3DModel in transformer/, as its
    save_pretrained writes it."""
    import diffusers

    folder = tmp_path_factory.mktemp("kandinsky6-sr")
    config = dict(
        in_visual_dim=4,
        out_visual_dim=4,
        time_dim=32,
        model_dim=64,
        ff_dim=128,
        num_visual_blocks=1,
        axes_dims=(8, 12, 12),
    )
    getattr(diffusers, CLASS).from_config(config).save_pretrained(folder / "transformer")
    return folder


def test_its_marks_are_kandinsky5s_and_no_family_claims_it(kandinsky6):
    comp = open_component(kandinsky6, "transformer")
    assert comp.config["_class_name"] == CLASS
    assert any(n.startswith("visual_transformer_blocks.0.") for n in comp.tensors)  # Kandinsky 5's mark
    # its marks are Kandinsky 5's; only its own foreign mark (pooled_bias) keeps the names alone from saying so
    assert get_family("kandinsky5").detection.marks_naming(list(comp.tensors)) == "diffusers"
    assert family_of(None, comp.tensors) is None
    assert family_of(CLASS, comp.tensors) is None
    assert component_family(comp) is None
    assert detect_layouts(kandinsky6) == [] and detect_layouts(kandinsky6 / "transformer") == []


@pytest.mark.parametrize("rel", [".", "transformer"])
def test_recipes_for_it_says_no_known_layout_naming_the_class(kandinsky6, rel):
    folder = kandinsky6 / rel
    proc = run_cli("recipes", "--for", folder, env={"COLUMNS": "200"})
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"{folder}: no known layout") and CLASS in first, proc.stdout
    assert "kandinsky5" not in proc.stdout and "Kandinsky 5" not in proc.stdout, proc.stdout


def test_convert_format_refuses_it_naming_the_class_and_writes_nothing(kandinsky6, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", kandinsky6, out, "--format", "fp8_channel")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "no known layout" in line and f"transformer/config.json names {CLASS}" in line, line
    assert not out.exists()
