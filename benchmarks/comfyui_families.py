#!/usr/bin/env python3
"""Every family's ComfyUI and GGUF files in the REAL ComfyUI and ComfyUI-GGUF, on the CPU: detection and loading.

    python3 benchmarks/comfyui_families.py COMFYUI_DIR COMFYUI_GGUF_DIR WORK_DIR [--families F,F] [--only REGEX]

`../shared/tools/comfyui_check.py` checks Wan (detection, keys, quantized layers, and a forward against bf16);
this runs its environment and its loading (`import_comfy`, `Runner.load`, `Runner.quantized_layers`, imported
from that file) over the other families, whose forwards ComfyUI conditions in family-specific ways. For each
family, example layout and native-named format (the ones ComfyUI reads: comfy_fp8, comfy_int8, comfy_nvfp4,
comfy_mxfp8, gguf):

  - `quantize example --family F --layout L` writes the source, `quantize convert --format FMT` its file (a plan-time
    refusal, exit 2, is reported as such and counts as passed when the family says why it has no such output (`Family.why_no`));
  - ComfyUI loads the file as its nodes do (Load Diffusion Model / Unet Loader (GGUF)) and must detect the
    family's model class (`EXPECTED`), log no missing / unexpected / left-over keys, and hold every layer the file
    stores quantized as a quantized tensor of the file's layout or GGML type, and no other;
  - a family whose small example ComfyUI-GGUF cannot build (`GGUF_AT_RELEASED_WIDTHS`: LTX-2, which ComfyUI builds
    at its defaults when no file metadata comes with the tensors, as none does from ComfyUI-GGUF) has its GGUF
    checked on an example at the released widths with a few blocks;
  - the bf16 source of a layout in native names (merged into one file) is loaded the same way, as a reference (REF:
    reported, not counted; HunyuanVideo 1.5's release keeps q, k and v apart and does not load as released): the
    example's dimensions are ones ComfyUI detects. Keys ComfyUI's model of the family has no place for (SkyReels-V2's fps
    conditioning: ComfyUI runs it as a plain Wan) are reported for the source too; a converted file passes when
    it adds none to the family's sources'. A diffusers-named source is not loaded (ComfyUI reads native names only).

Prints one line per case and a SUMMARY line. Exit 0: every case passed; 1: one failed; 2: set-up failed.
Not part of `make test` (ComfyUI is not on PyPI); run it on every change to a family's names or examples.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO.parent / "shared" / "tools" / "comfyui_check.py"

#: family -> example layouts to try -> the ComfyUI model classes (comfy/supported_models.py) that may detect it
EXPECTED = {
    "ltx2": {"*": {"LTXAV", "LTXV"}},
    "hunyuanvideo15": {"*": {"HunyuanVideo15"}},
    "minimax-h3": {"*": {"MiniMaxH3"}},
    "kandinsky5": {"*": {"Kandinsky5"}},
    "wan-vace": {"*": {"WAN21_Vace"}},
    "wan-animate": {"*": {"WAN22_Animate", "WAN_Animate2"}},
    "skyreels-v2": {"*": {"WAN21_T2V", "WAN21_I2V"}},
    "wan": {"ti2v": {"WAN22_T2V"}},
}
#: the prefix ComfyUI's loaders strip from a full checkpoint's diffusion model (comfy/model_detection.py
#: unet_prefix_from_state_dict)
UNET_PREFIX = "model.diffusion_model."
FORMATS = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "gguf"]
#: family -> (preset, blocks) of the example its GGUF file is checked on, where the family's small one cannot load
#: through ComfyUI-GGUF. Its Unet Loader hands ComfyUI no file metadata (nodes.py: load_diffusion_model_state_dict
#: without it), so ComfyUI builds LTX-2 at LTXAVModel's defaults, the 19B's widths, reading only the block count and
#: the head width off the tensors: the 19B's widths with 5 of its 48 blocks (7.5 GB of bf16), converted with the
#: bundled recipe's blocks kept as its first two and last two (the others quantized); for the layouts named (the
#: release, and a diffusers pipeline with its connectors/)
GGUF_AT_RELEASED_WIDTHS = {"ltx2": ("19b", 5, ("release", "pipeline"))}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("comfyui", type=Path)
    p.add_argument("comfyui_gguf", type=Path)
    p.add_argument("work", type=Path)
    p.add_argument("--quantize", default=str(REPO / ".venv" / "bin" / "quantize"))
    p.add_argument(
        "--families", default=None, help="comma-separated family names (default: every one in EXPECTED)"
    )
    p.add_argument("--only", default=None, help="regex on case ids")
    p.add_argument("--venv", type=Path, default=None)
    p.add_argument("--no-venv", action="store_true")
    a = p.parse_args()
    a.comfyui, a.comfyui_gguf, a.work = a.comfyui.resolve(), a.comfyui_gguf.resolve(), a.work.resolve()
    a.venv = (a.venv or a.work / "venv").resolve()
    a.min_sqnr = 0.0
    return a


def _check_module():
    spec = importlib.util.spec_from_file_location("comfyui_check", CHECK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _merged(folder: Path, out: Path) -> Path:
    """The bf16 source's tensors in one safetensors file (its own names) with its files' ``__metadata__`` (LTX-2's
    ``config``, which ComfyUI builds the model from: comfy/model_detection.py, the 'Lightricks ltxv' branch): what
    ComfyUI's loader is given."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    for f in sorted(folder.rglob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            tensors.update({k: h.get_tensor(k).contiguous() for k in h.keys()})
            metadata.update(h.metadata() or {})
    save_file(tensors, out, metadata=metadata or None)
    return out


