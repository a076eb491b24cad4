"""The Arrow cache of a project's snapshot: ``<project>/.cache/``, derived and rebuildable.

Arrow IPC (Feather v2) files, memory-mapped on load, written as append-only *segments*: a
records table and its keyword-index segment per refresh, plus the parsed ledger
(``events.arrow``) and its fold (``fold.arrow``). A manifest names the segment files and what
they were built from. Why IPC and not Parquet: a memory-mapped IPC file is usable without
decoding (zero-copy), which is what a per-dispatch CLI call needs (benchmarks/RESULTS.md).

The cache is never trusted blindly: :func:`is_fresh` compares the mtime of ``records/`` (files
are added and replaced by rename, which changes it) and the size, mtime and inode of
``issues.jsonl`` with what the manifest saw. A directory mtime within :data:`RACY_NS` of the
scan is not trusted (the racy-git rule: a file added in the same clock tick would not move it).
When ``records/`` changed, the listing is compared name by name and inode by inode
(:func:`listing_changes`): added, vanished and replaced records are found. Each segment keeps when
its record files were read (``read_ns``), and ``chk-N.arrow`` the rows read again or checked
against their files since (:func:`settle`): what tells a record edited in place after it was read
(:meth:`cybmem.store.snapshot.Snapshot.stale_rows`).

Writers take ``.cache/.lock``; readers only memory-map immutable segment files and swap in a new
manifest by rename, so concurrent readers and writers are safe. :func:`check` is the public
consistency check doctor uses.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from .. import _io
from .._io import atomic_write, locked
from ..arrow_numpy import array_of, numpy_of, scalar, strings  # not pa.array / pa.scalar: they import pandas
from .tokens import VERSION as TOKENIZER_VERSION

__all__ = [
    "CACHE_VERSION", "MAX_SEGMENTS", "RACY_NS", "Manifest", "cache_dir", "usable_dir", "write_table", "write_tables",
    "read_table", "read_tables", "ledger_stat", "is_fresh", "dir_mtime_for_manifest", "listing_changes", "discard", "CacheCheck", "check",
    "CHECKED_SCHEMA", "Checked", "read_checked", "merge_checked", "checked_file", "settle",
]

CACHE_VERSION = "14-" + TOKENIZER_VERSION  # 14: files and commands columns (and in the keyword text); 13: a segment's read_ns, chk-N.arrow; 12: kw-N.arrow doc ids in two bytes (+ high parts); 11: kw-N.arrow without impacts, tfs in a byte; 10: openOrder in act-N.arrow; 9: car-N.arrow (issue carriers); 8: act-N.arrow (issue activity); 6: kwi.arrow; the tokens are in it too
MAX_SEGMENTS = 8
RACY_NS = _io.RACY_NS  # a directory mtime this close to the scan may hide a same-tick write
_MAX_MANIFEST_BYTES = 256 * 1024 * 1024
#: chk-N.arrow: rows known equal to their record file at a moment later than their segment's read
#: (read again by a refresh, or checked and found equal: :func:`settle`), and that moment (epoch ns)
CHECKED_SCHEMA = pa.schema([("row", pa.int64()), ("at", pa.int64())])


#: a file of this name in a memory root says: write no cache under this root (the bundled
#: fixtures carry one, so reading them, or a copy of them, leaves no .cache/ behind)
NO_CACHE_FILE = ".nocache"


def cache_dir(project_dir: Path) -> Path:
    return Path(project_dir) / ".cache"


def disabled(memory_root: Path) -> bool:
    """True when the memory root asks for no cache (:data:`NO_CACHE_FILE`)."""
    return (Path(memory_root) / NO_CACHE_FILE).exists()


def usable_dir(project_dir: Path, memory_root: Path) -> Path | None:
    """The project's cache dir, or None when the memory root asks for no cache (:func:`disabled`)."""
    return None if disabled(memory_root) else cache_dir(project_dir)


def write_table(path: Path, table: pa.Table) -> None:
    """Write an Arrow table as an IPC file, atomically (readers see the old file or the new one)."""
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    atomic_write(path, sink.getvalue().to_pybytes(), durable=False)


def read_table(path: Path) -> pa.Table:
    """Memory-map an IPC file written by :func:`write_table` (zero-copy).

    Mapped by the one rule (:func:`cybmem._io.map_regular`): a FIFO, socket or device where a
    cache file should be raises StoreError (an OSError) at once, as a damaged file would."""
    return ipc.open_file(pa.py_buffer(_io.map_regular(path))).read_all()


def write_tables(cache: Path, tables: dict[str, pa.Table]) -> None:
    """Write several tables into the cache dir (file name -> table), each by :func:`write_table`."""
    for name, table in tables.items():
        write_table(cache / name, table)


