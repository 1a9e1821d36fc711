"""HunyuanVideo 1.5 (8.3B; diffusers' `HunyuanVideo15Transformer3DModel`): everything the tool knows of it.

Layouts (`HunyuanVideo15.layouts`): ``hunyuanvideo15`` (one model of the release as Tencent ships it:
``tencent/HunyuanVideo-1.5`` keeps each variant in ``transformer/<480p_t2v|720p_i2v|...>/``, a config.json of
``HunyuanVideo_1_5_DiffusionTransformer`` and its safetensors in the original ``hyvideo`` names; SOURCE is that
variant's folder) and ``hunyuanvideo15-diffusers`` (a diffusers ``transformer/``, or that folder itself).

Three namings, one table:

- *diffusers*: `HunyuanVideo15Transformer3DModel`'s (``transformer_blocks.N.attn.to_q``, ``context_embedder``...).
- *native*: what ComfyUI loads (``comfy/model_detection.py``'s "Hunyuan Video" branch, keyed on
  ``txt_in.individual_token_refiner.blocks.0.norm1.weight``; ``vision_in.proj.0.weight`` 1152 wide makes it
  ``supported_models.HunyuanVideo15``): the original ``hyvideo`` names, with each double block's attention input
  FUSED, ``double_blocks.N.img_attn_qkv`` = [q; k; v] and ``txt_attn_qkv`` (ComfyUI's blocks are Flux's,
  ``img_attn.qkv``; its ``process_unet_state_dict`` renames ``_attn_qkv.`` to that). GGUF files
  (``general.architecture`` "hyvid", which ComfyUI-GGUF reads and hands to ComfyUI's detection) use them too.
  This is `NAMES`: diffusers -> native, read both ways, with its stacked tensors (`Blocks.stacked`): the fused
  q/k/v of the double blocks and of the text token refiner (``self_attn_qkv``), and the final layer's
  ``adaLN_modulation.1`` = diffusers' ``norm_out.linear`` with its halves swapped (shift, scale against
  ``AdaLayerNormContinuous``'s scale, shift), a root-level stack (`_StackedNames`).
- *release*: the Tencent release's own names are the native ones except that its double blocks keep q, k and v
  apart (``img_attn_q``, ``img_attn_k``, ``img_attn_v``, the same for ``txt_``): ComfyUI cannot load them as they
  are. A release converted to a format of native names stacks them (`HunyuanVideo15.native_stacks`); the
  formats of source names (fp8_channel, torchao_fp8, torchao_int8, nf4) keep them as released, and the release's
  config.json. A forward pass maps them one to one (`diffusers_name`), and so does ``loaders`` (it reads a native
  checkpoint's own names through `diffusers_name` and `runnable_stacks`, turned around), building the diffusers
  class from that config (`diffusers_config`). diffusers' ``from_pretrained`` cannot load such an output: it never
  renames, and the release's config builds no `HunyuanVideo15Transformer3DModel` (it fails on ``patch_size``).

diffusers' single-file loader does not map HunyuanVideo 1.5 (``single_file_utils`` knows HunyuanVideo 1 only,
``convert_hunyuan_video_transformer_to_diffusers``); diffusers converts the release with
``scripts/convert_hunyuan_video1_5_to_diffusers.py`` (not installed with the package). The tests check `NAMES`
against both: the HunyuanVideo 1 converter for every name the two versions share, the script's table for the rest.

The dimensions ComfyUI fixes (``comfy/model_detection.py``, ``comfy/ldm/hunyuan_video/model.py``): heads of 128
(``num_heads = hidden_size // 128``), RoPE axes (16, 56, 56), mlp ratio 4, theta 256, two refiner blocks, the
ByT5 mapper 1472 -> 2048 -> 2048 -> hidden, the vision projection 1152 wide (SigLIP), Qwen2.5-VL's 3584-wide text.

>>> HUNYUANVIDEO15.native_name("transformer_blocks.3.ff_context.net.2.weight")
'double_blocks.3.txt_mlp.fc2.weight'
>>> HUNYUANVIDEO15.names.stacked_into("transformer_blocks.3.attn.add_k_proj.bias")
'double_blocks.3.txt_attn_qkv.bias'
>>> HUNYUANVIDEO15.diffusers_name("double_blocks.0.img_attn_v.weight")
'transformer_blocks.0.attn.to_v.weight'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    count_blocks,
    shape_reader,
)
from .names import _LEAVES, BlockNames, Blocks, Rows, Stack
from .policy import Policy

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import TensorInfo

__all__ = ["HUNYUANVIDEO15", "HunyuanVideo15", "NAMES", "RELEASE_CLASS"]

# --- names ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StackedNames(BlockNames):
    """`BlockNames` with stacked tensors outside the blocks too: native root module -> the diffusers rows it
    stacks (the final layer's modulation, diffusers' ``norm_out.linear`` with its halves swapped)."""

    root_stacked: Mapping[str, tuple[Rows, ...]] = field(default_factory=dict)

    def native_stack(self, native_name: str) -> Stack | None:
        for leaf in _LEAVES:
            rows = (
                self.root_stacked.get(native_name.removesuffix(leaf)) if native_name.endswith(leaf) else None
            )
            if rows:
                return tuple((f"{r.module}{leaf}", r.part, r.parts) for r in rows)
        return super().native_stack(native_name)

    def stacked_into(self, diffusers_name: str) -> str | None:
        for native, rows in self.root_stacked.items():
            for leaf in _LEAVES:
                if any(diffusers_name == f"{r.module}{leaf}" for r in rows):
                    return f"{native}{leaf}"
        return super().stacked_into(diffusers_name)


def _qkv(*modules: str) -> tuple[Rows, ...]:
    return tuple(Rows(m) for m in modules)


NAMES = _StackedNames(
    root_modules={
        "x_embedder.proj": "img_in.proj",
        "time_embed.timestep_embedder.linear_1": "time_in.mlp.0",
        "time_embed.timestep_embedder.linear_2": "time_in.mlp.2",
        # the MeanFlow (super-resolution, distilled) models' second timestep
        "time_embed.timestep_embedder_r.linear_1": "time_r_in.mlp.0",
        "time_embed.timestep_embedder_r.linear_2": "time_r_in.mlp.2",
        "context_embedder.proj_in": "txt_in.input_embedder",
        "context_embedder.time_text_embed.timestep_embedder.linear_1": "txt_in.t_embedder.mlp.0",
        "context_embedder.time_text_embed.timestep_embedder.linear_2": "txt_in.t_embedder.mlp.2",
        "context_embedder.time_text_embed.text_embedder.linear_1": "txt_in.c_embedder.linear_1",
        "context_embedder.time_text_embed.text_embedder.linear_2": "txt_in.c_embedder.linear_2",
        "context_embedder_2.norm": "byt5_in.layernorm",
        "context_embedder_2.linear_1": "byt5_in.fc1",
        "context_embedder_2.linear_2": "byt5_in.fc2",
        "context_embedder_2.linear_3": "byt5_in.fc3",
        "image_embedder.norm_in": "vision_in.proj.0",
        "image_embedder.linear_1": "vision_in.proj.1",
        "image_embedder.linear_2": "vision_in.proj.3",
        "image_embedder.norm_out": "vision_in.proj.4",
        "cond_type_embed": "cond_type_embedding",
        "proj_out": "final_layer.linear",
    },
    root_tensors={},
    blocks=(
        Blocks(
            "transformer_blocks",
            "double_blocks",
            modules={
                "norm1.linear": "img_mod.linear",
                "norm1_context.linear": "txt_mod.linear",
                "attn.norm_q": "img_attn_q_norm",
                "attn.norm_k": "img_attn_k_norm",
                "attn.norm_added_q": "txt_attn_q_norm",
                "attn.norm_added_k": "txt_attn_k_norm",
                "attn.to_out.0": "img_attn_proj",
                "attn.to_add_out": "txt_attn_proj",
                "ff.net.0.proj": "img_mlp.fc1",
                "ff.net.2": "img_mlp.fc2",
                "ff_context.net.0.proj": "txt_mlp.fc1",
                "ff_context.net.2": "txt_mlp.fc2",
            },
            stacked={
                "img_attn_qkv": _qkv("attn.to_q", "attn.to_k", "attn.to_v"),
                "txt_attn_qkv": _qkv("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
            },
        ),
        Blocks(
            "context_embedder.token_refiner.refiner_blocks",
            "txt_in.individual_token_refiner.blocks",
            modules={
                "norm1": "norm1",
                "norm2": "norm2",
                "attn.to_out.0": "self_attn_proj",
                "ff.net.0.proj": "mlp.fc1",
                "ff.net.2": "mlp.fc2",
                "norm_out.linear": "adaLN_modulation.1",
            },
            stacked={"self_attn_qkv": _qkv("attn.to_q", "attn.to_k", "attn.to_v")},
        ),
    ),
    # [shift; scale] natively, [scale; shift] in diffusers' AdaLayerNormContinuous
    root_stacked={
        "final_layer.adaLN_modulation.1": (Rows("norm_out.linear", 1, 2), Rows("norm_out.linear", 0, 2))
    },
)

#: a release double block's separate q, k, v (``double_blocks.N.img_attn_q.weight``): the native name stacks them
_RELEASE_QKV = re.compile(r"double_blocks\.(\d+)\.(img|txt)_attn_([qkv])\.(weight|bias)")
#: their diffusers names, by stream and letter
_DIFFUSERS_QKV = {
    ("img", "q"): "attn.to_q",
    ("img", "k"): "attn.to_k",
    ("img", "v"): "attn.to_v",
    ("txt", "q"): "attn.add_q_proj",
    ("txt", "k"): "attn.add_k_proj",
    ("txt", "v"): "attn.add_v_proj",
}

#: what ComfyUI reads a HunyuanVideo 1.5 by, natively (`naming`): its condition-type table and vision projection
NATIVE_MARKS = ("cond_type_embedding.", "vision_in.")
DIFFUSERS_MARKS = ("cond_type_embed.", "image_embedder.")

#: the release's config class (``hyvideo.models.transformers.hunyuanvideo_1_5_transformer``)
RELEASE_CLASS = "HunyuanVideo_1_5_DiffusionTransformer"
#: the pixel size diffusers' config calls ``target_size``, by the release's ``ideal_resolution``
_TARGET_SIZE = {"480p": 640, "720p": 960}

# --- a forward pass's inputs -------------------------------------------------------------------------------


def _keys(config: dict) -> tuple[str, ...]:
    keys = (
        "hidden_states",
        "timestep",
        "encoder_hidden_states",
        "encoder_attention_mask",
        "encoder_hidden_states_2",
        "encoder_attention_mask_2",
        "image_embeds",
    )
    return (*keys, "timestep_r") if config.get("use_meanflow") else keys


def _shapes(config: dict) -> dict[str, tuple[tuple[int | None, ...], ...]]:
    shapes = {
        "hidden_states": ((None, config["in_channels"], None, None, None),),
        "timestep": ((None,),),
        "encoder_hidden_states": ((None, None, config["text_embed_dim"]),),
        "encoder_attention_mask": ((None, None),),
        "encoder_hidden_states_2": ((None, None, config["text_embed_2_dim"]),),
        "encoder_attention_mask_2": ((None, None),),
        "image_embeds": ((None, None, config["image_embed_dim"]),),
    }
    return {**shapes, "timestep_r": ((None,),)} if config.get("use_meanflow") else shapes


def _random(config: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Latents of 2 x 4 x 4 (the noise, the image latent and a mask: `in_channels`), 6 Qwen2.5-VL text tokens, 4
    ByT5 tokens and 4 SigLIP image tokens (non-zero: the vision projection runs, as for image-to-video), every
    token valid, a timestep of 500."""
    import torch

    t = dict(
        hidden_states=torch.randn(1, config["in_channels"], 2, 4, 4, generator=g),
        timestep=torch.full((1,), 500.0),
        encoder_hidden_states=torch.randn(1, 6, config["text_embed_dim"], generator=g),
        encoder_attention_mask=torch.ones(1, 6),
        encoder_hidden_states_2=torch.randn(1, 4, config["text_embed_2_dim"], generator=g),
        encoder_attention_mask_2=torch.ones(1, 4),
        image_embeds=torch.randn(1, 4, config["image_embed_dim"], generator=g),
    )
    if config.get("use_meanflow"):
        t["timestep_r"] = torch.full((1,), 250.0)
    return t


