"""Wan-Animate-2 (Wan-AI/Wan2.2-Animate-2-14B; diffusers' `WanAnimate2Transformer3DModel`; ComfyUI's
``WAN_Animate2``): a Wan2.1 I2V 14B DiT driven by a video, with no layer of its own.

The model: Wan2.1's I2V, tensor for tensor (blocks, ``img_emb``, ``k_img`` / ``v_img``), run twice per step: once on
the driving video's latents (a fixed timestep of 1), whose self-attention keys and values it keeps per block, then
on the video being made, each of whose frames attends to every generated token and to the driving frame of the same
index (diffusers' flex-attention `BlockMask`, ComfyUI's per-frame loop in ``comfy/ldm/wan/model_animate2.py``). So
there are no extra layers to name or keep: what is new is how the same weights are run, and the names.

Layouts (`WanAnimate2.layouts`): ``wan-animate2``, the release as Wan-AI ships it (``wan_animate_2_bf16.safetensors``
at the root, the file the release's inference script loads; no config.json: its yaml holds the sizes, which are
read off the shapes) and ``wan-animate2-diffusers`` (a diffusers ``transformer/``, or that folder itself).

Names, three of them, one model:

- diffusers' class holds the release's module tree without its in-context wrapper: ``blocks.N.self_attn.to_q``,
  ``blocks.N.cross_attn.add_k_proj``, ``blocks.N.ffn.0``, ``head.head`` (the family's diffusers names: `NAMES`'
  diffusers side, told by ``blocks.0.self_attn.to_q.``, a prefix no other naming has);
- the release wraps each block in that wrapper (``blocks.N.block.self_attn.q``): diffusers' single-file converter
  ``convert_wan_animate_2_transformer_to_diffusers`` drops ``.block.`` and renames the attention projections, and
  the tests' oracle is that converter; a release is read under diffusers' names (`RELEASE_NAMES`,
  `WanAnimate2.aliases`), so it is a diffusers-named model with its config read off the shapes;
- ComfyUI's, which its files and GGUF's hold (`NAMES`' native side): Wan's own I2V names
  (``blocks.N.self_attn.q``), with no mark of Animate-2 at all. ComfyUI tells a ``WAN_Animate2`` file from a Wan2.1
  I2V one by the file's metadata alone (``comfy/model_detection.py`` updates the detected Wan config with
  ``config``'s ``transformer`` section: `COMFYUI_CONFIG`, model_type ``animate2``; Comfy-Org's
  ``wan_animate_2_bf16.safetensors``, which its workflow loads with the stock Load Diffusion Model node, can be
  told no other way), so every file written carries it (`Carried.written`). Without it
  ComfyUI runs the file as a plain ``WAN21_I2V`` (and so does a ComfyUI-GGUF older than its PR #399, which hands
  ComfyUI no file metadata). Comfy-Org's own file is the Wan family's by its names (this tool tells a model by
  its names and config, not its metadata), and Wan carries the ``config`` entry into its outputs: ComfyUI still
  builds ``WAN_Animate2`` from them.

A forward pass (``verify --forward``, ``sensitivity``) is the class's reference pass (``kv_cache_mode="extract"``:
dense attention, every Linear once; the generation pass differs by its flex-attention mask alone). The release's
outputs in diffusers' names are diffusers' own folder (config.json read off the shapes,
``diffusion_pytorch_model.safetensors``: `PlanPolicy.release_stem`), which ``from_pretrained`` loads.

Kept: what Wan's I2V keeps (patch, text and time embeddings, time_projection, every modulation, head, img_emb), for
Wan's reasons; the driving video's pass runs through the same quantized Linears.

>>> WAN_ANIMATE2.native_name("blocks.3.cross_attn.add_k_proj.weight"), WAN_ANIMATE2.native_name("head.head.bias")
('blocks.3.cross_attn.k_img.weight', 'head.head.bias')
>>> RELEASE_NAMES.diffusers("blocks.3.block.self_attn.o.weight")
'blocks.3.self_attn.to_out.0.weight'
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..read.files import config_class
from .family import (
    Aliases,
    CardWords,
    Carried,
    Detection,
    Family,
    Folders,
    ModelInputs,
    PlanPolicy,
    SourceLayout,
    count_blocks,
    lacking_in_blocks,
    shape_reader,
)
from .names import BlockNames, Blocks
from .policy import Policy
from .wan import BLOCK_WHY, SENSITIVE_WHY, WanVariant

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["WAN_ANIMATE2", "WanAnimate2", "NAMES", "RELEASE_NAMES", "COMFYUI_CONFIG", "RELEASE_FILE"]

CLASS = "WanAnimate2Transformer3DModel"
#: the release's one file (``wan_animate_2.yaml``'s ``model_path``)
RELEASE_FILE = "wan_animate_2_bf16.safetensors"
#: the file metadata ComfyUI builds ``WAN_Animate2`` from (the 'Wan 2.1' branch of ``detect_unet_config`` reads
#: ``config``'s ``transformer`` section over what it detects): what every file of the family carries
COMFYUI_CONFIG = json.dumps({"transformer": {"model_type": "animate2"}})
#: the release's in-context wrapper around each block (``Incontext_AttentionBlock.block``)
WRAPPER = "block."

#: diffusers' names of an attention's modules -> the original (and ComfyUI's) ones
_ATTENTION = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "norm_q": "norm_q", "norm_k": "norm_k"}
#: in a block: diffusers module -> native module (diffusers keeps Wan's module tree, names its projections its way)
BLOCK_MODULES = {
    **{f"{a}.{d}": f"{a}.{n}" for a in ("self_attn", "cross_attn") for d, n in _ATTENTION.items()},
    "cross_attn.add_k_proj": "cross_attn.k_img",
    "cross_attn.add_v_proj": "cross_attn.v_img",
    "cross_attn.norm_added_k": "cross_attn.norm_k_img",
    "norm3": "norm3",
    "ffn.0": "ffn.0",
    "ffn.2": "ffn.2",
}
#: outside the blocks the names are the same in all three namings
ROOT_MODULES = {
    m: m
    for m in (
        "patch_embedding",
        "text_embedding.0",
        "text_embedding.2",
        "time_embedding.0",
        "time_embedding.2",
        "time_projection.1",
        "head.head",
        "img_emb.proj.0",
        "img_emb.proj.1",
        "img_emb.proj.3",
        "img_emb.proj.4",
    )
}


def _names(wrapper: str) -> BlockNames:
    return BlockNames(
        root_modules=ROOT_MODULES,
        root_tensors={"head.modulation": "head.modulation"},
        blocks=(
            Blocks(
                "blocks",
                "blocks",
                modules={d: wrapper + n for d, n in BLOCK_MODULES.items()},
                tensors={"modulation": f"{wrapper}modulation"},
            ),
        ),
    )


#: diffusers' names <-> ComfyUI's (Wan's I2V names)
NAMES = _names("")
#: diffusers' names <-> the release's (each block's in its wrapper): how a release is read (`WanAnimate2.aliases`)
RELEASE_NAMES = _names(WRAPPER)

#: only diffusers' naming has it (Wan's native names have ``self_attn.q``, its diffusers names ``attn1``)
DIFFUSERS_MARK = "blocks.0.self_attn.to_q."
#: only the release's naming has it
RELEASE_MARK = f"blocks.0.{WRAPPER}"
#: ComfyUI's widths: heads 128 wide (``num_heads = dim // 128``)
HEAD_DIM = 128


# --- a forward pass's inputs -------------------------------------------------------------------------
#
# The class's forward takes lists (one latent per sample), a K/V cache and a mode. A pass here is its reference
# pass (``kv_cache_mode="extract"``): dense self-attention over the driving video's latents, every weight of the
# model used once (the generation pass differs in its attention mask alone, which needs flex attention compiled).


def _keys(config: dict) -> tuple[str, ...]:
    image = ("encoder_hidden_states_image",) if config.get("use_img_emb", True) else ()
    return ("hidden_states", "condition_latents", "timestep", "encoder_hidden_states", *image)


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    out, inp = config.get("out_dim", 16), config.get("in_dim", 36)
    shapes = {
        "hidden_states": ((None, out, None, None, None),),
        "condition_latents": ((None, inp - out, None, None, None),),
        "timestep": ((None,),),
        "encoder_hidden_states": ((None, None, config.get("text_dim", 4096)),),
    }
    if config.get("use_img_emb", True):
        shapes["encoder_hidden_states_image"] = ((None, None, 1280),)
    return shapes


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Two latent frames of 16 x 16 (8 x 8 tokens), their condition channels (mask and reference latents), eight
    text tokens (the class pads them to ``text_len``) and four CLIP image tokens."""
    import torch

    out, inp = config.get("out_dim", 16), config.get("in_dim", 36)
    p = config.get("patch_size", (1, 2, 2))
    f, h, w = 2 * p[0], 8 * p[1], 8 * p[2]
    inputs = dict(
        hidden_states=torch.randn(1, out, f, h, w, generator=g),
        condition_latents=torch.randn(1, inp - out, f, h, w, generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 8, config.get("text_dim", 4096), generator=g),
    )
    if config.get("use_img_emb", True):
        inputs["encoder_hidden_states_image"] = torch.randn(1, 4, 1280, generator=g)
    return inputs


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    """The reference pass's arguments: each sample a list entry, a fresh K/V cache, the token count and grid."""
    import torch
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    x = t["hidden_states"]
    p = config.get("patch_size", (1, 2, 2))
    grid = [x.shape[2] // p[0], x.shape[3] // p[1], x.shape[4] // p[2]]
    return dict(
        hidden_states=list(x),
        condition_latents=list(t["condition_latents"]),
        timestep=t["timestep"],
        encoder_hidden_states=list(t["encoder_hidden_states"]),
        encoder_hidden_states_image=t.get("encoder_hidden_states_image"),
        kv_cache=WanAnimate2KVCache(config["num_layers"]),
        kv_cache_mode="extract",
        seq_len=math.prod(grid),
        offset_grid_sizes=torch.tensor([grid] * x.shape[0]),
        return_dict=False,
        stacked=True,  # one tensor out (the family's class, `_pass_class`; diffusers' own takes no such argument)
    )


INPUTS = ModelInputs(
    keys=_keys, shapes=_shapes, random=_random, call=_call, accepts=_keys({"use_img_emb": True})
)


@cache
def _pass_class():
    """diffusers' class as a pass runs it: asked with ``stacked=True`` (`INPUTS`' call), its output (a list, one
    sample each) stacked into one tensor, what a pass compares; otherwise diffusers' own. Its rotary tables are made
    on the inputs' device (the class asks its patch embedding's weight, which a streamed pass fills only when that
    layer runs: on the meta device before)."""
    import diffusers
    import torch

    class WanAnimate2Pass(diffusers.WanAnimate2Transformer3DModel):
        def forward(self, hidden_states, *args, stacked: bool = False, **kwargs):
            self._inputs_on = hidden_states[0].device
            out = super().forward(hidden_states, *args, **kwargs)
            return (torch.stack(out[0]),) if stacked else out

        def _rope_freqs(self, offsets, device):
            return super()._rope_freqs(offsets, self._inputs_on if device.type == "meta" else device)

    return WanAnimate2Pass


# --- what the bundled recipes quantize ---------------------------------------------------------------------

ATTENTION = r"blocks\.\d+\.(self_attn|cross_attn)\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)"
FFN_UP, FFN = r"blocks\.\d+\.ffn\.0", r"blocks\.\d+\.ffn\.(0|2)"
_KEPT = (
    "patch, text and time embeddings, time_projection, every modulation, head, img_emb (Wan2.1 I2V's, for its "
    "reasons; Animate-2 adds no layer)"
)
_POLICY = dict(
    targets=(ATTENTION, FFN_UP),
    quantized=(
        "self/cross attention to_q, to_k, to_v, to_out.0, add_k_proj, add_v_proj and ffn.0 of every block (in "
        "diffusers' names, the release's read so; ComfyUI's and GGUF's files write Wan's q, k, v, o, k_img, v_img)"
    ),
    kept=f"{_KEPT}; ffn.2 where a format has one scale per row or tensor",
    block_targets=(ATTENTION, FFN),
    block_why=BLOCK_WHY,
    sensitive=(r"blocks\.0\..*", r"blocks\.\d+\.ffn\.2"),
    sensitive_why=SENSITIVE_WHY,
)
POLICY = Policy(
    what="Wan-Animate-2 as Wan-AI releases it (one file at the root, read under diffusers' names)", **_POLICY
)
DIFFUSERS_POLICY = Policy(
    what=f"Wan-Animate-2 in diffusers layout ({CLASS} in transformer/)",
    components=("transformer",),
    **_POLICY,
)


class WanAnimate2(Family):
    name = "wan-animate2"
    title = "Wan-Animate-2"
    names = NAMES
    #: told by diffusers' names (a release is read under them first: `aliases`); ComfyUI's names are Wan's I2V
    #: names, which only the Wan family claims
    detection = Detection(CLASS, diffusers_marks=(DIFFUSERS_MARK,), own_marks=(DIFFUSERS_MARK,))
    aliases = Aliases(
        marks=(RELEASE_MARK,),
        names=RELEASE_NAMES,
        what="Wan-Animate-2's release names (each block in its in-context wrapper, blocks.N.block.*)",
    )
    folders = Folders(
        "wan-animate2-diffusers",
        "wan-animate2",
        "Wan-Animate-2 as Wan-AI releases it (one model at the root, its own names, no config.json)",
    )
    plan = PlanPolicy(
        gguf_architecture="wan",  # ComfyUI-GGUF reads "wan"; ComfyUI then builds WAN_Animate2 from the metadata
        carried=Carried(written=(("config", COMFYUI_CONFIG),)),
        release_stem="diffusion_pytorch_model",  # its outputs in diffusers' names are diffusers' own folder
    )
    lora = WanVariant.lora
    card = CardWords(pipeline_tag="image-to-video")
    policies = {"wan-animate2": POLICY, "wan-animate2-diffusers": DIFFUSERS_POLICY}

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """A diffusers ``transformer/`` or bare folder (config.json naming the class), or the release: a root in
        diffusers' names (the release's, read so) with no config.json."""
        found = []
        transformer = open_("transformer")
        if transformer is not None and self.is_diffusers(transformer, registered):
            why = f"{self.title}, diffusers layout ({CLASS} in transformer/)"
            found.append(self.layout(why, self.folders.diffusers))
        root = open_(".")
        if root is not None and self.naming(root.tensors) == "diffusers":
            if config_class(root.config) == CLASS:
                found.append(self.layout(f"{self.title}, a bare {CLASS} folder", self.folders.diffusers))
            elif root.config is None:
                found.append(self.layout(self.folders.release_why, self.folders.release))
        return found

    def diffusers_name(self, native_name: str) -> str | None:
        """ComfyUI's name -> diffusers'; a name diffusers' class holds is its own (a release is read under them:
        a forward pass of it maps each to itself)."""
        own = NAMES.diffusers(native_name)
        if own is not None:
            return own
        return native_name if NAMES.native(native_name) is not None else None

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def build_model(self, config: dict):
        """diffusers' class, which a pass asks for its samples as one tensor (`_pass_class`)."""
        return _pass_class().from_config(config)

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        return self.diffusers_config({}, tensors, where)

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """The class's config read off the shapes (in diffusers' names: the release's are read so), the heads
        128 wide as ComfyUI builds them; every block must hold what block 0 holds (a partial file is refused
        naming the first tensor it lacks)."""
        shape = shape_reader(tensors, where, "a Wan-Animate-2 DiT")
        patch = shape("patch_embedding.weight")
        dim, layers = patch[0], count_blocks(tensors, "blocks.")
        _check_blocks(tensors, layers, where)
        heads = int(config.get("num_heads") or max(dim // HEAD_DIM, 1))
        return {
            "_class_name": CLASS,
            "patch_size": list(patch[2:]),
            "in_dim": patch[1],
            "dim": dim,
            "ffn_dim": shape("blocks.0.ffn.0.weight")[0],
            "freq_dim": shape("time_embedding.0.weight")[1],
            "text_dim": shape("text_embedding.0.weight")[1],
            "out_dim": shape("head.head.weight")[0] // math.prod(patch[2:]),
            "num_heads": heads,
            "num_layers": layers,
            "use_img_emb": "img_emb.proj.1.weight" in tensors,
        }


def _check_blocks(tensors: Mapping[str, TensorInfo], layers: int, where: Path) -> None:
    """Every block holds what block 0 holds: `InputError` naming the first tensor one lacks (in diffusers' names
    and the release's, which it is read from)."""
    name = lacking_in_blocks(tensors, "blocks.", layers)
    if name is not None:
        release = RELEASE_NAMES.native(name)
        also = f" (the release's {release!r})" if release else ""
        raise InputError(
            f"{where}: no tensor {name!r}{also}, which block 0 has: a partial {WAN_ANIMATE2.title} checkpoint"
        )


WAN_ANIMATE2 = WanAnimate2()
