"""Importing torchao quietly: on a CPU-only machine it logs harmless "Failed to load ... .so" warnings."""

from __future__ import annotations

import functools
from types import SimpleNamespace

from ._quiet import silenced

__all__ = ["torchao"]


@functools.cache
def torchao() -> SimpleNamespace:
    """The torchao objects the formats use, imported once with torchao's load warnings silenced."""
    with silenced("torchao", "torch.utils._pytree"):
        from torchao.core.config import config_to_dict
        from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            Float8Tensor,
            Int8DynamicActivationInt8WeightConfig,
            Int8Tensor,
            PerRow,
        )
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    return SimpleNamespace(
        config_to_dict=config_to_dict,
        JSONEncoder=TensorSubclassAttributeJSONEncoder,
        Float8DynamicActivationFloat8WeightConfig=Float8DynamicActivationFloat8WeightConfig,
        Float8Tensor=Float8Tensor,
        PerRow=PerRow,
        QuantizeTensorToFloat8Kwargs=QuantizeTensorToFloat8Kwargs,
        Int8DynamicActivationInt8WeightConfig=Int8DynamicActivationInt8WeightConfig,
        Int8Tensor=Int8Tensor,
        QuantizeTensorToInt8Kwargs=QuantizeTensorToInt8Kwargs,
    )
