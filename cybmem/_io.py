"""File primitives: private directories, atomic writes, whole-line appends, OS locks."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"
TMP_SUFFIX = ".part"
DIR_MODE = 0o700
FILE_MODE = 0o600

# Never follow a symlink planted where a store file should be: an append or a lock
# must not land outside the memory root.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) private to the user; existing dirs are left as they are."""
    if path.is_dir():
        return path
    # mkdir(parents=True) gives intermediate dirs the default mode; create each one private.
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
    return path


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def stage(path: Path, data: bytes, *, sync: bool = True) -> Path:
    """Write ``data`` to a private temp file next to ``path`` and fsync it; returns the temp path.

    The temp name starts with ``.tmp-`` so every reader ignores it; :func:`publish` moves
    it into place. A writer killed in between leaves only that temp file behind
    (``cybmem doctor --repair`` removes old ones).
    """
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def publish(tmp: Path, path: Path, *, overwrite: bool = True, sync: bool = True) -> None:
    """Move a staged temp file to ``path`` (see :func:`atomic_write`); the temp is always gone after.

    With ``sync=False`` the caller fsyncs the directory itself (see :func:`sync_path`), e.g.
    after releasing a lock.
    """
    try:
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if sync:
        _fsync_dir(path.parent)


def sync_path(path: Path) -> None:
    """fsync a file or directory by path (missing ones are ignored)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes, *, overwrite: bool = True, durable: bool = True) -> None:
    """Write ``data`` to ``path`` all at once: temp file in the same dir, fsync, rename.

    With ``overwrite=False`` the final step is a hard link, which fails with
    FileExistsError if ``path`` exists, so two writers can never replace each
    other's file (os.replace would silently clobber). ``durable=False`` skips the
    fsyncs: for derived files that are rebuilt when lost (readers see either the old or
    the new file after a process crash; only a power cut can cost the file itself).
    """
    publish(stage(path, data, sync=durable), path, overwrite=overwrite, sync=durable)


def append_lines(path: Path, lines: list[bytes], *, sync: bool = True) -> None:
    """Append whole lines with one O_APPEND write, so concurrent appenders never interleave.

    ``sync=False`` leaves the fsync to the caller (:func:`sync_path`), e.g. after a lock is released.
    """
    if not lines:
        return
    ensure_dir(path.parent)
    payload = b"".join(line.rstrip(b"\n") + b"\n" for line in lines)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW, FILE_MODE)
    try:
        # A previous writer killed mid-line leaves no trailing newline; start on a fresh
        # line so our first line is never glued to the torn one.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(lock_path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an OS advisory lock (flock) on ``lock_path`` for a read-modify-write."""
    ensure_dir(lock_path.parent)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