def read_tables(cache: Path, names: list[str], *, missing_ok: tuple[str, ...] = ()) -> list[pa.Table | None]:
    """Memory-map several files of the cache dir (:func:`read_table`), in the order named; a file
    named in ``missing_ok`` that does not exist is None (any other raises FileNotFoundError)."""
    return [None if name in missing_ok and not (cache / name).exists() else read_table(cache / name) for name in names]


@dataclass
class Manifest:
    """What the cache holds and what it was built from."""

    #: {"rec": file, "kw": file, "rows": n, "read_ns": when the scan that read its record files began}
    segments: list[dict] = field(default_factory=list)
    dir_mtime_ns: int | None = None
    bad: dict[str, int] = field(default_factory=dict)  # unreadable record files: name -> inode
    ledger: dict = field(default_factory=dict)  # {"size", "mtime_ns", "ino", "lines"}
    problems: list[list[str]] = field(default_factory=list)
    next_id: int = 1
    act: str | None = None  # the open issues' activity file (query-independent arrays the dispatch ranking reads)
    carry: str | None = None  # which record carries which fold row (ditto)
    checked: str | None = None  # chk-N.arrow (:data:`CHECKED_SCHEMA`), or None: no row checked since it was read

    def to_bytes(self) -> bytes:
        return orjson.dumps({"version": CACHE_VERSION, **self.__dict__})

    @classmethod
    def read(cls, cache: Path) -> "Manifest | None":
        """The manifest of a cache dir, or None when missing, damaged or of another version."""
        try:
            d = _io.loads(_io.read_file(cache / "manifest.json", limit=_MAX_MANIFEST_BYTES))
            if d.pop("version", None) != CACHE_VERSION:
                return None
            return cls(**d)
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    @classmethod
    def read_fresh(cls, cache: Path, records_dir: Path, issues_path: Path) -> "tuple[Manifest | None, bool]":
        """The manifest (:meth:`read`) and whether it is fresh (:func:`is_fresh`), in one call."""
        manifest = cls.read(cache)
        return manifest, manifest is not None and is_fresh(records_dir, issues_path, manifest)

    def write(self, cache: Path) -> None:
        atomic_write(cache / "manifest.json", self.to_bytes(), durable=False)

    def publish(self, cache: Path, records_dir: Path, scanned_at_ns: int, tables: dict[str, pa.Table] | None = None) -> None:
        """Make this manifest the cache's state: the new files it names written first (``tables``,
        file name -> table: :func:`write_tables`), records/' mtime as it may be trusted next time
        (:func:`dir_mtime_for_manifest`), the manifest written, the segment files it no longer
        names deleted (:func:`remove_unlisted`)."""
        write_tables(cache, tables or {})
        self.dir_mtime_ns = dir_mtime_for_manifest(records_dir, scanned_at_ns)
        self.write(cache)
        remove_unlisted(cache, self)

    def new_file(self, kind: str) -> str:
        name = f"{kind}-{self.next_id}.arrow"
        self.next_id += 1
        return name

    def new_files(self, *kinds: str) -> list[str]:
        """:meth:`new_file` of each kind, in order."""
        return [self.new_file(kind) for kind in kinds]

    def files(self) -> set[str]:
        return ({s[k] for s in self.segments for k in ("rec", "kw")} | {"events.arrow", "fold.arrow", "kwi.arrow"}
                | {f for f in (self.act, self.carry, self.checked) if f})


def ledger_stat(path: Path) -> dict | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _records_mtime(records_dir: Path) -> int | None:
    try:
        return records_dir.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def is_fresh(records_dir: Path, issues_path: Path, manifest: Manifest) -> bool:
    """True when neither records/ nor the ledger changed since the manifest was written."""
    mtime = _records_mtime(records_dir)
    if manifest.dir_mtime_ns is None or mtime != manifest.dir_mtime_ns:
        return False
    led = ledger_stat(issues_path)
    if not led:
        return not manifest.ledger.get("size")
    return led == {k: manifest.ledger.get(k) for k in ("size", "mtime_ns", "ino")}


def dir_mtime_for_manifest(records_dir: Path, scanned_at_ns: int) -> int | None:
    """records/'s mtime to trust next time, or None when it is too close to the scan (racy)."""
    mtime = _records_mtime(records_dir)
    if mtime is None:
        return None
    return mtime if scanned_at_ns - mtime > RACY_NS else None


