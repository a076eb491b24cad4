"""A project's memory as Arrow columns: the loader, the snapshot and its refresh.

The loader parses ``records/*.json`` and ``issues.jsonl`` into Arrow tables (one row per record,
lineage and outcome flattened, timestamps ``timestamp[ms, UTC]``, lists as Arrow lists) and
builds the keyword index over task + summary + issue titles. Rows are ordered oldest first
(endedAt, then runId), so a higher row is a newer record. The search hot path works on these
tables with numpy and never imports pandas (``cybmem.frames`` has the pandas views).

:func:`load_snapshot` keeps the Arrow cache (``cybmem.cache``) up to date incrementally: only
record files that are new since the last refresh are parsed (one new segment each time); a record
replaced by rename (another writer added ``supersededBy``) is parsed again and its row patched
in place when its keyword text did not change; a record that vanished, or whose text changed,
makes the cache start over. The ledger is re-read from the byte offset it had reached.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _io, cache as _cache, issues, supersession
from ._io import ensure_dir, locked
from .bm25 import KeywordIndex, RunLookup
from .errors import StoreError
from .schema import MemoryRecord, RUN_ID_RE, STATES
from .store import MAX_LEDGER_BYTES, MAX_RECORD_BYTES, MemoryStore, ReadProblem, parse_record
from .text import tokenize_many

__all__ = ["RECORD_SCHEMA", "Snapshot", "load_snapshot", "titles_of"]

_TS = pa.timestamp("ms", tz="UTC")
_STR_LIST = pa.list_(pa.string())
RECORD_SCHEMA = pa.schema(
    [
        ("runId", pa.string()),
        ("cwd", pa.string()),
        ("workflowName", pa.string()),
        ("task", pa.string()),
        ("state", pa.string()),
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
        ("workerAgents", _STR_LIST),
        ("workerStates", _STR_LIST),
        ("verdictSummary", pa.string()),
        ("supersededBy", pa.string()),
        ("supersedes", pa.string()),
        ("inode", pa.uint64()),
    ]
)

_LIST_COLS = {"accomplished", "issues", "next", "workerAgents", "workerStates"}
_PROGRESS_AFTER_S = 1.0


# --- parsing ------------------------------------------------------------------------


def _is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _fast_row(d: Any, run_id: str) -> bool:
    """Cheap structural check that never accepts what MemoryRecord.from_dict rejects (tested).

    It may reject more (relative cwds, float times, null lineage): those rows go through the
    full validator, which decides and, when valid, normalises them.
    """
    if type(d) is not dict or d.get("runId") != run_id or not RUN_ID_RE.fullmatch(run_id):
        return False
    lin, out = d.get("lineage"), d.get("outcome")
    st, en = d.get("startedAt"), d.get("endedAt")
    if not (
        type(d.get("cwd")) is str and d["cwd"][:1] == "/" and type(d.get("workflowName")) is str and type(d.get("task")) is str
        and d.get("state") in STATES and type(st) is int and type(en) is int and 0 <= st < 10**14 and 0 <= en < 10**14
        and type(lin) is dict and type(out) is dict
    ):
        return False
    for key in ("parentRunId", "chatSessionId", "previousRunId", "rootRunId"):
        v = lin.get(key)
        if v is not None and (type(v) is not str or (v and key != "chatSessionId" and (not RUN_ID_RE.fullmatch(v) or v[0] == "."))):
            return False
    s = out.get("summary")
    if s is not None and type(s) is not str:
        return False
    for key in ("accomplished", "issues", "next"):
        v = out.get(key)
        if v is not None and not _is_str_list(v):
            return False
    w = d.get("workers")
    if w is not None and not (type(w) is list and all(
        type(x) is dict and type(x.get("agentId")) is str and type(x.get("state")) is str
        and (x.get("provider") is None or type(x["provider"]) is str) for x in w
    )):
        return False
    v = d.get("verdictSummary")
    if v is not None and type(v) is not str:
        return False
    for key in ("supersededBy", "supersedes"):
        v = d.get(key)
        if v is not None and (type(v) is not str or (v and (not RUN_ID_RE.fullmatch(v) or v[0] == "."))):
            return False
    return True


class _Columns:
    """Column builders for RECORD_SCHEMA plus the keyword text of each row."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {f.name: [] for f in RECORD_SCHEMA}
        self.texts: list[str] = []

    def add(self, d: dict, inode: int, titles: dict[str, str]) -> None:
        c = self.cols
        lin, out = d["lineage"], d["outcome"]
        workers = d.get("workers") or ()
        c["runId"].append(d["runId"])
        c["cwd"].append(d["cwd"])
        c["workflowName"].append(d["workflowName"])
        c["task"].append(d["task"])
        c["state"].append(d["state"])
        c["startedAt"].append(d["startedAt"])
        c["endedAt"].append(d["endedAt"])
        c["parentRunId"].append(lin.get("parentRunId") or None)
        c["chatSessionId"].append(lin.get("chatSessionId") or None)
        c["previousRunId"].append(lin.get("previousRunId") or None)
        c["rootRunId"].append(lin.get("rootRunId") or None)
        summary = out.get("summary") or ""
        c["summary"].append(summary)
        issues = out.get("issues") or []
        c["accomplished"].append(out.get("accomplished") or [])
        c["issues"].append(issues)
        c["next"].append(out.get("next") or [])
        c["workerAgents"].append([w["agentId"] for w in workers])
        c["workerStates"].append([w["state"] for w in workers])
        c["verdictSummary"].append(d.get("verdictSummary"))
        c["supersededBy"].append(d.get("supersededBy") or None)
        c["supersedes"].append(d.get("supersedes") or None)
        c["inode"].append(inode)
        text = d["task"] + "\n" + summary
        if issues:
            text += "\n" + "\n".join(titles.get(i, i) for i in issues)
        self.texts.append(text)

    def __len__(self) -> int:
        return len(self.texts)

    def table(self) -> pa.Table:
        arrays = []
        for f in RECORD_SCHEMA:
            values = self.cols[f.name]
            if f.type == _TS:
                arrays.append(pa.array(values, type=pa.int64()).cast(_TS))
            else:
                arrays.append(pa.array(values, type=f.type))
        return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def _parse_records(store: MemoryStore, entries: list[tuple[str, int]], titles: dict[str, str]) -> tuple[_Columns, dict[str, int], list[ReadProblem]]:
    """Parse record files one by one; returns columns, the unreadable files (name -> inode) and their problems."""
    cols = _Columns()
    bad: dict[str, int] = {}
    problems: list[ReadProblem] = []
    base = str(store.records_dir) + os.sep
    for name, inode in entries:
        path = base + name
        try:
            raw = _io.read_file(path, limit=MAX_RECORD_BYTES)
            d = _io.loads(raw)
            if not _fast_row(d, name[:-5]):
                d = parse_record(name, raw).to_dict()  # the full validator decides (and normalises)
        except FileNotFoundError:
            continue  # removed between the listing and the read
        except (OSError, ValueError) as exc:  # StoreError, ValidationError, JSON errors
            bad[name] = inode
            why = str(exc) if str(exc).startswith((name, path)) else f"{name}: {'not valid JSON: ' if type(exc).__name__ == 'JSONDecodeError' else ''}{exc}"
            problems.append(ReadProblem(path, why))
            continue
        cols.add(d, inode, titles)
    return cols, bad, problems


