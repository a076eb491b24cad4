"""Exports: a project's memory (or a whole root's) as NDJSON, CSV, a Parquet dataset or SQLite.

Every format reads the store through its public views (:meth:`MemoryStore.records` for NDJSON,
the frames of :mod:`cybmem.explore.frames` for the flat ones), and every row carries the project slug.
The Parquet dataset is ``DIR/<records|issues>/machine=<m>/project=<slug>/month=<YYYY-MM>/part-<UTC
time>-<hex>.parquet`` (files: :data:`RECORDS_SCHEMA`, :data:`ISSUES_SCHEMA`; path columns:
:data:`PARTITION_SCHEMA`, strings; :func:`read_dataset` opens it), written incrementally and never
rewritten (but by :func:`refresh_dataset` after ``cybmem redact``), each file under a dot-name
then renamed, so many machines append to one DIR side by side. :func:`check_out` is the one rule
for a destination; every export is noted in ``exports.json`` (:func:`note_export`) so that a
redaction reaches it. What the dataset leaves out (``superseded``, ``durationS``) and why:
USAGE.md, "Exporting: ``cybmem export``".
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shlex
import socket
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import quote

import orjson
import pyarrow as pa

from .. import _io
from ..errors import StoreError, ValidationError
from ..store.memory_store import MemoryStore
from ..store.records import ms_to_iso

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import pyarrow.dataset as pads

__all__ = [
    "SCHEMA_VERSION",
    "RECORDS_SCHEMA",
    "ISSUES_SCHEMA",
    "PARTITION_SCHEMA",
    "RECORD_COLUMNS",
    "EVENT_COLUMNS",
    "ExportSummary",
    "TableSummary",
    "all_stores",
    "default_machine",
    "validate_machine",
    "export_ndjson",
    "export_csv",
    "export_parquet",
    "export_sqlite",
    "read_dataset",
    "check_out",
    "EXPORTS_FILE",
    "known_exports",
    "note_export",
    "redo_command",
    "refresh_dataset",
    "refresh_sqlite",
]

SCHEMA_VERSION = 1

_TS = pa.timestamp("ms", tz="UTC")
_STR_LIST = pa.list_(pa.string())

#: Columns of ``DIR/records/**/*.parquet``, in file order (the partition columns are in the path):
#: a record with lineage and outcome flattened. Written out here, not taken from the cache's
#: schema (cybmem.store.arrow_records.RECORD_SCHEMA), so that a change to the cache cannot change a user's
#: files; a change here is a new SCHEMA_VERSION (tests/test_export.py pins it).
RECORDS_SCHEMA = pa.schema(
    [
        pa.field("runId", pa.string(), nullable=False),
        ("cwd", pa.string()),
        ("workflowName", pa.string()),
        ("task", pa.string()),
        ("state", pa.string()),  # done | error | cancelled
        ("startedAt", _TS),
        ("endedAt", _TS),
        ("parentRunId", pa.string()),
        ("chatSessionId", pa.string()),
        ("previousRunId", pa.string()),
        ("rootRunId", pa.string()),
        ("summary", pa.string()),
        ("accomplished", _STR_LIST),
        ("issues", _STR_LIST),
        ("next", _STR_LIST),
        ("workerAgents", _STR_LIST),  # workers[].agentId
        ("workerStates", _STR_LIST),  # workers[].state
        ("verdictSummary", pa.string()),
        ("supersededBy", pa.string()),
        ("supersedes", pa.string()),
    ],
    metadata={"cybmem.table": "records", "cybmem.schema_version": str(SCHEMA_VERSION)},
)

#: Columns of ``DIR/issues/**/*.parquet``: one ledger event a row.
ISSUES_SCHEMA = pa.schema(
    [
        pa.field("issueId", pa.string(), nullable=False),
        ("at", _TS),
        ("event", pa.string()),  # opened | resolved | reopened | wontfix
        ("byRunId", pa.string()),
        ("title", pa.string()),
        ("detail", pa.string()),
        ("line", pa.int64()),  # 1-based line of the event in the project's issues.jsonl
    ],
    metadata={"cybmem.table": "issues", "cybmem.schema_version": str(SCHEMA_VERSION)},
)

#: The Hive partition columns, in path order; all strings.
PARTITION_SCHEMA = pa.schema([("machine", pa.string()), ("project", pa.string()), ("month", pa.string())])

#: Columns of the flat records view (CSV, SQLite ``records``): the frame plus ``project``.
RECORD_COLUMNS = (
    "project", "runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt", "durationS",
    "parentRunId", "chatSessionId", "previousRunId", "rootRunId", "summary", "accomplished", "issues", "next",
    "workerAgents", "workerStates", "verdictSummary", "supersededBy", "supersedes", "superseded",
)
#: Columns of the flat issue-event view (CSV, SQLite ``issue_events``).
EVENT_COLUMNS = ("project", "issueId", "at", "event", "byRunId", "title", "detail", "line")
_FOLD_COLUMNS = (
    "project", "issueId", "title", "state", "openedAt", "resolvedAt", "lastAt", "ageS", "reopenCount", "events",
    "openedBy", "resolvedBy",
)
_LIST_COLUMNS = {"accomplished", "issues", "next", "workerAgents", "workerStates"}
_TIME_COLUMNS = {"startedAt", "endedAt", "at", "openedAt", "resolvedAt", "lastAt"}
TABLES = ("records", "issues")
_MACHINE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# --- results ---------------------------------------------------------------------------


@dataclass
class TableSummary:
    """What one export did to one table."""

    table: str
    rows: int = 0  # rows in the source (the store's records or events)
    new: int = 0  # rows written that the destination did not have
    updated: int = 0  # rows the destination had and that changed (SQLite)
    files: list[str] = field(default_factory=list)  # files written

    def to_dict(self) -> dict:
        return {"table": self.table, "rows": self.rows, "new": self.new, "updated": self.updated, "files": self.files}


@dataclass
class ExportSummary:
    """What an export wrote: format, destination, projects, per-table counts, warnings, time."""

    format: str
    out: str | None
    projects: list[str]
    tables: list[TableSummary] = field(default_factory=list)
    machine: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def table(self, name: str) -> TableSummary:
        for t in self.tables:
            if t.table == name:
                return t
        t = TableSummary(name)
        self.tables.append(t)
        return t

    def to_dict(self) -> dict:
        out = {
            "format": self.format,
            "out": self.out,
            "projects": self.projects,
            "tables": [t.to_dict() for t in self.tables],
        }
        if self.machine is not None:
            out["machine"] = self.machine
        out.update(self.extra)
        out["warnings"] = self.warnings
        out["seconds"] = round(self.seconds, 3)
        return out


# --- shared helpers ----------------------------------------------------------------------


def all_stores(root: str | os.PathLike, *, required: bool = False) -> list[MemoryStore]:
    """A store for every project directory of a memory root, by slug.

    Raises:
        NotFoundError: with ``required``, when the root holds no project (``export --all``).
    """
    from ..store.projects import project_dirs

    stores = [MemoryStore(root, slug) for slug in project_dirs(Path(root))]
    if required and not stores:
        from ..errors import NotFoundError

        raise NotFoundError(f"no projects under {root}; nothing to export")
    return stores


def _as_stores(stores: MemoryStore | Iterable[MemoryStore]) -> list[MemoryStore]:
    if isinstance(stores, MemoryStore):
        return [stores]
    out = list(stores)
    if not out:
        raise ValidationError("nothing to export: no project given (is the memory root empty? see `cybmem projects`)")
    return out


def _check_table(table: str) -> str:
    if table not in TABLES:
        raise ValidationError(f"table {table!r} is not one of {', '.join(TABLES)}")
    return table


def _progress(total: int, label: str, progress: bool | None):
    from ..progress import Progress

    return Progress(total, label, enabled=progress)


def _frames(store: MemoryStore, warnings: list[str]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """The records and issue-event frames of a project; unreadable files become warnings."""
    from ..explore.frames import issue_events_frame, records_frame
    from ..store.loading import load_snapshot

    snap = load_snapshot(store)  # loads (and caches) once; the frames below reuse it warm
    for p in getattr(snap, "problems", ()):
        warnings.append(f"{store.slug}: {p.message}")
    return records_frame(store), issue_events_frame(store)


def _iso(ms: int | None) -> str | None:
    """Epoch ms as ISO 8601 UTC (:func:`cybmem.store.records.ms_to_iso`), None kept."""
    return None if ms is None else ms_to_iso(ms)


def _column_values(df: "pd.DataFrame", name: str) -> list:
    """A frame column as Python values: timestamps as epoch ms, lists as lists, missing as None."""
    arr = pa.array(df[name])
    if name in _TIME_COLUMNS:
        return arr.cast(_TS).cast(pa.int64()).to_pylist()
    values = arr.to_pylist()
    if name in _LIST_COLUMNS:
        return [v if v is not None else [] for v in values]
    return [None if isinstance(v, float) and v != v else v for v in values]


def _flat_rows(df: "pd.DataFrame", project: str, columns: tuple[str, ...]) -> list[dict]:
    """Frame rows as flat dicts for CSV and SQLite: ISO times, lists as JSON text, ``project`` added."""
    cols: dict[str, list] = {}
    n = len(df)
    for name in columns:
        if name == "project":
            cols[name] = [project] * n
            continue
        values = _column_values(df, name)
        if name in _TIME_COLUMNS:
            values = [_iso(v) for v in values]
        elif name in _LIST_COLUMNS:
            values = [json.dumps(v, ensure_ascii=False) for v in values]
        cols[name] = values
    return [dict(zip(columns, row)) for row in zip(*(cols[c] for c in columns))] if n else []


def _fold_rows(events: "pd.DataFrame", project: str) -> list[dict]:
    """The issue fold (:func:`cybmem.explore.frames.issue_fold`) as flat rows; ``ageS``: openAge, else timeToResolve, in seconds."""
    import pandas as pd

    from ..explore.frames import issue_fold

    fold = issue_fold(events)
    if fold.empty:
        return []
    fold = fold.copy()
    fold["ageS"] = fold["openAge"].fillna(fold["timeToResolve"]).dt.total_seconds()
    rows = []
    for rec in fold.to_dict("records"):
        row = {"project": project}
        for name in _FOLD_COLUMNS[1:]:
            v = rec.get(name)
            if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and v != v):
                v = None
            elif name in _TIME_COLUMNS:
                v = _iso(int(pd.Timestamp(v).as_unit("ms").value // 1_000_000))
            elif name in ("reopenCount", "events"):
                v = int(v)
            elif name == "ageS":
                v = float(v)
            row[name] = v
        rows.append(row)
    return rows


# --- where an export may write --------------------------------------------------------------

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


# --- the exports a project knows of ----------------------------------------------------------

#: In each project directory: the exports written from it, for `cybmem redact` to reach.
EXPORTS_FILE = "exports.json"
_MAX_EXPORTS_BYTES = 16 * 1024 * 1024
_FORMATS = ("ndjson", "csv", "parquet", "sqlite", "prov")


def known_exports(store: MemoryStore) -> list[dict]:
    """The exports written from a project to a path (its ``exports.json``), oldest first.

    Each is ``{"format", "out" (absolute), "at" (epoch ms of the latest)}`` with ``machine`` and
    ``tables`` (parquet, sqlite), ``table`` (ndjson, csv), ``all`` (written with ``--all``),
    ``chain`` and ``provn`` (prov). Exports to stdout or a stream are not noted.

    Raises:
        StoreError: the file is damaged (fix or delete it; exports it named are then out of reach).
    """
    path = store.dir / EXPORTS_FILE
    try:
        doc = _io.loads(_io.read_file(path, limit=_MAX_EXPORTS_BYTES))
    except FileNotFoundError:
        return []
    except ValueError:
        doc = None
    entries = doc.get("exports") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise StoreError(f"{path} is damaged (not the list of exports cybmem writes); fix or delete it: "
                         "`cybmem redact` cannot reach the exports it named")
    return [e for e in entries if isinstance(e, dict) and e.get("format") in _FORMATS and isinstance(e.get("out"), str)]


def note_export(stores: Iterable[MemoryStore], entry: dict, warnings: list[str]) -> None:
    """Note an export in each project's ``exports.json`` (one entry per format, path and machine,
    its time the latest), before it is written: an export killed halfway is known too. Entries
    whose path is gone are dropped. A project that cannot be written (a read-only root) gets a
    warning instead; the export goes on."""
    entry = {**entry, "out": os.path.abspath(entry["out"]), "at": int(time.time() * 1000)}
    key = (entry["format"], entry["out"], entry.get("machine"))
    for store in stores:
        path = store.dir / EXPORTS_FILE
        try:
            store._check_not_symlinked()
            with store.lock():
                kept = [e for e in known_exports(store)
                        if (e["format"], e["out"], e.get("machine")) != key and os.path.lexists(e["out"])]
                _io.atomic_write(path, orjson.dumps({"version": 1, "exports": kept + [entry]},
                                                    option=orjson.OPT_INDENT_2) + b"\n")
        except OSError as exc:
            warnings.append(f"{store.slug}: could not note this export in {path} ({exc.strerror or exc}); "
                            "`cybmem redact` will not reach it")


def redo_command(store: MemoryStore, entry: dict) -> str:
    """The command that writes a noted export again (replacing the file)."""
    args = ["cybmem", "export", entry["format"], "--memory-dir", os.path.abspath(store.root)]
    args += ["--all"] if entry.get("all") else ["--project", store.slug]
    if entry.get("table"):
        args += ["--table", str(entry["table"])]
    if entry.get("chain"):
        args += ["--chain", str(entry["chain"])]
    if entry.get("provn"):
        args.append("--provn")
    args += ["--out", entry["out"], "--force"]
    return " ".join(shlex.quote(a) for a in args)


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


def _out_name(out) -> str | None:
    if out is None or out == "-":
        return None
    return str(out) if isinstance(out, (str, os.PathLike)) else getattr(out, "name", None)


def _stream_sink(stores: list[MemoryStore], out, force: bool, entry: dict, summary: ExportSummary) -> Sink:
    """The sink of a file export, noted in each project's exports.json once the path passed the checks."""
    sink = Sink(out, force=force, roots=[s.root for s in stores])
    if isinstance(out, (str, os.PathLike)) and out != "-":
        check_out(out, force=force, roots=sink.roots)
        note_export(stores, {**entry, "out": str(out), "all": len(stores) > 1}, summary.warnings)
    return sink


