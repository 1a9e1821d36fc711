"""Gemma 4 text model's example checkpoints: transformers' `Gemma4TextModel` folder (the language model of Gemma 4
E2B / E4B, with its per-layer embeddings and its last layers sharing earlier ones' keys and values, in the names the
class holds and saves: no towers, no head) as a pipeline's ``text_encoder/`` with its ``tokenizer/tokenizer.json``
beside it, or bare, with its ``tokenizer.json`` inside (`Examples.files`).
"""

from __future__ import annotations

from ..gemma4 import TEXT_DEFAULTS
from ..gemma4_text import GEMMA4_TEXT as FAMILY
from .base import ExampleModel, Examples
from .gemma4 import Gemma4Shape, init, language_model_tensors, text_config, tokenizer_files

__all__ = ["GEMMA4_TEXT_EXAMPLES", "gemma4_text_tensors", "gemma4_text_config"]


def gemma4_text_tensors(s: Gemma4Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Gemma4TextModel`'s tensors (Gemma 4's language model, no prefix)."""
    return language_model_tensors(s, "")


def gemma4_text_config(s: Gemma4Shape) -> dict:
    """config.json of the text model alone: Gemma 4's text config under the text model's class, its per-layer
    embeddings' widths (none: 0) and how many layers share keys and values."""
    return {
        "architectures": [FAMILY.diffusers_class],
        "model_type": "gemma4_text",
        **text_config(s),
        "final_logit_softcapping": TEXT_DEFAULTS["final_logit_softcapping"],
        "sliding_window": 512,
        "hidden_size_per_layer_input": s.per_layer,
        "vocab_size_per_layer_input": s.vocab_size,
        "num_kv_shared_layers": s.kv_shared,
        "max_position_embeddings": 131_072,
        "dtype": "bfloat16",
    }


class Gemma4TextExamples(Examples):
    family = FAMILY
    presets = {
        # two global layers (the sliding ones' heads are Gemma 4 12B's example's concern), per-layer embeddings of
        # 16, the last sharing the first's keys and values (no k_proj, v_proj, k_norm), as E2B's and E4B's last
        # layers do; two layers, as Gemma 3's tiny text model: 4-bit weights' error compounds through each
        "tiny": Gemma4Shape(64, 128, 2, 2, 1, 32, 64, 1, False, 512, per_layer=16, kv_shared=1, pattern=1),
        # what ComfyUI's Gemma 4 E4B fixes (42 layers: it tells E4B by them; heads of 256 and 512, per-layer
        # embeddings of 256, the last 18 layers sharing) at a small text width (its config takes that):
        # benchmarks/comfyui_encoders.py --family gemma4-text
        "comfyui": Gemma4Shape(256, 512, 42, 2, 1, 256, 512, 1, False, 512, per_layer=256, kv_shared=18),
        # Gemma 4 E4B's language model (ComfyUI's Gemma4Config): 42 layers, 2560 wide, per-layer embeddings of 256,
        # the last 18 layers sharing keys and values: 7.5B parameters (2.8B of them the per-layer table), 14.9 GB
        # in bf16
        "e4b": Gemma4Shape(2560, 10240, 42, 8, 2, 256, 512, 2, False, 262144, per_layer=256, kv_shared=18),
    }
    layouts = ("pipeline", "bare")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/``; ``bare``: that folder itself."""
        s = self.shape(preset, layout)
        where = "text_encoder" if layout == "pipeline" else "."
        return [
            ExampleModel(where, gemma4_text_tensors(s), gemma4_text_config(s), stem="model", init=init(s))
        ]

    def files(self, layout: str) -> dict[str, str | bytes]:
        """The tokenizer, where the family looks for it: a pipeline's ``tokenizer/`` folder, or beside the model
        in a bare folder (``tokenizer.json`` and transformers' config of it)."""
        vocab = self.presets[self.default_preset].vocab_size
        return tokenizer_files(vocab, "tokenizer/" if layout == "pipeline" else "")


GEMMA4_TEXT_EXAMPLES = Gemma4TextExamples()
