"""The model families: the registry, how a component's family and names are found, and each family's tables
(Wan's native names against diffusers' own converter, the oracle). What every family promises on its examples is
tests/models/test_family_contract.py."""

from __future__ import annotations

import pytest

from quantize.errors import InputError
from quantize.formats import FORMAT_INFO
from quantize.models import FAMILIES, IDENTITY, family_of, get_family, name_table, names_for
from quantize.models.examples import examples_of
from quantize.read.checkpoint import open_component

WAN, KANDINSKY5 = get_family("wan"), get_family("kandinsky5")
WAN_NATIVE = name_table(WAN, "native", FORMAT_INFO["comfy_fp8"]).renamer


def test_families_are_registered_once_and_unknown_ones_are_named():
    names = [f.name for f in FAMILIES]
    assert len(set(names)) == len(names)
    # a variant is asked before the family it extends, which would claim its names too
    assert all(names.index(v) < names.index("wan") for v in ("wan-vace", "skyreels-v2", "wan-animate"))
    with pytest.raises(InputError, match=f"unknown model family 'ltx'.*known: {', '.join(names)}"):
        get_family("ltx")


@pytest.mark.parametrize(
    ("config_class", "names", "family"),
    [
        ("WanModel", [], "wan"),
        ("WanTransformer3DModel", [], "wan"),
        ("Kandinsky5Transformer3DModel", ["blocks.0.self_attn.q.weight"], "kandinsky5"),  # the config decides
        (None, ["head.modulation", "blocks.0.self_attn.q.weight"], "wan"),
        (None, ["condition_embedder.time_proj.weight"], "wan"),
        (None, ["visual_transformer_blocks.0.self_attention.to_query.weight"], "kandinsky5"),
        (None, ["proj_out.weight"], None),
        ("FluxTransformer2DModel", ["x_embedder.weight"], None),
        # a class no family is registered by is no family's, whatever marks its names share (Kandinsky 6's
        # super-resolution DiT has Kandinsky 5's): tests/read/test_detect_unregistered_class.py
        ("WanModelVariant", ["head.modulation"], None),
        (
            "Kandinsky6SRTransformer3DModel",
            ["visual_transformer_blocks.0.self_attention.to_query.weight"],
            None,
        ),
        (
            "Kandinsky6Transformer3DModel",
            ["visual_transformer_blocks.0.self_attention.to_query.weight"],
            "kandinsky6",
        ),
    ],
)
def test_a_components_family_is_found_by_its_config_class_else_by_its_names(config_class, names, family):
    found = family_of(config_class, names)
    assert (found.name if found else None) == family


def test_a_format_asks_for_a_role_and_the_family_answers_or_is_named():
    assert names_for("source", None, FORMAT_INFO["fp8_channel"], "here") is IDENTITY
    assert names_for("source", KANDINSKY5, FORMAT_INFO["fp8_channel"], "here") is IDENTITY
    assert names_for("native", WAN, FORMAT_INFO["gguf"], "here").name == "wan_native"
    assert names_for("native", KANDINSKY5, FORMAT_INFO["comfy_fp8"], "here").name == "kandinsky5_native"
    with pytest.raises(
        InputError, match=r"^here: the tensor names are of no model family this tool knows.*gguf"
    ):
        names_for("native", None, FORMAT_INFO["gguf"], "here")
    with pytest.raises(InputError, match="unknown role of names 'comfy'"):
        names_for("comfy", WAN, FORMAT_INFO["gguf"], "here")


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
    rename = WAN_NATIVE(list(state), "test")
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
    rename = WAN_NATIVE(names, "here")
    assert [rename(n) for n in names] == names
    with pytest.raises(InputError, match="here: the tensor names are neither Wan's native names"):
        WAN_NATIVE(["visual_embeddings.in_layer.weight", "time_embeddings.in_layer.bias"], "here")
    with pytest.raises(InputError, match="tensor 'blocks.0.attn1.extra.weight' has no native Wan name"):
        WAN_NATIVE(["condition_embedder.time_proj.weight", "blocks.0.attn1.extra.weight"], "here")


def test_a_mix_of_native_and_diffusers_names_is_refused():
    with pytest.raises(InputError, match="tensor 'condition_embedder.time_proj.weight' has a diffusers name"):
        WAN_NATIVE(["head.modulation", "condition_embedder.time_proj.weight"], "here")


# -- examples: the dimensions the runtimes fix -----------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("layout", ["t2v", "i2v", "a14b", "lingbot"])
def test_wan_examples_have_the_dimensions_comfyui_builds_wan_with(preset, layout):
    """ComfyUI builds every Wan with text_dim 4096, freq_dim 256 and 128-wide heads; an I2V model's in_dim is 36."""
    for model in examples_of(WAN).models(preset, layout):
        shapes = dict(model.tensors)
        config = model.config
        assert shapes["text_embedding.0.weight"][1] == 4096 and config["freq_dim"] == 256
        assert shapes["time_embedding.0.weight"][1] == 256
        assert config["dim"] // config["num_heads"] == 128
        assert shapes["patch_embedding.weight"][1] == config["in_dim"] == (36 if layout == "i2v" else 16)
        assert WAN.naming(shapes) == "native" and family_of(config["_class_name"], shapes) is WAN


