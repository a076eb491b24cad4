"""The hooks' library parts on their own: a prompt as memory keeps it, a turn's id, the session
start's orientation (its budget), the prompt's block (nothing for a prompt that shares nothing with
the project), and a session's end (the turns Stop never saw, newest first, at most a few). Each
through the real console script (``cybmem hook``) where a hook runs it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from conftest import T0, make_run
from cybmem.dispatch.orientation import ORIENTATION_CHARS, orientation
from cybmem.dispatch.preamble import FOOTER, HEADER
from cybmem.operations import agent_turns
from cybmem.operations.write import write_run


def hook(payload: dict, client: str = "claude-code", **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(["cybmem", "hook", client], input=json.dumps(payload), capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


def context(done: subprocess.CompletedProcess) -> str | None:
    assert done.returncode == 0, done.stderr
    if not done.stdout:
        return None
    reply = json.loads(done.stdout)["hookSpecificOutput"]
    return reply["additionalContext"]


def test_a_prompt_as_memory_keeps_it():
    block = f"{HEADER}\n- run 3f2a9c1e (2026-11-29): Fix the login form\n{FOOTER}\n\n"
    text = ("<system-reminder>\nThe user opened src/cart.ts\n</system-reminder>" + block
            + "Fix the cart <private>the key is hunter2</private> total")
    assert agent_turns.prompt_text(text) == "Fix the cart  total"
    assert agent_turns.prompt_text("<private>all of it</private>") == ""
    assert agent_turns.is_client_prompt("<task-notification>\n<task-id>a1</task-id>")
    assert not agent_turns.is_client_prompt("Explain <task-notification> tags")


def test_a_turns_id_is_the_same_everywhere_and_names_one_turn():
    one = agent_turns.turn_run_id("claude-code", "s1", "p1")
    assert one == agent_turns.turn_run_id("claude-code", "s1", "p1")
    assert len({one, agent_turns.turn_run_id("codex", "s1", "p1"), agent_turns.turn_run_id("claude-code", "s2", "p1"),
                agent_turns.turn_run_id("claude-code", "s1", "p2")}) == 4
    with pytest.raises(Exception, match="'cursor' is not an agent cybmem has hooks for"):
        agent_turns.turn_run_id("cursor", "s1", "p1")


def _busy_store(settings, n_runs: int = 30) -> None:
    """A project whose runs have long tasks and raised many issues, most still open."""
    for i in range(n_runs):
        out = (f"Did part {i}.\n\nISSUES:\n- The {i}th thing that is still broken in the checkout flow after the "
               f"rewrite: it fails on Safari\nNEXT:\n- none")
        write_run(make_run(f"r{i:02d}", f"Rework step {i} of the checkout flow so that the cart, the address form, "
                           "the payment form and the order summary all agree on the totals shown to the customer",
                           start=T0 + i * 3_600_000, output=out), settings)


def test_the_session_start_orientation_keeps_to_its_budget(settings):
    _busy_store(settings)
    done = hook({"hook_event_name": "SessionStart", "session_id": "s1", "cwd": "/home/dev/web", "source": "startup"})
    text = context(done)
    assert done.stderr == ""
    assert len(text) <= ORIENTATION_CHARS and text.startswith(HEADER + "\n") and text.endswith(FOOTER + "\n")
    runs = [line for line in text.splitlines() if line.startswith("- run ")]
    assert runs[0].startswith("- run r29 (") and len(runs) >= 5  # newest first, one line each
    assert all(len(line) <= 80 for line in runs)
    assert "Open issues in this project:" in text and "more open issues (`cybmem issues` lists them)" in text
    issues = text[text.index("Open issues in this project:"):]
    assert len(issues) <= 0.4 * ORIENTATION_CHARS + 80


def test_the_orientation_leaves_out_what_a_correction_replaced_and_is_empty_without_memory():
    runs = [{"runId": "a1", "endedAt": T0, "state": "done", "task": "Old", "superseded": True},
            {"runId": "a2", "endedAt": T0, "state": "done", "task": "New", "superseded": False}]
    text = orientation(runs, [])
    assert "run a2" in text and "run a1" not in text
    assert orientation([], []) == ""


def test_the_orientation_shows_what_a_merge_commit_issue_merged(settings):
    """An open issue whose title is only "Merge pull request #N from ..." is shown at a session
    start with the pull request's title from the run that opened it, as the prompt's block shows it."""
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.records import IssueEvent

    write_run(make_run("m1", "Merge pull request #77 from dev/fix-drawer\n\nFix the cart drawer on Safari"), settings)
    MemoryStore(settings.memory_dir, "web").append_issue_events(
        [IssueEvent("ticket-77", T0 + 1_000, "opened", "m1", "Merge pull request #77 from dev/fix-drawer")])
    text = context(hook({"hook_event_name": "SessionStart", "session_id": "s1", "cwd": "/home/dev/web", "source": "startup"},
                        CYBERINE_MEMORY_DIR=str(settings.memory_dir)))
    assert "- ticket-77: Fix the cart drawer on Safari (#77)" in text, text


@pytest.mark.parametrize("root", ["missing", "empty", "another project's"])
def test_a_project_without_memory_yet_gets_nothing_and_nothing_is_wrong(tmp_path, root, settings):
    """A new user's first session: no context, no line on stderr (nothing went wrong)."""
    memory = tmp_path / "root"
    if root != "missing":
        memory.mkdir()
    if root == "another project's":
        write_run(make_run("w1", "Fix the login form"), dataclasses.replace(settings, memory_dir=memory))
    base = {"session_id": "s1", "cwd": str(tmp_path / "new-project")}
    for event in ({"hook_event_name": "SessionStart", "source": "startup"},
                  {"hook_event_name": "UserPromptSubmit", "prompt_id": "p1", "prompt": "Fix the login form"}):
        done = hook({**base, **event}, CYBERINE_MEMORY_DIR=str(memory))
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), event


