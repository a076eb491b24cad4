"""Typed records of the store format (../shared/spec/store-format.md) and their validation.

Field names on disk are camelCase and timestamps epoch milliseconds. Every
``from_dict`` validates and names the field at fault; every type keeps the
fields it does not know in ``extra`` so that a round trip through cybmem never
drops what another program wrote.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .errors import ValidationError

__all__ = [
    "STATES",
    "validate_chat_id",
    "ISSUE_EVENTS",
    "RUN_ID_RE",
    "Lineage",
    "Outcome",
    "Worker",
    "MemoryRecord",
    "IssueEvent",
    "validate_run_id",
    "iso_to_ms",
    "ms_to_utc",
    "parse_time",
]

STATES = ("done", "error", "cancelled")
ISSUE_EVENTS = ("opened", "resolved", "reopened", "wontfix")
RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
ISSUE_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def iso_to_ms(text: str) -> int:
    """Epoch milliseconds of an ISO 8601 date or date-time (UTC unless it names a zone).

    Raises ValueError when ``text`` is not ISO 8601; callers word the message.
    """
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def parse_time(value: str | int | None, what: str = "time") -> int | None:
    """Epoch milliseconds (as in the store) or an ISO date/time (UTC unless it says otherwise).

    Raises:
        ValidationError: naming ``what`` (e.g. ``--as-of``) and the accepted forms.
    """
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return iso_to_ms(text)
    except ValueError:
        raise ValidationError(f"{what} {value!r} is neither epoch milliseconds nor an ISO date "
                              "(e.g. 2026-11-01 or 2026-11-01T09:30)") from None


def ms_to_utc(ms: int) -> str:
    """An epoch-millisecond timestamp as ``YYYY-MM-DD HH:MM`` in UTC (tables and one-liners)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def validate_run_id(value: Any, where: str = "runId") -> str:
    """Return ``value`` if it is a safe run id (``[A-Za-z0-9._-]{1,128}``, not starting with ``.``)."""
    if not isinstance(value, str) or not RUN_ID_RE.fullmatch(value) or value.startswith("."):
        raise ValidationError(
            f"{where}: {value!r} is not a valid run id; use 1-128 characters from A-Z a-z 0-9 . _ -, "
            "not starting with '.' (it names a file under records/, where dot-files are temp files)"
        )
    return value


_CHAT_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f/\\]")
_CHAT_MAX = 256


def validate_chat_id(value: Any, where: str = "chatSessionId") -> str:
    """Return ``value`` if it is a usable chat session id: 1-256 characters on one line, no
    control characters, no '/' or '\\', no surrounding spaces, not "." or ".." (it is printed
    and may name a file in the orchestrator's tree)."""
    if (not isinstance(value, str) or not value or len(value) > _CHAT_MAX or _CHAT_BAD.search(value)
            or value != value.strip() or value in (".", "..")):
        shown = value if not isinstance(value, str) else value[:80].encode("unicode_escape").decode("ascii")
        raise ValidationError(
            f"{where}: {shown!r} is not a usable chat session id; use 1-{_CHAT_MAX} characters on one line, "
            "without control characters, '/' or '\\'"
        )
    return value


def _validate_issue_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not ISSUE_ID_RE.fullmatch(value) or set(value) == {"."}:
        raise ValidationError(f"{where}: {value!r} is not a valid issue id; use 1-128 characters from A-Z a-z 0-9 . _ -")
    return value


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _str(d: dict, key: str, where: str, *, required: bool = True, empty_ok: bool = True) -> str | None:
    if key not in d or d[key] is None:
        if required:
            raise ValidationError(f"{where}{key}: required field is missing")
        return None
    value = d[key]
    if not isinstance(value, str):
        raise ValidationError(f"{where}{key}: expected a string, got {_type_name(value)}")
    if not empty_ok and not value.strip():
        raise ValidationError(f"{where}{key}: must not be empty")
    return value


def _ms(d: dict, key: str, where: str) -> int:
    if key not in d or d[key] is None:
        raise ValidationError(f"{where}{key}: required field is missing (epoch milliseconds)")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"{where}{key}: expected epoch milliseconds (integer), got {_type_name(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValidationError(f"{where}{key}: expected whole epoch milliseconds, got {value!r}")
        value = int(value)
    if not 0 <= value < 10**14:
        raise ValidationError(f"{where}{key}: {value} is not a plausible epoch-millisecond timestamp")
    return value


