"""``cybmem hook [CLIENT]``: the one command an agent's lifecycle hooks run (Claude Code's, Codex's).

It reads the hook's JSON payload on stdin and acts by its ``hook_event_name``:

- ``SessionStart``: the project's latest runs and open issues as one-line pointers
  (:func:`cybmem.dispatch.orientation.orientation`, at most 1,200 characters), as
  ``additionalContext``;
- ``UserPromptSubmit``: the MEMORY block for the prompt (what ``cybmem inject --system`` prints), as
  ``additionalContext``; nothing when no run or issue of the project relates to the prompt;
- ``Stop``: the turn that stopped, written as one run (:func:`cybmem.operations.agent_turns.stopped_turn`);
- ``SubagentStop``: the subagent's turn, its parent the turn that started it;
- ``SessionEnd``: the turns that never reached Stop (interrupted, crashed), written from the
  transcript.

A turn is written once, whichever hook sees it first: its run id comes from the session and the
prompt's id, and the write checks for it under the project lock. The hook never fails or stalls
the agent: it exits 0 whatever happens, says what went wrong in one line on stderr (no traceback),
and gives up after ``CYBERINE_HOOK_DEADLINE`` seconds (default 10). A memory root that cannot be
written costs the record, not the session.

This module is the front's argument translation and rendering: each event is one call on the
library handle (:class:`cybmem.memory.Memory`: ``orientation``, ``prompt_block``, ``record_turns``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..memory import Memory

__all__ = ["EVENTS", "Payload", "parse_payload", "handle", "reply", "main", "console"]

#: The events whose answer goes to the model, as ``hookSpecificOutput.additionalContext``.
CONTEXT_EVENTS = ("SessionStart", "UserPromptSubmit")
#: The events that write turns (:meth:`cybmem.memory.Memory.record_turns`).
TURN_EVENTS = ("Stop", "SubagentStop", "SessionEnd")
#: The events the hook acts on (any other is ignored with one line).
EVENTS = CONTEXT_EVENTS + TURN_EVENTS
#: The client's own limit on a hook, in seconds, where it is shorter than any deadline one would set:
#: Codex ends a SessionEnd hook after 3 s, whatever its entry asks. The hook gives up half a second before.
CLIENT_LIMITS = {("codex", "SessionEnd"): 3.0}
#: Set by :func:`console` (a process that runs one hook): the events that read a snapshot import
#: pyarrow.compute the quick way (:func:`cybmem.cli._startup.quick_compute_import`).
_quick_start = False
#: A payload larger than this is not a hook's (Claude Code's are a few hundred bytes; a prompt may be long).
MAX_PAYLOAD = 64 * 1024 * 1024


@dataclass(frozen=True)
class Payload:
    """What a hook's payload says, in the library's terms."""

    event: str
    session_id: str
    cwd: str
    transcript: str | None = None
    key: str | None = None  # the turn's prompt id (Claude Code's prompt_id, Codex's turn_id)
    prompt: str | None = None
    reply: str | None = None  # last_assistant_message
    agent_id: str | None = None
    agent_type: str | None = None
    agent_transcript: str | None = None
    source: str | None = None  # SessionStart: startup, resume, clear, compact


def _say(line: str) -> None:
    """One line on stderr, whatever it holds (never raises)."""
    try:
        os.write(2, ("cybmem hook: " + " ".join(str(line).split())[:1000] + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def parse_payload(raw: bytes) -> Payload:
    """A hook's payload; ValidationError naming what is missing or malformed."""
    from .._io import loads
    from ..errors import ValidationError

    try:
        d = loads(raw)
    except ValueError as exc:
        raise ValidationError(f"the payload on stdin is not JSON ({' '.join(str(exc).split())[:120]}); "
                              "it is the agent that runs `cybmem hook`, with the event's JSON on stdin") from None
    if not isinstance(d, dict):
        raise ValidationError(f"the payload on stdin is a JSON {type(d).__name__}, not an object")

    def text(key: str, *, required: bool = False) -> str | None:
        value = d.get(key)
        if value is None or value == "":
            if required:
                raise ValidationError(f"the payload has no {key}")
            return None
        if not isinstance(value, str):
            raise ValidationError(f"the payload's {key} is a {type(value).__name__}, not a string")
        return value

    event = text("hook_event_name", required=True)
    return Payload(event=event, session_id=text("session_id", required=event in EVENTS) or "",
                   cwd=text("cwd") or os.getcwd(), transcript=text("transcript_path"),
                   key=text("prompt_id") or text("turn_id"), prompt=text("prompt"),
                   reply=text("last_assistant_message"), agent_id=text("agent_id"), agent_type=text("agent_type"),
                   agent_transcript=text("agent_transcript_path"), source=text("source"))