def write_trimmed_example(family: str, preset: str, layout: str, blocks: int, dest: Path) -> None:
    """`quantize example --family F --preset P --layout L` with only the first `blocks` repeated blocks (run with
    our own environment's Python: the examples are built from diffusers' classes)."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_large_family import block_index, repeated_blocks

    from quantize.examples import write_random_checkpoint
    from quantize.models.examples import examples_of

    models = examples_of(family).models(preset, layout)
    prefix, _ = repeated_blocks([t for m in models for t in m.tensors])
    for i, m in enumerate(models):
        tensors = [
            (n, shape) for n, shape in m.tensors if (b := block_index(n, prefix)) is None or b < blocks
        ]
        config = (
            m.config if not m.config or "num_layers" not in m.config else {**m.config, "num_layers": blocks}
        )
        write_random_checkpoint(
            dest / m.component, tensors, dtype=torch.bfloat16, stem=m.stem, config=config, seed=i,
            metadata=_with_blocks(dict(m.metadata or {}), blocks),
        )  # fmt: skip


def _with_blocks(metadata: dict[str, str], blocks: int) -> dict[str, str]:
    """The release's metadata ``config`` (LTX-2's: ComfyUI reads its ``transformer`` section over what it counts,
    through a ComfyUI-GGUF that hands it over) saying the blocks the trimmed file has."""
    if "config" in metadata:
        config = json.loads(metadata["config"])
        if "num_layers" in config.get("transformer", {}):
            config["transformer"]["num_layers"] = blocks
            metadata["config"] = json.dumps(config, sort_keys=True)
    return metadata


def _released_widths_gguf(args, family: str, layout: str) -> tuple[Path, Path]:
    """The source (`GGUF_AT_RELEASED_WIDTHS`), and the family's bundled GGUF recipe for its release keeping the
    first two and the last two of the source's blocks where it keeps those of the whole model: (source, recipe)."""
    from quantize.read.detect import detect_layouts
    from quantize.recipes import bundled_text, default_recipes

    preset, blocks, _ = GGUF_AT_RELEASED_WIDTHS[family]
    src = args.work / "fam-src" / f"{family}-{layout}-{preset}-{blocks}-blocks"
    python = Path(args.quantize).parent / "python"
    argv = [str(python), __file__, "--write-example", family, preset, layout, str(blocks), str(src)]
    subprocess.run(argv, check=True)
    (found,) = [lay for lay in detect_layouts(src) if not lay.encoder]
    name = default_recipes()[found.name]["gguf"]
    text = bundled_text(name)
    ends = "|".join(str(b) for b in (0, 1, blocks - 2, blocks - 1))
    recipe = args.work / "fam-src" / f"{name}-{blocks}-blocks.yaml"
    recipe.write_text(re.sub(r"\(0\|1\|\d+\|\d+\)", f"({ends})", text, count=1))
    return src, recipe


