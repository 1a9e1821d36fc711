"""What every registered model family promises, checked on its own example checkpoints: the tests grow with
`models.FAMILIES`, each family's `examples_of(family).layouts`, its layouts (`Family.policies`) and the bundled
recipes derived for them (`recipes.default_recipes`: layout -> format -> name), and a family added to the registry is
held to all of it without a line here.

For each family, on the example `quantize example --family F --layout L` writes (the family's default preset: what
a user gets, and the size on which every bundled recipe must plan):

- **the example builds**: `quantize example --family F` alone writes the first layout (and says so), and each
  model's folder of every example re-opens with the tensors, shapes and config the family's `Examples` declares;
- **detection**: the folder is one layout (`read.detect.detect_layouts`) of the family, with bundled recipes, and
  a model's own folder alone is one too; each model is the family's by its config's class and its names
  (`models.component_family`), by its class alone where the class is the family's own, by its names alone where
  they carry the family's marks, and the family is asked before any other that would claim it (`Family.owns`);
  every layout the family has recipes for is some example's;
- **names, both ways**: each tensor's name in the other naming (`Family.names`) leads back to it, or is one of a
  stack the table reads both ways; what the table has no name for is carried, or a tensor a forward pass refuses
  by name (`models.runnable_names`);
- **the class**: each model planned and built as its runtime class on the meta device (`run.forward.runnable`,
  `StreamedModel`) has every parameter filled by a tensor of the checkpoint, shapes included, and every
  embedding of a diffusers class declared a plain weight (`PlanPolicy.plain_weights`);
- **recipes**: each bundled recipe of a layout (`recipes.load_recipe` by its name) is what ``--format`` picks for
  an example of that layout (`read.detect.recipe_for_format`) and plans on it (`plan.make_plan`); another example
  of the layout it does not plan on refuses it in an `InputError` carrying a reason the family states
  (`Family.why_no`); a curated recipe (``recipes/``) plans on an example of the layout its name begins with. A
  format a layout has no bundled recipe of has a stated reason (`recipes.layout_formats`), which asking for that
  recipe gives (`recipes.derived_recipe`); ``--format`` refuses it naming the layout (and the family's own reason,
  where it has one); a recipe of that format is planned or refused in an `InputError`, never a crash, and refused
  with the family's reason where the family has no such files (or none from a diffusers-named model).

The family files (tests/models/test_<family>.py) hold what is one family's own: its oracles (diffusers' converters,
ComfyUI's detection and modules, in tests/oracles), its recipes' splits, the formats through the command line.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from functools import cache
from pathlib import Path

import pytest
import torch

from quantize.errors import InputError
from quantize.formats import FORMAT_INFO
from quantize.models import (
    FAMILIES,
    component_family,
    family_of,
    get_family,
    own_names,
    runnable_names,
    same_but_size_one_dims,
)
from quantize.models.examples import diffusers_example, examples_of
from quantize.plan import make_plan
from quantize.read.checkpoint import open_component
from quantize.read.detect import detect_layouts, recipe_for_format
from quantize.read.files import config_class
from quantize.read.source import under_own_names
from quantize.recipes import (
    curated_recipes,
    default_recipes,
    derived_names,
    derived_recipe,
    layout_formats,
    layout_policies,
    load_recipe,
)
from tests.conftest import read_json, run_cli


def _recipes(family: str) -> dict[str, dict[str, str]]:
    """Layout -> format -> bundled recipe, of the family's layouts."""
    return {layout: default_recipes()[layout] for layout in get_family(family).policies}


#: layouts with bundled recipes that no example of the family's `Examples` writes: (family, layout) -> the example
#: layout it is derived from and the folder each of that example's models goes to, built as the family's diffusers
#: class (`models.examples.diffusers_example`): Wan's diffusers pipelines, one transformer or the A14B pair
DERIVED = {
    ("wan", "wan-diffusers"): ("t2v", ("transformer",)),
    ("wan", "wan2.2-a14b-diffusers"): ("a14b", ("transformer", "transformer_2")),
}


# -- the examples, each written once per session ---------------------------------------------------------------


def _example_cases() -> list:
    return [
        pytest.param(f.name, layout, id=f"{f.name}-{layout}")
        for f in FAMILIES
        for layout in examples_of(f).layouts
    ]


