"""How a checkpoint is laid out on disk: the names of its files, shard grouping, shard names, the index (used by
every writer), and which files form a component (used by every reader). Imports no torch."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import NamedTuple, TypeVar

from ..errors import InputError

__all__ = [
    "INDEX_SUFFIX",
    "CONFIG_NAME",
    "MANIFEST_NAME",
    "RECIPE_NAME",
    "CARD_NAME",
    "OUTPUT_ROOT_FILES",
    "SHARD_METADATA",
    "DEFAULT_MAX_SHARD_SIZE",
    "parse_size",
    "group_by_size",
    "shard_names",
    "index_name",
    "index_json",
    "ComponentFiles",
    "CHECKPOINT_SUFFIXES",
    "PTH_SUFFIX",
    "component_files",
    "files_of_components",
    "config_class",
    "component_class",
    "bare_model_class",
    "confined_path",
    "relative_path_problem",
    "inside_checkpoint",
    "no_duplicate_keys",
    "read_json_object",
]

INDEX_SUFFIX = ".safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit on a header
CONFIG_NAME = "config.json"
#: What a conversion writes at the output's root besides the models: its manifest, its recipe, its model card.
MANIFEST_NAME = "quantize_manifest.json"
RECIPE_NAME = "recipe.yaml"
CARD_NAME = "README.md"  # a Hub model card, as a source from the Hub has one
#: The output's own root files: a source's files of these names are never copied over them.
OUTPUT_ROOT_FILES = frozenset({CARD_NAME, MANIFEST_NAME, RECIPE_NAME})

#: `__metadata__` of every shard we write (what transformers and diffusers expect).
SHARD_METADATA = {"format": "pt"}

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int, what: str = "size") -> int:
    """'5GB' -> 5_000_000_000, '512MiB' -> 536_870_912, '1000' -> 1000 (bytes, at least 1)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        s = str(text).strip().upper().replace(" ", "")
        num = s.rstrip("KMGTIB")
        unit = s[len(num) :]
        try:
            value = float(num)
        except ValueError:
            value = math.nan
    if unit not in _SIZE_UNITS or not math.isfinite(value) or value * _SIZE_UNITS[unit] < 1:
        raise InputError(
            f"{what} {text!r}: expected a positive number of bytes with an optional unit such as 5GB or 512MiB"
        )
    return int(value * _SIZE_UNITS[unit])


T = TypeVar("T")
_SHARD_RE = re.compile(r"^(?P<stem>.+)-\d{5}-of-\d{5}\.safetensors$")


def group_by_size(items: Iterable[T], size: Callable[[T], int], max_bytes: int) -> list[list[T]]:
    """Items in order, a new group whenever the next one would push the current group past `max_bytes`."""
    groups: list[list[T]] = [[]]
    total = 0
    for item in items:
        n = size(item)
        if groups[-1] and total + n > max_bytes:
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += n
    return groups


