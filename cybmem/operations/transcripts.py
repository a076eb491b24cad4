"""A coding agent's session transcript read into turns: a person's prompt and what the agent did
until it stopped (its reply, the files it edited, the commands it ran, when, how it ended).

Two clients' formats, as their CLIs write them (the pinned versions tests/agent_clients.py drives):

- **Claude Code** (``~/.claude/projects/<dir>/<session>.jsonl``, one JSON object a line): a prompt
  is a ``user`` line carrying ``promptId`` whose content is text (not tool results, not
  ``isMeta``); the lines after it, up to the next prompt, are its turn: ``assistant`` lines (text,
  ``tool_use`` blocks: Edit, Write, MultiEdit, NotebookEdit name files, Bash runs commands), tool
  results, and ``[Request interrupted by user]`` when it was cut short. Hook output, system
  reminders and the client's own context are ``attachment`` lines and ``isMeta`` user lines, never
  part of a prompt. A prompt the client made itself (``promptSource: "system"``: a background
  agent's task notification) is not a person's. A subagent's turn is a transcript of its own
  (``subagents/agent-<id>.jsonl``): its first user line is the task it was given.
- **Codex** (``$CODEX_HOME/sessions/.../rollout-*.jsonl``): a turn runs from ``task_started`` to
  ``task_complete`` (or ``turn_aborted``), both carrying ``turn_id``; the person's prompt is a
  ``user`` message whose content kind is ``user.text`` (the environment and the hooks' context are
  other kinds, or ``developer`` messages); ``function_call`` items run commands (``exec_command``,
  ``shell``) and apply patches (``apply_patch``, whose ``*** Update File:`` lines name files).

Reading is bounded for the hook that fires at a turn's end: :func:`claude_turn` and
:func:`codex_turn` read the transcript from its end back to the turn's prompt only (a 50 MB
transcript costs what its last turn holds), through a memory map, and decode only the lines that
can be messages (the client's request logs, often most of the bytes, are skipped by their head).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from .._io import loads, map_regular, open_regular

__all__ = ["Turn", "claude_turn", "claude_turns", "claude_agent_turn", "codex_turn", "codex_turns",
           "MAX_FILES", "MAX_COMMANDS", "MAX_COMMAND_CHARS"]

#: What a turn keeps of what it did: the first files it edited and commands it ran, each command cut.
MAX_FILES = 100
MAX_COMMANDS = 50
MAX_COMMAND_CHARS = 500

#: Claude Code's tools that edit a file, and the input naming it.
_EDIT_TOOLS = {"Edit": "file_path", "Write": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}
_INTERRUPTED = "[Request interrupted by user"


@dataclass
class Turn:
    """One turn of a session: the prompt and what the agent did until it stopped."""

    session_id: str
    key: str  # the turn's id in its session: Claude Code's promptId, Codex's turn_id, a subagent's agent id
    prompt: str  # what the person typed (or the task a subagent was given)
    started_at: int | None = None  # epoch ms
    ended_at: int | None = None
    reply: str = ""  # the agent's last text
    state: str = "done"  # done, error or cancelled (interrupted, or never finished)
    files: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    cwd: str | None = None
    person: bool = True  # False: a prompt the client made itself (a task notification)
    finished: bool = False  # the agent finished answering (its last reply is in the transcript)

    def did(self, files: list[str], commands: list[str]) -> None:
        """Add files edited and commands run (each once, first seen first, bounded)."""
        for path in files:
            if path and path not in self.files and len(self.files) < MAX_FILES:
                self.files.append(path)
        for command in commands:
            command = command.strip()
            if len(command) > MAX_COMMAND_CHARS:
                command = command[:MAX_COMMAND_CHARS - 1] + "\u2026"
            if command and command not in self.commands and len(self.commands) < MAX_COMMANDS:
                self.commands.append(command)


def _ms(value) -> int | None:
    """Epoch ms of an ISO 8601 time (``2026-12-07T04:14:05.901Z``), epoch seconds or ms; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value * 1000) if value < 10**11 else int(value)
    if isinstance(value, str):
        try:
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            return None
    return None


def _backward(path: str | os.PathLike) -> Iterator[bytes]:
    """The lines of a file, last first (a memory map: only what is read is paged in)."""
    data = map_regular(path, follow=True)
    try:
        end = len(data)
        while end > 0:
            start = data.rfind(b"\n", 0, end - 1) + 1 if end > 1 else 0
            line = data[start:end].rstrip(b"\r\n")
            if line:
                yield line
            end = start
    finally:
        if hasattr(data, "close"):
            data.close()


def _forward(path: str | os.PathLike) -> Iterator[bytes]:
    with open_regular(path, follow=True) as fh:
        for line in fh:
            line = line.rstrip(b"\r\n")
            if line:
                yield line


def _decode(line: bytes) -> dict | None:
    try:
        d = loads(line)
    except ValueError:  # a line being written, or damaged: not a message
        return None
    return d if isinstance(d, dict) else None


