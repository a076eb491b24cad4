"""Where an export may write, and how a stream export is written there.

:func:`check_out` is the one rule for a destination: never through a link, never a device, FIFO or
socket, never inside a memory root, an existing file only with ``force`` (or a SQLite database an
export updates). :class:`Sink` writes a stream export to stdout, a caller's stream, or a file
written atomically (a temp file beside it, renamed into place once whole).
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from .. import _io
from ..errors import StoreError, ValidationError

__all__ = ["check_out", "Sink", "out_name"]

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def _stdout_hint(path: Path) -> str:
    return "; to write to stdout, leave --out off (or give -)" if str(path).startswith(("/dev/", "/proc/")) else ""


def _memory_root_of(real: Path, roots: Iterable[str | os.PathLike]) -> Path | None:
    """The memory root (or project directory) ``real`` lies in, if any: one of ``roots``, or a
    directory above it that holds a store's files (a project's records/ with its ledger or
    cybmem's lock beside it, or a root's projects.json with cybmem's lock or .nocache)."""
    for root in roots:
        r = Path(os.path.realpath(root))
        if real == r or r in real.parents:
            return Path(root)
    for d in real.parents:
        if (d / "records").is_dir() and any((d / n).exists() for n in ("issues.jsonl", ".lock", ".index.lock")):
            return d
        if (d / "projects.json").is_file() and ((d / ".projects.lock").exists() or (d / ".nocache").exists()):
            return d
    return None


def check_out(out: str | os.PathLike, *, force: bool = False, roots: Iterable[str | os.PathLike] = (),
              directory: bool = False, update: bool = False) -> Path:
    """Refuse an export destination that the export would destroy; return it as a Path.

    Refused, whatever ``force`` says: a symbolic link (never followed, never replaced: give the
    path it points to), anything that is not a regular file (a device such as /dev/null, a FIFO,
    a socket; a directory where a file goes, a file where a dataset directory goes), and a path
    inside a memory root (one of ``roots``, or any directory holding a store's files), where an
    export could replace a record or the ledger. An existing regular file is refused unless
    ``force`` (it is then replaced all at once) or ``update`` (a SQLite database an export updates).

    Args:
        out: the destination.
        force: an existing regular file may be replaced.
        roots: the memory roots being exported.
        directory: the export writes a directory (a Parquet dataset), which may exist.
        update: an existing file is updated in place, not replaced (SQLite).

    Raises:
        ValidationError: what is wrong with the path, and what to give instead.
        StoreError: its directory does not exist.
    """
    path = Path(out)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise ValidationError(f"{path} is a symbolic link (to {os.readlink(path)}); an export never writes through a "
                              f"link nor replaces it: give the path it points to{_stdout_hint(path)}")
    for test, kind in _KINDS:
        if st is not None and test(st.st_mode):
            raise ValidationError(f"{path} is {kind}, not a regular file; an export writes only regular files"
                                  f"{_stdout_hint(path)}")
    if directory:
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise ValidationError(f"{path} is a file; a Parquet export writes a dataset directory")
    elif st is not None and stat.S_ISDIR(st.st_mode):
        raise ValidationError(f"{path} is a directory; give a file path to write to")
    parent = path.parent
    if not directory and not parent.is_dir():  # a dataset directory is made with its parents
        raise StoreError(f"cannot write {path}: directory {parent} does not exist")
    real = Path(os.path.realpath(parent)) / path.name
    root = _memory_root_of(real, roots)
    if root is not None:
        raise ValidationError(f"{path} is inside the memory root {root}; an export there could replace a record or "
                              "the ledger: write it outside the memory root")
    if st is not None and not directory and not (force or update):
        raise ValidationError(f"{path} exists; add --force to replace it (only a regular file is ever replaced, "
                              "all at once)")
    return path


class Sink:
    """Where a stream export goes: stdout, a caller's stream, or a file written atomically
    (after :func:`check_out`: a temp file beside it, renamed into place once whole)."""

    def __init__(self, out: str | os.PathLike | IO | None, *, force: bool = False,
                 roots: Iterable[str | os.PathLike] = ()):
        self.out = out
        self.force = force
        self.roots = list(roots)
        self._file: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> IO[bytes]:
        out = self.out
        if out is None or out == "-":
            sys.stdout.flush()
            return _binary(sys.stdout)
        if not isinstance(out, (str, os.PathLike)):
            return _binary(out)
        path = check_out(out, force=self.force, roots=self.roots)
        # Without force, a file that appears meanwhile is not replaced either (a link, not a rename).
        self._file = _io.atomic_file(path, private=False, overwrite=self.force)
        try:
            return self._file.__enter__()
        except FileExistsError:
            raise ValidationError(f"{path} appeared while the export was written; add --force to replace it") from None

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._file is not None:
            try:
                self._file.__exit__(exc_type, exc, tb)
            except FileExistsError:
                raise ValidationError(f"{self.out} appeared while the export was written; add --force to replace it") from None
        elif exc_type is None:
            (sys.stdout.buffer if self.out in (None, "-") else _binary(self.out)).flush()


class _TextToBytes(io.RawIOBase):
    """A binary face on a text stream (e.g. io.StringIO in a notebook)."""

    def __init__(self, text: IO[str]):
        self.text = text

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.text.write(bytes(b).decode("utf-8"))
        return len(b)

    def flush(self) -> None:
        self.text.flush()


def _binary(stream: IO) -> IO[bytes]:
    buf = getattr(stream, "buffer", None)
    if buf is not None:
        return buf
    if isinstance(stream, io.TextIOBase):
        return _TextToBytes(stream)  # type: ignore[return-value]
    return stream


def out_name(out) -> str | None:
    if out is None or out == "-":
        return None
    return str(out) if isinstance(out, (str, os.PathLike)) else getattr(out, "name", None)
