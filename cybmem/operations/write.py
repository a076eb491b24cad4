"""The write path: an orchestrator's run (run.json or a hook payload) -> one episodic record; and
the corrections written after it: a record that supersedes another, an issue marked.

Accepted run shape (see USAGE.md, "The run.json shape"): a JSON object with the
run's id, cwd, workflow, task, state, times, workers (with their final
answers), an optional judge verdict and optional lineage. Field names of the
TypeScript orchestrator and a few common aliases are accepted; anything
missing that is optional is defaulted, extra fields are ignored.

Two optional layers (seeds W4), both best effort and off unless configured:
distillation (``CYBERINE_MEMORY_MODEL``: one chat call refines the NEW record's outcome
before it is written, ADD-only) and embeddings (``CYBERINE_MEMORY_EMBEDDINGS``: the written
record's text is embedded and appended to embeddings.jsonl). A failure of either keeps the
record as the extractive path makes it and adds one line to ``WriteResult.warnings``.

Distillation never holds the record. The outcome lives in the record and a record is never
rewritten (store-format.md), so the distilled part cannot be added after the record is
written; instead the write goes on without it: the call has a wall-clock deadline
(``CYBERINE_MEMORY_MODEL_TIMEOUT``, the whole exchange, kept whatever the server sends), and the
caller may wrap it in a context of its own (``while_distilling``) that abandons it: the CLI's turns
a SIGTERM (a hook's timeout) into a record written with its extractive outcome a moment later
instead of a lost run (:func:`cybmem.cli.signals.sigterm_abandons`). This module installs no
signal handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import loads, read_file
from ..store.embeddings import embedding_text, issue_text, record_text
from ..errors import CybmemError, NotFoundError, StoreError, ValidationError
from ..store.display import shorten
from ..store.outcome import extractive_summary, issue_slug, parse_trailer, split_issue
from ..dispatch.preamble import strip, strip_memory
from ..store.projects import abs_cwd, known_projects, lookup_slug, owning_dir, project_cwd, select_project
from ..store.private import private_value, strip_private
from ..store.secrets import redact_value
from ..store.records import IssueEvent, Lineage, MemoryRecord, Outcome, Worker, iso_to_ms, validate_chat_id, validate_run_id
from ..settings import Settings
from ..store.memory_store import MemoryStore

__all__ = ["RunInput", "parse_run", "read_run_file", "load_run_payload", "build_record", "write_run", "WriteResult",
           "supersede_run", "IssueMark", "mark_issue", "MAX_RUN_BYTES", "MAX_RUN_ISSUES", "ISSUE_TITLE_MAX",
           "ISSUE_DETAIL_MAX"]

MAX_RUN_BYTES = 256 * 1024 * 1024
#: The issues one run opens at most (its trailer's, then a distilled outcome's, first seen first). A
#: run raises a few; one that listed 50,000 put as many events in the ledger and a 2 MB line on the
#: terminal. The rest are left out, and the write says how many (USAGE.md, "Guarantees").
MAX_RUN_ISSUES = 50
#: An opened issue's title and detail as the ledger keeps them, cut on a word to these many characters
#: (ending in "…"); the id is derived from the whole title first (store-format.md, "The issue id, exactly").
ISSUE_TITLE_MAX = 300
ISSUE_DETAIL_MAX = 2000

_STATE_ALIASES = {
    "done": "done", "completed": "done", "complete": "done", "success": "done", "succeeded": "done",
    "ok": "done", "passed": "done",
    "error": "error", "failed": "error", "failure": "error", "errored": "error", "crashed": "error",
    "timeout": "error", "timed_out": "error",
    "cancelled": "cancelled", "canceled": "cancelled", "aborted": "cancelled", "killed": "cancelled",
    "stopped": "cancelled", "interrupted": "cancelled",
}
_RESOLVE_VERB = re.compile(r"^\s*(?:resolved|resolves|fixed|fixes|fix|closed|closes|close)\b[:\s#]*", re.I)


@dataclass
class RunInput:
    """The parts of an orchestrator run that a record is made of."""

    run_id: str | None
    cwd: str | None
    workflow_name: str
    task: str
    state: str
    started_at: int | None
    ended_at: int | None
    workers: list[dict] = field(default_factory=list)
    winner_output: str | None = None
    verdict: str | None = None
    lineage: dict = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # the files the run edited (an agent's turn)
    commands: list[str] = field(default_factory=list)  # the commands it ran


def _ms(value: Any, where: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValidationError(f"{where}: expected epoch milliseconds or an ISO date, got a boolean")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            raise ValidationError(f"{where}: {value!r} is not a timestamp")
        # Seconds are a common slip; epoch ms are 13 digits today.
        return int(value * 1000) if value < 10**11 else int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return _ms(int(text), where)
        try:
            return iso_to_ms(text)
        except ValueError:
            raise ValidationError(f"{where}: {value!r} is neither epoch milliseconds nor an ISO date") from None
    raise ValidationError(f"{where}: expected epoch milliseconds or an ISO date, got {type(value).__name__}")


def _text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        for key in ("prompt", "text", "content", "description", "task"):
            if isinstance(value.get(key), str):
                return value[key]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise ValidationError(f"{where}: expected text, got {type(value).__name__}")


def _first(d: Mapping, *keys: str) -> Any:
    for key in keys:
        if key in d and d[key] is not None:
            return d[key]
    return None


def _worker_output(w: Mapping) -> str | None:
    value = _first(w, "output", "finalText", "finalAnswer", "answer", "text", "result")
    try:
        return _text(value, "worker output")
    except ValidationError:
        return None


def _workers(run: Mapping) -> tuple[list[dict], dict | None]:
    """All workers (from run.workers and steps[].workers) and the verdict object, if any."""
    workers: list[dict] = []
    verdict = run.get("verdict") if isinstance(run.get("verdict"), Mapping) else None
    raw = run.get("workers")
    if raw is not None and not isinstance(raw, list):
        raise ValidationError(f"workers: expected a list, got {type(raw).__name__}")
    workers.extend(w for w in raw or [] if isinstance(w, Mapping))
    steps = run.get("steps")
    if steps is not None and not isinstance(steps, list):
        raise ValidationError(f"steps: expected a list, got {type(steps).__name__}")
    for step in steps or []:
        if not isinstance(step, Mapping):
            continue
        if isinstance(step.get("workers"), list):
            workers.extend(w for w in step["workers"] if isinstance(w, Mapping))
        if isinstance(step.get("verdict"), Mapping):
            verdict = step["verdict"]  # the last judged step decides
    return workers, verdict


def _str_list(run: Mapping, key: str) -> list[str]:
    """An optional list of strings (``files``, ``commands``); ValidationError names the field."""
    value = run.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(f"{key}: expected a list of strings, got {type(value).__name__}")
    return list(dict.fromkeys(v for v in value if v.strip()))


def parse_run(run: Any) -> RunInput:
    """Validate an orchestrator run object; ValidationError names the field at fault."""
    if not isinstance(run, Mapping):
        raise ValidationError(f"run: expected a JSON object, got {type(run).__name__}")
    task = _text(_first(run, "task", "prompt", "taskPrompt"), "task")
    if task is None or not task.strip():
        raise ValidationError("task: required field is missing or empty (the run's task prompt)")
    raw_state = _first(run, "state", "status")
    if raw_state is None:
        raise ValidationError("state: required field is missing (done, error or cancelled)")
    if not isinstance(raw_state, str) or raw_state.strip().lower() not in _STATE_ALIASES:
        raise ValidationError(f"state: {raw_state!r} is not a final state; use done, error or cancelled")
    workflow = _first(run, "workflowName", "workflow")
    if isinstance(workflow, Mapping):
        workflow = workflow.get("name")
    if workflow is not None and not isinstance(workflow, str):
        raise ValidationError(f"workflowName: expected a string, got {type(workflow).__name__}")
    run_id = _first(run, "runId", "id")
    if run_id is not None:
        validate_run_id(run_id, "runId")
    cwd = _first(run, "cwd", "workdir", "projectDir")
    if cwd is not None and not isinstance(cwd, str):
        raise ValidationError(f"cwd: expected a path string, got {type(cwd).__name__}")
    lineage = run.get("lineage") or {}
    if not isinstance(lineage, Mapping):
        raise ValidationError(f"lineage: expected an object, got {type(lineage).__name__}")
    workers, verdict_obj = _workers(run)
    verdict = _first(run, "verdictSummary")
    winner = None
    if verdict_obj is not None:
        verdict = verdict if verdict is not None else _first(verdict_obj, "summary", "reason", "verdict")
        winner = _first(verdict_obj, "winner", "winnerAgentId", "winnerId")
    if verdict is not None and not isinstance(verdict, str):
        raise ValidationError(f"verdictSummary: expected a string, got {type(verdict).__name__}")
    winner_output = _text(_first(run, "winnerOutput", "finalOutput", "output"), "winnerOutput")
    if winner_output is None:
        chosen = [w for w in workers if winner is not None and _first(w, "agentId", "id") == winner]
        if not chosen:
            chosen = [w for w in workers if str(_first(w, "state", "status") or "").lower() in ("done", "completed")]
        chosen = chosen or workers
        for w in reversed(chosen):
            out = _worker_output(w)
            if out:
                winner_output = out
                break
    ended = _ms(_first(run, "endedAt", "finishedAt", "completedAt", "updatedAt"), "endedAt")
    started = _ms(_first(run, "startedAt", "createdAt"), "startedAt")
    return RunInput(
        run_id=run_id,
        cwd=cwd,
        workflow_name=workflow or "unknown",
        task=task,
        state=_STATE_ALIASES[raw_state.strip().lower()],
        started_at=started,
        ended_at=ended,
        workers=workers,
        winner_output=winner_output,
        verdict=" ".join(verdict.split()) if verdict else None,
        lineage={k: v for k, v in lineage.items() if isinstance(v, str) and v},
        files=_str_list(run, "files"),
        commands=_str_list(run, "commands"),
    )


def read_run_file(path: str | os.PathLike) -> bytes:
    """The bytes of a run.json (regular files only, at most MAX_RUN_BYTES)."""
    try:
        return read_file(path, limit=MAX_RUN_BYTES)
    except FileNotFoundError:
        raise ValidationError(f"{path}: no such file") from None
    except StoreError as exc:
        raise ValidationError(str(exc)) from None


def load_run_payload(data: bytes | str) -> Any:
    """Decode a run.json file or a hook payload (``{"run": {...}}`` or ``{"runPath": "..."}``)."""
    try:
        payload = loads(data)
    except ValueError as exc:
        raise ValidationError(f"input is not valid JSON: {exc}") from None
    if isinstance(payload, Mapping):
        if isinstance(payload.get("run"), Mapping):
            return payload["run"]
        path = _first(payload, "runPath", "run_path", "runJson")
        if isinstance(path, str):
            return load_run_payload(read_run_file(path))
    return payload


def _worker_state(w: Mapping) -> str:
    raw = _first(w, "state", "status")
    return str(raw) if raw is not None else "unknown"


@dataclass
class WriteResult:
    """What a write did: the record, the events appended, the path, the secret kinds redacted."""

    record: MemoryRecord
    events: list[IssueEvent]
    path: Path
    redacted: list[str]
    store: MemoryStore
    notes: list[str] = field(default_factory=list)  # one line per optional layer that fell back
    distilled: bool = False  # the outcome was refined by CYBERINE_MEMORY_MODEL
    embedded: bool = False  # a vector was appended to embeddings.jsonl
    supersedes: str | None = None  # the run the record corrects (:func:`supersede_run`)

    @property
    def warnings(self) -> list[str]:
        """What went wrong without failing the write (e.g. the derived index not updated, an
        optional layer that fell back: distillation, embeddings)."""
        return [p.message for p in self.store.problems] + self.notes

    def to_dict(self) -> dict:
        return {
            "runId": self.record.runId,
            "project": self.store.slug,
            "path": str(self.path),
            "events": [e.to_dict() for e in self.events],
            "redacted": self.redacted,
            "distilled": self.distilled,
            "embedded": self.embedded,
            "warnings": self.warnings,
            **({"supersedes": self.supersedes} if self.supersedes else {}),
        }


def build_record(
    run: RunInput,
    store: MemoryStore,
    settings: Settings,
    *,
    run_id: str | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    cwd: str | None = None,
    now_ms: int | None = None,
) -> tuple[MemoryRecord, list[IssueEvent], list[str]]:
    """Make the record and its issue events; returns (record, events, redacted secret kinds).

    Lineage precedence: explicit arguments, then the run's own lineage block, then
    CYBERINE_RUN_ID / CYBERINE_PARENT_RUN_ID / CYBERINE_CHAT_SESSION_ID.
    """
    found: set[str] = set()
    # What a person marked <private> is never stored (cybmem.store.private), whatever the switches.
    run = dataclasses.replace(
        run, task=strip_private(run.task), winner_output=private_value(run.winner_output),
        verdict=private_value(run.verdict), workers=private_value(run.workers), files=private_value(run.files),
        commands=private_value(run.commands))
    if settings.redact_secrets:
        # The one pass, over every text of the run whole, before anything below strips, extracts
        # or cuts it. Run ids are validated, not redacted; a chat session id is free text.
        run = dataclasses.replace(
            run, task=redact_value(run.task, found)[0], workflow_name=redact_value(run.workflow_name, found)[0],
            winner_output=redact_value(run.winner_output, found)[0], verdict=redact_value(run.verdict, found)[0],
            workers=redact_value(run.workers, found)[0], files=redact_value(run.files, found)[0],
            commands=redact_value(run.commands, found)[0],
            lineage={**run.lineage, **({"chatSessionId": redact_value(run.lineage["chatSessionId"], found)[0]}
                                       if isinstance(run.lineage.get("chatSessionId"), str) else {})})
        chat_session_id = redact_value(chat_session_id, found)[0]
    rid = run_id or run.run_id or settings.run_id
    if not rid:
        raise ValidationError("runId: missing; put \"runId\" in run.json, pass --run-id or set CYBERINE_RUN_ID")
    validate_run_id(rid, "runId")
    ended = run.ended_at or now_ms or int(time.time() * 1000)
    started = run.started_at if run.started_at is not None else ended
    if started > ended:
        raise ValidationError(f"startedAt ({started}) is after endedAt ({ended})")
    parent = parent_run_id or run.lineage.get("parentRunId") or settings.parent_run_id
    chat = chat_session_id or run.lineage.get("chatSessionId") or settings.chat_session_id
    if chat and settings.redact_secrets:
        chat = redact_value(chat, found)[0]
    if chat:
        validate_chat_id(chat)
    if parent:
        validate_run_id(parent, "parentRunId")
    previous = run.lineage.get("previousRunId") or store.latest_run_id(before_ms=started, exclude=rid)
    root = run.lineage.get("rootRunId")
    if not root and parent:
        try:
            root = store.read_record(parent).lineage.rootRunId or parent
        except (NotFoundError, ValidationError, StoreError):  # the parent may live in another project or not be written yet
            root = parent
    root = root or rid

    # What was dispatched, less its MEMORY block and wrapper: "" when that was all it held (the
    # block is never stored as the task). A worker that echoed its prompt echoed the block too.
    task = strip(run.task).strip()
    output = strip_memory(run.winner_output or "")
    trailer = parse_trailer(output)
    events: list[IssueEvent] = []
    issue_ids: dict[str, None] = {}  # in order; a dict, so that a trailer of 50,000 items is not 50,000 list scans
    for item in trailer.issues:
        title, detail = split_issue(item)
        iid = issue_slug(title)
        if iid not in issue_ids:
            issue_ids[iid] = None
            events.append(IssueEvent(issueId=iid, at=ended, event="opened", byRunId=rid, title=title, detail=detail or None))
    accomplished = list(trailer.accomplished)
    # "resolved flaky-login-test" / "fixed: Flaky login test" closes an open issue: the ids an
    # item can name, then the state of just those (a long ledger is not folded whole).
    named: list[set[str]] = []
    for item in accomplished:
        m = _RESOLVE_VERB.match(item)
        if m:
            rest = item[m.end():]
            named.append({issue_slug(rest), issue_slug(split_issue(rest)[0]), *re.split(r"[\s,;]+", rest)})
    open_now = {k: v for k, v in store.issue_states_for(set().union(*named)).items() if v.is_open} if named else {}
    for candidates in named:
        for iid in sorted(candidates & open_now.keys()):
            if iid not in issue_ids:
                events.append(IssueEvent(issueId=iid, at=ended, event="resolved", byRunId=rid, title=open_now[iid].title))
    verdict = strip_memory(run.verdict) if run.verdict else run.verdict
    summary = extractive_summary(task, run.state, verdict, output)
    rec = MemoryRecord(
        runId=rid,
        cwd=os.path.abspath(cwd or run.cwd or os.getcwd()),
        workflowName=run.workflow_name,
        task=task,
        state=run.state,
        startedAt=started,
        endedAt=ended,
        lineage=Lineage(parentRunId=parent, chatSessionId=chat, previousRunId=previous, rootRunId=root),
        outcome=Outcome(
            summary=summary,
            accomplished=accomplished,
            issues=list(issue_ids),
            next=list(trailer.next),
        ),
        workers=[
            Worker(agentId=str(_first(w, "agentId", "id", "name") or f"worker-{i + 1}"), state=_worker_state(w),
                   provider=str(w["provider"]) if w.get("provider") is not None else None)
            for i, w in enumerate(run.workers)
        ],
        verdictSummary=verdict,
        files=[f for f in run.files if f.strip()],
        commands=[c for c in run.commands if c.strip()],
    )
    return rec, events, sorted(found)


def write_run(
    run_obj: Any,
    settings: Settings,
    *,
    cwd: str | None = None,
    project: str | None = None,
    run_id: str | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    supersedes: str | None = None,
    while_distilling: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> WriteResult:
    """Build the record of an orchestrator run and write it to its project's store.

    Everything is validated before anything touches the disk, so bad input leaves
    nothing behind. With CYBERINE_MEMORY_MODEL set the outcome is distilled first
    (:func:`_distill_into`); with CYBERINE_MEMORY_EMBEDDINGS set the written record is embedded
    (:func:`_embed_written`). Neither can fail the write: a fallback is one line in ``warnings``.

    ``while_distilling``: a context the model call runs in; a CybmemError raised inside it
    abandons the call and keeps the extractive outcome (the CLI passes
    :func:`cybmem.cli.signals.sigterm_abandons`). No signal handler is installed here.
    """
    run = parse_run(run_obj)
    root = settings.memory_dir
    given = cwd or run.cwd or os.getcwd()
    # Work out the project without registering it: bad input must leave nothing behind.
    known = known_projects(root)
    slug = select_project(root, project=project, create=True, known=known) if project else lookup_slug(known, given)
    store = MemoryStore(root, slug, index_cap=settings.index_cap)
    # A record's cwd names its project (`show` prints it as such, a lost projects.json is backfilled
    # from it): the directory the project is registered with, whichever directory the run was in.
    home = project_cwd(root, slug, known)
    record_cwd = home or abs_cwd(given)
    notes: list[str] = []
    if project and home and (cwd or run.cwd) and owning_dir({slug: {"cwd": home}}, abs_cwd(cwd or run.cwd)) is None:
        notes.append(f"the run's cwd {abs_cwd(cwd or run.cwd)} is not in project {slug}; filed there as --project "
                     f"asks, with the project's cwd {home}")
    old_id = None
    if supersedes:
        # A correction takes the place of the run it corrects: same lineage unless it says otherwise.
        old_id = store.resolve_run_id(supersedes)
        old = store.read_record(old_id)
        run.lineage = {**{k: v for k, v in old.lineage.to_dict().items() if isinstance(v, str) and v}, **run.lineage}
    rec, events, redacted = build_record(
        run, store, settings, run_id=run_id, parent_run_id=parent_run_id,
        chat_session_id=chat_session_id, cwd=record_cwd,
    )
    warnings: list[str] = notes
    distilled = _distill_into(rec, events, run, settings, redacted, warnings, while_distilling)
    _bound_issues(rec, events, warnings)
    MemoryStore.validate_write(rec, events)  # before anything is registered: bad input leaves nothing behind
    if not project:
        # Register the project now that the input is valid; the same store object carries on, so
        # what build_record read of its records (an index.json rebuilt in memory) is not read again.
        registered = select_project(root, cwd=given, create=True)
        if registered != slug:
            store = MemoryStore(root, registered, index_cap=settings.index_cap)
    since = _size(store.embeddings_path)  # no line for this new record can predate it
    path, written = store.commit(rec, events, corrects=old_id)
    if old_id is None:  # a correction is no new run: it was shown nothing
        _note_used(store, rec, written, run, settings, warnings)
    embedded = _embed_written(store, rec, settings, since, warnings)
    _retune_if_grown(store, settings)
    return WriteResult(record=rec, events=written, path=path, redacted=redacted, store=store, notes=warnings,
                       distilled=distilled, embedded=embedded, supersedes=old_id)


def supersede_run(store: MemoryStore, old_run_id: str, run_obj: Any, settings: Settings, *, cwd: str | None = None,
                  run_id: str | None = None,
                  while_distilling: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
                  ) -> WriteResult:
    """Correct a record of ``store``: write ``run_obj`` (the corrected run, with a new run id) as
    a record that supersedes ``old_run_id`` (an id or a unique prefix), which gains supersededBy
    (``cybmem supersede``, the MCP supersede tool).

    Raises:
        NotFoundError / AmbiguousError: no record, or several, match ``old_run_id`` (before the
            run is read); what :func:`write_run` raises.
    """
    old = store.resolve_run_id(old_run_id)
    return write_run(run_obj, settings, cwd=cwd, project=store.slug, run_id=run_id, supersedes=old,
                     while_distilling=while_distilling)


@dataclass
class IssueMark:
    """What marking an issue did: its state before and after, the ledger events appended."""

    project: str
    issue_id: str
    before: str
    after: str
    written: list[IssueEvent]

    def to_dict(self) -> dict:
        return {"project": self.project, "issueId": self.issue_id, "before": self.before, "after": self.after,
                "written": [e.to_dict() for e in self.written]}


def mark_issue(store: MemoryStore, issue_id: str, event: str, settings: Settings, *, by: str | None = None,
               detail: str | None = None) -> IssueMark:
    """Append a state change (resolved, wontfix or reopened) of an issue to the ledger, by run
    ``by`` (default: CYBERINE_RUN_ID), ``detail`` redacted unless CYBERINE_MEMORY_REDACT=0
    (``cybmem mark``, the MCP mark_issue tool); nothing is appended when it is already so.

    Raises:
        ValidationError: an event that is none of those; NotFoundError: no such issue.
    """
    before = store.issue_states_for([issue_id]).get(issue_id)
    written = store.mark_issue(issue_id, event, by=by or settings.run_id, detail=detail,
                               redact_secrets=settings.redact_secrets)
    if written or before is None:
        return IssueMark(store.slug, issue_id, before.state if before else event, event, written)
    # Nothing appended: the issue was found so under the lock (another writer may have got there
    # first since it was read above), and it is so now.
    now = store.issue_states_for([issue_id]).get(issue_id, before).state
    return IssueMark(store.slug, issue_id, now, now, written)


def _note_used(store: MemoryStore, rec: MemoryRecord, written: list[IssueEvent], run: RunInput, settings: Settings,
               warnings: list[str]) -> None:
    """What the run used of what memory showed it (cybmem.store.feedback_match.note_used: the runs its output
    names, those it fetched, the issues it resolved), noted in used.jsonl; the write never fails by it."""
    from ..dispatch import feedback
    from ..store.feedback_log import SHOWN_FILE, USED_FILE
    from ..store.feedback_match import note_used

    if not feedback.enabled(settings) or not (store.dir / SHOWN_FILE).exists():
        return
    try:
        o = rec.outcome
        # What the run said, not what it was asked: the task (and the summary made from it) may name runs too.
        text = "\n".join([strip_memory(run.winner_output or ""), run.verdict or "", *o.accomplished, *o.next])
        note_used(store, settings, run_id=rec.runId, task_hashed=feedback.task_hash(run.task),
                  started_at=rec.startedAt, ended_at=rec.endedAt, text=text,
                  issue_events=[(e.issueId, e.event) for e in written], warnings=warnings)
    except Exception as exc:  # noqa: BLE001 - an optional layer never fails the write
        message = _one_line(exc) if isinstance(exc, (CybmemError, OSError)) else f"unexpected {type(exc).__name__}: {_one_line(exc)}"
        warnings.append(f"what the run used was not noted in {store.dir / USED_FILE}: {message}")


def _retune_if_grown(store: MemoryStore, settings: Settings) -> None:
    """CYBERINE_MEMORY_RETUNE: when the history has grown enough since the last tuning, tune it in
    a detached process (cybmem.operations.retune.spawn_auto_tune); the write never waits for it or fails by it."""
    if settings.retune <= 0:
        return
    try:
        from .retune import retune_due, spawn_auto_tune

        if retune_due(store, settings):
            spawn_auto_tune(store, settings)
    except Exception:  # noqa: BLE001 - an optional layer never fails the write
        pass


def _bound_issues(rec: MemoryRecord, events: list[IssueEvent], warnings: list[str]) -> None:
    """Hold the issues the run opens to MAX_RUN_ISSUES (the first; the record names only those) and
    their ledger titles and details to ISSUE_TITLE_MAX and ISSUE_DETAIL_MAX; each bound that cut
    something is one line in ``warnings``."""
    opened = rec.outcome.issues
    if len(opened) > MAX_RUN_ISSUES:
        kept = set(opened[:MAX_RUN_ISSUES])
        rec.outcome.issues = opened[:MAX_RUN_ISSUES]
        events[:] = [e for e in events if e.event != "opened" or e.issueId in kept]
        warnings.append(f"the run lists {len(opened)} issues: the first {MAX_RUN_ISSUES} were opened, the other "
                        f"{len(opened) - MAX_RUN_ISSUES} left out (a run opens at most {MAX_RUN_ISSUES})")
    cut = 0
    for e in events:
        if e.event != "opened":
            continue
        if e.title and len(e.title) > ISSUE_TITLE_MAX:
            e.title, cut = shorten(e.title, ISSUE_TITLE_MAX), cut + 1
        if e.detail and len(e.detail) > ISSUE_DETAIL_MAX:
            e.detail, cut = shorten(e.detail, ISSUE_DETAIL_MAX), cut + 1
    if cut:
        warnings.append(f"{cut} issue title(s) or detail(s) cut for the ledger: a title keeps at most {ISSUE_TITLE_MAX} "
                        f"characters, a detail {ISSUE_DETAIL_MAX} (the id is made from the whole title)")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _distill_into(rec: MemoryRecord, events: list[IssueEvent], run: RunInput, settings: Settings,
                  redacted: list[str], warnings: list[str],
                  while_distilling: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> bool:
    """Refine the new record's outcome with one CYBERINE_MEMORY_MODEL call (ADD-only); True when it did.

    The model sees the run and the extractive outcome as a draft. Its summary replaces the
    extractive one; its accomplished and next items are added after the extractive ones; its
    issues open ledger events through the trailer's path (split_issue, issue_slug), after the
    extractive ones, and never resolve anything. Existing records and ledger lines are never
    touched. Everything it returns is redacted like the rest of the record. Unset: skipped; a
    malformed reply, a timeout, an error or a CybmemError from ``while_distilling`` (the CLI's
    SIGTERM) keeps the extractive outcome and adds one warning (module docstring: distillation
    never holds the record).
    """
    if not settings.distill.on:
        return False
    from ..clients.distillation import distill, distill_config  # only a configured layer pays for httpx

    try:
        config = distill_config(settings.distill)
        if config is None:
            return False
        run_view = {"task": rec.task, "workflowName": run.workflow_name, "state": run.state,
                    "verdictSummary": rec.verdictSummary, "winnerOutput": run.winner_output, "workers": run.workers}
        with while_distilling():
            out = distill(config, run_view, rec.outcome.to_dict())
    except CybmemError as exc:
        message = _one_line(exc).removeprefix("distilled outcome: ")
        if "extractive outcome is kept" not in message:
            message += "; the extractive outcome is kept"
        warnings.append(f"outcome not distilled: {message}")
        return False
    found: set[str] = set()
    if settings.redact_secrets:  # the same one pass as the rest of the run (cybmem.store.secrets.redact_value)
        out = redact_value(out, found)[0]
    outcome = rec.outcome
    outcome.summary = out["summary"] or outcome.summary
    for key in ("accomplished", "next"):
        have = getattr(outcome, key)
        for item in out[key]:
            if item not in have:
                have.append(item)
    touched = {ev.issueId for ev in events}
    for item in out["issues"]:
        title, detail = split_issue(item)
        iid = issue_slug(title)
        if iid in outcome.issues or iid in touched:
            continue
        outcome.issues.append(iid)
        touched.add(iid)
        events.append(IssueEvent(issueId=iid, at=rec.endedAt, event="opened", byRunId=rec.runId, title=title,
                                 detail=detail or None))
    redacted[:] = sorted(set(redacted) | found)
    return True


def _embed_written(store: MemoryStore, rec: MemoryRecord, settings: Settings, since: int, warnings: list[str]) -> bool:
    """Embed the record just written and append its vector (best effort); True when a line was added.

    The text is the keyword index's (task, summary, text of the issues it raised), cut to
    EMBED_TEXT_CHARS. A failure or timeout leaves the record as written and adds one warning;
    ``cybmem embed`` fills the gap later.
    """
    if not settings.embeddings.on:
        return False
    from ..clients.embeddings import Embedder, embed_config  # only a configured layer pays for httpx

    try:
        config = embed_config(settings.embeddings)
        if config is None:
            return False
        # The keyword index's issue text: title and detail by the fold's rule (cybmem.store.issue_tables.issue_texts).
        texts = {k: issue_text(v.title, v.detail) for k, v in store.issue_states_for(rec.outcome.issues).items()}
        text = embedding_text(record_text(rec.task, rec.outcome.summary, rec.outcome.issues, texts, rec.files, rec.commands))
        if text is None:
            return False
        # Off the dispatch path, but the run is over and its caller (a hook) waits: the whole call,
        # a retry included, ends within write_timeout (a cold Ollama loads the model in the first).
        with Embedder(dataclasses.replace(config, attempts=min(config.attempts, 2))) as embedder:
            vector = embedder.embed([text], timeout=config.write_timeout)[0]
        return store.append_embeddings([(rec.runId, config.model, vector)], since=since)[0] > 0
    except Exception as exc:  # noqa: BLE001 - the record is written; an optional layer never fails the write
        message = _one_line(exc) if isinstance(exc, (CybmemError, OSError)) else f"unexpected {type(exc).__name__}: {_one_line(exc)}"
        warnings.append(f"embedding not written: {message}; `cybmem embed` adds it later")
        return False
