"""cybmem's hooks in an agent's settings file: install, uninstall, status (``cybmem hooks``).

Where: Claude Code's ``~/.claude/settings.json`` (with a project, ``PROJECT/.claude/settings.json``);
Codex's ``$CODEX_HOME/hooks.json`` (default ``~/.codex/hooks.json``; with a project,
``PROJECT/.codex/hooks.json``). Both hold ``{"hooks": {EVENT: [{"hooks": [{"type": "command",
"command": ..., "timeout": ...}]}]}}``; cybmem adds one group per event it acts on
(:data:`EVENTS`), whose command is the absolute path of the cybmem that installed it and
``hook CLIENT`` (:func:`hook_command`), so that it runs whatever the agent's environment and
working directory.

How the file is changed:

- **Merge.** Every other key, every other event and every hook of the user's own stays where it
  was; a hook is cybmem's when its command runs an executable named ``cybmem`` with ``hook``
  (:func:`is_cybmem_hook`), whichever cybmem put it there (a newer one replaces it).
- **Idempotent.** Installing what is installed changes nothing (not a byte); uninstalling what is
  not installed neither.
- **Atomic, with a backup.** The file is replaced whole (a temp file beside it, renamed over it;
  a settings file that is a symbolic link is written where it points). Before cybmem's hooks go
  into a file that has none, the file as it was is kept beside it (``settings.json.cybmem-backup``;
  empty when there was no file); uninstalling restores those exact bytes when nothing else
  changed meanwhile (else it writes the file without cybmem's hooks, in the file's own indent).
- **Dry run.** :class:`HookChange` holds the bytes before and after; ``diff()`` is the unified diff
  ``--dry-run`` prints, and nothing is written.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_path, loads
from ..errors import ValidationError
from .agent_turns import check_client

__all__ = ["EVENTS", "HOOK_TIMEOUT", "BACKUP_SUFFIX", "HookChange", "HookStatus", "settings_path", "hook_command",
           "is_cybmem_hook", "install", "uninstall", "status"]

#: The events cybmem's hook acts on, per client (Codex runs no hook for a subagent's end).
EVENTS = {
    "claude-code": ("SessionStart", "UserPromptSubmit", "Stop", "SubagentStop", "SessionEnd"),
    "codex": ("SessionStart", "UserPromptSubmit", "Stop", "SessionEnd"),
}
#: Seconds the agent lets the hook run (``timeout`` of each entry); cybmem gives up before, at
#: CYBERINE_HOOK_DEADLINE (Codex's own default for SessionEnd is 1 s: too short for a record).
HOOK_TIMEOUT = 30
BACKUP_SUFFIX = ".cybmem-backup"


def settings_path(client: str, home: Path, codex_home: Path, project: Path | None = None) -> Path:
    """The settings file cybmem's hooks go in for ``client``: the user's, or a project's."""
    if check_client(client) == "claude-code":
        return (Path(project) if project else Path(home)) / ".claude" / "settings.json"
    return (Path(project) / ".codex" if project else Path(codex_home)) / "hooks.json"


def hook_command(executable: str | os.PathLike | list[str], client: str) -> str:
    """The command a hook entry runs: the cybmem executable (its absolute path; or an interpreter
    and its arguments) and ``hook CLIENT``, quoted for a shell."""
    argv = [os.fspath(executable)] if not isinstance(executable, list) else list(executable)
    return shlex.join([*argv, "hook", check_client(client)])


def is_cybmem_hook(command: Any) -> bool:
    """Whether a hook's command is cybmem's: it runs ``cybmem hook`` (an executable named cybmem,
    or ``python -m cybmem.cli``), by whatever path."""
    if not isinstance(command, str):
        return False
    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    if len(argv) >= 2 and os.path.basename(argv[0]) == "cybmem" and argv[1] == "hook":
        return True
    return len(argv) >= 4 and argv[1:4] == ["-m", "cybmem.cli", "hook"]


def _entry(command: str) -> dict:
    return {"type": "command", "command": command, "timeout": HOOK_TIMEOUT}


