"""The output directory appears all at once, or not at all, and one conversion at a time writes it.

- `output_lock`: a conversion holds an exclusive lock on ``.OUT.lock`` beside OUT for its whole run; a second
  conversion into the same OUT is refused at once (the lock is the kernel's: a killed run releases it).
- Everything is written into a temporary sibling ``.OUT.tmp-*``, fsynced, and renamed into place only when
  complete (`staging_dir`, `publish`). With ``overwrite``, an old OUT is moved aside to ``.OUT.old-*`` first and
  deleted only once the new one is in place; SIGINT/SIGTERM wait until both renames are done.
- Any failure before that removes the temporary directory and leaves OUT as it was. What a run killed outright
  (SIGKILL, power loss) leaves beside OUT is cleaned up by the next conversion into it (`recover_interrupted`):
  a temporary directory is removed; an old OUT moved aside is put back if no new one replaced it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError, OutputBusyError, OutputExistsError
from ..read.files import MANIFEST_NAME

__all__ = [
    "claimed_output",
    "output_lock",
    "recover_interrupted",
    "check_output_location",
    "staging_dir",
    "publish",
    "fsync_path",
    "signals_deferred",
    "NO_SPACE_ERRNOS",
]

#: errno values that mean the output's disk (or a quota, or a file size limit) is full.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _sibling(out: Path, kind: str) -> str:
    """The name prefix of OUT's temporary siblings: ``.OUT.lock``, ``.OUT.tmp-*``, ``.OUT.old-*``."""
    return f".{out.name}.{kind}"


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold OUT for one conversion: refuse with `OutputBusyError` while another (this process included) holds it.

    The lock file ``.OUT.lock`` (holding the owner's pid) is removed on release; one left by a killed run is
    harmless, since the lock itself (flock) dies with its process.
    """
    out = Path(out).absolute()
    if not out.parent.is_dir():
        raise InputError(f"{out.parent}: the output's parent directory does not exist")
    path = out.parent / _sibling(out, "lock")
    fd = _acquire(path, out)
    try:
        yield
    finally:
        try:
            os.unlink(path)  # still holding the lock, so no one else has this file locked
        except OSError:
            pass
        os.close(fd)


def _acquire(path: Path, out: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise InputError(
                f"{out.parent}: cannot create the output there ({e.strerror}): pick a writable location"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputBusyError(
                f"{out}: another conversion (pid {holder}) is writing it right now; wait for it to finish or pick "
                "another output"
            ) from None
        mine = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # its last holder removed that file as we opened it: lock the new one


def recover_interrupted(out: Path) -> list[str]:
    """With the lock held: clean up what a killed conversion left beside OUT; returns what was done.

    A temporary directory is removed. An old OUT moved aside is renamed back if OUT is missing (the run died
    between its two renames), else removed (it died after them).
    """
    done = []
    leftovers = sorted(out.parent.iterdir()) if out.parent.is_dir() else []
    old = [
        p for p in leftovers if p.name.startswith(_sibling(out, "old-")) and p.is_dir() and not p.is_symlink()
    ]
    for p in old:
        if not out.exists() and not out.is_symlink():
            os.rename(p, out)
            done.append(f"restored {out} from {p.name}")
        else:
            shutil.rmtree(p)
            done.append(f"removed {p.name}")
    for p in leftovers:
        if p.name.startswith(_sibling(out, "tmp-")) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
            done.append(f"removed {p.name}")
    return done


@contextmanager
def claimed_output(
    source: Path, out: Path, overwrite: bool, report: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold OUT for this conversion (`output_lock`), clean up after a killed one (`recover_interrupted`, each
    step told to `report`), and check that OUT may be written (`check_output_location`)."""
    with output_lock(out):
        for step in recover_interrupted(out):
            if report is not None:
                report(step)
        check_output_location(source, out, overwrite)
        yield


def check_output_location(source: Path, out: Path, overwrite: bool) -> None:
    """Refuse an output that overlaps the source, exists without `overwrite`, or is not ours to replace."""
    real_source, real_out = source.resolve(), out.resolve()
    if real_out == real_source or real_source in real_out.parents or real_out in real_source.parents:
        raise InputError(f"{out}: the output must not be the source, inside it, or contain it")
    if out.is_symlink():
        raise InputError(f"{out}: is a symbolic link; give the real path")
    if out.exists():
        if not out.is_dir():
            raise InputError(f"{out}: exists and is not a directory")
        if not overwrite:
            raise OutputExistsError(
                f"{out}: already exists; pass `overwrite` to replace it (the old checkpoint stays until the new one is complete)",
                parameters=("overwrite",),
            )
        cwd = Path.cwd().resolve()
        if real_out == cwd or real_out in cwd.parents:
            raise InputError(
                f"{out}: is the current directory or holds it; `overwrite` will not replace it",
                parameters=("overwrite",),
            )
        if any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
            raise InputError(
                f"{out}: is not a checkpoint written by `quantize convert` (no {MANIFEST_NAME}) and not empty; "
                "`overwrite` replaces only those: remove it yourself or pick another path",
                parameters=("overwrite",),
            )
    if not out.parent.is_dir():
        raise InputError(f"{out.parent}: the output's parent directory does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise InputError(f"{out.parent}: not writable, cannot create the output there")


@contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A fresh temporary sibling of `out`, removed on any failure (and after a successful `publish`)."""
    tmp = out.parent / f"{_sibling(out, 'tmp-')}{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
    except OSError as e:
        raise InputError(
            f"{out.parent}: cannot create the output there ({e.strerror}): pick a writable location"
        ) from None
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Flush `tmp` to disk and rename it to `out`, replacing an old `out` only with `overwrite`."""
    for dirpath, _, _ in os.walk(tmp):
        fsync_path(Path(dirpath))
    with signals_deferred():
        if out.exists():
            if not overwrite:
                raise OutputExistsError(f"{out}: appeared while converting; the new checkpoint was discarded")
            old = out.parent / f"{_sibling(out, 'old-')}{secrets.token_hex(4)}"
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(old, out)
                raise
        else:
            old = None
            os.rename(tmp, out)
        fsync_path(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back (their Python handlers, whichever thread the kernel picks) and deliver
    one that arrived on the way out, so that no interrupt splits what runs inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if pending:
            signal.raise_signal(pending[0])


_HELD = (signal.SIGINT, signal.SIGTERM)


def fsync_path(path: Path) -> None:
    """Flush a file (written earlier, through any descriptor) or a directory's entries to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
