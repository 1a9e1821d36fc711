"""The golden set: every bundled recipe on an example of each family and layout, `--format`, LoRA merges, mixed
ComfyUI types and `--calibrate`, converted through the command line, in process. A refactor that must change no
output byte runs this before and after and compares the two folders with `diff -r`.

    python benchmarks/golden.py sources DIR      # the example sources, once (with the code before)
    python benchmarks/golden.py convert DIR OUT  # every conversion of those sources into OUT

Run both with the code before (a clone on PYTHONPATH) and `convert` again with the code after, into another OUT,
then `diff -r OUT_BEFORE OUT_AFTER`. The sources are written once so that a change to the example generators does
not count as a change of output.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

#: a recipe mixing ComfyUI layouts per layer (`types`), the kind `--calibrate` fills
MIXED = """\
format: comfy_nvfp4
components: [transformer]
targets: ['blocks\\.\\d+\\.(attn[12]\\.(to_q|to_k|to_v|to_out\\.0)|ffn\\.net\\.(0\\.proj|2))']
types:
  'blocks\\.0\\.attn1\\..*': float8_e4m3fn
  'blocks\\.\\d+\\.ffn\\.net\\.2': mxfp8
  'blocks\\.1\\.attn2\\.to_q': int8_tensorwise
"""

GGUF_MIXED = """\
format: gguf
type: Q8_0
targets: ['blocks\\.\\d+\\.((self_attn|cross_attn)\\.(q|k|v|o)|ffn\\.(0|2))']
types:
  'blocks\\.0\\..*': Q4_1
  'blocks\\.\\d+\\.ffn\\.2': Q5_0
"""

FORMATS = (
    "fp8_channel",
    "torchao_fp8",
    "torchao_int8",
    "nf4",
    "comfy_fp8",
    "comfy_int8",
    "comfy_nvfp4",
    "comfy_mxfp8",
    "gguf",
)


def cli(*args: object) -> tuple[int, str]:
    """One command, in process: its exit code and what it printed."""
    from quantize.cli import cli as group

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            group.main(args=[str(a) for a in args], prog_name="quantize", standalone_mode=False)
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        except Exception as e:  # noqa: BLE001 - recorded, compared before and after
            buf.write(f"{type(e).__name__}: {e}\n")
            code = 1
    return code, buf.getvalue()


def write_sources(root: Path) -> None:
    """One example per family and layout (the family's smallest preset), the Wan LoRA and calibration inputs."""
    import torch
    from safetensors.torch import save_file

    from quantize.models import FAMILIES
    from quantize.models.examples import examples_of

    root.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        preset = "tiny" if "tiny" in examples_of(family).presets else examples_of(family).default_preset
        for layout in examples_of(family).layouts:
            args = ["example", root / f"{family.name}-{layout}", "--family", family.name, "--preset", preset]
            args += ["--layout", layout]
            if family.name == "wan" and layout == "t2v":
                args += ["--lora", root / f"{family.name}-{layout}-lora.safetensors"]
            code, text = cli(*args)
            print(f"{family.name} {layout}: {code} {text.strip()[:200]}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.diffusers_models import wan_of_width as _diffusers_wan  # a Wan in diffusers' names

    _diffusers_wan(root / "wan-diffusers" / "transformer", width=64)
    g = torch.Generator().manual_seed(1)
    save_file(
        {
            "hidden_states": torch.randn(2, 4, 2, 8, 8, generator=g).to(torch.bfloat16),
            "timestep": torch.tensor([900, 100]),
            "encoder_hidden_states": torch.randn(2, 8, 64, generator=g).to(torch.bfloat16),
        },
        str(root / "calibration.safetensors"),
    )
    (root / "mixed.yaml").write_text(MIXED)
    (root / "gguf-mixed.yaml").write_text(GGUF_MIXED)


def recipes_for(source: Path) -> list[str]:
    code, text = cli("recipes", "--for", source)
    return list(dict.fromkeys(re.findall(r"[\w.-]+\.yaml", text)))


def convert_all(root: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = []
    sources = sorted(p for p in root.iterdir() if p.is_dir())
    for src in sources:
        for recipe in recipes_for(src):
            code, text = cli(
                "convert", src, out / f"{src.name}--{recipe.removesuffix('.yaml')}", "-r", recipe
            )
            log.append(f"{src.name} -r {recipe}: {code}")
    wan = root / "wan-t2v"
    for fmt in FORMATS:
        code, text = cli("convert", wan, out / f"wan-t2v--format-{fmt}", "--format", fmt)
        log.append(f"wan-t2v --format {fmt}: {code} {text.strip().splitlines()[:1]}")
    code, _ = cli("convert", wan, out / "wan-t2v--shards", "-r", "wan-fp8.yaml", "--max-shard-size", "200KB")
    log.append(f"wan-t2v shards: {code}")
    lora = root / "wan-t2v-lora.safetensors"
    for recipe in ("wan-fp8.yaml", "wan-comfy-fp8.yaml", "wan-gguf-q8_0.yaml", "wan-nf4.yaml"):
        args = ["convert", wan, out / f"wan-t2v--lora--{recipe.removesuffix('.yaml')}", "-r", recipe]
        code, text = cli(*args, "--lora", f"{lora}:0.8", "--lora", f"{lora}:-0.3")
        log.append(f"wan-t2v lora {recipe}: {code} {text.strip()[-200:] if code else ''}")
    for name, recipe in (("wan-diffusers", "mixed.yaml"), ("wan-t2v", "gguf-mixed.yaml")):
        code, text = cli("convert", root / name, out / f"{name}--{recipe}", "-r", root / recipe)
        log.append(f"{name} {recipe}: {code} {text.strip()[-200:] if code else ''}")
    code, text = cli(
        "convert", root / "wan-diffusers", out / "wan-diffusers--calibrated", "-r", root / "mixed.yaml",
        "--calibrate", root / "calibration.safetensors",
    )  # fmt: skip
    log.append(f"calibrate: {code} {text.strip()[-300:]}")
    (out / "golden.log").write_text("\n".join(log) + "\n")
    print("\n".join(log))
    print(f"{sum(1 for p in out.iterdir() if p.is_dir())} conversions written")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("sources").add_argument("root", type=Path)
    c = sub.add_parser("convert")
    c.add_argument("root", type=Path)
    c.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.what == "sources":
        write_sources(args.root)
    else:
        convert_all(args.root, args.out)


if __name__ == "__main__":
    sys.exit(main())
