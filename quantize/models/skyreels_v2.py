"""SkyReels-V2 (Skywork's T2V, I2V and Diffusion-Forcing models on Wan2.1; diffusers' `SkyReelsV2Transformer3DModel`).

Layouts (`SkyReelsV2.layouts`): ``skyreels-v2`` (Skywork's release: shards at the root, Wan's original names, its
own config.json, which names Wan's ``WanModel`` class and adds ``inject_sample_info``) and ``skyreels-v2-diffusers``
(a diffusers ``transformer/``, or that folder itself).

Names: Wan's (`wan.NAMES`, shared) plus, in the models with ``inject_sample_info`` (the DF models), the fps
conditioning: ``fps_embedding`` (an Embedding of 2 rows) and ``fps_projection.0`` / ``.2`` (Linear, SiLU, Linear to
6 * dim), diffusers' ``fps_projection.net.0.proj`` / ``.net.2`` (diffusers' ``scripts/convert_skyreelsv2_to_diffusers.py``;
its single-file loader reuses ``convert_wan_transformer_to_diffusers``, which maps the rest). ComfyUI runs SkyReels-V2
as Wan (its detection has no SkyReels rule, and no fps layers): the fps layers of a DF model are carried, not run.

A model is SkyReels-V2's by its config (``inject_sample_info``, or diffusers' class) or, without one, by its fps
layers; a release without fps layers and without a config is a Wan, and is detected as one.

>>> SKYREELS_V2.native_name("fps_projection.net.2.weight")
'fps_projection.2.weight'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .family import Folders, ModelInputs, PlanPolicy
from .names import BlockNames
from .wan import INPUTS as WAN_INPUTS
from .wan import NAMES as WAN_NAMES
from .wan import ROOT_MODULES, WAN, WAN_DIFFUSERS_POLICY, WAN_POLICY, WanVariant

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = ["SKYREELS_V2", "SkyReelsV2", "NAMES", "FPS_MARKS"]

#: what only SkyReels-V2's DF models have, in either naming
FPS_MARKS = ("fps_embedding.", "fps_projection.")

NAMES = BlockNames(
    root_modules={
        **ROOT_MODULES,
        "fps_embedding": "fps_embedding",
        "fps_projection.net.0.proj": "fps_projection.0",
        "fps_projection.net.2": "fps_projection.2",
    },
    root_tensors=dict(WAN_NAMES.root_tensors),
    blocks=WAN_NAMES.blocks,
)


# --- a forward pass's inputs -------------------------------------------------------------------------


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Wan's inputs; for a DF model (``inject_sample_info``) one timestep per latent frame, as diffusion forcing
    denoises each frame at its own noise level."""
    import torch

    inputs = WAN_INPUTS.random(config, g)
    if config.get("inject_sample_info"):
        frames = inputs["hidden_states"].shape[2] // config.get("patch_size", (1, 2, 2))[0]
        inputs["timestep"] = torch.randint(0, 1000, (1, frames), generator=g)
    return inputs


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    forcing = t["timestep"].dim() == 2
    extra = {"fps": [0]} if config.get("inject_sample_info") else {}  # the pipeline's fps 24 -> row 0
    return dict(t, enable_diffusion_forcing=forcing, **extra, return_dict=False)


INPUTS = ModelInputs(
    keys=WAN_INPUTS.keys,
    shapes=WAN_INPUTS.shapes,
    random=_random,
    call=_call,
    accepts=WAN_INPUTS.accepts,
)


#: why the fps layers stay in high precision
_FPS_WHY = "they add to every block's modulation, like time_projection, which Wan keeps"


class SkyReelsV2(WanVariant):
    name = "skyreels-v2"
    title = "SkyReels-V2"
    names = NAMES
    #: Skywork's config.json names Wan's class: the model is SkyReels-V2's when it has fps layers
    detection = WanVariant.detect("SkyReelsV2Transformer3DModel", FPS_MARKS)
    #: Skywork's T2V and I2V releases have no fps layers: their config's ``inject_sample_info`` tells them
    folders = Folders(
        "skyreels-v2-diffusers",
        "skyreels-v2",
        "SkyReels-V2, Skywork's release (original Wan names, one model at the root)",
        release_config_keys=("inject_sample_info",),
    )
    #: the fps Embedding (2 rows): a lookup table, never a Linear (a recipe that targets it is refused by name)
    plan = PlanPolicy(gguf_architecture="wan", plain_weights=(r"fps_embedding\.",))
    policies = {
        "skyreels-v2": replace(
            WAN_POLICY,
            what="SkyReels-V2 (Skywork's release: original Wan key names, shards at the root)",
            kept=f"{WAN_POLICY.kept}; the DF models' fps_embedding and fps_projection ({_FPS_WHY})",
        ),
        "skyreels-v2-diffusers": replace(
            WAN_DIFFUSERS_POLICY,
            what="SkyReels-V2 (diffusers layout, SkyReelsV2Transformer3DModel in transformer/)",
            kept=f"{WAN_DIFFUSERS_POLICY.kept}; the DF models' fps_embedding and fps_projection ({_FPS_WHY})",
        ),
    }

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def variant_config(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path, base: dict
    ) -> dict:
        """``inject_sample_info``: the config's, else whether it has fps layers."""
        return {
            "inject_sample_info": bool(config.get("inject_sample_info", "fps_embedding.weight" in tensors))
        }

    def pipeline_tag(self, config: dict) -> str | None:
        return WAN.pipeline_tag({**config, "_class_name": WAN.diffusers_class}) or "text-to-video"


SKYREELS_V2 = SkyReelsV2()