# --- NDJSON ------------------------------------------------------------------------------


def export_ndjson(
    stores: MemoryStore | Iterable[MemoryStore],
    out: str | os.PathLike | IO | None = None,
    *,
    table: str = "records",
    progress: bool | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write records (as stored) or ledger events as newline-delimited JSON, with a ``project`` key first.

    Args:
        stores: one project's store, or several (``--all``).
        out: a file path (written atomically; see :func:`check_out` for what is refused), a
            stream, or None / ``"-"`` for stdout.
        table: ``records`` (each record as written on disk, unknown fields kept; oldest first)
            or ``issues`` (each ledger event as written, in file order).
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        force: replace an existing regular file at ``out``.

    Returns:
        An :class:`ExportSummary`; unreadable files are skipped and listed in ``warnings``.
    """
    started = time.perf_counter()
    stores = _as_stores(stores)
    _check_table(table)
    summary = ExportSummary("ndjson", _out_name(out), [s.slug for s in stores])
    ts = summary.table(table)
    with _stream_sink(stores, out, force, {"format": "ndjson", "table": table}, summary) as fh:
        for store in stores:
            items = store.records() if table == "records" else store.issue_events()
            with _progress(len(items), f"ndjson {store.slug}", progress) as bar:
                for i, item in enumerate(items, 1):
                    d = item.to_dict()
                    # project first; a field of the record named "project" (none in the spec) is shadowed.
                    line = {"project": store.slug, **{k: v for k, v in d.items() if k != "project"}}
                    fh.write(orjson.dumps(line) + b"\n")
                    if i % 256 == 0:
                        bar.update(256)
                bar.update(len(items) % 256)
            ts.rows += len(items)
            ts.new += len(items)
            summary.warnings += [f"{store.slug}: {p.message}" for p in store.problems]
    if summary.out:
        ts.files.append(summary.out)
    summary.seconds = time.perf_counter() - started
    return summary


# --- CSV ---------------------------------------------------------------------------------


def export_csv(
    stores: MemoryStore | Iterable[MemoryStore],
    out: str | os.PathLike | IO | None = None,
    *,
    table: str = "records",
    progress: bool | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write records or ledger events as CSV (RFC 4180, UTF-8, a header row).

    Records: :data:`RECORD_COLUMNS` (the frame with lineage and outcome flattened, plus
    ``project``); events: :data:`EVENT_COLUMNS`. Times are ISO 8601 UTC
    (``2026-10-01T00:18:00.000Z``), lists JSON text (``["a", "b"]``), booleans
    ``true``/``false``; a missing value is an empty cell (CSV has no null). A text a
    spreadsheet would run as a formula gets a leading ``'`` (:func:`_csv_cell`).

    Args:
        stores: one project's store, or several (``--all``).
        out: a file path (written atomically; see :func:`check_out` for what is refused), a
            stream, or None / ``"-"`` for stdout.
        table: ``records`` or ``issues``.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        force: replace an existing regular file at ``out``.
    """
    started = time.perf_counter()
    stores = _as_stores(stores)
    _check_table(table)
    columns = RECORD_COLUMNS if table == "records" else EVENT_COLUMNS
    summary = ExportSummary("csv", _out_name(out), [s.slug for s in stores])
    ts = summary.table(table)
    with _stream_sink(stores, out, force, {"format": "csv", "table": table}, summary) as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
        try:
            writer = csv.writer(text, lineterminator="\r\n")
            writer.writerow(columns)
            for store in stores:
                records, events = _frames(store, summary.warnings)
                rows = _flat_rows(records if table == "records" else events, store.slug, columns)
                with _progress(len(rows), f"csv {store.slug}", progress) as bar:
                    for i, row in enumerate(rows, 1):
                        writer.writerow([_csv_cell(v) for v in row.values()])
                        if i % 256 == 0:
                            bar.update(256)
                    bar.update(len(rows) % 256)
                ts.rows += len(rows)
                ts.new += len(rows)
            text.flush()
        finally:
            text.detach()  # leave the underlying stream (stdout) open
    if summary.out:
        ts.files.append(summary.out)
    summary.seconds = time.perf_counter() - started
    return summary


# Cells a spreadsheet reads as a formula (OWASP, "CSV Injection"): = + - @, a tab or a carriage
# return first, or = + - @ after blanks the spreadsheet trims on import.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _csv_cell(value) -> object:
    """One CSV cell: booleans as ``true``/``false``, None as empty, and a text that a spreadsheet
    would run (``=HYPERLINK(...)``, ``@SUM(...)``, ``\\t=1+1``, `` -2+3``) with a ``'`` put
    first, so the spreadsheet shows it as text; a plain number (``-5``, ``+1.5e3``) is left as it
    is. The NDJSON, Parquet and SQLite exports hold the raw values."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    if isinstance(value, str) and value and (
        value.startswith(_FORMULA_START) or value.lstrip().startswith(_FORMULA_START[:4])
    ) and not _PLAIN_NUMBER.fullmatch(value.strip()):
        return "'" + value
    return value


# --- Parquet dataset -----------------------------------------------------------------------


def default_machine() -> str:
    """This host's name, as a partition value (the first label of the name, made safe)."""
    name = socket.gethostname().split(".")[0]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-_") or "localhost"
    return name[:64]


def validate_machine(name: object) -> str:
    """Return ``name`` if it is one safe path segment (``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``)."""
    if not isinstance(name, str) or not _MACHINE_RE.fullmatch(name):
        raise ValidationError(
            f"machine name {name!r} is not one safe path segment; use 1-64 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )
    return name


def _segment(value: str) -> str:
    """A Hive partition value, URI-encoded as pyarrow's hive partitioning decodes it."""
    return quote(value, safe="-_.~")


def _partition_dir(out_dir: Path, table: str, machine: str, project: str) -> Path:
    return out_dir / table / f"machine={_segment(machine)}" / f"project={_segment(project)}"


def _existing_files(pdir: Path) -> list[Path]:
    if not pdir.is_dir():
        return []
    return sorted(p for p in pdir.glob("month=*/*.parquet") if not p.name.startswith((".", "_")))


def _read_column(files: list[Path], column: str) -> pa.ChunkedArray | None:
    import pyarrow.parquet as pq

    if not files:
        return None
    parts = []
    for f in files:
        try:
            with _io.open_regular(f, follow=True) as fh:  # a FIFO here would hang the export
                parts.append(pq.read_table(fh, columns=[column]).column(column))
        except (pa.ArrowException, OSError) as exc:
            raise StoreError(
                f"cannot read {f} ({exc}); the dataset holds a file cybmem did not write or a damaged one: "
                "move it aside and export again"
            ) from None
    return pa.chunked_array([c for part in parts for c in part.chunks], type=parts[0].type)


def _months(ts: pa.ChunkedArray | pa.Array) -> list[str]:
    import pyarrow.compute as pc

    return pc.strftime(ts, format="%Y-%m").to_pylist()


def _write_part(month_dir: Path, table: pa.Table) -> Path:
    """Write one part file atomically (a temp file readers skip, fsync, then a link to a new name)."""
    import pyarrow.parquet as pq

    month_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    final = month_dir / f"part-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
    with _io.atomic_file(final, private=False, overwrite=False) as fh:
        pq.write_table(table, fh, compression="zstd")
    return final


@contextlib.contextmanager
def _dataset_lock(out_dir: Path, machine: str) -> Iterator[None]:
    out_dir.mkdir(parents=True, exist_ok=True)
    with _io.locked(out_dir / f".lock-{machine}"):
        yield


def _records_arrow(df: "pd.DataFrame") -> pa.Table:
    cols = [f.name for f in RECORDS_SCHEMA]
    table = pa.Table.from_pandas(df[cols], schema=RECORDS_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(RECORDS_SCHEMA.metadata)


def _events_arrow(df: "pd.DataFrame") -> pa.Table:
    cols = [f.name for f in ISSUES_SCHEMA]
    table = pa.Table.from_pandas(df[cols], schema=ISSUES_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(ISSUES_SCHEMA.metadata)


def _append_partitioned(pdir: Path, table: pa.Table, time_column: str, bar, ts: TableSummary) -> None:
    """Write the new rows of one machine/project, one part file per month."""
    import pyarrow.compute as pc

    if not table.num_rows:
        return
    months = pa.array(_months(table.column(time_column)))
    for month in sorted(set(months.to_pylist())):
        part = table.filter(pc.equal(months, month))
        path = _write_part(pdir / f"month={_segment(month)}", part)
        ts.files.append(str(path))
        ts.new += part.num_rows
        bar.update(part.num_rows)


def export_parquet(
    stores: MemoryStore | Iterable[MemoryStore],
    out_dir: str | os.PathLike,
    *,
    machine: str | None = None,
    tables: Iterable[str] = TABLES,
    progress: bool | None = None,
    note: bool = True,
) -> ExportSummary:
    """Append a project's records and ledger events to a Hive-partitioned Parquet dataset.

    Only what the dataset does not hold yet for this machine and project is written
    (records by ``runId``, events past the last exported ledger ``line``), as new part
    files under ``DIR/<table>/machine=<m>/project=<slug>/month=<YYYY-MM>/``; existing
    files are never touched (but by :func:`refresh_dataset`). See the module docstring for the
    layout and schemas; each export is noted in the projects' ``exports.json`` (:func:`note_export`).

    Args:
        stores: one project's store, or several (``--all``).
        out_dir: the dataset directory (created).
        machine: the ``machine`` partition (default: :func:`default_machine`).
        tables: which of ``records`` and ``issues`` to export.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        note: note the dataset in the projects' ``exports.json`` (:func:`note_export`); False for
            a temporary dataset its maker removes (a report's), which no redaction need reach.

    Returns:
        An :class:`ExportSummary`: per table, the source rows, the rows newly written and the files.

    Raises:
        ValidationError: a bad machine name or table.
        StoreError: the dataset holds an unreadable file, or a ledger is shorter than what
            was already exported from it (it was replaced; appending would mix two ledgers).
    """
    import pyarrow.compute as pc

    started = time.perf_counter()
    stores = _as_stores(stores)
    tables = [_check_table(t) for t in tables]
    machine = validate_machine(machine if machine is not None else default_machine())
    out_dir = check_out(out_dir, roots=[s.root for s in stores], directory=True)
    summary = ExportSummary("parquet", str(out_dir), [s.slug for s in stores], machine=machine)
    for t in tables:
        summary.table(t)
    if note:  # before the dataset lock is taken, which a redaction takes after its own
        note_export(stores, {"format": "parquet", "out": str(out_dir), "machine": machine, "tables": tables,
                             "all": len(stores) > 1}, summary.warnings)
    with _dataset_lock(out_dir, machine):
        for store in stores:
            records, events = _frames(store, summary.warnings)
            if "records" in tables:
                ts = summary.table("records")
                pdir = _partition_dir(out_dir, "records", machine, store.slug)
                have = _read_column(_existing_files(pdir), "runId")
                table = _records_arrow(records)
                ts.rows += table.num_rows
                if have is not None and len(have):
                    table = table.filter(pc.invert(pc.is_in(table.column("runId"), value_set=have.combine_chunks())))
                with _progress(table.num_rows, f"parquet records {store.slug}", progress) as bar:
                    _append_partitioned(pdir, table, "endedAt", bar, ts)
            if "issues" in tables:
                ts = summary.table("issues")
                pdir = _partition_dir(out_dir, "issues", machine, store.slug)
                lines = _read_column(_existing_files(pdir), "line")
                last = pc.max(lines).as_py() if lines is not None and len(lines) else 0
                table = _events_arrow(events)
                ts.rows += table.num_rows
                if last:
                    newest = pc.max(table.column("line")).as_py() if table.num_rows else 0
                    if newest < last:
                        raise StoreError(
                            f"{store.issues_path} ends at line {newest or 0} but line {last} of project "
                            f"{store.slug} was already exported to {pdir}: the ledger was replaced. Export to a new "
                            "directory, or move that partition aside and export again"
                        )
                    table = table.filter(pc.greater(table.column("line"), last))
                with _progress(table.num_rows, f"parquet issues {store.slug}", progress) as bar:
                    _append_partitioned(pdir, table, "at", bar, ts)
    summary.seconds = time.perf_counter() - started
    return summary


def read_dataset(out_dir: str | os.PathLike, table: str = "records") -> "pads.Dataset":
    """Open one table of an exported Parquet dataset (every machine and project) with pyarrow.dataset.

    ``machine``, ``project`` and ``month`` come from the path, as strings.

    Example:
        >>> read_dataset("fleet").to_table(filter=pc.field("project") == "web").to_pandas()  # doctest: +SKIP
    """
    import pyarrow.dataset as ds

    _check_table(table)
    schema = RECORDS_SCHEMA if table == "records" else ISSUES_SCHEMA
    full = pa.schema(list(schema) + list(PARTITION_SCHEMA), metadata=schema.metadata)
    return ds.dataset(
        str(Path(out_dir) / table), format="parquet", schema=full,
        partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
    )


def refresh_dataset(
    store: MemoryStore,
    out_dir: str | os.PathLike,
    machine: str,
    *,
    run_ids: Iterable[str] = (),
    issue_ids: Iterable[str] = (),
    holds: Callable[[str], bool] | None = None,
) -> tuple[list[str], list[str]]:
    """Bring one machine's rows of a project in an exported dataset in line with the store, after
    ``cybmem redact`` rewrote records and ledger lines (the one time a part file is rewritten).

    Records: each row of a run in ``run_ids``, or whose ``issues`` names one of ``issue_ids``
    (ids the redaction renamed), becomes the store's row of that run now. Events: each row that
    differs from the ledger's event at its ``line`` becomes that event. A file with a changed row
    is replaced whole under its own name (a temp file, fsync, rename: a reader sees the old file
    or the new one), under the machine's dataset lock; the others are not touched. Temp files a
    killed writer of this machine left in the partition are removed.

    Returns:
        The files rewritten, and each file with a text for which ``holds`` says yes (with its
        runs or ledger lines).
    """
    import pyarrow.parquet as pq

    from ..store.loading import load_snapshot

    out_dir = Path(out_dir)
    machine = validate_machine(machine)
    snap = load_snapshot(store)  # Arrow, no pandas: `cybmem redact` and `doctor --repair` stay lean
    runs, olds = set(run_ids), set(issue_ids)
    rewritten: list[str] = []
    holding: list[str] = []
    # The lock file only: a dataset that is gone is not made again.
    with _io.locked(out_dir / f".lock-{machine}"):
        for table in TABLES:
            pdir = _partition_dir(out_dir, table, machine, store.slug)
            _remove_debris(pdir)
            files = _existing_files(pdir)
            if not files:
                continue
            if table == "records":
                schema, key, source = RECORDS_SCHEMA, "runId", snap.records
                wanted = (lambda row: row["runId"] in runs or bool(olds.intersection(row.get("issues") or ())))
            else:
                schema, key, source = ISSUES_SCHEMA, "line", snap.events
                wanted = (lambda row: True)
            current = pa.Table.from_pylist(source.select(schema.names).to_pylist(), schema=schema)
            now = {r[key]: r for r in current.to_pylist()}
            for f in files:
                try:
                    with _io.open_regular(f, follow=True) as fh:
                        rows = pq.ParquetFile(fh).read().to_pylist()
                except (pa.ArrowException, OSError) as exc:
                    raise StoreError(f"cannot read {f} ({exc}); the dataset holds a file cybmem did not write or a "
                                     "damaged one: move it aside and export again") from None
                new = [now.get(row[key], row) if wanted(row) else row for row in rows]
                if new != rows:
                    with _io.atomic_file(f, private=False) as fh:
                        pq.write_table(pa.Table.from_pylist(new, schema=schema), fh, compression="zstd")
                    rewritten.append(str(f))
                held = [str(row[key]) for row in new if holds is not None and _row_holds(row, holds)]
                if held:
                    what = "runs" if table == "records" else "ledger lines"
                    holding.append(f"{f} ({what} {', '.join(held[:5])}{', ...' if len(held) > 5 else ''}: "
                                   "`cybmem redact --everywhere` with the same text)")
    return rewritten, holding


def _row_holds(row: dict, holds: Callable[[str], bool]) -> bool:
    return any(isinstance(item, str) and holds(item)
               for v in row.values() for item in (v if isinstance(v, list) else [v]))


def _remove_debris(pdir: Path) -> None:
    """Remove the temp files of killed writers from a partition (its machine's lock held)."""
    if not pdir.is_dir():
        return
    for tmp in pdir.glob(f"month=*/{_io.TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink()


# --- SQLite --------------------------------------------------------------------------------

_SQL_TYPES = {
    "durationS": "REAL", "superseded": "INTEGER", "line": "INTEGER", "ageS": "REAL", "reopenCount": "INTEGER",
    "events": "INTEGER",
}
_FTS_COLUMNS = ("task", "summary")
_SQL_RECORD_COLUMNS = ("runId", "project") + RECORD_COLUMNS[2:]  # the primary key first, as Datasette shows it


def _q(name: str) -> str:
    return "[" + name + "]"


def _create_sql() -> tuple[str, str]:
    """The tables, then the FTS table, its triggers and the indexes (created once the tables are known good)."""
    def cols(names, pk=()):
        out = []
        for n in names:
            typ = _SQL_TYPES.get(n, "TEXT")
            out.append(f"   {_q(n)} {typ}" + (" NOT NULL" if n in pk else ""))
        return out

    rec_cols = _SQL_RECORD_COLUMNS
    fk = ",\n".join(
        f"   FOREIGN KEY({_q(c)}) REFERENCES [records]([runId])" for c in ("parentRunId", "previousRunId")
    )
    records = "CREATE TABLE IF NOT EXISTS [records] (\n" + ",\n".join(cols(rec_cols, ("runId",))) + \
        ",\n   PRIMARY KEY ([runId]),\n" + fk + "\n);"
    events = "CREATE TABLE IF NOT EXISTS [issue_events] (\n" + ",\n".join(cols(EVENT_COLUMNS, ("project", "line"))) + \
        ",\n   PRIMARY KEY ([project], [line]),\n   FOREIGN KEY([byRunId]) REFERENCES [records]([runId])\n);"
    issues = "CREATE TABLE IF NOT EXISTS [issues] (\n" + ",\n".join(cols(_FOLD_COLUMNS, ("project", "issueId"))) + \
        ",\n   PRIMARY KEY ([project], [issueId]),\n" + ",\n".join(
            f"   FOREIGN KEY({_q(c)}) REFERENCES [records]([runId])" for c in ("openedBy", "resolvedBy")) + "\n);"
    # The FTS table and its triggers as sqlite-utils' enable_fts(..., create_triggers=True) writes them,
    # so sqlite-utils' detect_fts() and Datasette's search box find it.
    fts_cols = ", ".join(_q(c) for c in _FTS_COLUMNS)
    old = ", ".join(f"old.{_q(c)}" for c in _FTS_COLUMNS)
    new = ", ".join(f"new.{_q(c)}" for c in _FTS_COLUMNS)
    fts = f"""
CREATE VIRTUAL TABLE IF NOT EXISTS [records_fts] USING FTS5 (
    {fts_cols},
    content=[records]
);
CREATE TRIGGER IF NOT EXISTS [records_ai] AFTER INSERT ON [records] BEGIN
  INSERT INTO [records_fts] (rowid, {fts_cols}) VALUES (new.rowid, {new});
END;
CREATE TRIGGER IF NOT EXISTS [records_ad] AFTER DELETE ON [records] BEGIN
  INSERT INTO [records_fts] ([records_fts], rowid, {fts_cols}) VALUES('delete', old.rowid, {old});
END;
CREATE TRIGGER IF NOT EXISTS [records_au] AFTER UPDATE ON [records] BEGIN
  INSERT INTO [records_fts] ([records_fts], rowid, {fts_cols}) VALUES('delete', old.rowid, {old});
  INSERT INTO [records_fts] (rowid, {fts_cols}) VALUES (new.rowid, {new});
END;
"""
    indexes = """
CREATE INDEX IF NOT EXISTS [idx_records_project_endedAt] ON [records] ([project], [endedAt]);
CREATE INDEX IF NOT EXISTS [idx_records_state] ON [records] ([state]);
CREATE INDEX IF NOT EXISTS [idx_issue_events_issueId] ON [issue_events] ([issueId]);
CREATE INDEX IF NOT EXISTS [idx_issues_state] ON [issues] ([state]);
"""
    return "\n".join([records, events, issues]), "\n".join([fts, indexes])


def _upsert(conn, table: str, columns: tuple[str, ...], key: tuple[str, ...], rows: list[dict]) -> tuple[int, int]:
    """Insert new rows and update changed ones; returns (new, updated). Unchanged rows are not touched.

    An UPSERT (not INSERT OR REPLACE) so the FTS update trigger fires and rowids stay.
    """
    if not rows:
        return 0, 0
    cols = ", ".join(_q(c) for c in columns)
    conn.execute("DROP TABLE IF EXISTS temp.[_incoming]")
    conn.execute(f"CREATE TEMP TABLE [_incoming] AS SELECT {cols} FROM main.{_q(table)} WHERE 0")
    conn.executemany(f"INSERT INTO temp.[_incoming] ({cols}) VALUES ({', '.join('?' for _ in columns)})",
                     [tuple(r[c] for c in columns) for r in rows])
    join = " AND ".join(f"t.{_q(k)} = i.{_q(k)}" for k in key)
    differs = " OR ".join(f"t.{_q(c)} IS NOT i.{_q(c)}" for c in columns if c not in key)
    new = conn.execute(f"SELECT count(*) FROM temp.[_incoming] i WHERE NOT EXISTS "
                       f"(SELECT 1 FROM main.{_q(table)} t WHERE {join})").fetchone()[0]
    updated = conn.execute(f"SELECT count(*) FROM temp.[_incoming] i JOIN main.{_q(table)} t ON {join} "
                           f"WHERE {differs}").fetchone()[0]
    sets = ", ".join(f"{_q(c)} = excluded.{_q(c)}" for c in columns if c not in key)
    changed = " OR ".join(f"{_q(c)} IS NOT excluded.{_q(c)}" for c in columns if c not in key)
    conn.execute(
        f"INSERT INTO main.{_q(table)} ({cols}) SELECT {cols} FROM temp.[_incoming] WHERE true "
        f"ON CONFLICT ({', '.join(_q(k) for k in key)}) DO UPDATE SET {sets} WHERE {changed}"
    )
    conn.execute("DROP TABLE temp.[_incoming]")
    return new, updated


def export_sqlite(
    stores: MemoryStore | Iterable[MemoryStore],
    path: str | os.PathLike,
    *,
    tables: Iterable[str] = TABLES,
    progress: bool | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write (or update) a SQLite database that Datasette and sqlite-utils open as it is.

    Tables: ``records`` (primary key ``runId``; :data:`RECORD_COLUMNS`, times ISO 8601 UTC,
    lists JSON text, ``superseded`` 0/1), ``records_fts`` (FTS5 over task and summary, kept in
    step by triggers, in the sqlite-utils convention), ``issue_events`` (primary key
    ``project, line``) and ``issues`` (the current fold of each project's ledger, replaced on
    every export; ``ageS`` is measured at export time). Re-exporting inserts what is new,
    updates what changed (e.g. ``superseded`` after a correction) and never duplicates;
    everything is written in one transaction, so a reader sees the old or the new state.

    A new database is built in a temp file beside ``path`` and renamed into place, so an
    interrupted export leaves no partial file; an existing one is updated in one transaction,
    with deleted and overwritten content zeroed (``secure_delete``) and the full-text index merged
    after an update, so a value `cybmem redact` removed leaves no copy in the file.

    Args:
        stores: one project's store, or several (``--all``).
        path: the database file (created when missing; see :func:`check_out` for what is refused:
            an existing file that is not a SQLite database is replaced only with ``force``).
        tables: ``records`` and/or ``issues`` (the latter writes ``issue_events`` and ``issues``).
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        force: replace an existing file that is not a SQLite database.
    """
    started = time.perf_counter()
    stores = _as_stores(stores)
    tables = [_check_table(t) for t in tables]
    path = Path(path)
    update = _is_sqlite(path)
    check_out(path, roots=[s.root for s in stores], update=True)  # all but the rule for an existing file:
    if not (update or force) and os.path.lexists(path):
        raise ValidationError(f"{path} exists and is not a SQLite database; add --force to replace it")
    summary = ExportSummary("sqlite", str(path), [s.slug for s in stores])
    note_export(stores, {"format": "sqlite", "out": str(path), "tables": tables, "all": len(stores) > 1},
                summary.warnings)
    if update:
        _sqlite_write(stores, path, path, tables, summary, progress)
    else:
        try:
            with _io.atomic_path(path, private=False, overwrite=force) as tmp:
                _sqlite_write(stores, tmp, path, tables, summary, progress)
        except FileExistsError:
            raise ValidationError(f"{path} appeared while the export was written; add --force to replace it") from None
    for t in summary.tables:
        t.files.append(str(path))
    summary.extra["fts"] = {"table": "records_fts", "columns": list(_FTS_COLUMNS)}
    summary.seconds = time.perf_counter() - started
    return summary


def refresh_sqlite(store: MemoryStore, path: str | os.PathLike, tables: Iterable[str] = TABLES) -> int:
    """Update a project's rows in a SQLite export after a redaction (as a re-export does, without
    noting it again); returns the rows updated."""
    summary = ExportSummary("sqlite", str(path), [store.slug])
    _sqlite_write([store], Path(path), Path(path), [t for t in tables if t in TABLES], summary, False)
    return sum(t.updated for t in summary.tables)


def _is_sqlite(path: Path) -> bool:
    """A regular file (not a link) that starts as every SQLite database does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 16) == b"SQLite format 3\x00"
    finally:
        os.close(fd)


def _sqlite_write(stores: list[MemoryStore], db: Path, path: Path, tables: list[str], summary: ExportSummary,
                  progress: bool | None) -> None:
    """Insert and update the stores' rows in the database file ``db`` (named ``path`` in messages)."""
    import sqlite3

    try:
        conn = sqlite3.connect(db, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {path} as a SQLite database: {exc}") from None
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA secure_delete = ON")  # an updated (redacted) value leaves no copy in free pages
        conn.execute("BEGIN IMMEDIATE")
        tables_sql, rest_sql = _create_sql()
        for stmt in _split_sql(tables_sql):
            conn.execute(stmt)
        _check_columns(conn, path)
        for stmt in _split_sql(rest_sql):
            conn.execute(stmt)
        with _progress(len(stores) * len(tables), "sqlite", progress) as bar:
            for store in stores:
                records, events = _frames(store, summary.warnings)
                if "records" in tables:
                    rows = _flat_rows(records, store.slug, RECORD_COLUMNS)
                    for r in rows:
                        r["superseded"] = int(bool(r["superseded"]))
                    clash = _id_clashes(conn, store.slug, [r["runId"] for r in rows])
                    if clash:
                        raise StoreError(
                            f"run {clash[0][0]} of project {store.slug} is already in {path} as a run of project "
                            f"{clash[0][1]}; runIds must be unique across the projects of one database"
                        )
                    new, updated = _upsert(conn, "records", _SQL_RECORD_COLUMNS, ("runId",), rows)
                    ts = summary.table("records")
                    ts.rows += len(rows)
                    ts.new += new
                    ts.updated += updated
                    bar.update()
                if "issues" in tables:
                    rows = _flat_rows(events, store.slug, EVENT_COLUMNS)
                    new, updated = _upsert(conn, "issue_events", EVENT_COLUMNS, ("project", "line"), rows)
                    ts = summary.table("issue_events")
                    ts.rows += len(rows)
                    ts.new += new
                    ts.updated += updated
                    fold = _fold_rows(events, store.slug)
                    before = conn.execute("SELECT count(*) FROM [issues] WHERE [project] = ?", (store.slug,)).fetchone()[0]
                    conn.execute("DELETE FROM [issues] WHERE [project] = ?", (store.slug,))
                    if fold:
                        cols = ", ".join(_q(c) for c in _FOLD_COLUMNS)
                        conn.executemany(f"INSERT INTO [issues] ({cols}) VALUES ({', '.join('?' for _ in _FOLD_COLUMNS)})",
                                         [tuple(r[c] for c in _FOLD_COLUMNS) for r in fold])
                    ts = summary.table("issues")
                    ts.rows += len(fold)
                    ts.new += max(len(fold) - before, 0)
                    bar.update()
        if any(t.updated for t in summary.tables):
            # The full-text index keeps a changed row's old terms in older segments until they merge.
            conn.execute("INSERT INTO [records_fts] ([records_fts]) VALUES ('optimize')")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise StoreError(f"cannot write {path}: {exc}") from None
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def _split_sql(script: str) -> list[str]:
    """Split the schema script into statements (triggers hold ``;`` inside BEGIN ... END)."""
    import sqlite3

    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    return out


def _check_columns(conn, path: Path) -> None:
    """A database written by another program (or another schema version) is refused, not mixed into."""
    want = {"records": _SQL_RECORD_COLUMNS, "issue_events": EVENT_COLUMNS, "issues": _FOLD_COLUMNS}
    for table, columns in want.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({_q(table)})")}
        missing = set(columns) - have
        if missing:
            raise StoreError(
                f"{path}: table {table} lacks column(s) {', '.join(sorted(missing))}; it was not written by this "
                "version of `cybmem export sqlite`: export to a new file"
            )


def _id_clashes(conn, project: str, run_ids: list[str]) -> list[tuple[str, str]]:
    if not run_ids:
        return []
    out = []
    for i in range(0, len(run_ids), 500):
        chunk = run_ids[i:i + 500]
        out += conn.execute(
            f"SELECT [runId], [project] FROM [records] WHERE [project] != ? AND [runId] IN ({', '.join('?' for _ in chunk)})",
            (project, *chunk),
        ).fetchall()
    return out

