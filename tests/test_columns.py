"""The loader's fast paths never accept a record the one record parser rejects, so every reader
(list, show, search, inject, the notebooks) sees the same records."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cybmem import columns
from cybmem.errors import ValidationError
from cybmem.store import parse_record

GOOD = {
    "runId": "r1", "cwd": "/home/dev/web", "workflowName": "implement-task", "task": "Fix it", "state": "done",
    "startedAt": 1_000, "endedAt": 2_000,
    "lineage": {"previousRunId": "r0", "parentRunId": "p1", "chatSessionId": "chat 1", "rootRunId": "p1"},
    "outcome": {"summary": "Fixed it.", "accomplished": ["fixed"], "issues": ["flaky-x"], "next": []},
    "workers": [{"agentId": "impl-1", "provider": "anthropic", "state": "done"}],
    "verdictSummary": "impl-1 wins",
}

ODD_VALUES = st.sampled_from([
    None, "", " ", "\t", ".hidden", "bad id", "../x", "x" * 129, 0, 1.5, 1e20, -1, 10**15, True, [], {}, ["x"], [1],
    "relative/dir", "ok-id", "\u00a0", "\x1c",
])
PATHS = st.sampled_from([
    ("runId",), ("cwd",), ("workflowName",), ("task",), ("state",), ("startedAt",), ("endedAt",), ("lineage",),
    ("outcome",), ("workers",), ("verdictSummary",), ("supersededBy",), ("supersedes",),
    ("lineage", "previousRunId"), ("lineage", "parentRunId"), ("lineage", "rootRunId"), ("lineage", "chatSessionId"),
    ("outcome", "summary"), ("outcome", "accomplished"), ("outcome", "issues"), ("outcome", "next"),
    ("workers", 0, "agentId"), ("workers", 0, "state"), ("workers", 0, "provider"),
])


def _mutate(record: dict, changes) -> dict:
    d = json.loads(json.dumps(record))
    for path, value in changes:
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
           _mutate(GOOD, [(("lineage", "rootRunId"), ".hidden")])]


@settings(max_examples=400, deadline=None)
@given(records)
@example(SLIPPED[0]).via("blank cwd")
@example(SLIPPED[1]).via("numeric provider")
@example(SLIPPED[2]).via("supersededBy not a run id")
@example(SLIPPED[3]).via("supersedes a dot-name")
@example(SLIPPED[4]).via("rootRunId a dot-name")
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
