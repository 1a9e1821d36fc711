"""Our checkpoints on N devices: FSDP2 over the blocks and diffusers' Ulysses context parallelism, against one device
with block offload. A multi-GPU machine runs it as it is, one process per GPU, under `torchrun`.

Wan2.1 T2V 14B, a transformer folder written by ``quantize convert`` (any format), on 2, 4 and 8 GPUs::

    torchrun --standalone --nproc_per_node 2 benchmarks/multi_gpu.py Wan2.1-T2V-14B-fp8/transformer --json wan14b-2gpu.json
    torchrun --standalone --nproc_per_node 4 benchmarks/multi_gpu.py Wan2.1-T2V-14B-fp8/transformer --json wan14b-4gpu.json
    torchrun --standalone --nproc_per_node 8 benchmarks/multi_gpu.py Wan2.1-T2V-14B-fp8/transformer --json wan14b-8gpu.json

Wan2.2 T2V A14B (its two experts, ``high_noise_model/`` and ``low_noise_model/``, or a diffusers pipeline's
``transformer/`` and ``transformer_2/``): the checkpoint's root loads both, each sharded and run in turn, both held as
a pipeline holds them; ``--expert`` picks one::

    torchrun --standalone --nproc_per_node 2 benchmarks/multi_gpu.py Wan2.2-T2V-A14B-fp8 --json a14b-2gpu.json
    torchrun --standalone --nproc_per_node 4 benchmarks/multi_gpu.py Wan2.2-T2V-A14B-fp8 --json a14b-4gpu.json
    torchrun --standalone --nproc_per_node 8 benchmarks/multi_gpu.py Wan2.2-T2V-A14B-fp8 --json a14b-8gpu.json
    torchrun --standalone --nproc_per_node 8 benchmarks/multi_gpu.py Wan2.2-T2V-A14B-fp8 --expert low_noise_model

Each rank (NCCL on CUDA, one GPU each; gloo with ``--device cpu``, which is how the tests run it on two CPU ranks):

1. loads the model with ``loaders.load_quantized(<the class its config names>, folder, host="mmap")`` onto the host;
2. FSDP2: ``fully_shard(block, reshard_after_forward=True)`` over each transformer block (``loaders.find_blocks``),
   then over the model (``--blocks-only``: the blocks alone, the rest replicated on every rank); no
   ``MixedPrecisionPolicy``: the weights are stored in their compute dtypes. ``fully_shard`` moves what it manages to
   the rank's device and keeps 1/N of it there;
3. context parallelism: ``loaders.parallel.enable_context_parallel(model, ContextParallelConfig(ulysses_degree=N))``
   (``--no-cp``: FSDP alone, every rank computing the whole sequence), attention backend ``native`` on the CPU, on
   CUDA what diffusers picks unless ``--attention-backend`` names one;
4. runs one warm-up and ``--steps`` denoiser steps on random inputs shaped for a ``--frames`` x ``--height`` x
   ``--width`` video (Wan's VAE: 4x in time, 8x in space) and ``--text-len`` text tokens, the same on every rank.

Then (``--baseline``, the default) rank 0 alone, the others waiting, loads the same folder again into host memory
(pinned on CUDA, pageable on the CPU), runs it on its one device under ``loaders.enable_block_offload`` with the same
inputs, and compares: the distributed output against the single-device one (max abs diff; exact is expected for every
format but comfy_fp8 where its kernel runs (``--compute fast`` on a GPU from SM89, ``kernel``) and the checkpoint has
no calibrated input scale: its dynamic per-tensor activation scale depends on the tokens a rank holds, see
loaders/parallel.py for the bound).

The JSON (``--json PATH``, written by rank 0) holds: ``world_size``, ``backend``, ``device`` (and the GPU's name),
``torch`` / ``diffusers`` versions, ``parallel`` (fsdp, blocks_only, ulysses_degree or null, attention_backend),
``inputs`` (the video size, the latent's shape, the tokens, the dtype), and under ``models`` for each model folder
(``transformer``, or ``high_noise_model`` and ``low_noise_model``): its ``format``, ``bytes`` (every parameter and
buffer of the whole model: ``blocks``, ``rest``), ``ranks`` (per rank: ``block_bytes`` and ``rest_bytes`` it holds,
the sums of the local shards' nbytes of the parameters and buffers, ``block_fraction`` of the whole blocks',
``peak_setup_bytes`` from the load to the sharded model, ``peak_step_bytes`` over the steps,
``step_s`` the median step, ``step_times_s``), ``ranks_max_abs_diff`` (each rank's output against rank 0's), and
``baseline`` (``host``, ``step_s``, ``peak_bytes``, ``max_abs_diff`` and ``equal`` against the distributed output).
Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA, the process's peak RSS (Linux's VmHWM, reset between
phases) on the CPU: ``memory`` says which. Rank 0 prints a table of the same. ``--outputs PATH`` (rank 0) writes
each model's inputs and distributed output to a safetensors file, keyed ``<model>/<name>``, for a check of its own.

On CPU ranks, a tiny checkpoint (what tests/test_multi_gpu_script.py runs)::

    torchrun --standalone --nproc_per_node 2 benchmarks/multi_gpu.py CKPT --device cpu --threads 1 \
        --frames 5 --height 64 --width 64 --text-len 8 --steps 1 --json report.json

Where it has run: on two CPU ranks (gloo), every format of a tiny Wan, exact against one process with block offload
but comfy_fp8 with ``--compute kernel``, each rank holding 0.49-0.51 of the blocks' bytes. The CUDA path (NCCL, ``fully_shard`` moving each block from the host's
memory map onto its GPU, pinned block offload for the baseline) is written to torch's and diffusers' CUDA semantics
and has not yet run on a multi-GPU machine.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `loaders`, `quantize` without an install

if TYPE_CHECKING:
    import torch
    from torch import nn

#: Wan's VAE: a latent frame per 4 video frames (plus the first), a latent pixel per 8x8
VAE_TIME, VAE_SPACE = 4, 8
#: the class a config naming no diffusers class (an original release's `WanModel`) is loaded as
DEFAULT_CLASS = "WanTransformer3DModel"
#: a rank's figures, gathered to rank 0 as one float64 row each (after these, the step times)
FIGURES = ("block_bytes", "rest_bytes", "peak_setup_bytes", "peak_step_bytes", "step_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "checkpoint",
        type=Path,
        help="a model folder written by `quantize convert`, its file, or a "
        "checkpoint of several (Wan2.2 A14B's experts, a pipeline)",
    )
    ap.add_argument(
        "--expert",
        help="the model folder to load of several (high_noise_model, low_noise_model, "
        "transformer_2); default: each",
    )
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="cuda: NCCL, a GPU per rank; cpu: gloo"
    )
    ap.add_argument(
        "--blocks-only", action="store_true", help="shard the blocks alone; the rest is replicated"
    )
    ap.add_argument("--no-cp", action="store_true", help="FSDP2 alone: no context parallelism")
    ap.add_argument(
        "--attention-backend",
        help="diffusers' attention backend (default: native on the CPU, diffusers' own choice on CUDA)",
    )
    ap.add_argument("--compute", choices=["fast", "dequantize", "kernel"], default="fast")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument(
        "--image-len",
        type=int,
        default=257,
        help="image-embedding tokens, where the model takes them (Wan2.1 I2V)",
    )
    ap.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run rank 0 alone with block offload afterwards and compare",
    )
    ap.add_argument("--threads", type=int, help="torch threads per rank on the CPU (default: cores / ranks)")
    ap.add_argument(
        "--timeout-min",
        type=float,
        default=60.0,
        help="collective timeout: the other ranks wait this long for rank 0's baseline",
    )
    ap.add_argument("--json", type=Path, help="write the figures here (rank 0)")
    ap.add_argument(
        "--outputs",
        type=Path,
        help="a safetensors file (rank 0): each model's inputs and distributed output, '<model>/<name>'",
    )
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    return args


# -- the process group ---------------------------------------------------------------------------------------------


def init_distributed(args: argparse.Namespace) -> torch.device:
    """The process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR in the environment), this rank's device."""
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        raise SystemExit(
            "run under torchrun: torchrun --standalone --nproc_per_node N benchmarks/multi_gpu.py ..."
        )
    timeout = datetime.timedelta(minutes=args.timeout_min)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: pass --device cpu to run on CPU ranks (gloo)")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        return device
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", timeout=timeout)
    return torch.device("cpu")


