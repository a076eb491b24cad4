"""File primitives: the one reader, the one JSON decoder, private directories, atomic writes,
whole-line appends, OS locks, the temp files a writer owns until it lets go. Every file cybmem
reads or writes goes through here."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from .errors import StoreError

TMP_PREFIX = ".tmp-"
TMP_SUFFIX = ".part"
DIR_MODE = 0o700
FILE_MODE = 0o600
#: An mtime this close to the moment a file or directory was read (2 s: the coarsest clock tick of
#: the file systems we meet) may hide a write in the same tick: what was read then is not trusted to be current.
RACY_NS = 2_000_000_000

# Never follow a symlink planted where a store file should be: an append or a lock
# must not land outside the memory root.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_CHUNK = 1 << 20


def _open_regular(path: str | os.PathLike, *, follow: bool = False) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading only if it is a regular file: the rule every read of a store or a
    dataset goes through. The open never blocks (O_NONBLOCK: a FIFO planted where a file should be
    would otherwise wait for a writer forever) and fstat then judges what was opened, not a name
    another process may swap. ``follow=False`` also refuses a final symbolic link (the memory root).

    Returns the descriptor (the caller closes it) and its stat.

    Raises:
        FileNotFoundError: the file does not exist (callers decide whether that is normal).
        StoreError: a symbolic link (with ``follow=False``), not a regular file, or unopenable.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise StoreError(f"{path} is a symbolic link; cybmem reads only real files inside the memory root "
                             "(replace the link with the file, see `cybmem doctor`)") from None
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path} is not a regular file (a FIFO, socket, device or directory); move it out of the way")
        # A regular file never blocks; reads through a handle are plain reads again.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_regular(path: str | os.PathLike, *, follow: bool = False) -> BinaryIO:
    """A binary handle on ``path`` by the rule of :func:`_open_regular`, for readers that take a
    file object (Parquet and Arrow readers); the caller closes it."""
    fd, _ = _open_regular(path, follow=follow)
    return os.fdopen(fd, "rb")


def map_regular(path: str | os.PathLike, *, follow: bool = False) -> mmap.mmap | bytes:
    """A regular file's bytes, memory-mapped read-only, opened by the rule of :func:`_open_regular`
    (``b""`` for an empty file, which mmap cannot map: readers fail on it as on a damaged file).
    For the Arrow readers that take a buffer (the cache's IPC files, a dataset's Parquet parts)."""
    with open_regular(path, follow=follow) as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(fh.fileno()).st_size else b""


def read_file_st(path: str | os.PathLike, *, limit: int | None = None, offset: int = 0) -> tuple[bytes, os.stat_result]:
    """Read a whole regular file (from byte ``offset`` on) and return its bytes and the stat of what was read.

    The one reader for everything under a memory root. It opens by :func:`_open_regular` (no
    final symbolic link, never blocking: a FIFO or device planted where a file should be can
    neither hang the reader nor feed it endless bytes), and reads at most ``limit`` bytes (a file
    that is or grows larger is refused). ``offset`` skips the bytes an append-only file's reader
    has already consumed (``limit`` then bounds what is left); past the end it reads nothing.

    Raises:
        FileNotFoundError: the file does not exist (callers decide whether that is normal).
        StoreError: a symbolic link, not a regular file, larger than ``limit``, or unreadable;
            the message names the path and what to do.
    """
    fd, st = _open_regular(path)
    try:
        if limit is not None and st.st_size - offset > limit:
            raise StoreError(f"{path} is {st.st_size} bytes, larger than the {limit} such a file may have")
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        chunks: list[bytes] = []
        got = 0
        cap = None if limit is None else limit + 1
        while True:
            want = _READ_CHUNK if cap is None else min(_READ_CHUNK, cap - got)
            if want <= 0:
                break
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if limit is not None and got > limit:
            raise StoreError(f"{path} grew past the {limit} bytes such a file may have while it was read")
        return b"".join(chunks), st
    except OSError as exc:
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_file(path: str | os.PathLike, *, limit: int | None = None, offset: int = 0) -> bytes:
    """:func:`read_file_st` without the stat."""
    return read_file_st(path, limit=limit, offset=offset)[0]


# A \uD800-\uDFFF escape: JavaScript's JSON.stringify writes lone surrogates this way
# (a string cut in the middle of an emoji by .slice()).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


def loads(raw: bytes | str) -> Any:
    """Decode JSON as JavaScript's JSON.parse reads it; the one JSON decoder for stored files.

    orjson does the work. It rejects a lone UTF-16 surrogate escape (``"\ud83c"``), which
    JSON.parse accepts and JSON.stringify writes; such a document is decoded by the standard
    library instead and each lone surrogate becomes U+FFFD, so the text stays valid UTF-8
    everywhere downstream. Raises ``orjson.JSONDecodeError`` (a ValueError) on invalid JSON.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
        if "surrogate" not in str(exc) or not _SURROGATE_ESCAPE.search(data):
            raise
        try:
            value = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            raise exc from None
        return _replace_surrogates(value)


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
            continue
        # mkdir's mode passes through the umask: under umask 277 the owner could not write
        # into the store it just made. chmod does not.
        os.chmod(d, DIR_MODE)
    return path


