"""cybmem's hooks in the real Codex CLI (pinned; tests/agent_clients.py) against a stand-in of the
Responses API, with the hooks as ``cybmem hooks install codex`` leaves them: trusted through Codex's
own app-server, no trust-bypass flag on any run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent_clients import agent_bins, codex  # noqa: F401
from servers import function_call, responses_server  # noqa: F401


def cybmem(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["cybmem", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def records(root: Path, slug: str = "web") -> list[dict]:
    found = [json.loads(p.read_text()) for p in (root / slug / "records").glob("*.json")] \
        if (root / slug / "records").is_dir() else []
    return sorted(found, key=lambda r: (r["startedAt"], r["endedAt"]))


@pytest.fixture
def project(tmp_path) -> Path:
    path = tmp_path / "web"
    path.mkdir()
    return path


def install(codex, project, *args: str) -> subprocess.CompletedProcess:
    done = cybmem("hooks", "install", "codex", "--codex", str(codex.exe), *args, cwd=project,
                  env=codex.env())
    assert done.returncode == 0, done.stderr
    return done


def test_two_turns_and_a_later_related_session(codex, responses_server, project, memory_root):
    done = install(codex, project)
    hooks_json = codex.codex_home / "hooks.json"
    assert f"Installed cybmem's hooks for Codex in {hooks_json}" in done.stdout
    assert done.stdout.rstrip().endswith("Codex trusts them (saved through `codex app-server`)")
    responses_server.when("regression test", "Added a regression test.\n\nISSUES:\n- none")
    responses_server.when("flakes again", "Looking at it.\n\nISSUES:\n- none")
    responses_server.when("Fix the flaky", [function_call("exec_command", cmd="npm test -- drawer"), function_call(
        "exec_command", cmd="apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: src/drawer.test.ts\n@@\n-a\n+b\n*** End Patch\nEOF")])
    responses_server.after_tools = ("The drawer test raced the animation; it now waits for transitionend.\n\nISSUES:\n"
                                    "- Drawer e2e test is slow: 40 s\nNEXT:\n- profile the e2e suite")
    first = codex.run("Fix the flaky cart drawer test", project)
    assert "--dangerously-bypass-hook-trust" not in first.args
    recs = records(memory_root)
    assert [r["task"] for r in recs] == ["Fix the flaky cart drawer test"]
    assert recs[0]["commands"] == ["npm test -- drawer"] and recs[0]["files"] == ["src/drawer.test.ts"]
    session = recs[0]["lineage"]["chatSessionId"]
    codex.run("Add a regression test for it", project, resume=session)
    recs = records(memory_root)
    assert [r["task"] for r in recs] == ["Fix the flaky cart drawer test", "Add a regression test for it"]
    assert [r["lineage"]["chatSessionId"] for r in recs] == [session, session]
    assert recs[1]["lineage"]["previousRunId"] == recs[0]["runId"]
    assert recs[0]["outcome"]["issues"] == ["drawer-e2e-test-is-slow"] and recs[0]["workflowName"] == "codex"
    assert recs[0]["workers"] == [{"agentId": "codex", "provider": "openai", "state": "done"}]
    before = len(responses_server.model_requests())
    codex.run("The cart drawer test flakes again", project)
    sent = responses_server.bodies()[before:]
    assert any(recs[0]["runId"][:8] in body and "Fix the flaky cart drawer test" in body for body in sent)
    assert len(records(memory_root)) == 3
    status = json.loads(cybmem("hooks", "status", "codex", "--codex", str(codex.exe), "--json", cwd=project,
                               env=codex.env()).stdout)
    assert status[0]["installed"] and set(status[0]["trust"].values()) == {"trusted"}


def test_hooks_codex_has_not_trusted_run_nothing_and_the_installer_says_how_to_trust_them(codex, responses_server,
                                                                                          project, memory_root):
    done = install(codex, project, "--codex", str(project / "no-codex-here"))
    assert "Codex runs them once you trust them" in done.stdout
    responses_server.when("README", "Done.")
    codex.run("Update the README", project)
    assert records(memory_root) == []  # Codex skips an untrusted hook without a word
    install(codex, project)  # now with codex: trusted
    codex.run("Update the README again", project)
    assert [r["task"] for r in records(memory_root)] == ["Update the README again"]


def test_uninstall_leaves_hooks_json_as_it_was(codex, project):
    hooks_json = codex.codex_home / "hooks.json"
    own = '{\n  "hooks": {\n    "Stop": [\n      {\n        "hooks": [\n          {"type": "command", "command": "say done"}\n        ]\n      }\n    ]\n  }\n}\n'
    hooks_json.write_text(own)
    install(codex, project)
    data = json.loads(hooks_json.read_text())
    assert list(data["hooks"]) == ["Stop", "SessionStart", "UserPromptSubmit", "SessionEnd"]
    assert data["hooks"]["Stop"][0] == {"hooks": [{"type": "command", "command": "say done"}]}
    done = cybmem("hooks", "uninstall", "codex", env=codex.env())
    assert done.returncode == 0
    assert hooks_json.read_text() == own
    assert os.path.exists(codex.codex_home / "config.toml")


def test_a_session_end_gives_up_before_codex_stops_waiting(tmp_path, memory_root):
    """Codex ends a SessionEnd hook after 3 s whatever its entry asks: the hook gives up half a second
    before, with its one line, when the project's lock is held (CYBERINE_HOOK_DEADLINE is longer)."""
    import fcntl
    import time

    project = tmp_path / "web"
    project.mkdir()
    (memory_root / "web").mkdir(parents=True)
    (memory_root / "projects.json").write_text(json.dumps({"web": {"cwd": str(project)}}))
    rollout = tmp_path / "rollout.jsonl"
    rows = [{"timestamp": "2026-12-01T10:00:00.000Z", "type": "event_msg", "payload": {"type": "task_started", "turn_id": "t1"}},
            {"timestamp": "2026-12-01T10:00:01.000Z", "type": "response_item", "payload": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bump the API client"}],
                "internal_chat_message_metadata_passthrough": {"turn_id": "t1", "content_item_kinds": ["user.text"]}}}]
    rollout.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    payload = json.dumps({"hook_event_name": "SessionEnd", "session_id": "s1", "cwd": str(project),
                          "transcript_path": str(rollout), "reason": "other"})
    lock = open(memory_root / "web" / ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        done = subprocess.run(["cybmem", "hook", "codex"], input=payload, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "CYBERINE_HOOK_DEADLINE": "20"})
        took = time.monotonic() - started
    finally:
        lock.close()
    assert done.returncode == 0 and done.stdout == "" and took < 10
    assert done.stderr.startswith("cybmem hook: SessionEnd: gave up after ") and done.stderr.count("\n") == 1
    done = subprocess.run(["cybmem", "hook", "codex"], input=payload, capture_output=True, text=True, timeout=60)
    (rec,) = records(memory_root)  # with the lock free, the turn that never finished is written
    assert rec["task"] == "Bump the API client" and rec["state"] == "cancelled" and rec["workflowName"] == "codex"


def test_a_projects_hooks_wait_for_codex_to_trust_the_project(codex, responses_server, project, memory_root):
    """Codex reads a project's .codex/ only in a project it trusts: the installer says so, and once
    the project is trusted (Codex's own `exec --trust`), installing again has Codex trust the hooks."""
    done = install(codex, project, "--project", str(project))
    assert (project / ".codex" / "hooks.json").is_file()
    assert done.stdout.rstrip().endswith(f"then run `cybmem hooks install codex --project` again")
    responses_server.when("README", "Done.")
    codex.run("Update the README", project, "--trust")
    assert records(memory_root) == []  # the project is trusted now; its hooks are not yet
    assert install(codex, project, "--project", str(project)).stdout.rstrip().endswith(
        "Codex trusts them (saved through `codex app-server`)")
    codex.run("Update the README again", project)
    assert [r["task"] for r in records(memory_root)] == ["Update the README again"]