_JSON_SCHEMA = pa.schema(
    [
        ("runId", pa.string()), ("cwd", pa.string()), ("workflowName", pa.string()), ("task", pa.string()),
        ("state", pa.string()), ("startedAt", pa.int64()), ("endedAt", pa.int64()),
        ("lineage", pa.struct([(k, pa.string()) for k in ("parentRunId", "chatSessionId", "previousRunId", "rootRunId")])),
        ("outcome", pa.struct([("summary", pa.string()), ("accomplished", _STR_LIST), ("issues", _STR_LIST), ("next", _STR_LIST)])),
        ("workers", pa.list_(pa.struct([("agentId", pa.string()), ("state", pa.string()), ("provider", pa.string())]))),
        ("verdictSummary", pa.string()), ("supersededBy", pa.string()), ("supersedes", pa.string()),
    ]
)
_BULK_MIN = 256  # below this many files the per-file path is cheaper than a bulk parse
_ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"  # validate_run_id: no leading "."


def _empty_to_null(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)


def _bulk_table(raws: list[bytes], names: list[str], inodes: list[int]) -> tuple[pa.Table, np.ndarray] | None:
    """Parse many record files at once with Arrow's multi-threaded JSON reader.

    Returns the records table and a bool array of rows that passed the vectorised
    checks (the others go through the per-file validator for their message), or
    None when the batch cannot be read in bulk (a file that is not one JSON
    object of the expected types): then the caller parses file by file.
    """
    import io

    import pyarrow.json as pj

    # JSON allows raw newlines only as whitespace between tokens, so flattening each
    # file to one line keeps it valid and makes the batch newline-delimited JSON.
    data = b"\n".join(r.replace(b"\r", b" ").replace(b"\n", b" ") for r in raws)
    try:
        t = pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(block_size=max(1 << 20, min(len(data) + 1, 1 << 26))),
            parse_options=pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowException, ValueError, OSError):
        return None
    if t.num_rows != len(raws):
        return None
    t = t.combine_chunks()
    lin, out, workers = t.column("lineage"), t.column("outcome"), t.column("workers")

    def field(struct, name):
        return pc.struct_field(struct, name)

    ok = pc.and_kleene(pc.equal(t.column("runId"), pa.array(names, pa.string())), pc.is_in(t.column("state"), value_set=pa.array(STATES)))
    for name in ("cwd", "workflowName", "task", "startedAt", "endedAt", "lineage", "outcome"):
        ok = pc.and_kleene(ok, pc.is_valid(t.column(name)))
    ok = pc.and_kleene(ok, pc.starts_with(t.column("cwd"), "/"))  # absolute, so not blank (others: per file)
    for name in ("startedAt", "endedAt"):
        col = t.column(name)
        ok = pc.and_kleene(ok, pc.and_kleene(pc.greater_equal(col, 0), pc.less(col, 10**14)))
    for name in ("parentRunId", "previousRunId", "rootRunId"):
        col = field(lin, name)
        ok = pc.and_kleene(ok, pc.or_kleene(pc.is_null(col), pc.or_kleene(pc.equal(col, ""), pc.match_substring_regex(col, _ID_PATTERN))))
    for name in ("supersededBy", "supersedes"):
        col = t.column(name)
        ok = pc.and_kleene(ok, pc.or_kleene(pc.is_null(col), pc.or_kleene(pc.equal(col, ""), pc.match_substring_regex(col, _ID_PATTERN))))
    flat = pc.list_flatten(workers)
    if len(flat):
        bad_worker = pc.or_(pc.is_null(field(flat, "agentId")), pc.is_null(field(flat, "state")))
        parents = pc.list_parent_indices(workers).to_numpy()
        bad_rows = np.unique(parents[bad_worker.to_numpy(zero_copy_only=False)])
    else:
        bad_rows = np.zeros(0, dtype=np.int64)
    mask = pc.fill_null(ok, False).to_numpy(zero_copy_only=False).copy()
    mask[bad_rows] = False
    for name in ("accomplished", "issues", "next"):
        col = field(out, name)
        if pc.any(pc.is_null(pc.list_flatten(col))).as_py():  # a null inside a list of strings
            inner = pc.is_null(pc.list_flatten(col)).to_numpy(zero_copy_only=False)
            mask[np.unique(pc.list_parent_indices(col).to_numpy()[inner])] = False

    def strings(arr):
        return arr if arr.type == _STR_LIST else arr

    def list_of(struct_list, name):
        return pa.ListArray.from_arrays(
            pc.fill_null(struct_list.offsets, 0) if struct_list.null_count else struct_list.offsets,
            field(struct_list.values, name), type=_STR_LIST,
        )

    w = workers.chunk(0) if isinstance(workers, pa.ChunkedArray) else workers
    if w.null_count:
        w = pc.fill_null(w, pa.scalar([], w.type))
    empty_list = pa.scalar([], _STR_LIST)
    columns = {
        "runId": t.column("runId"), "cwd": t.column("cwd"), "workflowName": t.column("workflowName"),
        "task": t.column("task"), "state": t.column("state"),
        "startedAt": t.column("startedAt").cast(_TS), "endedAt": t.column("endedAt").cast(_TS),
        "parentRunId": _empty_to_null(field(lin, "parentRunId")),
        "chatSessionId": _empty_to_null(field(lin, "chatSessionId")),
        "previousRunId": _empty_to_null(field(lin, "previousRunId")),
        "rootRunId": _empty_to_null(field(lin, "rootRunId")),
        "summary": pc.fill_null(field(out, "summary"), ""),
        "accomplished": pc.fill_null(field(out, "accomplished"), empty_list),
        "issues": pc.fill_null(field(out, "issues"), empty_list),
        "next": pc.fill_null(field(out, "next"), empty_list),
        "workerAgents": list_of(w, "agentId"), "workerStates": list_of(w, "state"),
        "verdictSummary": t.column("verdictSummary"),
        "supersededBy": _empty_to_null(t.column("supersededBy")),
        "supersedes": _empty_to_null(t.column("supersedes")),
        "inode": pa.array(inodes, pa.uint64()),
    }
    table = pa.Table.from_arrays([pa.chunked_array([c]) if isinstance(c, pa.Array) else c for c in columns.values()], schema=RECORD_SCHEMA)
    return table, mask