@dataclass
class HookChange:
    """What installing or uninstalling does to one settings file (or would, with a dry run)."""

    client: str
    path: Path  # the file written (a symbolic link's target)
    before: bytes | None  # None: there was no file
    after: bytes | None  # None: there is no file after
    command: str | None = None
    events: list[str] = field(default_factory=list)  # the events cybmem's hook is on, after
    backup: Path | None = None  # where the file as it was is kept
    written: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. Codex's trust of the hooks

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        """The change as a unified diff ("" when there is none)."""
        def lines(data: bytes | None) -> list[str]:
            return data.decode("utf-8", "replace").splitlines(keepends=True) if data else []

        out = difflib.unified_diff(lines(self.before), lines(self.after), fromfile=f"{self.path} (before)",
                                   tofile=f"{self.path} (after)")
        return "".join(line if line.endswith("\n") else line + "\n" for line in out)

    def to_dict(self) -> dict:
        return {"client": self.client, "path": str(self.path), "changed": self.changed, "written": self.written,
                "command": self.command, "events": self.events, "backup": str(self.backup) if self.backup else None,
                "notes": self.notes}


def _target(path: Path) -> Path:
    """The file a settings path names (a symbolic link's target: dotfiles are often links)."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def _read(path: Path) -> tuple[bytes | None, dict]:
    """The file's bytes (None: absent) and its JSON object; ValidationError saying how to fix it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, {}
    except OSError as exc:
        raise ValidationError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not raw.strip():
        return raw, {}
    try:
        data = loads(raw)
    except ValueError as exc:
        raise ValidationError(f"{path} is not valid JSON ({' '.join(str(exc).split())[:120]}); fix it (or move it "
                              "away), then run this again: cybmem changes only a file it can read whole") from None
    if not isinstance(data, dict):
        raise ValidationError(f"{path} holds a JSON {type(data).__name__}, not an object; fix it, then run this again")
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise ValidationError(f"{path}: \"hooks\" is a {type(hooks).__name__}, not an object; fix it, then run this again")
    for event, groups in (hooks or {}).items():
        if not isinstance(groups, list):
            raise ValidationError(f"{path}: hooks.{event} is a {type(groups).__name__}, not a list; fix it, then run this again")
    return raw, data


def _indent(raw: bytes | None) -> int:
    """The indent of a JSON file's nesting (2 when it shows none)."""
    for line in (raw or b"").decode("utf-8", "replace").splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
    return 2


def _dump(data: Mapping, like: bytes | None) -> bytes:
    return (json.dumps(data, indent=_indent(like), ensure_ascii=False) + "\n").encode("utf-8")


def _groups_of(data: dict, event: str) -> list:
    return (data.get("hooks") or {}).get(event) or []


def _has_ours(data: Mapping) -> bool:
    return any(is_cybmem_hook(h.get("command")) for groups in (data.get("hooks") or {}).values() for g in groups
               if isinstance(g, dict) for h in (g.get("hooks") or []) if isinstance(h, dict))


def _without_ours(data: dict) -> dict:
    """``data`` with every cybmem hook taken out (a group left empty goes, an event left empty goes,
    a ``hooks`` left empty goes)."""
    out = json.loads(json.dumps(data))  # a deep copy that keeps the key order
    hooks = out.get("hooks")
    if not isinstance(hooks, dict):
        return out
    for event in list(hooks):
        kept = []
        for group in hooks[event]:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                mine = [h for h in group["hooks"] if isinstance(h, dict) and is_cybmem_hook(h.get("command"))]
                if mine:
                    rest = [h for h in group["hooks"] if h not in mine]
                    if not rest:
                        continue
                    group = {**group, "hooks": rest}
            kept.append(group)
        if kept:
            hooks[event] = kept
        else:
            del hooks[event]
    if not hooks:
        del out["hooks"]
    return out


def _installed(data: Mapping, event: str, command: str) -> bool:
    """Whether ``event`` holds exactly cybmem's entry for ``command``, and no other cybmem hook."""
    ours = [h for g in _groups_of(data, event) if isinstance(g, dict) for h in (g.get("hooks") or [])
            if isinstance(h, dict) and is_cybmem_hook(h.get("command"))]
    return ours == [_entry(command)]


def _write(change: HookChange, backup: bytes | None) -> None:
    path = change.path
    path.parent.mkdir(parents=True, exist_ok=True)
    if backup is not None:
        bak = path.with_name(path.name + BACKUP_SUFFIX)
        with atomic_path(bak, private=False) as tmp:
            tmp.write_bytes(backup)
        change.backup = bak
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    if change.after is None:
        path.unlink(missing_ok=True)
    else:
        with atomic_path(path, private=False) as tmp:
            tmp.write_bytes(change.after)
        if mode is not None:
            os.chmod(path, mode)
    change.written = True


