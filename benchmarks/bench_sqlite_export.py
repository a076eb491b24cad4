"""The SQLite export beside sqlite-utils writing the same database: the format compared, then the time.

    python benchmarks/bench_sqlite_export.py                 # the fixtures and the 7.7k-run corpus, 3 runs
    python benchmarks/bench_sqlite_export.py --runs 7 --root DIR

Issue 30 asked whether `cybmem export sqlite` (cybmem.exchange.sqlite_export: hand-written DDL, FTS
triggers and UPSERT) should hand its work to sqlite-utils, whose conventions it follows. Each store
(a copy: an export notes itself in the store) is exported three ways through
:func:`cybmem.exchange.export.export_sqlite`, so that everything around the writing (the
destination's checks, exports.json, the temp file renamed into place, the summary) is the same;
only its write step (open, schema, rows, commit) differs, swapped in for the run:

- ``cybmem``: the module's own.
- ``sqlite-utils``: the same rows (cybmem.exchange.rows) written by sqlite-utils' ``create``,
  ``enable_fts(..., create_triggers=True)``, ``create_index`` and ``upsert_all`` of every row, in
  one transaction with ``secure_delete`` on (its idiom; an unchanged row is rewritten and its FTS
  entry replaced).
- ``sqlite-utils, changed rows``: as above, but only new and changed rows passed to ``upsert_all``,
  found by comparing with what the file holds (what cybmem does, and needs for its counts).

Each way exports into a new file, then again into the same file (nothing new). Before timing,
every database is checked against cybmem's: the same tables, columns (name, type, NOT NULL,
primary key), foreign keys and indexes, the same rows with the same rowids, the same FTS rows and
sqlite-utils' ``detect_fts()`` finding ``records_fts``; and the summaries' counts agree. Times are
medians of ``--runs`` rounds (the three ways in turn in each round) in one process, the Arrow cache
warm, with ratios to cybmem's measured in the same run. Needs sqlite-utils 4 (the bench extra).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _corpus import ensure_corpus  # noqa: E402

from unittest import mock  # noqa: E402

from cybmem.exchange import sqlite_export  # noqa: E402
from cybmem.exchange.export import all_stores, export_sqlite  # noqa: E402
from cybmem.exchange.rows import EVENT_COLUMNS, FOLD_COLUMNS, RECORD_COLUMNS, flat_rows, fold_rows, project_frames  # noqa: E402

#: cybmem's tables as sqlite-utils creates them: columns (in cybmem's order, runId first), primary key, foreign keys.
_TYPES = {"durationS": float, "superseded": int, "line": int, "ageS": float, "reopenCount": int, "events": int}
_RECORDS = ("runId", "project") + RECORD_COLUMNS[2:]
_TABLES = {
    "records": (_RECORDS, "runId", [("parentRunId", "records", "runId"), ("previousRunId", "records", "runId")]),
    "issue_events": (EVENT_COLUMNS, ("project", "line"), [("byRunId", "records", "runId")]),
    "issues": (FOLD_COLUMNS, ("project", "issueId"), [("openedBy", "records", "runId"), ("resolvedBy", "records", "runId")]),
}
_INDEXES = {"records": [["project", "endedAt"], ["state"]], "issue_events": [["issueId"]], "issues": [["state"]]}


def write_with_sqlite_utils(stores, db_file: Path, path: Path, tables, summary, progress, *, changed_only: bool) -> None:
    """The export's write step with sqlite-utils doing the schema, FTS and upsert (both tables written)."""
    import sqlite_utils

    with sqlite_utils.Database(db_file) as db:
        db.execute("PRAGMA secure_delete = ON")  # as cybmem: a rewritten (redacted) value leaves no copy
        with db.atomic():
            for name, (columns, pk, fks) in _TABLES.items():
                keys = {pk} if isinstance(pk, str) else set(pk)
                db[name].create({c: _TYPES.get(c, str) for c in columns}, pk=pk, not_null=keys, foreign_keys=fks,
                                if_not_exists=True)
            if not db["records"].detect_fts():
                db["records"].enable_fts(["task", "summary"], create_triggers=True)
            for name, indexes in _INDEXES.items():
                for columns in indexes:
                    db[name].create_index(columns, if_not_exists=True)
            rewritten = 0
            for store in stores:
                records, events = project_frames(store, summary.warnings)
                rows = flat_rows(records, store.slug, RECORD_COLUMNS)
                for r in rows:
                    r["superseded"] = int(bool(r["superseded"]))
                rows = [{c: r[c] for c in _RECORDS} for r in rows]
                rewritten += _upsert(db, "records", rows, store.slug, summary, changed_only)
                rewritten += _upsert(db, "issue_events", flat_rows(events, store.slug, EVENT_COLUMNS), store.slug, summary,
                                     changed_only)
                fold = fold_rows(events, store.slug)
                before = db["issues"].count_where("[project] = ?", [store.slug])
                db["issues"].delete_where("[project] = ?", [store.slug])
                db["issues"].insert_all(fold)
                ts = summary.table("issues")
                ts.rows += len(fold)
                ts.new += max(len(fold) - before, 0)
            if rewritten:  # as cybmem does after an update: the old terms leave the index's older segments
                db.execute("INSERT INTO [records_fts] ([records_fts]) VALUES ('optimize')")


