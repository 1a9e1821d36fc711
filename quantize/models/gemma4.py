"""Gemma 4 12B unified (transformers' `Gemma4UnifiedForConditionalGeneration`; LTX-2.5's text encoder, which
diffusers' `LTX2Pipeline` holds as its ``text_encoder/`` and reads every hidden state of): everything the tool knows
of it.

Layouts (`GEMMA4.layouts`): ``gemma4``: a transformers folder, a pipeline's ``text_encoder/`` or such a folder
itself (config.json ``architectures: ["Gemma4UnifiedForConditionalGeneration"]``), in the names its checkpoints
store (what transformers' ``save_pretrained`` writes: ``model.language_model.layers.N``, the encoder-free vision
embedder as ``model.vision_embedder.`` and its projection as ``model.embed_vision.embedding_projection``, the audio
projection ``model.embed_audio.``); ``gemma4-single``: one safetensors file in ComfyUI's names, no config.json
(Comfy-Org's repackaged Gemma 4 12B), which holds its tokenizer as the tensor ``tokenizer_json``.

Names: ComfyUI's Gemma 4 12B (``comfy/text_encoders/gemma4.py`` `Gemma4_12B`, which CLIPLoader picks by
``model.layers.47.self_attn.q_norm.weight`` without ``model.layers.5.self_attn.v_proj.weight``: its global layers
have no v_proj) holds the language model as ``model.``, the vision embedder as ``vision_model.``, the two
projections as ``multi_modal_projector.`` and ``audio_projector.``; `NAMES` maps the stored names to those.
transformers' class holds the vision embedder under other names again (``model.embed_vision.``,
`CLASS_PREFIXES`, its loader's ``gemma4_unified`` renaming, which a test holds to transformers' own).

What is Gemma 4's own, and how it is kept: each layer's ``layer_scalar`` (a one-element buffer the checkpoints
store and ComfyUI loads) is carried as stored; the global layers (every sixth) have heads of their own size (512
in the 12B, 256 on the sliding ones) and one key head whose projection is the value's too (``attention_k_eq_v``:
no ``v_proj``); the config read off a release's shapes says so from each layer's ``q_norm`` and ``v_proj``.

The tokenizer (`Tokenizer`): ComfyUI builds Gemma 4's from the file's ``tokenizer_json`` tensor, the bytes of
tokenizers' ``tokenizer.json`` as they are (Gemma 4 ships no SentencePiece model: no ``spiece_model`` rebuild),
taken from the pipeline's ``tokenizer/`` (or the folder's own ``tokenizer.json``).

GGUF: refused at plan time: ComfyUI-GGUF's CLIP loader reads only the architectures of its TXT_ARCH_LIST, which
has no Gemma 4.

What stays high-precision, and why (the bundled recipes say it too): the token embedding (262144 x 3840 in the
12B: a lookup table, tied to the output head, 8% of the weights), the vision embedder and the two projections (3%
of the weights, run only for image and audio prompts, which LTX-2.5 does not give), the layer scalars and every
norm; every Linear of the 48 language-model layers is quantized.

>>> GEMMA4.native_name("model.language_model.layers.3.self_attn.q_proj.weight")
'model.layers.3.self_attn.q_proj.weight'
>>> GEMMA4.native_name("model.vision_embedder.patch_dense.weight")
'vision_model.patch_dense.weight'
>>> GEMMA4.class_name("model.embed_vision.embedding_projection.weight")
'model.embed_vision.multimodal_embedder.embedding_projection.weight'
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..read.files import config_class
from .encoder import TextEncoder, token_inputs
from .family import (
    CardWords,
    Carried,
    Detection,
    Folders,
    ModelInputs,
    PlanPolicy,
    SourceLayout,
    Tokenizer,
    count_blocks,
)
from .gemma3 import layer_targets
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "GEMMA4",
    "Gemma4Family",
    "NAMES",
    "CLASS",
    "CLASS_PREFIXES",
    "TOKENIZER_TENSOR",
    "LAYER",
    "LAYER_TENSORS",
    "LAYER_QUANTIZED",
    "LAYER_CHECKS",
    "TEXT_DEFAULTS",
    "text_config_from_shapes",
    "check_layers",
    "check_found",
]

CLASS = "Gemma4UnifiedForConditionalGeneration"
#: ComfyUI's key for Gemma 4's tokenizer in its file (comfy/sd.py: ``tokenizer_json``)
TOKENIZER_TENSOR = "tokenizer_json"

# --- names -------------------------------------------------------------------------------------------------

_TEXT = "model.language_model"
_VISION = "model.vision_embedder"
#: a language-model layer's modules (the same in both namings; a global layer of the 12B has no v_proj, a
#: KV-sharing layer of the smaller ones no k_proj, v_proj or k_norm); v_norm has no weight
LAYER = (
    *(f"self_attn.{p}_proj" for p in "qkvo"),
    "self_attn.q_norm",
    "self_attn.k_norm",
    *(f"mlp.{p}_proj" for p in ("gate", "up", "down")),
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
#: a layer's tensors that are no module's weight: the scalar its output is multiplied by (a stored buffer)
LAYER_TENSORS = {"layer_scalar": "layer_scalar"}
#: the encoder-free vision embedder's modules (LayerNorms and the patch Linear), as stored and in ComfyUI
_VISION_MODULES = ("patch_ln1", "patch_dense", "patch_ln2", "pos_norm")

#: the names Gemma 4 12B's checkpoints store -> ComfyUI's (``comfy/text_encoders/gemma4.py`` `Gemma4UnifiedBase`)
NAMES = BlockNames(
    root_modules={
        f"{_TEXT}.embed_tokens": "model.embed_tokens",
        f"{_TEXT}.norm": "model.norm",
        **{f"{_VISION}.{m}": f"vision_model.{m}" for m in _VISION_MODULES},
        "model.embed_vision.embedding_projection": "multi_modal_projector.embedding_projection",
        "model.embed_audio.embedding_projection": "audio_projector.embedding_projection",
    },
    root_tensors={
        f"{_VISION}.pos_embedding": "vision_model.pos_embedding",
        TOKENIZER_TENSOR: TOKENIZER_TENSOR,
    },
    blocks=(Blocks(f"{_TEXT}.layers", "model.layers", modules={m: m for m in LAYER}, tensors=LAYER_TENSORS),),
)

#: stored prefix -> the prefix transformers' class holds it under (its ``conversion_mapping`` for
#: ``gemma4_unified``: the vision embedder's modules one by one, its projection into ``multimodal_embedder.``), each
#: a whole module's, so that no stored prefix begins a class name it is not
CLASS_PREFIXES = (
    *((f"{_VISION}.{m}", f"model.embed_vision.{m}") for m in (*_VISION_MODULES, "pos_embedding")),
    (
        "model.embed_vision.embedding_projection.",
        "model.embed_vision.multimodal_embedder.embedding_projection.",
    ),
)

# --- what the bundled recipes quantize (`policy.Policy`; `recipes.derive` makes one per format) ---------------

LAYER_QUANTIZED = (
    "every Linear of the language model's layers (the attention's q, k, v, o projections, where a layer has them, "
    "and the gated MLP's gate, up and down projections)"
)
_KEPT = (
    "the token embedding (embed_tokens: a lookup table of every token's vector, tied to the output head, 8% of "
    "Gemma 4 12B's weights, where a quantization error reaches every token), the encoder-free vision embedder and "
    "the image and audio projections (3% of the weights, run only for image and audio prompts, which LTX-2.5 does "
    "not give), each layer's layer_scalar (one value its output is multiplied by) and every norm"
)
#: 4-bit weights compound through the layers: the output's floor (Comfy-Org's single file measures 11.9 dB in nf4
#: at the tiny preset, `benchmarks/family_forward.py`: a dB under Gemma 3's floor)
LAYER_CHECKS = {
    "nf4": {"min_forward_sqnr_db": 11},
    "comfy_nvfp4": {"min_forward_sqnr_db": 11},
    "comfy_w4a8": {"min_forward_sqnr_db": 11},
    "comfy_w4a4": {"min_forward_sqnr_db": 9},
}

GEMMA4_POLICY = Policy(
    what=f"Gemma 4 12B text encoder ({CLASS}, LTX-2.5's) in transformers' layout (a pipeline's text_encoder/, or "
    "that folder itself, in the names its checkpoints store)",
    components=("text_encoder",),
    targets=layer_targets(r"model\.language_model\.layers"),
    quantized=LAYER_QUANTIZED,
    kept=_KEPT,
    checks=LAYER_CHECKS,
    copy_other_files=False,
)
GEMMA4_SINGLE_POLICY = Policy(
    what="Gemma 4 12B text encoder as one file given as SOURCE itself, in ComfyUI's names with its tokenizer "
    "(Comfy-Org's, LTX-2.5's: model.layers.N, vision_model., tokenizer_json; no config.json)",
    components=(".",),
    targets=layer_targets(r"model\.layers"),
    quantized=LAYER_QUANTIZED,
    kept=_KEPT,
    checks=LAYER_CHECKS,
    copy_other_files=False,
    note=f"A transformers-layout output of it is written in the names the class holds (model.language_model., "
    f"model.embed_vision.) with {CLASS}'s config read off its shapes (what they do not say Gemma 4 12B's) as "
    "config.json, tokenizer_json (no part of the class) left out.",
)

# --- a forward pass's inputs: the language model, whose every hidden state LTX2Pipeline reads ---------------

INPUTS = token_inputs(
    lambda config: config["text_config"]["vocab_size"], module="model.language_model", use_cache=False
)

# --- config, from a release's tensor shapes ------------------------------------------------------------------

#: what Gemma 4 12B's text config says and the shapes do not (its rope for the sliding and the global layers, a
#: window of 1024, the 5:1 pattern ComfyUI fixes too)
TEXT_DEFAULTS = {
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "sliding_window": 1024,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1_000_000.0,
        },
    },
    "final_logit_softcapping": 30.0,
}
#: the vision embedder's patches: 16-pixel patches merged 3 x 3 (the 12B's; the shapes give their product)
_POOLING = 3


def text_config_from_shapes(shape, root: str, count: int, per_layer: Mapping[int, bool], where: Path) -> dict:
    """A Gemma 4 text config read off the shapes (`shape(stored name)`) of the language model under `root`
    (``model.language_model.``; the text model alone's: "") and its `count` layers: the widths, each layer's type
    (a global layer's q_norm is wider than a sliding one's: `layer_types`), the global layers' head size and key
    heads, and whether their value is their key (no v_proj: `per_layer[i]` says whether layer i has one); the
    rest `TEXT_DEFAULTS`."""
    layers = f"{root}layers"
    vocab, hidden = shape(f"{root}embed_tokens.weight")
    dims = [shape(f"{layers}.{i}.self_attn.q_norm.weight")[0] for i in range(count)]
    local, wide = min(dims), max(dims)
    types = [
        "full_attention" if d == wide and (wide != local or (i + 1) % 6 == 0) else "sliding_attention"
        for i, d in enumerate(dims)
    ]
    types[-1] = "full_attention"
    first_local = types.index("sliding_attention") if "sliding_attention" in types else 0
    first_global = types.index("full_attention")
    if wide != local and dims[first_global] != wide:
        raise InputError(
            f"{where}: layer {first_global} of {layers} is global but its heads are {local} wide"
        )
    kv = shape(f"{layers}.{first_local}.self_attn.k_proj.weight")[0] // local
    global_kv = shape(f"{layers}.{first_global}.self_attn.k_proj.weight")[0] // wide
    return {
        **copy.deepcopy(TEXT_DEFAULTS),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": shape(f"{layers}.0.mlp.gate_proj.weight")[0],
        "num_hidden_layers": count,
        "num_attention_heads": shape(f"{layers}.0.self_attn.q_proj.weight")[0] // dims[0],
        "num_key_value_heads": kv,
        "head_dim": local,
        "global_head_dim": wide,
        "num_global_key_value_heads": global_kv,
        "attention_k_eq_v": not per_layer[first_global],
        "layer_types": types,
    }


#: a layer's attention tensors only some layers have: a KV-sharing layer none, a global layer whose value is its
#: key no v_proj
_KV = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight")


def check_layers(tensors, root: str, text: Mapping | None, where: Path, title: str) -> None:
    """`InputError` in one line naming the first tensor a partial checkpoint lacks (a file cut or edited by
    hand), before anything is written: every layer under `root` (``model.language_model.``, ``model.``, "") holds
    what every other holds but the key and value parts, and those as its kind's: by the text config `text` where
    there is one (its layer count, `layer_types`, KV sharing and ``attention_k_eq_v``), else as the other layers of
    its head size hold them."""
    prefix = f"{root}layers."
    held: dict[int, set[str]] = {}
    for name in tensors:
        number, _, leaf = name.removeprefix(prefix).partition(".")
        if name.startswith(prefix) and number.isdigit():
            held.setdefault(int(number), set()).add(leaf)
    count = len(held) if not text else text.get("num_hidden_layers") or len(held)
    lacking = next((i for i in range(count) if i not in held), None)
    if lacking is not None:
        raise InputError(
            f"{where}: no tensor of {prefix}{lacking}: a partial {title} checkpoint ({count} layers)"
        )
    common = set().union(*held.values()) - set(_KV) if held else set()
    kinds: dict[object, set[str]] = {}  # a release's head size -> the key and value parts its layers hold

    def width(i: int) -> object:
        norm = tensors.get(f"{prefix}{i}.self_attn.q_norm.weight")
        return None if norm is None else tuple(norm.shape)

    # transformers' default where a config names none: 5 sliding layers to 1 global, the last global
    types = (text or {}).get("layer_types") or [(j + 1) % 6 == 0 or j == count - 1 for j in range(count)]
    for i in range(count):
        if text:
            wide = i < len(types) and types[i] in ("full_attention", True)
            shared = i >= count - (text.get("num_kv_shared_layers") or 0)
            kv = () if shared else _KV[::2] if wide and text.get("attention_k_eq_v") else _KV
            wanted = common | set(kv)
        else:  # a release: the layers of its head size hold the same key and value parts
            kinds.setdefault(width(i), set()).update(held[i] & set(_KV))
            wanted = common
        missing = sorted(wanted - held[i])
        if missing:
            raise InputError(
                f"{where}: no tensor {f'{prefix}{i}.{missing[0]}'!r}: a partial {title} checkpoint"
            )
    if not text:
        for i in range(count):
            missing = sorted(kinds[width(i)] - held[i])
            if missing:
                raise InputError(
                    f"{where}: no tensor {f'{prefix}{i}.{missing[0]}'!r}, which the other layers of its head "
                    f"size hold: a partial {title} checkpoint"
                )


def check_found(family: TextEncoder, found: list, open_, root: str) -> list:
    """The layouts `found` of `family` (`TextEncoder.layouts`), each of whose model's layers is whole
    (`check_layers`, under the class's names, `root`, or a release's ComfyUI ``model.``)."""
    if found:
        for rel in (family.folders.encoder, "."):
            comp = open_(rel)
            if comp is None:
                continue
            if config_class(comp.config) == family.diffusers_class:
                text = comp.config.get("text_config", comp.config)
                check_layers(comp.tensors, root, text, comp.dir, family.title)
            elif rel == "." and not comp.config and family.naming(comp.tensors) == "native":
                check_layers(comp.tensors, "model.", None, comp.dir, family.title)
    return found


class Gemma4Family(TextEncoder):
    name = "gemma4"
    title = "Gemma 4"
    names = NAMES
    detection = Detection(
        CLASS,
        native_marks=("model.layers.0.",),
        # as its checkpoints store it (the class's own names too: the language model's are the same)
        diffusers_marks=(f"{_TEXT}.layers.0.",),
        # every Gemma 4 layer's scalar (Gemma 3's and Qwen's layers have none)
        own_marks=tuple(f"{p}.layers.0.layer_scalar" for p in ("model", _TEXT)),
        # the other Gemma 4s' (E2B, E4B, 31B): per-layer embeddings, a SigLIP-like tower, an audio encoder
        foreign_marks=(
            "model.embed_tokens_per_layer.",
            f"{_TEXT}.embed_tokens_per_layer.",
            "vision_model.encoder.",
            "model.vision_tower.",
            "audio_model.",
            "model.audio_tower.",
        ),
        library="transformers",
    )
    class_prefixes = CLASS_PREFIXES
    tied_linears = {"lm_head": f"{_TEXT}.embed_tokens.weight"}
    folders = Folders(
        "gemma4",
        release="gemma4-single",
        release_why="Gemma 4 12B, one file in ComfyUI's names with its tokenizer (Comfy-Org's, LTX-2.5's encoder)",
    )
    plan = PlanPolicy(
        root_stem="gemma4",
        no_gguf_why=(
            "ComfyUI-GGUF's CLIP loader reads only the text architectures of its TXT_ARCH_LIST (t5, t5encoder, "
            "llama, qwen2vl, qwen3, qwen3vl), none of them Gemma 4"
        ),
        carried=Carried(tensors=(TOKENIZER_TENSOR,)),
        tokenizer=Tokenizer(
            tensor=TOKENIZER_TENSOR,
            files=("tokenizer.json", "../tokenizer/tokenizer.json"),
            gguf_model="gemma4",
            vocab_tensor=f"{_TEXT}.embed_tokens.weight",
            kind="json",
        ),
    )
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token embedding, the vision embedder and the projections, the layer scalars, the norms and the "
        "layers the recipe keeps stay in their original precision.",
        kept_tensors="every norm and layer scalar, the token embedding, the vision embedder and the image and "
        "audio projections",
        comfyui="put the file in `ComfyUI/models/text_encoders/` and load it with the stock **Load CLIP** node, "
        "type `ltxv` (or with the LTX-2.5 text projection in **DualCLIPLoader**; its tokenizer is in the file, as "
        "`tokenizer_json`)",
    )
    policies = {"gemma4": GEMMA4_POLICY, "gemma4-single": GEMMA4_SINGLE_POLICY}

    # --- recognizing it ------------------------------------------------------------------------------------

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """A text encoder's layouts (`TextEncoder.layouts`), of a model whose layers are whole (`check_found`)."""
        return check_found(self, super().layouts(folder, open_, registered), open_, f"{_TEXT}.")

    # --- running it ------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`Gemma4UnifiedForConditionalGeneration`'s config for a file that has none, read off the tensor shapes
        (either naming, `text_config_from_shapes`); what they do not say is Gemma 4 12B's (its rope, a window of
        1024, 16-pixel patches merged 3 x 3). Every layer must hold its tensors (`check_layers`)."""
        native = self.naming(tensors) == "native"
        check_layers(
            tensors, "model." if native else f"{_TEXT}.", (config or {}).get("text_config"), where, self.title
        )
        if config:
            return dict(config)

        def shape(stored: str) -> tuple[int, ...]:
            name = stored if stored in tensors else self.native_name(stored)
            if name not in tensors:
                raise InputError(
                    f"{where}: no tensor {stored!r} (ComfyUI's {name!r}): not a {self.title} encoder"
                )
            return tuple(tensors[name].shape)

        layers = f"{_TEXT}.layers"
        count = count_blocks(tensors, "model.layers." if native else f"{layers}.")
        v_proj = f"{'model.layers' if native else layers}.{{}}.self_attn.v_proj.weight"
        per_layer = {i: v_proj.format(i) in tensors for i in range(count)}
        text = text_config_from_shapes(shape, f"{_TEXT}.", count, per_layer, where)
        width, patch_dim = shape(f"{_VISION}.patch_dense.weight")
        merged = math.isqrt(patch_dim // 3)
        vision = {
            "patch_size": merged // _POOLING,
            "pooling_kernel_size": _POOLING,
            "mm_embed_dim": width,
            "mm_posemb_size": shape(f"{_VISION}.pos_embedding")[0],
            "output_proj_dims": shape("model.embed_vision.embedding_projection.weight")[1],
            "rms_norm_eps": 1e-6,
        }
        audio = {
            "audio_embed_dim": shape("model.embed_audio.embedding_projection.weight")[1],
            "rms_norm_eps": 1e-6,
        }
        return {
            "architectures": [CLASS],
            "model_type": "gemma4_unified",
            "text_config": {"model_type": "gemma4_unified_text", **text, "max_position_embeddings": 262_144},
            "vision_config": {"model_type": "gemma4_unified_vision", **vision},
            "audio_config": {"model_type": "gemma4_unified_audio", **audio},
        }


GEMMA4 = Gemma4Family()
