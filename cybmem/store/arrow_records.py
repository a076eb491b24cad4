"""Record files as Arrow columns: the bulk loader behind every snapshot.

One row per record (lineage and outcome flattened, timestamps ``timestamp[ms, UTC]``, lists as
Arrow lists, the file's inode) plus the keyword text of each row (task + summary + the titles and details of
the issues it raised + the files it edited and the commands it ran). The columns and the checks come from the record's field table
(:data:`cybmem.store.records.RECORD_FIELDS`). Large batches are parsed at once by Arrow's multi-threaded
JSON reader and checked vectorised; a file those checks do not pass goes through the one record parser
(:func:`cybmem.store.memory_store.parse_record`), which decides and says why. Both fast paths only ever
accept a subset of what the parser accepts (tested), so every reader sees the same records.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import _io
from ..arrow_numpy import array_of, numpy_of, scalar, string_lists, strings
from .records import LINEAGE_FIELDS, MAX_MS, OUTCOME_FIELDS, RECORD_FIELDS, RUN_ID_PATTERN, RUN_ID_RE, STATES, WORKER_FIELDS
from .memory_store import MAX_RECORD_BYTES, MemoryStore, ReadProblem, parse_record
from .tokens import MAX_TEXT_CHARS

__all__ = ["RECORD_SCHEMA", "arrow_indices", "take_rows", "Cells", "with_ms_times", "load_records", "parse_files", "keyword_texts",
           "keyword_text_array", "empty_table"]


def arrow_indices(rows: np.ndarray) -> pa.Array:
    """Row numbers as an Arrow int64 array for ``take``, zero-copy. ``pa.array`` of a numpy array
    imports numpy.ma to rule out masked arrays, and pandas: too much for the dispatch path."""
    return array_of(np.ascontiguousarray(rows, dtype=np.int64), pa.int64())


#: Up to this many rows :func:`take_rows` slices instead of taking.
FEW_ROWS = 64


def take_rows(table: pa.Table, rows) -> pa.Table:
    """Some rows of a table, in the order given. A few are zero-copy slices: ``take`` over a
    table of several chunks (the cache's segments) first concatenates them, too slow for the
    rows a verb shows."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) <= FEW_ROWS:
        return pa.concat_tables([table.slice(int(r), 1) for r in rows.tolist()]) if len(rows) else table.slice(0, 0)
    return table.take(arrow_indices(rows))


_INT_FORMATS = {pa.int64(): "q", pa.uint64(): "Q", pa.int32(): "i", pa.uint32(): "I"}


class Cells:
    """One column's values at a few rows as ``to_pylist`` gives them, read straight from the
    column's Arrow buffers: a string, a list of strings, an integer or a ms timestamp costs a
    slice and a decode (about 0.5 us), where ``take`` + ``to_pylist`` costs 7-10 us a column
    whatever the rows (what a search's ten hits paid, several columns over). Other types are
    read one scalar at a time. Build one per column of a table that does not change (a
    snapshot's) and keep it."""

    __slots__ = ("_starts", "_chunks")

    def __init__(self, column: pa.ChunkedArray):
        self._starts: list[int] = []
        self._chunks: list[tuple] = []
        start = 0
        for chunk in column.chunks:
            if len(chunk):
                self._starts.append(start)
                self._chunks.append(self._reader(chunk))
                start += len(chunk)

    @staticmethod
    def _strings(arr: pa.Array) -> tuple:
        _, offsets, data = arr.buffers()
        return (memoryview(offsets).cast("i"), memoryview(data) if data is not None else memoryview(b""))

    @classmethod
    def _reader(cls, chunk: pa.Array) -> tuple:
        """(kind, validity bitmap or None, the chunk's offset, the kind's buffers, the chunk)."""
        t = chunk.type
        valid = chunk.buffers()[0] if chunk.null_count else None
        bits = memoryview(valid) if valid is not None else None
        if t == pa.string():
            return ("str", bits, chunk.offset, cls._strings(chunk), chunk)
        if pa.types.is_list(t) and t.value_type == pa.string():
            child = chunk.values
            strings = cls._strings(child) if not child.null_count else None
            if strings is not None:
                offsets = memoryview(chunk.buffers()[1]).cast("i")
                return ("list", bits, chunk.offset, (offsets, child.offset, *strings), chunk)
        if t in _INT_FORMATS:
            return ("int", bits, chunk.offset, memoryview(chunk.buffers()[1]).cast(_INT_FORMATS[t]), chunk)
        if pa.types.is_timestamp(t) and t.unit == "ms" and t.tz in (None, "UTC"):
            from datetime import datetime, timedelta
            from zoneinfo import ZoneInfo  # the tzinfo to_pylist gives a UTC timestamp

            epoch = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC") if t.tz else None)
            return ("ms", bits, chunk.offset, (memoryview(chunk.buffers()[1]).cast("q"), epoch, timedelta), chunk)
        return ("any", None, 0, None, chunk)

    def __getitem__(self, row: int) -> Any:
        """The value at ``row`` (0 <= row < the column's length)."""
        at = bisect.bisect_right(self._starts, row) - 1 if len(self._starts) > 1 else 0
        return self._cell(self._chunks[at], row - self._starts[at])

    def take(self, rows: list[int]) -> list:
        """The values at ``rows``, in their order."""
        if len(self._chunks) == 1:
            chunk = self._chunks[0]
            if chunk[1] is None and chunk[0] in ("str", "int", "list"):
                return self._take_valid(chunk, rows)
            return [self._cell(chunk, r) for r in rows]
        return [self[r] for r in rows]

    @staticmethod
    def _take_valid(reader: tuple, rows: list[int]) -> list:
        """:meth:`_cell` of each of ``rows`` for a chunk without nulls of a string, integer or
        list-of-strings column, in one comprehension (a search's hits: ~70 cells, each a call less)."""
        kind, _, off, bufs, _ = reader
        if kind == "str":
            offsets, data = bufs
            return [str(data[offsets[j]:offsets[j + 1]], "utf-8") for j in [off + r for r in rows]]
        if kind == "int":
            return [bufs[off + r] for r in rows]
        lists, base, offsets, data = bufs
        return [[str(data[offsets[i]:offsets[i + 1]], "utf-8") for i in range(base + lists[j], base + lists[j + 1])]
                for j in [off + r for r in rows]]

    @staticmethod
    def _cell(reader: tuple, local: int) -> Any:
        kind, bits, off, bufs, chunk = reader
        if kind == "any":
            return chunk[local].as_py()
        j = off + local
        if bits is not None and not (bits[j >> 3] >> (j & 7)) & 1:
            return None
        if kind == "str":
            offsets, data = bufs
            return str(data[offsets[j]:offsets[j + 1]], "utf-8")
        if kind == "int":
            return bufs[j]
        if kind == "ms":
            ms, epoch, timedelta = bufs
            return epoch + timedelta(milliseconds=ms[j])
        lists, base, offsets, data = bufs
        return [str(data[offsets[i]:offsets[i + 1]], "utf-8") for i in range(base + lists[j], base + lists[j + 1])]


def with_ms_times(table: pa.Table) -> pa.Table:
    """The table with its ``startedAt`` / ``endedAt`` columns as epoch ms (int64), as index
    entries and ``cybmem list --json`` show them."""
    for name in ("startedAt", "endedAt"):
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(pa.int64()))
    return table