def _open_private(path: Path, flags: int) -> int:
    """Open ``path`` with ``flags``, creating it 0600 whatever the umask when it does not exist
    (a file that exists keeps its mode: another tool may share it on purpose)."""
    for _ in range(3):  # created or removed by another process in between: look again
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE)
            break
        except FileExistsError:
            try:
                return os.open(path, flags | _NOFOLLOW)
            except FileNotFoundError:
                continue
    else:
        return os.open(path, flags | os.O_CREAT | _NOFOLLOW, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: The longest part of a target's name a temp file's name repeats (NAME_MAX is 255 bytes).
_NAME_IN_TEMP = 96


class Staged(os.PathLike):
    """A temp file a writer made beside its target and owns until it lets go (:meth:`release`).

    The writer holds an ``flock`` on it from the moment it is created: the mark by which doctor,
    and the next writer to the same target, tell a live writer's temp file (left alone, whatever
    its age: its writer may wait for a lock for minutes) from a dead one's (removed). A killed
    or stopped-then-killed process lets go at once; a stopped one still holds it.
    """

    __slots__ = ("path", "_fd")

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"Staged({str(self.path)!r})"

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} was released")
        return self._fd

    def present(self) -> bool:
        """Whether the file still has its name (nobody removed it meanwhile)."""
        try:
            return os.fstat(self.fd).st_nlink > 0 and os.path.samestat(os.fstat(self.fd), os.lstat(self.path))
        except OSError:
            return False

    def release(self) -> None:
        """Let go of it (the lock goes with the descriptor); the file itself is the caller's to
        publish or remove first."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _temp_name_part(name: str) -> str:
    """A target's name as a temp file beside it repeats it: at most :data:`_NAME_IN_TEMP` bytes."""
    raw = os.fsencode(name)
    return name if len(raw) <= _NAME_IN_TEMP else os.fsdecode(raw[:_NAME_IN_TEMP])


def temp_beside(path: Path) -> Staged:
    """A new, empty, private (0600) temp file beside ``path``, named ``.tmp-<name>.<random>.part``
    (every reader skips ``.tmp-`` names) and owned by this process (:class:`Staged`)."""
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{_temp_name_part(path.name)}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # just made: nobody else can hold it
        os.fchmod(fd, FILE_MODE)  # mkstemp's 0600 passes through the umask (0400 under umask 277)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Staged(Path(tmp), fd)


def _owner_of(temp: Path) -> Path:
    """The file whose lock says whether ``temp`` belongs to a live writer: itself, or for a file a
    library made beside a temp file (SQLite's ``.tmp-….part-journal``) that temp file."""
    name = temp.name
    cut = name.find(TMP_SUFFIX)
    return temp if cut < 0 or name.endswith(TMP_SUFFIX) else temp.with_name(name[: cut + len(TMP_SUFFIX)])


def temp_owned(temp: Path) -> bool:
    """Whether a live writer owns ``temp`` (it holds the lock :func:`temp_beside` takes; a temp
    file of a library beside it counts as its owner's). False for a temp no process holds: its
    writer was killed, or is an older cybmem that took no lock (doctor then goes by its age)."""
    return is_locked(_owner_of(temp))


