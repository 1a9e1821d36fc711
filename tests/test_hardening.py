"""Bad input, faults and interruption, through the command line as a user meets them.

Every case checks what a user would: the exit code, one `error:` line naming the file, tensor or pattern at
fault, no traceback, nothing left in (or beside) OUT, an old OUT intact, and the source untouched.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantize.publish.converter import convert
from tests.conftest import QUANTIZE, process_env, run_cli, run_process

TARGET = "blocks.0.ffn.0.weight"  # quantized by wan-fp8
SHARD = "diffusion_pytorch_model-00002-of-00003.safetensors"  # holds TARGET


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` and its SHA-256: what "untouched" and "intact" are checked against."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def leftovers(out: Path) -> list[str]:
    """Temporary directories, moved-aside checkpoints and lock files of OUT's conversions."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def assert_refused(proc, code: int, *needles: str, out: Path, out_before: dict | None = None) -> str:
    """One clean error line holding every needle; OUT as it was (absent, or `out_before`), nothing beside it."""
    assert proc.returncode == code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert "Traceback" not in proc.stderr
    if out_before is None:
        assert not out.exists()
    else:
        assert tree(out) == out_before
    assert leftovers(out) == []
    return errors[0]


@pytest.fixture
def src(wan_tiny, tmp_path) -> Path:
    """A private copy of the tiny Wan checkpoint, to break; the test checks it was not written to."""
    return Path(shutil.copytree(wan_tiny, tmp_path / "src"))


def _tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _edit_tensors(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors, metadata = _tensors(path)
    edit(tensors)
    save_file(tensors, path, metadata=metadata)


def _edit_header(path: Path, edit: Callable[[dict], None]) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def _edit_index(src: Path, edit: Callable[[dict], None]) -> None:
    index = src / "diffusion_pytorch_model.safetensors.index.json"
    data = json.loads(index.read_text())
    edit(data["weight_map"])
    index.write_text(json.dumps(data))


def _first_key(weight_map: dict) -> str:
    return sorted(weight_map)[0]


def _set(mapping: dict, key: str, value) -> None:
    mapping[key] = value


# --- the source ---------------------------------------------------------------------------------------

SOURCE_CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "no safetensors": (
        lambda s: [p.unlink() for p in s.glob("diffusion_pytorch_model*")],
        ("no *.safetensors files",),
    ),
    "truncated shard": (
        lambda s: (s / SHARD).write_bytes((s / SHARD).read_bytes()[:-1000]),
        (SHARD, "truncated"),
    ),
    "header not JSON": (
        lambda s: (s / SHARD).write_bytes((s / SHARD).read_bytes()[:8] + b"#" + (s / SHARD).read_bytes()[9:]),
        (SHARD, "header is not valid JSON"),
    ),
    "offsets out of bounds": (
        lambda s: _edit_header(s / SHARD, lambda h: _set(h[TARGET], "data_offsets", [0, 10**12])),
        (SHARD, TARGET),
    ),
    "header length past the end": (
        lambda s: (s / SHARD).write_bytes(struct.pack("<Q", 10**9) + (s / SHARD).read_bytes()[8:]),
        (SHARD, "runs past the end of the file"),
    ),
    "index names a missing shard": (
        lambda s: _edit_index(s, lambda m: _set(m, _first_key(m), "gone.safetensors")),
        ("index.json", "'gone.safetensors', which does not exist"),
    ),
    "index path leaves the checkpoint": (
        lambda s: _edit_index(s, lambda m: _set(m, _first_key(m), f"../src/{m[_first_key(m)]}")),
        ("index.json", "leaves the checkpoint directory"),
    ),
    "index path is absolute": (
        lambda s: _edit_index(s, lambda m: _set(m, _first_key(m), str(s / m[_first_key(m)]))),
        ("index.json", "leaves the checkpoint directory"),
    ),
    "a key in two shards": (
        lambda s: _edit_tensors(
            s / "diffusion_pytorch_model-00003-of-00003.safetensors",
            lambda t: _set(t, TARGET, _tensors(s / SHARD)[0][TARGET]),
        ),
        (f"tensor {TARGET!r} is in both", SHARD),
    ),
    "NaN in a weight to quantize": (
        lambda s: _edit_tensors(s / SHARD, lambda t: t[TARGET].view(-1).__setitem__(5, float("nan"))),
        (SHARD, f"tensor {TARGET!r} holds NaN or Inf values"),
    ),
    "Inf in a weight to quantize": (
        lambda s: _edit_tensors(s / SHARD, lambda t: t[TARGET].view(-1).__setitem__(7, float("-inf"))),
        (SHARD, f"tensor {TARGET!r} holds NaN or Inf values"),
    ),
    "an integer weight": (
        lambda s: _edit_tensors(s / SHARD, lambda t: _set(t, TARGET, t[TARGET].to(torch.int8))),
        (SHARD, f"tensor {TARGET!r} is I8, an integer weight", "already quantized"),
    ),
    "an fp8 weight": (
        lambda s: _edit_tensors(s / SHARD, lambda t: _set(t, TARGET, t[TARGET].to(torch.float8_e4m3fn))),
        (SHARD, f"tensor {TARGET!r} is F8_E4M3", "already quantized"),
    ),
    "a quantized weight's part": (
        lambda s: (
            _edit_tensors(s / SHARD, lambda t: _set(t, f"{TARGET}_scale", torch.ones(t[TARGET].shape[0], 1))),
            _edit_index(s, lambda m: _set(m, f"{TARGET}_scale", SHARD)),
        ),
        (SHARD, f"tensor '{TARGET}_scale' (F32) is a part of a quantized weight", "already quantized"),
    ),
    "an empty model": (
        lambda s: (
            [p.unlink() for p in s.glob("diffusion_pytorch_model*")],
            save_file({}, s / "diffusion_pytorch_model.safetensors"),
        ),
        ("the checkpoint holds no tensors",),
    ),
}


