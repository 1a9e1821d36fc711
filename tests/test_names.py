"""The name rules (module, part and manifest keys) and the name-table seam of the plan (the families' own
tables: tests/models)."""

from __future__ import annotations

import pytest

from quantize.errors import InputError
from quantize.models import NameTable
from quantize.names import manifest_key, module_name, part_key, split_manifest_key
from quantize.plan import plan_component
from quantize.read.checkpoint import open_component
from quantize.recipes import load_recipe


def test_module_name_strips_only_a_trailing_weight():
    assert module_name("blocks.0.ffn.0.weight") == "blocks.0.ffn.0"
    assert module_name("blocks.0.ffn.0.bias") == "blocks.0.ffn.0.bias"
    assert module_name("blocks.0.weight_scale") == "blocks.0.weight_scale"
    assert part_key("blocks.0.ffn.0", "weight.absmax") == "blocks.0.ffn.0.weight.absmax"


@pytest.mark.parametrize("component", [".", "transformer", "high_noise_model", "a/b"])
@pytest.mark.parametrize("tensor", ["blocks.0.ffn.0.weight", "x/proj.weight"])
def test_manifest_keys_round_trip(component, tensor):
    components = [".", "transformer", "high_noise_model", "a", "a/b"]
    assert split_manifest_key(manifest_key(component, tensor), components) == (component, tensor)


@pytest.mark.parametrize("bad", ["no-slash", "/x.weight", "transformer/", "other/x.weight"])
def test_a_malformed_manifest_key_is_named(bad):
    with pytest.raises(InputError, match=repr(bad)):
        split_manifest_key(bad, [".", "transformer"])


def test_a_name_table_renames_every_output_key_at_plan_time(wan_tiny):
    """Output keys, kept Linears and manifest keys all follow the table; patterns still match source names."""
    recipe = load_recipe("wan-fp8").recipe
    table = NameTable("test", lambda names, where: lambda name: f"model.{name}", "a prefix")
    plain = plan_component(open_component(wan_tiny), recipe)
    renamed = plan_component(open_component(wan_tiny), recipe, table)
    assert [t.quantize for t in renamed.tensors] == [t.quantize for t in plain.tensors]
    for a, b in zip(plain.tensors, renamed.tensors, strict=True):
        assert b.output_name == f"model.{a.name}" and b.name == a.name
        assert [s.name for s in b.outputs] == [f"model.{s.name}" for s in a.outputs]
        assert b.parts == a.parts and [s.nbytes for s in b.outputs] == [s.nbytes for s in a.outputs]
        assert renamed.manifest_key(b) == f"./model.{a.name}"
    assert renamed.kept_linears() == [f"model.{m}" for m in plain.kept_linears()]
    q = next(t for t in renamed.quantized())
    assert q.output("weight_scale").name == f"model.{q.module}.weight_scale"
