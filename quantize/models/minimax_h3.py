"""MiniMax-H3 (MiniMax's 33B joint audio + video DiT; diffusers' `MiniMaxH3Transformer3DModel`): everything the tool
knows of it.

Layouts (`MiniMaxH3.layouts`): ``minimax-h3`` (the single-file release, Comfy-Org/MiniMax-H3: one safetensors file, no
config.json, the original names, which ComfyUI's ``comfy/ldm/minimax/model.py`` builds and loads unchanged) and
``minimax-h3-diffusers`` (a diffusers ``transformer/`` with ``MiniMaxH3Transformer3DModel``'s config, or that folder
itself).

Names (`NAMES`, diffusers -> native, read both ways; diffusers' single-file converter
``convert_minimax_h3_transformer_checkpoint_to_diffusers(checkpoint, config, qkv_layout="stacked")`` is the tests'
oracle). One to one: the patch projections (``video_patch_proj`` / ``proj_in``, ``audio_patch_proj`` /
``audio_proj_in``), ``condition_proj`` / ``context_embedder``, ``time_embedder.proj_in|proj_out`` /
``time_embedder.linear_1|linear_2``, ``final_layer.{norm, adaln_proj.linear, video_out, audio_out}`` /
``norm_out.norm``, ``norm_out.linear``, ``proj_out``, ``audio_proj_out``, and in each of ``blocks.N`` /
``transformer_blocks.N`` and ``token_refiner.blocks.N`` / ``token_refiner.refiner_blocks.N``: ``norm1``, ``norm2``,
``attn.q_norm|k_norm`` / ``attn.norm_q|norm_k``, ``attn.out_proj`` / ``attn.to_out.0``, ``mlp.fc2`` / ``ff.net.2``,
``adaln_proj.linear`` (main blocks only, the same name). Stacked (`Blocks.stacked`): the native ``attn.qkv_proj`` is
the row stack [to_q; to_k; to_v] (the release's ``stacked`` layout, as ComfyUI splits it), and ``mlp.fc1`` is
[gate; value] where diffusers' ``ff.net.0.proj`` is [value; gate]: its halves swapped. Native only: ``rope.inv_freq``
(the rotary frequencies, which diffusers computes from the config: `Carried.parts`, never part of the class),
and in ComfyUI's pruned "curve" checkpoints ``adaln_t_table`` (no diffusers counterpart: such a file converts under
its own names, and a forward pass refuses it naming the tensor).

What converts to what: the release converts to every format but GGUF under its own names (the diffusers-side formats
too, with diffusers' config read off the tensors for config.json); its outputs run in a forward pass (``verify
--forward``, ``sensitivity``) and in our loader through the table, the stacked tensors cut by row ranges. A
diffusers-named model converts to the diffusers-side formats (fp8_channel, torchao_fp8, torchao_int8, nf4), which
diffusers' ``from_pretrained`` loads; the native-named formats (ComfyUI's) refuse it at plan time: ComfyUI's
detection reads ``rope.inv_freq``, which diffusers' class does not store, and this tool makes no tensor its source
lacks (`MiniMaxH3.diffusers_not_native_why`). GGUF is refused in every layout (`no_gguf_why`).

The dimensions ComfyUI fixes (``comfy/model_detection.py``, the 'MiniMax H3' rule): it reads the block counts, the
hidden size, the heads, the FFN and text widths, the time embedder's and the rope's widths off the tensors; the patch
is always (1, 2, 2) (the latent channels = ``final_layer.video_out`` rows // 4). The examples keep the VAEs' 24 video
and 32 audio latent channels, the text encoder's 5120 (Qwen3-VL 32B), the 256 timestep frequencies, and a head wide
enough for the 3 * 2 * ``rope_freq_dim`` channels the rope rotates.

>>> MINIMAX_H3.native_name("transformer_blocks.3.attn.to_out.0.weight")
'blocks.3.attn.out_proj.weight'
>>> MINIMAX_H3.names.native_stack("blocks.3.mlp.fc1.weight")
(('transformer_blocks.3.ff.net.0.proj.weight', 1, 2), ('transformer_blocks.3.ff.net.0.proj.weight', 0, 2))
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .family import (
    Carried,
    Detection,
    Family,
    Folders,
    LoraNames,
    ModelInputs,
    PlanPolicy,
    count_blocks,
    shape_reader,
)
from .names import BlockNames, Blocks, Rows
from .policy import Policy, Refused
from .readers import no_gguf_reader

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = ["MINIMAX_H3", "MiniMaxH3", "NAMES", "PATCH", "ROPE"]

#: the (t, h, w) patch ComfyUI always builds MiniMax-H3 with
PATCH = (1, 2, 2)
#: what neither the tensors nor a config say of a release: ComfyUI's ``MiniMaxH3Model`` defaults, diffusers' too
COMFYUI_CONSTANTS = {"rope_theta": 10000.0, "norm_eps": 1e-5, "qk_norm_eps": 1e-5, "final_norm_eps": 1e-5}
#: the tensors a native file has beside the class's: the rotary frequencies diffusers computes from its config
ROPE = "rope."

# --- names ---------------------------------------------------------------------------------------------

#: inside a block (main or token refiner): diffusers module -> native module, one to one
_BLOCK = {
    "norm1": "norm1",
    "norm2": "norm2",
    "attn.norm_q": "attn.q_norm",
    "attn.norm_k": "attn.k_norm",
    "attn.to_out.0": "attn.out_proj",
    "ff.net.2": "mlp.fc2",
}
#: native module -> the diffusers rows it stacks: [q; k; v], and [gate; value] where diffusers has [value; gate]
_STACKED = {
    "attn.qkv_proj": (Rows("attn.to_q"), Rows("attn.to_k"), Rows("attn.to_v")),
    "mlp.fc1": (Rows("ff.net.0.proj", 1, 2), Rows("ff.net.0.proj", 0, 2)),
}

#: diffusers' names -> the release's
NAMES = BlockNames(
    root_modules={
        "proj_in": "video_patch_proj",
        "audio_proj_in": "audio_patch_proj",
        "context_embedder": "condition_proj",
        "time_embedder.linear_1": "time_embedder.proj_in",
        "time_embedder.linear_2": "time_embedder.proj_out",
        "token_refiner.final_norm": "token_refiner.final_norm",
        "norm_out.norm": "final_layer.norm",
        "norm_out.linear": "final_layer.adaln_proj.linear",
        "proj_out": "final_layer.video_out",
        "audio_proj_out": "final_layer.audio_out",
    },
    root_tensors={},
    blocks=(
        Blocks(
            "transformer_blocks",
            "blocks",
            modules={**_BLOCK, "adaln_proj.linear": "adaln_proj.linear"},
            stacked=_STACKED,
        ),
        Blocks("token_refiner.refiner_blocks", "token_refiner.blocks", modules=_BLOCK, stacked=_STACKED),
    ),
)


# --- a forward pass's inputs ---------------------------------------------------------------------------------

_KEYS = (
    "hidden_states",
    "audio_hidden_states",
    "encoder_hidden_states",
    "timestep",
    "timestep_indices",
    "token_tags",
    "position_ids",
    "video_indices",
    "audio_indices",
    "text_indices",
)
#: the modality tags of the packed sequence's rows (diffusers' ``token_tags``)
_VIDEO, _TEXT, _AUDIO = 0, 1, 2


def _video_width(config: dict) -> int:
    p = config.get("patch_size", PATCH)
    return config["in_channels"] * p[0] * p[1] * p[2]


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    return {
        "hidden_states": ((None, None, _video_width(config)),),
        "audio_hidden_states": ((None, None, config["audio_in_channels"]),),
        "encoder_hidden_states": ((None, None, config["text_dim"]),),
        "timestep": ((None,),),
        "timestep_indices": ((None,),),
        "token_tags": ((None,),),
        "position_ids": ((None, 3),),
        "video_indices": ((None,),),
        "audio_indices": ((None,),),
        "text_indices": ((None,),),
    }


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One packed sequence as the pipeline lays it out: 6 text rows, a 2 x 2 x 2 grid of video patches, 4 audio rows;
    two noise levels (video and text at the first, audio at the second), rope positions per axis."""
    import torch

    text, (frames, h, w), audio = 6, (2, 2, 2), 4
    video = frames * h * w
    grid = torch.stack(
        torch.meshgrid(torch.arange(frames), torch.arange(h), torch.arange(w), indexing="ij"), -1
    ).reshape(-1, 3)
    positions = torch.cat(
        [
            torch.arange(text)[:, None].expand(text, 3),
            grid + torch.tensor([text, 0, 0]),
            (text + frames + torch.arange(audio))[:, None] * torch.tensor([1, 0, 0]),
        ]
    )
    tags = torch.tensor([_TEXT] * text + [_VIDEO] * video + [_AUDIO] * audio)
    return dict(
        hidden_states=torch.randn(1, video, _video_width(config), generator=g),
        audio_hidden_states=torch.randn(1, audio, config["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, text, config["text_dim"], generator=g),
        timestep=torch.tensor([0.6, 0.3]),
        timestep_indices=(tags == _AUDIO).long(),
        token_tags=tags,
        position_ids=positions,
        video_indices=torch.arange(text, text + video),
        audio_indices=torch.arange(text + video, text + video + audio),
        text_indices=torch.arange(text),
    )


INPUTS = ModelInputs(
    keys=lambda config: _KEYS,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_KEYS,
)


# --- what the bundled recipes quantize ---------------------------------------------------------------------

NO_NATIVE_FROM_DIFFUSERS = (
    "ComfyUI's detection reads rope.inv_freq, which diffusers' class does not store; convert the original release "
    "(Comfy-Org/MiniMax-H3) to it instead, or this model to fp8_channel, torchao_fp8, torchao_int8 or nf4"
)
_MODULATION_WHY = (
    "the block's AdaLN modulation (18 x 5376 x 2688 = 260M weights a block, 39% of the model: kept in bf16 it would "
    "leave 26 GB of the 66 GB unquantized; its input is the time embedding alone, a few rows a step, and per-row "
    "scales keep each modulation channel's own range)"
)
_KEPT = (
    "{patch} (the video and audio latent patch embeddings, float32 in the release and 0.03% of it), {text} (the "
    "text embedding every block attends to) and time_embedder (float32 in the release: the timestep embedding "
    "every modulation is made from), the token refiner ({refiner}: the text stream every block attends to, without "
    "an AdaLN gate to damp an error; 2.3% of the weights), {final} (float32 in the release: they write the video "
    "and audio velocities directly), every norm{rope}"
)
_FORWARD_FLOOR = {
    "nf4": {"min_forward_sqnr_db": 15},
    "comfy_nvfp4": {"min_forward_sqnr_db": 15},
    "comfy_w4a8": {"min_forward_sqnr_db": 14},
    "comfy_w4a4": {"min_forward_sqnr_db": 10},
}
RELEASE_POLICY = Policy(
    what="MiniMax-H3 as released (the single file of Comfy-Org/MiniMax-H3 at the root: the original names, no config.json)",
    targets=(
        r"blocks\.\d+\.attn\.(qkv_proj|out_proj)",
        r"blocks\.\d+\.mlp\.(fc1|fc2)",
        r"blocks\.\d+\.adaln_proj\.linear",
    ),
    quantized=(
        "in each of the blocks (blocks.N; 50 in the 33B): attn.qkv_proj (q, k and v stacked, as released), "
        f"attn.out_proj, mlp.fc1 (the SwiGLU's gate and value stacked), mlp.fc2, and adaln_proj.linear, {_MODULATION_WHY}"
    ),
    kept=_KEPT.format(
        patch="video_patch_proj and audio_patch_proj",
        text="condition_proj",
        refiner="token_refiner.blocks",
        final="the final layer (final_layer.adaln_proj.linear and the output heads video_out and audio_out",
        rope=", and rope.inv_freq (carried bit for bit)",
    )
    .replace("audio_out (float32", "audio_out, float32")
    .replace("directly), every", "directly)), every"),
    sensitive=(r"blocks\.\d+\.(mlp\.fc2|adaln_proj\.linear)",),
    sensitive_why=(
        "mlp.fc2 (the SwiGLU's down projection takes its outliers) and adaln_proj.linear (the modulation scales the "
        "whole residual stream: 4 bits there is the riskiest choice)"
    ),
    checks=_FORWARD_FLOOR,
    note=(
        "The output keeps the release's names; its config.json is diffusers' MiniMaxH3Transformer3DModel config read "
        "off the tensor shapes, which our loader builds and fills through the name table."
    ),
)
DIFFUSERS_POLICY = Policy(
    what="MiniMax-H3 in diffusers layout (transformer/, MiniMaxH3Transformer3DModel)",
    components=("transformer",),
    targets=(
        r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0)",
        r"transformer_blocks\.\d+\.ff\.net\.(0\.proj|2)",
        r"transformer_blocks\.\d+\.adaln_proj\.linear",
    ),
    quantized=(
        "in each of the transformer_blocks (50 in the 33B): attn.to_q, to_k, to_v, to_out.0, ff.net.0.proj (the "
        f"SwiGLU's value and gate), ff.net.2, and adaln_proj.linear, {_MODULATION_WHY}"
    ),
    kept=_KEPT.format(
        patch="proj_in and audio_proj_in",
        text="context_embedder",
        refiner="token_refiner.refiner_blocks",
        final="norm_out.linear and the output heads proj_out and audio_proj_out",
        rope="",
    ),
    checks=_FORWARD_FLOOR,
    refused=(Refused(NO_NATIVE_FROM_DIFFUSERS, names=("native", "gguf")),),
)


class MiniMaxH3(Family):
    name = "minimax-h3"
    title = "MiniMax-H3"
    names = NAMES
    # ComfyUI's detection keys; diffusers' own (the token refiner's blocks, the blocks' AdaLN under diffusers' prefix)
    detection = Detection(
        "MiniMaxH3Transformer3DModel",
        native_marks=("video_patch_proj.", "audio_patch_proj."),
        diffusers_marks=("token_refiner.refiner_blocks.", "transformer_blocks.0.adaln_proj."),
    )
    folders = Folders(
        "minimax-h3-diffusers",
        "minimax-h3",
        "MiniMax-H3 release: one file, the original names (Comfy-Org/MiniMax-H3), no config.json",
    )
    plan = PlanPolicy(
        no_gguf_why=no_gguf_reader("MiniMax-H3"),
        carried=Carried(parts=(ROPE,)),
        diffusers_not_native_why=NO_NATIVE_FROM_DIFFUSERS,
    )
    lora = LoraNames(
        prefixes=("transformer.", "diffusion_model.", "model.diffusion_model.", "base_model.model.")
    )
    policies = {"minimax-h3": RELEASE_POLICY, "minimax-h3-diffusers": DIFFUSERS_POLICY}

    # --- running it ------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`MiniMaxH3Transformer3DModel`'s config for the release's file (which has no config.json), read off the
        tensor shapes as ComfyUI reads them; the rest (rope theta, norm epsilons) are the class's defaults, which
        ComfyUI's are too. A pruned file (``adaln_t_table``, no time embedder) is refused, naming the tensor."""

        shape = shape_reader(tensors, where, f"a {self.title} release file")

        if "adaln_t_table" in tensors:
            raise InputError(
                f"{where}: tensor 'adaln_t_table' is a pruned {self.title}'s AdaLN curve table, which diffusers' "
                f"{self.diffusers_class} does not implement: this model cannot be run for a forward pass"
            )
        hidden, video = shape("video_patch_proj.weight")
        head = shape("blocks.0.attn.q_norm.weight")[0]
        out = shape("final_layer.video_out.weight")[0]
        patches = PATCH[0] * PATCH[1] * PATCH[2]
        if out % patches or video != out:
            raise InputError(
                f"{where}: tensor 'video_patch_proj.weight' takes {video} inputs and 'final_layer.video_out.weight' "
                f"gives {out}: not the ({', '.join(map(str, PATCH))}) patch of latent channels ComfyUI builds"
            )
        time_in = shape("time_embedder.proj_in.weight")
        return {
            "_class_name": self.diffusers_class,
            "num_attention_heads": shape("blocks.0.attn.qkv_proj.weight")[0] // (3 * head),
            "attention_head_dim": head,
            "hidden_size": hidden,
            "num_layers": count_blocks(tensors, "blocks."),
            "num_refiner_layers": count_blocks(tensors, "token_refiner.blocks."),
            "ffn_dim": shape("blocks.0.mlp.fc1.weight")[0] // 2,
            "in_channels": out // patches,
            "audio_in_channels": shape("final_layer.audio_out.weight")[0],
            "patch_size": list(PATCH),
            "text_dim": shape("condition_proj.weight")[1],
            "freq_dim": time_in[1],
            "time_embed_hidden_dim": time_in[0],
            "time_embed_dim": shape("time_embedder.proj_out.weight")[0],
            "rope_freq_dim": shape("rope.inv_freq")[0],
            **COMFYUI_CONSTANTS,
        }

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The release ships no config.json: a checkpoint converted from it is written with diffusers' config read
        off its tensors (`diffusers_config`), so that our loader builds `MiniMaxH3Transformer3DModel` for it (and
        takes its native names through `NAMES`). None for a pruned file, which that class cannot run."""
        if "adaln_t_table" in tensors:
            return None
        return self.diffusers_config({}, tensors, where)


MINIMAX_H3 = MiniMaxH3()