def _keyword_texts(table: pa.Table, titles: dict[str, str]) -> list[str]:
    tasks = table.column("task").to_pylist()
    summaries = table.column("summary").to_pylist()
    issues = table.column("issues").to_pylist()
    out = []
    for task, summary, ids in zip(tasks, summaries, issues):
        text = task + "\n" + (summary or "")
        if ids:
            text += "\n" + "\n".join(titles.get(i, i) for i in ids)
        out.append(text)
    return out


def _by_time(table: pa.Table, texts: list[str]) -> tuple[pa.Table, list[str]]:
    """Rows ordered oldest first (endedAt, then runId), so a higher row is a newer record."""
    if table.num_rows < 2:
        return table, texts
    order = pc.sort_indices(table, sort_keys=[("endedAt", "ascending"), ("runId", "ascending")])
    idx = order.to_numpy()
    if (np.diff(idx) == 1).all():
        return table, texts
    return table.take(order), [texts[i] for i in idx]


def _load_records_unordered(store: MemoryStore, entries: list[tuple[str, int]], titles: dict[str, str]) -> tuple[pa.Table, list[str], dict[str, int], list[ReadProblem]]:
    """Parse record files into a RECORD_SCHEMA table plus each row's keyword text.

    Rows come out oldest first. Large batches go through Arrow's JSON reader; files it cannot take, or rows that
    fail the vectorised checks, go through the per-file validator, which reports them.
    """
    if len(entries) >= _BULK_MIN:
        base = str(store.records_dir) + os.sep
        raws, names, inodes, kept, missing = [], [], [], [], []
        for name, inode in entries:
            try:
                raws.append(_io.read_file(base + name, limit=MAX_RECORD_BYTES))
            except OSError:
                missing.append((name, inode))  # vanished or unreadable: the per-file path reports it
                continue
            names.append(name[:-5])
            inodes.append(inode)
            kept.append((name, inode))
        bulk = _bulk_table(raws, names, inodes)
        if bulk is None:
            # Set aside files that are not a JSON object (they get the per-file message) and retry once.
            ok = []
            for i, raw in enumerate(raws):
                try:
                    ok.append(type(_io.loads(raw)) is dict)
                except ValueError:
                    ok.append(False)
            if not all(ok):
                missing += [e for e, good in zip(kept, ok) if not good]
                raws, names, inodes = ([x for x, good in zip(col, ok) if good] for col in (raws, names, inodes))
                kept = [e for e, good in zip(kept, ok) if good]
                bulk = _bulk_table(raws, names, inodes) if raws else None
        if bulk is not None:
            table, mask = bulk
            good = table.filter(pa.array(mask)) if not mask.all() else table
            rest = [e for e, m in zip(kept, mask) if not m] + missing
            cols, bad, problems = _parse_records(store, rest, titles)
            if len(cols):
                good = pa.concat_tables([good, cols.table()])
                # Same row order as the per-file path: by file name.
                names_now = [r + ".json" for r in good.column("runId").to_pylist()]
                order = sorted(range(len(names_now)), key=names_now.__getitem__)
                good = good.take(pa.array(order, pa.int64()))
            return good, _keyword_texts(good, titles), bad, problems
    cols, bad, problems = _parse_records(store, entries, titles)
    return cols.table(), cols.texts, bad, problems


