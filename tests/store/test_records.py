import pytest

from cybmem.errors import ValidationError
from cybmem.store.records import IssueEvent, MemoryRecord, validate_run_id


def base_record(**over):
    d = {
        "runId": "r1", "cwd": "/home/dev/web", "workflowName": "implement-task", "task": "Fix it",
        "state": "done", "startedAt": 1733000000000, "endedAt": 1733000090000, "lineage": {},
        "outcome": {"summary": "Fixed.", "accomplished": ["fixed"], "issues": [], "next": []},
        "workers": [{"agentId": "a1", "provider": "anthropic", "state": "done"}],
    }
    d.update(over)
    return d


def test_round_trip_keeps_unknown_fields_everywhere():
    d = base_record(futureField={"x": 1}, lineage={"parentRunId": "p1", "hopCount": 2},
                    outcome={"summary": "s", "accomplished": [], "issues": [], "next": [], "confidence": 0.9},
                    workers=[{"agentId": "a", "state": "done", "tokens": 12}])
    rec = MemoryRecord.from_dict(d)
    out = rec.to_dict()
    assert out["futureField"] == {"x": 1}
    assert out["lineage"] == {"parentRunId": "p1", "hopCount": 2}
    assert out["outcome"]["confidence"] == 0.9
    assert out["workers"] == [{"agentId": "a", "state": "done", "tokens": 12}]
    assert MemoryRecord.from_dict(out).to_dict() == out


@pytest.mark.parametrize(
    "over, field",
    [
        ({"state": "finished"}, "state"),
        ({"startedAt": "yesterday"}, "startedAt"),
        ({"endedAt": True}, "endedAt"),
        ({"task": 3}, "task"),
        ({"cwd": ""}, "cwd"),
        ({"lineage": {"parentRunId": 5}}, "lineage.parentRunId"),
        ({"lineage": {"previousRunId": "../etc"}}, "lineage.previousRunId"),
        ({"outcome": {"summary": "s", "issues": "one"}}, "outcome.issues"),
        ({"outcome": {"summary": "s", "next": [1]}}, "outcome.next[0]"),
        ({"workers": [{"state": "done"}]}, "workers[0].agentId"),
        ({"runId": "a/b"}, "runId"),
        ({"runId": ".."}, "runId"),
        ({"supersededBy": "x y"}, "supersededBy"),
    ],
)
def test_validation_names_the_field(over, field):
    with pytest.raises(ValidationError) as err:
        MemoryRecord.from_dict(base_record(**over))
    assert str(err.value).startswith(field)


def test_missing_required_fields_are_named():
    d = base_record()
    del d["lineage"]
    with pytest.raises(ValidationError, match="lineage: required"):
        MemoryRecord.from_dict(d)
    d = base_record()
    del d["endedAt"]
    with pytest.raises(ValidationError, match="endedAt: required"):
        MemoryRecord.from_dict(d)


def test_whole_float_timestamps_are_accepted():
    assert MemoryRecord.from_dict(base_record(startedAt=1733000000000.0)).startedAt == 1733000000000


def test_issue_event_validation_and_extras():
    ev = IssueEvent.from_dict({"issueId": "flaky", "at": 1, "event": "opened", "byRunId": "r1", "title": "Flaky", "sev": 2})
    assert ev.to_dict() == {"issueId": "flaky", "at": 1, "event": "opened", "byRunId": "r1", "title": "Flaky", "sev": 2}
    with pytest.raises(ValidationError, match="event"):
        IssueEvent.from_dict({"issueId": "x", "at": 1, "event": "closed"})
    with pytest.raises(ValidationError, match="issueId"):
        IssueEvent.from_dict({"issueId": "../x", "at": 1, "event": "opened"})


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\x00", "x" * 129, None, 7, "a b"])
def test_run_id_rejects_unsafe(bad):
    with pytest.raises(ValidationError):
        validate_run_id(bad)
