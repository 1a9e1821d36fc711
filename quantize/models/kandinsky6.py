"""Kandinsky 6 (TI2VA Lite and Pro; diffusers' `Kandinsky6Transformer3DModel`): everything the tool knows of it.

A text/image-to-video-and-audio DiT: a video branch and an audio branch, each with its own time, text and pooled-text
embeddings and its own text blocks (the Qwen2.5-VL tokens refined per modality), denoised together in fused blocks
(``visual_transformer_blocks``) that each hold a video and an audio decoder block (self-attention, text
cross-attention, feed-forward) and the cross-modal attentions between them (``va_cross_attention``: video reads
audio; ``av_cross_attention``: audio reads video). `Kandinsky6TI2VAPipeline` holds it with Qwen2.5-VL in
``text_encoder/`` and CLIP's text tower in ``text_encoder_2/``.

Layouts: ``kandinsky6`` only, diffusers' (``transformer/`` with the class's config.json, in a pipeline or that folder
itself). The original release (kandinskylab's native names) is not read: diffusers 0.42.1 has no single-file
converter of it (``loaders/single_file_utils.py`` knows no Kandinsky), so there is no oracle of its names; a folder
without config.json is refused (`Kandinsky6.diffusers_config`).

Names: diffusers' own. `NAMES` maps each to itself: the tool knows no other naming of Kandinsky 6, and the table
still refuses, naming it, a tensor the class does not have. Told from Kandinsky 5, whose block names it shares
(``visual_transformer_blocks.0.``), by its per-modality prefixes (`MARKS`, Kandinsky 5's foreign marks).

No runtime reads a native file of it: the ComfyUI of siliconflow/ComfyUI 187eda8e has no Kandinsky 6 model (its
detection knows Kandinsky 5 only), and ComfyUI-GGUF no kandinsky6 architecture, so the ComfyUI formats and GGUF are
refused at plan time; diffusers' and transformers' readers (fp8_channel, torchao_fp8/int8, nf4) load its outputs.

What stays high precision, and why (Kandinsky 5's split, the same layers in both branches): the time, text,
pooled-text, visual, audio and token-type embeddings (the inputs every block conditions on, and an Embedding
is looked up, not multiplied); every modulation layer (text, visual, va/av and the out layers' own: they take the
timestep, and diffusers keeps them float32 itself, ``_keep_in_fp32_modules``); both out layers (the velocity
itself); and ``feed_forward.net.2`` of every block (the down projection, fed by GELU's outliers). The audio branch is
quantized as the video branch is: its blocks are the same kinds of layer, and keeping them would leave a large
share of the model in bf16.

>>> KANDINSKY6.native_name("visual_transformer_blocks.3.va_cross_attention.to_key.weight")
'visual_transformer_blocks.3.va_cross_attention.to_key.weight'
>>> KANDINSKY6.native_name("visual_transformer_blocks.3.cross_attention.to_key.weight") is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..read.files import config_class
from .family import Detection, Family, Folders, LoraNames, ModelInputs, PlanPolicy, SourceLayout
from .names import BlockNames, Blocks
from .policy import Policy
from .readers import no_gguf_reader

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["KANDINSKY6", "Kandinsky6", "NAMES", "MARKS", "SR_MARKS"]

# --- names ---------------------------------------------------------------------------------------------

_ATTENTION = ("to_query", "to_key", "to_value", "out_layer", "query_norm", "key_norm")
_FEED_FORWARD = ("feed_forward.net.0.proj", "feed_forward.net.2")
_BRANCHES = ("video", "audio")


def _same(names: Sequence[str]) -> dict[str, str]:
    return {n: n for n in names}


def _attention(prefix: str) -> list[str]:
    return [f"{prefix}.{m}" for m in _ATTENTION]


def _decoder(prefix: str) -> list[str]:
    """A decoder block's modules (`Kandinsky6TransformerDecoderBlock`) under `prefix`."""
    return [
        f"{prefix}.visual_modulation.out_layer",
        *_attention(f"{prefix}.self_attention"),
        *_attention(f"{prefix}.cross_attention"),
        *(f"{prefix}.{m}" for m in _FEED_FORWARD),
    ]


