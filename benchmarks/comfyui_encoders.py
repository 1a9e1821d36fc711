#!/usr/bin/env python3
"""Our text-encoder files in the REAL ComfyUI and ComfyUI-GGUF, on the CPU: load, tokenize, encode a prompt.

    python3 benchmarks/comfyui_encoders.py COMFYUI_DIR COMFYUI_GGUF_DIR WORK_DIR [--family umt5|gemma3|gemma4|gemma4-text|qwen25vl|qwen25vl-text|qwen3vl|t5]
        [--preset P] [--recipes R1,R2] [--prompt TEXT]

umT5 (`--family umt5`, CLIPLoader type wan): ComfyUI recognizes it only at its real widths (comfy/sd.py
``detect_te_model``: block 23's ``wi_1`` 10240 rows; the model is built from ``umt5_config_xxl.json`` whatever the
file holds), and ComfyUI-GGUF rebuilds its tokenizer only for a ``token_embd`` of 256384 x 4096: the check runs at
umT5-XXL's shape (`--preset xxl`, 5.7B parameters, 11.4 GB of bf16; about 25 GB of disk and 14 GB of RAM at its
peak).

Gemma 3 (`--family gemma3`, CLIPLoader type ltxv): ComfyUI tells Gemma 3 12B by its layer 47 and builds it from its
`Gemma3_12B_Config`, whose fields its text-encoder options override (``<model_name>_model_config``, read in
``comfy/sd1_clip.py``): the default preset, ``comfyui``, has the 12B's 48 layers, head size and SigLIP tower at a
small text width, and the check passes those widths through that option, so that ComfyUI's own loader, tokenizer
and model run the file.

Gemma 4 12B unified (`--family gemma4`, CLIPLoader type ltxv, LTX-2.5's encoder): the same, for
`Gemma4_12B_Config` (ComfyUI tells the 12B by its layer 47 with no v_proj on layer 5; the head sizes, the vision
embedder and the audio projection are fixed, and the preset ``comfyui`` has them), its tokenizer the file's
``tokenizer_json`` (tokenizers' own tokenizer.json). Its text model alone (`--family gemma4-text`: E4B's language
model, which ComfyUI tells by its 42 layers, at the preset ``comfyui``'s small width) likewise, from a pipeline's
``text_encoder/`` as qwen25vl-text's below, its reference holding the tokenizer.json as ``tokenizer_json``; ComfyUI
logs E4B's towers and the unused key and value projections of its 18 KV-sharing layers missing, by design.

Qwen2.5-VL (`--family qwen25vl`, CLIPLoader type qwen_image; CLIPLoader (GGUF) for the GGUF pair, which finds its
mmproj file beside the text file): the same, for `Qwen25_7BVLI_Config` (ComfyUI tells the 7B by ``k_proj``'s 512-row
bias; heads of 128, the 1280-wide tower and its bundled tokenizer's 152064 ids are fixed, and the preset ``comfyui``
has them); the prompt is encoded twice, alone and with a 112 x 112 image (`WITH_IMAGE`: the vision tower runs), and
the SQNR is of both embeddings together.

Qwen2.5-VL's text model alone (`--family qwen25vl-text`, CLIPLoader type qwen_image, and CLIPLoader (GGUF)): a
diffusers HunyuanVideo 1.5 pipeline's ``text_encoder/`` converted to ComfyUI's and GGUF files; its bf16 reference is
that folder's tensors under ComfyUI's ``model.`` (written here with safetensors). Both lack the vision tower, so
ComfyUI logs its keys missing for each alike: lines naming only ``visual.`` keys are the design, any other fails. The GGUF
node is called as it is, ComfyUI's loader under it given the preset's widths as CLIPLoader's model options.

Qwen3-VL (`--family qwen3vl`, CLIPLoader type qwen_image: Qwen-Image 2.1's encoder): ComfyUI tells it by its
tower's DeepStack mergers (``comfy/sd.py`` ``detect_te_model``; the 8B unless the merger projects to 2560), renames
the file's ``model.language_model.``, ``model.visual.`` and ``lm_head.`` to its own module's and builds its
`Qwen3VL_8BConfig` (heads of 128; the tower fixed at the 8B's: 1152 wide, 27 deep, its MLP 4304, which no 32-wide
block divides) with the preset's text widths, as for Qwen2.5-VL; the prompt is encoded alone and with the image
(its DeepStack features added to the language model's first layers). No GGUF: ComfyUI-GGUF reads a qwen3vl file's
language model alone, which ComfyUI takes for Qwen3-8B (the family refuses it).

T5's encoder (`--family t5`: HunyuanVideo 1.5's byT5, at its real shape, which ComfyUI fixes in
byt5_config_small_glyph.json and tells by block 0's 384-row ``k``): ComfyUI reads a byT5 only as DualCLIPLoader's
second file (type hunyuan_video_15, ComfyUI-GGUF's DualCLIPLoader (GGUF) likewise), so each file loads beside the
same first one, Qwen2.5-VL's text model's bf16 reference at the preset `comfyui-4` (4 layers: ComfyUI reads the hidden
state 3 from the last); the prompt has quoted text (what
byT5 encodes) and the compared output is ``conditioning_byt5small``.

  - `quantize example --family F --layout single` writes Comfy-Org's single file (ComfyUI's names; umT5's and
    Gemma 3's hold the tokenizer as ``spiece_model``, ComfyUI bundles Qwen2.5's), random weights;
  - `quantize convert --recipe R` writes each file;
  - ComfyUI's own CLIPLoader (``comfy.sd.load_clip``) loads the bf16 source and each ComfyUI file, ComfyUI-GGUF's
    CLIPLoader (GGUF) node each GGUF file; every one must come in as the family's model, with no missing or
    unexpected key logged, its quantized layers as ComfyUI's quantized tensors (GGUF: GGML tensors), its tokenizer
    giving the bf16 file's token ids; its prompt embedding is compared with the bf16 file's (SQNR).

Prints one line per file and a SUMMARY line; exit 0: every file passed (loaded, same tokens, SQNR >= --min-sqnr);
1: one failed; 2: set-up failed. Not part of `make test` (ComfyUI is not on PyPI). Environment: ComfyUI's own,
built in WORK_DIR/venv by ../shared/tools/comfyui_check.py's `ensure_venv`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO.parent / "shared" / "tools" / "comfyui_check.py"
PROMPT = "a red fox jumps over a sleeping dog in the snow, cinematic light"


def _text_widths(family: str, model_name: str):
    """ComfyUI's options for a text encoder whose config it fixes (Gemma 3 12B's, Qwen2.5-VL 7B's): the example
    preset's text widths, the fields its config dataclass takes (``<model_name>_model_config``); what the
    dataclass fixes otherwise (head size, vision tower) the preset has."""

    def options(preset: str) -> dict:
        sys.path.insert(0, str(REPO))
        from quantize.models.examples import examples_of

        s = examples_of(family).presets[preset]
        config = {
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads,
        }
        return {"model_name": model_name, f"{model_name}_model_config": config}

    return options


#: family -> its default recipes and preset, ComfyUI's CLIP type (CLIPLoader and CLIPLoader (GGUF)), the
#: tokenizer's key in ComfyUI's tokens, and ComfyUI's text-encoder options for a preset (`_text_widths`)
FAMILIES = {
    "umt5": ("umt5-single-comfy-fp8,umt5-single-gguf-q8_0", "xxl", "wan", "umt5xxl", lambda preset: {}),
    "gemma3": (
        "gemma3-single-comfy-fp8,gemma3-single-comfy-int8,gemma3-single-comfy-nvfp4",
        "comfyui",
        "ltxv",
        "gemma3_12b",
        _text_widths("gemma3", "gemma3_12b"),
    ),
    # Gemma 4 12B unified (LTX-2.5's): ComfyUI tells it by layer 47 and layer 5's missing v_proj, builds it from
    # `Gemma4_12B_Config` (heads of 256 and 512, the vision embedder's and audio projection's widths fixed; the
    # text widths taken from ``gemma4_model_config``) and its tokenizer from the file's ``tokenizer_json``
    "gemma4": (
        "gemma4-single-comfy-fp8,gemma4-single-comfy-int8,gemma4-single-comfy-nvfp4,gemma4-single-comfy-mxfp8",
        "comfyui",
        "ltxv",
        "gemma4",
        _text_widths("gemma4", "gemma4"),
    ),
    # Gemma 4's text model alone (E4B's language model at a small width: ComfyUI tells E4B by its 42 layers and
    # builds `Gemma4_E4B`, per-layer embeddings and key-value sharing included), its bf16 reference the pipeline's
    # text_encoder/ under ``model.`` with the tokenizer.json as ``tokenizer_json``
    "gemma4-text": (
        "gemma4-text-comfy-fp8,gemma4-text-comfy-int8,gemma4-text-comfy-nvfp4",
        "comfyui",
        "ltxv",
        "gemma4",
        _text_widths("gemma4-text", "gemma4"),
    ),
    "qwen25vl": (
        "qwen25vl-single-comfy-fp8,qwen25vl-single-comfy-int8,qwen25vl-single-comfy-nvfp4,qwen25vl-single-gguf-q8_0",
        "comfyui",
        "qwen_image",
        "qwen25_7b",
        _text_widths("qwen25vl", "qwen25_7b"),
    ),
    "qwen25vl-text": (
        "qwen25vl-text-comfy-fp8,qwen25vl-text-comfy-int8,qwen25vl-text-gguf-q8_0",
        "comfyui",
        "qwen_image",
        "qwen25_7b",
        _text_widths("qwen25vl-text", "qwen25_7b"),
    ),
    "qwen3vl": (
        "qwen3vl-single-comfy-fp8,qwen3vl-single-comfy-int8,qwen3vl-single-comfy-nvfp4,qwen3vl-single-comfy-mxfp8",
        "comfyui",
        "qwen_image",
        "qwen3vl_8b",
        _text_widths("qwen3vl", "qwen3vl_8b"),
    ),
    # byT5 at its real shape (ComfyUI builds it from byt5_config_small_glyph.json), beside Qwen2.5-VL's text model
    # at the preset `comfyui-4` (its widths passed as with qwen25vl-text)
    "t5": (
        "t5-single-gguf-q8_0",
        "byt5",
        "hunyuan_video_15",
        "byt5",
        _text_widths("qwen25vl-text", "qwen25_7b"),
    ),
}
#: families whose files ComfyUI reads only as a DualCLIPLoader's second file (byT5: hunyuan_video_15): the first is
#: this family's bf16 reference (`PIPELINE_REFERENCE_PREFIX`) at its preset, the compared output the extra key
#: ComfyUI's model returns beside the first's conditioning, and the prompt holds quoted text (what byT5 encodes)
DUAL = {"t5": ("qwen25vl-text", "comfyui-4", "conditioning_byt5small")}
GLYPH_PROMPT = 'a storefront at night, its neon sign reads "OPEN 24 HOURS" above the door, cinematic light'
#: families whose example is a pipeline's text_encoder/ in the class's names (no ComfyUI file of its own): the bf16
#: reference is its tensors under ComfyUI's prefix for them (ComfyUI's `Llama2_` language model is ``model.``)
PIPELINE_REFERENCE_PREFIX = {"qwen25vl-text": "model.", "gemma4-text": "model."}
#: the tokenizer a pipeline's reference file holds as ComfyUI reads it (Gemma 4's: its tokenizer.json's bytes)
REFERENCE_TOKENIZER = {"gemma4-text": ("tokenizer/tokenizer.json", "tokenizer_json")}
#: families whose prompt is also encoded with an image (ComfyUI IMAGE, 112 x 112 random pixels: `IMAGE`), whose
#: embedding their vision tower makes (Qwen2.5-VL: TextEncodeQwenImageEdit's path; its GGUF tower the mmproj file);
#: the compared conditioning is both outputs
WITH_IMAGE = ("qwen25vl", "qwen3vl")
IMAGE = None
#: the keys ComfyUI's model has that a family's files lack by design (a text model alone: Qwen2.5-VL's tower)
ABSENT_BY_DESIGN = {
    "qwen25vl-text": "visual.",
    "t5": "visual.",
    # E4B's towers and their projectors; the key and value projections of its last 18 layers, which share the
    # earlier ones' (ComfyUI builds them and never runs them; transformers' class has none)
    "gemma4-text": (
        "vision_model.",
        "multi_modal_projector.",
        "audio_model.",
        "audio_projector.",
        *(f"model.layers.{i}.self_attn.{m}" for i in range(24, 42) for m in ("k_proj", "v_proj", "k_norm")),
    ),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("comfyui", type=Path)
    p.add_argument("comfyui_gguf", type=Path)
    p.add_argument("work", type=Path)
    p.add_argument("--quantize", default=str(REPO / ".venv" / "bin" / "quantize"))
    p.add_argument("--family", choices=sorted(FAMILIES), default="umt5")
    p.add_argument("--preset", default=None)
    p.add_argument("--recipes", default=None)
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--min-sqnr", type=float, default=30.0)
    p.add_argument("--venv", type=Path, default=None)
    p.add_argument("--no-venv", action="store_true")
    a = p.parse_args()
    a.comfyui, a.comfyui_gguf, a.work = a.comfyui.resolve(), a.comfyui_gguf.resolve(), a.work.resolve()
    a.venv = (a.venv or a.work / "venv").resolve()
    recipes, preset, a.clip_type, a.tokens_key, a.options = FAMILIES[a.family]
    a.recipes, a.preset = a.recipes or recipes, a.preset or preset
    a.companion = None  # the first file of a DualCLIPLoader (`DUAL`), made by `prepare`
    if a.family in DUAL and a.prompt == PROMPT:
        a.prompt = GLYPH_PROMPT
    return a


def _check_module():
    spec = importlib.util.spec_from_file_location("comfyui_check", CHECK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _quantize(args, *argv) -> None:
    t = time.time()
    subprocess.run([args.quantize, *map(str, argv)], check=True, stdout=subprocess.DEVNULL)
    print(
        f"  quantize {argv[0]} {argv[-1] if argv[0] == 'example' else argv[2]}: {time.time() - t:.0f} s",
        flush=True,
    )


def prepare(args) -> tuple[Path, dict[str, Path]]:
    """The bf16 source file and each recipe's output file (made once; a later run reuses them)."""
    src = args.work / f"{args.family}-{args.preset}"
    prefix = PIPELINE_REFERENCE_PREFIX.get(args.family)
    layout = "single" if prefix is None else "pipeline"
    if not (src / "example.json").exists():
        _quantize(args, "example", "--family", args.family, "--preset", args.preset, "--layout", layout, src)
    files = {}
    for recipe in filter(None, args.recipes.split(",")):
        out = args.work / f"{recipe}-{args.preset}"
        if not out.exists():
            _quantize(args, "convert", src, out, "--recipe", recipe)
        # the model's file (a GGUF Qwen2.5-VL's mmproj file beside it is found by ComfyUI-GGUF itself)
        (files[recipe],) = [
            p
            for p in out.rglob("*")
            if p.suffix in (".safetensors", ".gguf") and not p.name.startswith("mmproj-")
        ]
    if args.family in DUAL:
        family, preset, _ = DUAL[args.family]
        first = args.work / f"{family}-{preset}"
        if not (first / "example.json").exists():
            _quantize(args, "example", "--family", family, "--preset", preset, "--layout", "pipeline", first)
        args.companion = _prefixed_reference(first, PIPELINE_REFERENCE_PREFIX[family])
    if prefix is not None:
        return _prefixed_reference(src, prefix, REFERENCE_TOKENIZER.get(args.family)), files
    (source,) = src.glob("*.safetensors")
    return source, files


