"""``cybmem hooks install|uninstall|status``: cybmem's hooks merged into an agent's settings file and
taken out again, the real console script on real files (the test's HOME)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CLAUDE_EVENTS = ["SessionStart", "UserPromptSubmit", "Stop", "SubagentStop", "SessionEnd"]

#: A user's settings.json as people keep it: other keys, their own hooks, a 4-space indent, non-ASCII.
USERS_OWN = """{
    "model": "opus",
    "permissions": {
        "allow": ["Bash(npm test)", "Read(~/notes/**)"]
    },
    "env": {"GREETING": "grüß dich"},
    "hooks": {
        "Stop": [
            {
                "hooks": [{"type": "command", "command": "notify-send 'Claude is done'"}]
            }
        ],
        "PreToolUse": [
            {
                "matcher": "Bash",
                "hooks": [{"type": "command", "command": "~/bin/check-bash.sh", "timeout": 5}]
            }
        ]
    }
}
"""


def cybmem(*args: str, cwd: Path | None = None, env: dict | None = None, stdin: str | None = None):
    return subprocess.run(["cybmem", *args], capture_output=True, text=True, cwd=cwd, env=env, input=stdin, timeout=120)


def settings_file() -> Path:
    return Path(os.environ["HOME"]) / ".claude" / "settings.json"


def ours(data: dict) -> dict[str, list[str]]:
    """event -> the commands of cybmem's hooks on it."""
    return {event: [h["command"] for g in groups for h in g["hooks"] if " hook " in h["command"] + " "]
            for event, groups in data.get("hooks", {}).items()}


def test_install_into_no_file_and_uninstall_leaves_no_file():
    path = settings_file()
    done = cybmem("hooks", "install", "claude-code")
    assert done.returncode == 0, done.stderr
    exe = os.path.abspath(shutil.which("cybmem"))
    assert done.stdout.startswith(f"Installed cybmem's hooks for Claude Code in {path} (SessionStart, UserPromptSubmit, "
                                  f"Stop, SubagentStop, SessionEnd): {exe} hook claude-code\n")
    data = json.loads(path.read_text())
    assert list(data["hooks"]) == CLAUDE_EVENTS
    assert all(groups == [{"hooks": [{"type": "command", "command": f"{exe} hook claude-code", "timeout": 30}]}]
               for groups in data["hooks"].values())
    assert path.with_name("settings.json.cybmem-backup").read_bytes() == b""  # there was no file
    done = cybmem("hooks", "uninstall", "claude-code")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"Removed cybmem's hooks for Claude Code: {path} did not exist before them, and is gone again.\n"
    assert not path.exists() and not path.with_name("settings.json.cybmem-backup").exists()


def test_install_keeps_everything_else_twice_changes_nothing_and_uninstall_restores_the_bytes():
    path = settings_file()
    path.parent.mkdir(parents=True)
    path.write_text(USERS_OWN, encoding="utf-8")
    assert cybmem("hooks", "install").returncode == 0  # claude-code is the default
    after = path.read_bytes()
    data = json.loads(after)
    original = json.loads(USERS_OWN)
    assert {k: v for k, v in data.items() if k != "hooks"} == {k: v for k, v in original.items() if k != "hooks"}
    assert data["hooks"]["Stop"][0] == original["hooks"]["Stop"][0]  # the user's own hook, first, as it was
    assert data["hooks"]["PreToolUse"] == original["hooks"]["PreToolUse"]
    assert all(len(commands) == 1 for event, commands in ours(data).items() if event in CLAUDE_EVENTS)
    assert after.startswith(b'{\n    "model"')  # the file's own indent
    assert path.with_name("settings.json.cybmem-backup").read_text(encoding="utf-8") == USERS_OWN
    mtime = path.stat().st_mtime_ns
    done = cybmem("hooks", "install", "claude-code")
    assert done.stdout == f"cybmem's hooks for Claude Code are already in {path}; nothing changed.\n"
    assert path.read_bytes() == after and path.stat().st_mtime_ns == mtime
    done = cybmem("hooks", "uninstall", "claude-code")
    assert done.returncode == 0
    assert done.stdout == f"Removed cybmem's hooks for Claude Code from {path}; the file is back as it was before them.\n"
    assert path.read_text(encoding="utf-8") == USERS_OWN
    assert not path.with_name("settings.json.cybmem-backup").exists()
    assert cybmem("hooks", "uninstall").stdout == f"No hook of cybmem's in {path}; nothing changed.\n"


def test_uninstall_after_the_user_changed_the_file_keeps_their_change():
    path = settings_file()
    path.parent.mkdir(parents=True)
    path.write_text(USERS_OWN, encoding="utf-8")
    cybmem("hooks", "install")
    data = json.loads(path.read_text())
    data["theme"] = "dark"
    data["hooks"]["Stop"].insert(0, {"hooks": [{"type": "command", "command": "say done"}]})
    path.write_text(json.dumps(data, indent=4))
    assert cybmem("hooks", "uninstall").stdout == (f"Removed cybmem's hooks for Claude Code from {path}; everything "
                                                   "else in it stays.\n")
    left = json.loads(path.read_text())
    assert left["theme"] == "dark"
    assert [h["command"] for g in left["hooks"]["Stop"] for h in g["hooks"]] == ["say done", "notify-send 'Claude is done'"]
    assert not any("cybmem" in json.dumps(groups) for groups in left["hooks"].values())
    assert set(left["hooks"]) == {"Stop", "PreToolUse"}


