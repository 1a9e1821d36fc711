"""LTX-2's example checkpoints: the release's one file (the transformer in native names under its prefix, with a
few tensors of each other part, its metadata ``config``, no config.json), diffusers' ``transformer/`` and a diffusers
pipeline (``transformer/`` with ``connectors/``; LTX-2.5's with its text encoder too), in three generations (2.0, 2.3,
2.5)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..ltx2 import (
    COMFYUI_HEADS,
    CONNECTOR_NAMES,
    LTX2,
    LTX23_SWITCHES,
    LTX25_COMFYUI_SWITCHES,
    LTX25_SWITCHES,
    PREFIX,
    RELEASE_CONSTANTS,
)
from .base import ExampleModel, Examples, _diffusers, diffusers_example, linear
from .gemma4 import GEMMA4_EXAMPLES

#: the text encoders a pipeline preset may hold (`Ltx2Shape.text_encoder`), by family name: LTX-2.5's Gemma 4
TEXT_ENCODERS: dict[str, Examples] = {GEMMA4_EXAMPLES.family.name: GEMMA4_EXAMPLES}

__all__ = [
    "LTX2_EXAMPLES",
    "Ltx2Shape",
    "VERSIONS",
    "connector_tensors",
    "connectors_config",
    "release_others",
    "text_projection",
]

#: the generations of LTX-2's transformer an example is made of (`Ltx2Shape.version`): ``2.0`` (the 19B) projects the
#: caption features itself (PixArt caption projections); ``2.3`` (the 22B) gates every attention per head
#: (``to_gate_logits``), modulates the text cross-attention by the timestep too (9 rows of ``scale_shift_table``,
#: ``prompt_adaln_single``, ``prompt_scale_shift_table``) and takes the connectors' outputs as they are (its text
#: projection is per modality, ahead of the connectors: ``text_embedding_projection.{video,audio}_aggregate_embed``);
#: ``2.5`` (``ltx-2.5-22b-dev-transformer-bf16.safetensors``) is 2.3's structure with no bias in the video
#: feed-forward (``ff_bias`` false; the audio one keeps its own) and the generated keyframes' learned position
#: (``keyframes_abs_pos_embedding``, one row as wide as the video stream); its release file holds the transformer and
#: the two connectors alone (the VAEs, the Gemma 4 encoder with the text projection and the duration head are files
#: of their own) and its metadata names the switches (``ff_bias``, ``audio_ff_bias``, ``use_prompt_adaln_single``,
#: ``use_keyframes_abs_pos_embedding``) as ComfyUI reads them
VERSIONS = ("2.0", "2.3", "2.5")


@dataclass(frozen=True)
class Ltx2Shape:
    """The dimensions of an example LTX-2 of a generation (`VERSIONS`). ComfyUI's 32 heads for video and audio and
    128 latent channels are kept; the head widths, the caption width, the connectors' and (2.3) the structure are
    named in the file's metadata ``config``, as the releases name them. A 2.3 connector is as wide as the attention
    it feeds (its output is the cross-attention's context, with no caption projection between)."""

    attention_head_dim: int
    audio_attention_head_dim: int
    caption_channels: int
    connector_heads: int
    connector_head_dim: int
    num_layers: int = 48
    connector_layers: int = 2
    heads: int = COMFYUI_HEADS
    audio_heads: int = COMFYUI_HEADS
    in_channels: int = 128
    audio_in_channels: int = 128
    #: Gemma hidden states of this many layers, concatenated, are what text_embedding_projection takes (49)
    text_layers: int = 49
    #: the connectors' learnable registers (ComfyUI's Embeddings1DConnector: 128)
    registers: int = 128
    version: str = "2.0"
    #: the audio connector's heads and their width (ComfyUI's ``audio_connector_*``; None: the video connector's)
    audio_connector_heads: int | None = None
    audio_connector_head_dim: int | None = None
    #: the text encoder a pipeline example holds in ``text_encoder/`` (family, preset of its examples; None: none):
    #: its hidden width and layers + 1 are the preset's `caption_channels` and `text_layers` (the hidden states of
    #: every layer and the embeddings, concatenated, are what the text projection takes)
    text_encoder: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"LTX-2 version {self.version!r}: one of {', '.join(VERSIONS)}")
        widths = (self.connector_width, self.audio_connector_width)
        if self.v23 and widths != (self.dim, self.audio_dim):
            raise ValueError(
                f"LTX-2.3 connectors {widths} wide feed attentions {self.dim, self.audio_dim} wide"
            )

    @property
    def v23(self) -> bool:
        """The 2.3 structure (2.3's and 2.5's): gated attention, the text cross-attention's adaLN, no caption
        projection."""
        return self.version in ("2.3", "2.5")

    @property
    def v25(self) -> bool:
        """LTX-2.5's: no bias in the video feed-forward, the keyframes' position embedding, a release of the
        transformer and connectors alone."""
        return self.version == "2.5"

    @property
    def dim(self) -> int:
        return self.heads * self.attention_head_dim

    @property
    def audio_dim(self) -> int:
        return self.audio_heads * self.audio_attention_head_dim

    @property
    def audio_connector(self) -> tuple[int, int]:
        """The audio connector's heads and head width."""
        return (
            self.audio_connector_heads or self.connector_heads,
            self.audio_connector_head_dim or self.connector_head_dim,
        )

    @property
    def connector_width(self) -> int:
        return self.connector_heads * self.connector_head_dim

    @property
    def audio_connector_width(self) -> int:
        heads, head = self.audio_connector
        return heads * head

    @property
    def release_stem(self) -> str:
        """The release file's name (the dev model's of its generation), so that the example reads as released."""
        if self.v25:
            return "ltx-2.5-22b-dev-transformer-bf16"
        return "ltx-2.3-22b-dev" if self.v23 else "ltx-2-19b-dev"

    def config(self) -> dict:
        """`LTX2VideoTransformer3DModel`'s config for this shape."""
        config = {
            "_class_name": LTX2.diffusers_class,
            "in_channels": self.in_channels,
            "out_channels": self.in_channels,
            "num_attention_heads": self.heads,
            "attention_head_dim": self.attention_head_dim,
            "cross_attention_dim": self.dim,
            "audio_in_channels": self.audio_in_channels,
            "audio_out_channels": self.audio_in_channels,
            "audio_num_attention_heads": self.audio_heads,
            "audio_attention_head_dim": self.audio_attention_head_dim,
            "audio_cross_attention_dim": self.audio_dim,
            "num_layers": self.num_layers,
            "caption_channels": self.caption_channels,
            **RELEASE_CONSTANTS,
        }
        return config | (LTX23_SWITCHES if self.v23 else {}) | (LTX25_SWITCHES if self.v25 else {})

    def comfyui_config(self) -> dict:
        """The ``transformer`` section of the release's metadata ``config``, in ``LTXAVModel``'s argument names
        (``comfy/ldm/lightricks/av_model.py``, ``model.py``; the 2.3 switches as LTX-2.3's own file names them)."""
        config = {
            "num_attention_heads": self.heads,
            "attention_head_dim": self.attention_head_dim,
            "cross_attention_dim": self.dim,
            "audio_num_attention_heads": self.audio_heads,
            "audio_attention_head_dim": self.audio_attention_head_dim,
            "audio_cross_attention_dim": self.audio_dim,
            "in_channels": self.in_channels,
            "audio_in_channels": self.audio_in_channels,
            "caption_channels": self.caption_channels,
            "num_layers": self.num_layers,
            "connector_num_attention_heads": self.connector_heads,
            "connector_attention_head_dim": self.connector_head_dim,
            "connector_num_layers": self.connector_layers,
            "rope_type": "split",
        }
        if self.v23:
            heads, head = self.audio_connector
            config |= {
                "apply_gated_attention": True,  # to_gate_logits in every attention of the blocks
                "cross_attention_adaln": True,  # 9 modulation rows, prompt_adaln_single, prompt_scale_shift_table
                "caption_proj_before_connector": True,  # the text projection ahead of the connectors ...
                "caption_projection_first_linear": False,  # ... and none in the transformer
                "connector_apply_gated_attention": True,
                "audio_connector_num_attention_heads": heads,
                "audio_connector_attention_head_dim": head,
            }
        if self.v25:  # as LTX-2.5's own file names them: ComfyUI reads these off the metadata alone
            config |= LTX25_COMFYUI_SWITCHES
        return config


