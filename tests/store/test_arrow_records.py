"""The loader's fast paths never accept a record the one record parser rejects, so every reader
(list, show, search, inject, the notebooks) sees the same records."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
import pyarrow as pa

from cybmem.store import arrow_records as columns
from cybmem.errors import ValidationError
from cybmem.store.memory_store import parse_record

GOOD = {
    "runId": "r1", "cwd": "/home/dev/web", "workflowName": "implement-task", "task": "Fix it", "state": "done",
    "startedAt": 1_000, "endedAt": 2_000,
    "lineage": {"previousRunId": "r0", "parentRunId": "p1", "chatSessionId": "chat 1", "rootRunId": "p1"},
    "outcome": {"summary": "Fixed it.", "accomplished": ["fixed"], "issues": ["flaky-x"], "next": []},
    "workers": [{"agentId": "impl-1", "provider": "anthropic", "state": "done"}],
    "verdictSummary": "impl-1 wins",
    "files": ["src/drawer.css"], "commands": ["npm test"],
}

ODD_VALUES = st.sampled_from([
    None, "", " ", "\t", ".hidden", "bad id", "../x", "x" * 129, 0, 1.5, 1e20, -1, 10**15, True, [], {}, ["x"], [1],
    "relative/dir", "ok-id", "\u00a0", "\x1c",
])
PATHS = st.sampled_from([
    ("runId",), ("cwd",), ("workflowName",), ("task",), ("state",), ("startedAt",), ("endedAt",), ("lineage",),
    ("outcome",), ("workers",), ("verdictSummary",), ("supersededBy",), ("supersedes",), ("files",), ("commands",),
    ("files", 0), ("commands", 0),
    ("lineage", "previousRunId"), ("lineage", "parentRunId"), ("lineage", "rootRunId"), ("lineage", "chatSessionId"),
    ("outcome", "summary"), ("outcome", "accomplished"), ("outcome", "issues"), ("outcome", "next"),
    ("workers", 0, "agentId"), ("workers", 0, "state"), ("workers", 0, "provider"),
])


def _mutate(record: dict, changes) -> dict:
    d = json.loads(json.dumps(record))
    for path, value in changes:
        value = json.loads(json.dumps(value))  # ODD_VALUES' {} and [] are one object each: never share it
        target = d
        for key in path[:-1]:
            if isinstance(target, dict) and key in target and isinstance(target[key], (dict, list)):
                target = target[key]
            elif isinstance(target, list) and isinstance(key, int) and len(target) > key:
                target = target[key]
            else:
                break
        else:
            if isinstance(target, dict):
                if value is None and path[-1] in ("cwd", "state"):
                    target.pop(path[-1], None)
                else:
                    target[path[-1]] = value
            elif isinstance(target, list) and isinstance(path[-1], int) and len(target) > path[-1]:
                target[path[-1]] = value
    return d


def _valid(d: dict, name: str) -> bool:
    try:
        parse_record(name, json.dumps(d).encode())
        return True
    except ValidationError:
        return False


records = st.lists(st.tuples(PATHS, ODD_VALUES), max_size=3).map(lambda ch: _mutate(GOOD, ch))


# Shapes the earlier fast paths let through although the parser rejects them.
SLIPPED = [_mutate(GOOD, [(("cwd",), " ")]), _mutate(GOOD, [(("workers", 0, "provider"), 3)]),
           _mutate(GOOD, [(("supersededBy",), "bad id")]), _mutate(GOOD, [(("supersedes",), ".hidden")]),
           _mutate(GOOD, [(("lineage", "rootRunId"), ".hidden")]), _mutate(GOOD, [(("files", 0), None)])]


@settings(max_examples=400, deadline=None)
@given(records)
@example(SLIPPED[0]).via("blank cwd")
@example(SLIPPED[1]).via("numeric provider")
@example(SLIPPED[2]).via("supersededBy not a run id")
@example(SLIPPED[3]).via("supersedes a dot-name")
@example(SLIPPED[4]).via("rootRunId a dot-name")
@example(SLIPPED[5]).via("a null among the files")
def test_fast_row_accepts_only_what_the_parser_accepts(d):
    if columns._fast_row(d, "r1"):
        assert _valid(d, "r1.json"), d


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, min_size=1, max_size=8))
@example([GOOD, *SLIPPED]).via("each shape that slipped through before")
def test_bulk_checks_accept_only_what_the_parser_accepts(batch):
    raws = [json.dumps(d).encode() for d in batch]
    names = [f"r{i}" for i in range(len(batch))]
    for d, name in zip(batch, names):
        d["runId"] = name if d.get("runId") == "r1" else d.get("runId")
    raws = [json.dumps(d).encode() for d in batch]
    bulk = columns._bulk_table(raws, names, list(range(len(batch))))
    if bulk is None:
        return  # the batch goes file by file, through the parser itself
    _table, mask = bulk
    for d, name, ok in zip(batch, names, mask):
        if ok:
            assert _valid(d, name + ".json"), d


# --- one field table (cybmem.store.records.RECORD_FIELDS) ------------------------------------------------

_TS, _LS = "timestamp[ms, tz=UTC]", "list<item: string>"
#: The cache's columns (.cache/ holds them); derived from the field table, pinned here.
PINNED_RECORD_SCHEMA = [
    ("runId", "string"), ("cwd", "string"), ("workflowName", "string"), ("task", "string"), ("state", "string"),
    ("startedAt", _TS), ("endedAt", _TS), ("parentRunId", "string"), ("chatSessionId", "string"),
    ("previousRunId", "string"), ("rootRunId", "string"), ("summary", "string"), ("accomplished", _LS),
    ("issues", _LS), ("next", _LS), ("workerAgents", _LS), ("workerStates", _LS), ("verdictSummary", "string"),
    ("files", _LS), ("commands", _LS), ("supersededBy", "string"), ("supersedes", "string"), ("inode", "uint64"),
]


def test_the_arrow_schema_comes_from_the_field_table():
    from cybmem.store.records import Lineage, MemoryRecord, Outcome, Worker, RECORD_FIELDS

    assert [(f.name, str(f.type)) for f in columns.RECORD_SCHEMA] == PINNED_RECORD_SCHEMA
    assert MemoryRecord._KNOWN == tuple(f.name for f in RECORD_FIELDS) == tuple(columns._JSON_SCHEMA.names)
    nested = {f.name: f.nested for f in RECORD_FIELDS if f.nested}
    for cls, name in ((Lineage, "lineage"), (Outcome, "outcome"), (Worker, "workers")):
        assert cls._KNOWN == tuple(f.name for f in nested[name])


IDS = ["r0", "a.b", "-x", "_", "x" * 128, "x" * 129, ".hidden", "..", "a/b", "bad id", "é", "a\n"]


def test_the_run_id_rule_is_one_rule_on_every_path():
    """validate_run_id, the per-file fast path and Arrow's bulk check accept exactly the same links."""
    from cybmem.store.records import validate_run_id

    def parser_ok(v):
        try:
            validate_run_id(v)
            return True
        except ValidationError:
            return False

    batch = [_mutate(GOOD, [(("supersedes",), v), (("lineage", "rootRunId"), v)]) for v in IDS]
    names = [f"r{i}" for i in range(len(batch))]
    for d, name in zip(batch, names):
        d["runId"] = name
    _table, mask = columns._bulk_table([json.dumps(d).encode() for d in batch] * 40, names * 40, list(range(40 * len(batch))))
    want = [parser_ok(v) for v in IDS]
    assert want == [True] * 5 + [False] * 7
    assert [columns._fast_row(d, name) for d, name in zip(batch, names)] == want
    assert mask[:len(IDS)].tolist() == want
    assert [_valid(d, name + ".json") for d, name in zip(batch, names)] == want


