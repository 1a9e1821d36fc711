"""Stacked tensors: one output tensor made of row ranges of several source tensors (a native fused projection
written from diffusers' separate ones), read, copied and cut back exactly; and the name tables that declare them."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from quantize.errors import InputError
from quantize.models import BlockNames, Blocks, Rows, stack_rows
from quantize.read.checkpoint import open_component
from quantize.read.tensor_source import StackedSource, TensorSource

#: a fused attention (q, k, v) and a gated projection stored with its halves swapped, as MiniMax-H3's fc1 is
NAMES = BlockNames(
    root_modules={"proj_out": "final.linear"},
    root_tensors={},
    blocks=(
        Blocks(
            "transformer_blocks",
            "blocks",
            modules={"attn.to_out.0": "attn.proj"},
            stacked={
                "attn.qkv": (Rows("attn.to_q"), Rows("attn.to_k"), Rows("attn.to_v")),
                "mlp.fc1": (Rows("ff.proj", 1, 2), Rows("ff.proj", 0, 2)),
            },
        ),
    ),
)


def test_the_table_says_what_each_stacked_tensor_is_made_of_both_ways():
    assert NAMES.native_stack("blocks.3.attn.qkv.weight") == (
        ("transformer_blocks.3.attn.to_q.weight", 0, 1),
        ("transformer_blocks.3.attn.to_k.weight", 0, 1),
        ("transformer_blocks.3.attn.to_v.weight", 0, 1),
    )
    assert NAMES.native_stack("blocks.0.mlp.fc1.bias") == (
        ("transformer_blocks.0.ff.proj.bias", 1, 2),
        ("transformer_blocks.0.ff.proj.bias", 0, 2),
    )
    assert NAMES.stacked_into("transformer_blocks.3.attn.to_k.bias") == "blocks.3.attn.qkv.bias"
    assert NAMES.stacked_into("transformer_blocks.0.ff.proj.weight") == "blocks.0.mlp.fc1.weight"
    # a stacked tensor has no one-to-one name, and the one-to-one ones are not stacks
    assert NAMES.native("transformer_blocks.3.attn.to_q.weight") is None
    assert NAMES.native_stack("blocks.3.attn.proj.weight") is None
    assert NAMES.stacked_into("transformer_blocks.3.attn.to_out.0.weight") is None


def test_stack_rows_gives_each_tensor_its_rows_in_its_own_order():
    assert stack_rows(NAMES.native_stack("blocks.0.attn.qkv.weight"), 12) == {
        "transformer_blocks.0.attn.to_q.weight": ((0, 4),),
        "transformer_blocks.0.attn.to_k.weight": ((4, 8),),
        "transformer_blocks.0.attn.to_v.weight": ((8, 12),),
    }
    # fc1 = [gate; value], diffusers' proj = [value; gate]: its first half is the stack's second
    assert stack_rows(NAMES.native_stack("blocks.0.mlp.fc1.weight"), 8) == {
        "transformer_blocks.0.ff.proj.weight": ((4, 8), (0, 4))
    }
    with pytest.raises(ValueError, match="do not split into 3 equal parts"):
        stack_rows(NAMES.native_stack("blocks.0.attn.qkv.weight"), 10)


@pytest.fixture
def component(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "q": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "k": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "v": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "odd": torch.randn(4, 5, generator=g).to(torch.bfloat16),
        "f32": torch.randn(4, 3, generator=g),
    }
    save_file(tensors, tmp_path / "m.safetensors")
    return open_component(tmp_path), tensors


def _stack(comp, names, ranges=None):
    segs = [
        (TensorSource(comp.tensors[n]), *(ranges or {}).get(n, (0, comp.tensors[n].shape[0]))) for n in names
    ]
    return StackedSource.of("qkv", segs, "here")


def test_a_stacked_source_reads_copies_and_casts_its_rows_exactly(component):
    comp, t = component
    stacked = _stack(comp, ["q", "k", "v"])
    want = torch.cat([t["q"], t["k"], t["v"]])
    assert (
        stacked.info.shape == (12, 3)
        and stacked.info.dtype == "BF16"
        and stacked.info.nbytes == want.numel() * 2
    )
    assert torch.equal(stacked.read(), want)
    for r0, r1 in [(0, 12), (3, 9), (4, 8), (7, 8), (11, 12)]:  # ranges across and within the parts
        assert torch.equal(stacked.read_rows(r0, r1), want[r0:r1])
    assert torch.equal(stacked.read_rows(2, 10, torch.float32), want[2:10].float())
    out = bytearray(stacked.info.nbytes)

    def write(chunk, offset):
        out[offset : offset + len(chunk)] = chunk

    stacked.copy_bytes(write)
    assert bytes(out) == want.view(torch.uint8).numpy().tobytes()
    # halves of one tensor, swapped
    halves = StackedSource.of(
        "fc1", [(TensorSource(comp.tensors["q"]), 2, 4), (TensorSource(comp.tensors["q"]), 0, 2)], "here"
    )
    assert torch.equal(halves.read(), torch.cat([t["q"][2:], t["q"][:2]]))


def test_tensors_that_cannot_stack_are_refused_naming_them(component):
    comp, _ = component
    with pytest.raises(
        InputError, match=r"here: tensor 'odd' is BF16\[4, 5\] and 'q' BF16\[4, 3\]: 'qkv' cannot stack"
    ):
        _stack(comp, ["q", "odd"])
    with pytest.raises(InputError, match=r"tensor 'f32' is F32\[4, 3\] and 'q' BF16"):
        _stack(comp, ["q", "f32"])
