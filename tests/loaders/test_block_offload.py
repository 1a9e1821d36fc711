"""Block offload on the CPU: the same double-buffered logic as on a GPU, with synchronous copies.

An offloaded forward must equal the plain one exactly, copy each block once per step (a list of one or
two blocks stays resident), never allocate per step, and leave every block bound to its host tensors
between calls."""

from __future__ import annotations

import diffusers
import pytest
import torch

from loaders import enable_block_offload, find_block_lists, load_quantized
from tests.loaders.conftest import CASES, MODEL_FORMATS, MODELS, stored_tensors


def _load(converted, model: str, fmt: str, host: str = "mmap"):
    _, out = converted(model, fmt)
    return load_quantized(getattr(diffusers, MODELS[model][0]), out, host=host, dtype=torch.bfloat16)


def test_blocks_are_found_from_the_model():
    wan = diffusers.WanTransformer3DModel(
        num_layers=3, num_attention_heads=2, attention_head_dim=8, ffn_dim=32
    )
    assert [n for n, _ in find_block_lists(wan)] == ["blocks"]
    k5 = diffusers.Kandinsky5Transformer3DModel(
        num_text_blocks=1, num_visual_blocks=2, model_dim=32, ff_dim=64, axes_dims=(4, 6, 6)
    )
    assert [n for n, _ in find_block_lists(k5)] == ["text_transformer_blocks", "visual_transformer_blocks"]
    with pytest.raises(ValueError, match="'rope' is a WanRotaryPosEmbed, not an nn.ModuleList"):
        find_block_lists(wan, ["rope"])


@pytest.mark.parametrize("model, fmt", CASES)
def test_offloaded_forward_equals_the_plain_forward_exactly(converted, model, fmt):
    inputs = MODELS[model][2]
    plain = _load(converted, model, fmt)
    with torch.no_grad():
        want = [plain(**inputs(seed))[0] for seed in (0, 1)]
    offloaded = _load(converted, model, fmt)
    offloader = enable_block_offload(offloaded, device="cpu", host="pageable")
    with torch.no_grad():
        got = [offloaded(**inputs(seed))[0] for seed in (0, 1)]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    offloader.remove()
    with torch.no_grad():
        assert torch.equal(offloaded(**inputs(0))[0], want[0])


def _block_tensor_ptrs(block: torch.nn.Module) -> tuple[int, ...]:
    tensors = (t for m in block.modules() for t in (*m._parameters.values(), *m._buffers.values()))
    return tuple(t.data_ptr() for t in tensors if t is not None)


def test_blocks_run_from_two_preallocated_slots_and_are_copied_once_per_step(converted):
    model = _load(converted, "wan", "fp8_channel")  # 3 blocks: prefetching has to wrap and reuse slots
    host_ptrs = [_block_tensor_ptrs(b) for b in model.blocks]
    offloader = enable_block_offload(model, device="cpu", host="pageable")
    slot_ptrs = {t.data_ptr() for t in offloader.slot_tensors()}
    seen: list[tuple[int, ...]] = []
    for block in model.blocks:  # runs after the offloader's pre-hook: sees what the block computes with
        block.register_forward_pre_hook(lambda m, a: seen.append(_block_tensor_ptrs(m)))
    inputs = MODELS["wan"][2]
    steps = 3
    with torch.no_grad():
        for step in range(steps):
            model(**inputs(step))

    assert len(seen) == 3 * steps and all(set(ptrs) <= slot_ptrs for ptrs in seen)
    assert len(set(seen)) == 2  # the two slots, nothing else
    assert {t.data_ptr() for t in offloader.slot_tensors()} == slot_ptrs
    assert [
        _block_tensor_ptrs(b) for b in model.blocks
    ] == host_ptrs  # between calls: bound to the host copies
    # step 1: block 0 fetched, then each block prefetches the next (wrapping to block 0): 1 + 3; then 3 per step
    assert offloader.stats.block_copies == 1 + 3 * steps
    block_bytes = sum(t.numel() * t.element_size() for t in offloader.slot_tensors()) // 2
    assert offloader.stats.bytes_copied == offloader.stats.block_copies * block_bytes


def test_a_list_of_one_or_two_blocks_stays_resident(converted):
    model = _load(converted, "kandinsky5", "torchao_fp8")
    offloader = enable_block_offload(model, device="cpu", host="pageable")
    inputs = MODELS["kandinsky5"][2]
    with torch.no_grad():
        model(**inputs(0))
        first = offloader.stats.block_copies
        model(**inputs(1))
    # 1 text block + 3 visual blocks: the text block is copied once ever; of the visual ones, the middle block
    # stays in its slot across steps (the slot evicted is always the one whose block is needed last)
    assert first == 1 + 3 and offloader.stats.block_copies == first + 2


def test_everything_outside_the_blocks_is_on_the_device_and_blocks_on_the_host(converted):
    model = _load(converted, "wan", "nf4")
    enable_block_offload(model, device="meta", host="pageable")
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        assert t.device.type == ("cpu" if name.startswith("blocks.") else "meta"), name


