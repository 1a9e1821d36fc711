"""Wan2.1 VACE (1.3B, 14B; diffusers' `WanVACETransformer3DModel`): a Wan with a control branch.

Layouts (`WanVACE.layouts`): ``wan-vace`` (the release as Wan-AI ships it: shards at the root, original names,
config.json of ``VaceWanModel`` with ``vace_layers`` and ``vace_in_dim``) and ``wan-vace-diffusers`` (a diffusers
``transformer/``, or that folder itself).

Names: Wan's (`wan.NAMES`, shared, not repeated) plus the control branch: ``vace_patch_embedding`` (a Conv3d of
``vace_in_dim`` = 96 channels: 16 latent + 16 reactive latent + 64 mask), and ``vace_blocks.N``, each a Wan block
with ``after_proj`` (its hint, added to main block ``vace_layers[N]``'s output) and, in block 0 only,
``before_proj`` (the control tokens' entry: projected and added to the main stream). diffusers calls them
``proj_out`` and ``proj_in``; its single-file converter (``convert_wan_transformer_to_diffusers``, which covers
VACE) is the tests' oracle. ComfyUI (``comfy/model_detection.py``) tells VACE by ``vace_patch_embedding.weight``,
counts the ``vace_blocks`` and places them every ``num_layers // vace_layers`` blocks from 0
(``comfy/ldm/wan/model.py`` ``VaceWanModel``): the examples place them so.

>>> WAN_VACE.native_name("vace_blocks.0.proj_in.weight"), WAN_VACE.diffusers_name("vace_blocks.1.after_proj.bias")
('vace_blocks.0.before_proj.weight', 'vace_blocks.1.proj_out.bias')
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import Folders, ModelInputs
from .names import BlockNames, Blocks
from .policy import Policy
from .wan import BLOCK_MODULES, ROOT_MODULES, WanVariant
from .wan import INPUTS as WAN_INPUTS
from .wan import NAMES as WAN_NAMES
from .wan import WAN_DIFFUSERS_POLICY as WAN_D
from .wan import WAN_POLICY as WAN_P

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = ["WAN_VACE", "WanVACE", "NAMES", "VACE_MARKS", "comfyui_vace_layers"]

#: what only a VACE model has, in either naming
VACE_MARKS = ("vace_blocks.", "vace_patch_embedding.")

NAMES = BlockNames(
    root_modules={**ROOT_MODULES, "vace_patch_embedding": "vace_patch_embedding"},
    root_tensors=dict(WAN_NAMES.root_tensors),
    blocks=(
        *WAN_NAMES.blocks,
        Blocks(
            "vace_blocks",
            "vace_blocks",
            modules={**BLOCK_MODULES, "proj_in": "before_proj", "proj_out": "after_proj"},
            tensors={"scale_shift_table": "modulation"},
        ),
    ),
)


def comfyui_vace_layers(num_layers: int, vace_blocks: int) -> list[int]:
    """The main blocks ComfyUI adds the VACE hints to (it does not read them from a config)."""
    return list(range(0, num_layers, num_layers // vace_blocks))


# --- a forward pass's inputs -------------------------------------------------------------------------


def _keys(config: dict) -> tuple[str, ...]:
    keys = WAN_INPUTS.keys(config)
    return (*keys, "control_hidden_states", "control_hidden_states_scale")


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        **WAN_INPUTS.shapes(config),
        "control_hidden_states": ((None, config["vace_in_channels"], None, None, None),),
        "control_hidden_states_scale": ((len(config["vace_layers"]),),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Wan's inputs, control latents the size of the noise, and a context scale per VACE block around 1 (what
    the pipeline's ``conditioning_scale`` gives every block)."""
    import torch

    inputs = WAN_INPUTS.random(config, g)
    _, _, f, h, w = inputs["hidden_states"].shape
    inputs["control_hidden_states"] = torch.randn(1, config["vace_in_channels"], f, h, w, generator=g)
    inputs["control_hidden_states_scale"] = 0.5 + torch.rand(len(config["vace_layers"]), generator=g)
    return inputs


INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"image_dim": 1}),
)