@dataclass
class ListingChanges:
    """How a directory listing differs from the cached rows."""

    vanished: list[str]  # cached runIds whose file is gone
    replaced: list[tuple[int, str, int]]  # (row, file name, new inode): same name, another file
    added: list[tuple[str, int]]  # (file name, inode) listed but not cached


def listing_changes(records: pa.Table, listing: dict[str, int]) -> ListingChanges:
    """Compare cached rows (runId, inode) with a listing (name -> inode), vectorised."""
    names = strings(list(listing))
    inodes = array_of(list(listing.values()), pa.uint64())
    cached = pc.binary_join_element_wise(records.column("runId"), scalar(".json", pa.string()), scalar("", pa.string()))
    cached = cached.combine_chunks() if isinstance(cached, pa.ChunkedArray) else cached
    pos = pc.index_in(cached, value_set=names)
    vanished: list[str] = []
    replaced: list[tuple[int, str, int]] = []
    if pos.null_count:
        vanished = records.column("runId").filter(pc.is_null(pos)).to_pylist()
    if records.num_rows:
        listed_ino = inodes.take(pc.fill_null(pos, scalar(0, pos.type)))
        differs = pc.and_(pc.is_valid(pos), pc.not_equal(listed_ino, records.column("inode")))
        differs = pc.fill_null(differs, scalar(False, pa.bool_()))
        if pc.any(differs).as_py():
            rows = pc.indices_nonzero(differs).to_pylist()
            replaced = [(r, cached[r].as_py(), listing[cached[r].as_py()]) for r in rows]
    fresh = pc.invert(pc.is_in(names, value_set=cached))
    added = [(n, listing[n]) for n in names.filter(fresh).to_pylist()]
    return ListingChanges(vanished, replaced, added)


def discard(cache: Path, *, files: bool = False) -> None:
    """Forget the cache (under its lock): the next load rebuilds it from the store.

    ``files``: also delete the records cache's files, so that no copy of what the store held is
    left in them (`cybmem redact`); the vector cache (``vec-*``: numbers, under its own manifest)
    stays.
    """
    with contextlib.suppress(OSError), locked(cache / ".lock"):
        with contextlib.suppress(FileNotFoundError):
            (cache / "manifest.json").unlink()
        if files:
            with os.scandir(cache) as it:
                for entry in it:
                    if entry.name.endswith(".arrow") and not entry.name.startswith("vec-"):
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)


def remove_unlisted(cache: Path, manifest: Manifest) -> None:
    """Delete the numbered files the manifest no longer names (readers that mapped them keep their
    mapping; one that had yet to read its issue activity or carriers computes them instead).

    Only the records cache's own files (``rec-*``, ``kw-*``, ``act-*``, ``car-*``, ``chk-*``) are considered:
    the vector cache (``vec-*``, cybmem.retrieval.vectors) keeps its files under its own manifest.
    """
    keep = manifest.files()
    with contextlib.suppress(OSError), os.scandir(cache) as it:
        for entry in it:
            if entry.name.endswith(".arrow") and entry.name.startswith(("rec-", "kw-", "act-", "car-", "chk-")) and entry.name not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


#: rows (ascending) and the moment each was known equal to its file: what chk-N.arrow holds
Checked = tuple[np.ndarray, np.ndarray]


def read_checked(path: Path | None) -> Checked:
    """A chk-N.arrow file's rows and moments; none when there is no file or it cannot be read
    (those rows are then checked against their files again: never trusted blindly)."""
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if path is None:
        return none
    try:
        table = read_table(path)
    except (OSError, pa.ArrowException):
        return none
    if not table.schema.equals(CHECKED_SCHEMA):
        return none
    rows, at = numpy_of(table.column("row")), numpy_of(table.column("at"))
    return (rows, at) if np.all(rows[1:] > rows[:-1]) else none


def merge_checked(old: Checked, rows: np.ndarray, at: np.ndarray, *, replace: bool = False) -> Checked:
    """``old`` with these rows' moments added (``rows`` ascending), a row's later moment kept;
    ``replace``: these moments stand whatever ``old`` says (rows read again: what they hold changed).
    Sorting only (np.unique and np.isin import numpy.ma, tens of ms on a dispatch's path)."""
    old_rows, old_at = old
    if replace and len(rows):
        keep = rows[np.searchsorted(rows, old_rows).clip(max=len(rows) - 1)] != old_rows
        old_rows, old_at = old_rows[keep], old_at[keep]
    all_rows, all_at = np.concatenate([old_rows, rows]), np.concatenate([old_at, at])
    order = np.lexsort((all_at, all_rows))
    all_rows, all_at = all_rows[order], all_at[order]
    last = np.append(all_rows[1:] != all_rows[:-1], True)  # each row's latest moment
    return all_rows[last], all_at[last]


