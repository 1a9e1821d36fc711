"""Writes the generated parts of README.md and docs/*.md from the registries; ``--check`` only compares.

    .venv/bin/python docs/make_docs.py           # rewrite every generated part in place
    .venv/bin/python docs/make_docs.py --check   # exit 1, naming each part that differs (tests/test_docs.py)

A generated part lies between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; everything outside the markers is
hand-written and left as it is. What each part is made of:

- README.md ``table:families``: every layout of every family (`quantize.models.FAMILIES`, each family's
  `default_recipes`: layout -> format -> bundled recipe) against every format (`quantize.formats.FORMAT_INFO`), and
  where each format's files load (`runs_in`, `diffusers_needs`);
- docs/cli.md ``generated:cli``: the help of `quantize` and of each of its commands (`quantize.cli.cli`);
- docs/formats.md ``generated:formats``: each format's row of `FORMAT_INFO` and its module's docstring;
- docs/families.md ``generated:families``: each family's layouts, recipes, GGUF architecture, what it keeps, its
  examples (`quantize.models.examples.EXAMPLES`) and its module's docstring;
- docs/recipes.md ``generated:recipe-fields``, ``generated:recipe-names``: the fields of `quantize.recipes.Recipe`
  and `Checks`, each format's recipe-name suffix, and the bundled recipes that are no layout's default.

The code is imported from this checkout (the folder above this file), not from whatever is installed.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: how a `FormatInfo.runs_in` entry is named in the docs (an entry not listed here is shown as it is)
RUNTIMES = {
    "loaders": "`loaders`",
    "comfyui": "ComfyUI",
    "comfyui-gguf": "ComfyUI-GGUF",
    "diffusers-gguf": "diffusers `from_single_file`",
}
#: how a `FormatInfo.container` is described
CONTAINERS = {
    "sharded_safetensors": "safetensors shards named as the source's, an index, config.json per component",
    "single_safetensors": "one `.safetensors` file per model",
    "gguf_file": "one `.gguf` file per model",
}
#: what a `FormatInfo.names` role means
NAMES = {
    "source": "the source's own names (diffusers' or the release's, as stored)",
    "native": "the family's native names (the original release's, which ComfyUI reads)",
    "gguf": "a GGUF reader's names (a DiT's native names; llama.cpp's for a text encoder)",
}
#: how a `FormatInfo.tokenizer` holds a text encoder's tokenizer in the file
TOKENIZERS = {
    "tensor": "in the file, as a tensor of the tokenizer file's bytes (what ComfyUI reads)",
    "key_values": "in the file, as `tokenizer.ggml.*` key-values (what ComfyUI-GGUF rebuilds it from)",
}
#: what each field of a recipe means (`quantize.recipes.Recipe`, `Checks`); a field missing here fails the render
RECIPE_FIELDS = {
    "format": "The format of every quantized tensor (one of the formats in [formats.md](formats.md)).",
    "targets": "Python regular expressions, `re.fullmatch`ed against module names (a tensor name without "
    "`.weight`): the Linears to quantize. Each must match in every component.",
    "name": "The recipe's name, which the manifest, the card and `inspect` show.",
    "description": "Free text: what is quantized and kept, and why.",
    "components": 'Subfolders holding a model to convert; `"."` is the source root.',
    "ignore": "Patterns of modules kept even where a target matches (`ignore` wins). Each must match.",
    "keep_dtype": "What every tensor that is not quantized is stored as: `source` (bit-exact), `bfloat16`, "
    "`float32`.",
    "copy_other_files": "Copy (hard-link where possible) every other file of the source: VAE, text encoder, "
    "tokenizer, scheduler, `model_index.json`.",
    "checks": "Thresholds `quantize verify` enforces (below).",
    "type": "For a format with types (gguf's GGML types, a comfy format's layouts): the type of every quantized "
    "tensor no `types` pattern matches.",
    "types": "Pattern -> type, first match wins: an `_M` mix (Q4_K with Q6_K), a mixed ComfyUI file (nvfp4 with "
    "mxfp8 layers), or `kept`.",
    "min_sqnr_db": "Each quantized tensor's SQNR (dB) against its source, at least.",
    "min_cosine": "Each quantized tensor's cosine similarity with its source, at least.",
    "min_forward_sqnr_db": "`verify --forward`: the output SQNR (dB) of one forward pass, at least (20 when "
    "not set).",
}


# --- markdown helpers -------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def docstring_md(doc: str | None) -> str:
    """A module docstring as Markdown: doctest examples dropped, indented blocks (key tables, formulas) fenced,
    list items and their continuation lines left as they are."""
    if not doc:
        return ""
    lines = inspect.cleandoc(doc).splitlines()
    kept: list[str] = []
    in_doctest = False
    for line in lines:
        if line.startswith(">>>"):
            in_doctest = True
        elif in_doctest and not line.strip():
            in_doctest = False
        if not in_doctest:
            kept.append(line)
    out: list[str] = []
    in_list = False
    fenced = False
    for line in kept:
        indented = line.startswith("  ") and line.strip()
        if not line.strip():
            in_list = False
        elif not indented:
            in_list = bool(re.match(r"(- |\* |\d+\. )", line))
        if indented and not in_list:
            if not fenced:
                if out and out[-1].strip():
                    out.append("")
                out.append("```text")
                fenced = True
            out.append(line.replace("``", ""))
            continue
        if fenced:
            out += ["```", ""] if line.strip() else ["```"]
            fenced = False
        out.append(line)
    if fenced:
        out.append("```")
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def type_words(annotation: object) -> str:
    """A field's type in a recipe's words."""
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if isinstance(annotation, type) and annotation.__module__ != "builtins":
        return "mapping"
    text = str(annotation).replace("typing.", "")
    text = re.sub(r"<class '(\w+)'>", r"\1", text)
    return text.replace("|", "\\|")


def default_words(field: object) -> str:
    """A field's default as YAML would spell it; "required" for a field without one."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if hasattr(value, "model_dump"):
        value = {k: v for k, v in value.model_dump().items() if v is not None}
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value!r}`".replace("'", '"')


# --- the registries ---------------------------------------------------------------------------------------------


def families():
    from quantize.models import FAMILIES

    return FAMILIES


def format_infos():
    from quantize.formats import FORMAT_INFO

    return FORMAT_INFO


def layout_recipes(family) -> dict[str, dict[str, str]]:
    """Layout -> format -> bundled recipe name, of one family: its `default_recipes`, or, where the recipes are
    derived from the families' policies, `quantize.recipes.default_recipes` over the layouts the family declares."""
    declared = getattr(family, "default_recipes", None)
    if declared:
        return {layout: dict(by_format) for layout, by_format in declared.items()}
    from quantize.recipes import default_recipes, layout_policies

    owner = layout_policies()
    return {
        layout: dict(by) for layout, by in default_recipes().items() if owner[layout][0].name == family.name
    }


def all_layout_recipes() -> dict[str, dict[str, str]]:
    """Layout -> format -> bundled recipe name, over every family."""
    return {layout: by for family in families() for layout, by in layout_recipes(family).items()}


def module_doc(path: str) -> str | None:
    """The docstring of the module at `path` (relative to the checkout), read without importing it (a format's
    module imports torch)."""
    return ast.get_docstring(ast.parse((ROOT / path).read_text()), clean=True)


def loads_in(info, short: bool) -> str:
    """Where a format's files load: its runtimes, and diffusers' `from_pretrained` where it can."""
    places = [RUNTIMES.get(r, f"`{r}`") for r in info.runs_in]
    if info.diffusers_needs is not None:
        places.insert(0, "`from_pretrained`" if short else f"`from_pretrained` (with {info.diffusers_needs})")
    return ", ".join(places)


# --- the generated parts ----------------------------------------------------------------------------------------


def families_table() -> str:
    """README's table: each family's layouts against every format, and where each format's files load."""
    infos = format_infos()
    head = "| family | layout | " + " | ".join(f"`{f}`" for f in infos) + " |"
    rule = "|---|---|" + ":-:|" * len(infos)
    rows = [
        head,
        rule,
        "| **loads in** | | " + " | ".join(loads_in(i, short=True) for i in infos.values()) + " |",
    ]
    for family in families():
        anchor = slug(f"`{family.name}`: {family.title}")
        for n, (layout, by_format) in enumerate(layout_recipes(family).items()):
            who = f"[{family.title}](docs/families.md#{anchor})" if n == 0 else ""
            cells = " | ".join("✓" if fmt in by_format else "–" for fmt in infos)
            rows.append(f"| {who} | `{layout}` | {cells} |")
    n_layouts = len(all_layout_recipes())
    legend = [
        "",
        f"{len(families())} families, {n_layouts} layouts, {len(infos)} formats. ✓: `quantize convert SOURCE OUT "
        "--format FORMAT` takes that layout's bundled recipe (`quantize recipes --for SOURCE` lists them);",
        "–: no bundled recipe (the family's page says why). `from_pretrained`: diffusers' (transformers' for a text "
        "encoder). The formats:",
        "",
    ]
    for info in infos.values():
        legend.append(f"- `{info.name}`: {info.words}; {CONTAINERS.get(info.container, info.container)}.")
    return "\n".join(rows + legend)


