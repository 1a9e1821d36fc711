"""A ``.pth`` checkpoint and a checkpoint file as SOURCE: Wan's umT5 ``models_t5_umt5-xxl-enc-bf16.pth`` in Wan's
release folder, read with torch's weights-only loader alone, under transformers' names.

The oracles: torch's own ``torch.load`` of the same file (the values each byte range must hold), Comfy-Org's single
file of the same weights (what the conversion of the ``.pth`` must equal, byte for byte), transformers'
`from_pretrained` (a transformers-side output of it). The ``.pth`` files are written here with ``torch.save``, as
Wan's were; the tool itself writes none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantize.models import get_family
from quantize.read.checkpoint import open_component, read_tensor
from quantize.read.detect import detect_layouts
from tests.conftest import run_cli

UMT5 = get_family("umt5")
PTH = "models_t5_umt5-xxl-enc-bf16.pth"


def one_line_exit_2(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict[str, Path]:
    """Wan's release folder as it lies: the transformer's config.json at the root, the umT5 ``.pth`` in Wan's T5
    names beside it, the tokenizer in ``google/umt5-xxl/``; and Comfy-Org's single file of the same weights."""
    root = tmp_path_factory.mktemp("pth")
    run_cli("example", root / "pipeline", "--family", "umt5", check=True)
    weights = load_file(root / "pipeline" / "text_encoder" / "model.safetensors")
    wan = root / "Wan2.1-T2V-14B"
    (wan / "google" / "umt5-xxl").mkdir(parents=True)
    (wan / "config.json").write_text('{"_class_name": "WanModel", "dim": 64}\n')
    spiece = (root / "pipeline" / "tokenizer" / "spiece.model").read_bytes()
    (wan / "google" / "umt5-xxl" / "spiece.model").write_bytes(spiece)
    torch.save({UMT5.aliases.names.native(k): v for k, v in weights.items()}, wan / PTH)
    comfy = root / "umt5_xxl_fp16.safetensors"
    save_file({**weights, "spiece_model": torch.frombuffer(bytearray(spiece), dtype=torch.uint8)}, comfy)
    return {
        "pth": wan / PTH,
        "comfy": comfy,
        "weights": root / "pipeline" / "text_encoder" / "model.safetensors",
    }


def test_each_tensor_is_read_from_its_byte_range_as_torch_loads_it(release):
    comp = open_component(release["pth"].parent, ".", PTH)
    loaded = torch.load(release["pth"], weights_only=True)
    assert list(comp.tensors) == list(loaded)
    for name, info in comp.tensors.items():
        assert torch.equal(read_tensor(info), loaded[name]), name
    assert comp.config is None  # the WanModel config.json beside it is the transformer's


def test_the_pth_is_a_umt5_release_under_transformers_names(release):
    (layout,) = detect_layouts(release["pth"])
    assert layout.name == "umt5-single"


@pytest.mark.parametrize("fmt", ["comfy_fp8", "gguf"])
def test_the_pth_converts_to_what_comfy_orgs_file_of_its_weights_does(release, tmp_path, fmt):
    """The tokenizer from the release's google/umt5-xxl/, the tensors from the .pth under transformers' names: the
    ComfyUI or GGUF file is the one Comfy-Org's safetensors file of the same weights converts to, byte for byte."""
    run_cli("convert", release["pth"], tmp_path / "pth", "--format", fmt, check=True)
    run_cli("convert", release["comfy"], tmp_path / "comfy", "--format", fmt, check=True)
    run_cli("verify", tmp_path / "pth", "--source", release["pth"], "--forward", check=True)
    (ours,) = [p for p in (tmp_path / "pth").iterdir() if p.suffix in (".safetensors", ".gguf")]
    (theirs,) = [p for p in (tmp_path / "comfy").iterdir() if p.suffix in (".safetensors", ".gguf")]
    assert ours.read_bytes() == theirs.read_bytes()


def test_a_transformers_side_output_of_the_pth_loads_in_from_pretrained(release, tmp_path):
    from transformers import UMT5EncoderModel

    from quantize.run.forward import forward_sqnr_db

    run_cli("convert", release["pth"], tmp_path / "o", "--format", "fp8_channel", check=True)
    assert (tmp_path / "o" / "model.safetensors").is_file()
    model = UMT5EncoderModel.from_pretrained(tmp_path / "o", dtype=torch.float32).eval()
    reference = UMT5EncoderModel.from_pretrained(release["weights"].parent, dtype=torch.float32).eval()
    ids = torch.randint(0, 400, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model(input_ids=ids).last_hidden_state, reference(input_ids=ids).last_hidden_state
    assert forward_sqnr_db(want, got) > 20


def test_anything_but_a_state_dict_of_tensors_is_one_line_and_nothing_written(release, tmp_path):
    weights = torch.load(release["pth"], weights_only=True)
    with_step = tmp_path / "a" / PTH
    with_step.parent.mkdir()
    torch.save({**weights, "step": 3}, with_step)
    line = one_line_exit_2(run_cli("convert", with_step, tmp_path / "o", "--format", "comfy_fp8"))
    assert "entry 'step' is a int, not a tensor" in line and str(with_step) in line
    with_object = tmp_path / "b" / PTH
    with_object.parent.mkdir()
    torch.save({**weights, "when": Path("x")}, with_object)
    line = one_line_exit_2(run_cli("convert", with_object, tmp_path / "o", "--format", "comfy_fp8"))
    assert "weights-only loader refused it" in line and "Path" in line
    truncated = tmp_path / "c" / PTH
    truncated.parent.mkdir()
    truncated.write_bytes(release["pth"].read_bytes()[:2000])
    line = one_line_exit_2(run_cli("convert", truncated, tmp_path / "o", "--format", "comfy_fp8"))
    assert str(truncated) in line
    assert not (tmp_path / "o").exists()


def test_a_tensor_wan_does_not_have_is_named(release, tmp_path):
    weights = torch.load(release["pth"], weights_only=True)
    odd = tmp_path / PTH
    torch.save({**weights, "blocks.0.ffn.extra.weight": torch.zeros(4, 4)}, odd)
    line = one_line_exit_2(run_cli("convert", odd, tmp_path / "o", "--format", "comfy_fp8"))
    assert "'blocks.0.ffn.extra.weight' is in Wan's T5 names" in line


def test_a_file_of_no_family_is_named_itself_not_its_folder(tmp_path):
    other = tmp_path / "other.pth"
    torch.save({"a.weight": torch.zeros(4, 4)}, other)
    line = one_line_exit_2(run_cli("convert", other, tmp_path / "o", "--recipe", "umt5-single-comfy-fp8"))
    assert line.startswith(f"error: {other}: the tensor names are of no model family")
    line = one_line_exit_2(run_cli("convert", tmp_path / "nope.pth", tmp_path / "o", "--format", "gguf"))
    assert "no such folder or file" in line
