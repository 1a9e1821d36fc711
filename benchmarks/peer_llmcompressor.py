"""The llm-compressor peer of the fp8 benchmark, run by the Python of its own virtual environment.

    <peer venv>/bin/python benchmarks/peer_llmcompressor.py SRC OUT WORKERS

`model_free_ptq(scheme="FP8_DYNAMIC")` (FP8 weights per channel, dynamic per-token activations: the
scheme of our fp8_channel) over the same safetensors, quantizing the Linears wan-fp8.yaml quantizes
(every other one ignored), on the CPU. llm-compressor is never a dependency of dit-quantize.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: nothing to fetch

from llmcompressor import model_free_ptq  # noqa: E402

TARGETS = r"blocks\.\d+\.(self_attn|cross_attn)\.(q|k|v|o)|blocks\.\d+\.ffn\.0"


def transformers_view(src: Path, view: Path) -> Path:
    """`src` with its shards hard-linked under the names model_free_ptq looks for (model-0000i-of-0000n)."""
    view.mkdir(parents=True, exist_ok=True)
    index = next(src.glob("*.safetensors.index.json"), None)
    shards = sorted(src.glob("*.safetensors"))
    names = {s.name: s.name.replace("diffusion_pytorch_model", "model") for s in shards}
    for old, new in names.items():
        if not (view / new).exists():
            os.link(src / old, view / new)
    for extra in ("config.json",):
        if (src / extra).exists() and not (view / extra).exists():
            os.link(src / extra, view / extra)
    if index is not None:
        data = json.loads(index.read_text())
        data["weight_map"] = {k: names[v] for k, v in data["weight_map"].items()}
        (view / "model.safetensors.index.json").write_text(json.dumps(data))
    return view


if __name__ == "__main__":
    src, out, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    if len(sys.argv) > 4:  # prepare the view only (not timed)
        transformers_view(src, Path(sys.argv[4]))
        sys.exit(0)
    model_free_ptq(
        model_stub=str(src),
        save_directory=out,
        scheme="FP8_DYNAMIC",
        ignore=[f"re:^(?!({TARGETS})$).*"],
        max_workers=workers,
        device="cpu",
    )
