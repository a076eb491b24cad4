"""SQLite: a project's (or a root's) memory as a database that Datasette and sqlite-utils open as it is.

Tables ``records`` (with the FTS5 index ``records_fts``), ``issue_events`` and ``issues``; see
:func:`export_sqlite` and USAGE.md, "SQLite for Datasette".

Written with the stdlib, in sqlite-utils' conventions, not by sqlite-utils (issue 30; figures:
benchmarks/RESULTS.md, "The SQLite export beside sqlite-utils"). sqlite-utils writes the same
database (tables, columns, keys, indexes, rows, rowids, FTS; only the quoting of the stored schema
text differs), but its ``upsert_all`` converts every value in Python: on the 7.7k-run corpus a
first export takes 1.2-1.7x as long, and a re-export that passes it every row (rewriting each row
and its FTS entry) 1.5-1.7x. Letting it write only the DDL keeps the speed, but would make this
stdlib-only export, and the redaction's update of exported databases (:func:`refresh_sqlite`),
need an optional package that must join this module's one transaction (sqlite-utils 4 does), for
some forty lines of fixed DDL that tests/exchange/test_export.py holds to sqlite-utils' own reading
(``detect_fts``, keys, triggers).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from .. import _io
from ..errors import StoreError, ValidationError
from ..store.memory_store import MemoryStore
from .destination import check_out
from .export_log import note_export
from .rows import (EVENT_COLUMNS, FOLD_COLUMNS, RECORD_COLUMNS, TABLES, as_stores, check_table, flat_rows, fold_rows,
                   progress_bar, project_frames)
from .summary import ExportSummary

__all__ = ["export_sqlite", "refresh_sqlite"]

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
    issues = "CREATE TABLE IF NOT EXISTS [issues] (\n" + ",\n".join(cols(FOLD_COLUMNS, ("project", "issueId"))) + \
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
    stores = as_stores(stores)
    tables = [check_table(t) for t in tables]
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
        if db != path:
            # A new database built in a temp file: a failure discards the file, so its rollback
            # journal can live in memory and no -journal file is left beside it by a kill.
            conn.execute("PRAGMA journal_mode = MEMORY")
        conn.execute("PRAGMA secure_delete = ON")  # an updated (redacted) value leaves no copy in free pages
        conn.execute("BEGIN IMMEDIATE")
        tables_sql, rest_sql = _create_sql()
        for stmt in _split_sql(tables_sql):
            conn.execute(stmt)
        _check_columns(conn, path)
        for stmt in _split_sql(rest_sql):
            conn.execute(stmt)
        with progress_bar(len(stores) * len(tables), "sqlite", progress) as bar:
            for store in stores:
                records, events = project_frames(store, summary.warnings)
                if "records" in tables:
                    rows = flat_rows(records, store.slug, RECORD_COLUMNS)
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
                    rows = flat_rows(events, store.slug, EVENT_COLUMNS)
                    new, updated = _upsert(conn, "issue_events", EVENT_COLUMNS, ("project", "line"), rows)
                    ts = summary.table("issue_events")
                    ts.rows += len(rows)
                    ts.new += new
                    ts.updated += updated
                    fold = fold_rows(events, store.slug)
                    before = conn.execute("SELECT count(*) FROM [issues] WHERE [project] = ?", (store.slug,)).fetchone()[0]
                    conn.execute("DELETE FROM [issues] WHERE [project] = ?", (store.slug,))
                    if fold:
                        cols = ", ".join(_q(c) for c in FOLD_COLUMNS)
                        conn.executemany(f"INSERT INTO [issues] ({cols}) VALUES ({', '.join('?' for _ in FOLD_COLUMNS)})",
                                         [tuple(r[c] for c in FOLD_COLUMNS) for r in fold])
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
    want = {"records": _SQL_RECORD_COLUMNS, "issue_events": EVENT_COLUMNS, "issues": FOLD_COLUMNS}
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