_TS = pa.timestamp("ms", tz="UTC")
_STR_LIST = pa.list_(pa.string())
#: Arrow type of each field kind of cybmem.store.records's field table: in the table, and as JSON holds it.
_ARROW = {"str": pa.string(), "ms": _TS, "str_list": _STR_LIST}
_JSON_ARROW = {"str": pa.string(), "ms": pa.int64(), "str_list": _STR_LIST}
#: workers[] become two list columns (the provider is not kept).
_WORKER_COLUMNS = {"agentId": "workerAgents", "state": "workerStates"}


def _flat_fields() -> list[tuple[str, pa.DataType]]:
    """The record's columns from the field table: nested objects flattened, workers as two lists."""
    out = []
    for f in RECORD_FIELDS:
        if f.kind == "object":
            out += [(n.name, _ARROW[n.kind]) for n in f.nested]
        elif f.kind == "objects":
            out += [(_WORKER_COLUMNS[n.name], _STR_LIST) for n in f.nested if n.name in _WORKER_COLUMNS]
        else:
            out.append((f.name, _ARROW[f.kind]))
    return out


def _json_type(f) -> pa.DataType:
    """The type Arrow's JSON reader parses a field as (times as integers, nested objects as structs)."""
    if f.kind == "object":
        return pa.struct([(n.name, _json_type(n)) for n in f.nested])
    if f.kind == "objects":
        return pa.list_(pa.struct([(n.name, _json_type(n)) for n in f.nested]))
    return _JSON_ARROW[f.kind]


