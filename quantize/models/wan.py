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

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .base import BlockNames, Blocks, ExampleModel, Family, ModelInputs, SourceLayout

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "WAN",
    "Wan",
    "WanShape",
    "NAMES",
    "BLOCK_MODULES",
    "ROOT_MODULES",
    "VARIANT_MARKS",
    "wan_naming",
    "wan_tensors",
    "wan_config",
    "wan_block_tensors",
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
)

_NATIVE_MARKS = ("head.modulation", "blocks.0.self_attn.")
_DIFFUSERS_MARKS = ("condition_embedder.", "blocks.0.attn1.")


def wan_naming(names, native=_NATIVE_MARKS, diffusers=_DIFFUSERS_MARKS) -> str | None:
    """Which Wan naming `names` follow (``native``, ``diffusers``, ``mixed`` or None), by Wan's marks whatever
    else they hold: what a variant's names are, once its own marks said it is the variant."""
    names = list(names)
    is_native = any(n.startswith(native) for n in names)
    is_diffusers = any(n.startswith(diffusers) for n in names)
    if is_native and is_diffusers:
        return "mixed"
    return "native" if is_native else "diffusers" if is_diffusers else None


_EXPERTS = ("high_noise_model", "low_noise_model")
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


_INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"image_dim": 1}),
)


# --- examples --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WanShape:
    """The dimensions of an example Wan DiT. `text_dim` 4096 (umT5-XXL), `freq_dim` 256 and a head width of 128
    are what ComfyUI builds every Wan with, and an I2V model's `in_dim` is 36 (latents, mask and image): the
    examples keep them, so that every runtime loads them."""

    dim: int
    ffn_dim: int
    num_layers: int
    num_heads: int
    in_dim: int = 16
    out_dim: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    image_dim: int | None = None  # 1280 for I2V models (img_emb, k_img, v_img)
    camera: bool = False  # LingBot-World's camera/action layers
    model_type: str | None = None  # config.json's, when not t2v/i2v (Wan2.2 TI2V's "ti2v")


#: folder layouts of the examples: component subfolders ("." is the root), I2V parts, camera layers
_LAYOUTS = {
    "t2v": {"components": ["."], "image": False, "camera": False},
    "i2v": {"components": ["."], "image": True, "camera": False},
    "a14b": {"components": list(_EXPERTS), "image": False, "camera": False},
    "lingbot": {"components": list(_EXPERTS), "image": False, "camera": True},
    # Wan2.2 TI2V-5B: one model, Wan2.2's 48-channel latents in and out, text and image to video
    "ti2v": {"components": ["."], "image": False, "camera": False, "channels": TI2V_CHANNELS},
}


