"""A project's memory as the rows an export writes.

The stores of a root, a project's records and issue-event frames (:mod:`cybmem.explore.frames`,
read once per export), and the flat rows of the CSV and SQLite exports: times ISO 8601 UTC, lists
as JSON text, ``project`` added, and the issue fold's rows (``ageS`` measured at export time).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ..errors import ValidationError
from ..store.memory_store import MemoryStore
from ..store.records import ms_to_iso

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "TABLES",
    "RECORD_COLUMNS",
    "EVENT_COLUMNS",
    "FOLD_COLUMNS",
    "all_stores",
    "as_stores",
    "check_table",
    "progress_bar",
    "project_frames",
    "flat_rows",
    "fold_rows",
]

#: The tables of a project an export may write: its records and its ledger's events.
TABLES = ("records", "issues")
_TS = pa.timestamp("ms", tz="UTC")

#: Columns of the flat records view (CSV, SQLite ``records``): the frame plus ``project``.
RECORD_COLUMNS = (
    "project", "runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt", "durationS",
    "parentRunId", "chatSessionId", "previousRunId", "rootRunId", "summary", "accomplished", "issues", "next",
    "workerAgents", "workerStates", "verdictSummary", "supersededBy", "supersedes", "superseded",
)
#: Columns of the flat issue-event view (CSV, SQLite ``issue_events``).
EVENT_COLUMNS = ("project", "issueId", "at", "event", "byRunId", "title", "detail", "line")
#: Columns of the issue fold's rows (SQLite ``issues``).
FOLD_COLUMNS = (
    "project", "issueId", "title", "state", "openedAt", "resolvedAt", "lastAt", "ageS", "reopenCount", "events",
    "openedBy", "resolvedBy",
)
_LIST_COLUMNS = {"accomplished", "issues", "next", "workerAgents", "workerStates"}
_TIME_COLUMNS = {"startedAt", "endedAt", "at", "openedAt", "resolvedAt", "lastAt"}


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


def as_stores(stores: MemoryStore | Iterable[MemoryStore]) -> list[MemoryStore]:
    if isinstance(stores, MemoryStore):
        return [stores]
    out = list(stores)
    if not out:
        raise ValidationError("nothing to export: no project given (is the memory root empty? see `cybmem projects`)")
    return out


def check_table(table: str) -> str:
    if table not in TABLES:
        raise ValidationError(f"table {table!r} is not one of {', '.join(TABLES)}")
    return table


def progress_bar(total: int, label: str, progress: bool | None):
    from ..progress import Progress

    return Progress(total, label, enabled=progress)


def project_frames(store: MemoryStore, warnings: list[str]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
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


def flat_rows(df: "pd.DataFrame", project: str, columns: tuple[str, ...]) -> list[dict]:
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


def fold_rows(events: "pd.DataFrame", project: str) -> list[dict]:
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
        for name in FOLD_COLUMNS[1:]:
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
