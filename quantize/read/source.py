"""SOURCE resolved once: a folder, a bare component folder or a Hub repo id becomes one `SourceFolder`.

`open_source(SOURCE, recipe)` is the one place a source is resolved: a Hub repo id is fetched (`hub`: only the
files the recipe needs), a recipe naming one component given that component's folder itself (a bare diffusers
``transformer/``) is fitted to convert it as the root, and each component is opened (headers only) and its
model family found, once. It also lists the folder's other files (`other_files`: what ``copy_other_files``
copies) and reads its own model card's metadata (`card_metadata`). The plan, the LoRA step, the card and the
forward pass are handed this object; none of them looks at the folder again.

>>> # src = open_source("Wan2.1-T2V-1.3B", load_recipe("wan-fp8").recipe); src.components, src.family(".").name
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..models import Family, component_family, own_names
from .files import (
    CARD_NAME,
    CONFIG_NAME,
    OUTPUT_ROOT_FILES,
    bare_model_class,
    config_class,
    confined_path,
    files_of_components,
    read_json_object,
)

if TYPE_CHECKING:
    from ..recipes import Recipe
    from .checkpoint import Component

__all__ = [
    "SourceFolder",
    "open_source",
    "nested_sources",
    "local_source",
    "fitted_components",
    "under_own_names",
]

#: folders of a source tree that are never its files (a clone's, a cache's)
SKIP_DIRS = frozenset({".git", ".cache", ".huggingface"})
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", re.S)


@dataclass
class SourceFolder:
    """A source as the conversion sees it: its local folder, how the manifest names it, its Hub repo id (None:
    a local folder), the recipe fitted to it (its components as they lie here), and each component opened once."""

    folder: Path
    name: str
    repo_id: str | None
    recipe: Recipe
    #: the recipe's components as it names them (`recipe.components` is as they lie here: ``["."]`` for a bare one)
    named: tuple[str, ...]
    #: SOURCE given as one checkpoint file of `folder` (its one model, at the root), or None: the folder
    file: str | None = None
    _opened: dict[str, Component] = field(default_factory=dict, repr=False)

    @property
    def path(self) -> Path:
        """The source as given: its one file, or its folder."""
        return self.folder if self.file is None else self.folder / self.file

    @property
    def components(self) -> list[str]:
        return list(self.recipe.components)

    @property
    def bare(self) -> bool:
        """Whether SOURCE is itself the one component folder the recipe names (converted as the root)."""
        return list(self.named) != self.components

    def fit(self, recipe: Recipe) -> Recipe:
        """`recipe` (naming the same components as the one this source was resolved under) as it applies here:
        a bare folder's one component is the root."""
        if list(recipe.components) == self.components:
            return recipe
        if list(recipe.components) == list(self.named):
            return recipe.model_copy(update={"components": self.components})
        raise InputError(
            f"{self.folder}: resolved for components {', '.join(self.named)}, not {', '.join(recipe.components)}"
        )

    def where(self, named: str) -> str:
        """Where the component the recipe names `named` lies here (``.`` for a bare folder)."""
        return "." if self.bare and named in self.named else named

    def component(self, rel: str) -> Component:
        """Component `rel` (as it lies here), opened on first use (headers, index, config.json) and kept."""
        if rel not in self._opened:
            from .checkpoint import open_component

            comp_dir = self.folder if rel == "." else self.folder / rel
            if rel != "." and not comp_dir.is_dir():
                hint = (
                    " (SOURCE itself holds safetensors: point at its parent folder)"
                    if any(self.folder.glob("*.safetensors"))
                    else ""
                )
                raise InputError(
                    f"{self.folder}: component folder {rel!r} named by the recipe is missing{hint}"
                )
            comp = under_own_names(open_component(self.folder, rel, self.file))
            self._opened[rel] = self._with_beside(comp) if self.file is None else comp
        return self._opened[rel]

    def _with_beside(self, comp: Component) -> Component:
        """`comp`, where the recipe writes native names and its family's native file holds a model the pipeline
        keeps beside a diffusers one (`PlanPolicy.beside`: LTX-2's ``connectors/``), with that model joined."""
        from ..formats import format_info

        family = component_family(comp)
        if family is None or family.plan.beside is None or format_info(self.recipe.format).names == "source":
            return comp
        return with_beside(comp, family) if family.naming(comp.tensors) == "diffusers" else comp

    def family(self, rel: str) -> Family | None:
        """The model family of component `rel` (by its config class, else its tensor names), or None."""
        comp = self.component(rel)
        return component_family(comp)

    def files(self) -> list[Path]:
        """The shards and indexes of the components (those that can be read), e.g. to start hashing them."""
        if self.file is not None:
            return [self.folder / self.file]
        return files_of_components(self.folder, self.components)

    def other_files(self, skip: Iterable[Path] = ()) -> list[Path]:
        """The files of the folder that no component owns, but the output's own root files and `skip` (a LoRA
        kept in the folder), in path order: what ``copy_other_files`` copies. `InputError` where one of them is the
        config.json of another model of a class being converted (the second expert, say): copied, it would be an
        unquantized model. A source given as one file has none: what lies beside it is no part of it."""
        components = [self.component(rel) for rel in self.components]
        if self.file is not None:
            return []
        owned = {f for c in components for f in c.own_files()}
        skipped = {Path(f).resolve() for f in skip}
        files = []
        for dirpath, dirnames, filenames in os.walk(self.folder):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path in owned or (Path(dirpath) == self.folder and name in OUTPUT_ROOT_FILES):
                    continue
                files.append(path)
        files = sorted(files, key=lambda p: p.relative_to(self.folder).as_posix())
        files = [f for f in files if f.resolve() not in skipped]
        self._refuse_unconverted_twin(components, files)
        return files

    def _refuse_unconverted_twin(self, components: list[Component], files: list[Path]) -> None:
        """Refuse to copy, unconverted, another model of the class being converted (the second expert, say)."""
        classes = {config_class(c.config) for c in components} - {None}
        for f in files:
            if f.name != CONFIG_NAME or not any(f.parent.glob("*.safetensors")):
                continue
            try:
                cls = config_class(read_json_object(f))
            except InputError:
                continue
            if cls in classes:
                rel = f.parent.relative_to(self.folder).as_posix()
                raise InputError(
                    f"{f.parent}: holds another {cls} that the recipe does not convert and would copy unquantized: "
                    f"add {rel!r} to the recipe's components (for two experts, use a two-expert recipe)"
                )

    def card_metadata(self) -> dict:
        """The YAML front matter of the source's own README.md (a Hub model card), or {} when there is none or it
        is unreadable: where the output's card finds the source's license."""
        import yaml

        try:
            text = (self.folder / CARD_NAME).read_text()
        except (OSError, UnicodeDecodeError):
            return {}
        match = _FRONT_MATTER.match(text)
        if not match:
            return {}
        try:
            data = yaml.safe_load(match.group(1))
        except (yaml.YAMLError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}