def _prefixed_reference(src: Path, prefix: str, tokenizer: tuple[str, str] | None = None) -> Path:
    """The pipeline's bf16 ``text_encoder/`` as one file of ComfyUI's names (each tensor under `prefix`), written
    here with safetensors alone: the reference ComfyUI loads beside our files; with `tokenizer` (the pipeline's
    file, its tensor's name) the tokenizer file's bytes as that uint8 tensor, where ComfyUI reads it."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = src / "reference-bf16.safetensors"
    if not out.exists():
        tensors = {}
        for shard in sorted((src / "text_encoder").glob("*.safetensors")):
            with safe_open(str(shard), "pt") as f:
                tensors |= {prefix + k: f.get_tensor(k) for k in f.keys()}
        if tokenizer is not None:
            data = bytearray((src / tokenizer[0]).read_bytes())
            tensors[tokenizer[1]] = torch.frombuffer(data, dtype=torch.uint8).clone()
        save_file(tensors, str(out))
    return out


class Capture(logging.Handler):
    """ComfyUI's log lines while a file loads (it logs missing and unexpected keys, and what it detected)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def load(args, comfy, nodes, gg, path: Path):
    """The CLIP object ComfyUI's loader makes of `path`: CLIPLoader's ``comfy.sd.load_clip`` (the family's type)
    for a safetensors file, ComfyUI-GGUF's CLIPLoaderGGUF node for a GGUF file."""
    import folder_paths

    preset = DUAL[args.family][1] if args.family in DUAL else args.preset
    paths = [p for p in (args.companion, path) if p is not None]
    options = args.options(preset)
    if (
        args.companion is not None
    ):  # ComfyUI names each model of the pair itself; a name given would be both's
        options.pop("model_name")
    if path.suffix == ".gguf":
        for p in paths:
            folder_paths.add_model_folder_path("clip", str(p.parent))
            folder_paths.add_model_folder_path("text_encoders", str(p.parent))
        with _widths_passed(comfy, options):
            if args.companion is None:
                (clip,) = gg.NODE_CLASS_MAPPINGS["CLIPLoaderGGUF"]().load_clip(path.name, type=args.clip_type)
            else:
                (clip,) = gg.NODE_CLASS_MAPPINGS["DualCLIPLoaderGGUF"]().load_clip(
                    args.companion.name, path.name, type=args.clip_type
                )
        return clip
    clip_type = getattr(comfy.sd.CLIPType, args.clip_type.upper())
    return comfy.sd.load_clip(ckpt_paths=[str(p) for p in paths], clip_type=clip_type, model_options=options)