#: a VACE block is a Wan block: the same layers quantized; its before/after projections kept
_VACE_WHY = (
    "each VACE block's {before} (block 0: the control tokens' only way in) and {after} (its hint, scaled and added "
    "straight into a main block's output, so its error is not averaged by any later layer: 9 dim x dim Linears in "
    "the 14B, 1.4% of its weights)"
)
POLICY = Policy(
    what="Wan2.1 VACE (original key names, shards at the root, VaceWanModel)",
    targets=(
        *WAN_P.targets,
        r"vace_blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o)",
        r"vace_blocks\.\d+\.ffn\.0",
    ),
    quantized=f"{WAN_P.quantized}; in the VACE blocks the same layers (a VACE block is a Wan block)",
    kept=(
        "patch and VACE patch embeddings (5-D convolutions), text and time embeddings, time_projection, every "
        f"modulation, head; {_VACE_WHY.format(before='before_proj', after='after_proj')}; ffn.2 where a format has "
        "one scale per row or tensor"
    ),
    block_targets=(
        *WAN_P.block_targets,
        r"vace_blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o)",
        r"vace_blocks\.\d+\.ffn\.(0|2)",
    ),
    block_why=WAN_P.block_why,
    sensitive=(*WAN_P.sensitive, r"vace_blocks\.0\..*", r"vace_blocks\.\d+\.ffn\.2"),
    sensitive_why="the first block and the first VACE block and every FFN down projection (GELU's outliers)",
)
DIFFUSERS_POLICY = Policy(
    what="Wan2.1 VACE (diffusers layout, WanVACETransformer3DModel in transformer/)",
    components=("transformer",),
    targets=(
        *WAN_D.targets,
        r"vace_blocks\.\d+\.attn[12]\.(to_q|to_k|to_v|to_out\.0)",
        r"vace_blocks\.\d+\.ffn\.net\.0\.proj",
    ),
    quantized=f"{WAN_D.quantized}; in the VACE blocks the same layers (a VACE block is a Wan block)",
    kept=(
        "patch and VACE patch embeddings (5-D convolutions), condition_embedder, every scale_shift_table, "
        f"proj_out; {_VACE_WHY.format(before='proj_in', after='proj_out')}; ffn.net.2 where a format has one "
        "scale per row or tensor"
    ),
    block_targets=(
        *WAN_D.block_targets,
        r"vace_blocks\.\d+\.attn[12]\.(to_q|to_k|to_v|to_out\.0)",
        r"vace_blocks\.\d+\.ffn\.net\.(0\.proj|2)",
    ),
    block_why=WAN_D.block_why,
    sensitive=(*WAN_D.sensitive, r"vace_blocks\.0\..*", r"vace_blocks\.\d+\.ffn\.net\.2"),
    sensitive_why=POLICY.sensitive_why,
)


class WanVACE(WanVariant):
    name = "wan-vace"
    title = "Wan VACE"
    names = NAMES
    #: the release's class; a VACE release naming Wan's ``WanModel`` is told by its VACE blocks
    detection = WanVariant.detect(
        "WanVACETransformer3DModel",
        VACE_MARKS,
        release_class="VaceWanModel",
        native_mark="vace_blocks.0.self_attn.",
        diffusers_mark="vace_blocks.0.attn1.",
    )
    folders = Folders("wan-vace-diffusers", "wan-vace", "Wan2.1 VACE, original names, one model at the root")
    policies = {"wan-vace": POLICY, "wan-vace-diffusers": DIFFUSERS_POLICY}

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def variant_config(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path, base: dict
    ) -> dict:
        """The VACE blocks' places (the config's ``vace_layers``, else ComfyUI's spacing) and the control
        channels, read off ``vace_patch_embedding``."""
        blocks = 0
        while f"vace_blocks.{blocks}.after_proj.weight" in tensors:
            blocks += 1
        patch = tensors.get("vace_patch_embedding.weight")
        if patch is None or blocks == 0:
            raise InputError(
                f"{where}: no vace_patch_embedding.weight or vace_blocks.0.after_proj.weight: not a Wan VACE model"
            )
        layers = config.get("vace_layers") or comfyui_vace_layers(base["num_layers"], blocks)
        if len(layers) != blocks:
            raise InputError(
                f"{where / 'config.json'}: vace_layers {layers} names {len(layers)} blocks; the model has {blocks}"
            )
        return {"vace_layers": list(layers), "vace_in_channels": patch.shape[1]}


WAN_VACE = WanVACE()