def under_own_names(comp: Component) -> Component:
    """`comp`, its tensors under their family's own names where the release stores them in another naming (Wan's
    T5 names in its umT5 ``.pth``: `models.own_names`), else as it is."""
    names = own_names(comp.tensors, str(comp.where))
    return comp if names is None else comp.renamed(names)


def with_beside(comp: Component, family: Family) -> Component:
    """A diffusers model with the model its pipeline keeps beside it for the family's native files
    (`PlanPolicy.beside`: LTX-2's ``connectors/`` beside ``transformer/``) joined: that model's tensors under the
    release's names (what the release carries: never converted), its files among the component's (its shards;
    its index and config.json, `Component.joined_files`: hashed into the manifest as the source's), and the
    release's file metadata made of the two configs (`Family.beside_metadata`); `comp` as it is where the pipeline
    has no such folder (the plan then refuses a native output, saying why)."""
    import dataclasses

    from .checkpoint import open_component

    beside = family.plan.beside
    folder = comp.dir.parent / beside.folder
    if not folder.is_dir():
        return comp
    other = open_component(folder.parent, folder.name)
    if config_class(other.config) != beside.diffusers_class:
        raise InputError(
            f"{folder / CONFIG_NAME}: names {config_class(other.config)!r}, not {beside.diffusers_class}: "
            f"{family.title}'s {beside.folder}/ beside {comp.dir.name}/ is its {beside.diffusers_class}"
        )
    tensors = dict(comp.tensors)
    for name, info in other.tensors.items():
        native = beside.names.native(name)
        if native is None:
            raise InputError(
                f"{info.file}: tensor {name!r} has no name in {family.title}'s release: not a "
                f"{beside.diffusers_class} tensor"
            )
        tensors[native] = dataclasses.replace(info, name=native)
    meta = family.beside_metadata(comp.config or {}, other.config, other.config_path)
    metadata = {**comp.metadata, other.shards[0]: {**other.metadata.get(other.shards[0], {}), **meta}}
    joined = (*comp.joined_files, *(f for f in other.own_files() if f not in other.shards))
    return dataclasses.replace(
        comp, shards=[*comp.shards, *other.shards], tensors=tensors, metadata=metadata, joined_files=joined
    )