def cli_reference() -> str:
    """`quantize --help` and each command's help, as click prints them (110 columns)."""
    import click

    from quantize.cli import cli

    width = 110
    root = click.Context(cli, info_name="quantize", terminal_width=width, max_content_width=width)
    root.help_option_names = list((cli.context_settings or {}).get("help_option_names", ["--help"]))
    parts = ["## `quantize`", "", "```text", cli.get_help(root), "```"]
    for name in sorted(cli.commands):
        command = cli.commands[name]
        ctx = click.Context(
            command, info_name=name, parent=root, terminal_width=width, max_content_width=width
        )
        parts += ["", f"## `quantize {name}`", "", "```text", command.get_help(ctx), "```"]
    return "\n".join(parts)


def formats_reference() -> str:
    """Each format: its facts (`FORMAT_INFO`) and its module's docstring."""
    parts: list[str] = []
    for info in format_infos().values():
        path = f"quantize/formats/{info.module}.py"
        types = ", ".join(f"`{t}`" for t in info.options.TYPES) or "none (one encoding)"
        facts = [
            ("what it is", info.words),
            ("files", CONTAINERS.get(info.container, info.container)),
            ("key names", NAMES.get(info.names, info.names)),
            ("config.json `quant_method`", f"`{info.quant_method}`"),
            ("layout of", info.layout_library),
            ("numerics follow", ", ".join(info.libraries) or "the reference below"),
            ("recipe `type`", types),
            ("loads in", loads_in(info, short=False)),
        ]
        if getattr(info, "recipe_suffix", ""):
            kind = f" (`type: {info.recipe_type}`)" if getattr(info, "recipe_type", None) else ""
            facts.append(("bundled recipes", f"`<layout>-{info.recipe_suffix}`{kind}"))
        if getattr(info, "checks", ()):
            facts.append(("their `checks`", ", ".join(f"`{k}: {v}`" for k, v in info.checks)))
        if getattr(info, "block_scaled", False):
            facts.append(
                ("scales", "each block of a row's inputs: a layout's `block_targets` are quantized too")
            )
        if getattr(info, "sensitive_type", None):
            facts.append(("sensitive layers", f"in `{info.sensitive_type}` in the bundled recipes"))
        if info.card_note:
            facts.append(("note", info.card_note))
        if info.tokenizer:
            facts.append(("a text encoder's tokenizer", TOKENIZERS.get(info.tokenizer, info.tokenizer)))
        if info.fixes_kept_dtypes:
            facts.append(("kept tensors", "the format decides their dtype (`keep_dtype` must be `source`)"))
        parts += [f"## `{info.name}`", "", "| | |", "|---|---|"]
        parts += [f"| {k} | {v} |" for k, v in facts]
        parts += ["", f"From `{path}`:", "", docstring_md(module_doc(path)), ""]
    return "\n".join(parts).rstrip()