def test_the_prompts_block_names_the_turn_and_a_prompt_that_shares_nothing_gets_no_line(fixture_copy, tmp_path):
    env = {"CYBERINE_MEMORY_DIR": str(fixture_copy)}
    base = {"hook_event_name": "UserPromptSubmit", "session_id": "s1", "cwd": "/home/dev/web"}
    text = context(hook({**base, "prompt_id": "p1", "prompt": "Fix the flaky cart drawer test"}, **env))
    assert text.startswith(HEADER) and "Stabilise the flaky cart drawer e2e test" in text
    shown = [json.loads(line) for line in (fixture_copy / "web" / "shown.jsonl").read_text().splitlines()]
    assert shown[-1]["runId"] == agent_turns.turn_run_id("claude-code", "s1", "p1")  # what the turn's record will say it was shown
    lines = len(shown)
    assert context(hook({**base, "prompt_id": "p2", "prompt": "Calibrate the lidar sensor drift on the rig"}, **env)) is None
    assert context(hook({**base, "prompt_id": "p3", "prompt": "<task-notification>\n<task-id>a1</task-id>"}, **env)) is None
    assert context(hook({**base, "prompt_id": "p4", "prompt": "<private>cart drawer</private>"}, **env)) is None
    assert len((fixture_copy / "web" / "shown.jsonl").read_text().splitlines()) == lines + 1  # the lidar block was built


def _transcript(path: Path, turns: int, *, finished: set[int]) -> None:
    """A Claude Code transcript (its line shapes) of ``turns`` prompts; those not in ``finished`` were
    interrupted."""
    lines = []
    for i in range(turns):
        at = f"2026-12-01T10:{i:02d}:00.000Z"
        lines.append({"parentUuid": None, "isSidechain": False, "promptId": f"p{i}", "type": "user", "uuid": f"u{i}",
                      "timestamp": at, "cwd": "/home/dev/web", "promptSource": "sdk",
                      "message": {"role": "user", "content": f"Step {i} of the migration"}})
        if i in finished:
            lines.append({"parentUuid": f"u{i}", "isSidechain": False, "type": "assistant", "uuid": f"a{i}", "timestamp": at,
                          "message": {"role": "assistant", "content": [{"type": "text", "text": f"Did step {i}."}],
                                      "stop_reason": "end_turn"}})
        else:
            lines.append({"parentUuid": f"u{i}", "isSidechain": False, "promptId": f"p{i}", "type": "user", "uuid": f"x{i}",
                          "timestamp": at, "message": {"role": "user", "content": [{"type": "text",
                                                                                     "text": "[Request interrupted by user]"}]}})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def test_a_sessions_end_writes_the_turns_stop_never_saw_newest_first_and_a_few(tmp_path, memory_root):
    transcript = tmp_path / "s.jsonl"
    _transcript(transcript, 25, finished={0})
    payload = {"session_id": "s1", "cwd": "/home/dev/web", "transcript_path": str(transcript)}
    assert context(hook({**payload, "hook_event_name": "Stop", "prompt_id": "p0"})) is None
    done = hook({**payload, "hook_event_name": "SessionEnd", "reason": "other"})
    assert done.returncode == 0 and done.stderr == ""
    recs = sorted((json.loads(p.read_text()) for p in (memory_root / "web" / "records").glob("*.json")),
                  key=lambda r: r["startedAt"])
    written = [int(r["task"].split()[1]) for r in recs]
    assert written == [0] + list(range(5, 25))  # Stop wrote step 0; the end, the 20 newest of the rest
    assert {r["state"] for r in recs[1:]} == {"cancelled"} and recs[0]["state"] == "done"
    assert [r["lineage"].get("previousRunId") for r in recs[2:]] == [r["runId"] for r in recs[1:-1]]
