"""The write path: an orchestrator run -> one record + issue events."""

import json
import os

import pytest

from cybmem.errors import ConflictError, ValidationError
from cybmem.dispatch.preamble import FOOTER, HEADER
from cybmem.operations.write import load_run_payload, parse_run, write_run
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore

from conftest import MIN, T0, make_run

TRAILER = """I fixed the login form validation.

ACCOMPLISHED:
- fixed email validation
ISSUES:
- Flaky login test: fails one run in ten
NEXT:
- add a password strength meter
"""


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_record_from_run_json(settings, memory_root):
    run = make_run("r1", output=TRAILER, verdict={"winner": "impl-1", "summary": "impl-1 wins: tests pass"})
    res = write_run(run, settings)
    rec = res.record
    assert res.path == memory_root / "web" / "records" / "r1.json"
    assert (rec.runId, rec.state, rec.workflowName, rec.cwd) == ("r1", "done", "implement-task", "/home/dev/web")
    assert rec.outcome.accomplished == ["fixed email validation"]
    assert rec.outcome.issues == ["flaky-login-test"]
    assert rec.outcome.next == ["add a password strength meter"]
    assert rec.verdictSummary == "impl-1 wins: tests pass"
    assert "Fix the login form" in rec.outcome.summary and "done" in rec.outcome.summary
    assert rec.lineage.rootRunId == "r1" and rec.lineage.previousRunId is None
    assert [w.to_dict() for w in rec.workers] == [{"agentId": "impl-1", "provider": "anthropic", "state": "done"}]
    [ev] = res.events
    assert ev.to_dict() == {"issueId": "flaky-login-test", "at": T0 + 10 * MIN, "event": "opened", "byRunId": "r1",
                            "title": "Flaky login test", "detail": "fails one run in ten"}
    on_disk = json.loads(res.path.read_text())
    assert on_disk == rec.to_dict()


def test_memory_block_inside_task_wrapper_is_removed(settings):
    wrapped = (
        "You are an implementer. Work carefully.\nTASK:\n"
        f"{HEADER}\n- run 1234abcd (2025-11-01 09:00 UTC, done): old work\n  summary: old\n{FOOTER}\n\n"
        "Fix the login form\nso that emails validate\n\nINSTRUCTIONS:\n- end with the trailer\n"
    )
    rec = write_run(make_run("r1", wrapped), settings).record
    assert rec.task == "Fix the login form\nso that emails validate"


def test_memory_block_at_the_start_is_removed(settings):
    rec = write_run(make_run("r1", f"{HEADER}\n- run x\n{FOOTER}\n\nFix the login form"), settings).record
    assert rec.task == "Fix the login form"


def test_previous_is_auto_linked_and_root_carried_down_the_chain(settings):
    write_run(make_run("a", start=T0), settings)
    write_run(make_run("b", start=T0 + 20 * MIN, lineage={"parentRunId": "a"}), settings)
    c = write_run(make_run("c", start=T0 + 40 * MIN), settings, parent_run_id="b", chat_session_id="chat-9").record
    assert c.lineage.previousRunId == "b"
    assert (c.lineage.parentRunId, c.lineage.rootRunId, c.lineage.chatSessionId) == ("b", "a", "chat-9")


def test_previous_is_the_latest_run_that_ended_before_this_one_started(settings):
    write_run(make_run("early", start=T0, minutes=5), settings)
    write_run(make_run("long", start=T0, minutes=120), settings)  # still running when "next" starts
    nxt = write_run(make_run("next", start=T0 + 30 * MIN), settings).record
    assert nxt.lineage.previousRunId == "early"


def test_lineage_from_environment(memory_root, monkeypatch):
    monkeypatch.setenv("CYBERINE_RUN_ID", "env-run")
    monkeypatch.setenv("CYBERINE_PARENT_RUN_ID", "env-parent")
    monkeypatch.setenv("CYBERINE_CHAT_SESSION_ID", "chat-1")
    run = make_run("x")
    del run["id"]
    rec = write_run(run, Settings.from_env()).record
    assert (rec.runId, rec.lineage.parentRunId, rec.lineage.chatSessionId, rec.lineage.rootRunId) == ("env-run", "env-parent", "chat-1", "env-parent")


