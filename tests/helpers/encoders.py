"""What the text-encoder tests share: each format converted once, an encoder's last hidden state, and ComfyUI-GGUF's
tokenizer rebuild (spelled in tests/oracles/comfyui_gguf.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import run_cli

# ComfyUI-GGUF's tokenizer rebuild, an upstream's copy (tests/oracles), for the tests that take it from here
from tests.oracles.comfyui_gguf import comfyui_gguf_tokenizer as comfyui_gguf_tokenizer


def convert_each(source: Path, root: Path, formats: list[str]) -> dict[str, Path]:
    """`quantize convert SOURCE ROOT/FMT --format FMT` for each format, which must succeed: format -> output."""
    for fmt in formats:
        run_cli("convert", source, root / fmt, "--format", fmt, check=True)
    return {fmt: root / fmt for fmt in formats}


def last_hidden_state(model, ids: torch.Tensor) -> torch.Tensor:
    """An encoder model's (``last_hidden_state``) output on token ids, in float32, without gradients."""
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state.float()


def resident_and_offloaded(cls, path: Path, run) -> tuple[object, object, object]:
    """`loaders.load_quantized(cls, path)` twice (float32), the second with its blocks streamed by
    `enable_block_offload` (to the CPU, from pageable memory): (`run` of the resident model, `run` of the offloaded
    one, the offloader), for a test to hold the two equal and count the blocks copied."""
    from loaders import enable_block_offload, load_quantized

    plain = load_quantized(cls, path, dtype=torch.float32)
    offloaded = load_quantized(cls, path, dtype=torch.float32)
    offloader = enable_block_offload(offloaded, device="cpu", host="pageable")
    return run(plain), run(offloaded), offloader


def language_model_hidden_state(model, ids: torch.Tensor) -> torch.Tensor:
    """A multimodal encoder's language model's last hidden state (Gemma 3's, Qwen2.5-VL's), through the model's own
    forward (compressed-tensors decompresses its weights on the first call of the whole model), in float32."""
    with torch.no_grad():
        return model(input_ids=ids, output_hidden_states=True).hidden_states[-1].float()