def remove_temp(temp: Path) -> bool:
    """Remove a temp file unless a live writer owns it (:func:`temp_owned`, asked while this process
    holds the lock itself, so that the answer cannot change before the removal). Returns whether it
    was removed (False: owned, or already gone)."""
    owner = _owner_of(temp)
    try:
        fd = os.open(owner, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        fd = None  # a library's file beside a temp that is gone: nobody owns it
    except OSError:
        return False
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
        try:
            os.unlink(temp)
        except FileNotFoundError:
            return False
        return True
    finally:
        if fd is not None:
            os.close(fd)


def remove_dead_temps(path: Path) -> list[Path]:
    """Remove the temp files beside ``path`` that killed writers of it left (none a live writer
    owns): what the next writer of the same target cleans up, e.g. an export killed with SIGKILL,
    which could not clean up after itself. Returns those removed."""
    prefix = f"{TMP_PREFIX}{_temp_name_part(path.name)}."
    removed = []
    try:
        with os.scandir(path.parent) as it:
            found = [Path(e.path) for e in it if e.name.startswith(prefix) and TMP_SUFFIX in e.name
                     and e.is_file(follow_symlinks=False)]
    except OSError:
        return removed
    for temp in sorted(found, key=lambda t: t.name.endswith(TMP_SUFFIX)):  # a library's files first, then their owners
        if remove_temp(temp):
            removed.append(temp)
    return removed


def stage(path: Path, data: bytes, *, sync: bool = True) -> Staged:
    """Write ``data`` to a private temp file next to ``path`` (:func:`temp_beside`) and fsync it;
    returns it, owned by this process until :func:`publish` moves it into place (or the caller
    releases it).

    The temp name starts with ``.tmp-`` so every reader ignores it. A writer killed in between
    leaves only that temp file behind (``cybmem doctor --repair`` removes it: nobody owns it).
    """
    ensure_dir(path.parent)
    staged = temp_beside(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(staged.fd, view):]
        if sync:
            os.fsync(staged.fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged.path)
        staged.release()
        raise
    return staged


def publish(tmp: Path | Staged, path: Path, *, overwrite: bool = True, sync: bool = True) -> None:
    """Move a staged temp file to ``path`` (see :func:`atomic_write`); the temp is always gone
    after (and let go of).

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
        if isinstance(tmp, Staged):
            tmp.release()
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


def _default_mode() -> int:
    """The mode a plain open() would give a new file (0666 minus the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: Path, *, private: bool = True, overwrite: bool = True) -> Iterator[Path]:
    """Build a file into place all at once by path: yields the path of an empty temp file next to
    ``path`` (``.tmp-`` named, which every reader skips; owned by this process while it is built,
    :class:`Staged`) for a writer that needs a name (SQLite); on a clean exit it is fsynced and
    published (:func:`publish`), on an error removed. A process killed in between leaves only the
    temp file, never a partial or empty file at ``path``; the next writer of ``path`` removes
    such leftovers first (:func:`remove_dead_temps`). ``private=False`` gives the file the mode a
    plain open() would (exports outside the memory root); else 0600. With ``overwrite=False``
    nothing that exists at ``path`` is ever replaced (FileExistsError), also when it appeared
    while the file was written.
    """
    path = Path(path)
    remove_dead_temps(path)
    staged = None
    try:
        staged = temp_beside(path)
        yield staged.path
        sync_path(staged.path)  # by name: what the writer wrote there, through whatever handle
        os.chmod(staged.path, FILE_MODE if private else _default_mode())
    except BaseException:
        if staged is not None:
            with contextlib.suppress(OSError):
                os.unlink(staged.path)
            staged.release()
        raise
    publish(staged, path, overwrite=overwrite)


@contextlib.contextmanager
def atomic_file(path: Path, *, private: bool = True, overwrite: bool = True) -> Iterator[BinaryIO]:
    """Stream a file into place all at once: :func:`atomic_path` with a binary handle on the temp file."""
    with atomic_path(path, private=private, overwrite=overwrite) as tmp, open(tmp, "wb") as fh:
        yield fh


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
    fd = _open_private(path, os.O_RDWR | os.O_APPEND)
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
def locked(lock_path: Path, *, shared: bool = False, wait: bool = True) -> Iterator[None]:
    """Hold an OS advisory lock (flock) on ``lock_path`` for a read-modify-write.

    ``wait=False``: BlockingIOError at once when another process holds it (a job that must not run twice).
    """
    ensure_dir(lock_path.parent)
    fd = _open_private(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def is_locked(lock_path: Path) -> bool:
    """Whether another process holds the lock :func:`locked` takes on ``lock_path`` now."""
    try:
        fd = os.open(lock_path, os.O_RDWR | _NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
