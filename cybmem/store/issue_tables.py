"""The issue tables derived from a project's ledger and records, query-independent: each issue's
text, which record carries which issue, each issue's last activity and title code, the open rows,
and the keyword index over the issues. A snapshot computes them on first use or reads them from
the cache, which writes the current ones with every refresh (``act-N.arrow``, ``car-N.arrow``,
``kwi.arrow``); the open-issue ranking (cybmem.retrieval.issue_ranking) reads them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import ledger
from ..arrow_numpy import array_of, numpy_of, scalar, strings  # not pa.array / to_numpy: they import pandas
from .arrow_records import arrow_indices
from .embeddings import issue_texts_of
from .keyword_index import KeywordIndex
from .tokens import tokenize_arrow

__all__ = ["CARRIERS_SCHEMA", "ACTIVITY_SCHEMA", "issue_texts", "issue_carriers", "carrier_arrays", "issue_activity",
           "opened_in", "open_rows", "issue_index"]


def issue_texts(events: pa.Table, ids: list[str] | None = None) -> dict[str, str]:
    """issueId -> its title and detail by the fold's rule (cybmem.store.ledger), for all issues or only
    ``ids``: the text a run that raised the issue is also found by."""
    if ids is not None:
        if not ids or not events.num_rows:
            return {}
        events = events.filter(pc.is_in(events.column("issueId"), value_set=strings(sorted(set(ids)))))
    folded = ledger.fold_table(events)
    texts = issue_texts_of(folded.column("title").to_pylist(), folded.column("detail").to_pylist())
    return dict(zip(folded.column("issueId").to_pylist(), texts))


#: What :func:`issue_carriers` and :func:`issue_activity` return (and the cache's car-N and act-N hold).
CARRIERS_SCHEMA = pa.schema([("record", pa.int32()), ("foldRow", pa.int32())])
ACTIVITY_SCHEMA = pa.schema([("lastActivity", pa.int64()), ("titleKey", pa.int32()), ("openOrder", pa.int32())])


def issue_carriers(records: pa.Table, folded: pa.Table) -> pa.Table:
    """Every issue id the records' outcomes carry, in ``list_flatten`` order of their ``issues``
    column: ``record`` (the carrying row) and ``foldRow`` (the issue's row in ``folded``, -1 when
    the fold has no such issue). Query-independent: the current one is cached with the snapshot."""
    col = records.column("issues")
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not records.num_rows or not len(flat := pc.list_flatten(col)):
        return CARRIERS_SCHEMA.empty_table()
    rows = pc.list_parent_indices(col).cast(pa.int32())
    at = pc.fill_null(pc.index_in(flat, value_set=folded.column("issueId")), scalar(-1, pa.int32())).cast(pa.int32())
    return pa.table({"record": rows, "foldRow": at}, schema=CARRIERS_SCHEMA)


def carrier_arrays(carried: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """An :func:`issue_carriers` table as two int64 arrays: carrying record row, fold row (or -1)."""
    return (numpy_of(carried.column("record")).astype(np.int64),
            numpy_of(carried.column("foldRow")).astype(np.int64))


def issue_activity(records: pa.Table, folded: pa.Table, carriers_ok: np.ndarray, ended: np.ndarray,
                   carried: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
    """Query-independent arrays over the rows of a fold, for the dispatch ranking of open issues:
    ``lastActivity`` (epoch ms: the issue's last event, or later the end of the last run among
    ``carriers_ok`` that carries it in its outcome: a run that carries an open issue is activity
    on it, even when it wrote no event), ``titleKey`` (a code per :func:`cybmem.store.ledger.title_key`:
    the same code, the same title) and ``openOrder`` (:func:`open_rows`, then -1 to the length).
    ``carried``: :func:`issue_carriers` of the same two tables, as arrays (:meth:`cybmem.store.snapshot.Snapshot.carriers`)."""
    m = folded.num_rows
    last = numpy_of(folded.column("lastAt").cast(pa.int64())).copy() if m else np.zeros(0, np.int64)
    if m:
        rows, at = carried if carried is not None else carrier_arrays(issue_carriers(records, folded))
        ok = (at >= 0) & carriers_ok[rows]
        np.maximum.at(last, at[ok], ended[rows[ok]])
    codes = np.zeros(m, np.int32)
    if m:
        enc = pc.dictionary_encode(pc.fill_null(folded.column("title"), scalar("", pa.string()))).combine_chunks()
        by_key: dict[str, int] = {}
        per_title = np.array([by_key.setdefault(k, len(by_key)) for k in ledger.title_keys(enc.dictionary.to_pylist())],
                             dtype=np.int32)
        codes = per_title[numpy_of(enc.indices)]
    order = np.full(m, -1, np.int32)  # the open rows, newest opened first (open_rows), then -1s
    opened = open_rows(folded)
    order[: len(opened)] = opened
    return pa.table({"lastActivity": array_of(last, pa.int64()), "titleKey": array_of(codes, pa.int32()),
                     "openOrder": array_of(order, pa.int32())}, schema=ACTIVITY_SCHEMA)


def opened_in(activity: pa.Table) -> np.ndarray:
    """:func:`open_rows` as an :func:`issue_activity` table holds them (its ``openOrder``)."""
    order = numpy_of(activity.column("openOrder"))
    return order[: int((order >= 0).sum())].astype(np.int64)


def open_rows(folded: pa.Table) -> np.ndarray:
    """The rows of a fold whose issue is open, newest opened first (ties by id). Touches three
    columns only: the fold's text columns stay on disk."""
    if not folded.num_rows:
        return np.zeros(0, dtype=np.int64)
    is_open = pc.is_in(folded.column("state"), value_set=strings(ledger.OPEN))
    rows = np.flatnonzero(numpy_of(is_open))
    at = arrow_indices(rows)
    keys = pa.table({"openedAt": folded.column("openedAt").take(at), "issueId": folded.column("issueId").take(at)})
    order = pc.sort_indices(keys, sort_keys=[("openedAt", "descending"), ("issueId", "ascending")])
    return rows[numpy_of(order)]


def issue_index(folded: pa.Table) -> KeywordIndex:
    """A keyword index over the issues of a fold (title and detail), row-aligned with it."""
    return KeywordIndex.build(tokenize_arrow(issue_texts_of(folded.column("title").to_pylist(),
                                                            folded.column("detail").to_pylist())))
