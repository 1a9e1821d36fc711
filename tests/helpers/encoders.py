"""What the text-encoder tests share: each format converted once, and an encoder's last hidden state."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import run_cli


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


def comfyui_gguf_tokenizer(path: Path) -> bytes:
    """The ``spiece_model`` ComfyUI-GGUF's CLIP loader makes of a t5encoder GGUF file (loader.py,
    ``gguf_tokenizer_loader``): a ``ModelProto`` of ``tokenizer.ggml.tokens`` / ``scores`` / ``token_type``, the
    normalizer's ``add_space_prefix`` and ``remove_extra_whitespaces``, the eos and pad ids, byte fallback, as
    sentencepiece's own protobuf module serializes it."""
    import gguf
    from sentencepiece import sentencepiece_model_pb2 as model

    reader = gguf.GGUFReader(path)

    def field(key):
        return reader.fields[key].contents()

    assert field("tokenizer.ggml.model") == "t5"
    spm = model.ModelProto()
    spm.normalizer_spec.add_dummy_prefix = field("tokenizer.ggml.add_space_prefix")
    spm.normalizer_spec.remove_extra_whitespaces = field("tokenizer.ggml.remove_extra_whitespaces")
    tokens, scores = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.scores")
    for piece, score, type_ in zip(tokens, scores, field("tokenizer.ggml.token_type"), strict=True):
        spm.pieces.add(piece=piece, score=score, type=type_)
    spm.trainer_spec.byte_fallback = True
    spm.trainer_spec.vocab_size = len(tokens)
    spm.trainer_spec.max_sentence_length = 4096
    spm.trainer_spec.eos_id = field("tokenizer.ggml.eos_token_id")
    spm.trainer_spec.pad_id = field("tokenizer.ggml.padding_token_id")
    return spm.SerializeToString()