def connectors_config(s: Ltx2Shape) -> dict:
    """`LTX2TextConnectors`' config (a diffusers pipeline's ``connectors/``) for this shape, as diffusers' conversion
    script writes the released ones: the text encoder's width and layers the projection takes, each connector's
    heads, layers and registers, and 2.3's gated attention and per-modality projections (with biases)."""
    heads, head = s.audio_connector
    return {
        "_class_name": "LTX2TextConnectors",
        "caption_channels": s.caption_channels,
        "text_proj_in_factor": s.text_layers,
        "video_connector_num_attention_heads": s.connector_heads,
        "video_connector_attention_head_dim": s.connector_head_dim,
        "video_connector_num_layers": s.connector_layers,
        "video_connector_num_learnable_registers": s.registers,
        "video_gated_attn": s.v23,
        "audio_connector_num_attention_heads": heads,
        "audio_connector_attention_head_dim": head,
        "audio_connector_num_layers": s.connector_layers,
        "audio_connector_num_learnable_registers": s.registers,
        "audio_gated_attn": s.v23,
        "rope_type": "split",
        "per_modality_projections": s.v23,
        "video_hidden_dim": s.dim,
        "audio_hidden_dim": s.audio_dim,
        "proj_bias": s.v23,
    }


def connector_tensors(s: Ltx2Shape, name: str) -> list[tuple[str, tuple[int, ...]]]:
    """One text-embedding connector as ComfyUI's ``Embeddings1DConnector`` builds it (its learnable registers and
    its 1-D transformer blocks: self-attention with q/k norms, per-head gates in 2.3, a 4x GELU feed-forward)."""
    heads, head = s.audio_connector if name.startswith("audio") else (s.connector_heads, s.connector_head_dim)
    d, p = heads * head, f"{PREFIX}{name}"
    out = [(f"{p}.learnable_registers", (s.registers, d))]
    for i in range(s.connector_layers):
        b = f"{p}.transformer_1d_blocks.{i}"
        out += [(f"{b}.attn1.q_norm.weight", (d,)), (f"{b}.attn1.k_norm.weight", (d,))]
        for m in ("to_q", "to_k", "to_v", "to_out.0"):
            out += linear(f"{b}.attn1.{m}", d, d)
        if s.v23:
            out += linear(f"{b}.attn1.to_gate_logits", heads, d)
        out += linear(f"{b}.ff.net.0.proj", 4 * d, d) + linear(f"{b}.ff.net.2", d, 4 * d)
    return out


