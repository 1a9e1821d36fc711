"""Qwen2.5-VL (transformers' `Qwen2_5_VLForConditionalGeneration`; Qwen2.5-VL-7B is the text encoder of Kandinsky 5,
HunyuanVideo 1.5 and Qwen-Image): everything the tool knows of it.

Layouts (`QWEN25VL.layouts`): ``qwen25vl``: a transformers folder, a pipeline's ``text_encoder/`` (a diffusers
Kandinsky 5 pipeline's) or such a folder itself (config.json ``architectures:
["Qwen2_5_VLForConditionalGeneration"]``), in the names its checkpoints store (Qwen/Qwen2.5-VL-7B-Instruct's:
``model.layers.N``, ``visual.``, ``lm_head``); ``qwen25vl-single``: one safetensors file in ComfyUI's names, no
config.json (Comfy-Org's repackaged ``qwen_2.5_vl_7b.safetensors``).

Names: ComfyUI's Qwen2.5-VL (``comfy/text_encoders/llama.py`` `Qwen25_7BVLI`, which CLIPLoader picks by
``model.layers.0.self_attn.k_proj.bias`` of 512 rows) holds the names as stored, so `NAMES` maps each to itself
(a table still: a tensor it does not list is refused). transformers 5's class holds them as
``model.language_model.`` and ``model.visual.`` (`CLASS_PREFIXES`, its loader's renaming, which a test holds to
transformers' own; a name already so is left as it is): a forward pass and the loader fill the class through them,
and the formats transformers loads are written in them.

The tokenizer: ComfyUI bundles Qwen2.5's (``comfy/text_encoders/qwen25_tokenizer``), so its files hold none.

GGUF: two files, as llama.cpp's converter writes a Qwen2.5-VL and ComfyUI-GGUF's CLIP loader reads it back: the
language model as llama.cpp's ``qwen2vl`` (``qwen25vl.gguf``: `GGUF_NAMES`, ``blk.N.attn_q``, ``token_embd``,
``output``; its hyperparameters `text_key_values`) and the vision tower beside it as its ``mmproj`` file
(``mmproj-qwen25vl.gguf``, architecture ``clip``: ``v.blk.N.attn_q``, ``v.patch_embd``, ``mm.0``; its hyperparameters
`vision_key_values`), which ComfyUI-GGUF finds by name (a ``.gguf`` naming ``mmproj`` and the text file's stem:
rename both alike). llama.cpp's converter (``Qwen2VLVisionModel.modify_tensors``) writes the tower's fused ``qkv``
as its three thirds and its Conv3d patch embedding as its two temporal taps, two Conv2d kernels
(``v.patch_embd.weight``, ``v.patch_embd.weight.1``): so does `GGUF_NAMES` (`Blocks.split`, `Cut`), and ComfyUI-GGUF's
``gguf_mmproj_loader`` joins them again.

What stays high-precision, and why (the bundled recipes say it too): the token embedding and the output head
(152064 rows each: 0.55B parameters apiece in the 7B, lookup tables; the head unused by an encoder, carried as
stored), the vision tower and its merger (0.67B, run for image prompts only; its patch embedding a 3-D
convolution) and every norm; every Linear of the 28 language-model layers is quantized (their q, k and v biases
kept).

>>> GGUF_NAMES.native("visual.blocks.2.attn.proj.weight"), sorted(GGUF_NAMES.splits("visual.blocks.2.attn.qkv.bias"))
('v.blk.2.attn_out.weight', ['v.blk.2.attn_k.bias', 'v.blk.2.attn_q.bias', 'v.blk.2.attn_v.bias'])
>>> QWEN25VL.native_name("model.layers.3.self_attn.k_proj.bias")
'model.layers.3.self_attn.k_proj.bias'
>>> QWEN25VL.class_name("model.layers.3.self_attn.k_proj.bias"), QWEN25VL.class_name("visual.merger.ln_q.weight")
('model.language_model.layers.3.self_attn.k_proj.bias', 'model.visual.merger.ln_q.weight')
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .encoder import TextEncoder, token_inputs
from .family import (
    CardWords,
    Detection,
    Folders,
    GGUFCompanion,
    ModelInputs,
    PlanPolicy,
    count_blocks,
    shape_reader,
)
from .names import BlockNames, Blocks, Cut
from .policy import Policy

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = [
    "QWEN25VL",
    "Qwen25VLFamily",
    "NAMES",
    "GGUF_NAMES",
    "CLASS",
    "CLASS_PREFIXES",
    "LAYER_GGUF",
    "layer_targets",
    "LAYER_QUANTIZED",
    "LAYER_CHECKS",
    "text_key_values",
    "vision_key_values",
]

CLASS = "Qwen2_5_VLForConditionalGeneration"

# --- names -------------------------------------------------------------------------------------------------

#: a language-model layer's modules -> llama.cpp's names of them (gguf-py's MODEL_TENSORS[QWEN2VL],
#: tensor_mapping.py): what its text model alone writes to GGUF (`qwen25vl_text`)
LAYER_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_VISION_BLOCK = (
    "norm1",
    "norm2",
    "attn.qkv",
    "attn.proj",
    *(f"mlp.{p}_proj" for p in ("gate", "up", "down")),
)
_ROOT = (
    "model.embed_tokens",
    "model.norm",
    "lm_head",
    "visual.patch_embed.proj",
    "visual.merger.ln_q",
    "visual.merger.mlp.0",
    "visual.merger.mlp.2",
)

#: the names Qwen2.5-VL's checkpoints store -> ComfyUI's: the same (``comfy/text_encoders/llama.py``,
#: ``qwen_vl.py``; ComfyUI ignores ``lm_head``)
NAMES = BlockNames(
    root_modules={m: m for m in _ROOT},
    root_tensors={},
    blocks=(
        Blocks("model.layers", "model.layers", modules={m: m for m in LAYER_GGUF}),
        Blocks("visual.blocks", "visual.blocks", modules={m: m for m in _VISION_BLOCK}),
    ),
)
#: a vision block's modules -> llama.cpp's (gguf-py's MODEL_TENSORS[MMPROJ]); its fused qkv is `Blocks.split`
_VISION_GGUF = {
    "norm1": "ln1",
    "norm2": "ln2",
    "attn.proj": "attn_out",
    **{f"mlp.{p}_proj": f"ffn_{p}" for p in ("gate", "up", "down")},
}
#: the names its checkpoints store -> llama.cpp's: the language model's ``qwen2vl`` names and the tower's ``mmproj``
#: ones (``v.``, ``mm.``), its qkv in thirds and its Conv3d's two temporal taps apart, as llama.cpp's converter
#: writes them (gguf-py's tensor map, which a test holds this to)
GGUF_NAMES = BlockNames(
    root_modules={
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
        "visual.merger.ln_q": "v.post_ln",
        "visual.merger.mlp.0": "mm.0",
        "visual.merger.mlp.2": "mm.2",
    },
    root_tensors={},
    blocks=(
        Blocks("model.layers", "blk", modules=LAYER_GGUF),
        Blocks(
            "visual.blocks", "v.blk", modules=_VISION_GGUF, split={"attn.qkv": ("attn_q", "attn_k", "attn_v")}
        ),
    ),
    root_cuts={
        "visual.patch_embed.proj.weight": Cut(("v.patch_embd.weight", "v.patch_embd.weight.1"), dim=2)
    },
)
#: what its mmproj file holds (llama.cpp's vision tensors)
MMPROJ = GGUFCompanion("clip", holds=("v.", "mm."))

#: stored prefix -> the prefix transformers 5's class holds it under (its ``conversion_mapping`` for qwen2_5_vl)
CLASS_PREFIXES = (("model.", "model.language_model."), ("visual.", "model.visual."))

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(
    lambda config: config["text_config"]["vocab_size"], module="model.language_model", use_cache=False
)

# --- config, from a release's tensor shapes ------------------------------------------------------------------

#: Qwen2.5-VL's head size, text and vision (7B: 28 heads of 128 over 3584; the tower: 16 of 80 over 1280)
_HEAD_DIM, _VISION_HEAD_DIM = 128, 80
#: what Qwen2.5-VL-7B's config.json says and the shapes do not (Qwen/Qwen2.5-VL-7B-Instruct)
_TEXT_DEFAULTS = {
    "model_type": "qwen2_5_vl_text",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "max_position_embeddings": 128_000,
    "tie_word_embeddings": False,
}
_VISION_DEFAULTS = {
    "model_type": "qwen2_5_vl",
    "hidden_act": "silu",
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "window_size": 112,
}


#: the image normalization Qwen2.5-VL's processor applies (transformers' OPENAI_CLIP_MEAN and _STD, its
#: preprocessor_config.json's), which llama.cpp's converter writes from that file
_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


def text_key_values(arch: str, config: dict) -> dict[str, str | int | float | tuple[int, ...]]:
    """llama.cpp's ``qwen2vl`` hyperparameters of a Qwen2.5-VL language model (``convert_hf_to_gguf.py``'s
    Qwen2VLModel over its TextModel), from its config (a whole model's: its text fields, at the top level or under
    ``text_config``): the widths, its rope base and epsilon, and the multimodal rope's sections padded to four."""
    config = {**config, **config.get("text_config", {})}
    # transformers 5 writes ``rope_parameters``, 4 wrote ``rope_scaling`` and ``rope_theta`` (diffusers' repos)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    sections = list(rope.get("mrope_section") or ())
    theta = rope.get("rope_theta", config.get("rope_theta", 1_000_000.0))
    return {
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.rope.freq_base": float(theta),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.rope.dimension_sections": tuple((sections + [0, 0, 0, 0])[:4]),
    }