INPUTS = ModelInputs(
    keys=_keys,
    shapes=_shapes,
    random=_random,
    call=lambda config, t: dict(t, return_dict=False),
    accepts=_keys({"use_meanflow": True}),
)


# --- what the bundled recipes quantize ---------------------------------------------------------------------

_WHY_KEPT = (
    "they take the timestep or a raw encoder output, run once per step over few tokens (a fraction of a percent of "
    "the compute), and their error reaches every block: the modulations scale and gate the whole residual stream, "
    "the final layer writes the prediction itself"
)
_BLOCK_WHY = (
    "{down} too (the feed-forward down projections take GELU's outliers and add straight into the residual stream: "
    "kept where a format has one scale per tensor or per row, quantized where it scales blocks of inputs)"
)
_ATTENTION = r"double_blocks\.\d+\.(img|txt)_attn_(q|k|v|qkv|proj)"
_DIFFUSERS_ATTENTION = (
    r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
)
RELEASE_POLICY = Policy(
    what=(
        "HunyuanVideo 1.5 as released (one transformer/<variant>/ folder of tencent/HunyuanVideo-1.5: "
        "HunyuanVideo_1_5_DiffusionTransformer, original hyvideo names)"
    ),
    targets=(_ATTENTION, r"double_blocks\.\d+\.(img|txt)_mlp\.fc1"),
    quantized=(
        "every double block's attention (img_attn_q/k/v, img_attn_proj and the same txt_ ones, a fused *_attn_qkv "
        "where the source has it) and feed-forward img_mlp.fc1 and txt_mlp.fc1"
    ),
    kept=(
        "img_in (the 5-D patch embedding), txt_in (Qwen2.5-VL text input, its timestep and pooled-text embedders "
        "and the two token-refiner blocks), byt5_in (the ByT5 glyph-text mapper), vision_in (the SigLIP image "
        "projection), time_in (and time_r_in of MeanFlow models), cond_type_embedding, every img_mod/txt_mod "
        f"modulation, final_layer (its adaLN modulation and output linear): {_WHY_KEPT}"
    ),
    block_targets=(_ATTENTION, r"double_blocks\.\d+\.(img|txt)_mlp\.fc[12]"),
    block_why=_BLOCK_WHY.format(down="img_mlp.fc2 and txt_mlp.fc2"),
    sensitive=(r"double_blocks\.0\..*", r"double_blocks\.\d+\.(img|txt)_mlp\.fc2"),
    sensitive_why="the first double block and every feed-forward down projection (GELU's outliers)",
)
DIFFUSERS_POLICY = Policy(
    what="HunyuanVideo 1.5 (diffusers layout, HunyuanVideo15Transformer3DModel in transformer/)",
    components=("transformer",),
    targets=(_DIFFUSERS_ATTENTION, r"transformer_blocks\.\d+\.(ff|ff_context)\.net\.0\.proj"),
    quantized=(
        "every double block's attention (attn.to_q/to_k/to_v/to_out.0 and attn.add_q_proj/add_k_proj/add_v_proj/"
        "to_add_out) and feed-forward ff.net.0.proj and ff_context.net.0.proj"
    ),
    kept=(
        "x_embedder (the 5-D patch embedding), context_embedder (Qwen2.5-VL text input, its timestep and "
        "pooled-text embedders and the two token-refiner blocks), context_embedder_2 (the ByT5 glyph-text mapper), "
        "image_embedder (the SigLIP image projection), time_embed, cond_type_embed, every norm1/norm1_context "
        f"modulation, norm_out and proj_out (the final layer): {_WHY_KEPT}"
    ),
    block_targets=(_DIFFUSERS_ATTENTION, r"transformer_blocks\.\d+\.(ff|ff_context)\.net\.(0\.proj|2)"),
    block_why=_BLOCK_WHY.format(down="ff.net.2 and ff_context.net.2"),
    sensitive=(r"transformer_blocks\.0\..*", r"transformer_blocks\.\d+\.(ff|ff_context)\.net\.2"),
    sensitive_why=RELEASE_POLICY.sensitive_why,
)


