"""The harness the hook tests stand on: the real Claude Code and Codex CLIs run offline against the
model stand-ins of tests/servers.py (tests/agent_clients.py), with no hook installed yet."""

from __future__ import annotations

import json

from agent_clients import CLAUDE_CODE_VERSION, CODEX_VERSION, agent_bins, claude_code, codex  # noqa: F401
from servers import messages_server, responses_server, tool_use  # noqa: F401


def test_the_clients_are_the_pinned_versions(agent_bins):
    import subprocess

    for name, pin in (("claude", CLAUDE_CODE_VERSION), ("codex", CODEX_VERSION)):
        out = subprocess.run([str(agent_bins[name]), "--version"], capture_output=True, text=True, timeout=60).stdout
        assert pin in out, (name, out)


def test_claude_code_answers_from_the_stand_in(claude_code, messages_server, tmp_path):
    messages_server.when("capital of France", "Paris.")
    project = tmp_path / "proj"
    project.mkdir()
    result = claude_code.run("What is the capital of France?", project)
    assert result["result"] == "Paris."
    sent = messages_server.bodies()
    assert any("What is the capital of France?" in body for body in sent)
    transcript = claude_code.transcript(project, result["session_id"])
    assert "What is the capital of France?" in transcript.read_text()


def test_claude_code_writes_a_file_through_its_own_write_tool(claude_code, messages_server, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    target = project / "notes.md"
    messages_server.when("Write the notes", [{"type": "text", "text": "Writing them."},
                                             tool_use("Write", file_path=str(target), content="# Notes\n")])
    messages_server.after_tools = "Wrote notes.md."
    result = claude_code.run("Write the notes file", project, tools=("Write",))
    assert result["result"] == "Wrote notes.md."
    assert target.read_text() == "# Notes\n"
    # the model was sent the tool's result in the request after the one that asked for it
    bodies = [r.body for r in messages_server.model_requests() if "Write the notes" in json.dumps(r.body)]
    assert any(c.get("type") == "tool_result" for b in bodies for m in b["messages"] if isinstance(m["content"], list)
               for c in m["content"])


def test_codex_answers_from_the_stand_in(codex, responses_server, tmp_path):
    responses_server.when("capital of Italy", "Rome.")
    project = tmp_path / "proj"
    project.mkdir()
    done = codex.run("What is the capital of Italy?", project)
    assert done.stdout.strip().endswith("Rome.")
    assert any("What is the capital of Italy?" in body for body in responses_server.bodies())
