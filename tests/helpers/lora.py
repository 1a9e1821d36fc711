"""LoRAs as the LoRA tests' oracle sees them (per source tensor, its low-rank pair and/or diff), written in each
naming convention met in the wild, and the source with them merged by plain torch."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantize.read.checkpoint import open_component

#: the rank of every low-rank pair `make_lora` makes
RANK = 4


@dataclass
class Lora:
    """A LoRA keyed by the source's own tensor names; `write` spells it in one convention."""

    terms: dict[str, dict[str, torch.Tensor]] = field(
        default_factory=dict
    )  # name -> {down, up, alpha?} | {diff}
    strength: float = 1.0

    def merged(self, name: str, acc: torch.Tensor) -> torch.Tensor:
        t = self.terms.get(name)
        if t is None:
            return acc
        if "up" in t:
            alpha = float(t["alpha"].item()) if "alpha" in t else t["down"].shape[0]
            acc = acc + (t["up"].float() @ t["down"].float()) * (self.strength * (alpha / t["down"].shape[0]))
        if "diff" in t:
            acc = acc + t["diff"].float() * self.strength
        return acc


def make_lora(
    source: Path, seed: int, *, linears: str = "blocks.", diffs: bool = True, alpha=None, rel="."
) -> Lora:
    """Low-rank pairs on every Linear weight whose name starts with `linears`; with `diffs`, a diff on a norm
    weight, a diff_b on a bias and a diff_m on a block's and the head's modulation (names native or diffusers)."""
    comp = open_component(source, rel)
    g = torch.Generator().manual_seed(seed)
    lora = Lora()
    for name, info in comp.tensors.items():
        if name.startswith(linears) and name.endswith(".weight") and len(info.shape) == 2:
            out, inp = info.shape
            pair = {
                "down": (torch.randn(RANK, inp, generator=g) * 0.3).bfloat16(),
                "up": (torch.randn(out, RANK, generator=g) * 0.03).bfloat16(),
            }
            if alpha is not None:
                pair["alpha"] = alpha.clone()
            lora.terms[name] = pair
    if diffs:
        native = "head.modulation" in comp.tensors
        picks = (
            ["blocks.0.norm3.weight", "blocks.1.ffn.0.bias", "blocks.1.modulation", "head.modulation"]
            if native
            else [
                "blocks.0.norm2.weight",
                "blocks.1.ffn.net.0.proj.bias",
                "blocks.1.scale_shift_table",
                "scale_shift_table",
            ]
        )
        for name in picks:
            lora.terms.setdefault(name, {})["diff"] = (
                torch.randn(comp.tensors[name].shape, generator=g) * 0.01
            ).bfloat16()
    return lora


#: convention -> (prefix, down, up, spell a module name, the key of a diff of kind k)
CONVENTIONS = {
    "diffusion_model": ("diffusion_model.", "lora_down.weight", "lora_up.weight"),
    "model.diffusion_model": ("model.diffusion_model.", "lora_A.weight", "lora_B.weight"),
    "transformer": ("transformer.", "lora_A.weight", "lora_B.weight"),
    "pipe.dit": ("pipe.dit.", "lora_down.weight", "lora_up.weight"),
    "base_model.model": ("base_model.model.", "lora_A.default.weight", "lora_B.default.weight"),
    "none": ("", "lora_A.weight", "lora_B.weight"),
    "kohya": ("lora_unet_", "lora_down.weight", "lora_up.weight"),
    "kohya__": ("lora_unet__", "lora_down.weight", "lora_up.weight"),
}
_DIFF_KEY = {"weight": "diff", "bias": "diff_b", "modulation": "diff_m", "scale_shift_table": "diff_m"}


def write_lora(lora: Lora, path: Path, convention: str = "diffusion_model", rename=lambda n: n) -> Path:
    """`lora` in `convention`, each source name first passed through `rename` (into the LoRA's naming)."""
    prefix, down_key, up_key = CONVENTIONS[convention]
    kohya = convention.startswith("kohya")
    tensors = {}
    for name, t in lora.terms.items():
        name = rename(name)
        module, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        spelled = module.replace(".", "_") if kohya else module
        if "up" in t:
            tensors[f"{prefix}{spelled}.{down_key}"] = t["down"]
            tensors[f"{prefix}{spelled}.{up_key}"] = t["up"]
            if "alpha" in t:
                tensors[f"{prefix}{spelled}.alpha"] = t["alpha"]
        if "diff" in t:
            tensors[f"{prefix}{spelled}.{_DIFF_KEY[leaf]}"] = t["diff"]
    save_file(tensors, path)
    return path


def merged_source(source: Path, dest: Path, loras: list[Lora], rel: str = ".") -> Path:
    """`source` with `loras` merged as the contract says, saved in the source dtype with safetensors itself."""
    if not dest.exists():
        shutil.copytree(source, dest)
    comp = open_component(dest, rel)
    for shard in comp.shards:
        tensors = load_file(shard)
        for name, t in tensors.items():
            acc = t.float()
            for lora in loras:
                acc = lora.merged(name, acc)
            tensors[name] = acc.to(t.dtype)
        save_file(tensors, shard, metadata=comp.metadata[shard])
    return dest
