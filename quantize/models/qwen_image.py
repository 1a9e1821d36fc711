"""Qwen-Image (Alibaba's 20B text-to-image MMDiT; diffusers' `QwenImageTransformer2DModel`) and Qwen-Image 2.1 (its
single-stream successor; diffusers' `QwenImage21Transformer2DModel`): two families, what the tool knows of each.

**Qwen-Image** (``qwen-image``). Layouts (`QwenImage.layouts`): ``qwen-image`` (a diffusers pipeline's
``transformer/`` with ``QwenImageTransformer2DModel``'s config, or that folder itself) and ``qwen-image-release``
(Comfy-Org's single file, ``qwen_image_bf16.safetensors`` and its Edit / 2512 siblings: one file, no config.json,
no prefix). Names: ComfyUI's ``comfy/ldm/qwen_image/model.py`` is a port of diffusers' module that keeps every
module name (``img_in``, ``txt_norm``, ``txt_in``, ``time_text_embed.timestep_embedder.linear_1``,
``transformer_blocks.N.{img,txt}_mod.1``, ``attn.to_q`` ... ``attn.to_add_out``, ``{img,txt}_mlp.net.0.proj`` /
``net.2``, ``norm_out.linear``, ``proj_out``), and diffusers' single-file loader maps a Comfy-Org file with the
identity: the native names *are* diffusers' names, so there is one naming, and `NAMES` maps each name to itself
(still a table: a tensor it does not list, a variant's extra layer, has no native name and is refused by name). The
two layouts are told by the folder and its config.json, not by the names. ComfyUI tells the model by
``txt_norm.weight`` (``comfy/model_detection.py``, class ``QwenImage`` of ``comfy/supported_models.py``) and reads
only ``in_channels`` and the block count off the tensors: it builds 24 heads of 128 (3072 wide), a 3584-wide text
input (Qwen2.5-VL 7B), 16 latent channels in 2 x 2 patches and rope axes (16, 56, 56) whatever the file holds, so only
a model of those widths loads there (`diffusers_config` refuses a release of another head width). The 2511 Edit's
``__index_timestep_zero__`` (an empty marker ComfyUI registers as a buffer; diffusers' ``zero_cond_t``) is carried as
stored; the Layered model's ``time_text_embed.addition_t_embedding`` (an nn.Embedding in both) is a plain weight.

Formats: every one. ComfyUI's (and GGUF: ComfyUI-GGUF's ``qwen_image``) from either layout, the names being the
same; fp8_channel, torchao and nf4 too, the release's outputs written with diffusers' config read off the shapes so
that ``from_pretrained`` loads them.

**Qwen-Image 2.1** (``qwen-image-21``): a different model, one stream of text and image tokens, bias-free blocks with
a SwiGLU (``img_mlp.proj``, ``gate_layer``, ``out``), one ``modulation`` Linear shared by every block, and a
Qwen3-VL text encoder. Layouts: a diffusers ``transformer/`` (or that folder) only. ComfyUI 187eda8e does not run it
(``comfy/ldm/qwen_image`` builds the dual-stream model only, and its detection has no 2.1 rule), so ComfyUI's formats
are refused naming it, and GGUF too (ComfyUI-GGUF's ``qwen_image`` is loaded as that ComfyUI model). The fused
``img_mlp.gate_up`` single file diffusers' converter reads (``convert_qwen_image21_transformer_checkpoint_to_
diffusers``) is not a layout here.

What stays in high precision (both): the input projections (``img_in``, ``txt_in`` with its norm), the timestep
embedder, the final layer (``norm_out.linear``, ``proj_out``: they write the prediction), every norm and bias; the
feed-forward down projections where a format has one scale per row or tensor (GELU's / SwiGLU's outliers, as Wan,
Kandinsky 5 and HunyuanVideo 1.5 keep theirs). Qwen-Image's per-block modulation (``img_mod.1``, ``txt_mod.1``: a
third of its 20B weights) is quantized, as MiniMax-H3's: kept it would leave 13.6 GB in bf16, its input is the time
embedding alone, and per-row scales keep each channel's range (the NVFP4 recipes store it in MXFP8). 2.1's one shared
``modulation`` (1% of its weights at the class's default widths, feeding every block) is kept.

>>> QWEN_IMAGE.native_name("transformer_blocks.3.attn.to_add_out.weight")
'transformer_blocks.3.attn.to_add_out.weight'
>>> QWEN_IMAGE.native_name("transformer_blocks.3.ff.net.0.proj.weight") is None
True
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
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
    count_blocks,
    lacking_in_blocks,
    shape_reader,
)
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "QWEN_IMAGE",
    "QWEN_IMAGE_21",
    "QwenImage",
    "QwenImage21",
    "NAMES",
    "NAMES_21",
    "COMFYUI_WIDTHS",
    "RELEASE_LAYOUT",
]

#: what ComfyUI builds a Qwen-Image with whatever the file holds (``QwenImageTransformer2DModel``'s defaults in
#: comfy/ldm/qwen_image/model.py, which comfy/model_detection.py does not read off the tensors)
COMFYUI_WIDTHS = {
    "patch_size": 2,
    "out_channels": 16,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "axes_dims_rope": (16, 56, 56),
}
#: the Comfy-Org single file's layout
RELEASE_LAYOUT = "qwen-image-release"
#: the 2511 Edit's marker tensor (empty), ComfyUI's ``default_ref_method="index_timestep_zero"``
ZERO_COND_MARKER = "__index_timestep_zero__"
#: the Layered model's timestep-condition table (nn.Embedding in diffusers and ComfyUI)
ADDITION_T = "time_text_embed.addition_t_embedding"


def _same(names: Sequence[str]) -> dict[str, str]:
    return {n: n for n in names}


# --- names ---------------------------------------------------------------------------------------------

_TIME = ("time_text_embed.timestep_embedder.linear_1", "time_text_embed.timestep_embedder.linear_2")

_ATTENTION_MODULES = (
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "norm_q", "norm_k", "norm_added_q", "norm_added_k",
)  # fmt: skip

#: diffusers' names -> ComfyUI's (Comfy-Org's files'): the same, module by module
NAMES = BlockNames(
    root_modules=_same([*_TIME, ADDITION_T, "txt_norm", "img_in", "txt_in", "norm_out.linear", "proj_out"]),
    # carried as stored (no part of diffusers' class), under its own name in every file
    root_tensors={ZERO_COND_MARKER: ZERO_COND_MARKER},
    blocks=(
        Blocks(
            "transformer_blocks",
            "transformer_blocks",
            modules=_same(
                [
                    "img_mod.1",
                    "txt_mod.1",
                    *(f"attn.{m}" for m in _ATTENTION_MODULES),
                    *(f"{s}_mlp.net.{m}" for s in ("img", "txt") for m in ("0.proj", "2")),
                ]
            ),
        ),
    ),
)

#: Qwen-Image 2.1: diffusers' names, each itself (no runtime has other names for them)
NAMES_21 = BlockNames(
    root_modules=_same(
        [*_TIME, "txt_in.text_norm", "txt_in.in_layer", "txt_in.out_layer", "img_in", "modulation.1"]
        + ["norm_out.linear", "proj_out"]
    ),
    root_tensors={},
    blocks=(
        Blocks(
            "transformer_blocks",
            "transformer_blocks",
            modules=_same(
                [f"attn.{m}" for m in ("to_q", "to_k", "to_v", "to_out.0", "norm_q", "norm_k")]
                + [f"img_mlp.{m}" for m in ("proj", "gate_layer", "out")]
            ),
        ),
    ),
)

# --- a forward pass's inputs -------------------------------------------------------------------------------

_KEYS = ("hidden_states", "encoder_hidden_states", "timestep")


def _grid(tokens: int, even: bool) -> tuple[int, int]:
    """(height, width) of an image of `tokens` latent tokens, as square as they divide (`even`: both even, as
    Qwen-Image 2.1's 2 x 2 slots need); `InputError` where none is."""
    step = 2 if even else 1
    sides = [
        h for h in range(step, math.isqrt(tokens) + 1, step) if tokens % h == 0 and (tokens // h) % step == 0
    ]
    if not sides:
        raise InputError(
            f"hidden_states holds {tokens} image tokens, which no {'even ' if even else ''}height x width grid "
            "lays out: not a latent image of this model"
        )
    return sides[-1], tokens // sides[-1]


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, config["in_channels"]),),
        "encoder_hidden_states": ((None, None, config["joint_attention_dim"]),),
        "timestep": ((None,),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    return dict(
        hidden_states=torch.randn(1, 16, config["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, 6, config["joint_attention_dim"], generator=g),
        timestep=torch.tensor([0.5]),  # the pipeline's sigma: the class scales it by 1000
    )


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    h, w = _grid(t["hidden_states"].shape[1], even=False)
    return dict(t, img_shapes=[[(1, h, w)]] * t["hidden_states"].shape[0], return_dict=False)


INPUTS = ModelInputs(keys=lambda config: _KEYS, shapes=_shapes, random=_random, call=_call, accepts=_KEYS)


def _shapes_21(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, config["in_channels"] * config["patch_size"] ** 2),),
        "encoder_hidden_states": ((None, None, config["context_in_dim"]),),
        "timestep": ((None,),),
    }


def _random_21(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    return dict(
        hidden_states=torch.randn(1, 16, config["in_channels"] * config["patch_size"] ** 2, generator=g),
        encoder_hidden_states=torch.randn(1, 6, config["context_in_dim"], generator=g),
        timestep=torch.tensor([0.5]),
    )


def _call_21(config: dict, t: dict[str, torch.Tensor]) -> dict:
    """A text-to-image pass: the text, then the target image's slots (each a 2 x 2 group of its latent tokens)."""
    import torch

    batch, tokens = t["hidden_states"].shape[:2]
    h, w = _grid(tokens, even=True)
    text = t["encoder_hidden_states"].shape[1]
    mask = torch.cat(
        [torch.zeros(batch, text, dtype=torch.bool), torch.ones(batch, tokens // 4, dtype=torch.bool)], 1
    )
    return dict(t, img_shapes=[[(1, h, w)]] * batch, img_mask=mask, return_dict=False)


INPUTS_21 = ModelInputs(
    keys=lambda config: _KEYS, shapes=_shapes_21, random=_random_21, call=_call_21, accepts=_KEYS
)

# --- policies ----------------------------------------------------------------------------------------------

_BLOCK_WHY = (
    "{down} too (the feed-forward down projections take the activation's outliers and add straight into the "
    "residual stream: kept where a format has one scale per tensor or per row, quantized where it scales blocks "
    "of inputs)"
)
_ATTENTION = (
    r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
)
_MODULATION = r"transformer_blocks\.\d+\.(img|txt)_mod\.1"
_MODULATION_WHY = (
    "the blocks' modulation img_mod.1 and txt_mod.1 (2 x 6 x 3072 x 3072 = 113M weights a block, a third of the "
    "20B: kept in bf16 they would leave 13.6 GB unquantized; their input is the time embedding alone, and per-row "
    "scales keep each modulation channel's own range)"
)
#: 4-bit weights compound through the blocks: the output's floor
_FORWARD_FLOOR = {
    "nf4": {"min_forward_sqnr_db": 15},
    "comfy_nvfp4": {"min_forward_sqnr_db": 15},
    "comfy_w4a8": {"min_forward_sqnr_db": 15},
    "comfy_w4a4": {"min_forward_sqnr_db": 15},
}
_KEPT = (
    "img_in (the latent patch embedding), txt_norm and txt_in (the Qwen2.5-VL text input every block attends to), "
    "time_text_embed (the timestep embedding every modulation is made from), norm_out.linear and proj_out (the "
    "final layer: they write the prediction itself), every norm and bias"
)
POLICY = Policy(
    what="Qwen-Image MMDiT in diffusers layout (transformer/, QwenImageTransformer2DModel)",
    components=("transformer",),
    targets=(_ATTENTION, r"transformer_blocks\.\d+\.(img|txt)_mlp\.net\.0\.proj", _MODULATION),
    quantized=(
        "in each of the transformer_blocks (60 in the 20B): the image and text streams' attention (attn.to_q, to_k, "
        "to_v, to_out.0, add_q_proj, add_k_proj, add_v_proj, to_add_out), img_mlp.net.0.proj and "
        f"txt_mlp.net.0.proj, and {_MODULATION_WHY}"
    ),
    kept=f"{_KEPT}; img_mlp.net.2 and txt_mlp.net.2 where a format has one scale per row or tensor",
    block_targets=(_ATTENTION, r"transformer_blocks\.\d+\.(img|txt)_mlp\.net\.(0\.proj|2)", _MODULATION),
    block_why=_BLOCK_WHY.format(down="img_mlp.net.2 and txt_mlp.net.2"),
    sensitive=(r"transformer_blocks\.0\..*", r"transformer_blocks\.\d+\.(img|txt)_mlp\.net\.2", _MODULATION),
    sensitive_why=(
        "the first block, every feed-forward down projection (GELU's outliers) and the modulation (it scales and "
        "gates the whole residual stream: 4 bits there is the riskiest choice)"
    ),
    checks=_FORWARD_FLOOR,
)
RELEASE_POLICY = Policy(
    what=(
        "Qwen-Image MMDiT as Comfy-Org releases it (one file at the root, ComfyUI's names, which are diffusers', "
        "no config.json)"
    ),
    targets=POLICY.targets,
    quantized=POLICY.quantized,
    kept=POLICY.kept,
    block_targets=POLICY.block_targets,
    block_why=POLICY.block_why,
    sensitive=POLICY.sensitive,
    sensitive_why=POLICY.sensitive_why,
    checks=POLICY.checks,
    note=(
        "A diffusers-side output keeps the release's names, which are diffusers' own, with diffusers' "
        "QwenImageTransformer2DModel config read off the tensor shapes as its config.json."
    ),
)
_ATTENTION_21 = r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0)"
POLICY_21 = Policy(
    what="Qwen-Image 2.1 single-stream DiT in diffusers layout (transformer/, QwenImage21Transformer2DModel)",
    components=("transformer",),
    targets=(_ATTENTION_21, r"transformer_blocks\.\d+\.img_mlp\.(proj|gate_layer)"),
    quantized=(
        "in each of the transformer_blocks: attn.to_q, to_k, to_v, to_out.0 and the SwiGLU's img_mlp.proj and "
        "img_mlp.gate_layer"
    ),
    kept=(
        "img_in (the latent embedding), txt_in (the Qwen3-VL text input: its zero-centred norm, in_layer and "
        "out_layer), time_text_embed, the one modulation Linear every block slices its scales and gates from (1% "
        "of the weights, its error in every block), norm_out.linear and proj_out (the final layer), every norm; "
        "img_mlp.out where a format has one scale per row or tensor"
    ),
    block_targets=(_ATTENTION_21, r"transformer_blocks\.\d+\.img_mlp\.(proj|gate_layer|out)"),
    block_why=_BLOCK_WHY.format(down="img_mlp.out"),
    sensitive=(r"transformer_blocks\.0\..*", r"transformer_blocks\.\d+\.img_mlp\.out"),
    sensitive_why="the first block and every SwiGLU down projection (img_mlp.out: its outliers)",
    checks=_FORWARD_FLOOR,
)

_LORA = LoraNames(
    prefixes=("transformer.", "diffusion_model.", "model.diffusion_model.", "base_model.model.")
)
_NO_COMFYUI_21 = (
    "ComfyUI (siliconflow/ComfyUI 187eda8e) has no Qwen-Image 2.1 model: comfy/ldm/qwen_image builds only "
    "Qwen-Image's dual-stream QwenImageTransformer2DModel, and comfy/model_detection.py has no rule for 2.1's "
    "single stream"
)


class QwenImage(Family):
    name = "qwen-image"
    title = "Qwen-Image"
    names = NAMES
    # one naming (ComfyUI's are diffusers'), told by ComfyUI's own detection key and the text stream's modulation
    detection = Detection(
        "QwenImageTransformer2DModel", diffusers_marks=("txt_norm.", "transformer_blocks.0.txt_mod.")
    )
    #: the release (one file at the root, no config.json) is told apart by `layouts`
    folders = Folders("qwen-image")
    plan = PlanPolicy(
        gguf_architecture="qwen_image",  # ComfyUI-GGUF's IMG_ARCH_LIST; ComfyUI then detects it by txt_norm
        plain_weights=(re.escape(f"{ADDITION_T}."),),
        carried=Carried(tensors=(ZERO_COND_MARKER,)),
    )
    lora = _LORA
    card = CardWords(
        pipeline_tag="text-to-image",
        kept_tensors="every bias and norm, img_in, txt_in, the timestep embedder and the final layer",
    )
    policies = {"qwen-image": POLICY, RELEASE_LAYOUT: RELEASE_POLICY}

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """The diffusers layouts (`Family.layouts`), and the release's: a root holding Qwen-Image tensors and no
        config.json naming a class (a Comfy-Org file, alone or given as the source)."""
        found = _complete_layouts(self, super().layouts(folder, open_, registered), open_)
        root = open_(".")
        if (
            root is not None
            and not (root.config or {}).get("_class_name")
            and self.naming(root.tensors)
            and not _mage_flow(root.tensors)
        ):
            _check_blocks(self, root.tensors, None, root.dir)
            why = f"{self.title}, Comfy-Org's single file (ComfyUI's names, which are diffusers'; no config.json)"
            found.append(self.layout(why, RELEASE_LAYOUT))
        return found

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`QwenImageTransformer2DModel`'s config for a release file (no config.json), read off the tensor shapes
        as ComfyUI reads them (in_channels, the blocks) and the rest as ComfyUI builds it (`COMFYUI_WIDTHS`) where
        the shapes say no more; a head width other than ComfyUI's 128 is refused naming the tensor."""
        shape = shape_reader(tensors, where, f"a {self.title} release file")
        _check_blocks(self, tensors, None, where)
        head = shape("transformer_blocks.0.attn.norm_q.weight")[0]
        axes = COMFYUI_WIDTHS["axes_dims_rope"]
        if head != sum(axes):
            raise InputError(
                f"{where}: tensor 'transformer_blocks.0.attn.norm_q.weight' is {head} wide; ComfyUI builds a "
                f"{self.title} with heads of {sum(axes)} (rope axes {axes}): not a release it runs"
            )
        inner, in_channels = shape("img_in.weight")
        patch = COMFYUI_WIDTHS["patch_size"]
        return {
            "_class_name": self.diffusers_class,
            "patch_size": patch,
            "in_channels": in_channels,
            "out_channels": shape("proj_out.weight")[0] // patch**2,
            "num_layers": count_blocks(tensors, "transformer_blocks."),
            "attention_head_dim": head,
            "num_attention_heads": inner // head,
            "joint_attention_dim": shape("txt_norm.weight")[0],
            "guidance_embeds": False,
            "axes_dims_rope": list(axes),
            "zero_cond_t": ZERO_COND_MARKER in tensors,
            "use_additional_t_cond": f"{ADDITION_T}.weight" in tensors,
            "use_layer3d_rope": False,
        }

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The release ships no config.json: its converted checkpoints are written with diffusers' config read off
        its tensors (`diffusers_config`), so that they load as `QwenImageTransformer2DModel` (same names)."""
        return self.diffusers_config({}, tensors, where)

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-image"


class QwenImage21(Family):
    name = "qwen-image-21"
    title = "Qwen-Image 2.1"
    names = NAMES_21
    detection = Detection(
        "QwenImage21Transformer2DModel",
        diffusers_marks=("txt_in.text_norm.", "transformer_blocks.0.img_mlp.gate_layer."),
    )
    folders = Folders("qwen-image-21")
    plan = PlanPolicy(
        no_gguf_why=(
            "ComfyUI-GGUF's qwen_image files are loaded as ComfyUI's Qwen-Image model, and " + _NO_COMFYUI_21
        ),
        unread_by=("comfyui",),
        unread_why=_NO_COMFYUI_21,
    )
    lora = _LORA
    card = CardWords(
        pipeline_tag="text-to-image",
        kept_tensors="every norm, img_in, txt_in, the timestep embedder, the shared modulation and the final layer",
    )
    policies = {"qwen-image-21": POLICY_21}

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """The diffusers layouts (`Family.layouts`), each model's blocks checked whole."""
        return _complete_layouts(self, super().layouts(folder, open_, registered), open_)

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS_21

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """Qwen-Image 2.1 has no release without diffusers' config.json: a model without one is refused."""
        raise InputError(
            f"{where}: a {self.title} model without config.json naming {self.diffusers_class}: this tool reads "
            "2.1 from diffusers' layout only"
        )

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-image"


def _mage_flow(tensors: Mapping[str, TensorInfo]) -> bool:
    """Mage-Flow, which ComfyUI tells from Qwen-Image by a 2560-wide ``txt_norm`` and 128 outputs (its rule before
    Qwen-Image's in comfy/model_detection.py) and runs as another model: no release of this family."""
    norm, out = tensors.get("txt_norm.weight"), tensors.get("proj_out.weight")
    return norm is not None and out is not None and norm.shape[0] == 2560 and out.shape[0] == 128


def _check_blocks(family: Family, tensors: Mapping[str, object], layers: int | None, where: Path) -> None:
    """Every block holds what block 0 holds, and there are `layers` of them where a config.json says so:
    `InputError` naming the first tensor a partial model lacks (a runtime would build the block and leave the
    tensor random, or fail on loading it)."""
    lacking = lacking_in_blocks(tensors, "transformer_blocks.", layers)
    if lacking is not None:
        raise InputError(f"{where}: no tensor {lacking!r}, which block 0 has: a partial {family.title} model")


def _complete_layouts(
    family: Family, found: list[SourceLayout], open_: Callable[[str], Component | None]
) -> list[SourceLayout]:
    """`found` (the diffusers layouts `Family.layouts` matched), once the model each was found in has every block
    its config.json counts (`_check_blocks`)."""
    if found:
        for rel in ("transformer", "."):
            comp = open_(rel)
            if comp is not None and (comp.config or {}).get("_class_name") == family.diffusers_class:
                _check_blocks(family, comp.tensors, comp.config.get("num_layers"), comp.dir)
    return found


QWEN_IMAGE = QwenImage()
QWEN_IMAGE_21 = QwenImage21()
