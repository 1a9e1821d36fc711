"""The name rules (module, part and manifest keys) and the name-table seam of the plan."""

from __future__ import annotations

import pytest

from quantize.checkpoint import open_component
from quantize.errors import InputError
from quantize.names import (
    IDENTITY,
    WAN_NATIVE,
    NameTable,
    get_name_table,
    manifest_key,
    module_name,
    part_key,
    split_manifest_key,
)
from quantize.plan import plan_component
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


def test_the_identity_table_is_the_default_and_unknown_tables_are_named():
    assert get_name_table("source") is IDENTITY
    with pytest.raises(InputError, match="unknown name table 'native'.*known: source"):
        get_name_table("native")


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


# -- Wan native names: the inverse of diffusers' own converter -------------------------------------------


def _diffusers_wan_state(image_dim: int | None) -> dict:
    import diffusers

    from tests.diffusers_models import WAN_TINY

    kw = dict(image_dim=image_dim, added_kv_proj_dim=64) if image_dim else {}
    return diffusers.WanTransformer3DModel(**{**WAN_TINY, **kw}).state_dict()


@pytest.mark.parametrize("image_dim", [None, 32], ids=["t2v", "i2v"])
def test_diffusers_own_converter_maps_our_native_names_back_onto_the_source(image_dim):
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    state = _diffusers_wan_state(image_dim)
    rename = WAN_NATIVE.renamer(list(state), "test")
    native = {rename(k): v for k, v in state.items()}
    assert len(native) == len(state)  # one native name each
    # the cases that are easy to get wrong
    assert (
        rename("scale_shift_table") == "head.modulation" and rename("proj_out.weight") == "head.head.weight"
    )
    assert rename("blocks.1.scale_shift_table") == "blocks.1.modulation"
    assert rename("blocks.0.norm2.weight") == "blocks.0.norm3.weight"  # the cross-attention norm
    assert rename("condition_embedder.time_proj.bias") == "time_projection.1.bias"
    if image_dim:
        assert rename("condition_embedder.image_embedder.norm1.bias") == "img_emb.proj.0.bias"
        assert rename("blocks.0.attn2.norm_added_k.weight") == "blocks.0.cross_attn.norm_k_img.weight"
    back = convert_wan_transformer_to_diffusers(dict(native))
    assert set(back) == set(state)
    assert all(back[k] is state[k] for k in state)  # each tensor lands where it came from


def test_native_names_stay_and_other_models_are_refused(wan_tiny):
    names = list(open_component(wan_tiny).tensors)
    rename = WAN_NATIVE.renamer(names, "here")
    assert [rename(n) for n in names] == names
    with pytest.raises(InputError, match="here: the tensor names are neither Wan's native names"):
        WAN_NATIVE.renamer(["visual_embeddings.in_layer.weight", "time_embeddings.in_layer.bias"], "here")
    with pytest.raises(InputError, match="tensor 'blocks.0.attn1.extra.weight' has no native Wan name"):
        WAN_NATIVE.renamer(["condition_embedder.time_proj.weight", "blocks.0.attn1.extra.weight"], "here")


def test_a_mix_of_native_and_diffusers_names_is_refused():
    with pytest.raises(InputError, match="tensor 'condition_embedder.time_proj.weight' has a diffusers name"):
        WAN_NATIVE.renamer(["head.modulation", "condition_embedder.time_proj.weight"], "here")