def _derived_cases() -> list:
    return [pytest.param(family, layout, id=f"{family}-{layout}") for family, layout in DERIVED]


@pytest.fixture(scope="session")
def example(tmp_path_factory):
    """example(family, layout) -> (the folder, what `quantize example` printed), each written once for the whole
    run (xdist's workers share the folders, each written under a lock by the first that asks): the family's first
    layout by `quantize example --family F` alone (its defaults: that layout, the default preset), the others by
    `examples.write_example` at that preset (the models declared once: LTX-2's diffusers ones are built from
    diffusers' class); a layout of `DERIVED` (named by its detected layout) from its release's example."""
    from quantize.examples import write_example

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp("contract")
    else:  # the run's own temporary folder, above each worker's
        root = tmp_path_factory.getbasetemp().parent / "family-contract"
        root.mkdir(exist_ok=True)
    made: dict[tuple[str, str], tuple[Path, str]] = {}

    def get(family: str, layout: str) -> tuple[Path, str]:
        if (family, layout) not in made:
            out, done = root / family / layout, root / family / f"{layout}.done"
            out.parent.mkdir(exist_ok=True)
            with open(root / family / f"{layout}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not done.exists():
                    examples = examples_of(family)
                    if layout == examples.layouts[0]:
                        said = run_cli("example", out, "--family", family, check=True).stdout
                    else:
                        release = DERIVED[family, layout][0] if (family, layout) in DERIVED else layout
                        models = _models(family, layout)
                        write_example(out, examples.default_preset, release, family=family, models=models)
                        said = ""
                    done.write_text(said)
            made[family, layout] = out, done.read_text()
        return made[family, layout]

    return get


def _derived(family: str, layout: str):
    fam, (release, folders) = get_family(family), DERIVED[family, layout]
    models = examples_of(fam).models(examples_of(fam).default_preset, release)
    assert len(models) == len(folders)
    return [
        dataclasses.replace(diffusers_example(fam, m.tensors, m.config), component=folder)
        for m, folder in zip(models, folders, strict=True)
    ]


@cache
def _models(family: str, layout: str):
    """The models the family's examples declare for an example layout (or a `DERIVED` one), at the default preset."""
    if (family, layout) in DERIVED:
        return _derived(family, layout)
    examples = examples_of(family)
    return examples.models(examples.default_preset, layout)


def _read_as(names: list[str]) -> list[str]:
    """A model's tensor names as the tool reads them: a release's other naming under its family's own
    (`Family.aliases`: Wan-Animate-2's in-context wrapper, read under diffusers' names)."""
    renamed = own_names(names, "example")
    return names if renamed is None else [renamed[n] for n in names]


_DETECTED: dict[Path, list] = {}


def _detected(example, family: str, layout: str):
    """The one layout the example of `layout` is detected as (detected once per folder)."""
    src, _ = example(family, layout)
    if src not in _DETECTED:
        _DETECTED[src] = detect_layouts(src)
    found = _DETECTED[src]
    assert len(found) == 1, f"{family} {layout}: detected as {[(lay.name, lay.family) for lay in found]}"
    return found[0]


# -- the registry: every layout with recipes has an example -----------------------------------------------------


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_every_layout_the_family_has_recipes_for_is_an_examples_and_every_example_is_of_one(example, family):
    fam = get_family(family)
    detected = {_detected(example, family, lay).name for lay in examples_of(fam).layouts}
    detected |= {lay for fam_name, lay in DERIVED if fam_name == family}
    missing = sorted(set(_recipes(family)) - detected)
    assert not missing, (
        f"layouts with bundled recipes and no example (add one, or derive it in DERIVED): {missing}"
    )
    assert detected <= set(_recipes(family)), "an example of a layout with no bundled recipes"


# -- the example builds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "layout"), _example_cases())
def test_the_example_is_written_by_the_cli_and_reopens_as_declared(example, family, layout):
    src, stdout = example(family, layout)
    examples = examples_of(family)
    if layout == examples.layouts[0]:  # what `quantize example --family F` writes, and says
        assert (
            f"wrote a {examples.default_preset} {get_family(family).title}-shaped {layout} checkpoint"
            in stdout
        )
    assert read_json(src / "example.json") == {
        "family": family,
        "preset": examples.default_preset,
        "layout": layout,
    }
    for model in _models(family, layout):
        comp = open_component(src, model.component)
        fixed = {name: (len(data),) for name, data in (model.fixed or {}).items()}
        assert {n: tuple(t.shape) for n, t in comp.tensors.items()} == dict(model.tensors) | fixed
        assert (comp.config is None) == (model.config is None)
        if model.config is not None:
            assert comp.config == model.config
    for rel in examples.files(layout):
        assert (src / rel).is_file(), rel


# -- detection -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "layout"), _example_cases() + _derived_cases())
def test_the_example_is_one_layout_of_its_family_and_each_model_is_the_familys_alone(example, family, layout):
    fam = get_family(family)
    found = _detected(example, family, layout)
    assert found.family == family and found.name in _recipes(family), found
    src, _ = example(family, layout)
    beside, models = fam.plan.beside, _models(family, layout)
    # a text encoder in its pipeline folder is told as one (`--format` takes the transformer's recipe beside it)
    assert found.encoder == any(m.component == fam.folders.encoder for m in models), found
    for model in models:
        names = _read_as([n for n, _ in model.tensors])
        cls = config_class(model.config)
        if beside is not None and cls == beside.diffusers_class:
            continue  # a pipeline's model beside the family's (LTX-2's connectors): no family's own
        if model.component != "." and model.config is not None:
            # its own folder, alone, is a layout of the family
            (alone,) = detect_layouts(src / model.component)
            assert (alone.family, alone.encoder) == (family, False), alone
            assert alone.name in _recipes(family), alone
        owner = component_family(under_own_names(open_component(src, model.component)))
        told_by_config = any(k in (model.config or {}) for k in fam.folders.release_config_keys)
        if fam.naming(names) is None and told_by_config:
            # a release told by its config alone (SkyReels-V2's T2V: Wan's model and names): planned as the family
            # its class and names give, in the same naming
            assert owner is not None and owner.naming(names) == fam.detection.marks_naming(names), owner
            continue
        assert owner is fam, model.component
        # asked before any other family that would claim it too (Qwen2.5-VL's file holds Qwen2.5-VL-text's model)
        assert [f for f in FAMILIES if f.owns(cls, names)][0] is fam, model.component
        if cls in (fam.diffusers_class, *fam.native_classes) and cls not in fam.detection.shared_classes:
            assert family_of(cls, []) is fam, cls
        if fam.naming(names) is not None:
            assert family_of(None, names) is fam, model.component


# -- names, both ways -----------------------------------------------------------------------------------------


def _table(fam, model):
    """The name table of `model`: the family's, or that of the model beside it in a pipeline (`PlanPolicy.beside`)."""
    beside = fam.plan.beside
    if beside is not None and config_class(model.config) == beside.diffusers_class:
        return beside.names
    return fam.names


@pytest.mark.parametrize(
    ("family", "layout"),
    [p for p in _example_cases() + _derived_cases() if get_family(p.values[0]).names is not None],
)
def test_each_name_leads_back_to_itself_through_the_other_naming(family, layout):
    fam = get_family(family)
    for model in _models(family, layout):
        table = _table(fam, model)
        names = [n for n in _read_as([n for n, _ in model.tensors]) if not fam.carried(n)]
        naming = fam.detection.marks_naming(names)
        if table is not fam.names:  # a model beside the family's: its table is read native-wards
            naming = "diffusers"
        assert naming in ("native", "diffusers"), (model.component, naming)
        # the family's own reading of its table (HunyuanVideo 1.5 reads the release's q/k/v apart), or the other model's
        to_diffusers, to_native = (
            (fam.diffusers_name, fam.native_name) if table is fam.names else (table.diffusers, table.native)
        )
        there, back = (to_diffusers, to_native) if naming == "native" else (to_native, to_diffusers)
        unnamed = []
        for name in names:
            other = there(name)
            if other is None:
                stack = table.native_stack(name) if naming == "native" else None
                into = table.stacked_into(name) if naming == "diffusers" else None
                if stack is not None:  # a native fused tensor: each of its parts stacks into it again
                    assert all(table.stacked_into(part) == name for part, _, _ in stack), name
                elif into is not None:  # a diffusers tensor one native tensor stacks with others
                    assert name in {part for part, _, _ in table.native_stack(into)}, name
                else:
                    unnamed.append(name)
                continue
            returned = back(other)
            if returned is None and naming == "native":
                # stored apart, written stacked (HunyuanVideo 1.5's release: q, k and v; ComfyUI's names: qkv)
                into = table.stacked_into(other)
                assert into is not None, (name, other)
                assert other in {p for p, _, _ in table.native_stack(into)}, (name, other)
            else:
                assert returned == name, (name, other, returned)
        if unnamed:
            # what the table has no name for is a variant's layer no diffusers class has: refused by name
            assert naming == "native", (model.component, unnamed[:3])
            with pytest.raises(InputError, match="has no counterpart in diffusers"):
                runnable_names(fam, names, Path(model.component))


# -- the class, built with every tensor in place ------------------------------------------------------------------


@pytest.mark.parametrize(("family", "layout"), _example_cases() + _derived_cases())
def test_each_model_builds_as_its_class_with_every_parameter_a_tensor_of_the_checkpoint(
    example, family, layout
):
    from quantize.run.forward import StreamedModel, runnable, whole_then_cut

    fam = get_family(family)
    src, _ = example(family, layout)
    lay = _detected(example, family, layout)
    plan = make_plan(src, load_recipe(_recipes(family)[lay.name]["fp8_channel"]).recipe)
    for cp in plan.components:
        names = list(cp.component.tensors)
        unnamed = (
            fam.names is not None
            and fam.detection.marks_naming(names) == "native"
            and [
                n
                for n in names
                if not fam.carried(n) and fam.diffusers_name(n) is None and fam.names.native_stack(n) is None
            ]
        )
        if unnamed:
            # a variant no diffusers class implements (LingBot-World's camera layers): refused by name
            with pytest.raises(InputError, match=rf"tensor '{unnamed[0]}' has no counterpart"):
                runnable(cp)
            continue
        run = runnable(cp)
        # built, it refuses a parameter no tensor fills, or a tensor that is no parameter
        model = StreamedModel(run).model
        # a checkpoint may store a persistent buffer of the class (Gemma 4's layer scalars)
        params = {**dict(model.named_buffers()), **dict(model.named_parameters())}
        weight = whole_then_cut(run, lambda tp: torch.empty(tp.info.shape, device="meta"))
        for name, param in fam.parameter_names(run.parameters).items():
            got, want = weight(name).shape, params[param].shape
            assert got == want or same_but_size_one_dims(got, want), (name, got, want)
        if fam.detection.library == "diffusers":
            # an nn.Embedding's weight is 2-D but no Linear: a recipe targeting it would make a file its runtimes
            # cannot run (the class looks rows up in it), so the family declares it, in either naming, and a plan
            # refuses it by name (`PlanPolicy.plain_weights`)
            embeddings = [
                f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)
            ]
            assert all(fam.plain_weight(n) for n in embeddings), embeddings
            assert all(fam.plain_weight(fam.native_name(n)) for n in embeddings if fam.native_name(n)), (
                embeddings
            )