class HunyuanVideo15(Family):
    name = "hunyuanvideo15"
    title = "HunyuanVideo 1.5"
    names = NAMES
    detection = Detection(
        "HunyuanVideo15Transformer3DModel",
        native_classes=(RELEASE_CLASS,),
        native_marks=NATIVE_MARKS,
        diffusers_marks=DIFFUSERS_MARKS,
    )
    folders = Folders(
        "hunyuanvideo15-diffusers",
        "hunyuanvideo15",
        "HunyuanVideo 1.5, one model of the release (original names: a transformer/<variant>/ folder)",
        release_classes=(RELEASE_CLASS, None),
    )
    plan = PlanPolicy(
        gguf_architecture="hyvid",  # ComfyUI-GGUF's IMG_ARCH_LIST; ComfyUI then tells 1.5 by vision_in (1152)
        # nn.Embedding in both runtimes (ComfyUI builds a plain torch one): a table, no Linear; F32 in GGUF
        plain_weights=(r"cond_type_embedding\.", r"cond_type_embed\."),
    )
    lora = LoraNames(
        prefixes=("diffusion_model.", "model.diffusion_model.", "transformer.", "base_model.model.")
    )
    policies = {"hunyuanvideo15": RELEASE_POLICY, "hunyuanvideo15-diffusers": DIFFUSERS_POLICY}

    # --- names -----------------------------------------------------------------------------------

    def diffusers_name(self, native_name: str) -> str | None:
        """The diffusers name of a native or release name (the release's separate q, k, v included)."""
        qkv = _RELEASE_QKV.fullmatch(native_name)
        if qkv is not None:
            return f"transformer_blocks.{qkv[1]}.{_DIFFUSERS_QKV[qkv[2], qkv[3]]}.{qkv[4]}"
        return super().diffusers_name(native_name)

    def native_stacks(self, names: Sequence[str], where: str) -> dict[str, Stack]:
        """Hook: a diffusers-named model's stacks (`Family.native_stacks`), or a release's: each double block's
        separate q, k, v stacked into the fused native one; `InputError` naming one a stack lacks."""
        found = [m for n in names if (m := _RELEASE_QKV.fullmatch(n))]
        if not found or self.naming(names) != "native":
            return super().native_stacks(names, where)
        present, stacks = set(names), {}
        for m in found:
            block, stream, leaf = m[1], m[2], m[4]
            native = f"double_blocks.{block}.{stream}_attn_qkv.{leaf}"
            stack = tuple((f"double_blocks.{block}.{stream}_attn_{x}.{leaf}", 0, 1) for x in "qkv")
            lacking = next((n for n, _, _ in stack if n not in present), None)
            if lacking is not None:
                raise InputError(
                    f"{where}: tensor {lacking!r} is missing: {self.title}'s native {native!r} stacks it with "
                    f"{m[0]!r}"
                )
            if native in present:
                raise InputError(f"{where}: tensor {native!r} and {m[0]!r}: q, k, v both fused and apart")
            stacks[native] = stack
        return stacks

    # --- running it ----------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`HunyuanVideo15Transformer3DModel`'s config for a release config.json (or ComfyUI's file, which has
        none), the widths read off the tensors as ComfyUI reads them; the head width from ``heads_num`` (else
        ComfyUI's 128), the RoPE axes from ``rope_dim_list`` (else ComfyUI's)."""

        shape = shape_reader(tensors, where, f"a {self.title} DiT")

        img_in = shape("img_in.proj.weight")
        hidden = img_in[0]
        if len(img_in) != 5:
            raise InputError(
                f"{where}: tensor 'img_in.proj.weight' is {len(img_in)}-D: a {self.title} has a 3-D patch"
            )
        heads = int(config.get("heads_num") or hidden // 128)
        if hidden % heads:
            raise InputError(
                f"{where / 'config.json'}: heads_num {heads} does not divide hidden_size {hidden}"
            )
        patch = list(img_in[2:])
        if patch[1] != patch[2]:
            raise InputError(f"{where}: tensor 'img_in.proj.weight' has patch {patch}: not square")
        task = config.get("ideal_task") or "t2v"
        return {
            "_class_name": self.diffusers_class,
            "in_channels": img_in[1],
            "out_channels": shape("final_layer.linear.weight")[0] // (patch[0] * patch[1] * patch[2]),
            "num_attention_heads": heads,
            "attention_head_dim": hidden // heads,
            "num_layers": count_blocks(tensors, "double_blocks."),
            "num_refiner_layers": count_blocks(tensors, "txt_in.individual_token_refiner.blocks."),
            "mlp_ratio": float(config.get("mlp_width_ratio", 4.0)),
            "patch_size": patch[1],
            "patch_size_t": patch[0],
            "qk_norm": "rms_norm",
            "text_embed_dim": shape("txt_in.input_embedder.weight")[1],
            "text_embed_2_dim": shape("byt5_in.fc1.weight")[1],
            "image_embed_dim": shape("vision_in.proj.0.weight")[0],
            "rope_theta": float(config.get("rope_theta", 256)),
            "rope_axes_dim": list(config.get("rope_dim_list") or (16, 56, 56)),
            "target_size": _TARGET_SIZE.get(config.get("ideal_resolution"), 640),
            "task_type": "i2v" if task == "i2v" else "t2v",
            "use_meanflow": "time_r_in.mlp.0.weight" in tensors,
        }

    def pipeline_tag(self, config: dict) -> str | None:
        task = config.get("task_type") or config.get("ideal_task")
        return "image-to-video" if task == "i2v" else "text-to-video"

    def cp_plan(self, config: dict) -> dict:
        """diffusers' context-parallel plan for `HunyuanVideo15Transformer3DModel`, which ships none: the
        rotary tables (cos, sin: one row per image token) split as RoPE returns them; the first block's image tokens
        and its joined text tokens split along the sequence, each rank holding a share of both (the blocks' joint
        attention sees [image; text] of every rank after Ulysses' all-to-all, the same set of tokens as one
        process), and the text mask at every block; the output projection's tokens gathered back. The attention's
        query-and-key mask goes on as its keys' (`cp_masks_on_keys`)."""
        from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

        rows = ContextParallelInput(split_dim=0, expected_dims=2, split_output=True)
        tokens = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
        return {
            "rope": {0: rows, 1: rows},
            # the tokens once (each block passes its share on), the text mask at every block (each gets the whole)
            "transformer_blocks.0": {"hidden_states": tokens, "encoder_hidden_states": tokens},
            "transformer_blocks.*": {
                "attention_mask": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False)
            },
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        }

    def cp_masks_on_keys(self) -> bool:
        """diffusers' `HunyuanVideo15AttnProcessor2_0` (0.42) builds [B, 1, S, S] from the valid tokens a rank
        holds; every rank holds image tokens (all valid), so its mask's keys are the rank's valid tokens."""
        return True


HUNYUANVIDEO15 = HunyuanVideo15()
