"""Qwen3-VL text model's example checkpoint: a pipeline's ``text_encoder/`` (transformers' `Qwen3VLTextModel`
folder: Qwen3-VL's language model alone, in the names the class holds and saves, no tower, no head).
"""

from __future__ import annotations

from ..qwen3vl_text import QWEN3VL_TEXT as FAMILY
from .base import ExampleModel, Examples
from .qwen3vl import INIT, QWEN3VL_EXAMPLES, Qwen3VLShape, qwen3vl_config, qwen3vl_tensors

__all__ = ["QWEN3VL_TEXT_EXAMPLES", "qwen3vl_text_tensors", "qwen3vl_text_config"]

_LANGUAGE_MODEL = "model.language_model."


def qwen3vl_text_tensors(s: Qwen3VLShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Qwen3VLTextModel`'s tensors: Qwen3-VL's ``model.language_model.`` ones without that
    prefix."""
    return [
        (n[len(_LANGUAGE_MODEL) :], shape) for n, shape in qwen3vl_tensors(s) if n.startswith(_LANGUAGE_MODEL)
    ]


def qwen3vl_text_config(s: Qwen3VLShape) -> dict:
    """config.json as ``language_model.save_pretrained`` writes it: Qwen3-VL's ``text_config`` under the text
    model's class."""
    text = dict(qwen3vl_config(s)["text_config"])
    return {"architectures": [FAMILY.diffusers_class], **text, "dtype": "bfloat16"}


class Qwen3VLTextExamples(Examples):
    family = FAMILY
    #: Qwen3-VL's: the text model is its language model
    presets = QWEN3VL_EXAMPLES.presets
    layouts = ("pipeline",)

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/``."""
        s = self.shape(preset, layout)
        return [
            ExampleModel("text_encoder", qwen3vl_text_tensors(s), qwen3vl_text_config(s), "model", init=INIT)
        ]


QWEN3VL_TEXT_EXAMPLES = Qwen3VLTextExamples()
