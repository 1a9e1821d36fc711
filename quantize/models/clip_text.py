"""CLIP's text tower (transformers' `CLIPTextModel`: CLIP ViT-L/14's, the ``text_encoder_2/`` of diffusers' Kandinsky
5 and HunyuanVideo pipelines, whose pooled output they read): everything the tool knows of it.

Layouts (`CLIP_TEXT.layouts`): ``clip-text``: a pipeline's ``text_encoder_2/`` or such a folder itself (config.json
``architectures: ["CLIPTextModel"]``); ``clip-text-single``: one safetensors file in the same names, no config.json
(Comfy-Org's ``clip_l.safetensors``, which holds the ``text_projection`` of CLIP's joint space beside the tower:
carried as stored, no part of the class).

Names: transformers' own, which ComfyUI's CLIP (``comfy/clip_model.py``) holds too; `NAMES` maps each to itself, a
table all the same, so a tensor it does not list is refused.

Formats: transformers' (`from_pretrained`, our loader) alone. ComfyUI's are refused at plan time
(`PlanPolicy.unread_by`): its CLIP-L loaders (Load CLIP; DualCLIPLoader's ``kandinsky5`` and ``hunyuan_video``
types) build the tower with plain cast ops and take no quantization from the file, so a quantized weight would be
read without its scale. GGUF too: ComfyUI-GGUF's CLIP loader reads only the text architectures of its
``TXT_ARCH_LIST``, and CLIP is not one.

What stays high-precision, and why (the bundled recipes say it too): the token and position embeddings (lookup
tables), the layer norms and the final norm (its output is what a pipeline reads), the projection; every Linear of
the encoder layers is quantized, their biases kept.

>>> CLIP_TEXT.native_name("text_model.encoder.layers.3.mlp.fc1.bias")
'text_model.encoder.layers.3.mlp.fc1.bias'
>>> CLIP_TEXT.carried("text_projection.weight"), CLIP_TEXT.carried("text_model.final_layer_norm.weight")
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from .encoder import TextEncoder, token_inputs
from .family import (
    CardWords,
    Carried,
    Detection,
    Folders,
    ModelInputs,
    PlanPolicy,
    count_blocks,
)
from .names import BlockNames, Blocks
from .policy import Policy

if TYPE_CHECKING:
    from ..read.checkpoint import TensorInfo

__all__ = [
    "CLIP_TEXT",
    "CLIPTower",
    "TOWER",
    "CLIPTextFamily",
    "NAMES",
    "CLASS",
    "LAYER_MODULES",
    "NO_COMFY_QUANT",
    "NO_GGUF_CLIP",
    "quick_gelu",
    "tensor_shape",
]

CLASS = "CLIPTextModel"

#: an encoder layer's modules, CLIP's text and vision towers alike (transformers' `CLIPEncoderLayer`)
LAYER_MODULES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "layer_norm1",
    "mlp.fc1",
    "mlp.fc2",
    "layer_norm2",
)
#: why ComfyUI's formats are refused for a CLIP tower (`PlanPolicy.unread_why`), after the loader's name
NO_COMFY_QUANT = (
    "builds the tower with plain cast ops (comfy.ops.manual_cast) and takes no quantization from the file, so a "
    "quantized weight would be read without its scale"
)
#: why a CLIP tower has no GGUF (`PlanPolicy.no_gguf_why`)
NO_GGUF_CLIP = (
    "ComfyUI-GGUF's CLIP loaders read the text architectures of its TXT_ARCH_LIST (t5, t5encoder, llama, qwen2vl, "
    "qwen3, qwen3vl) and a vision tower only as a Qwen2-VL's mmproj file, no CLIP"
)


@dataclass(frozen=True)
class CLIPTower:
    """One of CLIP's towers, as the parts both its families share are made of it: its stored prefix, its layout
    names, its pipeline folder and Comfy-Org's file, the projection beside it there, ComfyUI's loader of it."""

    prefix: str  # ``text_model``: the tower's stored prefix, which transformers 5's class holds at its root
    layout: str  # ``clip-text``; the single file's is ``clip-text-single``
    title: str
    cls: str  # transformers' class of it
    role: str  # what it is and what reads it, in words (the bundled recipes')
    kept: str  # what its bundled recipes keep and why, in words (`Policy.kept`)
    nf4_forward_sqnr_db: float  # the floor of an nf4 output's forward pass (4-bit weights compound)
    encoder: str  # its folder in a pipeline
    file: str  # Comfy-Org's file of it
    projection: str  # the projection of CLIP's joint space in that file, no part of the class
    loaders: str  # ComfyUI's loaders of it, in words
    root_modules: tuple[str, ...]  # its modules outside the layers, under `prefix`
    root_tensors: tuple[str, ...] = ()

    @property
    def names(self) -> BlockNames:
        """transformers' names -> ComfyUI's: the same (a table all the same: a tensor it does not list is
        refused)."""
        layers = f"{self.prefix}.encoder.layers"
        return BlockNames(
            root_modules={f"{self.prefix}.{m}": f"{self.prefix}.{m}" for m in self.root_modules},
            root_tensors={f"{self.prefix}.{t}": f"{self.prefix}.{t}" for t in self.root_tensors},
            blocks=(Blocks(layers, layers, modules={m: m for m in LAYER_MODULES}),),
        )

    @property
    def class_prefixes(self) -> tuple[tuple[str, str], ...]:
        """transformers 5's class holds the tower at its root (its loader strips the stored prefix): the names an
        output for it is written in."""
        return ((f"{self.prefix}.", ""),)

    @property
    def folders(self) -> Folders:
        return Folders(
            self.layout,
            release=f"{self.layout}-single",
            release_why=f"{self.title}, one file in ComfyUI's names (Comfy-Org's {self.file})",
            encoder=self.encoder,
        )

    @property
    def plan(self) -> PlanPolicy:
        """Transformers' formats alone (ComfyUI's read no quantization of it, ComfyUI-GGUF no CLIP); Comfy-Org's
        projection and a stored ``position_ids`` carried as stored."""
        return PlanPolicy(
            root_stem=self.layout.replace("-", "_"),
            no_gguf_why=NO_GGUF_CLIP,
            carried=Carried(
                tensors=(rf"{self.projection}\.weight", rf"{self.prefix}\.embeddings\.position_ids")
            ),
            unread_by=("comfyui",),
            unread_why=f"{self.loaders} {NO_COMFY_QUANT}",
        )

    @property
    def policies(self) -> dict[str, Policy]:
        """Its two layouts' bundled recipes (`Family.policies`): every Linear of the encoder layers, under the
        tower's prefix or without it (as transformers 5 saves them); the formats are transformers' alone."""
        layers = rf"({self.prefix}\.)?encoder\.layers\.\d+"
        common = dict(
            targets=(rf"{layers}\.self_attn\.(q|k|v|out)_proj", rf"{layers}\.mlp\.fc(1|2)"),
            quantized="every Linear of the encoder layers (the attention's q, k, v and out projections and the "
            "MLP's fc1 and fc2, their biases kept as they are)",
            kept=self.kept,
            checks={"nf4": {"min_forward_sqnr_db": self.nf4_forward_sqnr_db}},
            copy_other_files=False,
        )
        return {
            self.layout: Policy(
                what=f"{self.title} ({self.cls}: {self.role}) in transformers' layout (the pipeline, or that "
                "folder itself; its names as released, under the tower's prefix, or as transformers 5 saves them, "
                "without)",
                components=(self.encoder,),
                **common,
            ),
            f"{self.layout}-single": Policy(
                what=f"{self.title} as one file given as SOURCE itself, in ComfyUI's names (Comfy-Org's "
                f"{self.file}, transformers' own)",
                components=(".",),
                note=f"A transformers-layout output of it is model.safetensors in transformers' names with the "
                f"{self.cls} config.json read off its shapes (OpenAI's towers, text up to 768 wide and vision up to "
                "1024, with quick GELU, OpenCLIP's wider ones with GELU, as ComfyUI's configs), the "
                f"{self.projection} (no part of the class) kept beside the weights as it is.",
                **common,
            ),
        }

    def projection_dim(self, tensors: Mapping[str, TensorInfo], hidden: int) -> int:
        """The projection's width where a file holds it (Comfy-Org's), else the tower's."""
        name = f"{self.projection}.weight"
        return tensors[name].shape[0] if name in tensors else hidden