# -- the checkpoint ------------------------------------------------------------------------------------------------


def model_folders(checkpoint: Path, expert: str | None) -> list[Path]:
    """The model folders to load: each of the checkpoint's (`loaders.find_components`), or the one `expert` names."""
    from loaders import find_components

    if checkpoint.is_file():  # a ComfyUI file or a GGUF: its folder holds its config.json
        checkpoint = checkpoint.parent
    folders = find_components(checkpoint)
    if expert is None:
        return folders
    picked = [f for f in folders if f.name == expert]
    if not picked:
        names = ", ".join(f.name for f in folders)
        raise SystemExit(
            f"{checkpoint}: no model folder {expert!r} (it holds {names}): pass one of those to --expert"
        )
    return picked


def model_class(folder: Path) -> type:
    """The diffusers class the folder's config.json names, else `DEFAULT_CLASS` (a release's own `WanModel`)."""
    import diffusers

    name = json.loads((folder / "config.json").read_text()).get("_class_name")
    return (
        getattr(diffusers, name, None)
        if name and hasattr(diffusers, name)
        else getattr(diffusers, DEFAULT_CLASS)
    )


def checkpoint_format(folder: Path) -> str:
    """The format the folder's config.json declares (its `quantization_config`, read as the loader reads it)."""
    from quantize.formats import format_of_config

    config = folder / "config.json"
    return format_of_config(json.loads(config.read_text())["quantization_config"], str(config)).NAME