def test_a_block_that_raises_is_unbound_and_the_next_forward_is_exact(converted):
    model = _load(converted, "wan", "fp8_channel")
    plain = _load(converted, "wan", "fp8_channel")
    enable_block_offload(model, device="cpu", host="pageable")
    host_ptrs = [_block_tensor_ptrs(b) for b in model.blocks]

    def fail_once(module, args):
        handle.remove()
        raise RuntimeError("boom inside block 1")

    handle = model.blocks[1].attn1.register_forward_pre_hook(fail_once)
    inputs = MODELS["wan"][2]
    with torch.no_grad(), pytest.raises(RuntimeError, match="boom inside block 1"):
        model(**inputs(0))
    assert [_block_tensor_ptrs(b) for b in model.blocks] == host_ptrs  # nothing left bound to a slot
    with torch.no_grad():
        assert torch.equal(model(**inputs(0))[0], plain(**inputs(0))[0])


def test_offload_arguments_are_checked(converted):
    model = _load(converted, "wan", "fp8_channel")
    with pytest.raises(ValueError, match="host must be one of 'pageable', 'pinned'"):
        enable_block_offload(model, device="cpu", host="mmap")
    enable_block_offload(model, device="cpu", host="pageable")
    with pytest.raises(ValueError, match="already enabled"):
        enable_block_offload(model, device="cpu", host="pageable")
    with pytest.raises(ValueError, match="Linear has no ModuleList of transformer blocks"):
        enable_block_offload(torch.nn.Linear(4, 4), device="cpu", host="pageable")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="host='pinned' needs CUDA"):
            enable_block_offload(_load(converted, "wan", "nf4"), device="cpu", host="pinned")


cuda = pytest.mark.gpu  # skipped without a CUDA device (tests/conftest.py)


@cuda
@pytest.mark.parametrize("host", ["pinned", "pageable"])
@pytest.mark.parametrize("fmt", MODEL_FORMATS["wan"])
def test_gpu_offload_equals_the_model_on_the_gpu_and_allocates_nothing_per_step(converted, fmt, host):
    inputs = MODELS["wan"][2]

    def on_gpu(seed):
        return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs(seed).items()}

    whole = _load(converted, "wan", fmt).to("cuda")
    with torch.no_grad():
        want = [whole(**on_gpu(s))[0] for s in range(3)]
    del whole
    model = _load(converted, "wan", fmt)
    offloader = enable_block_offload(model, device="cuda", host=host)
    assert all(t.is_pinned() for b in model.blocks for t in b.state_dict().values()) == (host == "pinned")
    with torch.no_grad():
        got = [model(**on_gpu(0))[0]]
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        got += [model(**on_gpu(s))[0] for s in (1, 2)]
        torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= allocated + sum(g.numel() * g.element_size() for g in got[1:]) + (
        1 << 20
    )
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    offloader.remove()


@pytest.fixture
def fake_pinning(monkeypatch):
    """The pinned code paths on a machine without CUDA: CUDA reported present, page-locking a no-op."""
    import loaders.host
    from loaders import bnb

    bnb.bitsandbytes()  # imported before CUDA is faked: it probes CUDA at import
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loaders.host, "_register", lambda buf: None)


@pytest.mark.parametrize("fmt", ["fp8_channel", "nf4", "comfy_fp8", "comfy_int8", "gguf"])
def test_pinned_loading_and_pinned_homing_of_a_mapped_model(converted, fake_pinning, monkeypatch, fmt):
    import loaders.offload

    out = converted("wan", fmt)[1]
    # stored dtypes: nothing cast, so every block tensor of the mapped model stays mapped. A GGUF file keeps its
    # Linear weights outside the blocks in BF16 and every other float tensor in F32: as stored the model runs in
    # no dtype, so it is loaded in float32 (its blocks hold only blocks of bytes and F32: nothing there is cast)
    dtype = torch.float32 if fmt == "gguf" else None

    def load(host):
        return load_quantized(diffusers.WanTransformer3DModel, out, host=host, dtype=dtype)

    plain, pinned = load("pageable"), load("pinned")
    # one exactly sized buffer per loading group: the layers outside the blocks, then each block
    assert len(pinned.__dict__["_pinned_host_buffers"]) == 1 + len(pinned.blocks)

    mapped = load("mmap")
    reread = []
    real_reread = loaders.offload.reread
    monkeypatch.setattr(
        loaders.offload, "reread", lambda info, out: reread.append(info.name) or real_reread(info, out)
    )
    enable_block_offload(mapped, device="cpu", host="pinned")
    from_file = {k for k in stored_tensors(out) if k.startswith("blocks.")}  # the checkpoint's names
    assert sorted(reread) == sorted(
        from_file
    )  # every block tensor that was mapped is re-read with pread, none copied out
    assert len(mapped.__dict__["_pinned_host_buffers"]) == len(mapped.blocks)
    x = {
        k: v.to(dtype) if dtype is not None and isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in MODELS["wan"][2](0).items()
    }
    with torch.no_grad():
        want = plain(**x)[0]
        assert torch.equal(pinned(**x)[0], want) and torch.equal(mapped(**x)[0], want)