TOWER = CLIPTower(
    prefix="text_model",
    layout="clip-text",
    title="CLIP text model",
    cls=CLASS,
    role="CLIP ViT-L/14's text tower, a diffusers Kandinsky 5 or HunyuanVideo pipeline's text_encoder_2/, whose "
    "pooled output they read",
    kept="the token and position embeddings (lookup tables, where a quantization error reaches every token), the "
    "layer norms and the final norm (its output and the pooled end token are what a pipeline reads), and a file's "
    f"text_projection (CLIP's joint space, no part of {CLASS}, kept as stored)",
    nf4_forward_sqnr_db=12,
    encoder="text_encoder_2",
    file="clip_l.safetensors",
    projection="text_projection",
    loaders="ComfyUI's CLIP-L loaders (Load CLIP, DualCLIPLoader's kandinsky5 and hunyuan_video types)",
    root_modules=("embeddings.token_embedding", "embeddings.position_embedding", "final_layer_norm"),
)
_TOWER = TOWER.prefix
NAMES = TOWER.names

INPUTS = token_inputs(lambda config: config["vocab_size"])


def quick_gelu(width: int, widest: int) -> str:
    """The activation of a CLIP tower `width` wide, for a file with no config: OpenAI's towers (up to `widest`:
    text 768, vision 1024) use quick GELU, OpenCLIP's wider ones (H, g, bigG) GELU, as ComfyUI's configs
    (``sd1_clip_config.json``, ``clip_vision_config_*.json``) say."""
    return "quick_gelu" if width <= widest else "gelu"


