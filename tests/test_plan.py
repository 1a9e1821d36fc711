"""`make_plan`: what a recipe quantizes (patterns match whole module names, ignore wins, the first target and the
first `types` pattern decide, each pattern counts its matches), what it refuses naming the tensor, pattern or folder
(a non-Linear hit, a pattern that matches nothing, an empty weight, nothing to quantize, a missing component), and
that planning reads the headers only."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantize.errors import InputError
from quantize.plan import make_plan
from quantize.recipes import dump_recipe, parse_recipe
from tests.helpers.recipes import MINIMAL


def _plan(source, text):
    return make_plan(source, parse_recipe(text))


def _quantized(plan):
    return {t.name for cp in plan.components for t in cp.tensors if t.quantize}


def test_fullmatch_not_search(wan_tiny):
    # 'ffn\.0' alone would be found by re.search in every block; fullmatch needs the whole name
    with pytest.raises(InputError, match="pattern 'ffn\\\\.0' matches no module"):
        _plan(wan_tiny, "format: fp8_channel\ntargets: ['ffn\\.0']\n")
    plan = _plan(wan_tiny, "format: fp8_channel\ntargets: ['.*ffn\\.0']\n")
    assert _quantized(plan) == {"blocks.0.ffn.0.weight", "blocks.1.ffn.0.weight"}


def test_ignore_wins(wan_tiny):
    plan = _plan(
        wan_tiny,
        "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.(0|2)']\nignore: ['blocks\\.1\\.ffn\\.2']\n",
    )
    assert _quantized(plan) == {"blocks.0.ffn.0.weight", "blocks.1.ffn.0.weight", "blocks.0.ffn.2.weight"}
    (cp,) = plan.components
    assert cp.pattern_matches["blocks\\.1\\.ffn\\.2"] == 1
    assert "blocks.1.ffn.2" in cp.kept_linears()


def test_ignore_pattern_matching_nothing_is_an_error(wan_tiny):
    with pytest.raises(InputError, match="ignore pattern 'head\\\\.proj' matches no module in component '.'"):
        _plan(wan_tiny, MINIMAL + "ignore: ['head\\.proj']\n")


@pytest.mark.parametrize(
    "target, tensor",
    [
        ("blocks\\.0\\.ffn\\.0\\.bias", "blocks.0.ffn.0.bias"),  # a bias
        ("blocks\\.0\\.norm3", "blocks.0.norm3.weight"),  # a norm (1-D)
        ("blocks\\.\\d+\\.modulation", "blocks.0.modulation"),  # a modulation table
        ("patch_embedding", "patch_embedding.weight"),  # a 5-D convolution
        ("blocks\\.0\\..*", "blocks.0.cross_attn.k.bias"),  # too broad: the first non-Linear it hits
    ],
)
def test_target_hitting_a_non_linear_tensor_is_named(wan_tiny, target, tensor):
    with pytest.raises(InputError, match=f"hits tensor '{tensor}'") as e:
        _plan(wan_tiny, f"format: fp8_channel\ntargets: ['{target}']\n")
    assert "not a 2-D Linear weight" in str(e.value)


def test_broad_target_is_fine_when_ignore_removes_the_non_linears(wan_tiny):
    plan = _plan(
        wan_tiny,
        "format: fp8_channel\ntargets: ['blocks\\.0\\..*']\nignore: ['.*\\.bias', '.*norm.*', '.*modulation']\n",
    )
    assert "blocks.0.self_attn.q.weight" in _quantized(plan)
    assert all(n.startswith("blocks.0.") for n in _quantized(plan))


def test_plan_reads_headers_only(wan_tiny):
    """Bytes read while planning (from /proc/self/io) stay far below the tensor data of the checkpoint."""
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("needs /proc/self/io")

    def rchar() -> int:
        return int(next(line for line in io.read_text().splitlines() if line.startswith("rchar:")).split()[1])

    data = sum(p.stat().st_size for p in wan_tiny.glob("*.safetensors"))
    before = rchar()
    plan = _plan(wan_tiny, MINIMAL)
    read = rchar() - before
    assert plan.output_bytes < plan.source_bytes
    assert read < data / 10, f"planning read {read} bytes of a {data}-byte checkpoint"


def test_missing_component_folder(wan_tiny):
    with pytest.raises(
        InputError, match="component folder 'transformer' named by the recipe is missing.*point at its parent"
    ):
        _plan(wan_tiny, MINIMAL + "components: [transformer]\n")


def test_overlapping_patterns_each_count_their_matches(wan_tiny):
    plan = _plan(
        wan_tiny, "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0', 'blocks\\.0\\.ffn\\.0']\n"
    )
    (cp,) = plan.components
    assert cp.pattern_matches == {"blocks\\.\\d+\\.ffn\\.0": 2, "blocks\\.0\\.ffn\\.0": 1}
    assert {t.pattern for t in cp.quantized()} == {"blocks\\.\\d+\\.ffn\\.0"}  # the first match decides


def test_a_recipe_that_quantizes_nothing_is_refused(wan_tiny):
    with pytest.raises(InputError, match="nothing would be quantized"):
        _plan(wan_tiny, MINIMAL + "ignore: ['blocks\\..*']\n")


def test_unmatched_pattern_suggests_the_closest_module(wan_tiny):
    with pytest.raises(InputError, match="closest module name: 'blocks.[01].ffn.0'"):
        _plan(wan_tiny, "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.fnn\\.0']\n")


@pytest.mark.parametrize("shape", [(0, 16), (16, 0)])
@pytest.mark.parametrize("fmt", ["fp8_channel", "comfy_fp8", "comfy_int8"])
def test_an_empty_weight_is_refused_at_plan_time_naming_it(tmp_path, shape, fmt):
    import torch
    from safetensors.torch import save_file

    tensors = {"blocks.0.ffn.0.weight": torch.zeros(shape), "head.modulation": torch.ones(1, 2, 16)}
    save_file(tensors, tmp_path / "m.safetensors")  # Wan-like names: the comfy formats' name table takes them
    with pytest.raises(InputError, match=r"tensor 'blocks.0.ffn.0.weight' F32\[.*\] is empty"):
        _plan(tmp_path, f"format: {fmt}\ntargets: ['blocks\\.0\\.ffn\\.0']\n")


def test_a_types_pattern_must_match_and_the_first_match_decides(tmp_path):
    from quantize.examples import write_example

    src = write_example(tmp_path / "w", "small", "t2v")
    base = "format: gguf\ntype: Q4_K\ntargets: ['blocks\\.\\d+\\.ffn\\.(0|2)']\n"
    plan = _plan(src, base + "types: {'blocks\\.0\\.ffn\\.2': Q8_0, 'blocks\\.\\d+\\.ffn\\.2': Q6_K}\n")
    types = {t.name: t.qtype for t in plan.components[0].quantized()}
    assert types == {
        **{f"blocks.{i}.ffn.0.weight": "Q4_K" for i in range(4)},
        **{f"blocks.{i}.ffn.2.weight": "Q6_K" for i in range(1, 4)},
        "blocks.0.ffn.2.weight": "Q8_0",
    }
    with pytest.raises(InputError, match=r"recipe types pattern 'blocks\\\.9.* matches no module"):
        _plan(src, base + "types: {'blocks\\.9\\.ffn\\.2': Q6_K}\n")
    import yaml

    assert not {"type", "types"} & set(yaml.safe_load(dump_recipe(parse_recipe(MINIMAL))))  # as it always was
