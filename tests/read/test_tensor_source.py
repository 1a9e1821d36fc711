"""The tensor-source seam: a per-tensor step changes what every stage reads, kept tensors included.

A step given to `convert` must give exactly what converting a source that already holds the changed values
gives; the byte copy of a kept tensor must never bypass it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantize.check.verify import verify
from quantize.errors import InputError
from quantize.publish.converter import convert
from quantize.read.checkpoint import TensorInfo, open_component
from quantize.read.tensor_source import TensorSource
from quantize.steps import BaseStep

WEIGHT = "blocks.0.self_attn.q.weight"  # quantized by wan-fp8
BIAS = "blocks.0.self_attn.q.bias"  # kept, copied as bytes when unchanged
SCALAR_TABLE = "blocks.1.modulation"  # kept, not 2-D


def _delta(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.01


@dataclass
class _AddDelta:
    """Adds a fixed float32 delta to one tensor, in float32, cast back to the stored dtype (LoRA-like)."""

    delta: torch.Tensor
    label: str = "test delta"

    def apply(self, rows: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        return (rows.float() + self.delta.reshape(-1, *self.delta.shape[1:])[r0:r1]).to(rows.dtype)


@dataclass
class _Step(BaseStep):
    names: tuple[str, ...]
    used: set[str] = field(default_factory=set)
    inputs: tuple[Path, ...] = ()

    def transforms_for(self, component: str, tensors: dict[str, TensorInfo]):
        touched = {n: tensors[n] for n in self.names if n in tensors}
        self.used |= set(touched)
        return {n: _AddDelta(_delta(info.shape, seed=len(n))) for n, info in touched.items()}

    def finish(self) -> None:
        missing = sorted(set(self.names) - self.used)
        if missing:
            raise InputError(f"test step: tensor {missing[0]!r} matches nothing")


def _changed_copy(src: Path, dest: Path, names: tuple[str, ...]) -> Path:
    """`src` with the named tensors changed as `_Step` changes them, rewritten with safetensors itself."""
    shutil.copytree(src, dest)
    comp = open_component(dest)
    for shard in comp.shards:
        tensors = load_file(shard)
        touched = [n for n in names if n in tensors]
        for n in touched:
            t = tensors[n]
            tensors[n] = (t.float() + _delta(tuple(t.shape), seed=len(n))).to(t.dtype)
        if touched:
            save_file(tensors, shard, metadata=comp.metadata[shard])
    return dest


def test_a_step_gives_what_converting_the_changed_source_gives(wan_tiny, tmp_path):
    names = (WEIGHT, BIAS, SCALAR_TABLE)
    step = _Step(names)
    convert(wan_tiny, tmp_path / "stepped", "wan-fp8", steps=[step], workers=2)
    assert step.used == set(names)
    changed = _changed_copy(wan_tiny, tmp_path / "changed-src", names)
    convert(changed, tmp_path / "direct", "wan-fp8", workers=2)
    shards = sorted(p.name for p in (tmp_path / "direct").glob("*.safetensors"))
    assert shards == sorted(p.name for p in (tmp_path / "stepped").glob("*.safetensors"))
    for name in shards:  # byte for byte: the kept bias and table were not copied from the unchanged source
        assert (tmp_path / "stepped" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes(), name
    plain = tmp_path / "plain"
    convert(wan_tiny, plain, "wan-fp8", workers=2)
    assert any((plain / n).read_bytes() != (tmp_path / "stepped" / n).read_bytes() for n in shards)
    # verify re-reads the source through the same steps: parity holds against the original source
    report = verify(tmp_path / "stepped", wan_tiny, steps=[_Step(names)])
    assert report.ok, [f for c in report.checks.values() for f in c.failures]
    without = verify(tmp_path / "stepped", wan_tiny)  # and fails, naming the tensors, without them
    failures = (
        without.checks[("parity", "requantize")].failures
        + without.checks[("parity", "kept tensors")].failures
    )
    assert len(failures) == 3 and all(any(n in f for n in names) for f in failures)


def test_a_step_that_matches_nothing_stops_the_conversion_before_anything_is_written(wan_tiny, tmp_path):
    with pytest.raises(InputError, match="'blocks.99.ffn.0.weight' matches nothing"):
        convert(wan_tiny, tmp_path / "out", "wan-fp8", steps=[_Step(("blocks.99.ffn.0.weight",))])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_changed_tensor_refuses_the_byte_copy(wan_tiny):
    info = open_component(wan_tiny).tensors[BIAS]
    source = TensorSource(info, (_AddDelta(_delta(info.shape, 1)),))
    assert source.changed
    with pytest.raises(ValueError, match="changed by test delta"):
        source.copy_bytes(lambda data, offset: None)
    assert not torch.equal(source.read(), TensorSource(info).read())
    assert torch.equal(source.read_rows(2, 5), source.read()[2:5])


class _Recorded(BaseStep):
    """A step that says it records itself (verify would rebuild it and apply it first)."""

    RECORDED = True

    def transforms_for(self, component, tensors):
        return {}


def test_steps_that_record_themselves_come_first(wan_tiny):
    from quantize.plan import make_plan
    from quantize.recipes import load_recipe

    recipe = load_recipe("wan-fp8").recipe
    make_plan(wan_tiny, recipe, steps=[_Recorded(), _Step(())])
    with pytest.raises(
        InputError, match=r"^`steps`: _Recorded records itself .* comes after _Step, which does not"
    ):
        make_plan(wan_tiny, recipe, steps=[_Step(()), _Recorded()])
