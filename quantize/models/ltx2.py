"""LTX-2 (Lightricks LTX-2 19B, LTX-2.3 22B and LTX-2.5 22B: audio and video in one transformer; diffusers'
`LTX2VideoTransformer3DModel`): everything the tool knows of it.

Generations (`VERSIONS`): LTX-2.0 (``ltx-2-19b-dev.safetensors``) projects the caption features in the transformer
(``caption_projection``, ``audio_caption_projection``); LTX-2.3 (``ltx-2.3-22b-dev.safetensors``) has none there (its
text projection is per modality, ahead of the connectors: ``text_embedding_projection.{video,audio}_aggregate_embed``,
carried), gates each attention per head (``to_gate_logits``) and modulates the text cross-attention by the timestep
(9 rows in each block's ``scale_shift_table``, ``prompt_adaln_single`` / ``audio_prompt_adaln_single``, each block's
``prompt_scale_shift_table``). One name table holds both; `Ltx2.diffusers_config` reads which off the tensors
(diffusers' ``gated_attn``, ``cross_attn_mod``, ``use_prompt_embeddings`` and their audio twins). The bundled recipes
keep the gates and every adaLN and modulation table of either.

LTX-2.5 (``ltx-2.5-22b-dev-transformer-bf16.safetensors``, Gemma 4 12B its text encoder) is 2.3's structure with no
bias in the video feed-forward (diffusers' ``ff_bias`` false; the audio one keeps its bias) and
``keyframes_abs_pos_embedding`` (one row as wide as the video stream, added to the tokens of generated keyframes: a
parameter, no Linear, so never quantized: it is carried in the file's dtype like every root table), as its published
files hold it (4349 tensors, the prompt adaLN kept); diffusers' other 2.5 switch, ``use_prompt_adaln_single`` false
(the prompt adaLN dropped), is read off the tensors too. Its release file holds the transformer and the two
connectors alone: its text projection is in the Gemma 4 file (``gemma4-12b-with-proj-ltx-2.5-bf16.safetensors``), its
VAEs in files of their own, and its duration head (ComfyUI's ``duration_head.py``, 3.8 MB, which ComfyUI's
ModelPatchLoader casts to float32 whatever it is stored in: nothing to gain by quantizing it) in
``model_patches/ltx-2.5-duration-head-bf16.safetensors``; a file that holds the head beside the transformer keeps it
as stored (`DURATION_HEAD`, under either prefix that loader takes). ComfyUI reads ``ff_bias``, ``audio_ff_bias`` and
``use_prompt_adaln_single`` off the metadata ``config`` alone (and the keyframes' row off its tensor); the release
names all four (`LTX25_COMFYUI_SWITCHES`), and a pipeline's file names them as the release does. Of the release's
other metadata (``model_version``, ``gemma_source_checkpoint``, ``license``) only ``config`` is carried, as for
2.0 and 2.3.

Layouts (`LTX2.layouts`): ``ltx2`` (the release as Lightricks ships it: ONE safetensors file, e.g.
``ltx-2-19b-dev.safetensors``, no config.json, holding the transformer under ``model.diffusion_model.`` together with
the video VAE (``vae.``), the audio VAE (``audio_vae.``), the vocoder (``vocoder.``), the text feature projection
(``text_embedding_projection.``) and the two text-embedding connectors
(``model.diffusion_model.{video,audio}_embeddings_connector.``); its ``__metadata__`` ``config`` holds the
configuration ComfyUI builds the transformer, the VAE and the audio VAE from) and ``ltx2-diffusers`` (a diffusers
``transformer/`` with ``LTX2VideoTransformer3DModel``'s config, or that folder itself).

Only the transformer's Linears are ever converted; every other tensor of the release file (`Carried.parts`) is
carried as stored, and its metadata ``config`` with it (`Carried.metadata`), so that a converted file is again
one file ComfyUI's checkpoint loader takes (``comfy/sd.py``: the unet under ``model.diffusion_model.``, the VAE under
``vae.``; the audio VAE node reads ``audio_vae.`` and ``vocoder.``; the text encoder loader reads the projection and
the connectors).

What converts to what: the release to every format (the diffusers-side ones with diffusers' config read off its
tensors for config.json); the diffusers layout to the diffusers-side formats only (fp8_channel, torchao_fp8,
torchao_int8, nf4), and, from a pipeline folder that holds diffusers' ``connectors/`` beside ``transformer/``, to
ComfyUI's and GGUF too. ComfyUI's ``LTXAVModel`` holds the text connectors, which diffusers keeps in another component
(``LTX2TextConnectors``), and reads the widths its tensors do not show from the release's metadata ``config``: the
pipeline's ``connectors/`` is joined to the transformer as the release carries it (`PlanPolicy.beside`:
`CONNECTOR_NAMES` gives its tensors the release's names, the text projection included) and the metadata ``config``
is made of the two configs (`Ltx2.beside_metadata`), so that the file is the release's but for its VAEs and vocoder.
A ``transformer/`` with no ``connectors/`` beside it would load with connectors missing: a ComfyUI or GGUF file of
it is refused at plan time (`Ltx2.diffusers_not_native_why`). An LTX-2.5 pipeline's file is its release's with the
text projection at the root beside it (diffusers keeps the projection in ``connectors/``; ComfyUI's diffusion model
loaders read only what is under the prefix, its LTX-2.5 text encoder loader the projection in the Gemma 4 file), and
one ``--format`` converts its ``text_encoder/`` too, by that encoder's family.

Names: the native ones are the release's, with its ``model.diffusion_model.`` prefix (``patchify_proj``,
``adaln_single``, ``av_ca_a2v_gate_adaln_single``, per block ``scale_shift_table_a2v_ca_video``, ``attn1.q_norm``);
diffusers' single-file converter (``convert_ltx2_transformer_to_diffusers``) is the tests' oracle. The connectors,
which diffusers keeps in another component (``LTX2TextConnectors``), have no name in `LTX2VideoTransformer3DModel`:
a native file carries them, never quantized; diffusers' names of them are `CONNECTOR_NAMES` (its conversion
script's ``LTX_2_0_CONNECTORS_KEYS_RENAME_DICT`` is the tests' oracle).

The dimensions ComfyUI fixes (``comfy/model_detection.py``, the 'Lightricks ltxv' branch: ``ltxav`` when
``audio_adaln_single.linear.weight`` exists): it counts the blocks and reads ``attention_head_dim`` = the rows of
``transformer_blocks.0.attn2.to_k`` // 32 (32 heads) and ``cross_attention_dim`` off its columns; everything else is
``LTXAVModel``'s defaults (32 audio heads of 64, 128 latent channels in and out for video and audio, caption width
3840, connectors of 30 heads of 128, the 2.0 structure) unless the file's metadata ``config`` says otherwise under
``transformer``. The 2.3 structure is told by that metadata alone (``apply_gated_attention``,
``cross_attention_adaln``, ``caption_proj_before_connector`` with ``caption_projection_first_linear`` false,
``connector_apply_gated_attention``, ``audio_connector_*``): ComfyUI reads no tensor for it. The examples keep the
32 heads and 128 channels, and carry a metadata ``config`` naming the rest, as the releases do; a ComfyUI file keeps
it, and a GGUF file carries it as its string key-value ``config``: ComfyUI-GGUF's Unet loader hands its string
key-values to ComfyUI as the file's metadata since its PR #399 (January 2026); an older one hands none, and ComfyUI
then builds its defaults, the 19B's dimensions and the 2.0 structure, which only a 2.0 19B GGUF matches (an
LTX-2.3 or 2.5 GGUF, whose structure the metadata alone tells, needs a ComfyUI-GGUF that hands it over).

>>> LTX2.native_name("transformer_blocks.3.attn1.norm_q.weight")
'model.diffusion_model.transformer_blocks.3.attn1.q_norm.weight'
>>> LTX2.diffusers_name("model.diffusion_model.av_ca_a2v_gate_adaln_single.linear.bias")
'av_cross_attn_video_a2v_gate.linear.bias'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import (
    Beside,
    Carried,
    Detection,
    Family,
    Folders,
    LoraNames,
    ModelInputs,
    PlanPolicy,
    count_blocks,
    lacking_in_blocks,
    shape_reader,
)
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = [
    "LTX2",
    "Ltx2",
    "NAMES",
    "PREFIX",
    "CARRIED",
    "COMFYUI_HEADS",
    "LTX23_SWITCHES",
    "LTX25_SWITCHES",
    "LTX25_COMFYUI_SWITCHES",
    "DURATION_HEAD",
    "CONNECTOR_NAMES",
    "CONNECTORS",
]

#: where the release keeps the transformer (and its text connectors) in its one file
PREFIX = "model.diffusion_model."
#: LTX-2.5's duration head (ComfyUI's ``comfy/ldm/lightricks/duration_head.py``, loaded by its ModelPatchLoader,
#: which takes it under either prefix: ``normalize_state_dict``): released as a file of its own, carried where a file
#: holds it beside the transformer
DURATION_HEAD = (f"{PREFIX}duration_head.", "duration_head.")
#: what the release's file holds beside the transformer: carried as stored, never converted
CARRIED = (
    "vae.",
    "audio_vae.",
    "vocoder.",
    "text_embedding_projection.",
    f"{PREFIX}video_embeddings_connector.",
    f"{PREFIX}audio_embeddings_connector.",
    *DURATION_HEAD,
)
#: the heads ComfyUI builds video and audio attention with when the file's metadata names none
COMFYUI_HEADS = 32

# --- names ---------------------------------------------------------------------------------------------

#: diffusers' adaLN-single modules -> the release's (the four audio-video cross-attention ones, LTX-2.3's prompt ones)
_ADALN = {
    "time_embed": "adaln_single",
    "audio_time_embed": "audio_adaln_single",
    "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
    "av_cross_attn_video_a2v_gate": "av_ca_a2v_gate_adaln_single",
    "av_cross_attn_audio_scale_shift": "av_ca_audio_scale_shift_adaln_single",
    "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single",
    "prompt_adaln": "prompt_adaln_single",
    "audio_prompt_adaln": "audio_prompt_adaln_single",
}
_ADALN_PARTS = ("emb.timestep_embedder.linear_1", "emb.timestep_embedder.linear_2", "linear")
#: the six attentions of a block: video and audio self- and text cross-attention, audio-to-video, video-to-audio
ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")


def _block_modules() -> dict[str, str]:
    modules = {}
    for a in ATTENTIONS:
        for m in ("to_q", "to_k", "to_v", "to_out.0", "to_gate_logits"):
            modules[f"{a}.{m}"] = f"{a}.{m}"
        modules[f"{a}.norm_q"], modules[f"{a}.norm_k"] = f"{a}.q_norm", f"{a}.k_norm"
    for ff in ("ff", "audio_ff"):
        for m in ("net.0.proj", "net.2"):
            modules[f"{ff}.{m}"] = f"{ff}.{m}"
    return modules


def _root_modules() -> dict[str, str]:
    modules = {f"{d}.{m}": f"{PREFIX}{n}.{m}" for d, n in _ADALN.items() for m in _ADALN_PARTS}
    modules |= {"proj_in": f"{PREFIX}patchify_proj", "audio_proj_in": f"{PREFIX}audio_patchify_proj"}
    for m in ("caption_projection", "audio_caption_projection"):
        modules |= {f"{m}.linear_{i}": f"{PREFIX}{m}.linear_{i}" for i in (1, 2)}
    return modules | {m: f"{PREFIX}{m}" for m in ("proj_out", "audio_proj_out")}


#: diffusers' names -> the release's (with its ``model.diffusion_model.`` prefix)
NAMES = BlockNames(
    root_modules=_root_modules(),
    root_tensors={
        t: f"{PREFIX}{t}"
        for t in ("scale_shift_table", "audio_scale_shift_table", "keyframes_abs_pos_embedding")
    },
    blocks=(
        Blocks(
            "transformer_blocks",
            f"{PREFIX}transformer_blocks",
            modules=_block_modules(),
            tensors={
                "scale_shift_table": "scale_shift_table",
                "audio_scale_shift_table": "audio_scale_shift_table",
                "prompt_scale_shift_table": "prompt_scale_shift_table",
                "audio_prompt_scale_shift_table": "audio_prompt_scale_shift_table",
                "video_a2v_cross_attn_scale_shift_table": "scale_shift_table_a2v_ca_video",
                "audio_a2v_cross_attn_scale_shift_table": "scale_shift_table_a2v_ca_audio",
            },
        ),
    ),
)

#: a text connector block's modules in diffusers' `LTX2TextConnectors` -> the release's (``transformer_1d_blocks``)
_CONNECTOR_BLOCK = {
    **{f"attn1.{m}": f"attn1.{m}" for m in ("to_q", "to_k", "to_v", "to_out.0", "to_gate_logits")},
    "attn1.norm_q": "attn1.q_norm",
    "attn1.norm_k": "attn1.k_norm",
    "ff.net.0.proj": "ff.net.0.proj",
    "ff.net.2": "ff.net.2",
}
#: diffusers' `LTX2TextConnectors` (a pipeline's ``connectors/``) -> the release's names: the text feature projection
#: (2.0's one ``aggregate_embed``, 2.3's one per modality) at the file's root, the two connectors under the
#: transformer's prefix
CONNECTOR_NAMES = BlockNames(
    root_modules={
        "text_proj_in": "text_embedding_projection.aggregate_embed",
        "video_text_proj_in": "text_embedding_projection.video_aggregate_embed",
        "audio_text_proj_in": "text_embedding_projection.audio_aggregate_embed",
    },
    root_tensors={
        f"{m}_connector.learnable_registers": f"{PREFIX}{m}_embeddings_connector.learnable_registers"
        for m in ("video", "audio")
    },
    blocks=tuple(
        Blocks(
            f"{m}_connector.transformer_blocks",
            f"{PREFIX}{m}_embeddings_connector.transformer_1d_blocks",
            modules=_CONNECTOR_BLOCK,
        )
        for m in ("video", "audio")
    ),
)
#: diffusers' pipeline folder of the connectors, beside ``transformer/``
CONNECTORS = Beside("connectors", "LTX2TextConnectors", CONNECTOR_NAMES)

#: what LTX-2 releases fix that their tensors do not say (diffusers' conversion of the 2.0 release; ComfyUI's
#: ``LTXAVModel`` defaults): split RoPE in float64, a causal offset of 1, timesteps scaled by 1000, 1x1x1 patches
RELEASE_CONSTANTS = {
    "patch_size": 1,
    "patch_size_t": 1,
    "vae_scale_factors": [8, 32, 32],
    "pos_embed_max_pos": 20,
    "base_height": 2048,
    "base_width": 2048,
    "audio_patch_size": 1,
    "audio_patch_size_t": 1,
    "audio_scale_factor": 4,
    "audio_pos_embed_max_pos": 20,
    "audio_sampling_rate": 16000,
    "audio_hop_length": 160,
    "activation_fn": "gelu-approximate",
    "qk_norm": "rms_norm_across_heads",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "attention_bias": True,
    "attention_out_bias": True,
    "rope_theta": 10000.0,
    "rope_double_precision": True,
    "causal_offset": 1,
    "timestep_scale_multiplier": 1000,
    "cross_attn_timestep_scale_multiplier": 1000,
    "rope_type": "split",
}

#: LTX-2.3's structure in diffusers' config, as diffusers' own conversion of the 2.3 release writes it
#: (``scripts/convert_ltx2_to_diffusers.py``, version "2.3"): per-head gates, the text cross-attention's adaLN, the
#: connectors' outputs taken as they are, and the attention processor spatio-temporal guidance needs (STG: it
#: changes no tensor, and without it diffusers' pipeline skips the guidance silently)
LTX23_SWITCHES = {
    "gated_attn": True,
    "audio_gated_attn": True,
    "cross_attn_mod": True,
    "audio_cross_attn_mod": True,
    "use_prompt_embeddings": False,
    "perturbed_attn": True,
}

#: LTX-2.5's structure in diffusers' config beyond 2.3's (`LTX23_SWITCHES`), as its published files hold it: no
#: bias in the video feed-forward (the audio one keeps its), the keyframes' position embedding; the prompt adaLN kept
LTX25_SWITCHES = {"ff_bias": False, "use_keyframes_abs_pos_embedding": True}
#: the same in the ``transformer`` section of its metadata ``config``, in ``LTXAVModel``'s argument names: ComfyUI
#: reads the first three there alone (``comfy/ldm/lightricks/av_model.py``), the last off the tensor too
LTX25_COMFYUI_SWITCHES = {
    "ff_bias": False,
    "audio_ff_bias": True,
    "use_prompt_adaln_single": True,
    "use_keyframes_abs_pos_embedding": True,
}

# --- a forward pass's inputs -------------------------------------------------------------------------------

_KEYS = (
    "hidden_states",
    "audio_hidden_states",
    "encoder_hidden_states",
    "audio_encoder_hidden_states",
    "timestep",
    "audio_timestep",
)


def _text_widths(config: dict) -> tuple[int, int]:
    """The widths of the video and audio text embeddings the transformer takes: the caption features (LTX-2.0
    projects them itself), else the connectors' outputs, as wide as its cross-attention (LTX-2.3)."""
    if config.get("use_prompt_embeddings", True):
        return config["caption_channels"], config["caption_channels"]
    return config["cross_attention_dim"], config["audio_cross_attention_dim"]


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    video, audio = _text_widths(config)
    timestep = ((None,), (None, None))
    return {
        "hidden_states": ((None, None, config["in_channels"]),),
        "audio_hidden_states": ((None, None, config["audio_in_channels"]),),
        "encoder_hidden_states": ((None, None, video),),
        "audio_encoder_hidden_states": ((None, None, audio),),
        "timestep": timestep,
        "audio_timestep": timestep,
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """8 video tokens, 5 audio tokens, 6 text tokens each, a timestep of 500 (sigma 0.5, scaled by 1000)."""
    import torch

    video, audio = _text_widths(config)
    return dict(
        hidden_states=torch.randn(1, 8, config["in_channels"], generator=g),
        audio_hidden_states=torch.randn(1, 5, config["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, 6, video, generator=g),
        audio_encoder_hidden_states=torch.randn(1, 6, audio, generator=g),
        timestep=torch.full((1,), 500.0),
        audio_timestep=torch.full((1,), 500.0),
    )


def _call(config: dict, t: dict[str, torch.Tensor]) -> dict:
    """The tokens as frames of one latent pixel each (RoPE positions from the counts); ``sigma``, what LTX-2.3's
    prompt adaLN takes, is the timestep as diffusers' pipeline passes it (``sigma=timestep``: already scaled by
    1000, as ComfyUI's ``compute_prompt_timestep`` scales it), one a sample."""
    ts = t["timestep"]
    sigma = ts.reshape(ts.shape[0], -1)[:, 0]
    return dict(
        t,
        sigma=sigma,
        num_frames=t["hidden_states"].shape[1],
        height=1,
        width=1,
        audio_num_frames=t["audio_hidden_states"].shape[1],
        return_dict=False,
    )


INPUTS = ModelInputs(keys=lambda config: _KEYS, shapes=_shapes, random=_random, call=_call, accepts=_KEYS)


# --- what the bundled recipes quantize ---------------------------------------------------------------------

_ATTENTIONS = r"(attn1|attn2|audio_attn1|audio_attn2|audio_to_video_attn|video_to_audio_attn)\.(to_q|to_k|to_v|to_out\.0)"
_FFS = r"(ff|audio_ff)\.net\.(0\.proj|2)"
#: the first two and the last two of the 48 blocks, kept whole
_EDGES = r"transformer_blocks\.(0|1|46|47)\..*"
_QUANTIZED = (
    "in blocks 2 to 45, every attention projection (to_q, to_k, to_v, to_out.0) of the six attentions (attn1, attn2, "
    "audio_attn1, audio_attn2, audio_to_video_attn, video_to_audio_attn) and both feed-forwards (ff and audio_ff: "
    "net.0.proj and net.2)"
)
_KEPT = (
    "{embeddings} (the latent patch embeddings), caption_projection and audio_caption_projection (the text "
    "embeddings), {modulation} (the adaLN modulation, with every block's scale_shift_table: it scales the whole "
    "residual stream per timestep), proj_out and audio_proj_out (the output heads), LTX-2.3's per-head "
    "to_gate_logits, and blocks 0, 1, 46 and 47 whole (the first two and the last two of the 48 blocks, kept in "
    "bf16 as Lightricks' own quantized releases keep them: the first take the raw patch embeddings and text, the "
    "last write straight into the output heads)"
)
_SENSITIVE_WHY = "the feed-forward down projections ff.net.2 and audio_ff.net.2: they take GELU's outliers"
RELEASE_POLICY = Policy(
    what=(
        "LTX-2 as released (one safetensors file at the root: the transformer under model.diffusion_model. with the "
        "video VAE, audio VAE, vocoder, text projection and connectors)"
    ),
    targets=(
        rf"model\.diffusion_model\.transformer_blocks\.\d+\.{_ATTENTIONS}",
        rf"model\.diffusion_model\.transformer_blocks\.\d+\.{_FFS}",
    ),
    ignore=(rf"model\.diffusion_model\.{_EDGES}",),
    quantized=_QUANTIZED,
    kept=_KEPT.format(
        embeddings="patchify_proj and audio_patchify_proj",
        modulation=(
            "every adaln_single (adaln_single, audio_adaln_single, the four av_ca_*_adaln_single of the audio-video "
            "cross-attention, LTX-2.3's prompt_adaln_single)"
        ),
    ),
    sensitive=(r"model\.diffusion_model\.transformer_blocks\.\d+\.(ff|audio_ff)\.net\.2",),
    sensitive_why=_SENSITIVE_WHY,
    note=(
        "Every other tensor of the file is carried bit for bit, never quantized: the audio-video text connectors, "
        "text_embedding_projection, vae., audio_vae., vocoder., and the file's metadata config (ComfyUI builds the "
        "model and both VAEs from it)."
    ),
)
DIFFUSERS_POLICY = Policy(
    what="LTX-2 (diffusers layout, LTX2VideoTransformer3DModel in transformer/)",
    components=("transformer",),
    targets=(rf"transformer_blocks\.\d+\.{_ATTENTIONS}", rf"transformer_blocks\.\d+\.{_FFS}"),
    ignore=(_EDGES,),
    quantized=_QUANTIZED,
    kept=_KEPT.format(
        embeddings="proj_in and audio_proj_in",
        modulation=(
            "time_embed, audio_time_embed, the four av_cross_attn_* of the audio-video cross-attention and "
            "LTX-2.3's prompt_adaln"
        ),
    ),
    sensitive=(r"transformer_blocks\.\d+\.(ff|audio_ff)\.net\.2",),
    sensitive_why=_SENSITIVE_WHY,
    note=(
        "The audio-video text connectors are in connectors/: a native-named file (ComfyUI's, GGUF) joins them from "
        "there, as the release carries them."
    ),
)


class Ltx2(Family):
    name = "ltx2"
    title = "LTX-2"
    names = NAMES
    # only LTX-2 has audio in its transformer, in either naming
    detection = Detection(
        "LTX2VideoTransformer3DModel",
        native_marks=(f"{PREFIX}audio_adaln_single.", f"{PREFIX}transformer_blocks.0.audio_attn1."),
        diffusers_marks=("audio_time_embed.", "transformer_blocks.0.audio_attn1."),
    )
    folders = Folders(
        "ltx2-diffusers",
        "ltx2",
        f"LTX-2 release: one file, the transformer under {PREFIX} with its VAEs and connectors",
    )
    plan = PlanPolicy(
        gguf_architecture="ltxv",  # ComfyUI-GGUF's IMG_ARCH_LIST; ComfyUI then tells LTX-2 (ltxav) by its audio
        carried=Carried(parts=CARRIED, metadata=("config",)),
        beside=CONNECTORS,
        diffusers_not_native_why=(
            "ComfyUI's LTX-2 model holds the text connectors, which diffusers keeps outside transformer/ (in "
            "connectors/, not found beside it), and takes the widths its tensors do not show from the release's "
            "metadata config; convert the pipeline folder that holds transformer/ and connectors/, or the release's "
            "one file (ltx-2-19b-dev.safetensors, ltx-2.3-22b-dev.safetensors), or this model to fp8_channel, "
            "torchao_fp8, torchao_int8 or nf4"
        ),
    )
    lora = LoraNames(prefixes=("diffusion_model.", "model.diffusion_model.", "transformer."))
    policies = {"ltx2": RELEASE_POLICY, "ltx2-diffusers": DIFFUSERS_POLICY}

    # --- running it ------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`LTX2VideoTransformer3DModel`'s config for the release's file (which has no config.json), read off the
        tensor shapes as ComfyUI reads them (32 heads unless a gated attention's gate says how many), the
        generation's structure off which tensors exist (2.3: gates, 9 modulation rows, the prompt adaLN, no caption
        projection); what the shapes do not say is what the releases fix (`RELEASE_CONSTANTS`)."""

        shape = shape_reader(tensors, where, f"an {self.title} release", PREFIX)
        self._complete_blocks(tensors, where)

        def has(name: str) -> bool:
            return f"{PREFIX}{name}" in tensors

        block = "transformer_blocks.0"
        inner, in_channels = shape("patchify_proj.weight")
        audio_inner, audio_in_channels = shape("audio_patchify_proj.weight")

        def heads_of(attention: str) -> int:  # a gated attention's gate has one row a head; else ComfyUI's 32
            gate = f"{block}.{attention}.to_gate_logits.weight"
            return shape(gate)[0] if has(gate) else COMFYUI_HEADS

        heads, audio_heads = heads_of("attn1"), heads_of("audio_attn1")
        to_k, audio_to_k = shape(f"{block}.attn2.to_k.weight"), shape(f"{block}.audio_attn2.to_k.weight")
        for width, n, what in (
            (to_k[0], heads, "attn2.to_k"),
            (audio_inner, audio_heads, "audio_patchify_proj"),
        ):
            if width % n:
                raise InputError(f"{where}: {what} is {width} wide: not {n} heads of equal width")
        cross_mod = shape(f"{block}.scale_shift_table")[0] == 9
        audio_cross_mod = shape(f"{block}.audio_scale_shift_table")[0] == 9
        prompt = has("caption_projection.linear_1.weight")
        built = {
            "_class_name": self.diffusers_class,
            "in_channels": in_channels,
            "out_channels": shape("proj_out.weight")[0],
            "num_attention_heads": heads,
            "attention_head_dim": to_k[0] // heads,
            "cross_attention_dim": to_k[1],
            "gated_attn": has(f"{block}.attn1.to_gate_logits.weight"),
            "cross_attn_mod": cross_mod,
            "audio_in_channels": audio_in_channels,
            "audio_out_channels": shape("audio_proj_out.weight")[0],
            "audio_num_attention_heads": audio_heads,
            "audio_attention_head_dim": audio_inner // audio_heads,
            "audio_cross_attention_dim": audio_to_k[1],
            "audio_gated_attn": has(f"{block}.audio_attn1.to_gate_logits.weight"),
            "audio_cross_attn_mod": audio_cross_mod,
            "num_layers": count_blocks(tensors, f"{PREFIX}transformer_blocks."),
            "caption_channels": shape("caption_projection.linear_1.weight")[1] if prompt else 3840,
            "use_prompt_embeddings": prompt,
            "ff_bias": has(f"{block}.ff.net.0.proj.bias"),
            "audio_ff_bias": has(f"{block}.audio_ff.net.0.proj.bias"),
            "use_prompt_adaln_single": has("prompt_adaln_single.linear.weight")
            or not (cross_mod or audio_cross_mod),
            "use_keyframes_abs_pos_embedding": has("keyframes_abs_pos_embedding"),
            # LTX-2.3's (gated) as diffusers converts it (`LTX23_SWITCHES`): spatio-temporal guidance's processor
            "perturbed_attn": has(f"{block}.attn1.to_gate_logits.weight"),
            **RELEASE_CONSTANTS,
        }
        if inner != built["num_attention_heads"] * built["attention_head_dim"]:
            raise InputError(
                f"{where}: patchify_proj is {inner} wide and attn2.to_k {to_k[0]}: not one {self.title}"
            )
        return built

    def _complete_blocks(self, tensors: Mapping[str, TensorInfo], where: Path) -> None:
        """Every block of the release holds what its block 0 holds: `InputError` naming the first tensor a partial
        file lacks (its shapes say nothing of a block they were not read off: ComfyUI would build the block and
        leave the tensor random)."""
        lacking = lacking_in_blocks(tensors, f"{PREFIX}transformer_blocks.")
        if lacking is not None:
            raise InputError(
                f"{where}: no tensor {lacking!r}, which block 0 has: a partial {self.title} release"
            )

    def beside_metadata(self, config: dict, beside_config: dict, where: Path) -> dict[str, str]:
        """The release's metadata ``config`` of a pipeline's transformer and connectors (`CONNECTORS`): its
        ``transformer`` section, what ComfyUI builds ``LTXAVModel`` from (``comfy/model_detection.py`` reads it over
        what the tensors show), in ``LTXAVModel``'s argument names, from `LTX2VideoTransformer3DModel`'s config and
        `LTX2TextConnectors`' (`where`, which an error names); LTX-2.3's switches where the transformer gates its
        attention (diffusers' ``gated_attn``); LTX-2.5's four (`LTX25_COMFYUI_SWITCHES`) where any differs from
        ComfyUI's default (a video feed-forward without bias, the keyframes' position embedding)."""
        t, c = config, beside_config
        try:
            section = {
                "num_attention_heads": t["num_attention_heads"],
                "attention_head_dim": t["attention_head_dim"],
                "cross_attention_dim": t["cross_attention_dim"],
                "audio_num_attention_heads": t["audio_num_attention_heads"],
                "audio_attention_head_dim": t["audio_attention_head_dim"],
                "audio_cross_attention_dim": t["audio_cross_attention_dim"],
                "in_channels": t["in_channels"],
                "audio_in_channels": t["audio_in_channels"],
                "caption_channels": c[
                    "caption_channels"
                ],  # the text encoder's width (2.3's transformer has none)
                "num_layers": t["num_layers"],
                "connector_num_attention_heads": c["video_connector_num_attention_heads"],
                "connector_attention_head_dim": c["video_connector_attention_head_dim"],
                "connector_num_layers": c["video_connector_num_layers"],
                "rope_type": t.get("rope_type", "split"),
            }
            if t.get("gated_attn"):  # LTX-2.3 (`LTX23_SWITCHES`), as its own file's metadata names it
                section |= {
                    "apply_gated_attention": True,
                    "cross_attention_adaln": bool(t.get("cross_attn_mod")),
                    "caption_proj_before_connector": True,
                    "caption_projection_first_linear": False,
                    "connector_apply_gated_attention": bool(c.get("video_gated_attn")),
                    "audio_connector_num_attention_heads": c["audio_connector_num_attention_heads"],
                    "audio_connector_attention_head_dim": c["audio_connector_attention_head_dim"],
                }
            switches = {
                "ff_bias": t.get("ff_bias", True),
                "audio_ff_bias": t.get("audio_ff_bias", True),
                "use_prompt_adaln_single": t.get("use_prompt_adaln_single", True),
                "use_keyframes_abs_pos_embedding": t.get("use_keyframes_abs_pos_embedding", False),
            }
            # LTX-2.5's (`LTX25_COMFYUI_SWITCHES`): ComfyUI reads them off the metadata
            if switches != dict.fromkeys(switches, True) | {"use_keyframes_abs_pos_embedding": False}:
                section |= switches
        except KeyError as e:
            raise InputError(
                f"{where}: no {e.args[0]!r} in the config: not an {self.title} pipeline's"
            ) from None
        return {"config": json.dumps({"transformer": section}, sort_keys=True)}

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The release ships no config.json: a checkpoint converted from it is written with diffusers' config read
        off its tensors (`diffusers_config`), so that our loader builds `LTX2VideoTransformer3DModel` for it."""
        return self.diffusers_config({}, tensors, where)


LTX2 = Ltx2()
