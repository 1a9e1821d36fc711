"""Wan2.1 / Wan2.2 (T2V, I2V, the A14B two-expert models) and LingBot-World: everything the tool knows of them.

Layouts (`Wan.layouts`): ``wan`` (original names, one model at the root), ``wan2.2-a14b`` (two experts in
``high_noise_model/`` and ``low_noise_model/``), ``lingbot-world`` (the same folders, with LingBot-World's
camera layers), ``wan-diffusers`` (a diffusers ``transformer/``, or that folder itself) and
``wan2.2-a14b-diffusers`` (``transformer/`` and ``transformer_2/``).

Names: the native ones are the original release's (``blocks.0.self_attn.q``, ``head.modulation``), what ComfyUI,
GGUF files and most LoRAs use; `NAMES` maps diffusers' `WanTransformer3DModel` names to them: the inverse of
diffusers' own ``convert_wan_transformer_to_diffusers`` (the tests' oracle). Note the swap: diffusers' ``norm2``
(the cross-attention norm, with weights) is native ``norm3``, and diffusers' parameter-free ``norm3`` is
native ``norm2``.

>>> WAN.native_name("blocks.3.attn2.add_k_proj.weight"), WAN.diffusers_name("head.modulation")
('blocks.3.cross_attn.k_img.weight', 'scale_shift_table')
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import (
    CardWords,
    Carried,
    Detection,
    Family,
    Folders,
    LoraNames,
    ModelInputs,
    PlanPolicy,
    SourceLayout,
)
from .names import BlockNames, Blocks
from .policy import Policy, Refused

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "WAN",
    "Wan",
    "WanVariant",
    "NAMES",
    "BLOCK_MODULES",
    "ROOT_MODULES",
    "VARIANT_MARKS",
    "INPUTS",
    "EXPERTS",
    "TI2V_CHANNELS",
]

#: diffusers module -> native module, outside the blocks (every Wan variant has these)
ROOT_MODULES = {
    "patch_embedding": "patch_embedding",
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.image_embedder.norm1": "img_emb.proj.0",
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    "condition_embedder.image_embedder.norm2": "img_emb.proj.4",
    "proj_out": "head.head",
}

#: inside a block: diffusers module -> native module (a VACE block has these too, and its two projections)
BLOCK_MODULES = {
    **{f"attn1.{d}": f"self_attn.{n}" for d, n in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"))},
    "attn1.to_out.0": "self_attn.o",
    "attn1.norm_q": "self_attn.norm_q",
    "attn1.norm_k": "self_attn.norm_k",
    **{f"attn2.{d}": f"cross_attn.{n}" for d, n in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"))},
    "attn2.to_out.0": "cross_attn.o",
    "attn2.norm_q": "cross_attn.norm_q",
    "attn2.norm_k": "cross_attn.norm_k",
    "attn2.add_k_proj": "cross_attn.k_img",
    "attn2.add_v_proj": "cross_attn.v_img",
    "attn2.norm_added_k": "cross_attn.norm_k_img",
    "norm1": "norm1",
    "norm2": "norm3",
    "norm3": "norm2",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
}

NAMES = BlockNames(
    root_modules=ROOT_MODULES,
    root_tensors={"scale_shift_table": "head.modulation"},
    blocks=(Blocks("blocks", "blocks", modules=BLOCK_MODULES, tensors={"scale_shift_table": "modulation"}),),
)

#: tensor-name prefixes only Wan's variants have (each a family of its own, asked before Wan): VACE's control
#: blocks, Animate's motion and face encoders and face adapter, SkyReels-V2's fps conditioning. Wan claims no model
#: that has one of them, so that a variant's source is detected as the variant alone.
VARIANT_MARKS = (
    "vace_blocks.",
    "vace_patch_embedding.",
    "motion_encoder.",
    "face_encoder.",
    "face_adapter.",
    "pose_patch_embedding.",
    "fps_embedding.",
    "fps_projection.",
    # the variants only ComfyUI runs (`wan_variants`): S2V's, HuMo's, the Fun camera models', SCAIL's, WanDancer's
    "casual_audio_encoder.",
    "audio_injector.",
    "trainable_cond_mask.",
    "frame_packer.",
    "audio_proj.",
    "control_adapter.",
    "patch_embedding_pose.",
    "patch_embedding_mask.",
    "patch_embedding_global.",
    "music_injector.",
    "music_encoder.",
    "music_projection.",
    "img_emb_refimage.",
    "head_global.",
    # Wan-Animate-2 (`wan_animate2`): diffusers' names (Wan's module tree, its own projection names) and the
    # release's in-context wrapper around each block
    "blocks.0.self_attn.to_q.",
    "blocks.0.block.",
)

_NATIVE_MARKS = ("head.modulation", "blocks.0.self_attn.")
_DIFFUSERS_MARKS = ("condition_embedder.", "blocks.0.attn1.")


EXPERTS = ("high_noise_model", "low_noise_model")
_CAMERA_MARKS = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer1.")


# --- a forward pass's inputs -----------------------------------------------------------------------

#: the latent channels of Wan2.2's VAE (TI2V-5B's in_dim and out_dim), whose pipeline expands the timestep to one
#: per latent token (``expand_timesteps``): the first frame's tokens, the image, at 0
TI2V_CHANNELS = 48


def _keys(config: dict) -> tuple[str, ...]:
    image = ("encoder_hidden_states_image",) if config.get("image_dim") else ()
    return ("hidden_states", "timestep", "encoder_hidden_states", *image)


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    shapes = {
        "hidden_states": ((None, config["in_channels"], None, None, None),),
        # one per sample, or (Wan2.2 TI2V's expanded timesteps) one per latent token
        "timestep": ((None,), (None, None)),
        "encoder_hidden_states": ((None, None, config["text_dim"]),),
    }
    if config.get("image_dim"):
        shapes["encoder_hidden_states_image"] = ((None, None, config["image_dim"]),)
    return shapes


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    p = config.get("patch_size", (1, 2, 2))
    inputs = dict(
        hidden_states=torch.randn(1, config["in_channels"], 2 * p[0], 8 * p[1], 8 * p[2], generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, config["text_dim"], generator=g),
    )
    if (
        config["in_channels"] == TI2V_CHANNELS
    ):  # Wan2.2 TI2V: one timestep per latent token (2 * 8 * 8 of them)
        inputs["timestep"] = torch.randint(0, 1000, (1, 2 * 8 * 8), generator=g)
    if config.get("image_dim"):
        inputs["encoder_hidden_states_image"] = torch.randn(1, 4, config["image_dim"], generator=g)
    return inputs


INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"image_dim": 1}),
)


# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

#: the attention projections of a Wan block (and I2V's image ones), original and diffusers names
ATTENTION = r"blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o|k_img|v_img)"
DIFFUSERS_ATTENTION = r"blocks\.\d+\.attn[12]\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)"
#: the feed-forward's up projection; with the down projection (``ffn.2``), whose input holds GELU's outliers
FFN_UP, FFN = r"blocks\.\d+\.ffn\.0", r"blocks\.\d+\.ffn\.(0|2)"
DIFFUSERS_FFN_UP, DIFFUSERS_FFN = r"blocks\.\d+\.ffn\.net\.0\.proj", r"blocks\.\d+\.ffn\.net\.(0\.proj|2)"
#: the layers an NVFP4 file keeps in MXFP8: the first block and every down projection
SENSITIVE = (r"blocks\.0\..*", r"blocks\.\d+\.ffn\.2")
DIFFUSERS_SENSITIVE = (r"blocks\.0\..*", r"blocks\.\d+\.ffn\.net\.2")
SENSITIVE_WHY = (
    "the first block and every ffn.2 (the down projections, whose inputs hold GELU's outliers); "
    "`quantize sensitivity --min-forward-sqnr` proposes a measured mix instead"
)
BLOCK_WHY = "ffn.2 too, where a scale per block of inputs holds GELU's outliers that a per-row scale spreads"
KEPT = "patch, text and time embeddings, time_projection, every modulation, head, img_emb"
DIFFUSERS_KEPT = "condition_embedder, patch_embedding, scale_shift_table, proj_out"

WAN_POLICY = Policy(
    what="Wan2.1/2.2 single-model DiT (original key names, shards at the root)",
    targets=(ATTENTION, FFN_UP),
    quantized="self/cross attention q, k, v, o (and I2V k_img, v_img) and ffn.0 of every block",
    kept=f"{KEPT}; ffn.2 where a format has one scale per row or tensor",
    block_targets=(ATTENTION, FFN),
    block_why=BLOCK_WHY,
    sensitive=SENSITIVE,
    sensitive_why=SENSITIVE_WHY,
)
A14B_POLICY = Policy(
    what="Wan2.2 A14B two-expert models (high_noise_model/, low_noise_model/, original key names)",
    components=EXPERTS,
    targets=(r"blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o)", FFN_UP),
    quantized="in both experts, attention q, k, v, o and ffn.0 of every block (the wan split)",
    kept=f"{KEPT}; ffn.2 where a format has one scale per row or tensor",
    block_targets=(r"blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o)", FFN),
    block_why=BLOCK_WHY,
    sensitive=SENSITIVE,
    sensitive_why=SENSITIVE_WHY,
)
LINGBOT_POLICY = Policy(
    what="LingBot-World (Wan2.2 A14B names, high_noise_model/ + low_noise_model/, camera layers)",
    components=EXPERTS,
    targets=A14B_POLICY.targets,
    ignore=(
        r"blocks\.\d+\.cam_(injector_layer[12]|scale_layer|shift_layer)",
        "patch_embedding_wancamctrl",
        "c2ws_hidden_states_layer[12]",
    ),
    quantized="in both experts, attention q, k, v, o and ffn.0 of every block",
    kept=f"{KEPT}; the camera/action layers (cam_*, patch_embedding_wancamctrl, c2ws_hidden_states_layer1/2)",
    block_targets=A14B_POLICY.block_targets,
    block_why=BLOCK_WHY,
    refused=(
        Refused(
            "ComfyUI's and ComfyUI-GGUF's Wan models have no LingBot-World camera layers (cam_*, "
            "patch_embedding_wancamctrl, c2ws_hidden_states_layer1/2): a native file would lose them",
            names=("native", "gguf"),
        ),
    ),
)
WAN_DIFFUSERS_POLICY = Policy(
    what="Wan2.1/2.2 in diffusers layout (transformer/)",
    components=("transformer",),
    targets=(DIFFUSERS_ATTENTION, DIFFUSERS_FFN_UP),
    quantized="attn1/attn2 to_q, to_k, to_v, to_out.0 (and I2V add_k_proj, add_v_proj) and ffn.net.0.proj",
    kept=f"{DIFFUSERS_KEPT}; ffn.net.2 where a format has one scale per row or tensor",
    block_targets=(DIFFUSERS_ATTENTION, DIFFUSERS_FFN),
    block_why=BLOCK_WHY.replace("ffn.2", "ffn.net.2"),
    sensitive=DIFFUSERS_SENSITIVE,
    sensitive_why=SENSITIVE_WHY.replace("ffn.2", "ffn.net.2"),
)
A14B_DIFFUSERS_POLICY = Policy(
    what="Wan2.2 A14B in diffusers layout (transformer/ and transformer_2/)",
    components=("transformer", "transformer_2"),
    targets=(r"blocks\.\d+\.attn[12]\.(to_q|to_k|to_v|to_out\.0)", DIFFUSERS_FFN_UP),
    quantized="in both experts, attn1/attn2 to_q, to_k, to_v, to_out.0 and ffn.net.0.proj",
    kept=WAN_DIFFUSERS_POLICY.kept,
    block_targets=(r"blocks\.\d+\.attn[12]\.(to_q|to_k|to_v|to_out\.0)", DIFFUSERS_FFN),
    block_why=WAN_DIFFUSERS_POLICY.block_why,
    sensitive=DIFFUSERS_SENSITIVE,
    sensitive_why=WAN_DIFFUSERS_POLICY.sensitive_why,
)


class Wan(Family):
    name = "wan"
    title = "Wan"
    names = NAMES
    detection = Detection(
        "WanTransformer3DModel",
        native_classes=("WanModel",),
        native_marks=_NATIVE_MARKS,
        diffusers_marks=_DIFFUSERS_MARKS,
        foreign_marks=VARIANT_MARKS,
    )
    #: a release's ``__metadata__`` ``config`` (its ``transformer`` section), which ComfyUI reads over what it tells
    #: off the tensors (``comfy/model_detection.py``): the only tell of the variants with no layer of their own,
    #: FlowRVS (``model_type`` ``flow_rvs``: ``WAN21_FlowRVS``) and the causal autoregressive T2V (``causal_ar``:
    #: ``WAN21_CausalAR_T2V``), carried into the files so that ComfyUI runs them as such
    plan = PlanPolicy(gguf_architecture="wan", carried=Carried(metadata=("config",)))
    lora = LoraNames(
        prefixes=(
            "model.diffusion_model.",
            "diffusion_model.",
            "base_model.model.",
            "transformer.",
            "pipe.dit.",
        ),
        modulation=("modulation", "scale_shift_table"),
    )
    folders = Folders("wan-diffusers", "wan")
    card = CardWords(
        experts_note="Wan2.2 A14B: load the high-noise expert for the first steps and the low-noise one for the rest."
    )
    policies = {
        "wan": WAN_POLICY,
        "wan2.2-a14b": A14B_POLICY,
        "lingbot-world": LINGBOT_POLICY,
        "wan-diffusers": WAN_DIFFUSERS_POLICY,
        "wan2.2-a14b-diffusers": A14B_DIFFUSERS_POLICY,
    }

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """Hook: the expert folders (A14B, LingBot-World) and the diffusers pair (``transformer_2/``) beside the
        one-model layouts; a root whose config is a variant's (`VARIANT_CONFIG_KEYS`) is not Wan's."""
        found = []
        experts = [open_(rel) for rel in EXPERTS]
        if all(c is not None and self.naming(c.tensors) == "native" for c in experts):
            if any(n.startswith(_CAMERA_MARKS) for c in experts for n in c.tensors):
                why = "LingBot-World layout, original names, 2 experts with camera layers"
                found.append(self.layout(why, "lingbot-world"))
            else:
                found.append(self.layout("Wan2.2 A14B layout, original names, 2 experts", "wan2.2-a14b"))
        transformer = open_("transformer")
        if transformer is not None and self.is_diffusers(transformer, registered):
            if open_("transformer_2") is not None:
                why = "Wan2.2 A14B, diffusers layout, 2 experts (transformer, transformer_2)"
                found.append(self.layout(why, "wan2.2-a14b-diffusers"))
            else:
                why = f"Wan, diffusers layout ({self.diffusers_class} in transformer/)"
                found.append(self.layout(why, self.folders.diffusers))
        root = open_(".")
        if root is not None and not _variant_config(root):
            if self.naming(root.tensors) == "native":
                why = f"Wan2.1/2.2 {_kind(root)}, original names, one model at the root"
                found.append(self.layout(why, self.folders.release))
            elif (root.config or {}).get("_class_name") == self.diffusers_class:
                why = f"Wan, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, self.folders.diffusers))
        return found

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """WanTransformer3DModel's config for an original Wan config.json (dim, num_heads, in_dim...), what the
        config does not say read off the tensor shapes (patch size, text and image widths)."""
        try:
            dim, heads = int(config["dim"]), int(config["num_heads"])
            patch = tensors["patch_embedding.weight"].shape
            image = tensors.get("img_emb.proj.1.weight")
            return {
                "_class_name": self.diffusers_class,
                "patch_size": list(patch[2:]),
                "num_attention_heads": heads,
                "attention_head_dim": dim // heads,
                "in_channels": int(config["in_dim"]),
                "out_channels": int(config["out_dim"]),
                "text_dim": tensors["text_embedding.0.weight"].shape[1],
                "freq_dim": int(config["freq_dim"]),
                "ffn_dim": int(config["ffn_dim"]),
                "num_layers": int(config["num_layers"]),
                "cross_attn_norm": True,
                "qk_norm": "rms_norm_across_heads",
                "eps": float(config.get("eps", 1e-6)),
                "image_dim": None if image is None else image.shape[1],
                "added_kv_proj_dim": None if image is None else dim,
            }
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise InputError(
                f"{where / 'config.json'}: not an original Wan config and model ({e!r} missing)"
            ) from None

    def pipeline_tag(self, config: dict) -> str | None:
        """Hook: by the release config's model_type, or by the diffusers config's image embedder."""
        model_type = config.get("model_type")
        if model_type in ("t2v", "i2v"):
            return "text-to-video" if model_type == "t2v" else "image-to-video"
        if config.get("_class_name") == self.diffusers_class:
            return "image-to-video" if config.get("image_dim") else "text-to-video"
        return None


#: config.json fields only a variant's release writes (SkyReels-V2's own ``WanModel`` config has
#: ``inject_sample_info``; VACE's ``vace_layers``): such a folder is the variant's, not Wan's
VARIANT_CONFIG_KEYS = ("inject_sample_info", "vace_layers", "vace_in_dim")


def _variant_config(comp: Component) -> bool:
    return any(k in (comp.config or {}) for k in VARIANT_CONFIG_KEYS)


def _kind(comp: Component) -> str:
    """T2V, I2V, TI2V, ...: the config's model_type, else told by the image embedder."""
    model_type = (comp.config or {}).get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type.upper()
    return "I2V" if any(n.startswith("img_emb.") for n in comp.tensors) else "T2V"