def vision_key_values(config: dict, where: Path) -> dict[str, str | int | float | bool | tuple[float, ...]]:
    """The ``clip.*`` hyperparameters of Qwen2.5-VL's mmproj file, as llama.cpp's converter writes them
    (``MmprojModel.set_gguf_parameters`` and ``Qwen2VLVisionModel``'s): the tower's widths, the text model's width it
    projects to, the image normalization, the projector, SiLU, the window-attention pattern (full attention every
    n-th block, n read off ``fullatt_block_indexes``, which must be evenly spaced) and the norms' epsilon."""
    text = {**config, **config.get("text_config", {})}
    vision = config.get("vision_config") or {}
    wanted = ("fullatt_block_indexes", "patch_size", "hidden_size", "intermediate_size", "depth", "num_heads")
    lacking = [k for k in wanted if k not in vision] + [k for k in ("hidden_size",) if k not in text]
    if lacking:
        raise InputError(
            f"{where}: the config has no {', '.join(lacking)} (vision_config's, text_config's): the mmproj file "
            "llama.cpp's converter writes needs them"
        )
    full = list(vision["fullatt_block_indexes"])
    every = full[0] + 1 if full else 0
    if not full or any(b - a != every for a, b in zip(full, full[1:], strict=False)):
        raise InputError(
            f"{where}: vision_config fullatt_block_indexes {full} are not evenly spaced: llama.cpp's mmproj "
            "holds one window-attention pattern"
        )
    return {
        "clip.has_vision_encoder": True,
        "clip.vision.projection_dim": text["hidden_size"],
        "clip.vision.image_size": vision.get("image_size", 560),
        "clip.vision.patch_size": vision["patch_size"],
        "clip.vision.embedding_length": vision["hidden_size"],
        "clip.vision.feed_forward_length": vision["intermediate_size"],
        "clip.vision.block_count": vision["depth"],
        "clip.vision.attention.head_count": vision["num_heads"],
        "clip.vision.image_mean": _IMAGE_MEAN,
        "clip.vision.image_std": _IMAGE_STD,
        "clip.projector_type": "qwen2.5vl_merger",
        "clip.use_silu": True,
        "clip.vision.n_wa_pattern": every,
        "clip.vision.attention.layer_norm_epsilon": float(text.get("rms_norm_eps", 1e-6)),
    }


# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------


def layer_targets(layers: str) -> tuple[str, ...]:
    """Every Linear of the language model's layers under `layers` (a regex): attention and gated MLP."""
    return (rf"{layers}\.\d+\.self_attn\.(q|k|v|o)_proj", rf"{layers}\.\d+\.mlp\.(gate|up|down)_proj")


#: the Linears `layer_targets` quantizes, in words, after "every Linear of"
LAYER_QUANTIZED = (
    "(the attention's q, k, v, o projections, their q, k and v biases kept as they are, and the gated MLP's gate, "
    "up and down projections)"
)
#: 4-bit weights compound through the layers: the output's floor
LAYER_CHECKS = {
    "nf4": {"min_forward_sqnr_db": 12},
    "comfy_nvfp4": {"min_forward_sqnr_db": 12},
    "comfy_w4a8": {"min_forward_sqnr_db": 12},
    "comfy_w4a4": {"min_forward_sqnr_db": 12},
}
_KEPT = (
    "the token embedding and the output head (embed_tokens and lm_head: 152064 rows each, 0.55B parameters apiece "
    "in the 7B, lookup tables where a quantization error reaches every token; the head unused by an encoder), the "
    "vision tower and its merger (0.67B, run for image prompts only; its patch embedding a 3-D convolution) and "
    "every norm"
)