#: diffusers' names -> themselves: the only naming of Kandinsky 6 this tool knows (see the module's docstring)
NAMES = BlockNames(
    root_modules=_same(
        [
            "visual_embeddings.in_layer",
            "visual_token_type_embeddings",
            "out_layer.modulation.out_layer",
            "out_layer.out_layer",
            "audio_embeddings.in_layer",
            "audio_embeddings.norm",
            "audio_out_layer.modulation.out_layer",
            "audio_out_layer.out_layer",
            *(
                f"{b}_{m}"
                for b in _BRANCHES
                for m in (
                    "time_embeddings.timestep_embedder.linear_1",
                    "time_embeddings.timestep_embedder.linear_2",
                    "text_embeddings.in_layer",
                    "text_embeddings.norm",
                    "pooled_text_embeddings.in_layer",
                    "pooled_text_embeddings.norm",
                )
            ),
        ]
    ),
    root_tensors={},
    blocks=(
        *(
            Blocks(
                f"{b}_text_transformer_blocks",
                f"{b}_text_transformer_blocks",
                modules=_same(["text_modulation.out_layer", *_attention("attn"), *_FEED_FORWARD]),
            )
            for b in _BRANCHES
        ),
        Blocks(
            "visual_transformer_blocks",
            "visual_transformer_blocks",
            modules=_same(
                [
                    *_decoder("video_dec_block"),
                    *_decoder("audio_dec_block"),
                    *_attention("va_cross_attention"),
                    *_attention("av_cross_attention"),
                    "va_modulation.out_layer",
                    "av_modulation.out_layer",
                ]
            ),
        ),
    ),
)

#: name prefixes only Kandinsky 6's transformer has (Kandinsky 5 shares ``visual_transformer_blocks.``): how a model
#: without config.json is told, and what makes a model never Kandinsky 5's
MARKS = ("video_text_embeddings.", "video_text_transformer_blocks.", "audio_out_layer.")
#: what only Kandinsky 6's super-resolution transformer (`Kandinsky6SRTransformer3DModel`) has: the bias its
#: conversion folds the empty caption's pooled text into. No family of this tool runs it (see `Kandinsky6`);
#: Kandinsky 5 must not claim it by its shared block names
SR_MARKS = ("pooled_bias",)

# --- a forward pass's inputs -------------------------------------------------------------------------------


def _keys(config: dict) -> tuple[str, ...]:
    keys = ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections", "audio_hidden_states")
    return keys + (("visual_token_type_ids",) if config.get("visual_token_type_num_embeddings") else ())


