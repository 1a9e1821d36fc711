"""Every family's example checkpoints (`quantize example`), one module each beside the family's own, registered
here: `EXAMPLES` by family name, `examples_of`. A family module knows nothing of its examples; they import it.

Imported on first use (`quantize example`, tests, benchmarks), never by the converter.
"""

from __future__ import annotations

from ...errors import InputError
from ..family import Family
from .base import ExampleModel, Examples, LoraTensor, diffusers_example, linear
from .clip_text import CLIP_TEXT_EXAMPLES
from .clip_vision import CLIP_VISION_EXAMPLES
from .gemma3 import GEMMA3_EXAMPLES
from .gemma3_text import GEMMA3_TEXT_EXAMPLES
from .gemma4 import GEMMA4_EXAMPLES
from .gemma4_text import GEMMA4_TEXT_EXAMPLES
from .hunyuanvideo15 import HUNYUANVIDEO15_EXAMPLES
from .kandinsky5 import KANDINSKY5_EXAMPLES
from .kandinsky6 import KANDINSKY6_EXAMPLES
from .ltx2 import LTX2_EXAMPLES
from .minimax_h3 import MINIMAX_H3_EXAMPLES
from .qwen3vl import QWEN3VL_EXAMPLES
from .qwen3vl_text import QWEN3VL_TEXT_EXAMPLES
from .qwen25vl import QWEN25VL_EXAMPLES
from .qwen25vl_text import QWEN25VL_TEXT_EXAMPLES
from .qwen_image import QWEN_IMAGE_21_EXAMPLES, QWEN_IMAGE_EXAMPLES
from .skyreels_v2 import SKYREELS_EXAMPLES
from .t5 import T5_EXAMPLES
from .umt5 import UMT5_EXAMPLES
from .wan import WAN_EXAMPLES
from .wan_animate import ANIMATE_EXAMPLES
from .wan_animate2 import ANIMATE2_EXAMPLES
from .wan_vace import VACE_EXAMPLES
from .wan_variants import CAMERA_EXAMPLES, DANCER_EXAMPLES, HUMO_EXAMPLES, S2V_EXAMPLES, SCAIL_EXAMPLES

__all__ = ["EXAMPLES", "examples_of", "ExampleModel", "Examples", "LoraTensor", "diffusers_example", "linear"]

#: family name -> its example checkpoints
EXAMPLES: dict[str, Examples] = {
    e.family.name: e
    for e in (
        VACE_EXAMPLES,
        SKYREELS_EXAMPLES,
        ANIMATE2_EXAMPLES,
        ANIMATE_EXAMPLES,
        S2V_EXAMPLES,
        HUMO_EXAMPLES,
        CAMERA_EXAMPLES,
        SCAIL_EXAMPLES,
        DANCER_EXAMPLES,
        WAN_EXAMPLES,
        KANDINSKY6_EXAMPLES,
        KANDINSKY5_EXAMPLES,
        LTX2_EXAMPLES,
        HUNYUANVIDEO15_EXAMPLES,
        MINIMAX_H3_EXAMPLES,
        QWEN_IMAGE_EXAMPLES,
        QWEN_IMAGE_21_EXAMPLES,
        UMT5_EXAMPLES,
        T5_EXAMPLES,
        GEMMA3_EXAMPLES,
        GEMMA3_TEXT_EXAMPLES,
        GEMMA4_EXAMPLES,
        GEMMA4_TEXT_EXAMPLES,
        QWEN25VL_EXAMPLES,
        QWEN25VL_TEXT_EXAMPLES,
        QWEN3VL_EXAMPLES,
        QWEN3VL_TEXT_EXAMPLES,
        CLIP_TEXT_EXAMPLES,
        CLIP_VISION_EXAMPLES,
    )
}


def examples_of(family: Family | str) -> Examples:
    """The example checkpoints of `family` (a `Family` or its registry name)."""
    name = family if isinstance(family, str) else family.name
    if name not in EXAMPLES:
        raise InputError(f"{name}: no example checkpoints (families with them: {', '.join(EXAMPLES)})")
    return EXAMPLES[name]