QWEN25VL_POLICY = Policy(
    what=f"Qwen2.5-VL text encoder ({CLASS}: Kandinsky 5's, HunyuanVideo 1.5's, Qwen-Image's) in transformers' "
    "layout (a pipeline's text_encoder/, or that folder itself, in the names Qwen/Qwen2.5-VL-7B-Instruct stores)",
    components=("text_encoder",),
    targets=layer_targets(r"model\.layers"),
    quantized=f"every Linear of the language model's layers {LAYER_QUANTIZED}",
    kept=_KEPT,
    checks=LAYER_CHECKS,
    copy_other_files=False,
)
QWEN25VL_SINGLE_POLICY = Policy(
    what="Qwen2.5-VL text encoder as one file given as SOURCE itself, in ComfyUI's names (Comfy-Org's "
    "qwen_2.5_vl_7b.safetensors: the names Qwen/Qwen2.5-VL-7B-Instruct stores; no config.json)",
    components=(".",),
    targets=QWEN25VL_POLICY.targets,
    quantized=QWEN25VL_POLICY.quantized,
    kept=_KEPT,
    checks=LAYER_CHECKS,
    copy_other_files=False,
    note=f"A transformers-layout output of it is written in the names the class holds (model.language_model., "
    f"model.visual.) with {CLASS}'s config read off its shapes (what they do not say Qwen2.5-VL-7B's) as "
    "config.json.",
)