def _text(content) -> str:
    """The text of a message's content: a string, or its text blocks (tool blocks left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(c["text"] for c in content if isinstance(c, dict) and c.get("type") in ("text", "input_text", "output_text")
                         and isinstance(c.get("text"), str))
    return ""


# --- Claude Code ------------------------------------------------------------------------------


def _claude_message(line: bytes) -> dict | None:
    """A Claude Code line that may be a message, decoded; None for the rest, most by their head
    (request logs, queue and cost records start with their type; attachments name themselves early)."""
    if line.startswith(b'{"type":"') and not line.startswith((b'{"type":"user"', b'{"type":"assistant"')):
        return None
    if b'"attachment":{' in line[:400]:
        return None
    d = _decode(line)
    return d if d is not None and d.get("type") in ("user", "assistant") else None


def _claude_kind(d: dict) -> str:
    """What a Claude Code message line is: prompt, interrupted, result (tool results), meta or assistant."""
    if d.get("type") == "assistant":
        return "assistant"
    if d.get("isMeta") or d.get("isCompactSummary"):
        return "meta"
    content = (d.get("message") or {}).get("content")
    if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
        return "result"
    text = _text(content)
    if text.startswith(_INTERRUPTED):
        return "interrupted"
    return "prompt" if d.get("promptId") or d.get("parentUuid") is None else "meta"


def _claude_prompt(d: dict, session_id: str, key: str | None = None) -> Turn:
    text = _text((d.get("message") or {}).get("content"))
    origin = d.get("origin") if isinstance(d.get("origin"), dict) else {}
    person = d.get("promptSource") != "system" and origin.get("kind") is None and not text.lstrip().startswith("<task-notification>")
    at = _ms(d.get("timestamp"))
    return Turn(session_id=session_id, key=key or str(d.get("promptId") or d.get("uuid") or ""), prompt=text,
                started_at=at, ended_at=at, cwd=d.get("cwd") if isinstance(d.get("cwd"), str) else None, person=person)


def _claude_follow(turn: Turn, d: dict, kind: str) -> None:
    """Add one line that follows the turn's prompt to the turn."""
    at = _ms(d.get("timestamp"))
    if at is not None:
        turn.ended_at = max(turn.ended_at or at, at)
    if kind == "interrupted":
        turn.state, turn.finished = "cancelled", False
        return
    if kind != "assistant":
        return
    message = d.get("message") or {}
    content = message.get("content") if isinstance(message.get("content"), list) else []
    files, commands = [], []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "tool_use" or not isinstance(block.get("input"), dict):
            continue
        name, args = block.get("name"), block["input"]
        if name in _EDIT_TOOLS and isinstance(args.get(_EDIT_TOOLS[name]), str):
            files.append(args[_EDIT_TOOLS[name]])
        elif name == "Bash" and isinstance(args.get("command"), str):
            commands.append(args["command"])
    turn.did(files, commands)
    text = _text(content)
    if text.strip():
        turn.reply = text
    if d.get("isApiErrorMessage") or message.get("model") == "<synthetic>" and d.get("error"):
        turn.state = "error"
    elif message.get("stop_reason") in ("end_turn", "stop_sequence", "max_tokens"):
        turn.finished = True
        if turn.state != "error":
            turn.state = "done"


def claude_turn(path: str | os.PathLike, prompt_id: str | None, *, session_id: str) -> Turn | None:
    """The turn of ``prompt_id`` in a Claude Code transcript (read from the end back to its prompt;
    None: the last turn); None when the transcript does not hold it."""
    after: list[tuple[dict, str]] = []  # the lines after a prompt, last first
    for line in _backward(path):
        d = _claude_message(line)
        if d is None or d.get("isSidechain"):
            continue
        kind = _claude_kind(d)
        if kind == "prompt":
            if prompt_id is None or d.get("promptId") == prompt_id:
                turn = _claude_prompt(d, session_id)
                for follow, follow_kind in reversed(after):
                    _claude_follow(turn, follow, follow_kind)
                return turn
            after = []  # those lines were a later turn's
            continue
        if kind != "meta":
            after.append((d, kind))
    return None


def claude_turns(path: str | os.PathLike, *, session_id: str) -> list[Turn]:
    """Every turn of a Claude Code transcript, in order (the people's and the client's)."""
    turns: list[Turn] = []
    for line in _forward(path):
        d = _claude_message(line)
        if d is None or d.get("isSidechain"):
            continue
        kind = _claude_kind(d)
        if kind == "prompt" and d.get("promptId") and (not turns or d["promptId"] != turns[-1].key):
            turns.append(_claude_prompt(d, session_id))
        elif turns and kind not in ("meta", "prompt"):
            _claude_follow(turns[-1], d, kind)
    return turns


