"""The Wan variants only ComfyUI runs: Wan2.2 S2V (speech to video), HuMo (audio-driven human video), the Wan2.1 /
Wan2.2 Fun camera-control models, SCAIL / SCAIL-2 (pose-driven character animation) and WanDancer (music to dance).

Each is a Wan DiT (`wan.NAMES`: its blocks, embeddings and head, shared and not repeated) with layers of its own,
released as ComfyUI loads it: one safetensors file in the original Wan names (Comfy-Org's repackaged files), no
config.json. ComfyUI (``comfy/model_detection.py``, the 'Wan 2.1' branch) tells each by one tensor and builds its
class from ``comfy/ldm/wan/model.py`` at widths it fixes (`ComfyWanVariant`'s subclasses say which):

- **S2V** (``WAN22_S2V``, ``WanModel_S2V``; told by ``casual_audio_encoder.encoder.final_linear.weight``): the
  audio encoder (``casual_audio_encoder``: Conv1d layers over 25 weighted wav2vec layers of 1024 channels, then
  ``final_linear``), 12 audio cross-attentions (``audio_injector.injector.N``, q/k/v/o, whose output is added to the
  stream after blocks 0, 4, 8, ...) each with its AdaLN (``injector_adain_layers.N.linear``: the audio's global
  scale and shift), the reference-frame Conv3d ``cond_encoder``, the motion frames' Conv3d ``frame_packer`` and the
  3-row Embedding ``trainable_cond_mask``;
- **HuMo** (``WAN21_HuMo``, ``HumoWanModel``; told by ``audio_proj.audio_proj_glob_1.layer.bias``): in every block
  an audio cross-attention (``blocks.N.audio_cross_attn_wrapper.audio_cross_attn``: q/k/v/o, keys and values from
  1536-wide audio tokens) with its LayerNorm, and ``audio_proj`` (three Linears from 8 x 5 x 1280 Whisper features
  to 16 tokens of 1536, and a LayerNorm);
- **Camera** (``WAN21_Camera``: Wan2.1 Fun I2V, 32 input channels, CLIP image embedder; ``WAN22_Camera``: Wan2.2
  Fun, 36, none; both ``CameraWanModel``; told by ``control_adapter.conv.weight``): ``control_adapter``, Conv2d layers
  over the Plücker embedding of the camera path, added to the patch embedding;
- **SCAIL** (``WAN21_SCAIL``, told by ``patch_embedding_pose.weight``) and **SCAIL-2** (``WAN21_SCAIL2``, by
  ``patch_embedding_mask.weight``): a Wan I2V with a pose patch embedding (Conv3d, built in float32) and, in SCAIL-2,
  a mask patch embedding of 28 channels;
- **WanDancer** (``WAN22_WanDancer``, ``WanDancerModel``; told by ``patch_embedding_global.weight``): a Wan I2V (36
  channels) with a second patch embedding and head (``patch_embedding_global``, ``head_global``: the global pass at
  other frame rates), a second image embedder (``img_emb_refimage``), 8 music cross-attentions
  (``music_injector.injector.N``) and a 2-layer music encoder (``music_projection``, ``music_encoder.N``, its
  attention projections fused in ``self_attn.in_proj_weight``, which ComfyUI cuts into q/k/v_proj on loading).

FlowRVS (``WAN21_FlowRVS``) and the causal autoregressive T2V (``WAN21_CausalAR_T2V``) have no layer of their own:
ComfyUI tells them by the file's metadata ``config`` alone (its ``transformer`` section's ``model_type`` ``flow_rvs``,
``causal_ar``). They are Wan's (`wan.Wan`), whose files carry that metadata (`Carried.metadata`).

Diffusers 0.42.1 has none of them (`Detection.library` None): each converts from its release to the formats
ComfyUI and ComfyUI-GGUF read (comfy_fp8, comfy_int8, comfy_nvfp4, comfy_mxfp8; GGUF as ``wan``, ComfyUI then telling
the variant by its layers) and to fp8_channel (the release's own names); the torchao and bitsandbytes formats, which
diffusers' ``from_pretrained`` loads, are refused at plan time saying so, and a forward pass (``verify --forward``,
``sensitivity``) refuses naming the first layer diffusers lacks. Quantized: Wan's block layers and, where they are
attention projections like Wan's, the variant's (S2V's audio and WanDancer's music injectors, HuMo's audio
cross-attention), which ComfyUI's ops read quantized as any Linear. Kept: what Wan keeps, and each variant's
conditioning entries (below, in each policy's words).

>>> WAN_CAMERA.owns(None, ["head.modulation", "blocks.0.self_attn.q.weight", "control_adapter.conv.weight"])
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import CardWords, Detection, Folders, ModelInputs, PlanPolicy, lacking_in_blocks
from .policy import Policy
from .wan import INPUTS as WAN_INPUTS
from .wan import NAMES as WAN_NAMES
from .wan import WAN_POLICY, WanVariant

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = [
    "WAN_S2V",
    "WAN_HUMO",
    "WAN_CAMERA",
    "WAN_SCAIL",
    "WAN_DANCER",
    "ComfyWanVariant",
    "S2V_MARKS",
    "HUMO_MARKS",
    "CAMERA_MARKS",
    "SCAIL_MARKS",
    "DANCER_MARKS",
]

#: what only each variant has (ComfyUI's tell first): Wan (`wan.VARIANT_MARKS`) claims no model with one
S2V_MARKS = ("casual_audio_encoder.", "audio_injector.", "trainable_cond_mask.", "frame_packer.")
HUMO_MARKS = ("audio_proj.",)
CAMERA_MARKS = ("control_adapter.",)
SCAIL_MARKS = ("patch_embedding_pose.", "patch_embedding_mask.")
DANCER_MARKS = (
    "patch_embedding_global.",
    "music_injector.",
    "music_encoder.",
    "music_projection.",
    "img_emb_refimage.",
    "head_global.",
)

#: why the formats diffusers' ``from_pretrained`` loads are refused (`PlanPolicy.unread_by`)
_NO_DIFFUSERS = (
    "diffusers (0.42.1) has no {title} class, so nothing loads such a file; ComfyUI runs {title} from its "
    "native names (comfy_fp8, comfy_int8, comfy_nvfp4, comfy_mxfp8, gguf)"
)


def _policy(what: str, extra: tuple[str, ...], quantized: str, kept: str) -> Policy:
    """Wan's release policy with the variant's own quantized layers (`extra`, quantized by every format) and kept
    ones (`kept`, why in words)."""
    return replace(
        WAN_POLICY,
        what=what,
        targets=(*WAN_POLICY.targets, *extra),
        block_targets=(*(WAN_POLICY.block_targets or ()), *extra),
        quantized=f"{WAN_POLICY.quantized}{quantized}",
        kept=f"{WAN_POLICY.kept}; {kept}",
    )


class ComfyWanVariant(WanVariant):
    """A Wan variant only ComfyUI runs: Wan's names (its own layers have none in diffusers), one release layout
    (ComfyUI's one file, or shards, in the original names), no diffusers layout; GGUF as ``wan``; the libraries'
    formats refused (`PlanPolicy.unread_by`)."""

    names = WAN_NAMES
    #: the numbered module lists of its release (prefix -> how many ComfyUI builds, None: as many as block 0's
    #: list counts), each of whose members must hold what member 0 holds
    stacks: Mapping[str, int | None] = {"blocks.": None}

    @staticmethod
    def comfy_detection(comfy_class: str, own_marks: tuple[str, ...]) -> Detection:
        """Its `Detection`: Wan's marks and its own, run by ComfyUI's `comfy_class` (no library's class)."""
        return replace(WanVariant.detect(comfy_class, own_marks), library=None)

    @staticmethod
    def release(layout: str, why: str) -> Folders:
        """Its `Folders`: the release `layout` alone (no diffusers class, no diffusers layout)."""
        return Folders(None, layout, why)

    @staticmethod
    def comfy_plan(title: str, plain_weights: tuple[str, ...] = ()) -> PlanPolicy:
        """Its `PlanPolicy`: GGUF as ``wan``, the formats of torchao and bitsandbytes (diffusers' loaders) refused."""
        return PlanPolicy(
            gguf_architecture="wan",  # ComfyUI-GGUF reads "wan"; ComfyUI then tells the variant by its layers
            plain_weights=plain_weights,
            unread_by=("torchao", "bitsandbytes"),
            unread_why=_NO_DIFFUSERS.format(title=title),
        )

    @property
    def inputs(self) -> ModelInputs:
        """Wan's (no pass runs: the forward refuses the variant's first layer diffusers lacks)."""
        return WAN_INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """None exists: `InputError` saying so (a forward pass refuses the model by name before asking)."""
        raise InputError(f"{where}: {_NO_DIFFUSERS.format(title=self.title)}")

    def variant_config(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path, base: dict
    ) -> dict:
        return {}

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """None (the release ships no config.json, and no library's class has one to write), once every member
        of its numbered lists (`stacks`) holds what member 0 holds: `InputError` naming the first tensor a partial
        file lacks (ComfyUI would build the layer and leave it random)."""
        for prefix, count in self.stacks.items():
            if not any(n.startswith(f"{prefix}0.") for n in tensors):
                raise InputError(f"{where}: no tensor {prefix}0.*: not a {self.title} model")
            lacking = lacking_in_blocks(tensors, prefix, count)
            if lacking is not None:
                raise InputError(
                    f"{where}: no tensor {lacking!r}, which {prefix}0 has: a partial {self.title} release"
                )
        return None


class WanS2V(ComfyWanVariant):
    name = "wan-s2v"
    title = "Wan2.2 S2V"
    detection = ComfyWanVariant.comfy_detection("WanModel_S2V", S2V_MARKS)
    #: ComfyUI builds 12 audio injectors whatever the checkpoint (after blocks 0, 4, 8, ..., 39)
    stacks = {
        "blocks.": None,
        "audio_injector.injector.": 12,
        "audio_injector.injector_adain_layers.": 12,
    }
    folders = ComfyWanVariant.release("wan-s2v", "Wan2.2 S2V, original names (ComfyUI's WAN22_S2V)")
    #: the 3-row Embedding of the reference / motion / noisy frames: a lookup table, never a Linear
    plan = ComfyWanVariant.comfy_plan(title, plain_weights=(r"trainable_cond_mask\.",))
    card = CardWords(pipeline_tag="image-to-video")
    policies = {
        "wan-s2v": _policy(
            "Wan2.2 S2V (speech to video; original key names, ComfyUI's one file or shards at the root)",
            (r"audio_injector\.injector\.\d+\.(q|k|v|o)",),
            "; the 12 audio injectors' q, k, v, o (cross-attentions like the blocks')",
            "the audio encoder (casual_audio_encoder: Conv1d layers and final_linear, the audio's only way in, as "
            "text_embedding is the text's), each injector's AdaLN (injector_adain_layers: the audio's scale and "
            "shift of the stream, as a modulation), the cond_encoder and frame_packer convolutions and the "
            "trainable_cond_mask Embedding (a lookup table)",
        )
    }


class WanHuMo(ComfyWanVariant):
    name = "wan-humo"
    title = "HuMo"
    detection = ComfyWanVariant.comfy_detection("HumoWanModel", HUMO_MARKS)
    folders = ComfyWanVariant.release("wan-humo", "HuMo, original names (ComfyUI's WAN21_HuMo)")
    plan = ComfyWanVariant.comfy_plan(title)
    card = CardWords(pipeline_tag="text-to-video")
    policies = {
        "wan-humo": _policy(
            "HuMo (audio-driven human video on Wan; original key names, one file or shards at the root)",
            (r"blocks\.\d+\.audio_cross_attn_wrapper\.audio_cross_attn\.(q|k|v|o)",),
            "; in every block the audio cross-attention's q, k, v, o",
            "audio_proj (the audio's only way in, as text_embedding is the text's: 3 Linears, 0.2% of the 17B's "
            "weights) and each block's norm1_audio",
        )
    }


class WanCamera(ComfyWanVariant):
    name = "wan-camera"
    title = "Wan Fun Camera"
    detection = ComfyWanVariant.comfy_detection("CameraWanModel", CAMERA_MARKS)
    folders = ComfyWanVariant.release(
        "wan-camera", "Wan2.1/2.2 Fun camera control, original names (ComfyUI's WAN21_Camera / WAN22_Camera)"
    )
    plan = ComfyWanVariant.comfy_plan(title)
    card = CardWords(pipeline_tag="image-to-video")
    policies = {
        "wan-camera": _policy(
            "Wan2.1/2.2 Fun camera control (original key names, one file or shards at the root)",
            (),
            "",
            "control_adapter (Conv2d layers over the camera path's Plücker embedding: no Linear)",
        )
    }


class WanSCAIL(ComfyWanVariant):
    name = "wan-scail"
    title = "SCAIL"
    detection = ComfyWanVariant.comfy_detection("SCAILWanModel", SCAIL_MARKS)
    folders = ComfyWanVariant.release(
        "wan-scail", "SCAIL / SCAIL-2, original names (ComfyUI's WAN21_SCAIL / WAN21_SCAIL2)"
    )
    plan = ComfyWanVariant.comfy_plan(title)
    card = CardWords(pipeline_tag="image-to-video")
    policies = {
        "wan-scail": _policy(
            "SCAIL / SCAIL-2 (pose-driven animation on Wan2.1 I2V; original key names, one file or shards)",
            (),
            "",
            "patch_embedding_pose and SCAIL-2's patch_embedding_mask (Conv3d layers, which ComfyUI builds in "
            "float32)",
        )
    }


class WanDancer(ComfyWanVariant):
    name = "wan-dancer"
    title = "WanDancer"
    detection = ComfyWanVariant.comfy_detection("WanDancerModel", DANCER_MARKS)
    folders = ComfyWanVariant.release("wan-dancer", "WanDancer, original names (ComfyUI's WAN22_WanDancer)")
    #: ComfyUI builds 8 music injectors (after blocks 0, 4, ..., 24, 27) and 2 music encoder layers
    stacks = {"blocks.": None, "music_injector.injector.": 8, "music_encoder.": 2}
    #: the music encoder's fused attention projections (``in_proj_weight``, nn.MultiheadAttention's), which
    #: ComfyUI cuts into q/k/v_proj by rows as it loads them (``WAN22_WanDancer.process_unet_state_dict``): cut
    #: rows of a quantized weight are no weight of its layout, so they are plain parameters, never quantized
    plan = ComfyWanVariant.comfy_plan(title, plain_weights=(r"music_encoder\.\d+\.self_attn\.in_proj_",))
    card = CardWords(pipeline_tag="image-to-video")
    policies = {
        "wan-dancer": _policy(
            "WanDancer (music-driven dance video on Wan I2V; original key names, one file or shards at the root)",
            (r"music_injector\.injector\.\d+\.(q|k|v|o)",),
            "; the 8 music injectors' q, k, v, o (cross-attentions like the blocks')",
            "the music encoder and music_projection (the music's only way in, 2 layers 256 wide, as "
            "text_embedding is the text's; its fused in_proj cut by ComfyUI as it loads), patch_embedding_global "
            "(a Conv3d), img_emb_refimage and head_global (as img_emb and head)",
        )
    }


WAN_S2V = WanS2V()
WAN_HUMO = WanHuMo()
WAN_CAMERA = WanCamera()
WAN_SCAIL = WanSCAIL()
WAN_DANCER = WanDancer()
