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
  of): carried as stored (`Family.carried_tensors`), no part of the class.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .base import BlockNames, Blocks, ExampleModel, Family, ModelInputs, Rows, SourceLayout
from .wan import NAMES as WAN_NAMES
from .wan import ROOT_MODULES, WAN, WanShape, _linear, wan_config, wan_naming, wan_tensors
from .wan_vace import diffusers_example

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "WAN_ANIMATE",
    "WanAnimate",
    "AnimateShape",
    "NAMES",
    "ANIMATE_MARKS",
    "BLUR_KERNELS",
    "NOT_ONE_TO_ONE",
]

#: what only an Animate model has, in either naming
ANIMATE_MARKS = ("motion_encoder.", "face_encoder.", "face_adapter.", "pose_patch_embedding.")

#: the motion encoder as ComfyUI and the release build it: a 512 x 512 face crop, 7 downsampling residual blocks
#: (each channel count in, out), 512 style features, 20 motion directions
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
#: model has no output in native names (`WanAnimate._refuse_diffusers_as_native`)
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
    return (*WAN.inputs.keys(config), "pose_hidden_states", "face_pixel_values")


def _latent_channels(config: dict) -> int:
    return config.get("latent_channels") or (config["in_channels"] - 4) // 2


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    size = config.get("motion_encoder_size", MOTION_SIZE)
    return {
        **WAN.inputs.shapes(config),
        "timestep": ((None,),),
        "pose_hidden_states": ((None, _latent_channels(config), None, None, None),),
        "face_pixel_values": ((None, 3, None, size, size),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Wan's I2V inputs with a text context of 512 tokens (as the pipeline pads it; the attention takes the tokens
    before the last 512 as the image's), the pose latents of every frame but the first, and one face frame: the
    face encoder makes it two face tokens' frames with its padding frame, one for each latent frame."""
    import torch

    inputs = WAN.inputs.random(config, g)
    b, _, f, h, w = inputs["hidden_states"].shape
    inputs["encoder_hidden_states"] = torch.randn(1, TEXT_LEN, config["text_dim"], generator=g)
    inputs["pose_hidden_states"] = torch.randn(b, _latent_channels(config), f - 1, h, w, generator=g)
    size = config.get("motion_encoder_size", MOTION_SIZE)
    inputs["face_pixel_values"] = torch.rand(b, 3, f - 1, size, size, generator=g) * 2 - 1
    return inputs


_INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"image_dim": 1}),
)


# --- examples --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnimateShape:
    """An example Animate: its Wan (an I2V: in_dim 36 = 16 noise + 16 reference latents + 4 mask, image_dim 1280,
    text_dim 4096, freq_dim 256, 128-wide heads), with `num_layers` a multiple of 5 (a face adapter block every 5).
    The motion and face encoders have ComfyUI's fixed sizes whatever the preset."""

    wan: WanShape

    @property
    def face_blocks(self) -> int:
        return self.wan.num_layers // FACE_EVERY


def _motion_encoder_tensors() -> list[tuple[str, tuple[int, ...]]]:
    """The release's motion encoder (``wan/modules/animate/motion_encoder.py``): LIA's EncoderApp, fc and direction."""
    first = MOTION_CHANNELS[0][0]
    t: list[tuple[str, tuple[int, ...]]] = [
        (f"{_CONVS}.0.0.weight", (first, 3, 1, 1)),
        (f"{_CONVS}.0.1.bias", (1, first, 1, 1)),
    ]
    for i, (cin, cout) in enumerate(MOTION_CHANNELS, start=1):
        c = f"{_CONVS}.{i}"
        t += [
            (f"{c}.conv1.0.weight", (cin, cin, 3, 3)),
            (f"{c}.conv1.1.bias", (1, cin, 1, 1)),
            (f"{c}.conv2.0.kernel", (4, 4)),
            (f"{c}.conv2.1.weight", (cout, cin, 3, 3)),
            (f"{c}.conv2.2.bias", (1, cout, 1, 1)),
            (f"{c}.skip.0.kernel", (4, 4)),
            (f"{c}.skip.1.weight", (cout, cin, 1, 1)),
        ]
    last = MOTION_CHANNELS[-1][1]
    t += [(f"{_CONVS}.{len(MOTION_CHANNELS) + 1}.weight", (MOTION_STYLE_DIM, last, 4, 4))]
    for j in range(4):
        t += _linear(f"motion_encoder.enc.fc.{j}", MOTION_STYLE_DIM, MOTION_STYLE_DIM)
    t += _linear("motion_encoder.enc.fc.4", MOTION_DIM, MOTION_STYLE_DIM)
    return t + [("motion_encoder.dec.direction.weight", (MOTION_STYLE_DIM, MOTION_DIM))]


