"""`gguf_file`: a component as one GGUF v3 file (``<component>.gguf``; ``diffusion_model.gguf`` at the root), and
its companion where its family has one (below), what ComfyUI-GGUF's loaders and diffusers' `from_single_file` read,
and config.json as for every format.

The file's key-values: ``general.architecture`` (the model family's, `models.family.PlanPolicy.gguf_architecture`),
``general.quantization_version`` (GGML's, 2), ``general.file_type`` (llama.cpp's file type of the file's most
used type, `_M` when a mix raises some tensors), and the source's metadata entries the family's runtimes read, under
their own keys as strings (`ComponentPlan.carried_metadata`: LTX-2's ``config``; ComfyUI-GGUF, since its PR #399,
hands every string key-value to ComfyUI as the file's metadata, from which ComfyUI builds LTX-2.3 and any
non-default width). Tensors in the source's order, each at its aligned offset; written streaming
(`gguf_file.GGUFWriter`), byte for byte what gguf-py's own `GGUFWriter` writes for the same tensors.
`--max-shard-size` does not apply.

A family with a companion file (`PlanPolicy.gguf_companion`: Qwen2.5-VL's vision tower as llama.cpp's ``mmproj``)
writes the tensors it holds into a second file beside the first, ``mmproj-<the first's name>``, with its own
architecture (``clip``), ``general.type`` and key-values; reading the folder back takes both as one component.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError
from ..formats import Format
from ..ggml_types import ggml_type
from ..models.family import GGUFCompanion
from ..plan import ComponentPlan, TensorPlan
from ..read.checkpoint import Component
from ..read.gguf import key_values_of, open_gguf_component, read_gguf
from ..read.spiece import PIECE_TYPES, Piece, SentencePieceModel, read_spiece_bytes
from ..read.tensor_source import TensorSource
from . import PlannedFile, WrittenFile, component_stem, config_with_quantization, source_config, write_config
from .gguf_io import GGUFArray, GGUFTensor, GGUFWriter, Value, header_bytes, written_size

__all__ = [
    "NAME",
    "file_name",
    "planned_files",
    "planned_size",
    "open_file",
    "finish",
    "component_config",
    "stored_metadata",
    "open_stored",
]

NAME = "gguf_file"
QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: the block layouts these types have had since 2023


def file_name(cp: ComponentPlan) -> str:
    """``high_noise_model.gguf``; ``diffusion_model.gguf`` at the root (a text encoder's: ``umt5.gguf``)."""
    return f"{component_stem(cp)}.gguf"


def _companion(cp: ComponentPlan) -> GGUFCompanion | None:
    return None if cp.family is None else cp.family.plan.gguf_companion


def planned_files(cp: ComponentPlan, fmt: Format, max_bytes: int) -> list[PlannedFile]:
    """One file holding every tensor, in source order; where the family has a companion file
    (`PlanPolicy.gguf_companion`: a vision tower's ``mmproj``), the tensors it holds go there instead, under
    ``<type>-<the model file's name>``."""
    companion = _companion(cp)
    if companion is None:
        return [PlannedFile(file_name(cp), tuple(cp.tensors))]
    theirs = tuple(tp for tp in cp.tensors if tp.output_name.startswith(companion.holds))
    ours = tuple(tp for tp in cp.tensors if not tp.output_name.startswith(companion.holds))
    if not theirs:  # a model without what the companion holds (a text model alone): one file
        return [PlannedFile(file_name(cp), ours)]
    return [PlannedFile(file_name(cp), ours), PlannedFile(f"{companion.type}-{file_name(cp)}", theirs)]


def _is_companion(file: PlannedFile, cp: ComponentPlan) -> bool:
    return _companion(cp) is not None and file.name != file_name(cp)


def file_type(tensors: tuple[TensorPlan, ...]) -> int:
    """llama.cpp's file type (`general.file_type`, from the GGML table) of the type holding the most quantized
    bytes; its `_M` file type if other types hold some. A file with nothing quantized (a kept vision tower's
    ``mmproj``): that of the dtype holding the most bytes of its 2-D weights (llama.cpp's ``MOSTLY_BF16``, say)."""
    by_type = Counter()
    for tp in tensors:
        if tp.quantize:
            by_type[tp.qtype] += tp.output_bytes
    if not by_type:
        for tp in tensors:
            if tp.is_linear_weight:
                by_type[tp.output().dtype] += tp.output_bytes
    (main, _), *others = by_type.most_common() or [("F32", 0)]
    row = ggml_type(main)
    return (row.file_type_mix or row.file_type) if others else row.file_type


def key_values(cp: ComponentPlan, file: PlannedFile) -> dict[str, Value]:
    """The key-values of `file`: the model's, or its companion's (`PlanPolicy.gguf_companion`)."""
    if _is_companion(file, cp):
        companion = _companion(cp)
        return {
            "general.architecture": companion.architecture,
            "general.type": companion.type,
            "general.quantization_version": QUANTIZATION_VERSION,
            "general.file_type": file_type(file.tensors),
            **_arrays(
                cp.family.gguf_companion_key_values(
                    (source_config(cp) or {}), cp.component.tensors, cp.component.where
                )
            ),
        }
    arch = None if cp.family is None else cp.family.plan.gguf_architecture
    if arch is None:
        if cp.family is None:
            raise InputError(
                f"{cp.component.dir}: a model of no known family has no GGUF architecture: GGUF files need one"
            )
        raise InputError(
            f"{cp.component.dir}: {cp.family.title} has no GGUF architecture ({cp.family.plan.no_gguf_why}): "
            "convert it to another format (quantize recipes --for lists them)"
        )
    return {
        "general.architecture": arch,
        "general.quantization_version": QUANTIZATION_VERSION,
        "general.file_type": file_type(file.tensors),
        **_arrays(cp.family.gguf_key_values((source_config(cp) or {}), cp.component.tensors)),
        **tokenizer_key_values(cp),
        **cp.carried_metadata(),
    }


def _arrays(values: dict) -> dict[str, Value]:
    """A family's key-values with each tuple an array, as gguf-py's `add_array` writes a list: of ints, int32
    (llama.cpp's ``rope.dimension_sections``); else float32 (``clip.vision.image_mean``)."""

    def array(v: tuple) -> GGUFArray:
        return GGUFArray("int32" if all(type(x) is int for x in v) else "float32", v)

    return {k: array(v) if isinstance(v, tuple) else v for k, v in values.items()}


@functools.lru_cache(maxsize=2)
def _spiece(tok: TensorSource) -> SentencePieceModel:
    """The tokenizer a uint8 tensor holds (parsed once: a file's size and layout ask for its key-values too)."""
    info = tok.info
    return read_spiece_bytes(bytes(tok.read_rows(0, info.shape[0]).numpy()), f"{info.file}: {info.name}")


#: llama.cpp's placeholder for a vocabulary row its tokenizer has no piece for (`_create_vocab_sentencepiece`)
_PAD_SCORE = -10000.0


def tokenizer_key_values(cp: ComponentPlan) -> dict[str, Value]:
    """A text encoder's SentencePiece tokenizer (`ComponentPlan.tokenizer`) as llama.cpp's converter writes it
    (``convert_hf_to_gguf.py``: `_create_vocab_sentencepiece` and `SpecialVocab`), what ComfyUI-GGUF's CLIP
    loader rebuilds the ``ModelProto`` from: the model kind, each piece, score and type, padded to the embedding's
    rows with ``[PAD<id>]`` pieces of score -10000 and type UNUSED, the normalizer's flags and character map, and
    the special ids the model has. Nothing where there is no tokenizer."""
    tok = cp.tokenizer
    if tok is None:
        return {}
    policy = cp.family.plan.tokenizer
    pieces = list((model := _spiece(tok)).pieces)
    vocab = cp.component.tensors[policy.vocab_tensor].shape[0]
    pieces += [Piece(f"[PAD{i}]", _PAD_SCORE, PIECE_TYPES["UNUSED"]) for i in range(len(pieces), vocab)]
    out: dict[str, Value] = {
        "tokenizer.ggml.model": policy.gguf_model,
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": GGUFArray("str", tuple(p.piece for p in pieces)),
        "tokenizer.ggml.scores": GGUFArray("float32", tuple(p.score for p in pieces)),
        "tokenizer.ggml.token_type": GGUFArray("int32", tuple(p.type for p in pieces)),
        "tokenizer.ggml.add_space_prefix": model.add_dummy_prefix,
        "tokenizer.ggml.remove_extra_whitespaces": model.remove_extra_whitespaces,
    }
    if model.precompiled_charsmap:
        out["tokenizer.ggml.precompiled_charsmap"] = GGUFArray("uint8", model.precompiled_charsmap)
    ids = (("bos", model.bos_id), ("eos", model.eos_id), ("unknown", model.unk_id), ("padding", model.pad_id))
    out.update({f"tokenizer.ggml.{what}_token_id": i for what, i in ids if i >= 0})
    return out


def stored_metadata(cp: ComponentPlan, fmt: Format, stored: Component) -> Iterator[tuple[str, bool, str]]:
    """Each file's header as written is the plan's, byte for byte (`gguf_io.header_bytes`): its key-values (the
    family's hyperparameters, the tokenizer, a companion's) and its tensor table. A difference names the first
    key-value that is not the plan's (the source's config or tokenizer changed since, or the file did), else the
    first byte that is not."""
    for file in planned_files(cp, fmt, 0):
        path = stored.dir / file.name
        expected, _ = header_bytes(key_values(cp, file), _tensors(file))
        try:
            with open(path, "rb") as f:
                have = f.read(len(expected))
        except OSError as e:
            yield "key-values", False, f"{path}: cannot read: {e.strerror or e}"
            continue
        same = have == expected
        yield "key-values", same, "" if same else f"{path}: {_difference(expected, have, path)}"


def _difference(expected: bytes, have: bytes, path: Path) -> str:
    """Where the header `have` of the file at `path` is not the header `expected`, in words: the first key-value
    that differs, else the first byte (a value's GGUF type, the order of the key-values, the tensor table)."""
    ours, theirs = key_values_of(expected, path), read_gguf(path)[0]
    for key in [*ours, *(k for k in theirs if k not in ours)]:
        if key not in theirs:
            return f"key-value {key!r} is missing"
        if key not in ours:
            return f"key-value {key!r} is not in the plan"
    for key in ours:
        if ours[key] != theirs[key]:
            return f"key-value {key!r} is not the plan's (the source's config or tokenizer changed?)"
    at = next((i for i, (a, b) in enumerate(zip(expected, have, strict=False)) if a != b), len(have))
    return (
        f"its header differs from the plan's at byte {at} (a value's type, the key-values' order or the "
        "tensor table)"
    )


def _tensors(file: PlannedFile) -> list[GGUFTensor]:
    return [GGUFTensor(s.name, s.dtype, s.shape) for tp in file.tensors for s in tp.outputs]


def planned_size(file: PlannedFile, cp: ComponentPlan, fmt: Format) -> int:
    """The bytes `file` takes on disk: header, key-values, tensor infos, the data and its alignment padding."""
    return written_size(key_values(cp, file), _tensors(file))


def open_file(path: Path, file: PlannedFile, cp: ComponentPlan, fmt: Format) -> GGUFWriter:
    return GGUFWriter(path, _tensors(file), key_values(cp, file))


def component_config(fmt: Format, config: dict | None, kept_linears: list[str]) -> dict:
    return config_with_quantization(fmt, config, kept_linears)


def finish(out_dir: Path, cp: ComponentPlan, fmt: Format, written: list[WrittenFile]) -> list[Path]:
    return [write_config(out_dir, cp, fmt)]


def open_stored(root: Path, rel: str) -> Component:
    """The component's GGUF file (the folder's one model file, with its companion) read back: its tensors (types,
    logical shapes, byte ranges) and config.json."""
    return open_gguf_component(root, rel)