def _str_list(d: dict, key: str, where: str) -> list[str]:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError(f"{where}{key}: expected a list of strings, got {_type_name(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ValidationError(f"{where}{key}[{i}]: expected a string, got {_type_name(item)}")
    return list(value)


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ValidationError(f"{where}: expected an object, got {_type_name(value)}")
    return value


def _extra(d: dict, known: tuple[str, ...]) -> dict:
    return {k: v for k, v in d.items() if k not in known}


def _put(out: dict, key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


def _merge_extra(out: dict, extra: dict, known: tuple[str, ...] = ()) -> None:
    """Add unknown fields after the known ones; an extra never replaces or resurrects a known field."""
    for key, value in extra.items():
        if key not in out and key not in known:
            out[key] = value


@dataclass
class Lineage:
    """Where a run sits: the run and chat session that dispatched it, its predecessor, its chain root."""

    parentRunId: str | None = None
    chatSessionId: str | None = None
    previousRunId: str | None = None
    rootRunId: str | None = None
    extra: dict = field(default_factory=dict)

    _KNOWN = ("parentRunId", "chatSessionId", "previousRunId", "rootRunId")

    @classmethod
    def from_dict(cls, d: Any, where: str = "lineage") -> "Lineage":
        d = _obj({} if d is None else d, where)
        w = where + "."
        values = {}
        for key in cls._KNOWN:
            value = _str(d, key, w, required=False)
            values[key] = value if value else None
        return cls(**values, extra=_extra(d, cls._KNOWN))

    def to_dict(self) -> dict:
        out: dict = {}
        for key in self._KNOWN:
            _put(out, key, getattr(self, key))
        _merge_extra(out, self.extra, self._KNOWN)
        return out


@dataclass
class Outcome:
    """The extractive outcome of a run: summary, accomplished, issue ids opened, next steps."""

    summary: str = ""
    accomplished: list[str] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    _KNOWN = ("summary", "accomplished", "issues", "next")

    @classmethod
    def from_dict(cls, d: Any, where: str = "outcome") -> "Outcome":
        d = _obj(d, where)
        w = where + "."
        return cls(
            summary=_str(d, "summary", w, required=False) or "",
            accomplished=_str_list(d, "accomplished", w),
            issues=_str_list(d, "issues", w),
            next=_str_list(d, "next", w),
            extra=_extra(d, cls._KNOWN),
        )

    def to_dict(self) -> dict:
        out = {"summary": self.summary, "accomplished": list(self.accomplished), "issues": list(self.issues), "next": list(self.next)}
        _merge_extra(out, self.extra)
        return out


@dataclass
class Worker:
    """One worker of a run and the state it ended in."""

    agentId: str
    state: str
    provider: str | None = None
    extra: dict = field(default_factory=dict)

    _KNOWN = ("agentId", "provider", "state")

    @classmethod
    def from_dict(cls, d: Any, where: str = "workers[]") -> "Worker":
        d = _obj(d, where)
        w = where + "."
        return cls(
            agentId=_str(d, "agentId", w),
            state=_str(d, "state", w),
            provider=_str(d, "provider", w, required=False),
            extra=_extra(d, cls._KNOWN),
        )

    def to_dict(self) -> dict:
        out: dict = {"agentId": self.agentId}
        _put(out, "provider", self.provider)
        out["state"] = self.state
        _merge_extra(out, self.extra, self._KNOWN)
        return out


@dataclass
class MemoryRecord:
    """One episodic record: a run that ended, written once to ``records/<runId>.json``.

    ``supersedes`` is cybmem's append-only way to correct a record: the
    correcting record names the run it replaces, and the replaced file is never
    touched. ``supersededBy`` written by another tool on the old record is
    honoured as well.
    """

    runId: str
    cwd: str
    workflowName: str
    task: str
    state: str
    startedAt: int
    endedAt: int
    lineage: Lineage = field(default_factory=Lineage)
    outcome: Outcome = field(default_factory=Outcome)
    workers: list[Worker] = field(default_factory=list)
    verdictSummary: str | None = None
    supersededBy: str | None = None
    supersedes: str | None = None
    extra: dict = field(default_factory=dict)

    _KNOWN = (
        "runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt",
        "lineage", "outcome", "workers", "verdictSummary", "supersededBy", "supersedes",
    )

    @classmethod
    def from_dict(cls, d: Any) -> "MemoryRecord":
        """Validate a decoded record; raises ValidationError naming the field at fault."""
        d = _obj(d, "record")
        run_id = validate_run_id(d.get("runId"), "runId") if "runId" in d else None
        if run_id is None:
            raise ValidationError("runId: required field is missing")
        state = _str(d, "state", "")
        if state not in STATES:
            raise ValidationError(f"state: {state!r} is not one of {', '.join(STATES)}")
        if "lineage" not in d:
            raise ValidationError("lineage: required field is missing (use {} when there is none)")
        if "outcome" not in d:
            raise ValidationError("outcome: required field is missing")
        workers_raw = d.get("workers")
        if workers_raw is None:
            workers_raw = []
        if not isinstance(workers_raw, list):
            raise ValidationError(f"workers: expected a list, got {_type_name(workers_raw)}")
        workers = [Worker.from_dict(w, f"workers[{i}]") for i, w in enumerate(workers_raw)]
        superseded_by = _str(d, "supersededBy", "", required=False) or None
        if superseded_by is not None:
            validate_run_id(superseded_by, "supersededBy")
        supersedes = _str(d, "supersedes", "", required=False) or None
        if supersedes is not None:
            validate_run_id(supersedes, "supersedes")
        rec = cls(
            runId=run_id,
            cwd=_str(d, "cwd", "", empty_ok=False),
            workflowName=_str(d, "workflowName", ""),
            task=_str(d, "task", ""),
            state=state,
            startedAt=_ms(d, "startedAt", ""),
            endedAt=_ms(d, "endedAt", ""),
            lineage=Lineage.from_dict(d["lineage"]),
            outcome=Outcome.from_dict(d["outcome"]),
            workers=workers,
            verdictSummary=_str(d, "verdictSummary", "", required=False),
            supersededBy=superseded_by,
            supersedes=supersedes,
            extra=_extra(d, cls._KNOWN),
        )
        for name in ("parentRunId", "previousRunId", "rootRunId"):
            value = getattr(rec.lineage, name)
            if value is not None:
                validate_run_id(value, f"lineage.{name}")
        return rec

    def to_dict(self) -> dict:
        """The record as written on disk (camelCase, known fields first, extras kept)."""
        out: dict = {
            "runId": self.runId,
            "cwd": self.cwd,
            "workflowName": self.workflowName,
            "task": self.task,
            "state": self.state,
            "startedAt": self.startedAt,
            "endedAt": self.endedAt,
            "lineage": self.lineage.to_dict(),
            "outcome": self.outcome.to_dict(),
            "workers": [w.to_dict() for w in self.workers],
        }
        _put(out, "verdictSummary", self.verdictSummary)
        _put(out, "supersededBy", self.supersededBy)
        _put(out, "supersedes", self.supersedes)
        _merge_extra(out, self.extra, self._KNOWN)
        return out


@dataclass
class IssueEvent:
    """One line of issues.jsonl: a state transition of one issue."""

    issueId: str
    at: int
    event: str
    byRunId: str | None = None
    title: str | None = None
    detail: str | None = None
    extra: dict = field(default_factory=dict)

    _KNOWN = ("issueId", "at", "event", "byRunId", "title", "detail")

    @classmethod
    def from_dict(cls, d: Any) -> "IssueEvent":
        """Validate a decoded ledger line; raises ValidationError naming the field at fault."""
        d = _obj(d, "issue event")
        event = _str(d, "event", "")
        if event not in ISSUE_EVENTS:
            raise ValidationError(f"event: {event!r} is not one of {', '.join(ISSUE_EVENTS)}")
        by = _str(d, "byRunId", "", required=False) or None
        return cls(
            issueId=_validate_issue_id(d.get("issueId"), "issueId"),
            at=_ms(d, "at", ""),
            event=event,
            byRunId=by,
            title=_str(d, "title", "", required=False),
            detail=_str(d, "detail", "", required=False),
            extra=_extra(d, cls._KNOWN),
        )

    def to_dict(self) -> dict:
        out: dict = {"issueId": self.issueId, "at": self.at, "event": self.event}
        _put(out, "byRunId", self.byRunId)
        _put(out, "title", self.title)
        _put(out, "detail", self.detail)
        _merge_extra(out, self.extra, self._KNOWN)
        return out
