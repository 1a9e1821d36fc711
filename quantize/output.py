"""The output directory appears all at once, or not at all.

Everything is written into a temporary sibling ``.OUT.tmp-*``, fsynced, and renamed into place only
when complete. With ``overwrite``, an old OUT is moved aside first and deleted only once the new one
is in place; SIGINT/SIGTERM are held back during those two renames. Any failure before that removes
the temporary directory and leaves OUT as it was.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError, OutputExistsError
from .manifest import MANIFEST_NAME

__all__ = ["check_output_location", "staging_dir", "publish", "write_file", "fsync_path"]


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
                f"{out}: already exists; pass --overwrite to replace it (the old checkpoint stays until the new one is complete)"
            )
        cwd = Path.cwd().resolve()
        if real_out == cwd or real_out in cwd.parents:
            raise InputError(f"{out}: is the current directory or holds it; --overwrite will not replace it")
        if any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
            raise InputError(
                f"{out}: is not a checkpoint written by `quantize convert` (no {MANIFEST_NAME}) and not empty; "
                "--overwrite replaces only those: remove it yourself or pick another path"
            )
    if not out.parent.is_dir():
        raise InputError(f"{out.parent}: the output's parent directory does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise InputError(f"{out.parent}: not writable, cannot create the output there")


@contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A fresh temporary sibling of `out`, removed on any failure (and after a successful `publish`)."""
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_file(path: Path, text: str) -> None:
    """Create `path` (never overwriting) with `text`, flushed to disk."""
    with open(path, "x", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Flush `tmp` to disk and rename it to `out`, replacing an old `out` only with `overwrite`."""
    for dirpath, _, _ in os.walk(tmp):
        fsync_path(Path(dirpath))
    with _signals_held():
        if out.exists():
            if not overwrite:
                raise OutputExistsError(f"{out}: appeared while converting; the new checkpoint was discarded")
            old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
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
def _signals_held() -> Iterator[None]:
    """Defer SIGINT and SIGTERM (main thread only) so that no interrupt splits the renames."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def fsync_path(path: Path) -> None:
    """Flush a file (written earlier, through any descriptor) or a directory's entries to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