def fitted_components(folder: Path, components: list[str]) -> list[str]:
    """The components of a recipe as they lie in `folder`: as named, or ``["."]`` when `folder` is itself the
    one model folder the recipe names (a bare diffusers ``transformer/``: `read.files.bare_model_class`), so that it
    is converted as that component, at the output's root.

    A recipe naming two components given one of them is refused, saying which folder to point at."""
    folder = Path(folder)
    if all(rel == "." or (folder / rel).is_dir() for rel in components):
        return components
    cls = bare_model_class(folder)
    if cls is None:
        return components  # the plan says which component folder is missing
    if len(components) > 1:
        where = (
            f"point at {folder.parent}"
            if folder.name in components
            else "point at the folder that holds them all"
        )
        raise InputError(
            f"{folder}: is one model's folder ({cls}), and the recipe converts {len(components)} "
            f"({', '.join(components)}): {where}, not at one of them"
        )
    return ["."]


def open_source(
    source: str | Path | SourceFolder, recipe: Recipe, choose=None, *, absolute: bool = False
) -> SourceFolder:
    """`source` (a folder, or a Hub repo id: then the files `choose(files)` returns are fetched, by default
    those `recipe` needs) resolved under `recipe`, its folder made absolute if asked; a `SourceFolder` is
    returned as it is."""
    if isinstance(source, SourceFolder):
        return source
    from .hub import recipe_files, resolve_source

    folder, name, repo_id = resolve_source(source, choose or recipe_files(recipe))
    return local_source(folder.absolute() if absolute else folder, recipe, name, repo_id)


def nested_sources(src: SourceFolder, recipes: Mapping[str, Recipe]) -> list[tuple[str, SourceFolder]]:
    """(folder, its source resolved under its recipe) of each nested conversion (folder of `src` -> recipe: a
    pipeline's text encoders beside its transformer), each converted as a bare model folder; `src` is a pipeline
    folder, local or fetched from the Hub with those folders (`hub.recipe_files`)."""
    if recipes and src.file is not None:
        raise InputError(f"{src.name}: nested conversions take a pipeline folder", parameters=("nested",))
    nested = []
    for rel, recipe in recipes.items():
        folder = confined_path(src.folder, rel, "nested")
        if rel in (".", *src.components) or not folder.is_dir():
            where = f"{src.name}/{rel}" if src.repo_id else str(folder)
            raise InputError(f"{where}: not a model folder of the pipeline beside what the recipe converts")
        nested.append((rel, local_source(folder, recipe, f"{src.name}/{rel}", src.repo_id)))
    return nested


def local_source(
    folder: Path, recipe: Recipe, name: str | None = None, repo_id: str | None = None
) -> SourceFolder:
    """The local folder `folder` resolved under `recipe` (no Hub lookup: a missing folder is an error); a
    checkpoint file (`read.files.CHECKPOINT_SUFFIXES`) is its one model, converted at the root under a recipe of
    one component."""
    folder = Path(folder)
    if folder.is_file():
        return _file_source(folder, recipe, name)
    if not folder.is_dir():
        raise InputError(f"{folder}: source directory not found")
    components = fitted_components(folder, list(recipe.components))
    fitted = (
        recipe if components == recipe.components else recipe.model_copy(update={"components": components})
    )
    name = name or folder.absolute().name
    if repo_id is None and components != list(recipe.components):  # a bare transformer/: name its model
        name = f"{folder.absolute().parent.name}/{folder.absolute().name}"
    return SourceFolder(folder, name, repo_id, fitted, tuple(recipe.components))


def _file_source(path: Path, recipe: Recipe, name: str | None) -> SourceFolder:
    """SOURCE given as one checkpoint file: its folder, the file alone read, the recipe's one component the root."""
    if len(recipe.components) != 1:
        raise InputError(
            f"{path}: one file is one model, and the recipe converts {len(recipe.components)} "
            f"({', '.join(recipe.components)}): give their folder"
        )
    fitted = recipe if recipe.components == ["."] else recipe.model_copy(update={"components": ["."]})
    return SourceFolder(path.parent, name or path.name, None, fitted, tuple(recipe.components), path.name)