def checked_file(manifest: Manifest, checked: Checked) -> dict[str, pa.Table]:
    """``checked`` as the cache's chk-N.arrow, named in ``manifest`` (none when it is empty)."""
    if not len(checked[0]):
        manifest.checked = None
        return {}
    manifest.checked = manifest.new_file("chk")
    arrays = [array_of(np.asarray(c, np.int64), pa.int64()) for c in checked]
    return {manifest.checked: pa.Table.from_arrays(arrays, schema=CHECKED_SCHEMA)}


def settle(cache: Path, manifest: Manifest, rows: np.ndarray, at: np.ndarray) -> None:
    """Keep that these rows were found equal to their record files by checks that began at
    ``at`` (epoch ns): a later load does not read them again until they change (git refreshes
    its index the same way once a racily-clean entry is found clean).

    Kept only while the cache holds the rows as ``manifest`` (the snapshot's) had them: the same
    segments, each the same file read at the same moment (a refresh that patched or compacted
    them names other files; one that started over, other moments). Nothing is kept when another
    process holds the cache's lock (a refresh: a read does not wait on it for an optional write)
    or the cache cannot be written: the next load checks those rows again.
    """
    try:
        with locked(cache / ".lock", wait=False):
            disk = Manifest.read(cache)
            if disk is None or disk.segments[:len(manifest.segments)] != manifest.segments:
                return
            kept = read_checked(cache / disk.checked if disk.checked else None)
            merged = merge_checked(kept, rows, at)
            if not (np.array_equal(merged[0], kept[0]) and np.array_equal(merged[1], kept[1])):
                write_tables(cache, checked_file(disk, merged))
                disk.write(cache)
                remove_unlisted(cache, disk)
    except OSError:  # BlockingIOError: another process holds the lock
        pass


@dataclass
class CacheCheck:
    """:func:`check`'s verdict: ``state`` is ok, absent, behind (the next read refreshes it) or broken."""

    state: str
    reasons: list[str] = field(default_factory=list)


def check(records_dir: Path, issues_path: Path, cache: Path, listing: dict[str, int], unreadable: set[str],
          ledger_whole: int) -> CacheCheck:
    """Compare a cache with the files it was built from (what ``cybmem doctor`` reports).

    Args:
        records_dir / issues_path / cache: the project's paths.
        listing: record file name -> inode, as listed now.
        unreadable: record file names that cannot be read (they are not cached).
        ledger_whole: bytes of the ledger up to its last newline.
    """
    try:
        contents = [n for n in os.listdir(cache) if n != ".lock" and not n.startswith(_io.TMP_PREFIX)]
    except (FileNotFoundError, NotADirectoryError):
        return CacheCheck("absent")
    if not contents:
        return CacheCheck("absent")
    manifest = Manifest.read(cache)
    if manifest is None:
        return CacheCheck("broken", ["cache manifest is missing, unreadable or from another version"])
    try:
        tables = [read_table(cache / s["rec"]) for s in manifest.segments]
        records = pa.concat_tables(tables) if tables else None
        for s in manifest.segments:
            read_table(cache / s["kw"])
        for name in ("events.arrow", "fold.arrow", "kwi.arrow"):
            if (cache / name).exists():
                read_table(cache / name)
        if records is None:
            cached: dict[str, int] = {}
            n_rows = 0
        else:
            cached = dict(zip((r + ".json" for r in records.column("runId").to_pylist()), records.column("inode").to_pylist()))
            n_rows = records.num_rows
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        return CacheCheck("broken", [f"cache cannot be read ({type(exc).__name__}: {exc})"])
    current = {n: ino for n, ino in listing.items() if n not in unreadable}
    replaced = [n for n, ino in cached.items() if n in current and current[n] != ino]
    vanished = [n for n in cached if n not in listing]
    dupes = n_rows - len(cached)
    why = []
    if vanished:
        why.append(f"{len(vanished)} cached record(s) no longer on disk")
    if dupes:
        why.append(f"{dupes} duplicate row(s)")
    consumed = int(manifest.ledger.get("size", 0) or 0)
    if consumed > ledger_whole:
        why.append("it has read more of issues.jsonl than the file now holds")
    if why:
        return CacheCheck("broken", why)
    new = [n for n in current if n not in cached]
    behind = []
    if new:
        behind.append(f"{len(new)} new record(s)")
    if replaced:
        behind.append(f"{len(replaced)} record file(s) replaced (e.g. a correction added supersededBy)")
    if consumed < ledger_whole:
        behind.append("new ledger lines")
    return CacheCheck("behind", behind) if behind else CacheCheck("ok")