def shard_names(stem: str, n: int, with_index: bool) -> list[str]:
    """``STEM.safetensors`` for one unindexed file, else ``STEM-0000i-of-0000n.safetensors``."""
    if n == 1 and not with_index:
        return [f"{stem}.safetensors"]
    return [f"{stem}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def index_name(stem: str) -> str:
    return f"{stem}{INDEX_SUFFIX}"


def index_json(weight_map: dict[str, str], total_size: int) -> str:
    """The ``*.safetensors.index.json`` text: total tensor bytes and key -> shard, keys sorted."""
    return (
        json.dumps(
            {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}, indent=2
        )
        + "\n"
    )


# --- reading: which files a component is made of (no tensor data, no torch) -----------------------


class ComponentFiles(NamedTuple):
    dir: Path
    index: Path | None
    stem: str  # shard name stem, e.g. "diffusion_pytorch_model"
    shards: list[Path]
    owner: dict[str, str] | None  # tensor -> shard file, from the index


#: the files one checkpoint file may be: safetensors, or a PyTorch zip checkpoint (read with torch's weights-only
#: loader, `read.pth`)
PTH_SUFFIX = ".pth"
CHECKPOINT_SUFFIXES = (".safetensors", PTH_SUFFIX)


def component_files(root: Path, rel: str = ".", file: str | None = None) -> ComponentFiles:
    """Which files make up the component `rel` of the checkpoint `root`, from the directory listing and the
    index alone (`checkpoint.open_component` then reads and checks the headers); with `file` (a source given as
    one file), that file of `root` alone.

    Raises `InputError` for a missing directory, several indexes, or shards that cannot be told apart.
    """
    if file is not None:
        return _one_file(Path(root), rel, file)
    comp_dir = root if rel == "." else confined_path(root, rel, f"component {rel!r}")
    if not comp_dir.is_dir():
        raise InputError(f"{comp_dir}: component directory not found")
    indexes = sorted(comp_dir.glob("*" + INDEX_SUFFIX))
    if len(indexes) > 1:
        names = ", ".join(p.name for p in indexes)
        raise InputError(f"{comp_dir}: more than one safetensors index ({names}); keep one")
    if indexes:
        shards, owner = _shards_from_index(comp_dir, indexes[0])
        return ComponentFiles(comp_dir, indexes[0], indexes[0].name[: -len(INDEX_SUFFIX)], shards, owner)
    shards, stem = _shards_without_index(comp_dir)
    return ComponentFiles(comp_dir, None, stem, shards, None)


def _one_file(root: Path, rel: str, file: str) -> ComponentFiles:
    """A checkpoint given as the one file `root / file`: the component at the root, that file its only shard."""
    path = root / file
    if rel != ".":
        raise InputError(f"{path}: one file is one model, at the root: the recipe names component {rel!r}")
    if not path.name.endswith(CHECKPOINT_SUFFIXES):
        raise InputError(
            f"{path}: not a checkpoint file ({' or '.join(CHECKPOINT_SUFFIXES)}): give that, or its model's folder"
        )
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return ComponentFiles(root, None, path.name.rsplit(".", 1)[0], [path], None)


def files_of_components(root: Path, components: list[str]) -> list[Path]:
    """The shards and indexes of `components` (those that can be read: `open_component` reports the others),
    e.g. to start hashing them before the conversion, and torch, start."""
    files: list[Path] = []
    for rel in components:
        try:
            found = component_files(Path(root), rel)
        except InputError:
            continue
        files += found.shards + ([found.index] if found.index else [])
    return files


def config_class(config: dict | None) -> str | None:
    """The model class a config.json names: diffusers' ``_class_name``, else the first of transformers'
    ``architectures`` (a text encoder's); None when it names none.

    >>> config_class({"_class_name": "SomeTransformer"}), config_class({"architectures": ["SomeEncoderModel"]})
    ('SomeTransformer', 'SomeEncoderModel')
    """
    config = config or {}
    cls = config.get("_class_name")
    if cls is None and isinstance(config.get("architectures"), list) and config["architectures"]:
        cls = config["architectures"][0]
    return cls if isinstance(cls, str) else None


def component_class(folder: Path) -> str | None:
    """The class `folder`'s config.json names (`config_class`), or None (no config, unreadable, not a model's)."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        return config_class(read_json_object(path))
    except InputError:
        return None


def bare_model_class(folder: Path) -> str | None:
    """The class of the one model `folder` itself holds when it is a pipeline's model folder given alone (a
    config.json naming a diffusers transformer class or, through ``architectures``, a transformers model: a
    pipeline's ``text_encoder/``; safetensors beside it), else None. A family's original release (a config class
    without "Transformer") holds its model at the root as it always did: not a bare folder."""
    folder = Path(folder)
    cls = component_class(folder)
    if cls is None or not any(folder.glob("*.safetensors")):
        return None
    transformers_model = "_class_name" not in read_json_object(folder / CONFIG_NAME)
    return cls if "Transformer" in cls or transformers_model else None


def _shards_without_index(comp_dir: Path) -> tuple[list[Path], str]:
    """One ``*.safetensors`` file, or one complete ``STEM-0000i-of-0000n`` set; anything else is ambiguous."""
    files = sorted(comp_dir.glob("*.safetensors"))
    pth = [] if files else sorted(comp_dir.glob(f"*{PTH_SUFFIX}"))
    if len(pth) == 1:  # a PyTorch checkpoint alone (`read.pth`)
        return pth, pth[0].name[: -len(PTH_SUFFIX)]
    if not files:
        raise InputError(f"{comp_dir}: no *.safetensors files and no {INDEX_SUFFIX} here")
    if len(files) == 1:
        m = _SHARD_RE.match(files[0].name)
        return files, m["stem"] if m else files[0].name[: -len(".safetensors")]
    m = _SHARD_RE.match(files[0].name)
    expected = (
        [f"{m['stem']}-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
        if m
        else []
    )
    if [f.name for f in files] != expected:
        names = ", ".join(f.name for f in files)
        raise InputError(
            f"{comp_dir}: several safetensors files and no {INDEX_SUFFIX} to say which form the model ({names}): "
            "add the index, or move the other files away"
        )
    return files, m["stem"]


def _shards_from_index(comp_dir: Path, index_path: Path) -> tuple[list[Path], dict[str, str]]:
    index = read_json_object(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index_path}: has no 'weight_map'")
    shards: list[Path] = []
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise InputError(f"{index_path}: tensor {name!r} maps to {file!r}, not a file name")
        path = confined_path(comp_dir, file, str(index_path))
        if path not in shards:
            if not path.is_file():
                raise InputError(f"{index_path}: names shard {file!r}, which does not exist")
            shards.append(path)
    return sorted(shards), {k: Path(v).as_posix() for k, v in weight_map.items()}


def read_json_object(path: Path) -> dict:
    """A JSON object from a file (an index, a config.json); duplicate keys, bad JSON or nesting too deep for the
    parser are one `InputError` naming the file."""
    try:
        data = json.loads(path.read_text(), object_pairs_hook=no_duplicate_keys)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{path}: not readable JSON ({e})") from None
    except RecursionError:
        raise InputError(f"{path}: not readable JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: must hold a JSON object, not {type(data).__name__}")
    return data


def relative_path_problem(relative: object) -> str | None:
    """Why `relative` is not a path inside a checkpoint (POSIX separators, no ``..``, not absolute), or None."""
    if not isinstance(relative, str) or not relative:
        return "is not a file name"
    if "\0" in relative or "\\" in relative:
        return "is not a POSIX relative path"
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts:
        return "leaves the checkpoint directory"
    return None


def inside_checkpoint(path: str) -> str:
    """`path` if it is a path inside a checkpoint, else `ValueError` saying why (a manifest field's validator)."""
    problem = relative_path_problem(path)
    if problem is not None:
        raise ValueError(f"path {path!r} {problem}")
    return path


def confined_path(root: Path, relative: str, what: str) -> Path:
    """`root / relative`, refusing absolute paths and paths that leave `root`."""
    problem = relative_path_problem(relative)
    if problem is not None:
        raise InputError(f"{what}: path {relative!r} {problem} ({root})")
    return root / relative


def no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object hook that refuses a key given twice (plain json keeps the last one silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out