def test_resolving_an_open_issue_through_the_trailer(settings):
    write_run(make_run("r1", output=TRAILER), settings)
    fix = "Stabilised it.\n\nACCOMPLISHED:\n- fixed flaky-login-test by waiting for the form\nISSUES:\n- none\nNEXT:\n- none\n"
    res = write_run(make_run("r2", "Stabilise the flaky login test", start=T0 + 60 * MIN, output=fix), settings)
    assert [(e.issueId, e.event) for e in res.events] == [("flaky-login-test", "resolved")]
    assert res.store.open_issues() == []


def test_duplicate_open_issue_from_a_later_run_is_not_reopened(settings):
    write_run(make_run("r1", output=TRAILER), settings)
    res = write_run(make_run("r2", start=T0 + 60 * MIN, output=TRAILER), settings)
    assert res.record.outcome.issues == ["flaky-login-test"]
    assert res.events == []
    lines = res.store.issues_path.read_text().splitlines()
    assert len(lines) == 1


def test_minimal_run_and_aliases(settings):
    run = {"runId": "m1", "cwd": "/home/dev/web", "prompt": {"prompt": "Tidy the README"}, "state": "completed",
           "finishedAt": "2025-11-01T10:00:00Z", "someOrchestratorField": {"x": 1}}
    rec = write_run(run, settings).record
    assert (rec.task, rec.state, rec.workflowName, rec.workers) == ("Tidy the README", "done", "unknown", [])
    assert rec.startedAt == rec.endedAt == 1761991200000
    assert rec.outcome.accomplished == [] and rec.outcome.summary


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("task"), "task: required"),
        (lambda r: r.update(status="running"), "not a final state"),
        (lambda r: r.update(startedAt="last tuesday"), "startedAt"),
        (lambda r: r.update(id="../../etc/passwd"), "runId"),
        (lambda r: r.update(workers={"a": 1}), "workers: expected a list"),
        (lambda r: r.update(lineage="p1"), "lineage: expected an object"),
        (lambda r: r.update(endedAt=T0 - 1), "is after endedAt"),
    ],
)
def test_bad_run_is_rejected_and_leaves_nothing_behind(settings, memory_root, change, message):
    run = make_run("r1")
    change(run)
    with pytest.raises(ValidationError, match=message):
        write_run(run, settings)
    assert listing(memory_root) == []


def test_existing_run_id_is_a_conflict(settings):
    write_run(make_run("r1"), settings)
    with pytest.raises(ConflictError):
        write_run(make_run("r1", "another task"), settings)
    assert MemoryStore(settings.memory_dir, "web").read_record("r1").task == "Fix the login form"


def test_hook_payload_shapes(tmp_path):
    run = make_run("r1")
    assert load_run_payload(json.dumps({"event": "RunEnd", "run": run})) == run
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert load_run_payload(json.dumps({"event": "RunEnd", "runPath": str(path)})) == run
    with pytest.raises(ValidationError, match="not valid JSON"):
        load_run_payload(b"{nope")


def test_secrets_are_redacted_before_writing(settings):
    out = "Set AWS key AKIAIOSFODNN7EXAMPLE in the env.\n\nACCOMPLISHED:\n- rotated token ghp_abcdefghijklmnopqrstuvwxyz0123456789\nISSUES:\n- none\nNEXT:\n- none"
    res = write_run(make_run("r1", "Deploy with password=hunter2hunter2", output=out), settings)
    text = res.path.read_text()
    assert "AKIAIOSFODNN7EXAMPLE" not in text and "ghp_abc" not in text and "hunter2hunter2" not in text
    assert "[REDACTED:" in text and res.redacted


def test_redaction_can_be_turned_off(memory_root):
    settings = Settings.from_env({"CYBERINE_MEMORY_REDACT": "0"}, memory_dir=memory_root)
    res = write_run(make_run("r1", "Deploy with password=hunter2hunter2"), settings)
    assert "hunter2hunter2" in res.record.task


def test_windows_line_endings_in_worker_output(settings):
    out = TRAILER.replace("\n", "\r\n")
    rec = write_run(make_run("r1", output=out), settings).record
    assert rec.outcome.issues == ["flaky-login-test"] and rec.outcome.next == ["add a password strength meter"]


def test_winner_is_the_judged_worker(settings):
    run = make_run("r1")
    run["workers"] = [
        {"agentId": "a", "state": "done", "output": "A\n\nACCOMPLISHED:\n- from a"},
        {"agentId": "b", "state": "done", "output": "B\n\nACCOMPLISHED:\n- from b"},
    ]
    run["verdict"] = {"winner": "a", "summary": "a is better"}
    assert write_run(run, settings).record.outcome.accomplished == ["from a"]
    run2 = dict(run, id="r2", verdict=None, startedAt=T0 + 60 * MIN, endedAt=T0 + 70 * MIN)
    assert write_run(run2, settings).record.outcome.accomplished == ["from b"], "no verdict: last done worker"