def _load_records(store: MemoryStore, entries: list[tuple[str, int]], titles: dict[str, str]) -> tuple[pa.Table, list[str], dict[str, int], list[ReadProblem]]:
    """Parse record files into a RECORD_SCHEMA table (oldest first) plus each row's keyword text."""
    table, texts, bad, problems = _load_records_unordered(store, entries, titles)
    table, texts = _by_time(table, texts)
    return table, texts, bad, problems


def _load_records(store: MemoryStore, entries: list[tuple[str, int]], titles: dict[str, str]) -> tuple[pa.Table, list[str], dict[str, int], list[ReadProblem]]:
    """Parse record files into a RECORD_SCHEMA table (oldest first) plus each row's keyword text."""
    table, texts, bad, problems = _load_records_unordered(store, entries, titles)
    table, texts = _by_time(table, texts)
    return table, texts, bad, problems


def titles_of(events: pa.Table, ids: list[str] | None = None) -> dict[str, str]:
    """issueId -> title by the fold's rule (cybmem.issues), for all issues or only ``ids``."""
    if ids is not None:
        if not ids or not events.num_rows:
            return {}
        events = events.filter(pc.is_in(events.column("issueId"), value_set=pa.array(sorted(set(ids)), pa.string())))
    folded = issues.fold_table(events)
    return dict(zip(folded.column("issueId").to_pylist(), folded.column("title").to_pylist()))


def _record_issue_ids(table: pa.Table) -> list[str]:
    return pc.unique(pc.list_flatten(table.column("issues"))).to_pylist() if table.num_rows else []


