"""The container seam: a new container is one module and a table row; convert and verify use it unchanged.

This file is itself a container (`one_file`: every tensor of a component in ``model.safetensors``, no index),
registered for the duration of a test, with fp8_channel's table row pointing at it. Nothing else changes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from quantize import containers, formats
from quantize.check.verify import verify
from quantize.containers import PlannedFile, config_text, get_container, write_file
from quantize.containers import sharded_safetensors as sharded
from quantize.containers.writer import ShardWriter, header_bytes, shard_layout
from quantize.errors import InputError
from quantize.publish.converter import convert
from quantize.read.checkpoint import CONFIG_NAME, open_component
from tests.conftest import load_all

# -- the `one_file` container ------------------------------------------------------------------------

NAME = "one_file"
FILE = "model.safetensors"


def planned_files(cp, fmt, max_bytes):
    return [PlannedFile(FILE, tuple(cp.tensors))]


def planned_size(file, cp, fmt):
    specs = [spec for tp in file.tensors for spec in tp.outputs]
    return len(header_bytes(shard_layout(specs), file_metadata(fmt, cp))) + sum(s.nbytes for s in specs)


def file_metadata(fmt, cp):
    return {"format": "pt", "container": NAME, **fmt.checkpoint_metadata(cp.metadata_entries())}


def stored_metadata(cp, fmt, stored):
    for shard in stored.shards:
        ok = stored.metadata[shard] == file_metadata(fmt, cp)
        yield "shard metadata", ok, "" if ok else f"{shard.name}: not the metadata the plan writes"


def open_file(path, file, cp, fmt):
    return ShardWriter(path, [spec for tp in file.tensors for spec in tp.outputs], file_metadata(fmt, cp))


def component_config(fmt, config, kept_linears):
    return containers.config_with_quantization(fmt, config, kept_linears)


def finish(out_dir, cp, fmt, written):
    write_file(
        out_dir / CONFIG_NAME, config_text(component_config(fmt, cp.component.config, cp.kept_linears()))
    )
    return [out_dir / CONFIG_NAME]


def open_stored(root, rel):
    return open_component(root, rel)


# -- tests -------------------------------------------------------------------------------------------


@pytest.fixture
def one_file_fp8(monkeypatch):
    monkeypatch.setitem(containers._MODULES, NAME, __name__)
    info = formats.FORMAT_INFO["fp8_channel"]
    monkeypatch.setitem(formats.FORMAT_INFO, "fp8_channel", dataclasses.replace(info, container=NAME))


def test_unknown_containers_are_named():
    assert get_container("sharded_safetensors") is sharded
    with pytest.raises(InputError, match="unknown container 'gguf'.*known: sharded_safetensors"):
        get_container("gguf")


def test_a_new_container_plugs_in_without_touching_convert_or_verify(wan_tiny, tmp_path, one_file_fp8):
    out = tmp_path / "one"
    manifest = convert(wan_tiny, out, "wan-fp8", max_shard_size="100KB", workers=2)
    assert [p.name for p in out.glob("*.safetensors*")] == [FILE]  # one file, no index
    assert {f.path for f in manifest.output_files} >= {FILE, CONFIG_NAME}
    with safe_open(out / FILE, "pt") as f:
        assert f.metadata()["container"] == NAME
    report = verify(out, wan_tiny)
    assert report.ok, [f for c in report.checks.values() for f in c.failures]
    assert report.checks[("parity", "requantize")].passed == manifest.components[0].quantized


def test_the_same_tensors_whatever_the_container(wan_tiny, tmp_path, request):
    sharded_out = tmp_path / "sharded"
    convert(wan_tiny, sharded_out, "wan-fp8", max_shard_size="100KB", workers=2)
    assert len(list(sharded_out.glob("*.safetensors"))) > 1
    request.getfixturevalue("one_file_fp8")
    one_out = tmp_path / "one"
    convert(wan_tiny, one_out, "wan-fp8", workers=2)
    ours, theirs = load_all(one_out), load_all(sharded_out)
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
    config = json.loads(Path(one_out / CONFIG_NAME).read_text())
    assert config == json.loads(Path(sharded_out / CONFIG_NAME).read_text())