def animate_tensors(s: AnimateShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the original ``WanAnimateModel`` (``wan/modules/animate/model_animate.py``), in its
    module order: Wan's I2V, the pose patch embedding, the motion encoder, the face adapter, the face encoder."""
    d, heads = s.wan.dim, s.wan.num_heads
    t = wan_tensors(s.wan)
    t[2:2] = [("pose_patch_embedding.weight", (d, 16, 1, 2, 2)), ("pose_patch_embedding.bias", (d,))]
    t += _motion_encoder_tensors()
    for i in range(s.face_blocks):
        b = f"face_adapter.fuser_blocks.{i}"
        t += (
            _linear(f"{b}.linear1_kv", 2 * d, d)
            + _linear(f"{b}.linear1_q", d, d)
            + _linear(f"{b}.linear2", d, d)
        )
        t += [(f"{b}.q_norm.weight", (d // heads,)), (f"{b}.k_norm.weight", (d // heads,))]
    f = "face_encoder"
    t += [(f"{f}.conv1_local.conv.weight", (FACE_HEADS * FACE_HIDDEN, MOTION_STYLE_DIM, 3))]
    t += [(f"{f}.conv1_local.conv.bias", (FACE_HEADS * FACE_HIDDEN,))]
    for c in ("conv2", "conv3"):
        t += [(f"{f}.{c}.conv.weight", (FACE_HIDDEN, FACE_HIDDEN, 3)), (f"{f}.{c}.conv.bias", (FACE_HIDDEN,))]
    t += _linear(f"{f}.out_proj", d, FACE_HIDDEN) + [(f"{f}.padding_tokens", (1, 1, 1, d))]
    return t


def animate_config(s: AnimateShape) -> dict:
    """config.json as the release writes it (``WanAnimateModel``'s registered arguments)."""
    base = wan_config(s.wan)
    return {
        "_class_name": "WanAnimateModel",
        "_diffusers_version": "0.35.1",
        "patch_size": [1, 2, 2],
        **{k: v for k, v in base.items() if not k.startswith("_") and k != "model_type"},
        "text_dim": s.wan.text_dim,
        "window_size": [-1, -1],
        "qk_norm": True,
        "cross_attn_norm": True,
        "motion_encoder_dim": MOTION_STYLE_DIM,
        "use_context_parallel": False,
        "use_img_emb": True,
    }


def _preset(dim: int, ffn_dim: int, num_layers: int, num_heads: int) -> AnimateShape:
    return AnimateShape(
        WanShape(
            dim=dim, ffn_dim=ffn_dim, num_layers=num_layers, num_heads=num_heads, in_dim=36, image_dim=1280
        )
    )


_LAYOUTS = ("animate", "diffusers")


class WanAnimate(Family):
    name = "wan-animate"
    title = "Wan Animate"
    diffusers_class = "WanAnimateTransformer3DModel"
    #: the release's class; one naming Wan's ``WanModel`` is told by its Animate tensors (`owns`)
    native_classes = ("WanAnimateModel", "WanModel")
    names = NAMES
    native_marks = ("face_adapter.fuser_blocks.", *WAN.native_marks)
    diffusers_marks = ("face_adapter.0.", *WAN.diffusers_marks)
    gguf_architecture = "wan"  # ComfyUI-GGUF reads "wan"; ComfyUI then tells Animate by its face adapter
    modulation_names = WAN.modulation_names
    lora_prefixes = WAN.lora_prefixes
    #: the motion encoder's "equalized" layers are plain parameters scaled per call in ComfyUI (``EqualLinear``)
    #: and diffusers alike, not Linear layers: a GGUF file holds them as F32, which both read as they are (as
    #: BF16 they come back as GGML's raw bytes, which only a Linear layer decodes: measured in ComfyUI)
    plain_weights = ("motion_encoder.",)
    #: the release's blur filters: the class computes them
    carried_tensors = (BLUR_KERNELS,)
    diffusers_not_native_why = (
        "diffusers splits the face adapter's linear1_kv and reshapes the motion encoder's biases, which a renaming "
        "cannot undo"
    )
    default_recipes = {
        "wan-animate": {
            "fp8_channel": "wan-animate-fp8",
            "torchao_fp8": "wan-animate-torchao-fp8",
            "torchao_int8": "wan-animate-torchao-int8",
            "nf4": "wan-animate-nf4",
            "comfy_fp8": "wan-animate-comfy-fp8",
            "comfy_int8": "wan-animate-comfy-int8",
            "comfy_nvfp4": "wan-animate-comfy-nvfp4",
            "comfy_mxfp8": "wan-animate-comfy-mxfp8",
            "gguf": "wan-animate-gguf-q8_0",
        },
        # ComfyUI's and GGUF's native names cannot be written from diffusers' names (NOT_ONE_TO_ONE)
        "wan-animate-diffusers": {
            "fp8_channel": "wan-animate-diffusers-fp8",
            "torchao_fp8": "wan-animate-diffusers-torchao-fp8",
            "torchao_int8": "wan-animate-diffusers-torchao-int8",
            "nf4": "wan-animate-diffusers-nf4",
        },
    }
    presets = {
        "tiny": _preset(dim=128, ffn_dim=256, num_layers=5, num_heads=1),
        # every Linear width a multiple of 256 (GGML's K-quants)
        "small": _preset(dim=256, ffn_dim=768, num_layers=5, num_heads=2),
        # Wan2.2-Animate-14B
        "14b": _preset(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40),
    }
    example_layouts = _LAYOUTS
    default_preset = "small"

    # --- recognizing it ------------------------------------------------------------------------------

    def naming(self, names) -> str | None:
        """Wan's namings, of a model with Animate's tensors; None for any other."""
        names = list(names)
        return wan_naming(names) if any(n.startswith(ANIMATE_MARKS) for n in names) else None

    def owns(self, config_class: str | None, names) -> bool:
        names = list(names)
        if config_class == "WanModel":  # a release naming Wan's class: its Animate tensors tell it
            return any(n.startswith(ANIMATE_MARKS) for n in names)
        return super().owns(config_class, names)

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        found = []
        transformer = open_("transformer")
        if transformer is not None and self._is_diffusers(transformer):
            why = f"Wan Animate, diffusers layout ({self.diffusers_class} in transformer/)"
            found.append(self.layout(why, "wan-animate-diffusers"))
        root = open_(".")
        if root is not None:
            if self.naming(root.tensors) == "native":
                why = "Wan2.2 Animate, original names, one model at the root"
                found.append(self.layout(why, "wan-animate"))
            elif (root.config or {}).get("_class_name") == self.diffusers_class:
                why = f"Wan Animate, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, "wan-animate-diffusers"))
        return found

    # --- names ---------------------------------------------------------------------------------------

    def _refuse_diffusers_as_native(self, names: Sequence[str], where: str, fmt: str) -> None:
        """`Family._refuse_diffusers_as_native`, naming first, by what it is, a diffusers tensor with no one
        native tensor."""
        if self.naming(names) == "diffusers":
            _refuse_not_one_to_one(
                names, where, "this format writes the original release's names (ComfyUI's, GGUF's)"
            )
        super()._refuse_diffusers_as_native(names, where, fmt)

    # --- running it ----------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """Wan's (`Wan.diffusers_config`: an I2V's), and the Animate parts' sizes read off the tensors: the pose
        latents' channels, the motion and face encoders' widths, a face adapter block every 5 blocks."""
        base = WAN.diffusers_config(config, tensors, where)
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
        return {
            **base,
            "_class_name": self.diffusers_class,
            "latent_channels": pose[1],
            "motion_encoder_size": 2 ** (blocks + 2),
            "motion_style_dim": fc0[1],
            "motion_dim": direction[1],
            "motion_encoder_dim": direction[0],
            "face_encoder_hidden_dim": hidden,
            "face_encoder_num_heads": local[0] // hidden,
            "inject_face_latents_blocks": FACE_EVERY,
        }

    def pipeline_tag(self, config: dict) -> str | None:
        return "image-to-video"

    # --- examples ------------------------------------------------------------------------------------

    def _shape(self, preset: str, layout: str) -> AnimateShape:
        if preset not in self.presets or layout not in _LAYOUTS:
            raise InputError(
                f"Wan Animate examples: preset {preset!r}, layout {layout!r}: presets {', '.join(self.presets)}, "
                f"layouts {', '.join(_LAYOUTS)}"
            )
        return self.presets[preset]

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """``animate``: the release's root (original names, ``WanAnimateModel`` config); ``diffusers``:
        ``transformer/`` with the names and shapes diffusers' own class has (built on meta)."""
        shape = self._shape(preset, layout)
        if layout == "animate":
            return [ExampleModel(".", animate_tensors(shape), animate_config(shape))]
        return [diffusers_example(self, animate_tensors(shape), animate_config(shape))]

    def example_files(self) -> dict[str, str]:
        return WAN.example_files()

    def example_lora(self, preset: str, layout: str, rank: int) -> list[tuple[str, tuple[int, ...], str]]:
        """Every Linear of the main blocks, as Wan LoRAs are written (`Wan.example_lora`: ``diffusion_model.`` keys,
        bf16 ``lora_down`` / ``lora_up``, float32 ``alpha``); an I2V's, so with k_img and v_img."""
        tensors: list[tuple[str, tuple[int, ...], str]] = []
        for name, dims in wan_tensors(self._shape(preset, "animate").wan):
            if name.startswith("blocks.") and name.endswith(".weight") and len(dims) == 2:
                module = f"diffusion_model.{name.removesuffix('.weight')}"
                tensors += [
                    (f"{module}.lora_down.weight", (rank, dims[1]), "BF16"),
                    (f"{module}.lora_up.weight", (dims[0], rank), "BF16"),
                    (f"{module}.alpha", (), "F32"),
                ]
        return tensors


def _refuse_not_one_to_one(names: Sequence[str], where, then: str) -> None:
    for name in names:
        why = not_one_to_one(name)
        if why is not None:
            raise InputError(f"{where}: tensor {name!r} {why}: {then}")


WAN_ANIMATE = WanAnimate()