def text_projection(s: Ltx2Shape) -> list[tuple[str, tuple[int, ...]]]:
    """The text feature projection in the release's names (the text encoder's layers concatenated -> the caption
    width, no bias; 2.3 and 2.5: one per modality, to the attention widths, with biases: ``comfy/text_encoders/lt.py``'s
    ``DualLinearProjection``)."""
    c, features = s.caption_channels, s.caption_channels * s.text_layers
    if s.v23:
        out = linear("text_embedding_projection.video_aggregate_embed", s.dim, features)
        return out + linear("text_embedding_projection.audio_aggregate_embed", s.audio_dim, features)
    return [("text_embedding_projection.aggregate_embed.weight", (c, features))]


def release_others(s: Ltx2Shape) -> list[tuple[str, tuple[int, ...]]]:
    """What the release's file holds beside the transformer (`CARRIED`), a few tensors of each part with the names
    ComfyUI and diffusers read: the text feature projection (`text_projection`), both connectors, and a handful of
    the video VAE's, audio VAE's and vocoder's tensors (2-D to 5-D). LTX-2.5's file holds the two connectors alone:
    its projection is in its text encoder's file, its VAEs in their own."""
    connectors = connector_tensors(s, "video_embeddings_connector") + connector_tensors(
        s, "audio_embeddings_connector"
    )
    if s.v25:
        return connectors
    out = text_projection(s) + connectors
    for vae, latent in (("vae", s.in_channels), ("audio_vae", 8)):
        for stat in ("mean-of-means", "std-of-means"):
            out.append((f"{vae}.per_channel_statistics.{stat}", (latent,)))
    out += [
        ("vae.encoder.conv_in.conv.weight", (32, 48, 3, 3, 3)),
        ("vae.encoder.conv_in.conv.bias", (32,)),
        ("vae.decoder.conv_out.conv.weight", (48, 32, 3, 3, 3)),
        ("audio_vae.decoder.conv_in.conv.weight", (32, 8, 3, 3)),
        ("vocoder.conv_pre.weight", (32, 64, 7)),
        ("vocoder.resblocks.0.convs1.0.weight", (32, 32, 3)),
    ]
    return out