def _names(folder: Path) -> list[str]:
    from safetensors import safe_open

    names = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            names += list(h.keys())
    return names


def _as_comfyui_names(model_config, layers: dict) -> dict:
    """The file's quantized layers under the names ComfyUI's model has for them: its model class renames some keys
    as it loads them (`process_unet_state_dict`: HunyuanVideo's ``img_attn_qkv`` is its ``img_attn.qkv``)."""
    renamed = model_config.process_unet_state_dict({f"{k}.weight": v for k, v in layers.items()})
    return {k.removesuffix(".weight"): v for k, v in renamed.items()}


def _case(
    runner,
    check,
    case_id: str,
    path: Path,
    expected: set[str],
    source_unexpected: frozenset | None = frozenset(),
) -> dict:
    """One file loaded as ComfyUI's node does. `source_unexpected`: the keys the family's bf16 sources left unused
    too (a pass allows those only); None: this is such a source, whose unused keys are reported, not failed."""
    r = dict(id=case_id, ok=False)
    runner.cap.records.clear()
    t0 = time.time()
    try:
        patcher = runner.load(case_id, path)
        m = patcher.model
        r["class"] = type(m.model_config).__name__
        logs = list(runner.cap.records)
        for key, mark in (
            ("missing", "unet missing"),
            ("unexpected", "unet unexpected"),
            ("leftover", "left over keys"),
        ):
            r[key] = sum((check._keys_in(x) for x in logs if x.startswith(mark)), [])
        want, found = runner.quantized_layers(patcher, path)
        # a checkpoint's layers under ComfyUI's unet prefix: its diffusion model holds them without it
        # (comfy/sd.py load_diffusion_model_state_dict strips `model.diffusion_model.`)
        want = {k.removeprefix(UNET_PREFIX): v for k, v in want.items()}
        want = _as_comfyui_names(m.model_config, want)
        r["q"] = f"{len(found)}/{len(want)}"
        r["q_mismatch"] = sorted(k for k in set(want) | set(found) if want.get(k) != found.get(k))
        r["layouts"] = sorted(set(found.values()))
        del patcher, m
    except Exception as e:  # noqa: BLE001
        r["error"] = f"{type(e).__name__}: {str(e).strip()[:400]} [{check.where(e, runner.roots)}]"
    r["secs"] = time.time() - t0
    runner.mm.unload_all_models()
    gc.collect()
    r["ok"] = (
        "error" not in r
        and r["class"] in expected
        and not r["missing"]
        and (source_unexpected is None or not set(r["unexpected"]) - source_unexpected)
        and not r["leftover"]
        and not r["q_mismatch"]
    )
    return r


def _line(r: dict) -> str:
    s = f"{'REF' if r.get('ref') else 'PASS' if r['ok'] else 'FAIL':4} {r['id']:58} "
    if "refused" in r:
        return s + f"refused at plan time: {r['refused']}"
    if r.get("class"):
        s += f"{r['class']} missing {len(r['missing'])} unexpected {len(r['unexpected'])} leftover {len(r['leftover'])} "
        s += f"quant {r['q']} {','.join(r['layouts']) or '-'} "
    if "error" in r:
        s += f"ERROR {r['error']}"
    for k in ("missing", "unexpected", "leftover", "q_mismatch"):
        if r.get(k):
            s += f"\n       {k}: {r[k][:8]}"
    return s.rstrip()


