"""Importing torchao quietly: on a CPU-only machine it logs harmless "Failed to load ... .so" warnings."""

from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

__all__ = ["torchao"]

_NOISY = ("torchao", "torch.utils._pytree")


@functools.cache
def torchao() -> SimpleNamespace:
    """The torchao objects the formats use, imported once with torchao's load warnings silenced."""
    levels = {name: logging.getLogger(name).level for name in _NOISY}
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from torchao.core.config import config_to_dict
        from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Float8Tensor, PerRow
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    return SimpleNamespace(
        config_to_dict=config_to_dict,
        JSONEncoder=TensorSubclassAttributeJSONEncoder,
        Float8DynamicActivationFloat8WeightConfig=Float8DynamicActivationFloat8WeightConfig,
        Float8Tensor=Float8Tensor,
        PerRow=PerRow,
        QuantizeTensorToFloat8Kwargs=QuantizeTensorToFloat8Kwargs,
    )