def _parse_ledger(raw: bytes, first_line: int, path) -> tuple[pa.Table, int, int, list[ReadProblem]]:
    """Ledger bytes -> events table, bytes and lines consumed, problems (torn tail included)."""
    events, consumed, lines, bad = issues.parse_ledger(raw, first_line=first_line)
    problems = [ReadProblem(f"{path}:{n}", f"{path.name}:{n}: {why}") for n, why in bad]
    if raw[consumed:].strip():
        n = first_line + lines
        problems.append(ReadProblem(f"{path}:{n}", f"{path.name}:{n}: skipped a torn last line (no newline yet)"))
    return issues.events_table(events), consumed, lines, problems


# --- the snapshot ---------------------------------------------------------------------


@dataclass
class Snapshot:
    """A project's records, issue events and keyword index, as loaded (and cached) at one moment."""

    store: MemoryStore
    records: pa.Table
    events: pa.Table
    index: KeywordIndex
    problems: list[ReadProblem] = field(default_factory=list)
    from_cache: bool = False
    parsed: int = 0  # record files parsed by this load (0 on a warm load)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return self.records.num_rows

    def _links(self, rows: np.ndarray | None = None) -> list[supersession.Link]:
        r = self.records
        has = pc.or_(pc.is_valid(r.column("supersedes")), pc.is_valid(r.column("supersededBy")))
        sub = r.filter(has).select(["runId", "endedAt", "supersedes", "supersededBy"])
        ended = sub.column("endedAt").cast(pa.int64()).to_pylist()
        return list(zip(sub.column("runId").to_pylist(), ended, sub.column("supersedes").to_pylist(),
                        sub.column("supersededBy").to_pylist()))

    def _ended_of(self, ids: list[str]) -> list[int | None]:
        """endedAt of each run id (None for ids with no record)."""
        pos = pc.index_in(pa.array(ids, pa.string()), value_set=self.records.column("runId")).to_pylist()
        ended = self.ended_ms()
        return [None if p is None else int(ended[p]) for p in pos]

    def supersession(self, as_of: int | None = None) -> dict[str, str]:
        """superseded runId -> direct correction, by cybmem.supersession's rule (as of a moment)."""
        key = ("supersession", as_of)
        if key not in self._cache:
            links = self._links() if self.n else []
            self._cache[key] = supersession.resolve(links, self._ended_of, as_of=as_of) if links else {}
        return self._cache[key]

    def candidates(self, as_of: int | None = None) -> np.ndarray:
        """Records that retrieval may return: existing at ``as_of`` and not superseded as of then."""
        mapping = self.supersession(as_of)
        mask = np.ones(self.n, dtype=bool) if as_of is None else self.ended_ms() <= as_of
        if mapping:
            hidden = pc.is_in(self.records.column("runId"), value_set=pa.array(list(mapping), pa.string()))
            mask &= ~hidden.to_numpy(zero_copy_only=False)
        return mask

    def superseded_mask(self) -> np.ndarray:
        """True for records that a later record supersedes."""
        return ~self.candidates() if self.n else np.zeros(0, dtype=bool)

    def ended_ms(self) -> np.ndarray:
        """endedAt as int64 epoch ms (computed once per snapshot)."""
        if "ended" not in self._cache:
            col = self.records.column("endedAt").cast(pa.int64())
            self._cache["ended"] = col.to_numpy() if self.n else np.zeros(0, np.int64)
        return self._cache["ended"]

    def newest_first(self) -> np.ndarray:
        """Row indices by endedAt, newest first (ties: higher row first); computed once."""
        if "newest" not in self._cache:
            ended = self.ended_ms()
            self._cache["newest"] = np.lexsort((-np.arange(self.n), -ended)) if self.n else np.zeros(0, np.int64)
        return self._cache["newest"]

    def prepare(self) -> "Snapshot":
        """Build the per-snapshot lookups that pay off over many queries (returns self).

        Dictionary-encoded lineage columns make the lineage kernel's equality passes ~30x cheaper
        than string compares, and a sorted run-id lookup makes the ancestor walk O(depth log N);
        both cost a few ms per 100k records once. A one-shot query (the CLI) is cheaper without
        them, so they are built only when a long-lived caller (widget, tuning, benchmark) asks.
        """
        if "lineage" not in self._cache:
            self._cache["lineage"] = tuple(
                self.records.column(n) if n == "runId" else pc.dictionary_encode(self.records.column(n).combine_chunks())
                for n in ("runId", "parentRunId", "previousRunId", "rootRunId", "chatSessionId")
            )
            self._cache["lookup"] = RunLookup.build(self.records.column("runId"))
        return self

    def lineage_columns(self) -> tuple:
        """runId, parentRunId, previousRunId, rootRunId, chatSessionId (encoded after :meth:`prepare`)."""
        if "lineage" in self._cache:
            return self._cache["lineage"]
        return tuple(self.records.column(n) for n in ("runId", "parentRunId", "previousRunId", "rootRunId", "chatSessionId"))

    def run_lookup(self) -> RunLookup | None:
        """The sorted run-id lookup built by :meth:`prepare`, else None (the kernel scans)."""
        return self._cache.get("lookup")

    def fold(self, as_of: int | None = None) -> pa.Table:
        """The issue fold (cybmem.issues.fold_table), as of a moment; the current one is cached."""
        if as_of is not None:
            return issues.fold_table(self.events, as_of_ms=as_of)
        if "fold" not in self._cache:
            table = None
            path = self._cache.get("fold_file")
            if path is not None:
                try:
                    table = _cache.read_table(path)
                except (OSError, pa.ArrowException):
                    table = None
            self._cache["fold"] = table if table is not None else issues.fold_table(self.events)
        return self._cache["fold"]

    def open_issues(self, as_of: int | None = None) -> pa.Table:
        """Open issues of :meth:`fold`, newest opened first (ties by id)."""
        folded = self.fold(as_of)
        if not folded.num_rows:
            return folded
        opened = folded.filter(pc.is_in(folded.column("state"), value_set=pa.array(issues.OPEN)))
        return opened.take(pc.sort_indices(opened, sort_keys=[("openedAt", "descending"), ("issueId", "ascending")]))

    def rows(self, indices: list[int], columns: list[str]) -> list[dict]:
        """Some rows as dicts, only the given columns (cheap for a top-k)."""
        if not indices:
            return []
        return self.records.select(columns).take(np.asarray(indices, dtype=np.int64)).to_pylist()