def _linear(name: str, out: int, inp: int, bias: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    specs = [(f"{name}.weight", (out, inp))]
    if bias:
        specs.append((f"{name}.bias", (out,)))
    return specs


def wan_tensors(s: WanShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original Wan2.1/2.2 DiT (``wan/modules/model.py``), in module order."""
    d = s.dim
    t: list[tuple[str, tuple[int, ...]]] = [
        ("patch_embedding.weight", (d, s.in_dim, 1, 2, 2)),
        ("patch_embedding.bias", (d,)),
    ]
    t += _linear("text_embedding.0", d, s.text_dim) + _linear("text_embedding.2", d, d)
    t += _linear("time_embedding.0", d, s.freq_dim) + _linear("time_embedding.2", d, d)
    t += _linear("time_projection.1", 6 * d, d)
    if s.camera:
        t += _linear("patch_embedding_wancamctrl", d, 6 * 4 * 64)
        t += _linear("c2ws_hidden_states_layer1", d, d) + _linear("c2ws_hidden_states_layer2", d, d)
    for i in range(s.num_layers):
        b = f"blocks.{i}"
        t += wan_block_tensors(s, b)
        if s.camera:
            for p in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
                t += _linear(f"{b}.{p}", d, d)
    t += _linear("head.head", s.out_dim * 4, d) + [("head.modulation", (1, 2, d))]
    if s.image_dim:
        e = s.image_dim
        t += [("img_emb.proj.0.weight", (e,)), ("img_emb.proj.0.bias", (e,))]
        t += _linear("img_emb.proj.1", e, e) + _linear("img_emb.proj.3", d, e)
        t += [("img_emb.proj.4.weight", (d,)), ("img_emb.proj.4.bias", (d,))]
    return t


def wan_block_tensors(s: WanShape, b: str) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of one original Wan attention block called `b` (``blocks.3``), in module order."""
    d = s.dim
    t: list[tuple[str, tuple[int, ...]]] = []
    for attn in ("self_attn", "cross_attn"):
        for p in ("q", "k", "v", "o"):
            t += _linear(f"{b}.{attn}.{p}", d, d)
        t += [(f"{b}.{attn}.norm_q.weight", (d,)), (f"{b}.{attn}.norm_k.weight", (d,))]
    if s.image_dim:
        t += _linear(f"{b}.cross_attn.k_img", d, d) + _linear(f"{b}.cross_attn.v_img", d, d)
        t += [(f"{b}.cross_attn.norm_k_img.weight", (d,))]
    t += [(f"{b}.norm3.weight", (d,)), (f"{b}.norm3.bias", (d,))]
    t += _linear(f"{b}.ffn.0", s.ffn_dim, d) + _linear(f"{b}.ffn.2", d, s.ffn_dim)
    return t + [(f"{b}.modulation", (1, 6, d))]


def wan_config(s: WanShape) -> dict:
    """config.json as the original Wan releases write it."""
    return {
        "_class_name": "WanModel",
        "_diffusers_version": "0.30.0",
        "model_type": s.model_type or ("i2v" if s.image_dim else "t2v"),
        "dim": s.dim,
        "eps": 1e-06,
        "ffn_dim": s.ffn_dim,
        "freq_dim": s.freq_dim,
        "in_dim": s.in_dim,
        "num_heads": s.num_heads,
        "num_layers": s.num_layers,
        "out_dim": s.out_dim,
        "text_len": 512,
    }


class Wan(Family):
    name = "wan"
    title = "Wan"
    diffusers_class = "WanTransformer3DModel"
    native_classes = ("WanModel",)
    names = NAMES
    native_marks = _NATIVE_MARKS
    diffusers_marks = _DIFFUSERS_MARKS
    gguf_architecture = "wan"
    modulation_names = ("modulation", "scale_shift_table")
    lora_prefixes = (
        "model.diffusion_model.",
        "diffusion_model.",
        "base_model.model.",
        "transformer.",
        "pipe.dit.",
    )
    experts_note = (
        "Wan2.2 A14B: load the high-noise expert for the first steps and the low-noise one for the rest."
    )
    default_recipes = {
        "wan": {
            "fp8_channel": "wan-fp8",
            "torchao_fp8": "wan-torchao-fp8",
            "torchao_int8": "wan-torchao-int8",
            "nf4": "wan-nf4",
            "comfy_fp8": "wan-comfy-fp8",
            "comfy_int8": "wan-comfy-int8",
            "comfy_nvfp4": "wan-comfy-nvfp4",
            "comfy_mxfp8": "wan-comfy-mxfp8",
            "gguf": "wan-gguf-q8_0",
        },
        "wan2.2-a14b": {
            "fp8_channel": "wan2.2-a14b-fp8",
            "comfy_fp8": "wan2.2-a14b-comfy-fp8",
            "comfy_int8": "wan2.2-a14b-comfy-int8",
            "comfy_nvfp4": "wan2.2-a14b-comfy-nvfp4",
            "comfy_mxfp8": "wan2.2-a14b-comfy-mxfp8",
            "gguf": "wan2.2-a14b-gguf-q8_0",
        },
        "lingbot-world": {"fp8_channel": "lingbot-world-fp8", "nf4": "lingbot-world-nf4"},
        "wan-diffusers": {
            "fp8_channel": "wan-diffusers-fp8",
            "torchao_fp8": "wan-diffusers-torchao-fp8",
            "torchao_int8": "wan-diffusers-torchao-int8",
            "nf4": "wan-diffusers-nf4",
            "comfy_fp8": "wan-diffusers-comfy-fp8",
            "comfy_int8": "wan-diffusers-comfy-int8",
            "comfy_nvfp4": "wan-diffusers-comfy-nvfp4",
            "comfy_mxfp8": "wan-diffusers-comfy-mxfp8",
            "gguf": "wan-diffusers-gguf-q8_0",
        },
        "wan2.2-a14b-diffusers": {"fp8_channel": "wan2.2-a14b-diffusers-fp8"},
    }
    presets = {
        "tiny": WanShape(dim=128, ffn_dim=256, num_layers=2, num_heads=1),
        # every Linear width a multiple of 256, as GGML's K-quants need (and as Wan's own are)
        "small": WanShape(dim=256, ffn_dim=768, num_layers=4, num_heads=2),
        "1.3b": WanShape(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12),
        "14b": WanShape(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40),
        # Wan2.2 TI2V-5B (with --layout ti2v: 48 channels in and out)
        "5b": WanShape(dim=3072, ffn_dim=14336, num_layers=30, num_heads=24),
    }
    example_layouts = tuple(_LAYOUTS)
    default_preset = "small"

    def naming(self, names) -> str | None:
        """Wan's namings (`Family.naming`), and None for a model with a variant's tensors (`VARIANT_MARKS`): that
        is the variant's, not Wan's."""
        names = list(names)
        if any(n.startswith(VARIANT_MARKS) for n in names):
            return None
        return super().naming(names)

    def owns(self, config_class: str | None, names) -> bool:
        """Its classes, or its names; not a model that carries a variant's tensors whatever its config says (a
        variant's release may name Wan's ``WanModel``)."""
        names = list(names)
        if any(n.startswith(VARIANT_MARKS) for n in names):
            return False
        return super().owns(config_class, names)

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        found = []
        experts = [open_(rel) for rel in _EXPERTS]
        if all(c is not None and self.naming(c.tensors) == "native" for c in experts):
            if any(n.startswith(_CAMERA_MARKS) for c in experts for n in c.tensors):
                why = "LingBot-World layout, original names, 2 experts with camera layers"
                found.append(self.layout(why, "lingbot-world"))
            else:
                found.append(self.layout("Wan2.2 A14B layout, original names, 2 experts", "wan2.2-a14b"))
        transformer = open_("transformer")
        if transformer is not None and self._is_diffusers(transformer):
            if open_("transformer_2") is not None:
                why = "Wan2.2 A14B, diffusers layout, 2 experts (transformer, transformer_2)"
                found.append(self.layout(why, "wan2.2-a14b-diffusers"))
            else:
                why = f"Wan, diffusers layout ({self.diffusers_class} in transformer/)"
                found.append(self.layout(why, "wan-diffusers"))
        root = open_(".")
        if root is not None and not _variant_config(root):
            if self.naming(root.tensors) == "native":
                why = f"Wan2.1/2.2 {_kind(root)}, original names, one model at the root"
                found.append(self.layout(why, "wan"))
            elif (root.config or {}).get("_class_name") == self.diffusers_class:
                why = f"Wan, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, "wan-diffusers"))
        return found

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

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
        model_type = config.get("model_type")
        if model_type in ("t2v", "i2v"):
            return "text-to-video" if model_type == "t2v" else "image-to-video"
        if config.get("_class_name") == self.diffusers_class:
            return "image-to-video" if config.get("image_dim") else "text-to-video"
        return None

    def _shape(self, preset: str, layout: str) -> tuple[WanShape, dict]:
        if preset not in self.presets or layout not in _LAYOUTS:
            raise InputError(
                f"Wan examples: preset {preset!r}, layout {layout!r}: presets {', '.join(self.presets)}, "
                f"layouts {', '.join(_LAYOUTS)}"
            )
        spec = _LAYOUTS[layout]
        image = spec["image"]
        channels = spec.get("channels", 16)
        shape = replace(
            self.presets[preset],
            image_dim=1280 if image else None,
            in_dim=36 if image else channels,
            out_dim=channels,
            camera=spec["camera"],
            model_type="ti2v" if channels == TI2V_CHANNELS else None,
        )
        return shape, spec

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        shape, spec = self._shape(preset, layout)
        return [ExampleModel(rel, wan_tensors(shape), wan_config(shape)) for rel in spec["components"]]

    def example_files(self) -> dict[str, str]:
        """umT5-XXL's tokenizer config, as it sits beside the DiT in a Wan release."""
        return {"google/umt5-xxl/tokenizer_config.json": json.dumps({"model_max_length": 512}) + "\n"}

    def example_lora(self, preset: str, layout: str, rank: int) -> list[tuple[str, tuple[int, ...], str]]:
        """Every block Linear, as the Wan LoRAs in the wild are written: ``diffusion_model.<module>.lora_down /
        lora_up.weight`` (bf16) and ``.alpha`` (float32)."""
        shape, _ = self._shape(preset, layout)
        tensors: list[tuple[str, tuple[int, ...], str]] = []
        for name, dims in wan_tensors(shape):
            if name.startswith("blocks.") and name.endswith(".weight") and len(dims) == 2:
                module = f"diffusion_model.{name.removesuffix('.weight')}"
                tensors += [
                    (f"{module}.lora_down.weight", (rank, dims[1]), "BF16"),
                    (f"{module}.lora_up.weight", (dims[0], rank), "BF16"),
                    (f"{module}.alpha", (), "F32"),
                ]
        return tensors


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
