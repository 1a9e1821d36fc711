"""The block-scale layout cuBLAS's block-scaled GEMMs read, which ComfyUI's NVFP4 and MXFP8 files store (comfy-kitchen's
``to_blocked``; NVIDIA's "1D block scaling factors layout").

A scale matrix [rows, cols] (one scale per block of a weight row) is padded with zeros to whole tiles of 128 rows by 4
columns, and each tile is stored as 32 x 16: row ``32·i + j`` and column ``c`` of the tile go to row ``j``, column
``4·i + c``. Tiles follow one another row-tile first, so rows [128·k, 128·(k+1)) of the stored [padded rows, padded
columns] matrix are exactly the tiles of scale rows [128·k, 128·(k+1)): a weight encoded in row chunks of whole
tiles (`TILE_ROWS`) gives its stored scale rows chunk by chunk.
"""

from __future__ import annotations

import torch

__all__ = [
    "TILE_ROWS",
    "TILE_COLS",
    "blocked_shape",
    "padded_shape",
    "padded",
    "to_blocked",
    "from_blocked",
    "roundup",
]

TILE_ROWS = 128
TILE_COLS = 4


def roundup(n: int, m: int) -> int:
    return -(-n // m) * m


def padded_shape(rows: int, cols: int, block: int) -> tuple[int, int]:
    """A weight's shape padded to whole blocks of `block` in both dims, as comfy-kitchen's layouts pad it."""
    return roundup(rows, block), roundup(cols, block)


def padded(x: torch.Tensor, block: int) -> torch.Tensor:
    """2-D `x` with zeros appended to whole blocks of `block` in both dims (`x` itself where none are needed)."""
    rows, cols = padded_shape(*x.shape, block)
    if (rows, cols) == tuple(x.shape):
        return x
    return torch.nn.functional.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """The stored shape of a [rows, cols] scale matrix: padded to whole tiles."""
    return roundup(rows, TILE_ROWS), roundup(cols, TILE_COLS)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] scales in the tiled layout, [padded rows, padded cols] (padding zeros)."""
    rows, cols = scales.shape
    prows, pcols = blocked_shape(rows, cols)
    if (prows, pcols) != (rows, cols):
        scales = torch.nn.functional.pad(scales.view(torch.uint8), (0, pcols - cols, 0, prows - rows)).view(
            scales.dtype
        )
    tiles = scales.reshape(prows // TILE_ROWS, 4, 32, pcols // TILE_COLS, TILE_COLS)  # (k, i, j, t, c)
    return tiles.permute(0, 3, 2, 1, 4).reshape(prows, pcols)


def from_blocked(blocked: torch.Tensor, r0: int, r1: int, cols: int) -> torch.Tensor:
    """Scale rows [r0, r1) and columns [0, cols) of the tiled matrix `blocked` (only the tiles of those rows are
    rearranged)."""
    start, stop = r0 - r0 % TILE_ROWS, roundup(r1, TILE_ROWS)
    pcols = blocked.shape[1]
    tiles = blocked[start:stop].reshape(-1, pcols // TILE_COLS, 32, 4, TILE_COLS)  # (k, t, j, i, c)
    plain = tiles.permute(0, 3, 2, 1, 4).reshape(stop - start, pcols)
    return plain[r0 - start : r1 - start, :cols]
