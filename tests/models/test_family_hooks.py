"""The family base as a contract: a family overrides its hooks (`HOOKS`) and nothing else of `Family`, and knows a
format by its facts (`FormatFacts`), never by a list of format names."""

from __future__ import annotations

import inspect

import pytest

from quantize.formats import FORMAT_INFO
from quantize.models import FAMILIES, HOOKS, Family, get_family
from quantize.models.family import Detection, Folders, PlanPolicy


def test_every_hook_is_a_method_of_the_base_with_a_docstring():
    for name in HOOKS:
        member = inspect.getattr_static(Family, name)
        function = member.fget if isinstance(member, property) else member
        assert callable(function) and (function.__doc__ or "").strip(), name


def test_no_family_overrides_what_is_not_a_hook():
    """Every registered family keeps to its hooks (the base refuses any other override when a family is defined)."""
    finals = {n for n, v in vars(Family).items() if callable(v) and not n.startswith("_")} - HOOKS
    assert finals, "the base has final methods"
    for family in FAMILIES:
        for cls in type(family).__mro__[:-1]:
            if cls is Family or not issubclass(cls, Family):
                continue
            assert not finals & set(vars(cls)), f"{cls.__name__} overrides {finals & set(vars(cls))}"


def test_overriding_a_final_method_is_refused_at_definition():
    with pytest.raises(TypeError, match="overrides why_no of Family, which is final"):

        class Rogue(Family):  # noqa: F841 - refused as it is defined
            def why_no(self, fmt, native_names=False):
                return None


def test_a_hook_may_be_overridden():
    class Toy(Family):
        name, title = "toy", "Toy"
        detection = Detection("ToyModel")
        folders = Folders("toy")

        @property
        def inputs(self):
            raise NotImplementedError

        def diffusers_config(self, config, tensors, where):
            return config

        def pipeline_tag(self, config):
            return "text-to-image"

    assert Toy().pipeline_tag({}) == "text-to-image"


@pytest.mark.parametrize("fmt", sorted(FORMAT_INFO))
def test_a_family_refuses_a_format_by_its_facts(fmt):
    """GGUF by the role of names it writes, ComfyUI's formats by their library: every format of those facts alike."""
    t5, kandinsky = get_family("t5"), get_family("kandinsky5")
    info = FORMAT_INFO[fmt]
    assert (t5.why_no(info) is not None) == (info.layout_library in t5.plan.unread_by)
    assert (kandinsky.why_no(info) is not None) == (info.names == "gguf")
    assert PlanPolicy().unread_by == ()
