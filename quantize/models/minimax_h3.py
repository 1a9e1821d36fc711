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
(the rotary frequencies, which diffusers computes from the config: `Family.carried_parts`, never part of the class),
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .base import BlockNames, Blocks, ExampleModel, Family, ModelInputs, NameTable, Rows, SourceLayout

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = ["MINIMAX_H3", "MiniMaxH3", "MiniMaxH3Shape", "NAMES", "minimax_h3_tensors", "PATCH"]

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


_INPUTS = ModelInputs(
    keys=lambda config: _KEYS,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_KEYS,
)


# --- examples --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MiniMaxH3Shape:
    """The dimensions of an example MiniMax-H3 DiT (`MiniMaxH3Transformer3DModel`'s config names). The defaults are
    the release's widths that its VAEs and text encoder fix (see the module's docstring)."""

    hidden_size: int
    num_attention_heads: int
    attention_head_dim: int
    ffn_dim: int
    num_layers: int
    num_refiner_layers: int
    time_embed_hidden_dim: int
    time_embed_dim: int
    rope_freq_dim: int
    in_channels: int = 24
    audio_in_channels: int = 32
    text_dim: int = 5120
    freq_dim: int = 256

    def config(self) -> dict:
        """`MiniMaxH3Transformer3DModel`'s config.json for this shape (the rest: the class's defaults)."""
        return {
            "_class_name": MINIMAX_H3.diffusers_class,
            "num_attention_heads": self.num_attention_heads,
            "attention_head_dim": self.attention_head_dim,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_refiner_layers": self.num_refiner_layers,
            "ffn_dim": self.ffn_dim,
            "in_channels": self.in_channels,
            "audio_in_channels": self.audio_in_channels,
            "patch_size": list(PATCH),
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "time_embed_hidden_dim": self.time_embed_hidden_dim,
            "time_embed_dim": self.time_embed_dim,
            "rope_freq_dim": self.rope_freq_dim,
        }