def _absent_by_design(line: str, prefix: str | None) -> bool:
    """Whether a logged line about missing keys names only keys under `prefix` (ComfyUI's list of missing keys, or
    its quantized ops' one layer without a weight), which the family's files lack by design."""
    if prefix is None or "unexpected" in line.lower():
        return False
    names = re.findall(r"'([^']+)'", line) or [line.split()[-1]]
    return all(n.startswith(prefix) for n in names)


@contextlib.contextmanager
def _widths_passed(comfy, options: dict):
    """ComfyUI-GGUF's node as it is, its call of ComfyUI's ``load_text_encoder_state_dicts`` given the preset's
    widths too (`options`; the node passes its own ops and device only): what ComfyUI's CLIPLoader takes as
    ``model_options``, for a file below the real widths. Nothing changes for a real-width file (no options)."""
    real = comfy.sd.load_text_encoder_state_dicts

    def with_widths(*a, model_options=None, **kw):
        return real(*a, model_options={**(model_options or {}), **options}, **kw)

    comfy.sd.load_text_encoder_state_dicts = with_widths
    try:
        yield
    finally:
        comfy.sd.load_text_encoder_state_dicts = real


def quantized_layers(clip) -> dict[str, int]:
    """How many weights of the loaded model ComfyUI holds quantized, by layout (its ``QuantizedTensor``s) or GGML
    type (ComfyUI-GGUF's ``GGMLTensor``s), as ../shared/tools/comfyui_check.py counts them."""
    import torch

    kinds: dict[str, int] = {}
    for _, mod in clip.cond_stage_model.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor):
            continue
        mro = [c.__name__ for c in type(w).__mro__]
        kind = None
        if "QuantizedTensor" in mro:
            layout = getattr(w, "_layout_cls", None) or getattr(w, "layout_cls", None)
            kind = layout if isinstance(layout, str) else getattr(layout, "__name__", str(layout))
        elif "GGMLTensor" in mro and getattr(w.tensor_type, "name", "F32") not in ("F32", "F16", "BF16"):
            kind = w.tensor_type.name
        if kind is not None:
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def stored_quantized(path: Path) -> int:
    """How many weights the file stores quantized (a ``comfy_quant`` marker each; a GGML block type)."""
    if path.suffix == ".gguf":
        import gguf

        return sum(
            t.tensor_type.name not in ("F32", "F16", "BF16") for t in gguf.GGUFReader(str(path)).tensors
        )
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sum(k.endswith(".comfy_quant") for k in f.keys())


