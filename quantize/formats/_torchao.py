"""What torchao's formats share: importing torchao quietly (on a CPU-only machine it logs harmless "Failed to load
... .so" warnings), and how diffusers declares a torchao checkpoint (config.json and every shard's metadata)."""

from __future__ import annotations

import abc
import copy
import functools
import json
from types import SimpleNamespace

from . import format_info
from ._quiet import silenced
from .base import Format, MetadataEntry

__all__ = ["torchao", "TorchaoFormat"]


class TorchaoFormat(Format):
    """A torchao tensor subclass in torchao's safetensors layout; a subclass gives its config's and its weight's
    serialized forms, written without importing torchao (tests hold them equal to torchao's own encoders)."""

    @abc.abstractmethod
    def config_dict(self) -> dict:
        """torchao's ``config_to_dict`` of the config diffusers' `TorchAoConfig` holds."""

    @abc.abstractmethod
    def weight_json(self, in_features: int) -> str:
        """torchao's JSON for a quantized weight of `in_features` inputs (its tensor subclass's attributes)."""

    def quantization_config(self, kept_linears: list[str]) -> dict:
        """diffusers' ``TorchAoConfig(<the config>).to_dict()``."""
        return {
            "quant_method": format_info(self.NAME).quant_method,
            "quant_type": {"default": copy.deepcopy(self.config_dict())},
            "modules_to_not_convert": sorted(kept_linears) or None,
        }

    def checkpoint_metadata(self, tensors: list[MetadataEntry]) -> dict[str, str]:
        """Every shard's torchao metadata, the whole model's (diffusers' loader merges the shards'): per tensor
        torchao's JSON, and ``tensor_names``."""
        metadata = {}
        for name, shape, _ in tensors:
            metadata[name] = (
                self.weight_json(shape[1]) if shape is not None else json.dumps({"_type": "Tensor"})
            )
        metadata["tensor_names"] = json.dumps([name for name, _, _ in tensors])
        return metadata


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
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import (
            QuantizeTensorToFloat8Kwargs,
            _choose_quant_func_and_quantize_tensor,
        )
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    return SimpleNamespace(
        quantize_activation=_choose_quant_func_and_quantize_tensor,
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