# --- loading and the cache -------------------------------------------------------------


class _Notice:
    """One line on stderr when a cold load takes longer than a second (the dispatcher's terminal
    otherwise sits silent for several seconds on a large store)."""

    def __init__(self, store: MemoryStore, files: int):
        self.store, self.files = store, files
        self.t0 = time.perf_counter()
        self.shown = False

    def tick(self, what: str) -> None:
        if not self.shown and time.perf_counter() - self.t0 > _PROGRESS_AFTER_S:
            self.shown = True
            print(f"cybmem: indexing {self.files} records of project {self.store.slug} ({what}); "
                  "later reads use the cache", file=sys.stderr, flush=True)


def _concat_indexes(parts: list[KeywordIndex]) -> KeywordIndex:
    return parts[0] if len(parts) == 1 else KeywordIndex.concat(parts)


def _read_ledger_all(store: MemoryStore) -> bytes:
    try:
        return _io.read_file(store.issues_path, limit=MAX_LEDGER_BYTES)
    except FileNotFoundError:
        return b""


def _build_full(store: MemoryStore, ledger_raw: bytes) -> tuple[pa.Table, pa.Table, KeywordIndex, dict[str, int], list[ReadProblem], int, int]:
    events, consumed, lines, problems = _parse_ledger(ledger_raw, 1, store.issues_path)
    listing = store.listing()
    notice = _Notice(store, len(listing))
    table, texts, bad, rec_problems = _load_records(store, sorted(listing.items()), titles_of(events))
    notice.tick("tokenizing")
    index = KeywordIndex.build(tokenize_many(texts))
    notice.tick("done")
    return table, events, index, bad, problems + rec_problems, consumed, lines


def _segments(cache, manifest: _cache.Manifest) -> tuple[pa.Table, KeywordIndex, pa.Table]:
    rec = [_cache.read_table(cache / s["rec"]) for s in manifest.segments]
    kw = [KeywordIndex.from_arrow(_cache.read_table(cache / s["kw"])) for s in manifest.segments]
    events = _cache.read_table(cache / "events.arrow") if (cache / "events.arrow").exists() else issues.events_table([])
    records = pa.concat_tables(rec) if rec else _Columns().table()
    index = _concat_indexes(kw) if kw else KeywordIndex.build([])
    return records, index, events


def _problems_of(manifest: _cache.Manifest) -> list[ReadProblem]:
    return [ReadProblem(p, m) for p, m in manifest.problems]


def _snapshot(store, records, events, index, problems, cache, *, from_cache: bool, parsed: int) -> Snapshot:
    snap = Snapshot(store, records, events, index, problems, from_cache=from_cache, parsed=parsed)
    if cache is not None and from_cache:
        snap._cache["fold_file"] = cache / "fold.arrow"
    return snap


def _load_warm(store: MemoryStore, cache) -> Snapshot | None:
    manifest = _cache.Manifest.read(cache)
    if manifest is None or not _cache.is_fresh(store.records_dir, store.issues_path, manifest):
        return None
    records, index, events = _segments(cache, manifest)
    return _snapshot(store, records, events, index, _problems_of(manifest), cache, from_cache=True, parsed=0)