# -- recipes ----------------------------------------------------------------------------------------------------


def _recipe_cases() -> list:
    return [
        pytest.param(f.name, layout, fmt, recipe, id=recipe)
        for f in FAMILIES
        for layout, by_format in _recipes(f.name).items()
        for fmt, recipe in by_format.items()
    ]


def _missing_cases() -> list:
    return [
        pytest.param(f.name, layout, fmt, id=f"{layout}-{fmt}")
        for f in FAMILIES
        for layout in f.policies
        for fmt in layout_formats(layout)
        if fmt not in default_recipes()[layout]
    ]


def _curated_cases() -> list:
    """(curated recipe, the layout its name begins with: the longest layout that begins it)."""
    layouts = sorted(default_recipes(), key=len, reverse=True)
    curated = sorted(n.removesuffix(".yaml") for n in curated_recipes())
    return [
        pytest.param(name, next((lay for lay in layouts if name.startswith(f"{lay}-")), None), id=name)
        for name in curated
        if name not in derived_names()
    ]


def _examples_of(example, family: str, layout: str) -> dict[str, Path]:
    """Every example of `family` detected as `layout`: its example layout (or `DERIVED` layout) -> its folder."""
    found = {layout: example(family, layout)[0]} if (family, layout) in DERIVED else {}
    for lay in examples_of(family).layouts:
        if _detected(example, family, lay).name == layout:
            found[lay] = example(family, lay)[0]
    assert found, f"{family}: no example of layout {layout}"
    return found