def test_a_newer_cybmem_replaces_the_older_ones_hook():
    path = settings_file()
    path.parent.mkdir(parents=True)
    old = {"hooks": {e: [{"hooks": [{"type": "command", "command": "/old/venv/bin/cybmem hook claude-code"}]}]
                     for e in CLAUDE_EVENTS}}
    path.write_text(json.dumps(old, indent=2) + "\n")
    done = cybmem("hooks", "status", "claude-code")
    assert "problem: /old/venv/bin/cybmem cannot run" in done.stdout
    cybmem("hooks", "install")
    exe = os.path.abspath(shutil.which("cybmem"))
    assert set(map(tuple, ours(json.loads(path.read_text())).values())) == {(f"{exe} hook claude-code",)}
    assert not path.with_name("settings.json.cybmem-backup").exists()  # the file already had cybmem's hooks


def test_dry_run_prints_the_change_and_writes_nothing():
    path = settings_file()
    path.parent.mkdir(parents=True)
    path.write_text(USERS_OWN, encoding="utf-8")
    done = cybmem("hooks", "install", "claude-code", "--dry-run")
    assert done.returncode == 0
    assert f"--- {path} (before)" in done.stdout and f"+++ {path} (after)" in done.stdout
    assert '+        "SessionStart": [' in done.stdout
    assert done.stdout.endswith("(dry run: nothing written)\n")
    assert path.read_text(encoding="utf-8") == USERS_OWN and not path.with_name("settings.json.cybmem-backup").exists()


@pytest.mark.parametrize("content, message", [
    ('{"model": "opus",', "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"hooks": []}', '"hooks" is a list, not an object'),
    ('{"hooks": {"Stop": {"command": "x"}}}', "hooks.Stop is a dict, not a list"),
])
def test_a_settings_file_it_cannot_read_whole_is_left_alone(content, message):
    path = settings_file()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    done = cybmem("hooks", "install", "claude-code")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"Error: {path}") and message in done.stderr and done.stderr.count("\n") == 1
    assert path.read_text() == content and not path.with_name("settings.json.cybmem-backup").exists()


def test_a_linked_settings_file_is_written_where_it_points(tmp_path):
    dotfiles = tmp_path / "dotfiles" / "claude-settings.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text(USERS_OWN, encoding="utf-8")
    path = settings_file()
    path.parent.mkdir(parents=True)
    path.symlink_to(dotfiles)
    cybmem("hooks", "install")
    assert path.is_symlink() and "hook claude-code" in dotfiles.read_text()
    cybmem("hooks", "uninstall")
    assert path.is_symlink() and dotfiles.read_text(encoding="utf-8") == USERS_OWN


def test_a_projects_settings_and_status(tmp_path):
    project = tmp_path / "web"
    project.mkdir()
    done = cybmem("hooks", "install", "claude-code", "--project", str(project))
    assert done.returncode == 0
    assert (project / ".claude" / "settings.json").is_file() and not settings_file().exists()
    status = json.loads(cybmem("hooks", "status", "claude-code", "--project", str(project), "--json").stdout)
    assert status[0]["installed"] and status[0]["missing"] == [] and status[0]["problems"] == []
    assert list(status[0]["events"]) == CLAUDE_EVENTS
    status = cybmem("hooks", "status", "claude-code").stdout
    assert status == f"Claude Code: not installed ({settings_file()}: no such file)\n"
    done = cybmem("hooks", "install", "claude-code", "--project", str(tmp_path / "nope"))
    assert done.returncode == 2 and "is not a directory" in done.stderr


def test_the_installed_command_runs_from_anywhere_in_a_bare_environment(tmp_path):
    """What Claude Code runs: the command as written, by a shell, in another directory, with a PATH
    that has no venv on it."""
    cybmem("hooks", "install")
    command = json.loads(settings_file().read_text())["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    payload = json.dumps({"hook_event_name": "SessionStart", "session_id": "s1", "cwd": str(tmp_path), "source": "startup"})
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"], "CYBERINE_MEMORY_DIR": os.environ["CYBERINE_MEMORY_DIR"]}
    done = subprocess.run(["/bin/sh", "-c", command], input=payload, capture_output=True, text=True, cwd="/", env=env,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == ""  # no memory yet: nothing to say


def test_every_hooks_command_has_help_with_an_example():
    for args in (["hook"], ["hooks"], ["hooks", "install"], ["hooks", "uninstall"], ["hooks", "status"]):
        done = cybmem(*args, "--help")
        example = " ".join(done.stdout.split()).partition("Example: ")[2]
        assert done.returncode == 0 and "cybmem hook" in example, args