def handle(client: str, p: Payload, memory: "Memory") -> str | None:
    """Act on one event through the handle; the context for the model (SessionStart,
    UserPromptSubmit), else None."""
    memory.check_hook_client(client)
    if p.event == "SessionStart":
        return memory.orientation(cwd=p.cwd)
    if p.event == "UserPromptSubmit":
        inj = memory.prompt_block(p.prompt or "", client=client, session_id=p.session_id, key=p.key, cwd=p.cwd)
        if inj is None:
            return None
        if inj.warnings:
            _say(f"{p.event}: {inj.warnings[0]}" + (f" (and {len(inj.warnings) - 1} more)" if len(inj.warnings) > 1 else ""))
        return inj.block if inj.relates else None  # nothing of the project relates to the prompt: no line at all
    if p.event in TURN_EVENTS:
        for result in memory.record_turns(client, p.event, session_id=p.session_id, cwd=p.cwd,
                                          while_distilling=_distilling, transcript=p.transcript, key=p.key,
                                          reply=p.reply, agent_id=p.agent_id, agent_type=p.agent_type,
                                          agent_transcript=p.agent_transcript):
            if result.warnings:  # an optional layer that fell back: one line
                _say(f"turn recorded as {result.record.runId}; {result.warnings[0]}")
        return None
    _say(f"{p.event}: not an event cybmem acts on ({', '.join(EVENTS)}); nothing done")
    return None


#: Set while a turn's write waits for the distillation model (CYBERINE_MEMORY_MODEL): a deadline then
#: abandons that call, not the record (:func:`_distilling`).
_in_model_call = threading.Event()


@contextlib.contextmanager
def _distilling() -> Iterator[None]:
    """The context of a write's distillation call: a SIGTERM (the agent's own timeout, or this
    hook's deadline) abandons the call, and the record is written with its extractive outcome."""
    from ..cli.signals import sigterm_abandons

    _in_model_call.set()
    try:
        with sigterm_abandons():
            yield
    finally:
        _in_model_call.clear()


def reply(event: str, context: str | None) -> bytes:
    """The hook's stdout: the context for the model as ``hookSpecificOutput`` (Claude Code's and
    Codex's shape), or nothing."""
    if not context or event not in CONTEXT_EVENTS:
        return b""
    import json

    return json.dumps({"hookSpecificOutput": {"hookEventName": event, "additionalContext": context}},
                      ensure_ascii=False).encode("utf-8") + b"\n"


def _deadline(seconds: float, what: list[str]) -> None:
    """End the process, exit code 0, one line on stderr, ``seconds`` from now (daemon timers). A
    write still waiting for the distillation model then would lose its record, so that call is
    abandoned earlier, leaving the write a quarter of the time (at least a second, at most half):
    the record is written with its extractive outcome, and the hook still ends by ``seconds``."""
    grace = min(max(1.0, seconds / 4), seconds / 2)

    def abandon_the_model() -> None:
        if _in_model_call.is_set():  # a slow model: write the record without its answer
            os.kill(os.getpid(), signal.SIGTERM)

    def give_up() -> None:
        hint = ("; a large store's first read builds its cache: `cybmem list` in the project builds it once"
                if what[0] in CONTEXT_EVENTS else "")
        _say(f"{what[0]}: gave up after {seconds:.3g} s (CYBERINE_HOOK_DEADLINE, or the agent's own limit); "
             f"the agent goes on without it{hint}")
        os._exit(0)

    for after, act in ((seconds - grace, abandon_the_model), (seconds, give_up)):
        timer = threading.Timer(after, act)
        timer.daemon = True
        timer.start()


def main(args: list[str]) -> int:
    """Run one hook: the client is ``args[0]`` (default ``claude-code``). Always returns 0."""
    what = ["payload"]
    started = time.monotonic()
    try:
        from ..memory import Memory

        memory = Memory.from_env(lenient=True)
        settings = memory.settings
        _deadline(settings.hooks.deadline, what)
        client = args[0] if args else "claude-code"
        raw = sys.stdin.buffer.read(MAX_PAYLOAD + 1)
        if len(raw) > MAX_PAYLOAD:
            from ..errors import ValidationError

            raise ValidationError(f"the payload on stdin is over {MAX_PAYLOAD // 2**20} MiB: not a hook's")
        payload = parse_payload(raw)
        what[0] = payload.event
        limit = CLIENT_LIMITS.get((client, payload.event))
        if limit is not None and limit - 0.5 < settings.hooks.deadline:
            _deadline(max(limit - 0.5 - (time.monotonic() - started), 0.1), what)
        if payload.event in CONTEXT_EVENTS and _quick_start:
            from ..cli import _startup

            _startup.quick_compute_import()  # these read a snapshot; a turn's write does not
        out = reply(payload.event, handle(client, payload, memory))
        if out:
            sys.stdout.buffer.write(out)
            sys.stdout.buffer.flush()
    except BaseException as exc:  # noqa: BLE001 - the agent never fails by its hook: one line, exit 0
        from ..answers import error_message

        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            _say(f"{what[0]}: interrupted; nothing more done")
        else:
            message = error_message(exc) or f"unexpected {type(exc).__name__}: {exc}"
            cost = {"Stop": "turn not recorded: ", "SubagentStop": "turn not recorded: ", "SessionEnd": "turns not recorded: ",
                    "SessionStart": "no memory given: ", "UserPromptSubmit": "no memory given: "}.get(what[0], "")
            _say(f"{what[0]}: {cost}{message}" if what[0] != "payload" else message)
    return 0


def console(args: list[str]) -> None:
    """The console script's way in for ``cybmem hook``: :func:`main` with the dispatch path's import
    tricks (no pandas, a quick pyarrow.compute: :func:`cybmem.cli._startup.quick_imports`), then out at
    once, exit code 0, without the interpreter's teardown (the agent waits for the process to end)."""
    global _quick_start
    try:
        from ..cli import _startup

        _startup.one_command_process = _quick_start = True
        with _startup.quick_imports(compute=False):
            main(args)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)
