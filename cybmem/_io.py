"""File primitives: private directories, atomic writes, whole-line appends, OS locks."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"
DIR_MODE = 0o700
FILE_MODE = 0o600


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) private to the user; existing dirs are left as they are."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` all at once: temp file in the same dir, fsync, rename.

    With ``overwrite=False`` the final step is a hard link, which fails with
    FileExistsError if ``path`` exists, so two writers can never replace each
    other's file (os.replace would silently clobber).
    """
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    _fsync_dir(path.parent)


def append_lines(path: Path, lines: list[bytes]) -> None:
    """Append whole lines with one O_APPEND write, so concurrent appenders never interleave."""
    if not lines:
        return
    ensure_dir(path.parent)
    payload = b"".join(line.rstrip(b"\n") + b"\n" for line in lines)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        # A previous writer killed mid-line leaves no trailing newline; start on a fresh
        # line so our first line is never glued to the torn one.
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    payload = b"\n" + payload
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(lock_path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an OS advisory lock (flock) on ``lock_path`` for a read-modify-write."""
    ensure_dir(lock_path.parent)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
