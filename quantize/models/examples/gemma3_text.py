"""Gemma 3 text model's example checkpoints: transformers' `Gemma3TextModel` folder (Gemma 3's language model alone,
in the names the class holds and saves, no tower, no head) as a pipeline's ``text_encoder/`` with its
``tokenizer/tokenizer.model`` beside it, or bare, with its ``tokenizer.model`` inside (`Examples.files`).
"""

from __future__ import annotations

import json

from ..gemma3_text import GEMMA3_TEXT as FAMILY
from .base import ExampleModel, Examples
from .gemma3 import GEMMA3_EXAMPLES, Gemma3Shape, example_tokenizer, gemma3_config, gemma3_tensors

__all__ = ["GEMMA3_TEXT_EXAMPLES", "gemma3_text_tensors", "gemma3_text_config"]

_LANGUAGE_MODEL = "language_model.model."

#: Gemma's RMSNorms scale by 1 + weight (stored near 0), the final one included
_INIT = {r"norm\.weight$": (0.0, 0.1)}


def gemma3_text_tensors(s: Gemma3Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Gemma3TextModel`'s tensors: Gemma 3's stored ``language_model.model.`` ones without that
    prefix."""
    return [
        (n[len(_LANGUAGE_MODEL) :], shape) for n, shape in gemma3_tensors(s) if n.startswith(_LANGUAGE_MODEL)
    ]


def gemma3_text_config(s: Gemma3Shape) -> dict:
    """config.json of the text model alone: google/gemma-3-12b-it's ``text_config`` under the text model's class."""
    text = dict(gemma3_config(s)["text_config"])
    return {"architectures": [FAMILY.diffusers_class], **text, "dtype": "bfloat16"}


class Gemma3TextExamples(Examples):
    family = FAMILY
    #: Gemma 3's: the text model is its language model (the tower's sizes unused)
    presets = GEMMA3_EXAMPLES.presets
    layouts = ("pipeline", "bare")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/``; ``bare``: that folder itself."""
        s = self.shape(preset, layout)
        where = "text_encoder" if layout == "pipeline" else "."
        return [ExampleModel(where, gemma3_text_tensors(s), gemma3_text_config(s), stem="model", init=_INIT)]

    def files(self, layout: str) -> dict[str, str | bytes]:
        """The tokenizer, where the family looks for it: a pipeline's ``tokenizer/`` folder, or beside the model
        in a bare folder (``tokenizer.model`` and transformers' config of it)."""
        vocab = self.presets[self.default_preset].vocab_size
        config = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False}
        where = "tokenizer/" if layout == "pipeline" else ""
        return {
            f"{where}tokenizer.model": example_tokenizer(vocab),
            f"{where}tokenizer_config.json": json.dumps(config) + "\n",
        }


GEMMA3_TEXT_EXAMPLES = Gemma3TextExamples()