def _linear(name: str, out: int, inp: int, bias: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{name}.weight", (out, inp))] + ([(f"{name}.bias", (out,))] if bias else [])


def _block(prefix: str, s: MiniMaxH3Shape, adaln: bool) -> list[tuple[str, tuple[int, ...]]]:
    d, inner = s.hidden_size, s.num_attention_heads * s.attention_head_dim
    t = [(f"{prefix}.norm1.weight", (d,)), (f"{prefix}.norm2.weight", (d,))]
    t += _linear(f"{prefix}.attn.qkv_proj", 3 * inner, d, bias=False)
    t += [(f"{prefix}.attn.q_norm.weight", (s.attention_head_dim,))]
    t += [(f"{prefix}.attn.k_norm.weight", (s.attention_head_dim,))]
    t += _linear(f"{prefix}.attn.out_proj", d, inner, bias=False)
    t += _linear(f"{prefix}.mlp.fc1", 2 * s.ffn_dim, d, bias=False)
    t += _linear(f"{prefix}.mlp.fc2", d, s.ffn_dim, bias=False)
    if adaln:  # six modulation vectors for each of the three modalities
        t += _linear(f"{prefix}.adaln_proj.linear", 6 * 3 * d, s.time_embed_dim)
    return t


def minimax_h3_tensors(s: MiniMaxH3Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the release's file (``MiniMaxH3Model`` of ComfyUI's ``comfy/ldm/minimax/model.py``, its
    full time embedder), in module order."""
    d, video = s.hidden_size, s.in_channels * PATCH[0] * PATCH[1] * PATCH[2]
    t = _linear("video_patch_proj", d, video) + _linear("audio_patch_proj", d, s.audio_in_channels)
    t += _linear("condition_proj", d, s.text_dim)
    t += _linear("time_embedder.proj_in", s.time_embed_hidden_dim, s.freq_dim)
    t += _linear("time_embedder.proj_out", s.time_embed_dim, s.time_embed_hidden_dim)
    t += [("rope.inv_freq", (s.rope_freq_dim,))]
    for i in range(s.num_refiner_layers):
        t += _block(f"token_refiner.blocks.{i}", s, adaln=False)
    t += [("token_refiner.final_norm.weight", (d,))]
    for i in range(s.num_layers):
        t += _block(f"blocks.{i}", s, adaln=True)
    t += [("final_layer.norm.weight", (d,))] + _linear(
        "final_layer.adaln_proj.linear", 2 * d, s.time_embed_dim
    )
    return (
        t
        + _linear("final_layer.video_out", video, d)
        + _linear("final_layer.audio_out", s.audio_in_channels, d)
    )


#: example layouts: ``original`` the release's one file; ``diffusers`` diffusers' ``transformer/``
_LAYOUTS = ("original", "diffusers")
#: what the example's one file is called (the bf16 single file's name, so that it reads as released)
RELEASE_FILE_STEM = "minimax_h3_bf16"


class MiniMaxH3(Family):
    name = "minimax-h3"
    title = "MiniMax-H3"
    diffusers_class = "MiniMaxH3Transformer3DModel"
    names = NAMES
    # ComfyUI's detection keys; diffusers' own (the token refiner's blocks, the blocks' AdaLN under diffusers' prefix)
    native_marks = ("video_patch_proj.", "audio_patch_proj.")
    diffusers_marks = ("token_refiner.refiner_blocks.", "transformer_blocks.0.adaln_proj.")
    gguf_architecture = None
    no_gguf_why = (
        "ComfyUI-GGUF's loader reads only the architectures of its IMG_ARCH_LIST (flux, sd1, sdxl, sd3, aura, "
        "hidream, cosmos, ltxv, hyvid, wan, lumina2, qwen_image), none of them MiniMax-H3"
    )
    lora_prefixes = ("transformer.", "diffusion_model.", "model.diffusion_model.", "base_model.model.")
    carried_parts = (ROPE,)
    diffusers_not_native_why = (
        "ComfyUI's detection reads rope.inv_freq, which diffusers' class does not store; convert the original release "
        "(Comfy-Org/MiniMax-H3) to it instead, or this model to fp8_channel, torchao_fp8, torchao_int8 or nf4"
    )
    default_recipes = {
        "minimax-h3": {
            "fp8_channel": "minimax-h3-fp8",
            "torchao_fp8": "minimax-h3-torchao-fp8",
            "torchao_int8": "minimax-h3-torchao-int8",
            "nf4": "minimax-h3-nf4",
            "comfy_fp8": "minimax-h3-comfy-fp8",
            "comfy_int8": "minimax-h3-comfy-int8",
            "comfy_nvfp4": "minimax-h3-comfy-nvfp4",
            "comfy_mxfp8": "minimax-h3-comfy-mxfp8",
        },
        "minimax-h3-diffusers": {
            "fp8_channel": "minimax-h3-diffusers-fp8",
            "torchao_fp8": "minimax-h3-diffusers-torchao-fp8",
            "torchao_int8": "minimax-h3-diffusers-torchao-int8",
            "nf4": "minimax-h3-diffusers-nf4",
        },
    }
    presets = {
        # heads narrower than the hidden size (3 x 32 = 96 < 128), as the release's (56 x 128 = 7168 > 5376) differ
        "tiny": MiniMaxH3Shape(
            hidden_size=128,
            num_attention_heads=3,
            attention_head_dim=32,
            ffn_dim=256,
            num_layers=2,
            num_refiner_layers=1,
            time_embed_hidden_dim=128,
            time_embed_dim=64,
            rope_freq_dim=4,
        ),
        # every Linear of the blocks a multiple of 128 wide
        "small": MiniMaxH3Shape(
            hidden_size=256,
            num_attention_heads=6,
            attention_head_dim=64,
            ffn_dim=768,
            num_layers=4,
            num_refiner_layers=2,
            time_embed_hidden_dim=256,
            time_embed_dim=128,
            rope_freq_dim=8,
        ),
        # MiniMax-H3 33B (MiniMaxH3Transformer3DModel's defaults, ComfyUI's MiniMaxH3Model's): for benchmarks
        "33b": MiniMaxH3Shape(
            hidden_size=5376,
            num_attention_heads=56,
            attention_head_dim=128,
            ffn_dim=14336,
            num_layers=50,
            num_refiner_layers=2,
            time_embed_hidden_dim=5376,
            time_embed_dim=2688,
            rope_freq_dim=16,
        ),
    }
    example_layouts = _LAYOUTS
    # the smallest whose every Linear each bundled recipe takes (nf4 needs inputs a multiple of 64 wide: tiny's
    # attention output is 96)
    default_preset = "small"

    # --- recognizing it ------------------------------------------------------------------------------

    def layouts(self, folder: Path, open_: Callable[[str], Component | None]) -> list[SourceLayout]:
        """``minimax-h3-diffusers``: a diffusers ``transformer/`` (or such a folder itself); ``minimax-h3``: the
        release's one file at the root, told by its native names."""
        found = []
        transformer = open_("transformer")
        if transformer is not None and self._is_diffusers(transformer):
            why = f"{self.title}, diffusers layout ({self.diffusers_class} in transformer/)"
            found.append(self.layout(why, "minimax-h3-diffusers"))
        root = open_(".")
        if root is not None:
            if self.naming(root.tensors) == "native":
                why = f"{self.title} release: one file, the original names (Comfy-Org/MiniMax-H3), no config.json"
                found.append(self.layout(why, "minimax-h3"))
            elif (root.config or {}).get("_class_name") == self.diffusers_class:
                why = f"{self.title}, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, "minimax-h3-diffusers"))
        return found

    # --- names ---------------------------------------------------------------------------------------

    def name_table(self, role: str, fmt: str, where: str = "") -> NameTable:
        """GGUF refused whatever the layout (`no_gguf_why`); a diffusers-named model's native names (ComfyUI's
        formats) are refused when it is planned (`diffusers_not_native_why`)."""
        if fmt == "gguf":
            at = f"{where}: " if where else ""
            raise InputError(
                f"{at}{self.title} has no GGUF architecture ({self.no_gguf_why}): convert it to another format "
                "(quantize recipes --for lists them)"
            )
        return super().name_table(role, fmt, where)

    # --- running it ------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return _INPUTS

    def runnable_names(self, names: Sequence[str], where: Path) -> dict[str, str]:
        """The release's names -> diffusers' (`Family.runnable_names`; the stacked ones cut by `runnable_stacks`);
        ``rope.inv_freq`` left out: diffusers computes it from the config."""
        return super().runnable_names([n for n in names if not self.carried(n)], where)

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`MiniMaxH3Transformer3DModel`'s config for the release's file (which has no config.json), read off the
        tensor shapes as ComfyUI reads them; the rest (rope theta, norm epsilons) are the class's defaults, which
        ComfyUI's are too. A pruned file (``adaln_t_table``, no time embedder) is refused, naming the tensor."""

        def shape(name: str) -> tuple[int, ...]:
            if name not in tensors:
                raise InputError(f"{where}: no tensor {name!r}: not a {self.title} release file")
            return tuple(tensors[name].shape)

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
            "num_layers": _count(tensors, "blocks."),
            "num_refiner_layers": _count(tensors, "token_refiner.blocks."),
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

    def pipeline_tag(self, config: dict) -> str | None:
        return "text-to-video"

    # --- examples --------------------------------------------------------------------------------------

    def example(self, preset: str, layout: str) -> list[ExampleModel]:
        """``original``: the release's one file at the root (original names, no config.json); ``diffusers``:
        ``transformer/`` with the names and shapes diffusers' own class has (built on meta). Only names and shapes:
        `quantize example` writes them one tensor at a time, so the 33B one never is in memory."""
        if preset not in self.presets or layout not in _LAYOUTS:
            raise InputError(
                f"{self.title} examples: preset {preset!r}, layout {layout!r}: presets {', '.join(self.presets)}, "
                f"layouts {', '.join(_LAYOUTS)}"
            )
        from .wan_vace import diffusers_example

        native = minimax_h3_tensors(self.presets[preset])
        if layout == "original":
            return [ExampleModel(".", native, None, RELEASE_FILE_STEM)]
        return [diffusers_example(self, native, {})]


def _count(tensors: Mapping[str, object], prefix: str) -> int:
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in tensors):
        n += 1
    return n


MINIMAX_H3 = MiniMaxH3()