def install(client: str, path: Path, command: str, *, dry_run: bool = False) -> HookChange:
    """Put cybmem's hook (``command``) on each of the client's :data:`EVENTS` in the settings file at
    ``path`` (module docstring: merge, idempotent, atomic, backup); with ``dry_run`` nothing is written.

    Raises:
        ValidationError: the file is not a JSON object with ``hooks`` an object of lists (nothing is written).
    """
    check_client(client)
    target = _target(path)
    before, data = _read(target)
    events = list(EVENTS[client])
    if all(_installed(data, e, command) for e in events):
        return HookChange(client, target, before, before, command=command, events=events)
    new = _without_ours(data)
    hooks = new.setdefault("hooks", {})
    for event in events:
        hooks.setdefault(event, []).append({"hooks": [_entry(command)]})
    change = HookChange(client, target, before, _dump(new, before), command=command, events=events)
    if not dry_run:
        # The file as it was before cybmem's hooks first went in (empty: there was none): what uninstall restores.
        _write(change, backup=None if _has_ours(data) else (before or b""))
    return change


def uninstall(client: str, path: Path, *, dry_run: bool = False) -> HookChange:
    """Take cybmem's hooks out of the settings file at ``path``, and only them (module docstring).

    Raises:
        ValidationError: the file is not a JSON object with ``hooks`` an object of lists.
    """
    check_client(client)
    target = _target(path)
    before, data = _read(target)
    bak = target.with_name(target.name + BACKUP_SUFFIX)
    if not _has_ours(data):
        return HookChange(client, target, before, before)
    new = _without_ours(data)
    after = _dump(new, before)
    kept = None
    if bak.is_file():
        kept = bak.read_bytes()
        try:
            pristine = loads(kept) if kept.strip() else {}
        except ValueError:
            pristine = None
        if pristine == new:  # nothing else changed since: the exact bytes come back (no file, if there was none)
            after = kept if kept else None
    change = HookChange(client, target, before, after, backup=bak if kept is not None else None)
    if not dry_run:
        _write(change, backup=None)
        if kept is not None and (after is None or after == kept):
            bak.unlink(missing_ok=True)
    return change


@dataclass
class HookStatus:
    """What of cybmem's hooks one settings file holds."""

    client: str
    path: Path
    exists: bool
    events: dict[str, str] = field(default_factory=dict)  # event -> the command of cybmem's hook on it
    missing: list[str] = field(default_factory=list)  # events cybmem acts on that have no hook of it
    problems: list[str] = field(default_factory=list)  # a command that cannot run, a file that cannot be read
    trust: dict[str, str] = field(default_factory=dict)  # Codex: event -> trusted / untrusted / modified

    @property
    def installed(self) -> bool:
        return bool(self.events)

    def to_dict(self) -> dict:
        return {"client": self.client, "path": str(self.path), "exists": self.exists, "installed": self.installed,
                "events": self.events, "missing": self.missing, "problems": self.problems,
                **({"trust": self.trust} if self.trust else {})}


def status(client: str, path: Path) -> HookStatus:
    """Which of the client's events the settings file at ``path`` gives cybmem's hook, with what
    command, and whether that command can run (its executable is there)."""
    check_client(client)
    target = _target(path)
    st = HookStatus(client, target, exists=target.exists())
    try:
        _, data = _read(target)
    except ValidationError as exc:
        st.problems.append(str(exc))
        return st
    for event in EVENTS[client]:
        ours = [h["command"] for g in _groups_of(data, event) if isinstance(g, dict) for h in (g.get("hooks") or [])
                if isinstance(h, dict) and is_cybmem_hook(h.get("command"))]
        if ours:
            st.events[event] = ours[0]
        else:
            st.missing.append(event)
    for command in dict.fromkeys(st.events.values()):
        exe = shlex.split(command)[0]
        if not (os.path.isabs(exe) and os.access(exe, os.X_OK)) and shutil.which(exe) is None:
            st.problems.append(f"{exe} cannot run (moved, or its environment removed); run `cybmem hooks install "
                               f"{client}` again with the cybmem you use")
    return st
