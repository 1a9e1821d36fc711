"""ComfyUI-GGUF's reading of a text encoder's GGUF file, as city96/ComfyUI-GGUF at e579b7e writes it: ``loader.py``,
``gguf_tokenizer_loader``, which rebuilds a t5encoder's SentencePiece tokenizer (ComfyUI's ``spiece_model``) from the
file's ``tokenizer.ggml.*`` key-values (`comfyui_gguf_tokenizer`), spelled with sentencepiece's own protobuf
module."""

from __future__ import annotations

from pathlib import Path


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
