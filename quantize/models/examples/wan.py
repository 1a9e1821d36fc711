"""Wan's example checkpoints (`quantize example --family wan`): the original release's tensors and config.json at
each preset, in its layouts (T2V, I2V, the A14B experts, LingBot-World's camera layers, TI2V-5B), and its LoRAs."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from ..wan import EXPERTS, TI2V_CHANNELS, WAN
from .base import ExampleModel, Examples, LoraTensor, linear

__all__ = ["WAN_EXAMPLES", "WanShape", "wan_tensors", "wan_block_tensors", "wan_config", "wan_lora"]


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
    "a14b": {"components": list(EXPERTS), "image": False, "camera": False},
    "lingbot": {"components": list(EXPERTS), "image": False, "camera": True},
    # Wan2.2 TI2V-5B: one model, Wan2.2's 48-channel latents in and out, text and image to video
    "ti2v": {"components": ["."], "image": False, "camera": False, "channels": TI2V_CHANNELS},
}


def wan_tensors(s: WanShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original Wan2.1/2.2 DiT (``wan/modules/model.py``), in module order."""
    d = s.dim
    t: list[tuple[str, tuple[int, ...]]] = [
        ("patch_embedding.weight", (d, s.in_dim, 1, 2, 2)),
        ("patch_embedding.bias", (d,)),
    ]
    t += linear("text_embedding.0", d, s.text_dim) + linear("text_embedding.2", d, d)
    t += linear("time_embedding.0", d, s.freq_dim) + linear("time_embedding.2", d, d)
    t += linear("time_projection.1", 6 * d, d)
    if s.camera:
        t += linear("patch_embedding_wancamctrl", d, 6 * 4 * 64)
        t += linear("c2ws_hidden_states_layer1", d, d) + linear("c2ws_hidden_states_layer2", d, d)
    for i in range(s.num_layers):
        b = f"blocks.{i}"
        t += wan_block_tensors(s, b)
        if s.camera:
            for p in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
                t += linear(f"{b}.{p}", d, d)
    t += linear("head.head", s.out_dim * 4, d) + [("head.modulation", (1, 2, d))]
    if s.image_dim:
        e = s.image_dim
        t += [("img_emb.proj.0.weight", (e,)), ("img_emb.proj.0.bias", (e,))]
        t += linear("img_emb.proj.1", e, e) + linear("img_emb.proj.3", d, e)
        t += [("img_emb.proj.4.weight", (d,)), ("img_emb.proj.4.bias", (d,))]
    return t


def wan_block_tensors(s: WanShape, b: str) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of one original Wan attention block called `b` (``blocks.3``), in module order."""
    d = s.dim
    t: list[tuple[str, tuple[int, ...]]] = []
    for attn in ("self_attn", "cross_attn"):
        for p in ("q", "k", "v", "o"):
            t += linear(f"{b}.{attn}.{p}", d, d)
        t += [(f"{b}.{attn}.norm_q.weight", (d,)), (f"{b}.{attn}.norm_k.weight", (d,))]
    if s.image_dim:
        t += linear(f"{b}.cross_attn.k_img", d, d) + linear(f"{b}.cross_attn.v_img", d, d)
        t += [(f"{b}.cross_attn.norm_k_img.weight", (d,))]
    t += [(f"{b}.norm3.weight", (d,)), (f"{b}.norm3.bias", (d,))]
    t += linear(f"{b}.ffn.0", s.ffn_dim, d) + linear(f"{b}.ffn.2", d, s.ffn_dim)
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


class WanExamples(Examples):
    family = WAN
    presets = {
        "tiny": WanShape(dim=128, ffn_dim=256, num_layers=2, num_heads=1),
        # every Linear width a multiple of 256, as GGML's K-quants need (and as Wan's own are)
        "small": WanShape(dim=256, ffn_dim=768, num_layers=4, num_heads=2),
        "1.3b": WanShape(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12),
        "14b": WanShape(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40),
        # Wan2.2 TI2V-5B (with --layout ti2v: 48 channels in and out)
        "5b": WanShape(dim=3072, ffn_dim=14336, num_layers=30, num_heads=24),
    }
    layouts = tuple(_LAYOUTS)
    default_preset = "small"

    def layout_shape(self, preset: str, layout: str) -> tuple[WanShape, dict]:
        """The preset's shape as `layout` has it (I2V's image parts, TI2V's channels, the camera layers)."""
        base = self.shape(preset, layout)
        spec = _LAYOUTS[layout]
        image = spec["image"]
        channels = spec.get("channels", 16)
        shape = replace(
            base,
            image_dim=1280 if image else None,
            in_dim=36 if image else channels,
            out_dim=channels,
            camera=spec["camera"],
            model_type="ti2v" if channels == TI2V_CHANNELS else None,
        )
        return shape, spec

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        shape, spec = self.layout_shape(preset, layout)
        return [ExampleModel(rel, wan_tensors(shape), wan_config(shape)) for rel in spec["components"]]

    def files(self, layout: str) -> dict[str, str | bytes]:
        """umT5-XXL's tokenizer config, as it sits beside the DiT in a Wan release."""
        return {"google/umt5-xxl/tokenizer_config.json": json.dumps({"model_max_length": 512}) + "\n"}

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        """Every block Linear, as the Wan LoRAs in the wild are written (`wan_lora`)."""
        return wan_lora(self.layout_shape(preset, layout)[0], rank)


def wan_lora(shape: WanShape, rank: int) -> list[LoraTensor]:
    """A LoRA on every block Linear of a Wan of `shape`, as the Wan LoRAs in the wild are written:
    ``diffusion_model.<module>.lora_down / lora_up.weight`` (bf16) and ``.alpha`` (float32)."""
    tensors: list[LoraTensor] = []
    for name, dims in wan_tensors(shape):
        if name.startswith("blocks.") and name.endswith(".weight") and len(dims) == 2:
            module = f"diffusion_model.{name.removesuffix('.weight')}"
            tensors += [
                (f"{module}.lora_down.weight", (rank, dims[1]), "BF16"),
                (f"{module}.lora_up.weight", (dims[0], rank), "BF16"),
                (f"{module}.alpha", (), "F32"),
            ]
    return tensors


WAN_EXAMPLES = WanExamples()