def _family_reasons(fam, fmt: str) -> list[str]:
    """The reasons the family states for having no `fmt` output (`Family.why_no`), as a format of its names role:
    the words its refusals carry (no GGUF architecture; no runtime that reads them; not from diffusers' names)."""
    why = fam.why_no(FORMAT_INFO[fmt], FORMAT_INFO[fmt].names != "source")
    p = fam.plan
    return [r for r in (p.no_gguf_why, p.unread_why, p.diffusers_not_native_why) if why and r and r in why]


@pytest.mark.parametrize(("family", "layout", "fmt", "recipe"), _recipe_cases())
def test_each_bundled_recipe_is_the_formats_default_for_its_layout_and_plans_on_its_example(
    example, family, layout, fmt, recipe
):
    fam = get_family(family)
    loaded = load_recipe(recipe).recipe
    assert loaded.format == fmt and loaded.name == recipe
    planned, refused = 0, []
    for src in _examples_of(example, family, layout).values():
        chosen, lay = recipe_for_format(src, fmt)
        assert (chosen, lay.name, lay.family) == (recipe, layout, family)
        try:
            plan = make_plan(src, loaded)
        except InputError as e:
            refused.append(str(e))
            continue
        assert any(t.quantize for cp in plan.components for t in cp.tensors), src
        planned += 1
    assert planned, f"{recipe} plans on no example of {layout}: {refused}"
    for message in refused:  # another example of the layout (LTX-2's transformer without its connectors)
        assert any(r in message for r in _family_reasons(fam, fmt)), message