class Qwen25VLFamily(TextEncoder):
    name = "qwen25vl"
    title = "Qwen2.5-VL"
    names = NAMES
    detection = Detection(
        CLASS,
        # as its checkpoints store it (ComfyUI's too), or as the class holds it (a transformers-side output)
        diffusers_marks=("model.layers.0.", "model.language_model.layers.0."),
        # the vision tower's fused qkv: no other encoder here has it (a Qwen2.5 LLM has no tower)
        own_marks=("visual.blocks.0.attn.qkv.", "model.visual.blocks.0.attn.qkv."),
        # Qwen3-VL's tower has the fused qkv too, and DeepStack's mergers beside it (`qwen3vl`)
        foreign_marks=("model.visual.deepstack_merger_list.", "visual.deepstack_merger_list."),
        library="transformers",
    )
    class_prefixes = CLASS_PREFIXES
    #: the 3B ties its head to the embedding; the 7B stores it (then kept as stored)
    tied_linears = {"lm_head": "model.language_model.embed_tokens.weight"}
    folders = Folders(
        "qwen25vl",
        release="qwen25vl-single",
        release_why="Qwen2.5-VL, one file in ComfyUI's names (Comfy-Org's qwen_2.5_vl_7b*.safetensors)",
    )
    plan = PlanPolicy(
        root_stem="qwen25vl", gguf_architecture="qwen2vl", gguf_names=GGUF_NAMES, gguf_companion=MMPROJ
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the output head, the vision tower, the norms and the layers the recipe keeps "
        "stay in their original precision.",
        kept_tensors="every norm and bias, the token embedding, the output head and the vision tower",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node "
        "(type `qwen_image`), or as the first file of **DualCLIPLoader** (type `kandinsky5`, `hunyuan_video_15`); "
        "ComfyUI bundles its tokenizer",
        comfyui_gguf="put both files (the text model and its `mmproj-` vision tower, named alike) in "
        "`ComfyUI/models/text_encoders/` and load the first with **CLIPLoader (GGUF)** (type `qwen_image`) or as "
        "the first file of **DualCLIPLoader (GGUF)** (`kandinsky5`, `hunyuan_video_15`): it finds the mmproj file "
        "beside it by name; ComfyUI bundles its tokenizer",
    )
    policies = {"qwen25vl": QWEN25VL_POLICY, "qwen25vl-single": QWEN25VL_SINGLE_POLICY}

    # --- recognizing it ------------------------------------------------------------------------------------

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def gguf_key_values(
        self, config: dict, tensors: Mapping[str, TensorInfo]
    ) -> dict[str, str | int | float | tuple[int, ...]]:
        return text_key_values(self.plan.gguf_architecture, config)

    def gguf_companion_key_values(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path
    ) -> dict[str, str | int | float | bool | tuple[int | float, ...]]:
        return vision_key_values(config, where)

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`Qwen2_5_VLForConditionalGeneration`'s config for a file that has none, read off the tensor shapes;
        what they do not say is Qwen2.5-VL-7B's (heads of 128 and of 80, its rope, window and patch sizes)."""
        if config:
            return dict(config)

        shape = shape_reader(tensors, where, f"a {self.title} encoder")

        vocab, hidden = shape("model.embed_tokens.weight")
        depth = count_blocks(tensors, "visual.blocks.")
        width = shape("visual.patch_embed.proj.weight")[0]
        text = {
            **copy.deepcopy(_TEXT_DEFAULTS),
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": shape("model.layers.0.mlp.gate_proj.weight")[0],
            "num_hidden_layers": count_blocks(tensors, "model.layers."),
            "num_attention_heads": shape("model.layers.0.self_attn.q_proj.weight")[0] // _HEAD_DIM,
            "num_key_value_heads": shape("model.layers.0.self_attn.k_proj.weight")[0] // _HEAD_DIM,
        }
        vision = {
            **_VISION_DEFAULTS,
            "depth": depth,
            "hidden_size": width,
            "intermediate_size": shape("visual.blocks.0.mlp.gate_proj.weight")[0],
            "num_heads": max(1, width // _VISION_HEAD_DIM),
            "out_hidden_size": shape("visual.merger.mlp.2.weight")[0],
            # every eighth block attends over the whole image (7, 15, 23, 31 of the 7B's 32)
            "fullatt_block_indexes": [i for i in range(depth) if i % 8 == 7] or [depth - 1],
        }
        return {
            "architectures": [CLASS],
            "model_type": "qwen2_5_vl",
            "text_config": text,
            "vision_config": vision,
            "tie_word_embeddings": "lm_head.weight" not in tensors,
        }


QWEN25VL = Qwen25VLFamily()
