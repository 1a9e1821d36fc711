"""A forward pass's inputs file (`--inputs`): every tensor is checked by name, rank and the widths the config
fixes before the model runs, and refused in one line naming the tensor, its shape and the shape taken."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from quantize.errors import InputError
from quantize.models import get_family
from quantize.run.forward import load_inputs

WAN = get_family("wan")
CONFIG = {"in_channels": 16, "text_dim": 4096, "patch_size": [1, 2, 2]}


def _inputs(tmp_path, **changed):
    tensors = {
        "hidden_states": torch.zeros(1, 16, 2, 8, 8),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.zeros(1, 8, 4096),
        **changed,
    }
    path = tmp_path / "inputs.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize(
    "timestep", [torch.tensor([500]), torch.full((1, 64), 500)], ids=["per sample", "ti2v"]
)
def test_what_the_model_takes_is_taken(tmp_path, timestep):
    """Wan2.2 TI2V's pipeline gives one timestep per latent token: [batch, tokens]."""
    got = load_inputs(_inputs(tmp_path, timestep=timestep), WAN, CONFIG)
    assert got["timestep"].shape == timestep.shape and got["hidden_states"].dtype == torch.float32


@pytest.mark.parametrize(
    ("key", "wrong", "taken"),
    [
        ("hidden_states", torch.zeros(16, 2, 8, 8), "[*, 16, *, *, *]"),  # the batch dimension missing
        ("hidden_states", torch.zeros(1, 36, 2, 8, 8), "[*, 16, *, *, *]"),  # an I2V latent on a T2V model
        ("encoder_hidden_states", torch.zeros(1, 8, 256), "[*, *, 4096]"),  # another text encoder's width
        ("timestep", torch.zeros(1, 2, 3), "[*] or [*, *]"),
    ],
)
def test_a_tensor_of_another_rank_or_width_is_named(tmp_path, key, wrong, taken):
    path = _inputs(tmp_path, **{key: wrong})
    with pytest.raises(InputError) as e:
        load_inputs(path, WAN, CONFIG)
    assert str(e.value) == (
        f"{path}: tensor {key!r} has shape {list(wrong.shape)}; this WanTransformer3DModel takes {key} of shape "
        f"{taken} (* any size)"
    )