@pytest.mark.parametrize(("name", "layout"), _curated_cases())
def test_a_curated_recipe_plans_on_an_example_of_the_layout_its_name_begins_with(example, name, layout):
    assert layout is not None, f"{name}: its name begins with no layout's"
    family = layout_policies()[layout][0].name
    recipe = load_recipe(name).recipe
    for src in _examples_of(example, family, layout).values():
        assert any(t.quantize for cp in make_plan(src, recipe).components for t in cp.tensors), src


@pytest.mark.parametrize(("family", "layout", "fmt"), _missing_cases())
def test_a_format_a_layout_has_no_recipe_of_is_refused_saying_why(example, family, layout, fmt):
    fam, info = get_family(family), FORMAT_INFO[fmt]
    why = layout_formats(layout)[fmt]
    assert why, f"{layout} has no bundled {fmt} recipe and says not why"
    with pytest.raises(InputError, match="has no bundled") as refused:
        derived_recipe(layout, fmt)
    assert why in str(refused.value)
    family_why = fam.why_no(info, info.names != "source")
    # a recipe of that format, as a user would write it: the layout's own targets
    base = load_recipe(default_recipes()[layout]["fp8_channel"]).recipe
    donor = next(load_recipe(names[fmt]).recipe for names in default_recipes().values() if fmt in names)
    recipe = type(base).model_validate(
        base.model_dump() | {"format": fmt, "type": donor.type, "types": {}, "name": f"{base.name}-as-{fmt}"}
    )
    for lay, src in _examples_of(example, family, layout).items():
        with pytest.raises(InputError, match=f"no bundled {fmt} recipe for {layout}") as refused:
            recipe_for_format(src, fmt)
        # the family's reason, or the layout's
        assert (family_why or why) in str(refused.value), str(refused.value)
        names = [n for m in _models(family, lay) for n, _ in m.tensors]
        # refused at plan time where the family has no such files, or none from a model in diffusers' names
        must = fam.why_no(info) is not None or (family_why is not None and fam.naming(names) == "diffusers")
        try:
            make_plan(src, recipe)
        except InputError as e:
            # the family's reason, or the first tensor it cannot write, named (Wan Animate's fused kv halves)
            said = [*_family_reasons(fam, fmt), *(f"'{n}'" for n in names)]
            assert not must or any(r in str(e) for r in said), str(e)
        else:
            assert not must, f"{recipe.name} plans on {src}, though {fam.title} says: {family_why}"
