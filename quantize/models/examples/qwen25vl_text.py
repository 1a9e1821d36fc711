"""Qwen2.5-VL text model's example checkpoint: a diffusers HunyuanVideo 1.5 pipeline's ``text_encoder/``
(transformers' `Qwen2_5_VLTextModel` folder: Qwen2.5-VL's language model alone, in the names the class holds and
saves, no tower, no head). ComfyUI bundles Qwen2.5's tokenizer: it holds none.
"""

from __future__ import annotations

from ..qwen25vl_text import QWEN25VL_TEXT as FAMILY
from .base import ExampleModel, Examples
from .qwen25vl import QWEN25VL_EXAMPLES, Qwen25VLShape, qwen25vl_config, qwen25vl_tensors

__all__ = ["QWEN25VL_TEXT_EXAMPLES", "qwen25vl_text_tensors", "qwen25vl_text_config"]

_LANGUAGE_MODEL = "model."


def qwen25vl_text_tensors(s: Qwen25VLShape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `Qwen2_5_VLTextModel`'s tensors: Qwen2.5-VL's ``model.`` ones without that prefix."""
    return [
        (n[len(_LANGUAGE_MODEL) :], shape)
        for n, shape in qwen25vl_tensors(s)
        if n.startswith(_LANGUAGE_MODEL)
    ]


def qwen25vl_text_config(s: Qwen25VLShape) -> dict:
    """config.json as diffusers' HunyuanVideo 1.5 repos hold it: Qwen2.5-VL-7B-Instruct's ``text_config``, under
    the text model's class, with the ``rope_scaling`` and ``rope_theta`` transformers 4 wrote."""
    text = dict(qwen25vl_config(s)["text_config"])
    return {"architectures": [FAMILY.diffusers_class], **text, "dtype": "bfloat16"}


class Qwen25VLTextExamples(Examples):
    family = FAMILY
    #: Qwen2.5-VL's: the text model is its language model
    presets = QWEN25VL_EXAMPLES.presets
    layouts = ("pipeline",)

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder/``."""
        s = self.shape(preset, layout)
        (vl,) = QWEN25VL_EXAMPLES.models(preset, layout)
        return [
            ExampleModel(
                "text_encoder", qwen25vl_text_tensors(s), qwen25vl_text_config(s), "model", init=vl.init
            )
        ]


QWEN25VL_TEXT_EXAMPLES = Qwen25VLTextExamples()