WAN = Wan()


class WanVariant(Family):
    """What Wan's variants (VACE, SkyReels-V2, Animate) share: a Wan with layers of its own, told by those layers'
    marks (`own_marks`: Wan claims no model that has one) whatever the release's config names among Wan's classes;
    Wan's names, marks, LoRA names and GGUF architecture (ComfyUI-GGUF reads ``wan``, then ComfyUI tells the
    variant by its layers); a pass's inputs and diffusers config are Wan's and its own (`variant_config`)."""

    plan = PlanPolicy(gguf_architecture="wan")
    lora = Wan.lora

    @staticmethod
    def detect(
        diffusers_class: str,
        own_marks: tuple[str, ...],
        release_class: str | None = None,
        native_mark: str | None = None,
        diffusers_mark: str | None = None,
    ) -> Detection:
        """A variant's `Detection`: its classes (and Wan's ``WanModel``, which a release may name), Wan's marks
        (a block of its own in each naming first, where it has one), its own marks."""
        return Detection(
            diffusers_class,
            native_classes=(*((release_class,) if release_class else ()), *Wan.detection.native_classes),
            native_marks=(*((native_mark,) if native_mark else ()), *_NATIVE_MARKS),
            diffusers_marks=(*((diffusers_mark,) if diffusers_mark else ()), *_DIFFUSERS_MARKS),
            own_marks=own_marks,
            shared_classes=Wan.detection.native_classes,
        )

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """Wan's (`Wan.diffusers_config`) under the variant's class, and what the variant's own layers need
        (`variant_config`)."""
        base = WAN.diffusers_config(config, tensors, where)
        return {
            **base,
            "_class_name": self.diffusers_class,
            **self.variant_config(config, tensors, where, base),
        }

    @abc.abstractmethod
    def variant_config(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path, base: dict
    ) -> dict:
        """The variant's config fields beyond Wan's (`base`), read off its config and tensors."""