def main() -> int:
    if sys.argv[1:2] == ["--write-example"]:  # FAMILY PRESET LAYOUT BLOCKS DEST, in our own environment
        family, preset, layout, blocks, dest = sys.argv[2:]
        sys.path.insert(0, str(REPO))
        write_trimmed_example(family, preset, layout, int(blocks), Path(dest))
        return 0
    args = parse_args()
    sys.path.insert(0, str(REPO))
    check = _check_module()
    if not args.no_venv and os.path.realpath(sys.prefix) != os.path.realpath(args.venv):
        py = check.ensure_venv(args)
        os.execv(
            str(py),
            [str(py), os.path.abspath(__file__), *sys.argv[1:], "--no-venv", "--venv", str(args.venv)],
        )
    for sub in ("fam-src", "fam-out", "fam-ref", "models", "logs"):
        shutil.rmtree(args.work / sub, ignore_errors=True)
        (args.work / sub).mkdir(parents=True)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    mm, folder_paths, nodes, gg = check.import_comfy(args)
    runner = check.Runner(args, mm, folder_paths, nodes, gg)
    from quantize.formats import format_info
    from quantize.models import get_family
    from quantize.models.examples import examples_of

    print(
        f"ComfyUI {check.tree_rev(args.comfyui)}, ComfyUI-GGUF {check.tree_rev(args.comfyui_gguf)}",
        flush=True,
    )
    only = re.compile(args.only) if args.only else None
    families = args.families.split(",") if args.families else list(EXPECTED)
    results = []
    source_unexpected: dict[
        str, frozenset
    ] = {}  # family -> keys ComfyUI found no place for in its bf16 source
    for family in families:
        by_layout = EXPECTED[family]
        fam = get_family(family)
        layouts = [lay for lay in examples_of(fam).layouts if lay in by_layout] or (
            list(examples_of(fam).layouts) if "*" in by_layout else []
        )
        for layout in layouts:
            expected = by_layout.get(layout, by_layout.get("*", set()))
            src = args.work / "fam-src" / f"{family}-{layout}"
            p = subprocess.run(
                [args.quantize, "example", str(src), "--family", family, "--layout", layout],
                capture_output=True,
                text=True,
            )
            if p.returncode:
                r = dict(
                    id=f"{family}/{layout}/example", ok=False, error=(p.stdout + p.stderr).strip()[-300:]
                )
                results.append(r)
                print(_line(r), flush=True)
                continue
            natives = [c for c in sorted({f.parent for f in src.rglob("*.safetensors")})]
            if all(fam.naming(_names(comp)) != "native" for comp in natives):
                natives = []  # diffusers names: ComfyUI detects no model in them; only our output is loaded
            for comp in natives:
                rel = comp.relative_to(src).as_posix() or "."
                cid = f"{family}/{layout}/{rel}/bf16-source"
                if only and not only.search(cid):
                    continue
                ref = _merged(
                    comp, args.work / "fam-ref" / f"{family}-{layout}-{rel.replace('/', '_')}.safetensors"
                )
                r = _case(
                    runner, check, cid, ref, expected, source_unexpected=None
                )  # the reference: reported, neither passed nor failed (HunyuanVideo 1.5's release keeps q, k and
                # v apart, which ComfyUI loads fused: it does not load as released, its conversions do)
                r["ref"] = True
                source_unexpected[family] = source_unexpected.get(family, frozenset()) | set(
                    r.get("unexpected", ())
                )
                results.append(r)
                print(_line(r), flush=True)
            for fmt in FORMATS:
                cid = f"{family}/{layout}/{fmt}"
                if only and not only.search(cid):
                    continue
                out = args.work / "fam-out" / f"{family}-{layout}-{fmt}"
                how = ["--format", fmt]
                source = src
                if fmt == "gguf" and layout in GGUF_AT_RELEASED_WIDTHS.get(family, (0, 0, ()))[2]:
                    source, recipe = _released_widths_gguf(args, family, layout)
                    how = ["--recipe", str(recipe)]
                p = subprocess.run(
                    [args.quantize, "convert", str(source), str(out), *how], capture_output=True, text=True
                )
                (args.work / "logs" / f"{family}-{layout}-{fmt}.log").write_text(p.stdout + p.stderr)
                if p.returncode:
                    text = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
                    refusal = (
                        p.returncode == 2
                        and fam.why_no(format_info(fmt), format_info(fmt).names != "source") is not None
                    )  # the family says why
                    r = dict(id=cid, ok=refusal, refused=text[0][:300])
                    results.append(r)
                    print(_line(r), flush=True)
                    continue
                files = sorted(out.rglob("*.gguf" if fmt == "gguf" else "*.safetensors"))
                for f in files:
                    r = _case(
                        runner,
                        check,
                        f"{cid}/{f.relative_to(out).as_posix()}",
                        f,
                        expected,
                        source_unexpected.get(family, frozenset()),
                    )
                    results.append(r)
                    print(_line(r), flush=True)
    cases = [r for r in results if not r.get("ref")]
    failed = [r for r in cases if not r["ok"]]
    refs = len(results) - len(cases)
    print(
        f"SUMMARY {len(cases) - len(failed)}/{len(cases)} passed ({refs} bf16 sources loaded as references)",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
