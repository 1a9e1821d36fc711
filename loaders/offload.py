"""Block offload: the transformer blocks live on the host and visit the device one at a time.

Everything outside the blocks moves to the device once. Each list of blocks of one structure gets two
preallocated device *slots*, each holding every tensor of one block. Running block i binds its
modules' tensors to the slot holding it (a swap of dict entries: no allocation, no copy); meanwhile
block i+1 (wrapping to the first block for the next step) is copied from the host into the other
slot on a side stream, which waits until the block that last used that slot has finished. After
block i the modules are bound back to their host tensors. A list of one or two blocks therefore
stays resident and is never copied again.

On CUDA the copies run on their own stream, ordered by events; from pinned memory they overlap with
compute, from pageable memory the driver stages them and the host waits. Elsewhere (the CPU, in
tests) the same logic runs with synchronous copies. Inference only: no gradients flow through slots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from .blocks import find_block_lists
from .host import check_host, host_buffer, mapped_source, reread
from .modules import QuantizedLinear, set_param

__all__ = ["enable_block_offload", "BlockOffloader", "OffloadStats"]

_ATTR = "_block_offloader"


def enable_block_offload(
    model: nn.Module,
    device: str | torch.device = "cuda",
    host: str = "pinned",
    blocks: list[str] | None = None,
) -> BlockOffloader:
    """Keep `model`'s transformer blocks in host memory (``"pinned"`` or ``"pageable"``) and stream them
    to `device` block by block, double-buffered; the rest of the model moves to `device`.

    blocks: the attribute paths of the ModuleLists of blocks (found from the model when None).
    Returns the offloader; ``.remove()`` undoes the hooks and leaves the blocks on the host.
    """
    if getattr(model, _ATTR, None) is not None:
        raise ValueError("block offload is already enabled on this model: call .remove() on it first")
    return BlockOffloader(model, device, host, blocks)


@dataclass
class OffloadStats:
    block_copies: int = 0  # blocks copied host -> device
    bytes_copied: int = 0
    copy_issue_seconds: float = 0.0  # host time spent issuing copies (all of it when copies are synchronous)


@dataclass(eq=False)
class _Binding:
    """One tensor of a block: which module entry it is, and its host tensor object."""

    module: nn.Module
    local: str
    is_param: bool
    host: torch.Tensor


@dataclass(eq=False)
class _Slot:
    tensors: list[torch.Tensor]  # device tensors, in the order of a block's bindings
    bound: list[torch.Tensor]  # what gets bound: Parameters wrapping `tensors` where the entry is a parameter
    resident: tuple[int, int] | None = None  # (list, block) whose values it holds or is receiving
    in_use_by: tuple[int, int] | None = None  # the block currently bound to it
    ready: object = None  # event: the copy into it is done
    free: object = None  # event: the block that used it is done


@dataclass(eq=False)
class _Pool:
    slots: list[_Slot] = field(default_factory=list)


class BlockOffloader:
    def __init__(self, model: nn.Module, device, host: str, blocks: list[str] | None):
        check_host(host, allow_mmap=False)
        self.model, self.host = model, host
        self.device = _resolve(torch.device(device))
        self.lists = find_block_lists(model, blocks)
        if not self.lists:
            raise ValueError(
                f"{type(model).__name__} has no ModuleList of transformer blocks: pass blocks=[...]"
            )
        self.stats = OffloadStats()
        self._streamed = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(self.device) if self._streamed else None
        self._move_rest()
        self._bindings: dict[tuple[int, int], list[_Binding]] = {}
        self._pool_of: dict[tuple[int, int], _Pool] = {}
        pools: dict[tuple, _Pool] = {}
        for li, (_, ml) in enumerate(self.lists):
            for bi, block in enumerate(ml):
                key = (li, bi)
                self._bindings[key] = self._home_block(block)  # one block at a time in flight on the host
                signature = tuple(
                    (b.local, b.is_param, tuple(b.host.shape), b.host.dtype) for b in self._bindings[key]
                )
                self._pool_of[key] = pools.setdefault(signature, _Pool())
        for key, pool in self._pool_of.items():
            if not pool.slots:
                pool.slots = [self._new_slot(self._bindings[key]) for _ in range(2)]
        self._order = list(self._bindings)  # the blocks in the order they run
        self._hooks = []
        for li, (_, ml) in enumerate(self.lists):
            for bi, block in enumerate(ml):
                self._hooks.append(block.register_forward_pre_hook(self._pre_hook((li, bi))))
                self._hooks.append(block.register_forward_hook(self._post_hook((li, bi)), always_call=True))
        model.__dict__[_ATTR] = self

    # -- set-up ---------------------------------------------------------------------------------------

    def _in_blocks(self, name: str) -> bool:
        return any(p == "" or name == p or name.startswith(p + ".") for p, _ in self.lists)

    def _move_rest(self) -> None:
        """Everything outside the blocks to the device, once."""
        for name, module in self.model.named_modules():
            if self._in_blocks(name):
                continue
            if isinstance(module, QuantizedLinear):
                module._apply(lambda t: t.to(self.device))
                continue
            for local, p in module._parameters.items():
                if p is not None:
                    set_param(module, local, p.data.to(self.device))
            for local, b in module._buffers.items():
                if b is not None:
                    module._buffers[local] = b.to(self.device)

    def _home_block(self, block: nn.Module) -> list[_Binding]:
        """Put each tensor of `block` in host memory of the chosen kind; the block's bindings.

        pageable: a tensor already on the host stays where it is (memory-mapped ones included).
        pinned: the block's tensors that are not pinned yet go into one exactly sized pinned buffer; those
        still memory-mapped from the checkpoint are re-read from the file, not copied out of the mapping.
        """
        entries = [
            (module, local, is_param, t)
            for module in block.modules()
            for is_param, tensors in ((True, module._parameters), (False, module._buffers))
            for local, t in tensors.items()
            if t is not None
        ]
        homes = [t.data if is_param else t for _, _, is_param, t in entries]
        if self.host == "pageable":
            homes = [t if t.device.type == "cpu" else t.to("cpu") for t in homes]
        else:
            moving = [i for i, t in enumerate(homes) if not (t.device.type == "cpu" and t.is_pinned())]
            specs = [(homes[i].dtype, tuple(homes[i].shape)) for i in moving]
            for i, pinned in zip(moving, host_buffer(specs, True, self.model), strict=True):
                module, local = entries[i][0], entries[i][1]
                source = mapped_source(module, local, homes[i])
                homes[i] = reread(source, pinned) if source is not None else pinned.copy_(homes[i])
        bindings = []
        for (module, local, is_param, _), home in zip(entries, homes, strict=True):
            if is_param:
                home = nn.Parameter(home, requires_grad=False)
            (module._parameters if is_param else module._buffers)[local] = home
            bindings.append(_Binding(module, local, is_param, home))
        return bindings

    def _new_slot(self, bindings: list[_Binding]) -> _Slot:
        tensors = [torch.empty_like(b.host, device=self.device) for b in bindings]
        if self._streamed:  # written on the copy stream: the allocator must not reuse them before it is done
            for t in tensors:
                t.record_stream(self._copy_stream)
        bound = [
            nn.Parameter(t, requires_grad=False) if b.is_param else t
            for b, t in zip(bindings, tensors, strict=True)
        ]
        slot = _Slot(tensors, bound)
        if self._streamed:
            slot.ready, slot.free = torch.cuda.Event(), torch.cuda.Event()
        return slot

    # -- per block ------------------------------------------------------------------------------------

    def _pre_hook(self, key):
        def hook(module, args):
            self._before(key)

        return hook

    def _post_hook(self, key):
        def hook(module, args, output):
            self._after(key)

        return hook

    def _before(self, key: tuple[int, int]) -> None:
        pool = self._pool_of[key]
        slot = next((s for s in pool.slots if s.resident == key), None)
        if slot is None:  # not prefetched: fetch it now, into a slot no block is using if there is one
            free = [s for s in pool.slots if s.in_use_by is None] or pool.slots  # all bound: a forward raised
            slot = max(free, key=lambda s: self._distance(key, s.resident))
            if slot.in_use_by is not None:
                self._unbind(slot)
            self._fetch(key, slot)
        if self._streamed:
            torch.cuda.current_stream(self.device).wait_event(slot.ready)
        self._bind(key, slot)
        self._prefetch(self._following(key), slot)

    def _prefetch(self, key: tuple[int, int], busy: _Slot) -> None:
        """Start copying block `key` into a free slot of its pool, unless it is there already."""
        pool = self._pool_of[key]
        if any(s.resident == key for s in pool.slots):
            return
        free = [s for s in pool.slots if s is not busy and s.in_use_by is None]
        if free:  # evict the block needed last (a slot that holds nothing, first)
            self._fetch(key, max(free, key=lambda s: self._distance(key, s.resident)))

    def _distance(self, start: tuple[int, int], key: tuple[int, int] | None) -> int:
        """How many blocks after `start` block `key` runs again (None: never)."""
        if key is None:
            return len(self._order)
        return (self._order.index(key) - self._order.index(start)) % len(self._order)

    def _after(self, key: tuple[int, int]) -> None:
        slot = next(s for s in self._pool_of[key].slots if s.in_use_by == key)
        self._unbind(slot)
        if self._streamed:
            slot.free.record(torch.cuda.current_stream(self.device))

    def _following(self, key: tuple[int, int]) -> tuple[int, int]:
        """The block that runs after `key`: the next of its list, or the first of the next list, wrapping."""
        li, bi = key
        if bi + 1 < len(self.lists[li][1]):
            return (li, bi + 1)
        return ((li + 1) % len(self.lists), 0)

    def _fetch(self, key: tuple[int, int], slot: _Slot) -> None:
        """Copy block `key` from the host into `slot` (on the copy stream, once the slot is free)."""
        started = time.perf_counter()
        bindings = self._bindings[key]
        if self._streamed:
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(slot.free)
                for b, dst in zip(bindings, slot.tensors, strict=True):
                    dst.copy_(b.host, non_blocking=True)
                slot.ready.record(self._copy_stream)
        else:
            with torch.no_grad():
                for b, dst in zip(bindings, slot.tensors, strict=True):
                    dst.copy_(b.host)
        slot.resident = key
        self.stats.block_copies += 1
        self.stats.bytes_copied += sum(t.numel() * t.element_size() for t in slot.tensors)
        self.stats.copy_issue_seconds += time.perf_counter() - started

    def _bind(self, key: tuple[int, int], slot: _Slot) -> None:
        for b, t in zip(self._bindings[key], slot.bound, strict=True):
            (b.module._parameters if b.is_param else b.module._buffers)[b.local] = t
        slot.in_use_by = key

    def _unbind(self, slot: _Slot) -> None:
        for b in self._bindings[slot.in_use_by]:
            (b.module._parameters if b.is_param else b.module._buffers)[b.local] = b.host
        slot.in_use_by = None

    # -- teardown -------------------------------------------------------------------------------------

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every preallocated device tensor (for checks that nothing else gets allocated)."""
        seen = {id(p): p for p in self._pool_of.values()}
        return [t for pool in seen.values() for s in pool.slots for t in s.tensors]

    def remove(self) -> None:
        """Remove the hooks; the blocks stay bound to their host tensors, the rest stays on the device."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for pool in {id(p): p for p in self._pool_of.values()}.values():
            for slot in pool.slots:
                if slot.in_use_by is not None:
                    self._unbind(slot)
        if self._streamed:
            torch.cuda.synchronize(self.device)
        self.model.__dict__.pop(_ATTR, None)


def _resolve(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
