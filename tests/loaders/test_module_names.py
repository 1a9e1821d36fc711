"""The names `loaders` answers to after `modules.py` and `materialize.py` became packages: each class under its
format's name in the module of its format, the earlier names as aliases (the same class objects), the registry in
one place, and what was imported from the two modules still importable from them."""

from __future__ import annotations

import importlib

import pytest

import loaders
import loaders.materialize
import loaders.modules
from loaders.modules import gemm
from quantize.formats import FORMAT_INFO

#: earlier name -> the class's name now (every other class kept its name)
RENAMED = {
    "FP8Linear": "FP8ChannelLinear",
    "Int8Linear": "ComfyInt8Linear",
    "Float8Linear": "TorchaoFP8Linear",
    "NVFP4Linear": "ComfyNVFP4Linear",
    "MXFP8Linear": "ComfyMXFP8Linear",
}
KEPT = [
    "ComfyFP8Linear",
    "TorchaoInt8Linear",
    "NF4Linear",
    "GGUFLinear",
    "ComfyW4a4Linear",
    "ComfyW4a8Linear",
    "QuantizedLinear",
]


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_an_earlier_name_is_the_same_class_from_loaders_and_loaders_modules(old, new):
    cls = getattr(loaders.modules, new)
    assert cls.__name__ == new
    assert getattr(loaders.modules, old) is cls
    assert getattr(loaders, old) is cls and getattr(loaders, new) is cls
    assert {old, new} <= set(loaders.__all__) and {old, new} <= set(loaders.modules.__all__)


def test_every_class_is_exported_and_lives_in_the_module_of_its_format():
    assert set(KEPT) <= set(loaders.__all__) and set(KEPT) <= set(loaders.modules.__all__)
    for fmt, cls in loaders.modules.MODULES.items():
        assert cls.__module__ == f"loaders.modules.{fmt}", (fmt, cls)
        assert importlib.import_module(cls.__module__).__dict__[cls.__name__] is cls
        assert getattr(loaders, cls.__name__) is cls and cls.__name__ not in RENAMED
    assert loaders.MODULES is loaders.modules.MODULES
    assert len(set(loaders.modules.MODULES.values())) == len(loaders.modules.MODULES) == len(FORMAT_INFO)


def test_int8_gemm_read_and_set_on_the_package_is_the_setting_the_products_read(monkeypatch):
    """``loaders.modules.INT8_GEMM`` (`make gpu-check` sets it) is `gemm.INT8_GEMM`, read and set."""
    assert loaders.modules.INT8_GEMM == gemm.INT8_GEMM == "triton"
    monkeypatch.setattr(loaders.modules, "INT8_GEMM", "int_mm")
    assert gemm.INT8_GEMM == "int_mm" and loaders.modules.INT8_GEMM == "int_mm"
    assert "INT8_GEMM" not in vars(loaders.modules)  # one value, in gemm: never a stale copy on the package
    monkeypatch.undo()
    assert gemm.INT8_GEMM == loaders.modules.INT8_GEMM == "triton"
    loaders.modules.INT8_GEMM = "int_mm"  # as `make gpu-check` sets it
    try:
        assert gemm.INT8_GEMM == "int_mm"
    finally:
        loaders.modules.INT8_GEMM = "triton"
    with pytest.raises(AttributeError, match="has no attribute 'NO_SUCH_SETTING'"):
        loaders.modules.NO_SUCH_SETTING  # noqa: B018


def test_what_was_imported_from_the_two_modules_still_is():
    from loaders.materialize import (  # noqa: F401
        CheckpointMismatchError,
        find_component,
        find_components,
        load_quantized,
        open_model_files,
        parameters_on_meta,
    )
    from loaders.modules import (  # noqa: F401
        COMPUTE,
        KernelUnavailable,
        QuantizedLinear,
        int_mm,
        module_for,
        set_param,
    )

    assert loaders.load_quantized is load_quantized
    assert loaders.CheckpointMismatchError is CheckpointMismatchError
    assert int_mm is gemm.int_mm
