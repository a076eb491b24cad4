"""A new user, from README.md alone: the hooks line README gives a Claude Code user, run as written
into a HOME whose settings.json they already had; three Claude Code sessions on one project (the
real CLI against a stand-in of the Messages API); the third session's model request carries what
the first two did, `cybmem list` shows one record per turn, and the uninstall line README gives
leaves settings.json byte for byte as it was."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from agent_clients import agent_bins, claude_code  # noqa: F401
from servers import messages_server, tool_use  # noqa: F401

REPO = Path(__file__).resolve().parents[2]

#: A settings.json of someone who has used Claude Code for a while.
SETTINGS = """{
  "permissions": {
    "allow": ["Bash(npm run lint)"]
  },
  "hooks": {
    "PostToolUse": [{"matcher": "Write", "hooks": [{"type": "command", "command": "prettier --write \\"$FILE\\""}]}]
  },
  "statusLine": {"type": "command", "command": "~/.claude/statusline.sh"}
}
"""


def readme_command(action: str) -> str:
    """The `cybmem hooks ACTION claude-code` command README.md gives a Claude Code user."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.findall(rf"`(cybmem hooks {action} claude-code[^`]*)`", text)
    assert found, f"README.md gives a Claude Code user no `cybmem hooks {action} claude-code` line"
    return found[0]


def test_a_new_user_from_the_readme(claude_code, messages_server, tmp_path, memory_root):
    settings = claude_code.settings_path
    settings.parent.mkdir(parents=True)
    settings.write_text(SETTINGS, encoding="utf-8")
    project = tmp_path / "shop"
    project.mkdir()
    done = subprocess.run(readme_command("install"), shell=True, capture_output=True, text=True, cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr

    messages_server.when("checkout button", [tool_use("Write", file_path=str(project / "checkout.css"),
                                                      content=".checkout { z-index: 2 }\n")])
    messages_server.when("footer", "Moved the footer below the fold.\n\nISSUES:\n- Footer overlaps the cookie banner: "
                         "on phones\nNEXT:\n- none")
    messages_server.after_tools = ("Raised the checkout button above the footer.\n\nACCOMPLISHED:\n- checkout button "
                                   "above the footer\nISSUES:\n- none\nNEXT:\n- check the footer on phones")
    first = claude_code.run("Fix the checkout button hidden behind the footer", project, tools=("Write",))
    second = claude_code.run("Now tidy the footer layout on phones", project, resume=first["session_id"])
    before = len(messages_server.model_requests())
    third = claude_code.run("The footer still covers the checkout button on small phones", project)
    sent = "\n".join(messages_server.bodies()[before:])

    listed = json.loads(subprocess.run(["cybmem", "list", "--json"], capture_output=True, text=True, cwd=project,
                                       timeout=120).stdout)
    tasks = [r["task"] for r in reversed(listed)]
    assert tasks == ["Fix the checkout button hidden behind the footer", "Now tidy the footer layout on phones",
                     "The footer still covers the checkout button on small phones"]
    assert {r["chatSessionId"] for r in listed} == {first["session_id"], third["session_id"]} and \
        second["session_id"] == first["session_id"]
    # the third session's model request carries what the first two did: their runs, the open issue
    first_run, second_run = listed[2], listed[1]
    for text in (first_run["runId"][:8], "Fix the checkout button hidden behind the footer",
                 second_run["runId"][:8], "footer-overlaps-the-cookie-banner"):
        assert text in sent, text

    done = subprocess.run(readme_command("uninstall"), shell=True, capture_output=True, text=True, cwd=project, timeout=120)
    assert done.returncode == 0, done.stderr
    assert settings.read_text(encoding="utf-8") == SETTINGS
    assert sorted(p.name for p in settings.parent.iterdir() if p.name.startswith("settings")) == ["settings.json"]