def load(folder: Path, host: str, compute: str) -> nn.Module:
    """The folder's model on the host (`host`: mmap, pageable or pinned), every tensor as stored."""
    from loaders import load_quantized

    return load_quantized(model_class(folder), folder, host=host, compute=compute)


# -- the bytes each rank holds -------------------------------------------------------------------------------------


def held_bytes(model: nn.Module, block_names: list[str]) -> tuple[int, int]:
    """(block bytes, rest bytes) this rank holds: `loaders.parallel.held_bytes` (a sharded tensor's local shard) of
    the blocks, and of the model less them."""
    from loaders.parallel import held_bytes as held

    blocks, _ = held([model.get_submodule(name) for name in block_names])
    everything, _ = held([model])
    return blocks, everything - blocks


# -- FSDP2 and context parallelism ---------------------------------------------------------------------------------


def shard(model: nn.Module, device: torch.device, blocks_only: bool) -> list[str]:
    """FSDP2 over each block, then the model (or, `blocks_only`, the rest moved to `device` whole); the blocks' names."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from loaders import find_blocks

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    blocks = find_blocks(model)
    for _, block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    names = [name for name, _ in blocks]
    if blocks_only:
        move_rest(model, device, names)
    else:
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return names


def move_rest(model: nn.Module, device: torch.device, block_names: list[str]) -> None:
    """Every parameter and buffer outside the blocks onto `device`, in place (as `fully_shard` moves what it
    manages: ``tensor.data = tensor.to(device)``, the same objects)."""
    import torch

    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with torch.no_grad():
        for name, t in tensors.items():
            if not any(name.startswith(b + ".") for b in block_names) and t.device != device:
                t.data = t.to(device)


def attention_backend(args: argparse.Namespace, device: torch.device) -> str | None:
    """The attention backend to set: `--attention-backend`, else ``native`` on the CPU (the one that runs there
    under context parallelism), else None: diffusers' own choice."""
    return args.attention_backend or ("native" if device.type == "cpu" else None)


