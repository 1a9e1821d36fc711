"""Hand-written copies of upstream code the tests hold our files against, where the upstream is not installed (ComfyUI
and ComfyUI-GGUF are not on PyPI; diffusers' conversion scripts ship outside its package): each module names the
files and the commit it spells, so that a change upstream can be diffed against it. Shared code, as tests/helpers
is: test modules import from here, never from each other (`tests/test_dependencies.py`).

- ComfyUI: siliconflow/ComfyUI at 187eda8e (``comfy/model_detection.py``, ``comfy/supported_models.py``, the
  models under ``comfy/ldm/`` and ``comfy/text_encoders/``);
- ComfyUI-GGUF: city96/ComfyUI-GGUF at e579b7e (``loader.py``);
- diffusers 0.42.1: the conversion scripts under ``scripts/`` (``single_file_utils``' own converters are installed
  and called as they are).
"""
