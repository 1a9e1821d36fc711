#!/usr/bin/env python3
"""Every family's ComfyUI and GGUF files in the REAL ComfyUI and ComfyUI-GGUF, on the CPU: detection and loading.

    python3 benchmarks/comfyui_families.py COMFYUI_DIR COMFYUI_GGUF_DIR WORK_DIR [--families F,F] [--only REGEX]

`../shared/tools/comfyui_check.py` checks Wan (detection, keys, quantized layers, and a forward against bf16);
this runs its environment and its loading (`import_comfy`, `Runner.load`, `Runner.quantized_layers`, imported
from that file) over the other families, whose forwards ComfyUI conditions in family-specific ways. For each
family, example layout and native-named format (the ones ComfyUI reads: comfy_fp8, comfy_int8, comfy_nvfp4,
comfy_mxfp8, comfy_w4a8, comfy_w4a4, gguf; `--formats` picks some):

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
import contextlib
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
    # ComfyUI builds WAN_Animate2 only from a file whose metadata says "animate2" (Wan-Animate-2's: `wan-animate2`);
    # Wan Animate's face adapter makes it "animate" (comfy/model_detection.py): the two kept apart
    "wan-animate": {"*": {"WAN22_Animate"}},
    # ComfyUI tells it from a Wan2.1 I2V by the file's metadata alone (its names are Wan's)
    "wan-animate2": {"*": {"WAN_Animate2"}},
    "skyreels-v2": {"*": {"WAN21_T2V", "WAN21_I2V"}},
    "wan-s2v": {"*": {"WAN22_S2V"}},
    "wan-humo": {"*": {"WAN21_HuMo"}},
    "wan-camera": {"camera-2.1": {"WAN21_Camera"}, "camera-2.2": {"WAN22_Camera"}},
    "wan-scail": {"scail": {"WAN21_SCAIL"}, "scail2": {"WAN21_SCAIL2"}},
    "wan-dancer": {"*": {"WAN22_WanDancer"}},
    "wan": {"ti2v": {"WAN22_T2V"}},
    "qwen-image": {"*": {"QwenImage"}},
}
#: the prefix ComfyUI's loaders strip from a full checkpoint's diffusion model (comfy/model_detection.py
#: unet_prefix_from_state_dict)
UNET_PREFIX = "model.diffusion_model."
FORMATS = ["comfy_fp8", "comfy_int8", "comfy_nvfp4", "comfy_mxfp8", "comfy_w4a8", "comfy_w4a4", "gguf"]
#: family -> (preset, blocks) of the example its GGUF file is checked on, where the family's small one cannot load
#: through ComfyUI-GGUF. Its Unet Loader hands ComfyUI no file metadata (nodes.py: load_diffusion_model_state_dict
#: without it), so ComfyUI builds LTX-2 at LTXAVModel's defaults, the 19B's widths, reading only the block count and
#: the head width off the tensors: the 19B's widths with 5 of its 48 blocks (7.5 GB of bf16), converted with the
#: bundled recipe's blocks kept as its first two and last two (the others quantized); for the layouts named (the
#: release, and a diffusers pipeline with its connectors/)
GGUF_AT_RELEASED_WIDTHS = {"ltx2": ("19b", 5, ("release", "pipeline"))}
#: family -> presets checked beside its default one, in every layout (case ids ``family@preset/layout/...``): LTX-2.5
PRESETS = {"ltx2": ("tiny-2.5", "comfyui-2.5"), "qwen-image": ("comfyui",)}
#: (family, preset) -> the only layouts its example is checked in (else every one)
PRESET_LAYOUTS = {("ltx2", "comfyui-2.5"): ("pipeline",)}
#: family -> why its default example is not loaded, only its `PRESETS`: ComfyUI builds Qwen-Image at the released
#: widths whatever the file holds (comfy/model_detection.py reads only in_channels and the block count), so only
#: the ``comfyui`` example (those widths, two blocks) loads
DEFAULT_PRESET_UNLOADED = {
    "qwen-image": "ComfyUI builds the released widths (3072 wide, 24 heads of 128) only"
}
#: (family, preset) -> why its GGUF file is loaded with the file's string key-values handed to ComfyUI as its
#: metadata, as ComfyUI-GGUF does since its PR #399 (January 2026): a ComfyUI-GGUF that hands none (the one checked
#: here, if older) makes ComfyUI build LTXAVModel's defaults, the 2.0 structure, whatever the tensors are; LTX-2.3's
#: and 2.5's structure (gated attention, the text cross-attention's adaLN, 2.5's video feed-forward without bias) is
#: told by the metadata alone, at any width
GGUF_WITH_METADATA = {
    ("ltx2", "tiny-2.5"): "LTX-2.5's structure is in the metadata alone (ComfyUI-GGUF PR #399 hands it over)",
    (
        "ltx2",
        "comfyui-2.5",
    ): "LTX-2.5's structure is in the metadata alone (ComfyUI-GGUF PR #399 hands it over)",
    # its names are a Wan2.1 I2V's: without the metadata ComfyUI builds WAN21_I2V (which runs, without the pose branch)
    (
        "wan-animate2",
        None,
    ): "Wan-Animate-2 is told from a Wan2.1 I2V by the metadata alone (ComfyUI-GGUF PR #399)",
}


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
    p.add_argument(
        "--formats", default=",".join(FORMATS), help=f"comma-separated formats (default: {','.join(FORMATS)})"
    )
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
    gguf_metadata: bool = False,
    forward=None,
) -> dict:
    """One file loaded as ComfyUI's node does. `source_unexpected`: the keys the family's bf16 sources left unused
    too (a pass allows those only); None: this is such a source, whose unused keys are reported, not failed."""
    r = dict(id=case_id, ok=False)
    runner.cap.records.clear()
    t0 = time.time()
    try:
        with _gguf_metadata_handed(path if gguf_metadata else None):
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
        if forward is not None:  # `FORWARDS`: the outputs, compared with the bf16 source's by the caller
            r["out"] = forward(runner, patcher)
            r["finite"] = all(bool(runner.torch.isfinite(o).all()) for o in r["out"])
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
        and r.get("finite", True)
    )
    return r


@contextlib.contextmanager
def _gguf_metadata_handed(path: Path | None):
    """While ComfyUI-GGUF's Unet Loader loads `path`, ComfyUI is handed the file's string key-values as its metadata
    (what ComfyUI-GGUF does since its PR #399: `GGUF_WITH_METADATA`); None: as the checked ComfyUI-GGUF does."""
    if path is None:
        yield
        return
    import comfy.sd
    import gguf

    reader = gguf.GGUFReader(path)
    metadata = {k: f.contents() for k, f in reader.fields.items() if f.types == [gguf.GGUFValueType.STRING]}
    load = comfy.sd.load_diffusion_model_state_dict
    comfy.sd.load_diffusion_model_state_dict = lambda sd, model_options={}, **kw: load(
        sd, model_options=model_options, metadata=metadata, **kw
    )
    try:
        yield
    finally:
        comfy.sd.load_diffusion_model_state_dict = load


def _ltx2_forward(runner, patcher) -> list:
    """``LTXAVModel`` run as ComfyUI holds it (its own dtype, the layers as loaded): 2x2x2 video latents, 3 audio
    latent frames, 6 text tokens already through the connectors, sigma 0.5 for both; the video and audio outputs in
    float32."""
    torch = runner.torch
    runner.mm.load_models_gpu([patcher])
    dm, dtype = patcher.model.diffusion_model, patcher.model.get_dtype()
    g = torch.Generator().manual_seed(0)
    video = torch.randn(1, dm.in_channels, 2, 2, 2, generator=g)
    audio = torch.randn(1, dm.num_audio_channels, 3, dm.audio_frequency_bins, generator=g)
    # the connectors' outputs, video and audio concatenated: as wide as the two cross-attentions (2.3, 2.5), or
    # twice the caption width (2.0, whose transformer projects them: av_model.py preprocess_text_embeds)
    width = dm.cross_attention_dim + dm.audio_cross_attention_dim
    context = torch.randn(
        1, 6, width if dm.caption_proj_before_connector else 2 * dm.caption_channels, generator=g
    )
    sigma = torch.full((1,), 0.5)
    with torch.no_grad():
        out = dm([video.to(dtype), audio.to(dtype)], (sigma, sigma), context.to(dtype), frame_rate=25)
    return [o.float() for o in out]


def _ltx25_text_encoder(runner, check, case_id: str, out: Path) -> dict | None:
    """LTX-2.5's text encoder as ComfyUI's LTXAVTextEncoderLoader builds it (``comfy.sd.load_clip``, type ltxv) of
    a pipeline's two ComfyUI files: Gemma 4 from ``text_encoder/``, the text projection from the transformer's file
    (the release keeps it in Gemma 4's; a pipeline's file carries it at its root), at the example encoder's widths
    (ComfyUI fixes Gemma 4 12B's otherwise: ``gemma4_model_config``, as benchmarks/comfyui_encoders.py passes them).
    It must be LTX's (Gemma 4 with the per-modality projection), miss no key, leave none of the encoder's file or
    the projection unused, and encode a prompt to finite features. None: no text encoder file in `out`."""
    import logging

    import comfy.sd

    from quantize.models.examples import examples_of

    encoder = sorted((out / "text_encoder").glob("*.safetensors"))
    transformer = sorted((out / "transformer").glob("*.safetensors"))
    if not encoder or not transformer:
        return None
    g = examples_of("gemma4").presets["comfyui"]
    widths = {
        "vocab_size": g.vocab_size, "hidden_size": g.hidden, "intermediate_size": g.intermediate,
        "num_hidden_layers": g.layers, "num_attention_heads": g.heads, "num_key_value_heads": g.kv_heads,
    }  # fmt: skip
    lines: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: lines.append(record.getMessage())
    root = logging.getLogger()
    level = root.level
    r = dict(id=f"{case_id}/text_encoder+transformer (LTXAVTextEncoderLoader)", ok=False, encoder=True)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        clip = comfy.sd.load_clip(
            ckpt_paths=[str(encoder[0]), str(transformer[0])],
            clip_type=comfy.sd.CLIPType.LTXV,
            model_options={"model_name": "gemma4", "gemma4_model_config": widths},
        )
        model = clip.cond_stage_model
        r["class"] = f"{type(model).__name__}/{type(model.text_embedding_projection).__name__}"
        cond = clip.encode_from_tokens_scheduled(clip.tokenize("a cat playing the piano"))[0][0]
        r["cond"], r["finite"] = tuple(cond.shape), bool(runner.torch.isfinite(cond).all())
    except Exception as e:  # noqa: BLE001
        r["error"] = f"{type(e).__name__}: {str(e).strip()[:400]} [{check.where(e, runner.roots)}]"
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    keys = {k: sum((check._keys_in(x) for x in lines if x.startswith(f"clip {k}")), []) for k in ("missing", "unexpected")}  # fmt: skip
    r["missing"] = keys["missing"]
    # the transformer's own, and the tokenizer ComfyUI takes from the encoder's file (comfy/sd.py: tokenizer_data)
    # before its model is handed the rest
    tokenizer = ("tokenizer_json", "spiece_model")
    r["unexpected"] = [k for k in keys["unexpected"] if not k.startswith(UNET_PREFIX) and k not in tokenizer]
    r["ok"] = "error" not in r and r["class"] == "LTXAVTEModel_/DualLinearProjection" and r["finite"]
    r["ok"] = r["ok"] and not r["missing"] and not r["unexpected"]
    return r


#: (family, preset) -> a check of a pipeline's text encoder as ComfyUI loads it with the transformer's file
#: (runner, check, case id, output folder) -> result, None where the output has no such files
ENCODER_CHECKS = {("ltx2", "comfyui-2.5"): _ltx25_text_encoder}


#: family -> a forward pass on ComfyUI's loaded model (runner, patcher) -> outputs: each file is run, and a
#: converted file's outputs are held to its bf16 source's (SQNR, reported; a non-finite output fails)
FORWARDS = {"ltx2": _ltx2_forward}


def _sqnr(ref: list, got: list) -> str:
    import torch

    return "/".join(
        f"{10 * torch.log10(a.pow(2).sum() / (a - b).pow(2).sum().clamp_min(1e-30)).item():.1f}"
        for a, b in zip(ref, got, strict=True)
    )


def _line(r: dict) -> str:
    s = f"{'REF' if r.get('ref') else 'PASS' if r['ok'] else 'FAIL':4} {r['id']:58} "
    if "refused" in r:
        return s + f"refused at plan time: {r['refused']}"
    if r.get("encoder"):  # `ENCODER_CHECKS`
        s += f"{r.get('class', '-')} missing {len(r['missing'])} unexpected {len(r['unexpected'])} "
        s += f"cond {r['cond']} {'finite' if r['finite'] else 'NOT FINITE'} " if "cond" in r else ""
        s += f"ERROR {r['error']}" if "error" in r else ""
        return (s + "".join(f"\n       {k}: {r[k][:8]}" for k in ("missing", "unexpected") if r[k])).rstrip()
    if r.get("class"):
        s += f"{r['class']} missing {len(r['missing'])} unexpected {len(r['unexpected'])} leftover {len(r['leftover'])} "
        s += f"quant {r['q']} {','.join(r['layouts']) or '-'} "
        if "finite" in r:  # `FORWARDS`
            s += f"forward {'finite' if r['finite'] else 'NOT FINITE'} "
            s += f"SQNR {r['sqnr']} dB " if r.get("sqnr") else ""
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
    outputs: dict[tuple[str, str], list | None] = {}  # (name, layout) -> the bf16 source's `FORWARDS` outputs
    source_unexpected: dict[
        str, frozenset
    ] = {}  # family -> keys ComfyUI found no place for in its bf16 source
    for family in families:
        by_layout = EXPECTED[family]
        fam = get_family(family)
        layouts = [lay for lay in examples_of(fam).layouts if lay in by_layout] or (
            list(examples_of(fam).layouts) if "*" in by_layout else []
        )
        cases = [(None, layout) for layout in layouts if family not in DEFAULT_PRESET_UNLOADED]
        cases += [
            (preset, layout)
            for preset in PRESETS.get(family, ())
            for layout in layouts
            if layout in PRESET_LAYOUTS.get((family, preset), (layout,))
        ]
        for preset, layout in cases:
            expected = by_layout.get(layout, by_layout.get("*", set()))
            name = family if preset is None else f"{family}@{preset}"  # the case ids' and folders' name
            src = args.work / "fam-src" / f"{name}-{layout}"
            p = subprocess.run(
                [args.quantize, "example", str(src), "--family", family, "--layout", layout]
                + ([] if preset is None else ["--preset", preset]),
                capture_output=True,
                text=True,
            )
            if p.returncode:
                r = dict(id=f"{name}/{layout}/example", ok=False, error=(p.stdout + p.stderr).strip()[-300:])
                results.append(r)
                print(_line(r), flush=True)
                continue
            natives = [c for c in sorted({f.parent for f in src.rglob("*.safetensors")})]
            if all(fam.naming(_names(comp)) != "native" for comp in natives):
                natives = []  # diffusers names: ComfyUI detects no model in them; only our output is loaded
            for comp in natives:
                rel = comp.relative_to(src).as_posix() or "."
                cid = f"{name}/{layout}/{rel}/bf16-source"
                if only and not only.search(cid):
                    continue
                ref = _merged(
                    comp, args.work / "fam-ref" / f"{name}-{layout}-{rel.replace('/', '_')}.safetensors"
                )
                r = _case(
                    runner, check, cid, ref, expected, source_unexpected=None, forward=FORWARDS.get(family)
                )
                outputs[name, layout] = r.pop(
                    "out", None
                )  # the reference: reported, neither passed nor failed (HunyuanVideo 1.5's release keeps q, k and
                # v apart, which ComfyUI loads fused: it does not load as released, its conversions do)
                r["ref"] = True
                source_unexpected[family] = source_unexpected.get(family, frozenset()) | set(
                    r.get("unexpected", ())
                )
                results.append(r)
                print(_line(r), flush=True)
            for fmt in args.formats.split(","):
                cid = f"{name}/{layout}/{fmt}"
                if only and not only.search(cid):
                    continue
                out = args.work / "fam-out" / f"{name}-{layout}-{fmt}"
                how = ["--format", fmt]
                source = src
                handed = fmt == "gguf" and (family, preset) in GGUF_WITH_METADATA
                if (
                    preset is None
                    and fmt == "gguf"
                    and layout in GGUF_AT_RELEASED_WIDTHS.get(family, (0, 0, ()))[2]
                ):
                    source, recipe = _released_widths_gguf(args, family, layout)
                    how = ["--recipe", str(recipe)]
                p = subprocess.run(
                    [args.quantize, "convert", str(source), str(out), *how], capture_output=True, text=True
                )
                (args.work / "logs" / f"{name}-{layout}-{fmt}.log").write_text(p.stdout + p.stderr)
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
                # a pipeline's text encoder, converted by the same --format: benchmarks/comfyui_encoders.py's
                files = [f for f in files if f.relative_to(out).parts[0] != fam.folders.encoder]
                for f in files:
                    r = _case(
                        runner,
                        check,
                        f"{cid}/{f.relative_to(out).as_posix()}",
                        f,
                        expected,
                        source_unexpected.get(family, frozenset()),
                        gguf_metadata=handed,
                        forward=FORWARDS.get(family),
                    )
                    got, ref_out = r.pop("out", None), outputs.get((name, layout))
                    if got is not None and ref_out is not None and source == src:
                        r["sqnr"] = _sqnr(ref_out, got)  # against its own bf16 source's, video/audio
                    if handed:
                        r["id"] += " (metadata handed over)"
                    results.append(r)
                    print(_line(r), flush=True)
                encoder_check = ENCODER_CHECKS.get((family, preset))
                if encoder_check is not None and fmt != "gguf":
                    r = encoder_check(runner, check, cid, out)
                    if r is not None:
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
