"""Random-weight checkpoints with the real key names of Wan models, for demos, tests and benchmarks.

No model can be downloaded here, and none is needed to exercise the toolchain: the converter only
cares about names, shapes and dtypes. These checkpoints use the original Wan key names
(``blocks.N.self_attn.q``, ``ffn.0``, ``modulation``...), their config.json and their folder layouts
(Wan2.1 at the root; Wan2.2 A14B and LingBot-World with two experts), and are written shard by
shard with the same streaming writer as the converter, so even a 14B-shaped one needs little RAM.

>>> specs = wan_tensors(WAN_PRESETS["tiny"])
>>> specs[0]
('patch_embedding.weight', (64, 16, 1, 2, 2))
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from . import dtypes
from .layout import SHARD_METADATA, group_by_size, index_json, index_name, shard_names
from .writer import ShardWriter, TensorSpec

__all__ = [
    "WanShape",
    "WAN_PRESETS",
    "LAYOUTS",
    "wan_tensors",
    "write_checkpoint",
    "write_wan_example",
    "write_wan_lora",
]


@dataclass(frozen=True)
class WanShape:
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


WAN_PRESETS: dict[str, WanShape] = {
    "tiny": WanShape(dim=64, ffn_dim=192, num_layers=2, num_heads=2, text_dim=96, freq_dim=32),
    # every Linear width a multiple of 256, as GGML's K-quants need (and as Wan's own are)
    "small": WanShape(dim=256, ffn_dim=768, num_layers=4, num_heads=4, text_dim=256, freq_dim=64),
    "1.3b": WanShape(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12),
    "14b": WanShape(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40),
}

#: Folder layouts: component subfolders ("." is the root) and whether the model has the I2V/camera parts.
LAYOUTS = {
    "t2v": {"components": ["."], "image": False, "camera": False},
    "i2v": {"components": ["."], "image": True, "camera": False},
    "a14b": {"components": ["high_noise_model", "low_noise_model"], "image": False, "camera": False},
    "lingbot": {"components": ["high_noise_model", "low_noise_model"], "image": False, "camera": True},
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
        for attn in ("self_attn", "cross_attn"):
            for p in ("q", "k", "v", "o"):
                t += _linear(f"{b}.{attn}.{p}", d, d)
            t += [(f"{b}.{attn}.norm_q.weight", (d,)), (f"{b}.{attn}.norm_k.weight", (d,))]
        if s.image_dim:
            t += _linear(f"{b}.cross_attn.k_img", d, d) + _linear(f"{b}.cross_attn.v_img", d, d)
            t += [(f"{b}.cross_attn.norm_k_img.weight", (d,))]
        t += [(f"{b}.norm3.weight", (d,)), (f"{b}.norm3.bias", (d,))]
        t += _linear(f"{b}.ffn.0", s.ffn_dim, d) + _linear(f"{b}.ffn.2", d, s.ffn_dim)
        t += [(f"{b}.modulation", (1, 6, d))]
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


def wan_config(s: WanShape) -> dict:
    """config.json as the original Wan releases write it."""
    return {
        "_class_name": "WanModel",
        "_diffusers_version": "0.30.0",
        "model_type": "i2v" if s.image_dim else "t2v",
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


def _random(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    fan_in = shape[-1] if len(shape) >= 2 else 1
    std = 1.0 if len(shape) < 2 else fan_in**-0.5
    return (torch.randn(shape, generator=g) * std).to(dtype)


def write_checkpoint(
    out_dir: Path,
    tensors: list[tuple[str, tuple[int, ...]]],
    *,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: int = 10**9,
    stem: str = "diffusion_pytorch_model",
    config: dict | None = None,
    seed: int = 0,
) -> list[Path]:
    """Write random tensors as safetensors shards (+ index when more than one, + config.json)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dt = dtypes.by_torch(dtype).name
    specs = [TensorSpec(name, dt, shape) for name, shape in tensors]
    groups = group_by_size(specs, lambda s: s.nbytes, max_shard_size)
    names = shard_names(stem, len(groups), with_index=False)
    weight_map = {}
    for group, name in zip(groups, names, strict=True):
        with ShardWriter(out_dir / name, group, SHARD_METADATA) as w:
            for spec in group:
                w.write(spec.name, _random(spec.name, spec.shape, dtype, seed))
        weight_map.update(dict.fromkeys((s.name for s in group), name))
    if len(groups) > 1:
        (out_dir / index_name(stem)).write_text(index_json(weight_map, sum(s.nbytes for s in specs)))
    if config is not None:
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out_dir / n for n in names]


def write_wan_example(
    out_dir: Path,
    preset: str = "tiny",
    layout: str = "t2v",
    *,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: int = 10**9,
    seed: int = 0,
) -> Path:
    """A Wan-shaped checkpoint directory in one of `LAYOUTS`, with a stand-in VAE file beside it."""
    shape = WAN_PRESETS[preset]
    spec = LAYOUTS[layout]
    shape = replace(shape, image_dim=1280 if spec["image"] else None, camera=spec["camera"])
    out_dir = Path(out_dir)
    for i, comp in enumerate(spec["components"]):
        write_checkpoint(
            out_dir / comp,
            wan_tensors(shape),
            dtype=dtype,
            max_shard_size=max_shard_size,
            config=wan_config(shape),
            seed=seed + i,
        )
    # A file of the kind that sits beside the DiT in a release (copied when a recipe asks).
    tokenizer = out_dir / "google" / "umt5-xxl"
    tokenizer.mkdir(parents=True, exist_ok=True)
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}) + "\n")
    (out_dir / "example.json").write_text(
        json.dumps({"preset": preset, "layout": layout, "shape": asdict(shape)}, indent=2) + "\n"
    )
    return out_dir


def write_wan_lora(
    path: Path, preset: str = "small", layout: str = "t2v", *, rank: int = 16, seed: int = 0
) -> Path:
    """A random-weight LoRA on every block Linear of a `write_wan_example` model, as the Wan LoRAs in the wild
    are written (``diffusion_model.<module>.lora_down/lora_up.weight`` and ``.alpha``, bf16; alpha = rank/2),
    streamed to `path` one tensor at a time."""
    spec = LAYOUTS[layout]
    shape = replace(WAN_PRESETS[preset], image_dim=1280 if spec["image"] else None, camera=spec["camera"])
    tensors: list[tuple[str, tuple[int, ...], str]] = []
    for name, dims in wan_tensors(shape):
        if name.startswith("blocks.") and name.endswith(".weight") and len(dims) == 2:
            module = f"diffusion_model.{name.removesuffix('.weight')}"
            tensors += [
                (f"{module}.lora_down.weight", (rank, dims[1]), "BF16"),
                (f"{module}.lora_up.weight", (dims[0], rank), "BF16"),
                (f"{module}.alpha", (), "F32"),
            ]
    specs = [TensorSpec(name, dt, dims) for name, dims, dt in tensors]
    with ShardWriter(Path(path), specs, SHARD_METADATA) as w:
        for name, dims, _ in tensors:
            if name.endswith(".alpha"):
                w.write(name, torch.tensor(rank / 2, dtype=torch.float32))
            else:  # small enough that the merged weights stay close to the model's
                w.write(
                    name, _random(name, dims, torch.bfloat16, seed) * (0.3 if "lora_down" in name else 0.03)
                )
    return Path(path)
