"""dit-quantize: offline conversion of video diffusion transformers to pre-quantized checkpoints.

>>> from quantize import convert
>>> # manifest = convert("Wan2.1-T2V-1.3B", "Wan2.1-T2V-1.3B-fp8", "wan-fp8.yaml")
"""

__version__ = "0.1.0"

from .convert import convert  # noqa: E402
from .plan import make_plan  # noqa: E402
from .recipes import load_recipe  # noqa: E402

__all__ = ["__version__", "convert", "make_plan", "load_recipe"]