RECORD_SCHEMA = pa.schema(_flat_fields() + [("inode", pa.uint64())])

# What the fast paths check, by the field table (cybmem.store.records); the full parser checks the same rules.
_REQUIRED = tuple(f.name for f in RECORD_FIELDS if f.required)
_REQUIRED_STR = tuple(f.name for f in RECORD_FIELDS if f.kind == "str" and f.required and f.rule is None)
_MS = tuple(f.name for f in RECORD_FIELDS if f.kind == "ms")
_OPTIONAL_STR = tuple(f.name for f in RECORD_FIELDS if f.kind == "str" and not f.required and f.rule is None)
_RUN_LINKS = tuple(f.name for f in RECORD_FIELDS if f.rule == "run_id" and not f.required)
_LINEAGE_LINKS = tuple(f.name for f in LINEAGE_FIELDS if f.rule == "run_id")
_LINEAGE_STR = tuple(f.name for f in LINEAGE_FIELDS if f.rule is None)
_OUTCOME_STR = tuple(f.name for f in OUTCOME_FIELDS if f.kind == "str")
_OUTCOME_LISTS = tuple(f.name for f in OUTCOME_FIELDS if f.kind == "str_list")
_RECORD_LISTS = tuple(f.name for f in RECORD_FIELDS if f.kind == "str_list")  # files, commands
_WORKER_REQUIRED = tuple(f.name for f in WORKER_FIELDS if f.required)
_WORKER_OPTIONAL = tuple(f.name for f in WORKER_FIELDS if not f.required)


def _is_str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _optional_str(obj: dict, keys: tuple[str, ...]) -> bool:
    """Each of ``keys`` absent, null or a string (loops, not all(): this runs per file)."""
    for k in keys:
        v = obj.get(k)
        if v is not None and type(v) is not str:
            return False
    return True


def _optional_link(obj: dict, keys: tuple[str, ...]) -> bool:
    """Each of ``keys`` absent, null, empty or a run id."""
    for k in keys:
        v = obj.get(k)
        if v is not None and (type(v) is not str or (v and not RUN_ID_RE.fullmatch(v))):
            return False
    return True