def claude_agent_turn(path: str | os.PathLike, agent_id: str, *, session_id: str) -> Turn | None:
    """A subagent's turn: its transcript whole (the task it was given, what it did); None when empty."""
    turn: Turn | None = None
    for line in _forward(path):
        d = _claude_message(line)
        if d is None:
            continue
        kind = _claude_kind(d)
        if turn is None:
            if kind == "prompt":
                turn = _claude_prompt(d, session_id, key=agent_id)
        elif kind not in ("meta", "prompt"):
            _claude_follow(turn, d, kind)
    return turn


# --- Codex ------------------------------------------------------------------------------------


def _codex_line(line: bytes) -> dict | None:
    d = _decode(line)
    return d if d is not None and isinstance(d.get("payload"), dict) else None


def _patch_files(patch: str) -> list[str]:
    """The files an apply_patch names (``*** Add File:``, ``*** Update File:``, ``*** Delete File:``)."""
    out = []
    for row in patch.splitlines():
        for head in ("*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: "):
            if row.startswith(head):
                out.append(row[len(head):].strip())
    return out


def _codex_follow(turn: Turn, d: dict) -> None:
    """Add one rollout line of the turn to it."""
    p, kind = d["payload"], d.get("type")
    at = _ms(d.get("timestamp"))
    if at is not None:
        turn.ended_at = max(turn.ended_at or at, at)
    ptype = p.get("type")
    if kind == "response_item" and ptype == "message":
        role = p.get("role")
        meta = p.get("internal_chat_message_metadata_passthrough") or {}
        kinds = meta.get("content_item_kinds") or []
        text = _text(p.get("content"))
        if role == "user" and not turn.prompt and ("user.text" in kinds or not kinds and not text.lstrip().startswith("<")):
            turn.prompt = text
        elif role == "assistant" and text.strip():
            turn.reply = text
    elif kind == "response_item" and ptype in ("function_call", "custom_tool_call", "local_shell_call"):
        name = p.get("name") or ""
        raw = p.get("arguments") if ptype == "function_call" else p.get("input")
        args = raw
        if isinstance(raw, str) and ptype == "function_call":
            try:
                args = loads(raw)
            except ValueError:
                args = {}
        if name == "apply_patch":
            patch = args if isinstance(args, str) else (args.get("input") or args.get("patch") or "") if isinstance(args, dict) else ""
            turn.did(_patch_files(patch) if isinstance(patch, str) else [], [])
        elif isinstance(args, dict):
            command = args.get("cmd") or args.get("command")
            if isinstance(command, list):
                command = " ".join(str(c) for c in command)
            if isinstance(command, str) and "*** Begin Patch" in command:
                turn.did(_patch_files(command), [])  # apply_patch run through the shell: an edit
            elif isinstance(command, str):
                turn.did([], [command])
        if ptype == "local_shell_call" and isinstance((p.get("action") or {}).get("command"), list):
            turn.did([], [" ".join(str(c) for c in p["action"]["command"])])
    elif kind == "event_msg" and ptype == "task_complete":
        turn.finished, turn.state = True, "done"
        if isinstance(p.get("last_agent_message"), str) and p["last_agent_message"].strip():
            turn.reply = p["last_agent_message"]
        done = _ms(p.get("completed_at"))
        if done is not None:
            turn.ended_at = max(turn.ended_at or done, done)
    elif kind == "event_msg" and ptype == "turn_aborted":
        turn.state, turn.finished = "cancelled", False
    elif kind == "event_msg" and ptype == "error":
        turn.state = "error"


def _codex_start(d: dict, session_id: str) -> Turn | None:
    p = d["payload"]
    if d.get("type") != "event_msg" or p.get("type") != "task_started" or not isinstance(p.get("turn_id"), str):
        return None
    at = _ms(d.get("timestamp")) or _ms(p.get("started_at"))
    return Turn(session_id=session_id, key=p["turn_id"], prompt="", started_at=at, ended_at=at, state="cancelled")


def codex_turn(path: str | os.PathLike, turn_id: str | None, *, session_id: str) -> Turn | None:
    """The turn ``turn_id`` of a Codex rollout (read from the end back to its start; None: the last
    turn); None when the rollout does not hold it."""
    after: list[dict] = []
    for line in _backward(path):
        d = _codex_line(line)
        if d is None:
            continue
        start = _codex_start(d, session_id)
        if start is not None:
            if turn_id is None or start.key == turn_id:
                for follow in reversed(after):
                    _codex_follow(start, follow)
                return start
            after = []
            continue
        after.append(d)
    return None


def codex_turns(path: str | os.PathLike, *, session_id: str) -> list[Turn]:
    """Every turn of a Codex rollout, in order."""
    turns: list[Turn] = []
    cwd = None
    for line in _forward(path):
        d = _codex_line(line)
        if d is None:
            continue
        if d.get("type") in ("session_meta", "turn_context") and isinstance(d["payload"].get("cwd"), str):
            cwd = d["payload"]["cwd"]
        start = _codex_start(d, session_id)
        if start is not None:
            start.cwd = cwd
            turns.append(start)
        elif turns:
            _codex_follow(turns[-1], d)
    return turns
