"""Kandinsky 5 (T2V Lite and Pro; diffusers' `Kandinsky5Transformer3DModel`): everything the tool knows of it.

Layouts (`Kandinsky5.layouts`): ``kandinsky5-original`` (the release as its authors ship it: the DiT as one safetensors
file in ``model/``, e.g. ``kandinsky5lite_t2v_sft_5s.safetensors`` of ``kandinskylab/Kandinsky-5.0-T2V-Lite-sft-5s``,
with no config.json: its dimensions live in the GitHub repository's YAML, and are read here off the tensor shapes as
ComfyUI reads them) and ``kandinsky5`` (diffusers layout: ``transformer/`` with
``Kandinsky5Transformer3DModel``'s config, or that folder itself).

Names: the native ones are the original release's (``visual_transformer_blocks.0.cross_attention.key_norm``,
``visual_embeddings.in_layer``, ``out_layer.modulation.out_layer``), the module names of the original
``DiffusionTransformer3D`` that ComfyUI's ``comfy/ldm/kandinsky5/model.py`` builds and loads unchanged. diffusers'
port keeps every one of them, so `NAMES` maps each name to itself; it is still a table: a tensor it does not list
(a variant's extra layer) has no native name and is refused, naming it. The two namings cannot be told apart by
their names (`Family.naming` says ``diffusers`` of both); the layouts are told by the folder and its config.json.

The dimensions ComfyUI fixes (``comfy/model_detection.py``, ``comfy/ldm/kandinsky5/model.py``): it reads model_dim,
time_dim, ff_dim, visual_embed_dim and the block counts off the tensors, but not the head width: axes_dims
(16, 24, 24), a head of 64, unless model_dim is 4096 or 2560 ((32, 48, 48), a head of 128); the text widths 3584
(Qwen2.5-VL) and 768 (CLIP), out_visual_dim 16 and the (1, 2, 2) patch are its defaults; and its video model always
concatenates the image latent and a mask to the noise (visual_cond: 16 + 16 + 1 channels, visual_embed_dim
4 * 33 = 132). The examples keep all of them, and `Kandinsky5.diffusers_config` assumes them of an original file.

>>> KANDINSKY5.native_name("visual_transformer_blocks.3.cross_attention.key_norm.weight")
'visual_transformer_blocks.3.cross_attention.key_norm.weight'
>>> KANDINSKY5.native_name("visual_transformer_blocks.3.attn2.to_q.weight") is None
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import (
    Detection,
    Family,
    Folders,
    LoraNames,
    ModelInputs,
    PlanPolicy,
    SourceLayout,
    count_blocks,
    shape_reader,
)
from .kandinsky6 import MARKS as KANDINSKY6_MARKS
from .kandinsky6 import SR_MARKS as KANDINSKY6_SR_MARKS
from .names import BlockNames, Blocks
from .policy import Policy
from .readers import no_gguf_reader

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["KANDINSKY5", "Kandinsky5", "NAMES", "ORIGINAL_FOLDER", "comfyui_axes_dims"]

# --- names ---------------------------------------------------------------------------------------------

_ATTENTION = ("to_query", "to_key", "to_value", "out_layer", "query_norm", "key_norm")


def _same(names: Sequence[str]) -> dict[str, str]:
    return {n: n for n in names}


#: diffusers' names -> the original release's: the same, module by module
NAMES = BlockNames(
    root_modules=_same(
        [
            "time_embeddings.in_layer",
            "time_embeddings.out_layer",
            "text_embeddings.in_layer",
            "text_embeddings.norm",
            "pooled_text_embeddings.in_layer",
            "pooled_text_embeddings.norm",
            "visual_embeddings.in_layer",
            "out_layer.modulation.out_layer",
            "out_layer.out_layer",
        ]
    ),
    root_tensors={},
    blocks=(
        Blocks(
            "text_transformer_blocks",
            "text_transformer_blocks",
            modules=_same(
                [
                    "text_modulation.out_layer",
                    *(f"self_attention.{m}" for m in _ATTENTION),
                    "feed_forward.in_layer",
                    "feed_forward.out_layer",
                ]
            ),
        ),
        Blocks(
            "visual_transformer_blocks",
            "visual_transformer_blocks",
            modules=_same(
                [
                    "visual_modulation.out_layer",
                    *(f"{a}.{m}" for a in ("self_attention", "cross_attention") for m in _ATTENTION),
                    "feed_forward.in_layer",
                    "feed_forward.out_layer",
                ]
            ),
        ),
    ),
)

#: the folder the release keeps its DiT in (``model/kandinsky5lite_t2v_sft_5s.safetensors``)
ORIGINAL_FOLDER = "model"


def comfyui_axes_dims(model_dim: int) -> tuple[int, int, int]:
    """The RoPE axes ComfyUI builds a Kandinsky 5 of this width with (its head width is their sum): it does not
    read them off the tensors (comfy/model_detection.py)."""
    return (32, 48, 48) if model_dim in (4096, 2560) else (16, 24, 24)


# --- a forward pass's inputs -------------------------------------------------------------------------------

_KEYS = ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, None, None, _visual_channels(config)),),
        "encoder_hidden_states": ((None, None, config["in_text_dim"]),),
        "timestep": ((None,),),
        "pooled_projections": ((None, config["in_text_dim2"]),),
    }


def _visual_channels(config: dict) -> int:
    """The channels of the model's latent input: the noise, and with visual_cond the image latent and a mask."""
    c = config["in_visual_dim"]
    return 2 * c + 1 if config.get("visual_cond") else c


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    p = config.get("patch_size", (1, 2, 2))
    frames, h, w = 2 * p[0], 4 * p[1], 4 * p[2]
    return dict(
        hidden_states=torch.randn(1, frames, h, w, _visual_channels(config), generator=g),
        encoder_hidden_states=torch.randn(1, 6, config["in_text_dim"], generator=g),
        timestep=torch.tensor([500.0]),
        pooled_projections=torch.randn(1, config["in_text_dim2"], generator=g),
    )


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    import torch

    p = config.get("patch_size", (1, 2, 2))
    _, frames, h, w, _ = t["hidden_states"].shape
    return dict(
        t,
        visual_rope_pos=(torch.arange(frames // p[0]), torch.arange(h // p[1]), torch.arange(w // p[2])),
        text_rope_pos=torch.arange(t["encoder_hidden_states"].shape[1]),
        return_dict=False,
    )


INPUTS = ModelInputs(keys=lambda config: _KEYS, shapes=_shapes, random=_random, call=_call, accepts=_KEYS)


#: 4-bit weights compound through the blocks: the output's floor
_FORWARD_FLOOR = {
    "nf4": {"min_forward_sqnr_db": 15},
    "comfy_nvfp4": {"min_forward_sqnr_db": 15},
    "comfy_w4a8": {"min_forward_sqnr_db": 15},
    "comfy_w4a4": {"min_forward_sqnr_db": 15},
}
POLICY = Policy(
    what="Kandinsky 5 DiT",
    components=("transformer",),
    targets=(
        r"(text|visual)_transformer_blocks\.\d+\.(self_attention|cross_attention)\.(to_query|to_key|to_value|out_layer)",
        r"(text|visual)_transformer_blocks\.\d+\.feed_forward\.in_layer",
    ),
    quantized=(
        "every attention projection (to_query, to_key, to_value, out_layer) and feed_forward.in_layer of the text "
        "and visual blocks"
    ),
    kept=(
        "time, text, pooled-text and visual embeddings, every modulation layer, the final out_layer, and "
        "feed_forward.out_layer of both block kinds (the exclusions of the Kandinsky 5 FP8 work: the layers that "
        "take the timestep or feed the residual stream from GELU's outliers)"
    ),
    sensitive=(r"text_transformer_blocks\.\d+\..*", r"visual_transformer_blocks\.0\..*"),
    sensitive_why="the text blocks (the linguistic token refiner every visual block attends to) and the first visual block",
    checks=_FORWARD_FLOOR,
)


class Kandinsky5(Family):
    name = "kandinsky5"
    title = "Kandinsky 5"
    names = NAMES
    # one naming, told by these prefixes (the original's and diffusers' are the same names); Kandinsky 6's
    # transformers share its block names, and are told by their own prefixes
    detection = Detection(
        "Kandinsky5Transformer3DModel",
        diffusers_marks=("visual_transformer_blocks.0.", "text_transformer_blocks.0."),
        foreign_marks=(*KANDINSKY6_MARKS, *KANDINSKY6_SR_MARKS),
    )
    #: the release (in ``model/``, no config.json) is told apart by `layouts`
    folders = Folders("kandinsky5")
    plan = PlanPolicy(
        no_gguf_why=no_gguf_reader("Kandinsky 5")
        + ", and diffusers has no single-file loader for Kandinsky5Transformer3DModel"
    )
    lora = LoraNames(
        prefixes=("transformer.", "base_model.model.", "diffusion_model.", "model.diffusion_model.")
    )
    policies = {
        "kandinsky5": replace(POLICY, what="Kandinsky 5 DiT in diffusers layout (transformer/)"),
        "kandinsky5-original": replace(
            POLICY,
            what="Kandinsky 5 DiT as released (the original names, one file in model/)",
            components=("model",),
        ),
    }

    # --- recognizing it ------------------------------------------------------------------------------

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """The diffusers layouts (`Family.layouts`), and the release's: ``model/`` holding Kandinsky 5 tensors and
        no config.json naming a class."""
        found = super().layouts(folder, open_, registered)
        comp = open_(ORIGINAL_FOLDER)
        if comp is not None and _is_original(self, comp):
            why = (
                f"{self.title}, the original release's layout (the DiT in {ORIGINAL_FOLDER}/, original names)"
            )
            found.append(self.layout(why, "kandinsky5-original"))
        return found

    # --- running it ------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`Kandinsky5Transformer3DModel`'s config for an original file (which has no config.json), read off the
        tensor shapes as ComfyUI reads them; what the shapes do not say is what ComfyUI assumes (see the module's
        docstring), and a head width other than ComfyUI's is an error naming the tensor."""

        shape = shape_reader(tensors, where, f"an original {self.title} DiT")

        patch = (1, 2, 2)
        model_dim = shape("visual_embeddings.in_layer.bias")[0]
        axes = comfyui_axes_dims(model_dim)
        norm = "visual_transformer_blocks.0.self_attention.query_norm.weight"
        if shape(norm)[0] != sum(axes):
            raise InputError(
                f"{where}: tensor {norm!r} is {shape(norm)[0]} wide; ComfyUI builds a {self.title} of model_dim "
                f"{model_dim} with a head of {sum(axes)} (axes_dims {axes}): not a release it runs"
            )
        visual = shape("visual_embeddings.in_layer.weight")[1] // math.prod(patch)
        out_visual = shape("out_layer.out_layer.weight")[0] // math.prod(patch)
        cond = visual == 2 * out_visual + 1
        return {
            "_class_name": self.diffusers_class,
            "in_visual_dim": out_visual if cond else visual,
            "in_text_dim": shape("text_embeddings.in_layer.weight")[1],
            "in_text_dim2": shape("pooled_text_embeddings.in_layer.weight")[1],
            "time_dim": shape("time_embeddings.in_layer.bias")[0],
            "out_visual_dim": out_visual,
            "patch_size": list(patch),
            "model_dim": model_dim,
            "ff_dim": shape("visual_transformer_blocks.0.feed_forward.in_layer.weight")[0],
            "num_text_blocks": count_blocks(tensors, "text_transformer_blocks."),
            "num_visual_blocks": count_blocks(tensors, "visual_transformer_blocks."),
            "axes_dims": list(axes),
            "visual_cond": cond,
        }

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The release ships no config.json: a checkpoint converted from it is written with diffusers' config read
        off its tensors (`diffusers_config`), so that it loads as `Kandinsky5Transformer3DModel` (its names are
        diffusers' too)."""
        return self.diffusers_config({}, tensors, where)

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-video" if config.get("_class_name") == self.diffusers_class else None


def _is_original(family: Family, comp: Component) -> bool:
    """A component of the original release: Kandinsky 5 names, and no config.json naming a class."""
    return not (comp.config or {}).get("_class_name") and family.naming(comp.tensors) is not None


KANDINSKY5 = Kandinsky5()
