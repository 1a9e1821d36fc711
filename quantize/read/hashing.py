"""SHA-256 of files: streamed through one reusable buffer, and scheduled to fill idle cores.

Hashing is about a third of the CPU a conversion spends (SHA-256 runs near 1.5 GB/s a core here), so
where it runs decides the wall time more than how. `FileHasher` hashes each file once (by inode: a
hard link or a Hub cache symlink is one file) on threads of its own: files queued as *background*
work run at the lowest scheduling priority, so they take only the cycles other work leaves (a
conversion's source files: the command line queues them before it even imports torch, then the
converting workers take the cores and the hashing finishes in their gaps and at the end).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

__all__ = ["sha256_file", "FileHasher", "HashingStopped", "lowest_priority"]

_CHUNK = 16 << 20  # a multiple of mmap.ALLOCATIONGRANULARITY
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # populated: one call, not a fault a page


class HashingStopped(Exception):
    """The hasher was closed before this file was hashed to the end."""


def sha256_file(path: Path, stop: threading.Event | None = None) -> str:
    """The hex SHA-256 of a file, hashed straight from the page cache through short-lived memory maps of
    `_CHUNK` bytes (no copy into a buffer: a fifth less CPU than reading; read where a file cannot be mapped);
    `stop` set ends it early (`HashingStopped`). A file that shrinks while it is hashed is an `OSError`, not a
    fault."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        size, pos = os.fstat(f.fileno()).st_size, 0
        while pos < size:
            if stop is not None and stop.is_set():
                raise HashingStopped(str(path))
            n = min(_CHUNK, size - pos)
            if os.fstat(f.fileno()).st_size < pos + n:
                raise OSError(f"{path}: shrank while it was being hashed")
            try:
                with mmap.mmap(f.fileno(), n, flags=_MAP_FLAGS, prot=mmap.PROT_READ, offset=pos) as m:
                    h.update(m)
            except OSError:  # a file system that cannot map files: this window is read instead
                data = os.pread(f.fileno(), n, pos)
                if len(data) != n:
                    raise OSError(f"{path}: shrank while it was being hashed") from None
                h.update(data)
            pos += n
        if os.pread(f.fileno(), 1, size):
            raise OSError(f"{path}: grew while it was being hashed")
    return h.hexdigest()


def lowest_priority() -> None:
    """Run the calling thread at nice 19 (Linux: a thread is a task of its own); elsewhere, as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


class FileHasher:
    """SHA-256 of files on background threads, each file once; `submit` returns a future of the hex digest.

    >>> # with FileHasher() as hasher: digest = hasher.submit(path).result()
    """

    def __init__(self, background_threads: int = 2):
        self._background = ThreadPoolExecutor(
            max(1, background_threads), thread_name_prefix="sha256-bg", initializer=lowest_priority
        )
        self._foreground = ThreadPoolExecutor(1, thread_name_prefix="sha256")
        self._futures: dict[tuple[int, int], Future] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def submit(self, path: Path, background: bool = False) -> Future:
        """The digest of `path`, computed once; `background`: at the lowest priority (if not queued already)."""
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            if key not in self._futures:
                pool = self._background if background else self._foreground
                self._futures[key] = pool.submit(sha256_file, Path(path), self._stop)
            return self._futures[key]

    def close(self) -> None:
        """Stop at once (an interrupted conversion does not wait for a 5 GB shard's hash): files not started
        are dropped, running ones stop at their next chunk. Digests already delivered are unaffected."""
        self._stop.set()
        for pool in (self._background, self._foreground):
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> FileHasher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
