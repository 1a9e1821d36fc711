"""Where loaded tensors live on the host, and how they get there.

``mmap``: views into a private memory map of each shard: nothing is read at load time; pages come in
when first used and are reclaimable page cache. ``pageable``: read with pread into ordinary memory.
``pinned``: read with pread straight into page-locked memory, which a GPU copies from asynchronously.
Pinned memory is allocated one buffer per group of tensors (a block), sized exactly and pinned with
``cudaHostRegister``: torch's own pinned allocator rounds every allocation up to a power of two
(a 67.5 MiB weight would lock 128 MiB) and keeps what it pinned cached for the process's life.
Pinned memory needs CUDA, and it is RAM the kernel can never reclaim.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import torch

from quantize import dtypes
from quantize.read.checkpoint import TensorInfo, read_into

__all__ = [
    "HOST_MODES",
    "TensorReader",
    "check_host",
    "host_buffer",
    "remember_source",
    "mapped_source",
    "reread",
]

HOST_MODES = ("mmap", "pageable", "pinned")
_ALIGN = 64  # bytes: every view in a host buffer starts on a cache line


def check_host(host: str, *, allow_mmap: bool = True) -> None:
    modes = HOST_MODES if allow_mmap else HOST_MODES[1:]
    if host not in modes:
        raise ValueError(f"host must be one of {', '.join(map(repr, modes))}, got {host!r}")
    if host == "pinned" and not torch.cuda.is_available():
        raise ValueError(
            "host='pinned' needs CUDA (pinned memory is for fast copies to a GPU); use 'pageable'"
        )


def host_buffer(
    specs: list[tuple[torch.dtype, tuple[int, ...]]], pin: bool, owner: torch.nn.Module
) -> list[torch.Tensor]:
    """Empty host tensors of these dtypes and shapes, carved from one fresh buffer.

    With `pin` the buffer is page-locked at its exact size (``cudaHostRegister``) and unregistered when
    `owner` (which keeps it) is garbage-collected. The memory is zeroed first: faulting pages in from
    user space and then reading into them is several times faster than faults inside the read.
    """
    offsets, total = [], 0
    for dtype, shape in specs:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += math.prod(shape) * dtype.itemsize
    buf = torch.empty(max(total, 1), dtype=torch.uint8).zero_()
    if pin:
        _register(buf)
        owner.__dict__.setdefault("_pinned_host_buffers", []).append(buf)
    return [
        buf[o : o + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
        for o, (dtype, shape) in zip(offsets, specs, strict=True)
    ]


def _register(buf: torch.Tensor) -> None:
    cudart = torch.cuda.cudart()
    ptr = buf.data_ptr()
    torch.cuda.check_error(cudart.cudaHostRegister(ptr, buf.numel(), 0))
    weakref.finalize(buf, cudart.cudaHostUnregister, ptr)


class TensorReader:
    """Reads checkpoint tensors into the chosen host memory, or straight to `device`, a group at a time."""

    def __init__(self, host: str, device: torch.device | None = None):
        check_host(host)
        self.host, self.device = host, device
        self._maps: dict[Path, torch.Tensor] = {}

    def read_group(self, infos: list[TensorInfo], owner: torch.nn.Module) -> list[torch.Tensor]:
        """The tensors of `infos`; pinned ones share one buffer kept by `owner` (unless bound for `device`)."""
        if self.host == "pinned":
            specs = [(dtypes.by_name(i.dtype).torch, dtypes.held_shape(i.dtype, i.shape)) for i in infos]
            staged = [read_into(i, t) for i, t in zip(infos, host_buffer(specs, True, owner), strict=True)]
            if self.device is None:
                return staged
            moved = [t.to(self.device, non_blocking=True) for t in staged]
            torch.cuda.synchronize(self.device)  # the staging buffer goes when this returns
            return moved
        tensors = [self._mapped(i) if self.host == "mmap" else _read_prefaulted(i) for i in infos]
        if self.device is not None:
            tensors = [t.to(self.device) for t in tensors]
        return tensors

    def _mapped(self, info: TensorInfo) -> torch.Tensor:
        file = self._maps.get(info.file)
        if file is None:
            size = info.file.stat().st_size
            storage = torch.UntypedStorage.from_file(str(info.file), shared=False, nbytes=size)
            file = self._maps[info.file] = torch.empty(0, dtype=torch.uint8).set_(storage)
        dtype = dtypes.by_name(info.dtype).torch
        if info.start % dtype.itemsize:  # safetensors writers align, but not every file is from one
            return _read_prefaulted(info)
        return file[info.start : info.end].view(dtype).view(dtypes.held_shape(info.dtype, info.shape))


def _read_prefaulted(info: TensorInfo) -> torch.Tensor:
    """The tensor read into fresh memory that is zeroed first (0.6 vs 3 GB/s on the benchmark machine)."""
    (out,) = host_buffer(
        [(dtypes.by_name(info.dtype).torch, dtypes.held_shape(info.dtype, info.shape))], False, None
    )
    return read_into(info, out)


def remember_source(module: torch.nn.Module, attr: str, tensor: torch.Tensor, info: TensorInfo) -> None:
    """Note on `module` that its tensor `attr` is a memory-mapped view of `info`, so that it can later be
    re-read from the file instead of copied out of the mapping (which faults every page into the process)."""
    module.__dict__.setdefault("_mapped_from", {})[attr] = (info, tensor.data_ptr())


def reread(info: TensorInfo, out: torch.Tensor) -> torch.Tensor:
    """Read `info`'s stored bytes again into `out`: a contiguous host tensor of as many bytes, typed as stored or a
    quantized part's bytes (what `QuantizedLinear` holds)."""
    flat = out.reshape(-1).view(torch.uint8)
    read_into(
        info, flat.view(dtypes.by_name(info.dtype).torch).view(dtypes.held_shape(info.dtype, info.shape))
    )
    return out


def mapped_source(module: torch.nn.Module, attr: str, tensor: torch.Tensor) -> TensorInfo | None:
    """Where `tensor` (module's `attr`) was mapped from, if it is still that memory-mapped view."""
    info, ptr = module.__dict__.get("_mapped_from", {}).get(attr, (None, None))
    if info is not None and tensor.device.type == "cpu" and tensor.data_ptr() == ptr:
        return info
    return None
