"""Errors name the Python parameter at fault; the CLI writes the option a user typed in its place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import quantize
from quantize.errors import InputError
from quantize.publish.converter import convert


def test_an_error_names_the_parameter_and_the_cli_option_replaces_it(tmp_path):
    with pytest.raises(InputError) as caught:
        convert(tmp_path / "src", tmp_path / "out", "wan-fp8", workers=0)
    e = caught.value
    assert e.parameters == ("workers",)
    assert str(e) == "`workers` must be at least 1, got 0"
    assert e.with_options({"workers": "--workers"}) == "--workers must be at least 1, got 0"
    assert e.with_options({}) == str(e)  # a parameter the command has no option for stays as the library says


def test_two_parameters_and_only_those_are_replaced():
    e = InputError(
        "`loras` re-applies LoRAs to the source: give `source` too", parameters=("loras", "source")
    )
    options = {"loras": "--lora", "source": "--source", "workers": "--workers"}
    assert e.with_options(options) == "--lora re-applies LoRAs to the source: give --source too"
    assert InputError("run `workers` once").with_options(options) == "run `workers` once"  # not named


def test_no_library_error_starts_with_a_cli_option():
    root = Path(quantize.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "cli":
            continue
        assert not re.search(r'Error\(\s*f?"--', path.read_text()), path