def _fast_row(d: Any, run_id: str) -> bool:
    """Cheap structural check that never accepts what MemoryRecord.from_dict rejects (tested).

    It may reject more (relative cwds, float times, null lineage): those rows go through the
    full validator, which decides and, when valid, normalises them.
    """
    if type(d) is not dict or d.get("runId") != run_id or not RUN_ID_RE.fullmatch(run_id):
        return False
    lin, out, w = d.get("lineage"), d.get("outcome"), d.get("workers")
    if not (type(d.get("cwd")) is str and d["cwd"][:1] == "/" and d.get("state") in STATES
            and type(lin) is dict and type(out) is dict):
        return False
    for k in _REQUIRED_STR:
        if type(d.get(k)) is not str:
            return False
    for k in _MS:
        v = d.get(k)
        if type(v) is not int or not 0 <= v < MAX_MS:
            return False
    for k in _OUTCOME_LISTS:
        v = out.get(k)
        if v is not None and not _is_str_list(v):
            return False
    for k in _RECORD_LISTS:
        v = d.get(k)
        if v is not None and not _is_str_list(v):
            return False
    if w is not None:
        if type(w) is not list:
            return False
        for x in w:
            if type(x) is not dict or not _optional_str(x, _WORKER_OPTIONAL):
                return False
            for k in _WORKER_REQUIRED:
                if type(x.get(k)) is not str:
                    return False
    return (_optional_str(lin, _LINEAGE_STR) and _optional_link(lin, _LINEAGE_LINKS) and _optional_str(out, _OUTCOME_STR)
            and _optional_str(d, _OPTIONAL_STR) and _optional_link(d, _RUN_LINKS))


