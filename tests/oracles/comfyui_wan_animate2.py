"""ComfyUI's Wan-Animate-2, as siliconflow/ComfyUI at 187eda8e writes it (added in a464ac33, "Support Wan-Animate2"):

- ``comfy/model_detection.py``, ``detect_unet_config``'s 'Wan 2.1' branch: a file in Wan's I2V names is detected as
  ``model_type`` "i2v" (no tensor of Animate-2's tells it), then ``if metadata is not None and "config" in metadata:
  dit_config.update(json.loads(metadata["config"]).get("transformer", {}))``: the file's metadata names the type;
- ``comfy/supported_models.py``: ``WAN_Animate2.unet_config = {"image_model": "wan2.1", "model_type": "animate2"}``,
  ``WAN21_I2V``'s ``model_type`` "i2v"; ``comfy/ldm/wan/model_animate2.py``'s ``WanAnimate2Model`` is a ``WanModel``
  built as ``model_type='i2v'`` (the same tensors).

`comfyui_animate2_class` is the two together, on a state dict's names and shapes and the file's metadata.
"""

from __future__ import annotations

import json

from tests.oracles.comfyui_wan import comfyui_wan

#: supported_models.py: the Wan model classes by (image_model "wan2.1") model_type, for the types met here
CLASSES = {"animate2": "WAN_Animate2", "i2v": "WAN21_I2V", "t2v": "WAN21_T2V"}


def comfyui_animate2_class(state: dict, metadata: dict | None) -> tuple[str, dict]:
    """(ComfyUI's model class, its detected config) for a file of `state` (name -> shape) with `metadata`."""
    config = comfyui_wan(state)
    if metadata is not None and "config" in metadata:
        config.update(json.loads(metadata["config"]).get("transformer", {}))
    return CLASSES[config["model_type"]], config