def test_parse_run_accepts_seconds_and_iso():
    run = make_run("r1")
    run["startedAt"], run["endedAt"] = 1761955200, "2025-11-01T00:10:00+00:00"
    parsed = parse_run(run)
    assert (parsed.started_at, parsed.ended_at) == (T0, T0 + 10 * MIN)


def test_files_are_private(settings, memory_root):
    write_run(make_run("r1", output=TRAILER), settings)
    for path in memory_root.rglob("*"):
        mode = os.stat(path).st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), path


def test_a_correction_keeps_the_lineage_of_the_run_it_supersedes(settings):
    write_run(make_run("p", start=T0), settings)
    old = write_run(make_run("r1", start=T0 + 20 * MIN, lineage={"parentRunId": "p", "chatSessionId": "c1"}), settings).record
    fix = write_run(make_run("r1-fix", "corrected", start=T0 + 20 * MIN), settings, supersedes="r1").record
    assert fix.supersedes == "r1"
    assert fix.lineage.to_dict() == old.lineage.to_dict()


# --- bounds of what one run opens (issue 41) ---------------------------------------------------------


def _issues_trailer(items):
    return "Found a lot.\n\nISSUES:\n" + "".join(f"- {item}\n" for item in items)


def test_a_run_opens_at_most_max_run_issues_and_says_what_it_left_out(settings, memory_root):
    from cybmem.operations.write import MAX_RUN_ISSUES

    # 50,000 ISSUES bullets took 42 s (a list scanned for each id) and put 50,000 events in the ledger.
    items = [f"Problem number {i}: it breaks" for i in range(50_000)]
    res = write_run(make_run("r1", output=_issues_trailer(items)), settings)
    opened = [e for e in res.events if e.event == "opened"]
    assert [e.issueId for e in opened] == [f"problem-number-{i}" for i in range(MAX_RUN_ISSUES)], "the first, in order"
    assert res.record.outcome.issues == [e.issueId for e in opened], "the record names the issues it opened"
    assert len((memory_root / "web" / "issues.jsonl").read_text().splitlines()) == MAX_RUN_ISSUES
    assert (f"the run lists 50000 issues: the first {MAX_RUN_ISSUES} were opened, the other {50_000 - MAX_RUN_ISSUES} "
            f"left out (a run opens at most {MAX_RUN_ISSUES})") in res.warnings


def test_repeated_issues_count_once_toward_the_bound(settings):
    from cybmem.operations.write import MAX_RUN_ISSUES

    # The same titles over and over (and "**title**:" spellings of them): only distinct ids count.
    items = [f"Problem {i % MAX_RUN_ISSUES}: again" for i in range(5_000)] + [f"**Problem {i}**: again" for i in range(10)]
    res = write_run(make_run("r1", output=_issues_trailer(items)), settings)
    assert len(res.record.outcome.issues) == MAX_RUN_ISSUES and not res.warnings


def test_an_issue_title_and_detail_are_cut_for_the_ledger_and_the_id_comes_from_the_whole_title(settings, memory_root):
    from cybmem.operations.write import ISSUE_DETAIL_MAX, ISSUE_TITLE_MAX
    from cybmem.store.outcome import issue_slug

    title = " ".join(f"word{i}" for i in range(20_000))  # one bullet of 140 kB, no separator
    res = write_run(make_run("r1", output=_issues_trailer([title, "Short one: " + "detail " * 2_000])), settings)
    events = [json.loads(line) for line in (memory_root / "web" / "issues.jsonl").read_text().splitlines()]
    assert events[0]["issueId"] == issue_slug(title) and len(events[0]["title"]) <= ISSUE_TITLE_MAX
    assert events[0]["title"].endswith("\u2026") and title.startswith(events[0]["title"][:-1])
    assert events[1]["title"] == "Short one" and len(events[1]["detail"]) <= ISSUE_DETAIL_MAX
    assert max(len(line) for line in (memory_root / "web" / "issues.jsonl").read_bytes().splitlines()) < 3_000
    assert any(w.startswith("2 issue title(s) or detail(s) cut for the ledger") for w in res.warnings), res.warnings
