"""Process tuning for the `quantize` command: freed chunk memory is reused, not faulted in again."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time

import pytest

from quantize.read.hashing import FileHasher, HashingStopped, lowest_priority, sha256_file

LINUX_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a conversion's pattern: a few MB of temporaries allocated and freed per row chunk, on worker threads
_CHUNK_LOOP = """
import resource, sys, threading, torch
from quantize.formats.fp8_channel import FORMAT as fp8_channel
from quantize.process import tune_for_streaming
from quantize.encode import ErrorStats
took = tune_for_streaming() if sys.argv[1] == "tuned" else None
def chunks():  # the row chunks of a Wan attention and FFN weight, as the converter makes them
    for shape in [(682, 1536), (117, 8960)] * 20:
        w = torch.randn(shape, dtype=torch.bfloat16).float()
        parts = fp8_channel.encode(w)
        ErrorStats().add(w, fp8_channel.decode(parts))
torch.set_num_threads(1)
chunks()  # warm up: first-touch pages are faulted in either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = threading.Thread(target=chunks); t.start(); t.join()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHUNK_LOOP, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not LINUX_GLIBC, reason="glibc's mallopt")
def test_tuned_process_reuses_freed_chunk_memory():
    took, tuned = _faults("tuned")
    _, plain = _faults("plain")
    assert took == "True"
    # 40 chunks of 4 MB temporaries: thousands of pages each when faulted anew, few when reused
    assert plain > 20_000
    assert tuned < plain / 4


@pytest.mark.skipif(platform.system() != "Linux", reason="per-thread nice is Linux's")
def test_source_hashing_threads_run_at_lowest_priority():
    seen = {}

    def probe():
        lowest_priority()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert seen["nice"] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 19  # the caller is untouched


def test_file_hasher_hashes_each_file_once_and_background_work_runs_niced(tmp_path, monkeypatch):
    a = tmp_path / "a.bin"
    a.write_bytes(b"x" * 100_000)
    os.link(a, tmp_path / "b.bin")  # the same file under two names
    (tmp_path / "c.bin").write_bytes(b"y")
    calls, nice = [], {}

    def counted(path, stop=None):
        calls.append(path.name)
        nice[path.name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return sha256_file(path, stop)

    monkeypatch.setattr("quantize.read.hashing.sha256_file", counted)
    with FileHasher() as hasher:
        first = hasher.submit(a, background=True)
        assert hasher.submit(tmp_path / "b.bin") is first  # by inode: not hashed again
        third = hasher.submit(tmp_path / "c.bin")
        assert first.result() == sha256_file(a) and third.result() == sha256_file(tmp_path / "c.bin")
    assert sorted(calls) == ["a.bin", "c.bin"]
    if platform.system() == "Linux":
        assert nice["a.bin"] == 19 and nice["c.bin"] != 19


def test_recipes_and_the_files_to_hash_come_without_torch(tmp_path):
    """The command line starts hashing the source before it imports torch (a second of start-up)."""
    code = (
        "import sys; from quantize.recipes import load_recipe; from quantize.read.files import files_of_components; "
        "from quantize.read.hashing import FileHasher; from quantize.read.hub import resolve_source; "
        f"r = load_recipe('wan-fp8.yaml'); print(len(files_of_components({str(tmp_path)!r}, r.recipe.components))); "
        "print('torch' in sys.modules)"
    )
    from quantize.examples import write_example

    write_example(tmp_path / "src", "tiny", "t2v")
    code = code.replace(repr(str(tmp_path)), repr(str(tmp_path / "src")))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["1", "False"]


def test_closing_the_hasher_stops_a_file_being_hashed(tmp_path):
    """An interrupted conversion does not wait for a 5 GB shard's hash to finish."""
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(4 << 30)  # sparse: 4 GB of zeros, no disk used, seconds of SHA-256
    hasher = FileHasher()
    future = hasher.submit(big)
    while not future.running():
        time.sleep(0.001)
    hasher.close()
    assert isinstance(future.exception(), HashingStopped)


@pytest.mark.parametrize("size", [0, 1, 4095, (16 << 20) + 3, 40 << 20])
def test_files_are_hashed_through_maps_as_hashlib_hashes_them(tmp_path, size):
    import hashlib

    data = os.urandom(size)
    (tmp_path / "f.bin").write_bytes(data)
    assert sha256_file(tmp_path / "f.bin") == hashlib.sha256(data).hexdigest()


def test_a_file_system_that_cannot_map_files_is_hashed_by_reading(tmp_path, monkeypatch):
    import errno
    import hashlib

    import quantize.read.hashing as hashing

    def refuse(*args, **kwargs):
        raise OSError(errno.ENODEV, "No such device")

    data = os.urandom((16 << 20) + 5)
    (tmp_path / "f.bin").write_bytes(data)
    monkeypatch.setattr(hashing.mmap, "mmap", refuse)
    assert sha256_file(tmp_path / "f.bin") == hashlib.sha256(data).hexdigest()