def tensor_shape(tensors: Mapping[str, TensorInfo], name: str, where: Path, title: str) -> tuple[int, ...]:
    """The shape of tensor `name`, or `InputError` naming the file and the tensor it lacks."""
    if name not in tensors:
        raise InputError(f"{where}: no tensor {name!r}: not a {title}")
    return tuple(tensors[name].shape)


class CLIPTextFamily(TextEncoder):
    name = TOWER.layout
    title = TOWER.title
    names = NAMES
    detection = Detection(
        CLASS,
        # as its checkpoints store it (ComfyUI's too), or as transformers 5's class holds it (an output)
        diffusers_marks=(f"{_TOWER}.embeddings.token_embedding.", "embeddings.token_embedding."),
        # CLIP's whole model (its vision tower beside), and SigLIP's text tower (its head)
        foreign_marks=("vision_model.", f"{_TOWER}.head."),
        library="transformers",
    )
    class_prefixes = TOWER.class_prefixes
    folders = TOWER.folders
    plan = TOWER.plan
    card = CardWords(
        pipeline_tag=None,
        weights="text encoder",
        kept="The token and position embeddings, the norms, the projection and the layers the recipe keeps stay "
        "in their original precision.",
        kept_tensors="every norm and bias, the embeddings and the projection",
    )
    policies = TOWER.policies

    @property
    def inputs(self) -> ModelInputs:
        return INPUTS

    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """`CLIPTextModel`'s config (transformers' `CLIPTextConfig`) for a file that has none, read off the tensor
        shapes; what they do not say is CLIP's: 64-wide heads, the activation by width (`quick_gelu`), an epsilon
        of 1e-5, OpenAI's token ids (its config's legacy eos of 2: the pooled token is the highest id, the end
        token)."""
        if config:
            return dict(config)
        vocab, hidden = tensor_shape(
            tensors, f"{_TOWER}.embeddings.token_embedding.weight", where, self.title
        )
        positions, _ = tensor_shape(
            tensors, f"{_TOWER}.embeddings.position_embedding.weight", where, self.title
        )
        inner, _ = tensor_shape(tensors, f"{_TOWER}.encoder.layers.0.mlp.fc1.weight", where, self.title)
        return {
            "architectures": [CLASS],
            "model_type": "clip_text_model",
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": inner,
            "projection_dim": TOWER.projection_dim(tensors, hidden),
            "num_hidden_layers": count_blocks(tensors, f"{_TOWER}.encoder.layers."),
            "num_attention_heads": hidden // 64,
            "max_position_embeddings": positions,
            "hidden_act": quick_gelu(hidden, 768),
            "layer_norm_eps": 1e-5,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
        }


CLIP_TEXT = CLIPTextFamily()