def test_a_rule_changed_in_the_table_changes_every_path():
    """Make verdictSummary required in the table only: the parser, the fast path and the bulk check all follow."""
    import subprocess
    import sys

    code = f"""
import dataclasses, json
import cybmem.store.records as s
s.RECORD_FIELDS = tuple(dataclasses.replace(f, required=True) if f.name == "verdictSummary" else f for f in s.RECORD_FIELDS)
from cybmem.store import arrow_records as columns
from cybmem.errors import ValidationError
d = {GOOD!r}
del d["verdictSummary"]
try:
    s.MemoryRecord.from_dict(d)
    parser = "accepted"
except ValidationError as exc:
    parser = str(exc)
_t, mask = columns._bulk_table([json.dumps(d).encode()], ["r1"], [1])
print(parser, columns._fast_row(d, "r1"), mask.tolist())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "verdictSummary: required field is missing False [False]"


_words = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
_ids = st.sampled_from(["a", "b", "c", "x-1"])


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(_words, st.one_of(st.none(), _words), st.one_of(st.none(), st.lists(_ids, max_size=3))),
                     max_size=8),
       titles=st.dictionaries(_ids, _words, max_size=3), cut=st.integers(0, 3))
def test_keyword_text_array_is_record_text(rows, titles, cut):
    """The Arrow keyword texts are embeddings.record_text's, row for row: summaries that are null, issues that
    are null, empty or have no text (the id stands in), a table in several chunks and a sliced one."""
    import pyarrow as pa

    from cybmem.store.embeddings import record_text

    table = pa.table({"task": pa.array([r[0] for r in rows], pa.string()), "summary": pa.array([r[1] for r in rows], pa.string()),
                      "issues": pa.array([r[2] for r in rows], pa.list_(pa.string()))})
    want = [record_text(task, summary, issues, titles) for task, summary, issues in rows]
    assert columns.keyword_text_array(table, titles).to_pylist() == want
    assert columns.keyword_texts(table, titles) == want
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    assert columns.keyword_text_array(chunked, titles).to_pylist() == want
    assert columns.keyword_text_array(table.slice(cut), titles).to_pylist() == want[cut:]


# --- Cells: a few rows' values from the buffers, as to_pylist gives them (issue 31) ---------------


_CELL_TYPES = [
    (pa.string(), st.one_of(st.none(), st.text(max_size=12))),
    (pa.list_(pa.string()), st.one_of(st.none(), st.lists(st.text(max_size=6), max_size=4))),
    (pa.list_(pa.string()), st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=4))),
    (pa.uint64(), st.one_of(st.none(), st.integers(0, 2**64 - 1))),
    (pa.int64(), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
    (pa.timestamp("ms", tz="UTC"), st.one_of(st.none(), st.integers(-2_000_000_000_000, 4_000_000_000_000))),
    (pa.timestamp("ms"), st.one_of(st.none(), st.integers(0, 4_000_000_000_000))),
    (pa.float64(), st.one_of(st.none(), st.floats(allow_nan=False))),  # read one scalar at a time
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_cells_read_what_to_pylist_gives(data):
    """Every supported type, nulls, several chunks, chunks that are slices of larger arrays."""
    t, values = data.draw(st.sampled_from(_CELL_TYPES))
    chunks = []
    for _ in range(data.draw(st.integers(1, 3))):
        vals = data.draw(st.lists(values, min_size=0, max_size=8))
        skip = data.draw(st.integers(0, 2))
        pad = data.draw(st.lists(values, min_size=skip, max_size=skip))
        arr = pa.array(pad + vals + pad, t)
        chunks.append(arr.slice(skip, len(vals)))  # a slice: its offset is not 0
    col = pa.chunked_array(chunks, t)
    cells = columns.Cells(col)
    expect = col.to_pylist()
    assert [cells[i] for i in range(len(col))] == expect
    backwards = list(range(len(col)))[::-1]
    assert cells.take(backwards) == [expect[i] for i in backwards]
    if pa.types.is_timestamp(t):
        assert [c.tzinfo for c in (cells[i] for i in range(len(col))) if c is not None] == \
               [c.tzinfo for c in expect if c is not None]