def set_backend(model: nn.Module, backend: str | None) -> None:
    if backend:
        model.set_attention_backend(backend)


def context_parallel(model: nn.Module, world: int) -> None:
    """Ulysses over every rank: diffusers' hooks split the sequence at the class's plan (`loaders.parallel`, imported
    here: FSDP alone, ``--no-cp``, needs none of it)."""
    from diffusers import ContextParallelConfig

    from loaders.parallel import enable_context_parallel

    enable_context_parallel(model, ContextParallelConfig(ulysses_degree=world))


# -- inputs and steps ----------------------------------------------------------------------------------------------


def latent_shape(config, args: argparse.Namespace) -> tuple[int, int, int, int]:
    """(channels, frames, height, width) of the latent of a `--frames` x `--height` x `--width` video."""
    _, ph, pw = config.patch_size
    if args.height % (VAE_SPACE * ph) or args.width % (VAE_SPACE * pw) or (args.frames - 1) % VAE_TIME:
        raise SystemExit(
            f"--height and --width must be multiples of {VAE_SPACE * ph} and --frames of the form 4k+1 "
            f"(got {args.frames} x {args.height} x {args.width})"
        )
    return (
        config.in_channels,
        (args.frames - 1) // VAE_TIME + 1,
        args.height // VAE_SPACE,
        args.width // VAE_SPACE,
    )


def tokens(config, latent: tuple[int, int, int, int]) -> int:
    pt, ph, pw = config.patch_size
    return (latent[1] // pt) * (latent[2] // ph) * (latent[3] // pw)


def check_split(config, args: argparse.Namespace, world: int) -> None:
    """Ulysses splits the video's tokens evenly over the ranks: a size that does not divide is named up front."""
    n = tokens(config, latent_shape(config, args))
    if n % world:
        raise SystemExit(
            f"{args.frames} x {args.height} x {args.width} makes {n} tokens, not a multiple of {world} ranks: "
            "change --frames, --height or --width (or pass --no-cp)"
        )


def make_inputs(config, args: argparse.Namespace, device: torch.device) -> dict:
    """One denoiser step's inputs, random from `--seed` (the same on every rank), in bf16 on `device`."""
    import torch

    g = torch.Generator().manual_seed(args.seed)
    bf16 = torch.bfloat16
    inputs = dict(
        hidden_states=torch.randn(1, *latent_shape(config, args), generator=g).to(bf16),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, args.text_len, config.text_dim, generator=g).to(bf16),
    )
    if getattr(config, "image_dim", None):
        inputs["encoder_hidden_states_image"] = torch.randn(
            1, args.image_len, config.image_dim, generator=g
        ).to(bf16)
    return {k: v.to(device) for k, v in inputs.items()} | {"return_dict": False}


def run_steps(model: nn.Module, inputs: dict, steps: int, device: torch.device, synced: bool) -> tuple:
    """One warm-up and `steps` timed steps: (the last output, on the CPU, as float32; the step times in seconds)."""
    import torch
    import torch.distributed as dist

    times, out = [], None
    with torch.inference_mode():
        for i in range(steps + 1):
            if synced:
                dist.barrier()
            sync(device)
            start = time.perf_counter()
            out = model(**inputs)[0]
            sync(device)
            if i:
                times.append(time.perf_counter() - start)
    return out.float().cpu(), times


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- peak memory ---------------------------------------------------------------------------------------------------


def memory_kind(device: torch.device) -> str:
    return "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS (VmHWM)"