@pytest.mark.parametrize("case", SOURCE_CASES)
def test_a_bad_source_is_refused_cleanly_and_left_untouched(src, tmp_path, case):
    mutate, needles = SOURCE_CASES[case]
    mutate(src)
    before = tree(src)
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "-r", "wan-fp8")
    assert_refused(proc, 2, *needles, out=out)
    assert tree(src) == before


def test_a_missing_source_directory(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", tmp_path / "nowhere", out, "-r", "wan-fp8")
    assert_refused(proc, 2, f"{tmp_path / 'nowhere'}: source not found", out=out)


@pytest.mark.parametrize("recipe", ["wan-fp8", "wan-nf4", "wan-torchao-fp8"])
def test_an_already_quantized_checkpoint_is_not_a_source(wan_tiny, tmp_path, recipe):
    quantized = tmp_path / "quantized"
    convert(wan_tiny, quantized, recipe, workers=1)
    proc = run_cli("convert", quantized, tmp_path / "again", "-r", "wan-fp8")
    assert_refused(
        proc, 2, "config.json: has a quantization_config", "already quantized", out=tmp_path / "again"
    )
    # without the config, the tensors tell
    (quantized / "config.json").unlink()
    proc = run_cli("convert", quantized, tmp_path / "again", "-r", "wan-fp8")
    assert_refused(proc, 2, "already quantized", out=tmp_path / "again")


# --- the recipe ---------------------------------------------------------------------------------------

RECIPE_CASES = {
    "unknown key": ("format: fp8_channel\ntargets: ['x']\ntarget: ['y']\n", "unknown key 'target'"),
    "bad regex": (
        "format: fp8_channel\ntargets: ['blocks\\.(\\d+']\n",
        "bad regular expression 'blocks\\.(\\d+'",
    ),
    "pattern matching nothing": (
        "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.9']\n",
        "pattern 'blocks\\.\\d+\\.ffn\\.9' matches no module",
    ),
    "target hits a bias": (
        "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.ffn\\.0\\.bias']\n",
        "hits tensor 'blocks.0.ffn.0.bias' BF16[",
    ),
    "target hits a norm": (
        "format: fp8_channel\ntargets: ['blocks\\.\\d+\\.norm3']\n",
        "hits tensor 'blocks.0.norm3.weight'",
    ),
    "target hits a 5-D conv": (
        "format: fp8_channel\ntargets: ['patch_embedding']\n",
        "hits tensor 'patch_embedding.weight' BF16[",
    ),
    "two formats": ("format: [fp8_channel, nf4]\ntargets: ['x']\n", "a recipe has one format"),
    "a format per pattern": ("format: fp8_channel\ntargets: {'x': nf4}\n", "a recipe has one format"),
    "not YAML": ("format: [fp8_channel\n", "not valid YAML"),
    "binary": ("\x00\x01", "not valid YAML"),
}


@pytest.mark.parametrize("case", RECIPE_CASES)
def test_a_bad_recipe_is_refused_naming_the_field_or_pattern(wan_tiny, tmp_path, case):
    text, needle = RECIPE_CASES[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    out = tmp_path / "out"
    assert_refused(run_cli("convert", wan_tiny, out, "-r", recipe), 2, needle, out=out)


def test_an_unknown_bundled_recipe_lists_the_bundled_ones(wan_tiny, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", wan_tiny, out, "-r", "wan-fp9")
    line = assert_refused(proc, 2, "recipe 'wan-fp9': no such file, and no bundled recipe", out=out)
    assert "wan-fp8.yaml" in line and "wan-nf4.yaml" in line


@pytest.mark.parametrize(
    "fmt, needle",
    [
        ("torchao_fp8", "torchao_fp8 needs both dims to be multiples of 16"),
        ("nf4", "nf4 needs in_features to be a multiple of 64"),
    ],
)
def test_a_shape_the_format_s_consumers_cannot_load_is_refused(tmp_path, fmt, needle):
    source = tmp_path / "odd"
    source.mkdir()
    save_file({"proj.weight": torch.randn(24, 40).bfloat16()}, source / "model.safetensors")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"format: {fmt}\ntargets: ['proj']\n")
    out = tmp_path / "out"
    assert_refused(run_cli("convert", source, out, "-r", recipe), 2, "tensor 'proj.weight'", needle, out=out)


# --- the output ---------------------------------------------------------------------------------------


def test_an_existing_output_is_kept_without_overwrite(wan_tiny, tmp_path):
    out = tmp_path / "out"
    convert(wan_tiny, out, "wan-fp8", workers=1)
    before = tree(out)
    proc = run_cli("convert", wan_tiny, out, "-r", "wan-nf4")
    assert_refused(proc, 2, f"{out}: already exists; pass --overwrite", out=out, out_before=before)


def _read_only(directory: Path):
    """Make `directory` unwritable, even for root (an immutable flag), or skip."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return lambda: directory.chmod(0o755)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", directory]).returncode != 0:
        pytest.skip("running as root without chattr +i: no way to make a directory read-only here")
    return lambda: subprocess.run(["chattr", "-i", directory], check=True)


def test_an_unwritable_output_location(wan_tiny, tmp_path):
    parent = tmp_path / "locked"
    parent.mkdir()
    undo = _read_only(parent)
    try:
        proc = run_cli("convert", wan_tiny, parent / "out", "-r", "wan-fp8")
    finally:
        undo()
    assert_refused(proc, 2, f"{parent}: cannot create the output there", out=parent / "out")


def _file_size_limit(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG

    return apply


def _run_limited(*args, limit: int) -> subprocess.CompletedProcess:
    """A process of its own: the file size limit is the process's."""
    return run_process(*args, preexec_fn=_file_size_limit(limit))


@pytest.mark.parametrize("old_output", [False, True])
def test_the_disk_filling_up_mid_write_leaves_nothing_and_keeps_the_old_output(
    wan_tiny, tmp_path, old_output
):
    out = tmp_path / "out"
    before = None
    if old_output:
        convert(wan_tiny, out, "wan-fp8", workers=1)
        before = tree(out)
    # 100 kB per file: the conversion's first output shard does not fit
    proc = _run_limited("convert", wan_tiny, out, "-r", "wan-fp8-all", "--overwrite", limit=100_000)
    line = assert_refused(proc, 1, f"{out}/diffusion_pytorch_model-0000", out=out, out_before=before)
    assert "File too large" in line and "free some space" in line and f"{out} is unchanged" in line


def _unshare_tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt && umount /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_tmpfs_works(), reason="cannot mount a small tmpfs here (needs unshare -m)")
def test_a_real_full_disk(wan_tiny, tmp_path):
    """No space left on device, on a 200 kB tmpfs in a private mount namespace."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f"mount -t tmpfs -o size=200k tmpfs {disk} && "
        f"{QUANTIZE} convert {wan_tiny} {disk}/out -r wan-fp8-all; rc=$?; "
        f"ls -A {disk}; exit $rc"
    )
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "free some space" in errors[0]
    assert f"{disk}/out/" in errors[0] and ".tmp-" not in errors[0]
    assert proc.stdout.strip() == ""  # the tmpfs held nothing at the end: no temporary directory, no lock


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [QUANTIZE, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=process_env(),
    )


def _wait_for_progress(proc: subprocess.Popen, out: Path) -> None:
    """Until the conversion has written part of its output (a progress line past 0%)."""
    for line in proc.stderr:
        if line.startswith("convert:") and "%" in line:
            assert any(p.name.startswith(f".{out.name}.tmp-") for p in out.parent.iterdir())
            return
    raise AssertionError(f"the conversion ended before it made progress: {proc.wait()}")


@pytest.fixture(scope="module")
def wan_small(tmp_path_factory) -> Path:
    """Big enough (8 MB, ~2 s of nf4 on one worker) to be interrupted halfway."""
    from quantize.examples import write_example

    return write_example(tmp_path_factory.mktemp("small") / "wan-small", "small", "t2v")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("old_output", [False, True])
def test_an_interrupted_conversion_leaves_nothing_and_keeps_the_old_output(
    wan_small, tmp_path, sig, old_output
):
    out = tmp_path / "out"
    before = None
    if old_output:
        out.mkdir()
        (out / "quantize_manifest.json").write_text(
            "{}"
        )  # an earlier checkpoint, as far as --overwrite cares
        before = tree(out)
    proc = _start("convert", wan_small, out, "-r", "wan-nf4", "--workers", "1", "--overwrite")
    _wait_for_progress(proc, out)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert_refused(done, 128 + sig, f"interrupted by {sig.name}", out=out, out_before=before)


def test_a_killed_conversion_is_cleaned_up_by_the_next_one(wan_small, wan_tiny, tmp_path):
    out = tmp_path / "out"
    convert(wan_tiny, out, "wan-fp8", workers=1)
    before = tree(out)
    proc = _start("convert", wan_small, out, "-r", "wan-nf4", "--workers", "1", "--overwrite")
    _wait_for_progress(proc, out)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.communicate(timeout=60)
    stale = leftovers(out)
    assert any(".tmp-" in name for name in stale) and tree(out) == before
    # a run killed between its two renames left the old checkpoint aside and no OUT
    os.rename(out, out.parent / f".{out.name}.old-deadbeef")
    proc = run_cli("convert", wan_tiny, out, "-r", "wan-fp8")
    assert_refused(proc, 2, "already exists", out=out, out_before=before)  # put back first, then refused
    assert (
        f"restored {out} from .{out.name}.old-deadbeef, left by a conversion that was killed" in proc.stderr
    )
    assert f"removed .{out.name}.tmp-" in proc.stderr


def test_a_second_conversion_into_a_busy_output_is_refused(wan_tiny, tmp_path):
    out = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    with open(lock, "w") as held:  # what a running conversion holds
        held.write("4242\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = run_cli("convert", wan_tiny, out, "-r", "wan-fp8", "--overwrite")
    assert proc.returncode == 2 and not out.exists()
    assert f"{out}: another conversion (pid 4242) is writing it right now" in proc.stderr
    lock.unlink()


def test_two_conversions_at_once_never_corrupt_the_output(wan_small, tmp_path):
    """A second conversion into an OUT that a first one is writing is refused; the first then finishes intact.

    The first is stopped (SIGSTOP) once it has written part of its output, so the two overlap for certain."""
    out = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    first = _start("convert", wan_small, out, "-r", "wan-nf4", "--workers", "1", "--overwrite")
    try:
        _wait_for_progress(first, out)
        os.kill(first.pid, signal.SIGSTOP)
        assert first.poll() is None and lock.read_text().strip() == str(first.pid)
        with open(lock) as probe, pytest.raises(BlockingIOError):  # the first holds the lock, stopped
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        beside = leftovers(out)
        assert f".{out.name}.lock" in beside and any(".tmp-" in name for name in beside)

        second = run_cli("convert", wan_small, out, "-r", "wan-fp8", "--overwrite")
        assert second.returncode == 2, second.stderr
        (line,) = second.stderr.splitlines()  # one line: no traceback, no progress
        assert line.startswith(f"error: {out}: another conversion (pid {first.pid}) is writing it right now")
        assert not out.exists() and leftovers(out) == beside  # the second left nothing, took nothing
    except BaseException:
        first.kill()  # stopped or not
        first.communicate(timeout=60)
        raise
    os.kill(first.pid, signal.SIGCONT)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert json.loads((out / "quantize_manifest.json").read_text())["format"] == "nf4"  # the first's output
    assert run_cli("verify", out).returncode == 0 and leftovers(out) == []


def test_an_existing_or_busy_output_is_refused_before_torch_is_imported(wan_tiny, tmp_path):
    """A second in start-up saved, and nothing downloaded for a Hub source, when the answer is no."""
    out = tmp_path / "out"
    convert(wan_tiny, out, "wan-fp8", workers=1)
    code = (
        "import sys\nfrom quantize.cli import main\n"
        f"try:\n    main(['convert', {str(wan_tiny)!r}, {str(out)!r}, '-r', 'wan-fp8'])\n"
        "finally:\n    print('torch imported:', 'torch' in sys.modules)"
    )
    proc = subprocess.run(
        [str(Path(QUANTIZE).with_name("python")), "-c", code], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert "torch imported: False" in proc.stdout