class _Columns:
    """Column builders for RECORD_SCHEMA."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {f.name: [] for f in RECORD_SCHEMA}

    def add(self, d: dict, inode: int) -> None:
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
        for name in _RECORD_LISTS:
            c[name].append(d.get(name) or [])
        c["supersededBy"].append(d.get("supersededBy") or None)
        c["supersedes"].append(d.get("supersedes") or None)
        c["inode"].append(inode)

    def __len__(self) -> int:
        return len(self.cols["runId"])

    def table(self) -> pa.Table:
        arrays = []
        for f in RECORD_SCHEMA:
            values = self.cols[f.name]
            # From buffers: pa.array imports pandas (cybmem.arrow_numpy).
            if f.type == _TS:
                arrays.append(array_of(values, pa.int64()).cast(_TS))
            elif f.type == _STR_LIST:
                arrays.append(string_lists(values, f.type))
            elif f.type == pa.string():
                arrays.append(strings(values, f.type))
            else:
                arrays.append(array_of(values, f.type))
        return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def _parse_records(store: MemoryStore, entries: list[tuple[str, int]]) -> tuple[_Columns, dict[str, int], list[ReadProblem]]:
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
        cols.add(d, inode)
    return cols, bad, problems


_JSON_SCHEMA = pa.schema([(f.name, _json_type(f)) for f in RECORD_FIELDS])
_BULK_MIN = 256  # below this many files the per-file path is cheaper than a bulk parse
_ID_PATTERN = f"^{RUN_ID_PATTERN}$"  # validate_run_id's rule, for Arrow's RE2


# Compute calls are given Arrow scalars: a Python value would be converted by pa.scalar, which
# imports pandas (cybmem.arrow_numpy).
_EMPTY, _NEWLINE, _FALSE = scalar("", pa.string()), scalar("\n", pa.string()), scalar(False, pa.bool_())


def _empty_to_null(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(pc.equal(arr, _EMPTY), scalar(None, pa.string()), arr)


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

    ok = pc.and_kleene(pc.equal(t.column("runId"), strings(names)), pc.is_in(t.column("state"), value_set=strings(STATES)))
    for name in _REQUIRED:
        ok = pc.and_kleene(ok, pc.is_valid(t.column(name)))
    ok = pc.and_kleene(ok, pc.starts_with(t.column("cwd"), "/"))  # absolute, so not blank (others: per file)
    for name in _MS:
        col = t.column(name)
        ok = pc.and_kleene(ok, pc.and_kleene(pc.greater_equal(col, scalar(0, pa.int64())), pc.less(col, scalar(MAX_MS, pa.int64()))))
    for col in [field(lin, name) for name in _LINEAGE_LINKS] + [t.column(name) for name in _RUN_LINKS]:
        ok = pc.and_kleene(ok, pc.or_kleene(pc.is_null(col), pc.or_kleene(pc.equal(col, _EMPTY), pc.match_substring_regex(col, _ID_PATTERN))))
    flat = pc.list_flatten(workers)
    if len(flat):
        bad_worker = pc.is_null(field(flat, _WORKER_REQUIRED[0]))
        for name in _WORKER_REQUIRED[1:]:
            bad_worker = pc.or_(bad_worker, pc.is_null(field(flat, name)))
        parents = numpy_of(pc.list_parent_indices(workers))
        bad_rows = np.unique(parents[numpy_of(bad_worker)])
    else:
        bad_rows = np.zeros(0, dtype=np.int64)
    mask = numpy_of(pc.fill_null(ok, _FALSE)).copy()
    mask[bad_rows] = False
    for col in [field(out, name) for name in _OUTCOME_LISTS] + [t.column(name) for name in _RECORD_LISTS]:
        if pc.any(pc.is_null(pc.list_flatten(col))).as_py():  # a null inside a list of strings
            inner = numpy_of(pc.is_null(pc.list_flatten(col)))
            mask[np.unique(numpy_of(pc.list_parent_indices(col))[inner])] = False

    def list_of(struct_list, name):
        return pa.ListArray.from_arrays(
            pc.fill_null(struct_list.offsets, scalar(0, pa.int32())) if struct_list.null_count else struct_list.offsets,
            field(struct_list.values, name), type=_STR_LIST,
        )

    w = workers.chunk(0) if isinstance(workers, pa.ChunkedArray) else workers
    if w.null_count:
        w = pc.fill_null(w, scalar([], w.type))
    empty_list = scalar([], _STR_LIST)
    columns = {
        "runId": t.column("runId"), "cwd": t.column("cwd"), "workflowName": t.column("workflowName"),
        "task": t.column("task"), "state": t.column("state"),
        "startedAt": t.column("startedAt").cast(_TS), "endedAt": t.column("endedAt").cast(_TS),
        "parentRunId": _empty_to_null(field(lin, "parentRunId")),
        "chatSessionId": _empty_to_null(field(lin, "chatSessionId")),
        "previousRunId": _empty_to_null(field(lin, "previousRunId")),
        "rootRunId": _empty_to_null(field(lin, "rootRunId")),
        "summary": pc.fill_null(field(out, "summary"), _EMPTY),
        "accomplished": pc.fill_null(field(out, "accomplished"), empty_list),
        "issues": pc.fill_null(field(out, "issues"), empty_list),
        "next": pc.fill_null(field(out, "next"), empty_list),
        "workerAgents": list_of(w, "agentId"), "workerStates": list_of(w, "state"),
        "verdictSummary": t.column("verdictSummary"),
        **{name: pc.fill_null(t.column(name), empty_list) for name in _RECORD_LISTS},
        "supersededBy": _empty_to_null(t.column("supersededBy")),
        "supersedes": _empty_to_null(t.column("supersedes")),
        "inode": array_of(inodes, pa.uint64()),
    }
    table = pa.Table.from_arrays([pa.chunked_array([c]) if isinstance(c, pa.Array) else c for c in columns.values()], schema=RECORD_SCHEMA)
    return table, mask


def keyword_texts(table: pa.Table, issue_text: dict[str, str]) -> list[str]:
    """The text each row is indexed by (cybmem.store.embeddings.record_text; embeddings use it too)."""
    return keyword_text_array(table, issue_text).to_pylist()


def keyword_text_array(table: pa.Table, issue_text: dict[str, str]) -> pa.StringArray:
    """:func:`keyword_texts` as an Arrow array, joined by Arrow's string kernels: each row's
    :func:`cybmem.store.embeddings.record_text` (task, summary, then the text of each issue it raised,
    or the issue's id when ``issue_text`` has none, then the files it edited and the commands it
    ran), one line each; the task up to
    :data:`cybmem.store.tokens.MAX_TEXT_CHARS` characters."""
    if not table.num_rows:
        return strings([])
    task = pc.utf8_slice_codeunits(table.column("task"), 0, MAX_TEXT_CHARS)
    text = pc.binary_join_element_wise(task, pc.fill_null(table.column("summary"), _EMPTY), _NEWLINE)
    ids = table.column("issues").combine_chunks()
    raised = ids.values
    if len(raised) and issue_text:
        at = pc.index_in(raised, value_set=strings(list(issue_text)))
        raised = pc.if_else(pc.is_null(at), raised, strings(list(issue_text.values())).take(at))
    issues = pc.binary_join(pa.ListArray.from_arrays(ids.offsets, raised), _NEWLINE)
    has = pc.fill_null(pc.greater(pc.list_value_length(ids), scalar(0, pa.int32())), _FALSE)
    text = pc.if_else(has, pc.binary_join_element_wise(text, issues, _NEWLINE), text)
    for name in _RECORD_LISTS:  # the files a run edited, the commands it ran (a table without them: none)
        if name in table.column_names:
            items = table.column(name)
            has = pc.fill_null(pc.greater(pc.list_value_length(items), scalar(0, pa.int32())), _FALSE)
            text = pc.if_else(has, pc.binary_join_element_wise(text, pc.binary_join(items, _NEWLINE), _NEWLINE), text)
    return text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text


def _by_time(table: pa.Table, texts: pa.Array) -> tuple[pa.Table, pa.Array]:
    """Rows ordered oldest first (endedAt, then runId), so a higher row is a newer record."""
    if table.num_rows < 2:
        return table, texts
    order = pc.sort_indices(table, sort_keys=[("endedAt", "ascending"), ("runId", "ascending")])
    idx = numpy_of(order)
    if (np.diff(idx) == 1).all():
        return table, texts
    return table.take(order), texts.take(order)


def _load_records_unordered(store: MemoryStore, entries: list[tuple[str, int]], issue_text: dict[str, str]) -> tuple[pa.Table, pa.StringArray, dict[str, int], list[ReadProblem]]:
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
            good = table.filter(array_of(mask, pa.bool_())) if not mask.all() else table
            rest = [e for e, m in zip(kept, mask) if not m] + missing
            cols, bad, problems = _parse_records(store, rest)
            if len(cols):
                good = pa.concat_tables([good, cols.table()])
                # Same row order as the per-file path: by file name.
                names_now = [r + ".json" for r in good.column("runId").to_pylist()]
                order = sorted(range(len(names_now)), key=names_now.__getitem__)
                good = good.take(array_of(order, pa.int64()))
            return good, keyword_text_array(good, issue_text), bad, problems
    cols, bad, problems = _parse_records(store, entries)
    table = cols.table()
    return table, keyword_text_array(table, issue_text), bad, problems


def load_records(store: MemoryStore, entries: list[tuple[str, int]], issue_text: dict[str, str]) -> tuple[pa.Table, pa.StringArray, dict[str, int], list[ReadProblem]]:
    """Parse record files into a RECORD_SCHEMA table (oldest first) plus each row's keyword text."""
    table, texts, bad, problems = _load_records_unordered(store, entries, issue_text)
    table, texts = _by_time(table, texts)
    return table, texts, bad, problems


def empty_table() -> pa.Table:
    """An empty records table."""
    return _Columns().table()


def parse_files(store: MemoryStore, entries: list[tuple[str, int]], issue_text: dict[str, str]) -> tuple[pa.Table, pa.StringArray, dict[str, int], list[ReadProblem]]:
    """Parse a few record files one by one, rows in the order given (see :func:`load_records`)."""
    cols, bad, problems = _parse_records(store, entries)
    table = cols.table()
    return table, keyword_text_array(table, issue_text), bad, problems
