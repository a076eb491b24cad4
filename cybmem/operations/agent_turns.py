"""A coding agent's turn as a run: how the agent hooks (``cybmem hook``) map one turn of a Claude Code
or Codex session onto the run.json shape :func:`cybmem.operations.write.write_run` takes, so that
each turn becomes one record.

- **Task**: the turn's prompt as the person typed it, without ``<private>`` spans, the client's
  system reminders or a MEMORY block (:func:`prompt_text`; the write path strips the block and the
  private spans again, and redacts secrets).
- **Outcome**: from the turn's final reply (the hook's ``last_assistant_message``, else the
  transcript's last assistant text), whose ``ACCOMPLISHED:`` / ``ISSUES:`` / ``NEXT:`` sections
  are read as the outcome trailer, so the issues it names open in the ledger.
- **State, start, end**: from the transcript (the prompt's time, the turn's last line); a turn
  that reached Stop is ``done`` (``error`` when the client recorded an API error), one that never
  did (interrupted, crashed) ``cancelled``.
- **Lineage**: ``chatSessionId`` is the session id (a resumed session's turns share it); a
  subagent's turn has the turn that started it as ``parentRunId``; ``previousRunId`` and
  ``rootRunId`` are filled by the write path as the store format defines them.
- **Files and commands**: the files the turn edited and the commands it ran (the record's
  optional ``files`` and ``commands``).
- **Run id**: :func:`turn_run_id`, derived from the client, the session id and the turn's key (the
  prompt's id), so that whichever hook sees a turn first writes it, and the others find it there.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable

from ..dispatch.preamble import strip
from ..errors import ValidationError
from ..store.private import strip_private
from . import transcripts
from .transcripts import Turn

__all__ = ["CLIENTS", "SESSION_END_TURNS", "TURN_EVENTS", "check_client", "turn_run_id", "prompt_text",
           "is_client_prompt", "turn_run", "stopped_turn", "subagent_turn", "session_turns", "event_runs"]

#: The agents whose hooks cybmem speaks, and the provider of each one's model.
CLIENTS = {"claude-code": "anthropic", "codex": "openai"}
#: Fixed namespace of the turns' run ids (uuid5): the same turn gives the same id in every process.
_TURNS = uuid.UUID("5d0c3a52-7a39-4c8e-9f11-2b1f3c6e0d40")
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def check_client(client: str) -> str:
    """``client`` if cybmem has hooks for it; ValidationError naming the ones it has."""
    if client not in CLIENTS:
        raise ValidationError(f"{client!r} is not an agent cybmem has hooks for; use one of: {', '.join(CLIENTS)}")
    return client


def turn_run_id(client: str, session_id: str, key: str) -> str:
    """The run id of a turn: a UUID derived from the client, the session id and the turn's key (the
    prompt's id; a subagent's agent id), the same whichever hook and process computes it."""
    return str(uuid.uuid5(_TURNS, f"{check_client(client)}\x00{session_id}\x00{key}"))


def prompt_text(text: str) -> str:
    """A prompt as memory keeps it, and searches with: without its ``<private>`` spans, the client's
    ``<system-reminder>`` blocks, a MEMORY block or a workflow's ``TASK:`` wrapper."""
    return strip(_REMINDER.sub("", strip_private(text or ""))).strip()


def is_client_prompt(text: str) -> bool:
    """Whether a prompt is one the client made itself (Claude Code's note that a background agent
    finished), not a person's: no block is built for it, no record written."""
    return (text or "").lstrip().startswith("<task-notification>")


def turn_run(client: str, turn: Turn, *, state: str | None = None, reply: str | None = None, cwd: str | None = None,
             parent_run_id: str | None = None, workflow: str | None = None) -> dict | None:
    """The run.json of a turn (module docstring); None when its prompt keeps nothing (all private)."""
    task = prompt_text(turn.prompt)
    if not task:
        return None
    status = state or turn.state
    output = reply if reply and reply.strip() else turn.reply
    run: dict = {
        "runId": turn_run_id(client, turn.session_id, turn.key),
        "cwd": cwd or turn.cwd,
        "workflowName": workflow or client,
        "task": task,
        "status": status,
        "workers": [{"agentId": client, "provider": CLIENTS[client], "state": status, "output": output}],
        "winnerOutput": output,
        "lineage": {"chatSessionId": turn.session_id, **({"parentRunId": parent_run_id} if parent_run_id else {})},
        "files": list(turn.files),
        "commands": list(turn.commands),
    }
    if turn.started_at is not None:
        run["startedAt"] = turn.started_at
    if turn.ended_at is not None:
        run["endedAt"] = turn.ended_at
    return run


def _read(client: str, transcript: str | os.PathLike, key: str, session_id: str) -> Turn | None:
    if client == "codex":
        return transcripts.codex_turn(transcript, key, session_id=session_id)
    return transcripts.claude_turn(transcript, key, session_id=session_id)