def why_not(family, layout: str, fmt: str) -> str:
    """Why `layout` (of `family`) has no bundled recipe of `fmt`, in words ("" where nothing says why)."""
    try:
        from quantize.recipes import layout_formats
    except ImportError:  # recipes declared per family, not derived: the family says why
        return family.why_no(fmt) or ""
    return layout_formats(layout).get(fmt) or ""


def grouped_refusals(reasons: dict[str, str]) -> list[str]:
    """Format -> why not, as one line per reason: "no `a`, `b`: why" (the format's name dropped from the reason,
    since the formats are listed before it)."""
    by_why: dict[str, list[str]] = {}
    for fmt, why in reasons.items():
        by_why.setdefault(why.replace(f" {fmt} ", " "), []).append(f"`{fmt}`")
    return [f"no {', '.join(formats)}" + (f": {why}" if why else "") for why, formats in by_why.items()]


def layout_lines(family, layout: str, by_format: dict[str, str]) -> list[str]:
    """One layout of a family: what a source of it is, its formats, what its recipes quantize and keep, and why."""
    infos = format_infos()
    policy = getattr(family, "policies", {}).get(layout)
    formats = "every format" if len(by_format) == len(infos) else ", ".join(f"`{f}`" for f in by_format)
    out = [
        f"- **`{layout}`**" + (f": {policy.what}" if policy is not None else "") + f". Formats: {formats}."
    ]
    if policy is not None:
        block = [f"`{n}`" for n, i in infos.items() if getattr(i, "block_scaled", False) and n in by_format]
        out.append(f"  - quantized: {policy.quantized}")
        if policy.block_targets is not None and policy.block_why and block:
            out.append(
                f"  - in the formats with a scale per block of inputs ({', '.join(block)}): {policy.block_why}"
            )
        for n, i in infos.items():
            kind = getattr(i, "sensitive_type", None)
            if kind and policy.sensitive and n in by_format:
                out.append(f"  - `{n}` puts in {kind}: {policy.sensitive_why}")
        for fmt, own in policy.exceptions.items():
            out.append(f"  - `{fmt}`: {own.why}")
        out.append(f"  - kept: {policy.kept}")
        if policy.note:
            out.append(f"  - {policy.note}")
    reasons = {fmt: why_not(family, layout, fmt) for fmt in infos if fmt not in by_format}
    out += [f"  - {line}" for line in grouped_refusals(reasons)]
    return out


