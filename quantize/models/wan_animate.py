"""Wan2.2 Animate (Wan-AI/Wan2.2-Animate-14B; diffusers' `WanAnimateTransformer3DModel`): a Wan I2V with pose, face
and motion conditioning.

Layouts (`WanAnimate.layouts`): ``wan-animate`` (the release as Wan-AI ships it: shards at the root, original names,
config.json of ``WanAnimateModel``) and ``wan-animate-diffusers`` (a diffusers ``transformer/``, or that folder
itself).

The model: Wan2.1's I2V (`wan.NAMES`: blocks, ``img_emb``, ``k_img`` / ``v_img``, shared and not repeated), plus
``pose_patch_embedding`` (a Conv3d of the 16 pose-latent channels, added to every frame but the first), the motion
encoder (LIA's StyleGAN2-style image encoder: ``motion_encoder.enc.net_app.convs`` 0-8 on a 512 x 512 face crop,
``enc.fc`` 0-4, its "equalized" Linears scaled at run time, and ``dec.direction``, QR-orthogonalized), the face
encoder (causal Conv1d over the motion vectors of the frames, then ``out_proj`` to the model width) and the face
adapter (``face_adapter.fuser_blocks.N``, one cross-attention to the face tokens after every fifth block, its output
added straight into the residual stream). ComfyUI (``comfy/ldm/wan/model_animate.py``) hard-codes all of it: heads
128 wide, the motion encoder's channels (32 to 512) and 20 motion directions, the face encoder's 4 x 1024 channels,
and an adapter after blocks 0, 5, 10, ... (so ``num_layers`` is a multiple of 5).

Names: diffusers' single-file loader maps this model with ``convert_wan_transformer_to_diffusers`` (not the
``convert_wan_animate_2_...`` one, which is for ``WanAnimate2Transformer3DModel``, another model): the tests' oracle.
`NAMES` is that mapping read both ways, and three kinds of the release's tensors are not one diffusers tensor of
the same shape under another name; each is declared, and every stage follows:

- ``face_adapter.fuser_blocks.N.linear1_kv`` (weight [2 dim, dim] and bias): the fused key/value projection, a stack
  (`Blocks.stacked`) of diffusers' ``face_adapter.N.to_k`` (its first half of the rows, as the converter splits it)
  and ``to_v`` (the second); a forward pass and the loader cut it by row ranges;
- ``motion_encoder.enc.net_app.convs.*.bias`` (15 of them): the fused leaky ReLUs' biases, [1, C, 1, 1] in the
  release (and in ComfyUI), [C] in diffusers (``...act_fn.bias``): the same values, renamed by the table and viewed
  to the parameter's shape where they go into the class (`models.same_but_size_one_dims`);
- ``motion_encoder.enc.net_app.convs.{1..7}.conv2.0.kernel`` and ``.skip.0.kernel``: the blur filter (a constant
  4 x 4 buffer the release saves: LIA's ``make_kernel((1, 3, 3, 1))``, which diffusers computes and stores none
  of): carried as stored (`Carried.tensors`), no part of the class.

So the release converts to every format (its own names, or ComfyUI's and GGUF's, which are the same) and it and
each of its outputs run as the diffusers class (``verify --forward``, ``sensitivity``, `loaders.load_quantized`);
a diffusers ``transformer/`` converts to the formats that keep its names only: its halves of ``linear1_kv`` and its
[C] biases have no one native tensor a renaming writes (`NOT_ONE_TO_ONE`, refused naming the tensor).

>>> WAN_ANIMATE.native_name("face_adapter.2.to_out.weight"), WAN_ANIMATE.diffusers_name("face_encoder.conv2.conv.bias")
('face_adapter.fuser_blocks.2.linear2.weight', 'face_encoder.conv2.bias')
>>> WAN_ANIMATE.names.native_stack("face_adapter.fuser_blocks.2.linear1_kv.bias")
(('face_adapter.2.to_k.bias', 0, 1), ('face_adapter.2.to_v.bias', 0, 1))
>>> WAN_ANIMATE.carried("motion_encoder.enc.net_app.convs.3.skip.0.kernel")
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import CardWords, Carried, Folders, ModelInputs, PlanPolicy
from .names import BlockNames, Blocks, Rows
from .policy import FormatTargets, Policy, Refused
from .wan import INPUTS as WAN_INPUTS
from .wan import NAMES as WAN_NAMES
from .wan import ROOT_MODULES, WanVariant
from .wan import WAN_DIFFUSERS_POLICY as WAN_D
from .wan import WAN_POLICY as WAN_P

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = [
    "WAN_ANIMATE",
    "WanAnimate",
    "NAMES",
    "ANIMATE_MARKS",
    "BLUR_KERNELS",
    "NOT_ONE_TO_ONE",
    "MOTION_CHANNEL_SIZES",
]

#: what only an Animate model has, in either naming
ANIMATE_MARKS = ("motion_encoder.", "face_encoder.", "face_adapter.", "pose_patch_embedding.")

#: the motion encoder as ComfyUI and the release build it: a 512 x 512 face crop, 7 downsampling residual blocks
#: (each channel count in, out: `MOTION_CHANNEL_SIZES`), 512 style features, 20 motion directions
MOTION_SIZE = 512
MOTION_CHANNELS = ((32, 64), (64, 128), (128, 256), (256, 512), (512, 512), (512, 512), (512, 512))
MOTION_STYLE_DIM = 512
MOTION_DIM = 20
#: the face encoder: motion vectors of MOTION_STYLE_DIM in, FACE_HEADS x FACE_HIDDEN channels, then out_proj
FACE_HIDDEN = 1024
FACE_HEADS = 4
#: a face adapter block after every this many blocks (ComfyUI's ``i % 5``), from block 0
FACE_EVERY = 5

_CONVS = "motion_encoder.enc.net_app.convs"

#: the motion encoder's channels at each feature-map size (its keys as diffusers' config writes them), ComfyUI's
MOTION_CHANNEL_SIZES = {"512": 32, "256": 64, "128": 128, "64": 256, "32": 512, "16": 512, "8": 512, "4": 512}


def motion_channel_sizes(tensors: Mapping[str, TensorInfo], blocks: int) -> dict[str, int]:
    """The channels at each feature-map size of a release's motion encoder of `blocks` residual blocks, read off
    ``conv_in`` (the input size's) and each block's ``conv2`` (the next size down's)."""
    size = 2 ** (blocks + 2)
    channels = {str(size): tensors[f"{_CONVS}.0.0.weight"].shape[0]}
    for i in range(1, blocks + 1):
        channels[str(size >> i)] = tensors[f"{_CONVS}.{i}.conv2.1.weight"].shape[0]
    return channels


NAMES = BlockNames(
    root_modules={
        **ROOT_MODULES,
        "pose_patch_embedding": "pose_patch_embedding",
        "motion_encoder.conv_in": f"{_CONVS}.0.0",
        **{
            f"motion_encoder.res_blocks.{i}.{d}": f"{_CONVS}.{i + 1}.{n}"
            for i in range(len(MOTION_CHANNELS))
            for d, n in (("conv1", "conv1.0"), ("conv2", "conv2.1"), ("conv_skip", "skip.1"))
        },
        "motion_encoder.conv_out": f"{_CONVS}.{len(MOTION_CHANNELS) + 1}",
        **{f"motion_encoder.motion_network.{j}": f"motion_encoder.enc.fc.{j}" for j in range(5)},
        **{f"face_encoder.{c}": f"face_encoder.{c}.conv" for c in ("conv1_local", "conv2", "conv3")},
        "face_encoder.out_proj": "face_encoder.out_proj",
    },
    root_tensors={
        **WAN_NAMES.root_tensors,
        "motion_encoder.motion_synthesis_weight": "motion_encoder.dec.direction.weight",
        "face_encoder.padding_tokens": "face_encoder.padding_tokens",
        # the fused leaky ReLUs' biases: [C] in diffusers, [1, C, 1, 1] in the release (the same values)
        "motion_encoder.conv_in.act_fn.bias": f"{_CONVS}.0.1.bias",
        **{
            f"motion_encoder.res_blocks.{i}.{d}.act_fn.bias": f"{_CONVS}.{i + 1}.{n}.bias"
            for i in range(len(MOTION_CHANNELS))
            for d, n in (("conv1", "conv1.1"), ("conv2", "conv2.2"))
        },
    },
    blocks=(
        *WAN_NAMES.blocks,
        Blocks(
            "face_adapter",
            "face_adapter.fuser_blocks",
            modules={"to_q": "linear1_q", "to_out": "linear2", "norm_q": "q_norm", "norm_k": "k_norm"},
            # the release fuses to_k and to_v: k the first half of the rows (diffusers' converter splits it so)
            stacked={"linear1_kv": (Rows("to_k"), Rows("to_v"))},
        ),
    ),
)

#: the release's blur filters (`carried_tensors`): constant buffers diffusers computes and holds none of
BLUR_KERNELS = rf"{re.escape(_CONVS)}\.\d+\.(conv2|skip)\.0\.kernel"

#: (pattern of a diffusers tensor name, why it has no one native tensor a renaming writes): why a diffusers-named
#: model has no output in native names (`WanAnimate.refuse_native`)
NOT_ONE_TO_ONE = (
    (
        re.compile(r"face_adapter\.\d+\.(to_k|to_v)\.(weight|bias)"),
        "is half of the face adapter's key/value projection, which the original release (and ComfyUI) holds fused "
        "with the other half (linear1_kv)",
    ),
    (
        re.compile(r"motion_encoder\.(conv_in|res_blocks\.\d+\.conv[12])\.act_fn\.bias"),
        "is a motion-encoder activation bias of shape [C], which the original release (and ComfyUI) holds as "
        "[1, C, 1, 1]",
    ),
)


def not_one_to_one(name: str) -> str | None:
    """Why diffusers tensor `name` has no one native tensor a renaming writes, or None."""
    return next((why for pattern, why in NOT_ONE_TO_ONE if pattern.fullmatch(name)), None)


# --- a forward pass's inputs -------------------------------------------------------------------------

#: the text context length the I2V cross-attention assumes (diffusers' WanAttnProcessor splits the image tokens
#: off as everything before the last 512)
TEXT_LEN = 512


def _keys(config: dict) -> tuple[str, ...]:
    return (*WAN_INPUTS.keys(config), "pose_hidden_states", "face_pixel_values")


def _latent_channels(config: dict) -> int:
    return config.get("latent_channels") or (config["in_channels"] - 4) // 2


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    size = config.get("motion_encoder_size", MOTION_SIZE)
    return {
        **WAN_INPUTS.shapes(config),
        "timestep": ((None,),),
        "pose_hidden_states": ((None, _latent_channels(config), None, None, None),),
        "face_pixel_values": ((None, 3, None, size, size),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Wan's I2V inputs with a text context of 512 tokens (as the pipeline pads it; the attention takes the tokens
    before the last 512 as the image's), the pose latents of every frame but the first, and one face frame: the
    face encoder makes it two face tokens' frames with its padding frame, one for each latent frame."""
    import torch

    inputs = WAN_INPUTS.random(config, g)
    b, _, f, h, w = inputs["hidden_states"].shape
    inputs["encoder_hidden_states"] = torch.randn(1, TEXT_LEN, config["text_dim"], generator=g)
    inputs["pose_hidden_states"] = torch.randn(b, _latent_channels(config), f - 1, h, w, generator=g)
    size = config.get("motion_encoder_size", MOTION_SIZE)
    inputs["face_pixel_values"] = torch.rand(b, 3, f - 1, size, size, generator=g) * 2 - 1
    return inputs


INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"image_dim": 1}),
)


#: why ComfyUI's and GGUF's native names cannot be written from diffusers' names (`NOT_ONE_TO_ONE`)
NO_NATIVE_FROM_DIFFUSERS = (
    "diffusers splits the face adapter's linear1_kv and reshapes the motion encoder's biases, which a renaming "
    "cannot undo"
)
_KEPT = (
    "patch and pose patch embeddings (5-D convolutions), {embeddings}, every modulation, {head}; the motion encoder "
    "(LIA's convolutional face-crop encoder, its equalized Linears {fc}, scaled at run time, and the "
    "QR-orthogonalized {direction}: 23M parameters whatever the model size), the face encoder (causal Conv1d and "
    "out_proj: the motion signal's embedding, like the text and time embeddings) and each face adapter block's "
    "{out} (its output is added straight into the residual stream after every fifth block, gated by no "
    "modulation: 8 dim x dim Linears in the 14B, 1.2% of its weights; `quantize sensitivity` on the small model, "
    "every Linear in NF4, ranks it 8th most sensitive of 65 and face_encoder.out_proj 9th)"
)
#: torchao's dynamic per-row FP8 activation scale of an all-zero row is 0: NaN in diffusers' forward
_ZERO_ROWS = (
    "the face adapter's {kv} kept: their input always holds exactly-zero rows (the all-zero face frame the model "
    "prepends to the motion tokens, layer-normed), and torchao's dynamic per-row FP8 activation scale of a zero "
    "row is 0, so diffusers' forward gives NaN there (measured: from_pretrained on the tiny example; TorchAO INT8 "
    "and our loader are finite)"
)
_FACE = r"face_adapter\.fuser_blocks\.\d+\.(linear1_q|linear1_kv)"
_DIFFUSERS_FACE = r"face_adapter\.\d+\.(to_q|to_k|to_v)"
POLICY = Policy(
    what="Wan2.2 Animate (original key names, shards at the root, WanAnimateModel)",
    targets=(*WAN_P.targets, _FACE),
    quantized=f"{WAN_P.quantized}; in the face adapter blocks linear1_q and linear1_kv (the fused k and v)",
    kept=_KEPT.format(
        embeddings="text, time and image embeddings (img_emb), time_projection",
        head="head",
        fc="enc.fc",
        direction="dec.direction",
        out="linear2",
    )
    + "; ffn.2 where a format has one scale per row or tensor",
    block_targets=(*WAN_P.block_targets, _FACE),
    block_why=WAN_P.block_why,
    sensitive=(*WAN_P.sensitive, r"face_adapter\.fuser_blocks\.0\..*"),
    sensitive_why=(
        "the first block, the first face adapter block (it acts right after block 0) and every FFN down "
        "projection (GELU's outliers)"
    ),
    exceptions={
        "torchao_fp8": FormatTargets(
            (*WAN_P.targets, r"face_adapter\.fuser_blocks\.\d+\.linear1_q"),
            _ZERO_ROWS.format(kv="linear1_kv"),
        )
    },
)
DIFFUSERS_POLICY = Policy(
    what="Wan2.2 Animate (diffusers layout, WanAnimateTransformer3DModel in transformer/)",
    components=("transformer",),
    targets=(*WAN_D.targets, _DIFFUSERS_FACE),
    quantized=f"{WAN_D.quantized}; in the face adapter blocks to_q, to_k, to_v",
    kept=_KEPT.format(
        embeddings="condition_embedder",
        head="proj_out",
        fc="motion_network (no nn.Linear in diffusers' class)",
        direction="motion_synthesis_weight",
        out="to_out",
    )
    + "; ffn.net.2 where a format has one scale per row or tensor",
    block_targets=(*WAN_D.block_targets, _DIFFUSERS_FACE),
    block_why=WAN_D.block_why,
    exceptions={
        "torchao_fp8": FormatTargets(
            (*WAN_D.targets, r"face_adapter\.\d+\.to_q"), _ZERO_ROWS.format(kv="to_k and to_v")
        )
    },
    refused=(
        Refused(f"ComfyUI's and GGUF's native names: {NO_NATIVE_FROM_DIFFUSERS}", names=("native", "gguf")),
    ),
)


class WanAnimate(WanVariant):
    name = "wan-animate"
    title = "Wan Animate"
    names = NAMES
    #: the release's class; one naming Wan's ``WanModel`` is told by its Animate tensors
    detection = WanVariant.detect(
        "WanAnimateTransformer3DModel",
        ANIMATE_MARKS,
        release_class="WanAnimateModel",
        native_mark="face_adapter.fuser_blocks.",
        diffusers_mark="face_adapter.0.",
    )
    folders = Folders(
        "wan-animate-diffusers", "wan-animate", "Wan2.2 Animate, original names, one model at the root"
    )
    plan = PlanPolicy(
        gguf_architecture="wan",  # ComfyUI-GGUF reads "wan"; ComfyUI then tells Animate by its face adapter
        #: the motion encoder's "equalized" layers are plain parameters scaled per call in ComfyUI (``EqualLinear``)
        #: and diffusers alike, not Linear layers: a GGUF file holds them as F32, which both read as they are (as
        #: BF16 they come back as GGML's raw bytes, which only a Linear layer decodes: measured in ComfyUI)
        plain_weights=(r"motion_encoder\.",),
        #: the release's blur filters: the class computes them
        carried=Carried(tensors=(BLUR_KERNELS,)),
        diffusers_not_native_why=NO_NATIVE_FROM_DIFFUSERS,
    )
    card = CardWords(pipeline_tag="image-to-video")
    policies = {"wan-animate": POLICY, "wan-animate-diffusers": DIFFUSERS_POLICY}

    def refuse_native(self, names: Sequence[str], where: str, fmt: str) -> None:
        """`Family.refuse_native`, naming first, by what it is, a diffusers tensor with no one native tensor."""
        if self.naming(names) == "diffusers":
            _refuse_not_one_to_one(
                names, where, "this format writes the original release's names (ComfyUI's, GGUF's)"
            )
        super().refuse_native(names, where, fmt)

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def variant_config(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path, base: dict
    ) -> dict:
        """The Animate parts' sizes read off the tensors: the pose latents' channels, the motion and face
        encoders' widths, a face adapter block every 5 blocks."""
        try:
            pose = tensors["pose_patch_embedding.weight"].shape
            fc0 = tensors["motion_encoder.enc.fc.0.weight"].shape
            direction = tensors["motion_encoder.dec.direction.weight"].shape
            local = tensors["face_encoder.conv1_local.conv.weight"].shape
            hidden = tensors["face_encoder.conv2.conv.weight"].shape[0]
        except KeyError as e:
            raise InputError(f"{where}: no {e.args[0]}: not a Wan Animate model") from None
        blocks = 0
        while f"{_CONVS}.{blocks + 1}.conv1.0.weight" in tensors:
            blocks += 1
        channels = motion_channel_sizes(tensors, blocks)
        return {
            "latent_channels": pose[1],
            "motion_encoder_size": 2 ** (blocks + 2),
            # only where they are not ComfyUI's (a test preset's narrow encoder): the class's default otherwise
            **({} if channels == MOTION_CHANNEL_SIZES else {"motion_encoder_channel_sizes": channels}),
            "motion_style_dim": fc0[1],
            "motion_dim": direction[1],
            "motion_encoder_dim": direction[0],
            "face_encoder_hidden_dim": hidden,
            "face_encoder_num_heads": local[0] // hidden,
            "inject_face_latents_blocks": FACE_EVERY,
        }


def _refuse_not_one_to_one(names: Sequence[str], where, then: str) -> None:
    for name in names:
        why = not_one_to_one(name)
        if why is not None:
            raise InputError(f"{where}: tensor {name!r} {why}: {then}")


WAN_ANIMATE = WanAnimate()
