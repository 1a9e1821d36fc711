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