def test_the_kandinsky5_example_is_diffusers_own_class():
    (model,) = examples_of(KANDINSKY5).models("tiny", "t2v")
    assert model.component == "transformer" and model.config["in_text_dim"] == 3584
    assert family_of(model.config["_class_name"], dict(model.tensors)) is KANDINSKY5
    with pytest.raises(InputError, match="Kandinsky 5 examples: preset '14b'"):
        examples_of(KANDINSKY5).models("14b", "t2v")


def test_a_name_table_with_block_lists_named_otherwise_in_each_naming():
    """Families to come call their blocks otherwise natively (HunyuanVideo's double_blocks are diffusers'
    transformer_blocks): each list of blocks has its prefix in each naming, and the table reads both ways."""
    from quantize.models import BlockNames, Blocks

    table = BlockNames(
        root_modules={"x_embedder": "img_in"},
        root_tensors={"scale_shift_table": "final.modulation"},
        blocks=(
            Blocks("transformer_blocks", "double_blocks", {"attn.to_q": "img_attn_q"}, {"shift": "mod"}),
            Blocks("single_transformer_blocks", "single_blocks", {"proj_out": "linear2"}),
        ),
    )
    pairs = {
        "x_embedder.weight": "img_in.weight",
        "scale_shift_table": "final.modulation",
        "transformer_blocks.3.attn.to_q.bias": "double_blocks.3.img_attn_q.bias",
        "transformer_blocks.0.shift": "double_blocks.0.mod",
        "single_transformer_blocks.12.proj_out.weight": "single_blocks.12.linear2.weight",
    }
    for diffusers_name, native in pairs.items():
        assert table.native(diffusers_name) == native and table.diffusers(native) == diffusers_name
    assert table.native("transformer_blocks.0.proj_out.weight") is None  # a module of the other list
    assert table.native("single_transformer_blocks.x.proj_out.weight") is None  # no block number


# -- a family is declared parts and the hooks it needs -----------------------------------------------------------


def test_a_new_family_is_its_parts_and_its_runtime_and_the_rest_follows():
    """A family of one naming (no native table) declares its detection, folders and runtime, and nothing else: it is
    found by its class and its marks, its layouts are told, a GGUF is refused at plan time in its words, and a
    forward pass runs under its own names; one without its runtime cannot be made (`abc`, as a format's hooks)."""
    from quantize.models.family import Detection, Family, Folders, ModelInputs, PlanPolicy

    class Toy(Family):
        name, title = "toy", "Toy"
        detection = Detection("ToyTransformer3DModel", diffusers_marks=("toy_blocks.0.",))
        folders = Folders("toy")
        plan = PlanPolicy(no_gguf_why="no GGUF reader knows Toy")
        inputs = ModelInputs(lambda c: (), lambda c: {}, lambda c, g: {}, lambda c, t: t, ())

        def diffusers_config(self, config, tensors, where):
            return dict(config)

    toy, names = Toy(), ["toy_blocks.0.proj.weight", "toy_blocks.0.proj.bias"]
    assert toy.owns("ToyTransformer3DModel", []) and toy.owns(None, names) and not toy.owns("WanModel", names)
    assert toy.naming(names) == "diffusers" and toy.diffusers_class == "ToyTransformer3DModel"
    assert name_table(toy, "source", FORMAT_INFO["fp8_channel"]) is IDENTITY
    with pytest.raises(InputError, match="m: Toy has no GGUF architecture \\(no GGUF reader knows Toy\\)"):
        name_table(toy, "source", FORMAT_INFO["gguf"], "m")
    with pytest.raises(InputError, match="Toy has none in this tool yet"):
        name_table(toy, "native", FORMAT_INFO["comfy_fp8"], "m")

    class NoRuntime(Family):
        name, title = "none", "None"
        detection = Detection("NoneModel")
        folders = Folders("none")

    with pytest.raises(TypeError, match="abstract"):
        NoRuntime()


def test_wans_variants_share_wans_parts_and_differ_in_their_marks():
    """VACE, SkyReels-V2 and Animate are `WanVariant`s: Wan's LoRA names and GGUF architecture, told apart from Wan
    (and from each other) by their own layers' marks, whatever Wan class their release's config names."""
    from quantize.models.wan import WanVariant

    wan = get_family("wan")
    variants = [f for f in FAMILIES if isinstance(f, WanVariant)]
    # and the ones only ComfyUI runs (`wan_variants`), besides any other
    some = {"wan-vace", "skyreels-v2", "wan-animate", "wan-s2v", "wan-humo", "wan-camera", "wan-scail"}
    assert some <= {f.name for f in variants}
    base = ["blocks.0.self_attn.q.weight", "head.modulation"]
    for f in variants:
        own = [f"{f.detection.own_marks[0]}x.weight"]
        assert f.lora == wan.lora and f.plan.gguf_architecture == "wan"
        assert f.owns("WanModel", base + own) and not f.owns("WanModel", base)
        assert not wan.owns("WanModel", base + own) and family_of("WanModel", base + own) is f
        assert family_of("WanModel", base) is wan