def families_reference() -> str:
    """Each family: its class, GGUF architecture, examples, each layout's formats and policy, its module docstring."""
    from quantize.models.examples import EXAMPLES

    parts: list[str] = []
    for family in families():
        path = type(family).__module__.replace(".", "/") + ".py"
        detection = family.detection
        parts += [f"## `{family.name}`: {family.title}", ""]
        parts.append(f"Runs as `{detection.diffusers_class}` ({detection.library}).")
        if family.plan.gguf_architecture:
            parts[-1] += f" GGUF architecture: `{family.plan.gguf_architecture}`."
        examples = EXAMPLES.get(family.name)
        if examples is not None:
            presets = ", ".join(f"`{p}`" for p in examples.presets)
            layouts = ", ".join(f"`{x}`" for x in examples.layouts)
            parts[-1] += (
                f" `quantize example --family {family.name}`: presets {presets} (default "
                f"`{examples.default_preset}`), layouts {layouts}."
            )
        parts += ["", "Layouts and their bundled recipes:", ""]
        for layout, by_format in layout_recipes(family).items():
            parts += layout_lines(family, layout, by_format)
        parts += ["", f"From `{path}`:", "", docstring_md(module_doc(path)), ""]
    return "\n".join(parts).rstrip()


def recipe_fields() -> str:
    """The fields of a recipe and of its `checks`."""
    from quantize.recipes import Checks, Recipe

    parts: list[str] = []
    for model, title in ((Recipe, "A recipe"), (Checks, "`checks`")):
        parts += [f"{title}:", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            if name not in RECIPE_FIELDS:
                raise SystemExit(f"docs/make_docs.py: say what recipe field {name!r} means in RECIPE_FIELDS")
            kind = type_words(field.annotation)
            parts.append(f"| `{name}` | {kind} | {default_words(field)} | {RECIPE_FIELDS[name]} |")
        parts.append("")
    return "\n".join(parts).rstrip()


def recipe_names() -> str:
    """Each format's recipe-name suffix, read off the defaults, and the bundled recipes no layout defaults to."""
    from quantize.recipes import bundled_recipes, parse_recipe

    defaults = all_layout_recipes()
    suffixes: dict[str, set[str]] = {}
    odd: list[str] = []
    for layout, by_format in defaults.items():
        for fmt, name in by_format.items():
            if name.startswith(f"{layout}-"):
                suffixes.setdefault(fmt, set()).add(name[len(layout) + 1 :])
            else:
                odd.append(f"`{name}` ({layout}, {fmt})")
    parts = ["| format | recipe name | layouts with one |", "|---|---|---:|"]
    for fmt in format_infos():
        names = " or ".join(f"`<layout>-{s}`" for s in sorted(suffixes.get(fmt, ()))) or "–"
        count = sum(fmt in by for by in defaults.values())
        parts.append(f"| `{fmt}` | {names} | {count} of {len(defaults)} |")
    if odd:
        parts += ["", "Named otherwise: " + ", ".join(odd) + "."]
    default_names = {n for by in defaults.values() for n in by.values()}
    others = {
        name: text
        for name, text in bundled_recipes().items()
        if name.removesuffix(".yaml") not in default_names
    }
    parts += [
        "",
        f"The other bundled recipes ({len(others)}), no layout's default: variants and mixes by name:",
        "",
    ]
    parts += ["| recipe | format | what it is |", "|---|---|---|"]
    for name, text in others.items():
        recipe = parse_recipe(text, name)
        what = " ".join(recipe.description.split())
        parts.append(f"| `{name.removesuffix('.yaml')}` | `{recipe.format}` | {what} |")
    return "\n".join(parts)


#: file (relative to the checkout) -> marker name -> what renders it
PARTS: dict[str, dict[str, Callable[[], str]]] = {
    "README.md": {"table:families": families_table},
    "docs/cli.md": {"generated:cli": cli_reference},
    "docs/formats.md": {"generated:formats": formats_reference},
    "docs/families.md": {"generated:families": families_reference},
    "docs/recipes.md": {"generated:recipe-fields": recipe_fields, "generated:recipe-names": recipe_names},
}


def replace_part(text: str, marker: str, body: str, where: str) -> str:
    """`text` with what lies between `marker`'s start and end lines replaced by `body`."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise SystemExit(f"{where}: needs one {start} ... {end} pair, in that order")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def rendered(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """File -> (its text now, its text with every generated part rendered)."""
    out = {}
    for rel, parts in PARTS.items():
        text = (root / rel).read_text()
        new = text
        for marker, render in parts.items():
            new = replace_part(new, marker, render(), rel)
        out[rel] = (text, new)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 naming each file that differs"
    )
    args = parser.parse_args(argv)
    stale = []
    for rel, (old, new) in rendered().items():
        if old == new:
            continue
        stale.append(rel)
        if not args.check:
            (ROOT / rel).write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run .venv/bin/python docs/make_docs.py", file=sys.stderr)
        return 1
    if not args.check:
        print(f"rewrote {', '.join(stale)}" if stale else "every generated part was up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
