"""Qwen3-VL (transformers' `Qwen3VLForConditionalGeneration`; Qwen3-VL-8B is the text encoder of Qwen-Image 2.1,
Qwen3-VL-4B of Krea 2 and Mage-Flow): everything the tool knows of it.

Layouts (`QWEN3VL.layouts`): ``qwen3vl``: a transformers folder, a pipeline's ``text_encoder/`` (a diffusers
QwenImage21Pipeline's) or such a folder itself (config.json ``architectures: ["Qwen3VLForConditionalGeneration"]``),
in the names its checkpoints store (Qwen/Qwen3-VL-8B-Instruct's: ``model.language_model.layers.N``,
``model.visual.``, ``lm_head``); ``qwen3vl-single``: one safetensors file in ComfyUI's names, no config.json
(Comfy-Org's repackaged ``qwen3vl_8b.safetensors``).

Names: Qwen3-VL's checkpoints store the names the class holds (transformers has no renaming for it), and ComfyUI
reads that same file: CLIPLoader (``comfy/sd.py`` ``detect_te_model``) tells Qwen3-VL by its tower's
``model.visual.deepstack_merger_list.0.norm.weight`` (the 4B by the merger's 2560 output rows, else the 8B), then
renames ``model.language_model.`` to its `Llama2_`'s ``model.``, ``model.visual.`` to its tower's ``visual.``
(``comfy/text_encoders/qwen3vl.py`` `Qwen3VLVisionModel`: Qwen3.5's tower with DeepStack's mergers) and ``lm_head.``
to ``model.lm_head.``. So `NAMES` maps each to itself (a table still: a tensor it does not list is refused). CLIPLoader
type ``qwen_image`` (and any type without its own Qwen3-VL branch) runs it as `Qwen3VLTEModel`; ComfyUI bundles the
tokenizer (Qwen2.5's), so its files hold none.

GGUF: refused at plan time (`NO_GGUF`): ComfyUI-GGUF's CLIP loader lists ``qwen3vl`` but maps back only the
language model (no mmproj file for it), and ComfyUI then tells those names as Qwen3-8B or -4B, a language model of
another rope base (1e6 against Qwen3-VL's 5e6, no multimodal rope), Flux 2 Klein's or Z-Image's encoder: no reader
runs a GGUF file as Qwen3-VL.

What stays high-precision, and why (the bundled recipes say it too): the token embedding and the output head
(151936 rows each: 0.62B parameters apiece in the 8B, lookup tables; the head unused by an encoder, carried as
stored), the vision tower, its merger and its DeepStack mergers (0.58B in the 8B, run for image prompts only; its
patch embedding a 3-D convolution; the 8B's MLP 4304 wide, which no 32-wide block divides) and every norm (the
attention's q and k norms too); every Linear of the 36 language-model layers is quantized.

>>> QWEN3VL.native_name("model.language_model.layers.3.self_attn.q_norm.weight")
'model.language_model.layers.3.self_attn.q_norm.weight'
>>> QWEN3VL.native_name("model.visual.deepstack_merger_list.2.linear_fc1.bias")
'model.visual.deepstack_merger_list.2.linear_fc1.bias'
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .encoder import TextEncoder, complete_blocks, token_inputs
from .family import CardWords, Detection, Folders, ModelInputs, PlanPolicy, count_blocks, shape_reader
from .names import BlockNames, Blocks
from .policy import Policy
from .qwen25vl import LAYER_CHECKS, layer_targets

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = [
    "QWEN3VL",
    "Qwen3VLFamily",
    "NAMES",
    "CLASS",
    "LAYER",
    "LAYER_QUANTIZED",
    "NO_GGUF",
    "NO_COMFYUI_TEXT",
    "DEEPSTACK",
    "TOWER_MARK",
]

CLASS = "Qwen3VLForConditionalGeneration"
_TEXT, _VISION = "model.language_model", "model.visual"
#: what ComfyUI tells a Qwen3-VL by (DeepStack's mergers: no other encoder has them), under the stored names
TOWER_MARK = f"{_VISION}.deepstack_merger_list."

# --- names -------------------------------------------------------------------------------------------------

#: a language-model layer's modules (Qwen3's: no biases, q and k RMS-normed per head)
LAYER = (
    *(f"self_attn.{p}_proj" for p in "qkvo"),
    "self_attn.q_norm",
    "self_attn.k_norm",
    *(f"mlp.{p}_proj" for p in ("gate", "up", "down")),
    "input_layernorm",
    "post_attention_layernorm",
)
_VISION_BLOCK = ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
_MERGER = ("norm", "linear_fc1", "linear_fc2")
_ROOT = (
    f"{_TEXT}.embed_tokens",
    f"{_TEXT}.norm",
    "lm_head",
    f"{_VISION}.patch_embed.proj",
    f"{_VISION}.pos_embed",
    *(f"{_VISION}.merger.{m}" for m in _MERGER),
)

#: the names Qwen3-VL's checkpoints store -> ComfyUI's: the same (its loader renames them itself)
NAMES = BlockNames(
    root_modules={m: m for m in _ROOT},
    root_tensors={},
    blocks=(
        Blocks(f"{_TEXT}.layers", f"{_TEXT}.layers", modules={m: m for m in LAYER}),
        Blocks(f"{_VISION}.blocks", f"{_VISION}.blocks", modules={m: m for m in _VISION_BLOCK}),
        Blocks(TOWER_MARK[:-1], TOWER_MARK[:-1], modules={m: m for m in _MERGER}),
    ),
)

#: why no GGUF (`PlanPolicy.no_gguf_why`), for the whole model and its text model alone
NO_GGUF = (
    "ComfyUI-GGUF's CLIP loader maps a qwen3vl file's language model back alone (no mmproj file for it), which "
    "ComfyUI then tells as Qwen3-8B or -4B (comfy/sd.py detect_te_model: Flux 2 Klein's or Z-Image's encoder, rope "
    "base 1e6 against Qwen3-VL's 5e6): no reader runs it as Qwen3-VL"
)
#: why ComfyUI reads no file of the text model alone (`qwen3vl_text`'s `PlanPolicy.unread_why`)
NO_COMFYUI_TEXT = (
    "ComfyUI's CLIPLoader tells a Qwen3-VL only by its vision tower's DeepStack mergers (comfy/sd.py "
    "detect_te_model); without them its language model is taken for Qwen3-8B or -4B, of another rope base (1e6 "
    "against 5e6)"
)

# --- a forward pass's inputs ---------------------------------------------------------------------------------

INPUTS = token_inputs(lambda config: config["text_config"]["vocab_size"], module=_TEXT, use_cache=False)

# --- config, from a release's tensor shapes ------------------------------------------------------------------

#: what Qwen3-VL's config.json says and the shapes do not (Qwen/Qwen3-VL-8B-Instruct's, as transformers 4.57 wrote
#: it: ``rope_scaling`` and ``rope_theta``)
_TEXT_DEFAULTS = {
    "model_type": "qwen3_vl_text",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 5_000_000,
    "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    "max_position_embeddings": 262_144,
    "attention_bias": False,
}
#: ComfyUI's fixed tower fields (``QWEN3VL_VISION_COMMON``: 16 heads, whatever the width), with the config's
_VISION_DEFAULTS = {
    "model_type": "qwen3_vl",
    "hidden_act": "gelu_pytorch_tanh",
    "num_heads": 16,
    "in_channels": 3,
}
#: the tower's depth -> its DeepStack layers, which its shapes do not say (ComfyUI's ``QWEN3VL_VISION``: the 4B's
#: 24 blocks, the 8B's and 32B's 27)
DEEPSTACK = {24: [5, 11, 17], 27: [8, 16, 24]}


def deepstack_layers(depth: int, mergers: int, where: Path) -> list[int]:
    """The tower's blocks whose features DeepStack's `mergers` add to the language model, for a tower `depth`
    blocks deep (`DEEPSTACK`); `InputError` naming the model where Qwen3-VL has no such tower."""
    known = DEEPSTACK.get(depth)
    if known is None or len(known) != mergers:
        raise InputError(
            f"{where}: a Qwen3-VL tower of {depth} blocks and {mergers} DeepStack mergers: which blocks feed them "
            f"(config deepstack_visual_indexes) is no shape's, and Qwen3-VL's known towers are "
            f"{', '.join(f'{d} blocks ({v})' for d, v in DEEPSTACK.items())}: give its config.json"
        )
    return list(known)


# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

#: the Linears `qwen25vl.layer_targets` quantizes of a Qwen3 layer, in words, after "every Linear of"
LAYER_QUANTIZED = (
    "(the attention's q, k, v, o projections, its q and k norms kept, and the gated MLP's gate, up and down "
    "projections)"
)
_KEPT = (
    "the token embedding and the output head (embed_tokens and lm_head: 151936 rows each, 0.62B parameters apiece "
    "in the 8B, lookup tables where a quantization error reaches every token; the head unused by an encoder), the "
    "vision tower, its merger and DeepStack mergers (0.58B in the 8B, run for image prompts only; its patch "
    "embedding a 3-D convolution, its MLP 4304 wide, which no 32-wide block divides) and every norm"
)

QWEN3VL_POLICY = Policy(
    what=f"Qwen3-VL text encoder ({CLASS}: Qwen-Image 2.1's) in transformers' layout (a pipeline's text_encoder/, "
    "or that folder itself, in the names Qwen/Qwen3-VL-8B-Instruct stores, which ComfyUI's file holds too)",
    components=("text_encoder",),
    targets=layer_targets(r"model\.language_model\.layers"),
    quantized=f"every Linear of the language model's layers {LAYER_QUANTIZED}",
    kept=_KEPT,
    checks=LAYER_CHECKS,
    copy_other_files=False,
)
QWEN3VL_SINGLE_POLICY = Policy(
    what="Qwen3-VL text encoder as one file given as SOURCE itself, in ComfyUI's names (Comfy-Org's "
    "qwen3vl_8b.safetensors: the names Qwen/Qwen3-VL-8B-Instruct stores; no config.json)",
    components=(".",),
    targets=QWEN3VL_POLICY.targets,
    quantized=QWEN3VL_POLICY.quantized,
    kept=_KEPT,
    checks=LAYER_CHECKS,
    copy_other_files=False,
    note=f"A transformers-layout output of it is written with {CLASS}'s config read off its shapes (what they do "
    "not say Qwen3-VL-8B's) as config.json.",
)


class Qwen3VLFamily(TextEncoder):
    name = "qwen3vl"
    title = "Qwen3-VL"
    names = NAMES
    detection = Detection(
        CLASS,
        diffusers_marks=(f"{_TEXT}.layers.0.",),
        # DeepStack's mergers: no other encoder here has them (Qwen2.5-VL's tower has the fused qkv too)
        own_marks=(TOWER_MARK,),
        library="transformers",
    )
    #: the 4B ties its head to the embedding; the 8B stores it (then kept as stored)
    tied_linears = {"lm_head": f"{_TEXT}.embed_tokens.weight"}
    folders = Folders(
        "qwen3vl",
        release="qwen3vl-single",
        release_why="Qwen3-VL, one file in ComfyUI's names (Comfy-Org's qwen3vl_8b*.safetensors)",
    )
    plan = PlanPolicy(root_stem="qwen3vl", no_gguf_why=NO_GGUF)
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the output head, the vision tower and its mergers, the norms and the layers the "
        "recipe keeps stay in their original precision.",
        kept_tensors="every norm and bias, the token embedding, the output head and the vision tower",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node "
        "(type `qwen_image`); ComfyUI bundles its tokenizer",
    )
    policies = {"qwen3vl": QWEN3VL_POLICY, "qwen3vl-single": QWEN3VL_SINGLE_POLICY}

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`Qwen3VLForConditionalGeneration`'s config for a file that has none, read off the tensor shapes; what
        they do not say is Qwen3-VL-8B's (its rope, the tower's 16 heads and, by its depth, its DeepStack
        layers). Every block must hold what block 0 holds, and a config's blocks must all be there
        (`encoder.complete_blocks`)."""
        if config:
            text, vision = config.get("text_config") or {}, config.get("vision_config") or {}
            counts = {
                f"{_TEXT}.layers": text.get("num_hidden_layers"),
                f"{_VISION}.blocks": vision.get("depth"),
                TOWER_MARK[:-1]: len(vision.get("deepstack_visual_indexes") or ()),
            }
            complete_blocks(self, tensors, where, {k: v for k, v in counts.items() if v})
            return dict(config)
        complete_blocks(self, tensors, where)

        shape = shape_reader(tensors, where, f"a {self.title} encoder")

        vocab, hidden = shape(f"{_TEXT}.embed_tokens.weight")
        head_dim = shape(f"{_TEXT}.layers.0.self_attn.q_norm.weight")[0]
        width, _, temporal, patch, _ = shape(f"{_VISION}.patch_embed.proj.weight")
        depth = count_blocks(tensors, f"{_VISION}.blocks.")
        merged = shape(f"{_VISION}.merger.linear_fc1.weight")[0]
        text = {
            **copy.deepcopy(_TEXT_DEFAULTS),
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": shape(f"{_TEXT}.layers.0.mlp.gate_proj.weight")[0],
            "num_hidden_layers": count_blocks(tensors, f"{_TEXT}.layers."),
            "num_attention_heads": shape(f"{_TEXT}.layers.0.self_attn.q_proj.weight")[0] // head_dim,
            "num_key_value_heads": shape(f"{_TEXT}.layers.0.self_attn.k_proj.weight")[0] // head_dim,
            "head_dim": head_dim,
        }
        vision = {
            **_VISION_DEFAULTS,
            "depth": depth,
            "hidden_size": width,
            "intermediate_size": shape(f"{_VISION}.blocks.0.mlp.linear_fc1.weight")[0],
            "out_hidden_size": shape(f"{_VISION}.merger.linear_fc2.weight")[0],
            "patch_size": patch,
            "temporal_patch_size": temporal,
            "spatial_merge_size": round((merged // width) ** 0.5),
            "num_position_embeddings": shape(f"{_VISION}.pos_embed.weight")[0],
            "deepstack_visual_indexes": deepstack_layers(depth, count_blocks(tensors, TOWER_MARK), where),
        }
        return {
            "architectures": [CLASS],
            "model_type": "qwen3_vl",
            "text_config": text,
            "vision_config": vision,
            "tie_word_embeddings": "lm_head.weight" not in tensors,
        }


QWEN3VL = Qwen3VLFamily()
