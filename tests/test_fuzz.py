"""Fuzzing the readers of untrusted input: recipes, safetensors headers, indexes, manifests.

Whatever the bytes, a reader either returns something consistent or raises `InputError` (the CLI's clean,
one-line exit 2); never another exception, never a hang. Derandomized, so CI sees the same cases every run
(`HYPOTHESIS_PROFILE=explore` draws new ones, ten times as many).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from quantize.errors import InputError
from quantize.publish.manifest import read_manifest
from quantize.read.checkpoint import open_component, read_header
from quantize.read.files import MANIFEST_NAME, component_files
from quantize.recipes import Recipe, dump_recipe, parse_recipe

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=30000,  # a hang, not a slow example on a loaded 2-core machine (one took over 5 s beside the suite)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("explore", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 1

DEEP = "[" * 5000 + "]" * 5000  # nesting past the recursion limit of any recursive parser

# JSON-like values, the shapes headers, indexes and recipes are made of
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _clean_error(e: InputError) -> None:
    assert str(e).strip(), "an error with no message"


# --- recipes --------------------------------------------------------------------------------------

recipe_keys = st.sampled_from([*Recipe.model_fields, "target", "checks", "min_sqnr_db", "extra"])
recipe_values = (
    json_values
    | st.sampled_from(["fp8_channel", "nf4", "torchao_fp8", "int8", "source", "bfloat16", "."])
    | st.lists(
        st.sampled_from([r"blocks\.\d+\.ffn\.0", "(", "[a-", ".*", "", "..", "/abs", "a/../b", "x"]),
        max_size=4,
    )
)
recipe_mappings = st.dictionaries(recipe_keys, recipe_values, max_size=6)


@pytest.mark.slow
@settings(max_examples=800 * SCALE)
@given(st.one_of(st.text(max_size=200), recipe_mappings.map(lambda d: yaml.safe_dump(d, allow_unicode=True))))
@example("format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0']\n")
@example("- " * 5000 + "a")
@example("a: &a [1, 2]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n")
@example(DEEP)
def test_recipe_loader_never_crashes(text):
    try:
        recipe = parse_recipe(text, "fuzz.yaml")
    except InputError as e:
        _clean_error(e)
        return
    assert recipe.format in {"fp8_channel", "nf4", "torchao_fp8"} and recipe.targets
    assert parse_recipe(dump_recipe(recipe)) == recipe  # what is accepted round-trips


# --- safetensors headers --------------------------------------------------------------------------


def _valid_file() -> bytes:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "blocks.0.ffn.0.weight": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        "blocks.0.ffn.0.bias": torch.randn(4, generator=g),
        "scale_shift_table": torch.randn(1, 2, 3, generator=g).to(torch.float16),
    }
    return save(tensors, metadata={"format": "pt"})


VALID = _valid_file()
(HEADER_LEN,) = struct.unpack("<Q", VALID[:8])
VALID_HEADER = json.loads(VALID[8 : 8 + HEADER_LEN])


def _with_header(header: object, data: bytes = VALID[8 + HEADER_LEN :], raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header, allow_nan=True).encode()
    return struct.pack("<Q", len(text)) + text + data


def _mutated_entry(draw_value, key: str) -> dict:
    header = json.loads(json.dumps(VALID_HEADER))
    name = sorted(k for k in header if k != "__metadata__")[0]
    header[name][key] = draw_value
    return header


@st.composite
def safetensors_files(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "flip", "truncate", "length", "header", "entry", "metadata"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "flip":
        data = bytearray(VALID)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, 8 + HEADER_LEN + 16))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "truncate":
        return VALID[: draw(st.integers(0, len(VALID) - 1))]
    if kind == "length":
        return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + VALID[8:]
    if kind == "header":
        return _with_header(draw(json_values))
    if kind == "entry":
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))
        value = draw(
            json_values
            | st.sampled_from(["F8_E8M0", "I128", "BF16", "F32", "U8"])
            | st.lists(st.integers(-(2**66), 2**66), max_size=3)
        )
        return _with_header(_mutated_entry(value, key))
    return _with_header({**VALID_HEADER, "__metadata__": draw(json_values)})


@settings(max_examples=1200 * SCALE)
@given(safetensors_files())
@example(VALID)
@example(_with_header(None, raw=DEEP.encode()))
@example(_with_header(None, raw=b'{"a": 1, "a": 2}'))
@example(struct.pack("<Q", 2**63) + b"{}")
def test_safetensors_header_reader_never_crashes(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        path.write_bytes(data)
        try:
            header = read_header(path)
        except InputError as e:
            _clean_error(e)
            assert str(path) in str(e)  # the file is named
            return
    size = len(data)
    cursor = header.data_start
    for t in header.tensors.values():  # what is accepted tiles the file exactly, as safetensors requires
        assert t.start == cursor and t.end <= size
        cursor = t.end
    assert cursor == size


# --- indexes --------------------------------------------------------------------------------------

shard_names = st.sampled_from(
    [
        "model.safetensors",
        "./model.safetensors",
        "../model.safetensors",
        "/etc/passwd",
        "sub/../model.safetensors",
        "missing.safetensors",
        "model.safetensors\x00",
        "a\\model.safetensors",
        "",
        ".",
        "sub",
    ]
) | st.text(max_size=10)


@st.composite
def index_texts(draw) -> str:
    kind = draw(st.sampled_from(["weight_map", "json", "text"]))
    if kind == "text":
        return draw(st.text(max_size=60))
    if kind == "json":
        return json.dumps(draw(json_values))
    names = [k for k in VALID_HEADER if k != "__metadata__"]
    keys = draw(st.lists(st.sampled_from([*names, "other.weight"]) | st.text(max_size=6), max_size=5))
    values = draw(st.lists(shard_names | json_values, min_size=len(keys), max_size=len(keys)))
    return json.dumps({"metadata": draw(json_values), "weight_map": dict(zip(keys, values, strict=True))})


@settings(max_examples=800 * SCALE)
@given(index_texts())
@example(json.dumps({"weight_map": {k: "model.safetensors" for k in VALID_HEADER if k != "__metadata__"}}))
@example(DEEP)
def test_index_reader_never_crashes(text):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "ckpt"
        (root / "sub").mkdir(parents=True)
        (root / "model.safetensors").write_bytes(VALID)
        (root / "model.safetensors.index.json").write_text(text)
        try:
            files = component_files(root)
            component = open_component(root)
        except InputError as e:
            _clean_error(e)
            return
        for shard in files.shards:  # every shard an accepted index names is inside the checkpoint
            assert shard.resolve().is_relative_to(root.resolve()) and shard.is_file()
        assert set(component.tensors) == {k for k in VALID_HEADER if k != "__metadata__"}


# --- manifests ------------------------------------------------------------------------------------


@settings(max_examples=300 * SCALE)
@given(
    st.one_of(
        st.text(max_size=80),
        json_values.map(json.dumps),
        st.fixed_dictionaries(
            {
                "output_files": st.lists(
                    st.fixed_dictionaries({"path": shard_names, "size": json_values, "sha256": json_values})
                )
            }
        ).map(json.dumps),
        # the recorded steps, and the LoRAs of the manifests written before them
        st.fixed_dictionaries(
            {"steps": st.lists(json_values | st.fixed_dictionaries({"step": json_values}))}
        ).map(json.dumps),
        st.fixed_dictionaries({"loras": json_values}).map(json.dumps),
    )
)
@example(DEEP)
@example(json.dumps({"steps": [{"step": []}]}))
@example(json.dumps({"steps": [{"step": "lora", "loras": 5}]}))
@example(json.dumps({"loras": 5}))
@example(json.dumps({"loras": [{"file": "../x"}]}))
@example(json.dumps({"schema_version": 99}))
def test_manifest_reader_never_crashes(text):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / MANIFEST_NAME).write_text(text)
        try:
            read_manifest(Path(d))
        except InputError as e:
            _clean_error(e)


@pytest.mark.parametrize("field", ["output_files", "source_files", "components"])
def test_a_manifest_path_outside_the_checkpoint_is_refused(wan_tiny, tmp_path, field):
    from quantize.publish.converter import convert

    out = tmp_path / "out"
    convert(wan_tiny, out, "wan-fp8", workers=1)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest[field][0]["path"] = "../../etc/passwd"
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(
        InputError, match=rf"invalid manifest at {field}\.0\.path: .*'\.\./\.\./etc/passwd' leaves"
    ):
        read_manifest(out)