def stopped_turn(client: str, transcript: str | os.PathLike, key: str | None, *, session_id: str,
                 cwd: str | None = None, reply: str | None = None) -> dict | None:
    """The run of the turn that just stopped (the Stop hook): ``key`` is its prompt's id (Claude
    Code's ``prompt_id``, Codex's ``turn_id``; None: the transcript's last turn), ``reply`` the
    hook's ``last_assistant_message``.
    None when the turn is the client's own (a task notification) or keeps nothing.

    Raises:
        NotFoundError: the transcript does not hold the turn; StoreError / OSError: it cannot be read.
    """
    from ..errors import NotFoundError

    turn = _read(check_client(client), transcript, key, session_id)
    if turn is None:
        raise NotFoundError(f"no turn {key or ''} in {transcript}".replace("  ", " "))
    if not turn.person or is_client_prompt(turn.prompt):
        return None
    return turn_run(client, turn, state="error" if turn.state == "error" else "done", reply=reply, cwd=cwd)


def subagent_turn(client: str, transcript: str | os.PathLike, agent_id: str, *, session_id: str,
                  parent_key: str | None, cwd: str | None = None, agent_type: str | None = None,
                  reply: str | None = None) -> dict | None:
    """The run of a subagent's turn (the SubagentStop hook): its own transcript, the task it was
    given, the turn that started it (``parent_key``, that turn's prompt id) as its parent.

    Raises:
        NotFoundError: the subagent's transcript holds no task.
    """
    from ..errors import NotFoundError

    turn = transcripts.claude_agent_turn(transcript, agent_id, session_id=session_id)
    if turn is None:
        raise NotFoundError(f"no task in the subagent transcript {transcript}")
    parent = turn_run_id(client, session_id, parent_key) if parent_key else None
    workflow = f"{client}/{agent_type}" if agent_type else f"{client}/subagent"
    return turn_run(client, turn, state="error" if turn.state == "error" else "done", reply=reply, cwd=cwd,
                    parent_run_id=parent, workflow=workflow)


#: The most turns a session's end writes, newest first: the turns Stop never saw (interrupted,
#: crashed) are the last few; older turns without a record ran before the hooks were installed.
SESSION_END_TURNS = 20


def session_turns(client: str, transcript: str | os.PathLike, *, session_id: str, cwd: str | None = None,
                  written: Callable[[str], bool] = lambda run_id: False) -> list[dict]:
    """The runs a session's end writes (the SessionEnd hook): its people's turns that are not
    ``written`` yet (a run id -> whether its record exists), the :data:`SESSION_END_TURNS` newest of
    them, in the order to write them (oldest first, so that each links the one before), as the
    transcript left them: a turn that never finished (interrupted, crashed) is ``cancelled``."""
    read = transcripts.codex_turns if check_client(client) == "codex" else transcripts.claude_turns
    runs = []
    for turn in read(transcript, session_id=session_id):
        if not turn.person or is_client_prompt(turn.prompt):
            continue
        state = turn.state if turn.state == "error" else "done" if turn.finished else "cancelled"
        run = turn_run(client, turn, state=state, cwd=cwd)
        if run is not None:
            runs.append(run)
    newest = [run for run in reversed(runs) if not written(run["runId"])][:SESSION_END_TURNS]
    return newest[::-1]


#: The hook events that write turns (:func:`event_runs`).
TURN_EVENTS = ("Stop", "SubagentStop", "SessionEnd")


def _given(value: str | None, what: str) -> str:
    if not value:
        raise ValidationError(f"the payload has no {what}")
    return value


def event_runs(client: str, event: str, *, session_id: str, cwd: str | None, written: Callable[[str], bool],
               transcript: str | None = None, key: str | None = None, reply: str | None = None,
               agent_id: str | None = None, agent_type: str | None = None,
               agent_transcript: str | None = None) -> list[dict]:
    """The runs a hook's event writes, in the order to write them: ``Stop`` the turn that stopped,
    ``SubagentStop`` the subagent's turn, ``SessionEnd`` the turns that never reached Stop; none
    for another event, nor for a turn ``written`` already (a run id -> whether its record exists:
    a cheap look before the transcript is read; the write checks again under the project lock).
    The arguments are the payload's (``key``: its prompt or turn id; ``reply``: its
    ``last_assistant_message``).

    Raises:
        ValidationError: the payload lacks what the event needs (its transcript, its agent id).
        NotFoundError / StoreError / OSError: the transcript does not hold the turn, or cannot be read.
    """
    if event == "Stop":
        path = _given(transcript, "transcript_path")
        if key and written(turn_run_id(client, session_id, key)):
            return []
        run = stopped_turn(client, path, key, session_id=session_id, cwd=cwd, reply=reply)
        return [run] if run is not None else []
    if event == "SubagentStop":
        agent = _given(agent_id, "agent_id")
        if written(turn_run_id(client, session_id, agent)):
            return []
        run = subagent_turn(client, _given(agent_transcript, "agent_transcript_path"), agent, session_id=session_id,
                            parent_key=key, cwd=cwd, agent_type=agent_type, reply=reply)
        return [run] if run is not None else []
    if event == "SessionEnd":
        return session_turns(client, _given(transcript, "transcript_path"), session_id=session_id, cwd=cwd,
                             written=written)
    return []