def encode(clip, prompt: str, key: str, output: str = "cond", images: list | None = None):
    """The tokens of the family's tokenizer (`key`) and the conditioning ComfyUI's model returns for the prompt
    (`output`: ``cond``, or the extra key a DualCLIPLoader's second model's output comes under), with `images`
    (ComfyUI IMAGE tensors) where given: its vision tower's embedding among the tokens (Qwen-Image-Edit's)."""
    tokens = clip.tokenize(prompt) if images is None else clip.tokenize(prompt, images=images)
    batch = tokens[key] if isinstance(tokens, dict) else tokens  # Gemma 3's tokenizer gives its batch bare
    ids = [t[0] for t in batch[0]]
    return ids, clip.encode_from_tokens(tokens, return_dict=True)[output].float()


def main() -> int:
    args = parse_args()
    if not args.no_venv and os.path.realpath(sys.prefix) != os.path.realpath(args.venv):
        check = _check_module()
        py = check.ensure_venv(args)
        os.execv(
            str(py),
            [str(py), os.path.abspath(__file__), *sys.argv[1:], "--no-venv", "--venv", str(args.venv)],
        )
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        source, files = prepare(args)
        mm, _, nodes, gg = _check_module().import_comfy(args)
        import comfy.sd
        import torch

        global IMAGE
        IMAGE = torch.rand(1, 112, 112, 3, generator=torch.Generator().manual_seed(0))
    except Exception as e:  # noqa: BLE001
        print(f"SETUP FAILED: {type(e).__name__}: {e}")
        return 2
    capture = Capture()
    logging.getLogger().addHandler(capture)
    logging.getLogger().setLevel(logging.INFO)

    def run(path: Path):
        capture.lines.clear()
        t = time.time()
        clip = load(args, comfy, nodes, gg, path)
        loaded = time.time() - t
        t = time.time()
        output = DUAL[args.family][2] if args.family in DUAL else "cond"
        ids, cond = encode(clip, args.prompt, args.tokens_key, output)
        if args.family in WITH_IMAGE:  # the prompt again with an image: the vision tower's path
            cond = torch.cat(
                [cond.flatten(), encode(clip, args.prompt, args.tokens_key, output, [IMAGE])[1].flatten()]
            )
        model = type(clip.cond_stage_model).__name__
        kinds = quantized_layers(clip)
        keys = [line for line in capture.lines if "missing" in line.lower() or "unexpected" in line.lower()]
        keys = [line for line in keys if not _absent_by_design(line, ABSENT_BY_DESIGN.get(args.family))]
        del clip
        gc.collect()
        mm.soft_empty_cache()
        return model, ids, cond, kinds, keys, loaded, time.time() - t

    ref_model, ref_ids, ref, _, ref_keys, lt, et = run(source)
    print(
        f"REF {source.name}: {ref_model}, {len(ref_ids)} tokens, cond {list(ref.shape)}, load {lt:.0f} s, "
        f"encode {et:.0f} s{', keys: ' + '; '.join(ref_keys) if ref_keys else ''}",
        flush=True,
    )
    passed = 0
    for recipe, path in files.items():
        model, ids, cond, kinds, keys, lt, et = run(path)
        sqnr = float(10 * torch.log10(ref.pow(2).sum() / (ref - cond).pow(2).sum()))
        stored = stored_quantized(path)
        ok = model == ref_model and ids == ref_ids and not keys and sum(kinds.values()) == stored
        ok = ok and sqnr >= args.min_sqnr
        passed += ok
        print(
            f"{'PASS' if ok else 'FAIL'} {recipe} ({path.name}, {path.stat().st_size / 1e9:.2f} GB): {model}, "
            f"tokens {'same' if ids == ref_ids else 'DIFFER'}, quantized {kinds} of {stored} in the file, "
            f"SQNR {sqnr:.1f} dB, load {lt:.0f} s, "
            f"encode {et:.0f} s{', keys: ' + '; '.join(keys) if keys else ''}",
            flush=True,
        )
    print(
        f"SUMMARY {passed}/{len(files)} passed (min SQNR {args.min_sqnr} dB against the bf16 file in the same ComfyUI)"
    )
    return 0 if passed == len(files) else 1


if __name__ == "__main__":
    sys.exit(main())