def _write_events(cache, manifest: _cache.Manifest, events: pa.Table) -> None:
    """The cached ledger and its fold, written together."""
    _cache.write_table(cache / "events.arrow", events)
    _cache.write_table(cache / "fold.arrow", issues.fold_table(events))


def _start_over(store: MemoryStore, cache, scanned_at: int) -> Snapshot:
    raw = _read_ledger_all(store)
    table, events, index, bad, problems, consumed, lines = _build_full(store, raw)
    led = _cache.ledger_stat(store.issues_path) or {"size": 0, "mtime_ns": 0, "ino": 0}
    manifest = _cache.Manifest()
    seg = {"rec": manifest.new_file("rec"), "kw": manifest.new_file("kw"), "rows": table.num_rows}
    _cache.write_table(cache / seg["rec"], table)
    _cache.write_table(cache / seg["kw"], index.to_arrow())
    manifest.segments = [seg]
    manifest.bad = bad
    manifest.ledger = {"size": consumed, "mtime_ns": led["mtime_ns"] if consumed == led["size"] else None,
                       "ino": led["ino"], "lines": lines}
    _write_events(cache, manifest, events)
    manifest.problems = [[p.path, p.message] for p in problems]
    manifest.dir_mtime_ns = _cache.dir_mtime_for_manifest(store.records_dir, scanned_at)
    manifest.write(cache)
    _cache.remove_unlisted(cache, manifest)
    return _snapshot(store, table, events, index, problems, cache, from_cache=False, parsed=table.num_rows)


def _patch_replaced(store: MemoryStore, cache, manifest: _cache.Manifest, records: pa.Table,
                    replaced: list[tuple[int, str, int]], events: pa.Table) -> pa.Table | None:
    """Re-read records replaced by rename and patch their rows in their segments.

    Returns the patched records table, or None when a replacement changed a row's keyword text or
    cannot be read (then the cache starts over: the index must change too).
    """
    names = [(name, ino) for _, name, ino in replaced]
    rows = [row for row, _, _ in replaced]
    titles = titles_of(events, sorted({i for lst in records.take(pa.array(rows)).column("issues").to_pylist() for i in lst or ()}))
    cols, bad, _ = _parse_records(store, names, titles)
    if bad or len(cols) != len(names):
        return None
    new = cols.table()
    old_texts = _keyword_texts(records.take(pa.array(rows)), titles)
    if old_texts != cols.texts:
        return None
    starts = np.cumsum([0] + [s["rows"] for s in manifest.segments])
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for j, row in enumerate(rows):
        seg = int(np.searchsorted(starts, row, side="right") - 1)
        by_segment.setdefault(seg, []).append((row - int(starts[seg]), j))
    for seg, hits in by_segment.items():
        table = _cache.read_table(cache / manifest.segments[seg]["rec"])
        take = np.arange(table.num_rows, dtype=np.int64)
        for local, j in hits:
            take[local] = table.num_rows + j
        patched = pa.concat_tables([table, new]).take(pa.array(take))
        name = manifest.new_file("rec")
        _cache.write_table(cache / name, patched)
        manifest.segments[seg] = {**manifest.segments[seg], "rec": name}
    return pa.concat_tables([_cache.read_table(cache / s["rec"]) for s in manifest.segments])