def reset_peak(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator statistics, or the process's RSS high-water mark (Linux: clear_refs 5)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux: the peak stays the process's, since it started


def peak(device: torch.device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# -- one model: distributed, then the baseline ---------------------------------------------------------------------


def run_distributed(
    folder: Path, args: argparse.Namespace, device: torch.device
) -> tuple[dict, nn.Module, dict]:
    """Load, shard, parallelize and step one model on every rank: (its figures, gathered on rank 0; the model,
    kept as a pipeline keeps it; its inputs and this rank's output, on the CPU)."""
    import torch.distributed as dist

    from loaders import find_blocks

    reset_peak(device)
    model = load(folder, "mmap", args.compute)
    whole = held_bytes(model, [name for name, _ in find_blocks(model)])
    if not args.no_cp:
        check_split(model.config, args, dist.get_world_size())
    block_names = shard(model, device, args.blocks_only)
    set_backend(model, attention_backend(args, device))
    if not args.no_cp:
        context_parallel(model, dist.get_world_size())
    blocks, rest = held_bytes(model, block_names)
    peak_setup = peak(device)
    inputs = make_inputs(model.config, args, device)
    reset_peak(device)
    out, times = run_steps(model, inputs, args.steps, device, synced=True)
    figures = [blocks, rest, peak_setup, peak(device), statistics.median(times), *times]
    rows = gather(figures, device)
    spread = ranks_max_abs_diff(out, device)
    result = {
        "format": checkpoint_format(folder),
        "class": type(model).__name__.removeprefix("FSDP"),
        "bytes": {"blocks": whole[0], "rest": whole[1]},
        "ranks": [rank_figures(r, row, whole[0]) for r, row in enumerate(rows)],
        "ranks_max_abs_diff": spread,
    }
    tensors = {k: v.cpu() for k, v in inputs.items() if k != "return_dict"} | {"output": out}
    return result, model, tensors


def gather(figures: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's figures (one float64 row each, exact for byte counts below 2**53), on every rank."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor(figures, dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [r.tolist() for r in rows]


def rank_figures(rank: int, row: list[float], block_total: int) -> dict:
    named = dict(zip(FIGURES, row, strict=False))
    ints = {k: int(named[k]) for k in FIGURES if k.endswith("bytes")}
    return {
        "rank": rank,
        **ints,
        "block_fraction": round(ints["block_bytes"] / block_total, 4) if block_total else None,
        "step_s": named["step_s"],
        "step_times_s": row[len(FIGURES) :],
    }


def ranks_max_abs_diff(out, device: torch.device) -> float:
    """The largest difference of any rank's output from rank 0's (0.0: every rank returned the same)."""
    import torch.distributed as dist

    ref = out.to(device)
    dist.broadcast(ref, src=0)
    diff = (out.to(device) - ref).abs().max().reshape(1).double()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return diff.item()


def run_baseline(folder: Path, args: argparse.Namespace, device: torch.device, distributed_out) -> dict:
    """Rank 0 alone: the model in host memory (pinned on CUDA, pageable on the CPU) under block offload onto its one
    device, the same inputs: its step time, peak memory and its output against the distributed one."""
    import torch

    from loaders import enable_block_offload

    host = "pinned" if device.type == "cuda" else "pageable"
    reset_peak(device)
    model = load(folder, host, args.compute)
    set_backend(model, attention_backend(args, device))
    offloader = enable_block_offload(model, device=device, host=host)
    inputs = make_inputs(model.config, args, device)
    out, times = run_steps(model, inputs, args.steps, device, synced=False)
    figures = {
        "host": host,
        "step_s": statistics.median(times),
        "step_times_s": times,
        "peak_bytes": peak(device),
        "max_abs_diff": (out - distributed_out).abs().max().item(),
        "equal": bool(torch.equal(out, distributed_out)),
    }
    offloader.remove()
    del model, offloader
    release(device)
    return figures


def release(device: torch.device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- the report ----------------------------------------------------------------------------------------------------


def header(args: argparse.Namespace, device: torch.device, first_config) -> dict:
    import diffusers
    import torch
    import torch.distributed as dist

    latent = latent_shape(first_config, args)
    world = dist.get_world_size()
    return {
        "checkpoint": str(args.checkpoint),
        "world_size": world,
        "backend": dist.get_backend(),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "memory": memory_kind(device),
        "parallel": {
            "fsdp": True,
            "blocks_only": args.blocks_only,
            "ulysses_degree": None if args.no_cp else world,
            "attention_backend": args.attention_backend
            or ("native" if device.type == "cpu" else "diffusers' default"),
            "compute": args.compute,
        },
        "inputs": {
            "frames": args.frames,
            "height": args.height,
            "width": args.width,
            "text_len": args.text_len,
            "latent": list(latent),
            "tokens": tokens(first_config, latent),
            "dtype": "bfloat16",
            "steps": args.steps,
        },
    }


def table(report: dict) -> str:
    """A short plain-text table: a line per model and rank, a line per baseline."""
    mib = 2**20
    lines = [
        f"{report['world_size']} x {report['device_name']} ({report['backend']}), "
        f"ulysses {report['parallel']['ulysses_degree'] or 'off'}, {report['inputs']['tokens']} tokens, "
        f"peak = {report['memory']}",
        f"{'model':<18} {'rank':>8} {'blocks MiB':>11} {'of all':>7} {'rest MiB':>9} {'peak MiB':>9} {'step s':>8}",
    ]
    for name, m in report["models"].items():
        for r in m["ranks"]:
            lines.append(
                f"{name:<18} {r['rank']:>8} {r['block_bytes'] / mib:>11.1f} {r['block_fraction']:>7.3f} "
                f"{r['rest_bytes'] / mib:>9.1f} {r['peak_step_bytes'] / mib:>9.1f} {r['step_s']:>8.3f}"
            )
        b = m.get("baseline")
        if b:
            same = "equal" if b["equal"] else f"max abs diff {b['max_abs_diff']:.3g}"
            lines.append(
                f"{name:<18} {'1+offld':>8} {m['bytes']['blocks'] / mib:>11.1f} {1:>7.3f} "
                f"{m['bytes']['rest'] / mib:>9.1f} {b['peak_bytes'] / mib:>9.1f} {b['step_s']:>8.3f}  "
                f"output {same}"
            )
    return "\n".join(lines)


def save_outputs(outputs: dict[str, dict], path: Path) -> None:
    """Each model's inputs and output in one safetensors file, keyed ``<model>/<name>``."""
    from safetensors.torch import save_file

    save_file({f"{m}/{k}": t.contiguous() for m, ts in outputs.items() for k, t in ts.items()}, str(path))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch.distributed as dist

    from loaders.parallel import fsdp_problem
    from quantize.errors import InputError

    if (problem := fsdp_problem()) is not None:
        sys.exit(f"multi_gpu.py: {problem}")
    try:
        folders = model_folders(args.checkpoint, args.expert)
    except (
        InputError
    ) as e:  # a checkpoint that is not there or holds no model: one line, before any rank waits
        print(f"multi_gpu.py: {e}", file=sys.stderr)
        sys.exit(2)

    device = init_distributed(args)
    rank = dist.get_rank()
    try:
        models, outputs, kept = {}, {}, []
        for folder in folders:
            result, model, tensors = run_distributed(folder, args, device)
            models[folder.name], outputs[folder.name] = result, tensors
            kept.append(model)
        report = header(args, device, kept[0].config)
        if args.baseline:
            del kept, model  # the distributed models freed before the single-device run
            release(device)
            if rank == 0:
                for folder in folders:
                    models[folder.name]["baseline"] = run_baseline(
                        folder, args, device, outputs[folder.name]["output"]
                    )
            dist.barrier()
        report["models"] = models
        if rank == 0:
            print(table(report), flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=2) + "\n")
            if args.outputs:
                save_outputs(outputs, args.outputs)
    except InputError as e:  # a checkpoint that does not fit its class (every rank finds the same): one line
        if rank == 0:
            print(f"multi_gpu.py: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