def _upsert(db, table: str, rows: list[dict], project: str, summary, changed_only: bool) -> int:
    """Upsert ``rows`` and count them in ``summary``; returns how many of those passed were already there."""
    _, pk, _ = _TABLES[table]
    ts = summary.table(table)
    ts.rows += len(rows)
    keys = [pk] if isinstance(pk, str) else list(pk)
    have = {tuple(r[k] for k in keys): r for r in db.query(f"SELECT * FROM [{table}] WHERE [project] = ?", [project])}
    ts.updated += sum(1 for r in rows if have.get(tuple(r[k] for k in keys), r) != r)
    if changed_only:
        rows = [r for r in rows if have.get(tuple(r[k] for k in keys)) != r]
    before = db[table].count
    db[table].upsert_all(rows, pk=pk)
    ts.new += db[table].count - before
    return len(rows) - (db[table].count - before)


def shape(path: Path) -> dict:
    """What a reader of the database sees, but for the SQL text of its schema (quoting differs)."""
    con = sqlite3.connect(path)
    try:
        out = {"objects": con.execute("SELECT type, name, tbl_name FROM sqlite_master ORDER BY name").fetchall()}
        for table in _TABLES:
            out[table] = (con.execute(f"PRAGMA table_xinfo([{table}])").fetchall(),
                          con.execute(f"PRAGMA foreign_key_list([{table}])").fetchall(),
                          sorted(r[1:] for r in con.execute(f"PRAGMA index_list([{table}])")))
        for table in ("records", "issue_events"):
            out[table + " rows"] = con.execute(f"SELECT rowid, * FROM [{table}] ORDER BY rowid").fetchall()
        age = FOLD_COLUMNS.index("ageS")  # measured at export time
        out["issues rows"] = [r[:age] + r[age + 1:] for r in con.execute("SELECT * FROM issues ORDER BY project, issueId")]
        out["fts rows"] = con.execute("SELECT rowid, * FROM records_fts ORDER BY rowid").fetchall()
        con.execute("INSERT INTO records_fts(records_fts) VALUES('integrity-check')")
    finally:
        con.close()
    import sqlite_utils

    with sqlite_utils.Database(path) as db:
        out["detect_fts"] = db["records"].detect_fts()
    return out


def measure(root: Path, runs: int) -> None:
    ways = {"cybmem": None,
            "sqlite-utils": functools.partial(write_with_sqlite_utils, changed_only=False),
            "sqlite-utils, changed rows": functools.partial(write_with_sqlite_utils, changed_only=True)}

    def export(way: str, stores, path: Path):
        if ways[way] is None:
            return export_sqlite(stores, path)
        with mock.patch.object(sqlite_export, "_sqlite_write", ways[way]):  # only the write step differs
            return export_sqlite(stores, path)

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "memory"
        shutil.copytree(root, copy)
        stores = all_stores(copy)
        shapes, counts = {}, {}
        for way in ways:  # also warms the Arrow cache
            path = Path(tmp) / f"check-{len(shapes)}.db"
            counts[way] = [[(t.table, t.rows, t.new, t.updated) for t in export(way, stores, path).tables] for _ in (1, 2)]
            shapes[way] = shape(path)
        for way, got in shapes.items():
            differ = [k for k in got if got[k] != shapes["cybmem"][k]]
            if counts[way] != counts["cybmem"]:
                differ.append("the summary's counts")
            print(f"  format of {way}: {'the same as cybmem' if not differ else 'DIFFERS in ' + ', '.join(differ)}"
                  f" (detect_fts: {got['detect_fts']})")
        times: dict[str, dict[str, list[float]]] = {w: {"first": [], "again": []} for w in ways}
        for i in range(runs):
            for j, way in enumerate(ways):
                path = Path(tmp) / f"run-{i}-{j}.db"
                for step in ("first", "again"):
                    started = time.perf_counter()
                    export(way, stores, path)
                    times[way][step].append(time.perf_counter() - started)
        base = {step: statistics.median(times["cybmem"][step]) for step in ("first", "again")}
        print(f"  {len(shapes['cybmem']['records rows']):,} runs in {len(stores)} project(s), median of {runs}, "
              f"load average {os.getloadavg()[0]:.1f}:")
        print(f"  {'':28s} {'first export':>22s} {'again (nothing new)':>22s}")
        for way in ways:
            cells = []
            for step in ("first", "again"):
                t = statistics.median(times[way][step])
                cells.append(f"{t * 1000:8.1f} ms ({t / base[step]:.2f}x)")
            print(f"  {way:28s} {cells[0]:>22s} {cells[1]:>22s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--root", type=Path, action="append",
                    help="a memory root (repeatable; default: the fixtures and the pytest corpus)")
    args = ap.parse_args()
    for root in [r.resolve() for r in args.root or [REPO / "data-fixtures" / "memory", ensure_corpus("pytest-memory")]]:
        print(f"{root.relative_to(REPO) if root.is_relative_to(REPO) else root.name}:")
        measure(root, args.runs)


if __name__ == "__main__":
    main()
