"""T5 encoder's example checkpoints: a pipeline's ``text_encoder_2/`` (transformers' `T5EncoderModel` folder, as
diffusers' HunyuanVideo 1.5 pipeline holds its byT5) and Comfy-Org's single file (the same names, no config.json).
ComfyUI bundles byT5's tokenizer: neither holds one.
"""

from __future__ import annotations

from ..t5 import CLASS, T5
from .base import ExampleModel, Examples
from .umt5 import UMT5Shape, umt5_config, umt5_init, umt5_tensors

__all__ = ["T5_EXAMPLES", "t5_tensors", "t5_config", "SINGLE_FILE_STEM"]

#: Comfy-Org's file name for HunyuanVideo 1.5's byT5 (split_files/text_encoders/byt5_small_glyphxl_fp16.safetensors)
SINGLE_FILE_STEM = "byt5_small_glyphxl_fp16"
_BIAS = "layer.0.SelfAttention.relative_attention_bias"


def t5_tensors(s: UMT5Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of `T5EncoderModel`'s state dict as transformers saves it: umT5's, the relative attention
    bias in block 0 alone."""
    return [(n, shape) for n, shape in umt5_tensors(s) if _BIAS not in n or n.startswith("encoder.block.0.")]


def t5_config(s: UMT5Shape) -> dict:
    """config.json as transformers writes a `T5EncoderModel`'s (byt5-small's fields: gated GELU; this shape's
    sizes)."""
    return {**umt5_config(s), "architectures": [CLASS], "model_type": "t5"}


class T5Examples(Examples):
    family = T5
    presets = {
        "tiny": UMT5Shape(d_model=256, d_ff=512, num_heads=4, d_kv=64, num_layers=2, vocab_size=512),
        # HunyuanVideo 1.5's byT5 (Glyph-SDXL-v2's byt5-small, its 1510 byte, color and font tokens): ComfyUI's
        # byt5_config_small_glyph.json, 0.22B parameters, 0.44 GB in bf16
        "byt5": UMT5Shape(d_model=1472, d_ff=3584, num_heads=6, d_kv=64, num_layers=12, vocab_size=1510),
    }
    layouts = ("pipeline", "single")

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        """``pipeline``: transformers' folder in ``text_encoder_2/``; ``single``: Comfy-Org's one file at the root,
        no config.json."""
        s = self.shape(preset, layout)
        if layout == "pipeline":
            return [
                ExampleModel("text_encoder_2", t5_tensors(s), t5_config(s), stem="model", init=umt5_init(s))
            ]
        return [ExampleModel(".", t5_tensors(s), None, SINGLE_FILE_STEM, init=umt5_init(s), one_file=True)]


T5_EXAMPLES = T5Examples()