def _visual_channels(config: dict) -> int:
    """The channels of the video latent input: the noise, and with visual_cond the image latent and a mask."""
    c = config["in_visual_dim"]
    return 2 * c + 1 if config.get("visual_cond") else c


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, None, None, _visual_channels(config)),),
        "encoder_hidden_states": ((None, None, config["in_text_dim"]),),
        "timestep": ((None,),),
        "pooled_projections": ((None, config["in_text_dim2"]),),
        "audio_hidden_states": ((None, None, config["in_audio_dim"]),),
        "visual_token_type_ids": ((None, None),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A video of 2 latent frames of 4 x 4 patches, 6 text tokens, 8 audio latents: both branches and the
    cross-modal attentions run."""
    import torch

    p = config.get("patch_size", (1, 2, 2))
    frames, h, w = 2 * p[0], 4 * p[1], 4 * p[2]
    x = dict(
        hidden_states=torch.randn(1, frames, h, w, _visual_channels(config), generator=g),
        encoder_hidden_states=torch.randn(1, 6, config["in_text_dim"], generator=g),
        timestep=torch.tensor([500.0]),
        pooled_projections=torch.randn(1, config["in_text_dim2"], generator=g),
        audio_hidden_states=torch.randn(1, 8, config["in_audio_dim"], generator=g),
    )
    if config.get("visual_token_type_num_embeddings"):
        # the pipeline's with an image: 0 for each generated frame, 1 for the reference frame it appends
        x["visual_token_type_ids"] = torch.zeros(1, frames // p[0], dtype=torch.long)
        x["visual_token_type_ids"][:, -1] = 1
    return x


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    return dict(t, return_dict=False)


INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=_call,
    accepts=(
        "hidden_states",
        "encoder_hidden_states",
        "timestep",
        "pooled_projections",
        "audio_hidden_states",
        "visual_token_type_ids",
    ),
)

_BLOCKS = (
    r"((video|audio)_text_transformer_blocks\.\d+|visual_transformer_blocks\.\d+\.(video|audio)_dec_block)"
)

POLICY = Policy(
    what="Kandinsky 6 DiT in diffusers layout (transformer/)",
    components=("transformer",),
    targets=(
        rf"{_BLOCKS}\.(attn|self_attention|cross_attention)\.(to_query|to_key|to_value|out_layer)",
        r"visual_transformer_blocks\.\d+\.(va|av)_cross_attention\.(to_query|to_key|to_value|out_layer)",
        rf"{_BLOCKS}\.feed_forward\.net\.0\.proj",
    ),
    quantized=(
        "every attention projection (to_query, to_key, to_value, out_layer) of the video and audio text blocks, of "
        "the video and audio decoder blocks and of the cross-modal va/av attentions, and feed_forward.net.0.proj "
        "of every block"
    ),
    kept=(
        "the time, text, pooled-text, visual, audio and token-type embeddings, every modulation layer (diffusers "
        "keeps them float32), both out layers, and feed_forward.net.2 of every block (Kandinsky 5's split: the "
        "layers that take the timestep or feed the residual stream from GELU's outliers)"
    ),
    checks={"nf4": {"min_forward_sqnr_db": 15}},
)


class Kandinsky6(Family):
    """Kandinsky 6's TI2VA transformer. Its super-resolution transformer (`Kandinsky6SRTransformer3DModel`, a
    text-free DiT of other names, 1.4B at its defaults) is another class and no layout of this family: its forward
    runs NABLA sparse attention on flex attention alone, on a token grid of 8 x 8 blocks."""

    name = "kandinsky6"
    title = "Kandinsky 6"
    names = NAMES
    detection = Detection("Kandinsky6Transformer3DModel", diffusers_marks=MARKS)
    folders = Folders("kandinsky6")
    plan = PlanPolicy(
        no_gguf_why=no_gguf_reader("Kandinsky 6") + " (ComfyUI-GGUF has no kandinsky6 architecture)",
        unread_by=("comfyui",),
        unread_why="no Kandinsky 6 in ComfyUI 187eda8e (its model detection knows Kandinsky 5 only)",
        plain_weights=(r"visual_token_type_embeddings\.",),
    )
    lora = LoraNames(prefixes=("transformer.", "base_model.model."))
    policies = {"kandinsky6": POLICY}

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """The diffusers layouts (`Family.layouts`), of a model whose blocks are whole (`_check_blocks`)."""
        found = super().layouts(folder, open_, registered)
        if found:
            for rel in ("transformer", "."):
                comp = open_(rel)
                if comp is not None and config_class(comp.config) == self.diffusers_class:
                    _check_blocks(comp)
        return found

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """Its config is diffusers' config.json, which every layout it is read from holds: a model without one
        is refused (its RoPE axes and audio widths are not all in the shapes)."""
        if config.get("_class_name") == self.diffusers_class:
            return dict(config)
        raise InputError(
            f"{where}: a {self.title} transformer without diffusers' config.json ({self.diffusers_class}): "
            f"{self.title} is read from diffusers' transformer/ folder only"
        )


#: each list of blocks -> the config.json field that counts them, and the class's default
_BLOCK_COUNTS = {
    "video_text_transformer_blocks": ("num_text_blocks", 4),
    "audio_text_transformer_blocks": ("num_text_blocks", 4),
    "visual_transformer_blocks": ("num_visual_blocks", 60),
}


def _check_blocks(comp: Component) -> None:
    """`InputError` in one line where a list of blocks is not as config.json counts it, or a block lacks a
    tensor the others of its list hold (a file cut or edited by hand): named, before anything is written, rather
    than a checkpoint that diffusers' loader refuses."""
    config, where = comp.config or {}, comp.where
    for blocks, (key, default) in _BLOCK_COUNTS.items():
        held: dict[int, set[str]] = {}
        for name in comp.tensors:
            head, _, rest = name.partition(f"{blocks}.")
            number, _, leaf = rest.partition(".")
            if not head and number.isdigit():
                held.setdefault(int(number), set()).add(leaf)
        want = config.get(key, default)
        lacking = next((i for i in range(want) if i not in held), None)
        if lacking is not None:
            raise InputError(
                f"{where}: no tensor of {blocks}.{lacking}: config.json's {key} is {want}, and the tensors hold "
                f"{len(held)} of those blocks"
            )
        if len(held) > want:
            raise InputError(
                f"{where}: the tensors hold {len(held)} {blocks}, and config.json's {key} is {want}"
            )
        every = set().union(*held.values()) if held else set()
        for i in sorted(held):
            missing = sorted(every - held[i])
            if missing:
                raise InputError(
                    f"{where}: tensor {f'{blocks}.{i}.{missing[0]}'!r} is missing: the other {blocks} of this "
                    f"{KANDINSKY6.title} transformer hold it"
                )


KANDINSKY6 = Kandinsky6()