def _refresh(store: MemoryStore, cache) -> Snapshot:
    ensure_dir(cache)
    with locked(cache / ".lock"):
        manifest = _cache.Manifest.read(cache)
        if manifest is not None and _cache.is_fresh(store.records_dir, store.issues_path, manifest):
            records, index, events = _segments(cache, manifest)  # another process just refreshed
            return _snapshot(store, records, events, index, _problems_of(manifest), cache, from_cache=True, parsed=0)
        scanned_at = time.time_ns()
        listing = store.listing()
        if manifest is None:
            return _start_over(store, cache, scanned_at)
        try:
            records, index, events = _segments(cache, manifest)
        except (OSError, ValueError, KeyError, pa.ArrowException):
            return _start_over(store, cache, scanned_at)
        changes = _cache.listing_changes(records, listing)
        if changes.vanished:
            return _start_over(store, cache, scanned_at)  # a record vanished: append-only was broken

        # The ledger from its last offset (from the start if it was replaced).
        problems = _problems_of(manifest)
        led = _cache.ledger_stat(store.issues_path) or {"size": 0, "mtime_ns": 0, "ino": 0}
        prev = manifest.ledger
        same_file = prev.get("ino") == led["ino"] and led["size"] >= prev.get("size", 0)
        if not same_file:
            events, consumed, lines, led_problems = _parse_ledger(_read_ledger_all(store), 1, store.issues_path)
            problems = [p for p in problems if ".jsonl:" not in p.path]
        elif led["size"] > prev.get("size", 0):
            raw = _read_ledger_all(store)[prev.get("size", 0):]
            more, consumed, lines, led_problems = _parse_ledger(raw, prev.get("lines", 0) + 1, store.issues_path)
            consumed += prev.get("size", 0)
            lines += prev.get("lines", 0)
            if more.num_rows:
                events = pa.concat_tables([events, more]).combine_chunks()
            problems = [p for p in problems if "torn last line" not in p.message]
        else:
            consumed, lines, led_problems = prev.get("size", 0), prev.get("lines", 0), []
        problems += [p for p in led_problems if p not in problems]
        if (consumed, lines) != (prev.get("size", 0), prev.get("lines", 0)) or not same_file:
            _write_events(cache, manifest, events)
        manifest.ledger = {"size": consumed, "mtime_ns": led["mtime_ns"] if consumed == led["size"] else None,
                           "ino": led["ino"], "lines": lines}

        if changes.replaced:
            patched = _patch_replaced(store, cache, manifest, records, changes.replaced, events)
            if patched is None:
                return _start_over(store, cache, scanned_at)
            records = patched

        # Everything listed that is neither cached nor a known-bad file (with the same inode) is new.
        new = sorted(e for e in changes.added if manifest.bad.get(e[0]) != e[1])
        for name in [n for n in manifest.bad if listing.get(n) != manifest.bad[n]]:
            manifest.bad.pop(name)
            problems = [p for p in problems if not p.path.endswith(os.sep + name)]
        parsed = 0
        if new:
            seg_table, texts, bad, rec_problems = _load_records(store, new, {})
            if seg_table.num_rows:
                # Issue titles for the keyword text: only the few ids these records raise.
                titles = titles_of(events, _record_issue_ids(seg_table))
                texts = _keyword_texts(seg_table, titles) if titles else texts
            manifest.bad.update(bad)
            problems += rec_problems
            if seg_table.num_rows:
                seg_index = KeywordIndex.build(tokenize_many(texts))
                parsed = seg_table.num_rows
                records = pa.concat_tables([records, seg_table])
                index = _concat_indexes([index, seg_index])
                if len(manifest.segments) >= _cache.MAX_SEGMENTS:
                    records = records.combine_chunks()
                    index = index.compact()
                    seg = {"rec": manifest.new_file("rec"), "kw": manifest.new_file("kw"), "rows": records.num_rows}
                    _cache.write_table(cache / seg["rec"], records)
                    _cache.write_table(cache / seg["kw"], index.to_arrow())
                    manifest.segments = [seg]
                else:
                    seg = {"rec": manifest.new_file("rec"), "kw": manifest.new_file("kw"), "rows": seg_table.num_rows}
                    _cache.write_table(cache / seg["rec"], seg_table)
                    _cache.write_table(cache / seg["kw"], seg_index.to_arrow())
                    manifest.segments.append(seg)
        manifest.problems = [[p.path, p.message] for p in problems]
        manifest.dir_mtime_ns = _cache.dir_mtime_for_manifest(store.records_dir, scanned_at)
        manifest.write(cache)
        _cache.remove_unlisted(cache, manifest)
        return _snapshot(store, records, events, index, problems, cache, from_cache=True, parsed=parsed)


def load_snapshot(store: MemoryStore, *, use_cache: bool = True) -> Snapshot:
    """Load a project's memory, refreshing its Arrow cache incrementally.

    Args:
        store: the project's store.
        use_cache: False parses everything and neither reads nor writes the cache.

    Returns:
        A :class:`Snapshot`; unreadable records and ledger lines are listed in ``problems``
        (each once) and skipped.

    Raises:
        StoreError: records/ or the ledger cannot be read at all.
    """
    if not use_cache:
        table, events, index, _bad, problems, _, _ = _build_full(store, _read_ledger_all(store))
        return Snapshot(store, table, events, index, problems, from_cache=False, parsed=table.num_rows)
    cache = _cache.cache_dir(store.dir)
    for attempt in range(3):
        try:
            try:
                snap = _load_warm(store, cache)
            except (pa.ArrowException, ValueError, KeyError, TypeError):
                snap = None  # a damaged cache file: rebuild it
                _cache.discard(cache)
            if snap is not None:
                return snap
            return _refresh(store, cache)
        except StoreError:
            raise  # the store itself (records/, the ledger) cannot be read: say so
        except FileNotFoundError:
            # A concurrent compaction removed a segment between manifest and read: retry.
            if attempt == 2:
                raise
        except OSError:
            # The cache cannot be written (a read-only store, a full disk, .cache not a dir):
            # memory still works, parsed in memory.
            return load_snapshot(store, use_cache=False)
    raise AssertionError("unreachable")
