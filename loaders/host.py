"""Where loaded tensors live on the host, and how they get there.

``mmap``: views into a private, read-only-in-practice memory map of each shard: nothing is read at
load time; pages come in when first used and can be dropped again by the kernel (they are the page
cache). ``pageable``: read with pread into ordinary memory. ``pinned``: read with pread straight into
page-locked memory, which the GPU can copy from asynchronously (it needs CUDA, and it is RAM the
kernel can never reclaim: pinning can double host use when the model is also in the page cache).
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantize import dtypes
from quantize.checkpoint import TensorInfo, read_into

__all__ = ["HOST_MODES", "TensorReader", "check_host", "remember_source", "to_host"]

HOST_MODES = ("mmap", "pageable", "pinned")


def check_host(host: str, *, allow_mmap: bool = True) -> None:
    modes = HOST_MODES if allow_mmap else HOST_MODES[1:]
    if host not in modes:
        raise ValueError(f"host must be one of {', '.join(map(repr, modes))}, got {host!r}")
    if host == "pinned" and not torch.cuda.is_available():
        raise ValueError(
            "host='pinned' needs CUDA (pinned memory is for fast copies to a GPU); use 'pageable'"
        )


class TensorReader:
    """Reads checkpoint tensors into the chosen host memory, or straight to `device`."""

    def __init__(self, host: str, device: torch.device | None = None):
        check_host(host)
        self.host, self.device = host, device
        self._maps: dict[Path, torch.Tensor] = {}

    def read(self, info: TensorInfo) -> torch.Tensor:
        t = self._host_tensor(info)
        if self.device is not None and t.device != self.device:
            t = t.to(self.device, non_blocking=self.host == "pinned")
        return t

    def _host_tensor(self, info: TensorInfo) -> torch.Tensor:
        if self.host == "pinned":
            dtype = dtypes.by_name(info.dtype).torch
            return read_into(info, torch.empty(info.shape, dtype=dtype, pin_memory=True))
        if self.host == "pageable":
            return _read_prefaulted(info)
        return self._mapped(info)

    def _mapped(self, info: TensorInfo) -> torch.Tensor:
        file = self._maps.get(info.file)
        if file is None:
            size = info.file.stat().st_size
            storage = torch.UntypedStorage.from_file(str(info.file), shared=False, nbytes=size)
            file = self._maps[info.file] = torch.empty(0, dtype=torch.uint8).set_(storage)
        dtype = dtypes.by_name(info.dtype).torch
        raw = file[info.start : info.end]
        if info.start % dtype.itemsize:  # safetensors writers align, but not every file is from one
            return _read_prefaulted(info)
        return raw.view(dtype).view(info.shape)


def _read_prefaulted(info: TensorInfo) -> torch.Tensor:
    """The tensor read into fresh memory that is zeroed first: faulting the pages in from user space and then
    reading is several times faster than letting the kernel fault them one by one inside the read
    (0.6 vs 3 GB/s measured on the benchmark machine)."""
    raw = torch.empty(info.nbytes, dtype=torch.uint8).zero_()
    read_into(info, raw.view(dtypes.by_name(info.dtype).torch).view(info.shape))
    return raw.view(dtypes.by_name(info.dtype).torch).view(info.shape)


def remember_source(module: torch.nn.Module, name: str, tensor: torch.Tensor, info: TensorInfo) -> None:
    """Note on `module` that its tensor `name` is a memory-mapped view of `info`, so it can later be re-read
    from the file instead of copied out of the mapping (which would fault every page into the process)."""
    module.__dict__.setdefault("_mapped_from", {})[name] = (info, tensor.data_ptr())


def to_host(module: torch.nn.Module, name: str, t: torch.Tensor, host: str) -> torch.Tensor:
    """Module tensor `name` (currently `t`) in host memory of the kind asked.

    pinned: a page-locked copy, read from the file with pread when `t` is still the memory-mapped view
    the loader put there; pageable: `t` itself when it is on the host (mapped or not), else a CPU copy.
    """
    if host == "pageable":
        return t if t.device.type == "cpu" else t.to("cpu")
    if t.is_pinned():
        return t
    info, ptr = module.__dict__.get("_mapped_from", {}).get(name, (None, None))
    if info is not None and t.device.type == "cpu" and t.data_ptr() == ptr:
        return read_into(info, torch.empty(info.shape, dtype=t.dtype, pin_memory=True))
    return t.to("cpu").pin_memory()