#: example layouts: ``release`` the one file at the root; ``diffusers`` the transformer/ folder


class Ltx2Examples(Examples):
    family = LTX2
    presets = {
        # 48 blocks, as every release has (the recipes keep blocks 0, 1, 46 and 47), 32 heads of 2
        "tiny": Ltx2Shape(
            attention_head_dim=2,
            audio_attention_head_dim=2,
            caption_channels=64,
            connector_heads=2,
            connector_head_dim=32,
            connector_layers=1,
        ),
        # every Linear of the blocks a multiple of 256 wide (GGML's K-quants)
        "small": Ltx2Shape(
            attention_head_dim=8,
            audio_attention_head_dim=8,
            caption_channels=256,
            connector_heads=2,
            connector_head_dim=128,
            connector_layers=1,
        ),
        # LTX-2 19B (ltx-2-19b-dev.safetensors): ComfyUI's LTXAVModel defaults, for benchmarks
        "19b": Ltx2Shape(
            attention_head_dim=128,
            audio_attention_head_dim=64,
            caption_channels=3840,
            connector_heads=30,
            connector_head_dim=128,
        ),
        # the LTX-2.3 structure at the tiny size (video 128 wide, audio 64: a mix-up of the two shows), 48 blocks
        "tiny-2.3": Ltx2Shape(
            attention_head_dim=4,
            audio_attention_head_dim=2,
            caption_channels=64,
            connector_heads=2,
            connector_head_dim=64,
            connector_layers=1,
            version="2.3",
            audio_connector_heads=2,
            audio_connector_head_dim=32,
        ),
        # LTX-2.3 22B (ltx-2.3-22b-dev.safetensors): its metadata config's dimensions, for benchmarks
        "22b": Ltx2Shape(
            attention_head_dim=128,
            audio_attention_head_dim=64,
            caption_channels=3840,
            connector_heads=32,
            connector_head_dim=128,
            connector_layers=8,
            version="2.3",
            audio_connector_heads=32,
            audio_connector_head_dim=64,
        ),
        # the LTX-2.5 structure at tiny-2.3's size; its pipeline holds its text encoder (`Ltx2Shape.text_encoder`:
        # Gemma 4's tiny example, 64 wide, 2 layers) whose width and layers + 1 the connectors' projection takes
        "tiny-2.5": Ltx2Shape(
            attention_head_dim=4,
            audio_attention_head_dim=2,
            caption_channels=64,
            connector_heads=2,
            connector_head_dim=64,
            connector_layers=1,
            version="2.5",
            audio_connector_heads=2,
            audio_connector_head_dim=32,
            text_layers=3,
            text_encoder=("gemma4", "tiny"),
        ),
        # tiny-2.5 with Gemma 4's ``comfyui`` example as its pipeline's encoder (the 48 layers ComfyUI tells Gemma 4
        # 12B by, 256 wide): its ComfyUI files load in ComfyUI's LTX-2.5 text encoder loader
        # (benchmarks/comfyui_families.py)
        "comfyui-2.5": Ltx2Shape(
            attention_head_dim=4,
            audio_attention_head_dim=2,
            caption_channels=256,
            connector_heads=2,
            connector_head_dim=64,
            connector_layers=1,
            version="2.5",
            audio_connector_heads=2,
            audio_connector_head_dim=32,
            text_encoder=("gemma4", "comfyui"),
        ),
        # LTX-2.5 22B (ltx-2.5-22b-dev-transformer-bf16.safetensors): 2.3's dimensions (4349 tensors in all), for
        # benchmarks
        "22b-2.5": Ltx2Shape(
            attention_head_dim=128,
            audio_attention_head_dim=64,
            caption_channels=3840,
            connector_heads=32,
            connector_head_dim=128,
            connector_layers=8,
            version="2.5",
            audio_connector_heads=32,
            audio_connector_head_dim=64,
        ),
    }
    layouts = ("release", "diffusers", "pipeline")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``release``: the one file at the root (the transformer in native names with the release's other
        parts, its metadata ``config``, no config.json); ``diffusers``: ``transformer/`` with the names and shapes
        diffusers' own class has (built on meta); ``pipeline``: that and ``connectors/`` beside it, the release's
        text projection and connectors in `LTX2TextConnectors`' names (`CONNECTOR_NAMES`), with its config, and the
        preset's text encoder in ``text_encoder/`` where it names one (`Ltx2Shape.text_encoder`)."""
        shape: Ltx2Shape = self.shape(preset, layout)
        native = [(self.family.native_name(n), s) for n, s in _class_tensors(shape.config())]
        native += release_others(shape)
        if layout in ("diffusers", "pipeline"):
            # the class's config as diffusers writes it, read off the release as we read it
            transformer = diffusers_example(self.family, native, {})
            if layout == "diffusers":
                return [transformer]
            connectors = [(n, s) for n, s in native if CONNECTOR_NAMES.diffusers(n) is not None]
            if shape.v25:  # its release keeps the projection with the encoder; diffusers' connectors hold it
                connectors = text_projection(shape) + connectors
            named = [(CONNECTOR_NAMES.diffusers(n), s) for n, s in connectors]
            models = [transformer, ExampleModel("connectors", named, connectors_config(shape))]
            return models + _text_encoder(shape)
        metadata = {"config": json.dumps({"transformer": shape.comfyui_config()}, sort_keys=True)}
        return [ExampleModel(".", native, None, shape.release_stem, metadata)]

    def preset_files(self, preset: str, layout: str) -> dict[str, str | bytes]:
        """A pipeline with a text encoder (`Ltx2Shape.text_encoder`) has its tokenizer beside it, as that
        encoder's examples write it; nothing else."""
        shape: Ltx2Shape = self.shape(preset, layout)
        if layout != "pipeline" or shape.text_encoder is None:
            return {}
        return dict(TEXT_ENCODERS[shape.text_encoder[0]].files("pipeline"))


def _text_encoder(shape: Ltx2Shape) -> list[ExampleModel]:
    """The pipeline's ``text_encoder/`` of the preset's encoder (`Ltx2Shape.text_encoder`: its examples' pipeline
    layout), held to the widths the connectors' projection takes."""
    if shape.text_encoder is None:
        return []
    family, preset = shape.text_encoder
    models = [m for m in TEXT_ENCODERS[family].models(preset, "pipeline") if m.component == "text_encoder"]
    for m in models:
        text = m.config.get("text_config", m.config)
        widths = (text["hidden_size"], text["num_hidden_layers"] + 1)
        if widths != (shape.caption_channels, shape.text_layers):
            raise ValueError(
                f"{family} {preset}: {widths[0]} wide, {widths[1]} hidden states; the LTX-2 preset's projection "
                f"takes {shape.caption_channels} x {shape.text_layers}"
            )
    return models


def _class_tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of diffusers' class built on meta from `config`."""
    import torch

    with torch.device("meta"):
        model = getattr(_diffusers(LTX2), LTX2.diffusers_class).from_config(config)
    return [(n, tuple(t.shape)) for n, t in model.state_dict().items()]


LTX2_EXAMPLES = Ltx2Examples()
