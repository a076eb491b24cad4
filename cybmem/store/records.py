"""Typed records of the store format (docs/store-format.md) and their validation.

The record's fields and their rules are declared once, in :data:`RECORD_FIELDS` (with the
nested :data:`LINEAGE_FIELDS`, :data:`OUTCOME_FIELDS`, :data:`WORKER_FIELDS`): the dataclasses
here parse by it, and :mod:`cybmem.store.arrow_records` derives the cache's Arrow schema and its bulk checks
from it. Field names on disk are camelCase and timestamps epoch milliseconds. Every
``from_dict`` validates and names the field at fault; every type keeps the
fields it does not know in ``extra`` so that a round trip through cybmem never
drops what another program wrote.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import ValidationError

__all__ = [
    "Field",
    "RECORD_FIELDS",
    "LINEAGE_FIELDS",
    "OUTCOME_FIELDS",
    "WORKER_FIELDS",
    "RUN_ID_PATTERN",
    "MAX_MS",
    "MAX_MOMENT",
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
    "ms_to_iso",
    "ms_to_utc",
    "parse_time",
    "FUTURE_SLACK_MS",
    "check_not_future",
    "check_moment",
]

STATES = ("done", "error", "cancelled")
ISSUE_EVENTS = ("opened", "resolved", "reopened", "wontfix")
#: A run id: 1-128 characters from A-Z a-z 0-9 . _ -, not starting with "." (it names a file under
#: records/, where dot-files are temp files). The one rule: Python's re and Arrow's RE2 both take it.
RUN_ID_PATTERN = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}"
RUN_ID_RE = re.compile(RUN_ID_PATTERN)
ISSUE_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class Field:
    """One field of the on-disk record: its name, its type, whether it is required, its rule.

    ``kind``: ``str``, ``ms`` (epoch milliseconds, an integer in [0, 10**14)), ``str_list``
    (a list of strings), ``object`` / ``objects`` (one nested object / a list of them, whose
    fields are ``nested``). ``rule``: ``run_id`` (:data:`RUN_ID_PATTERN`; empty means none),
    ``state`` (one of :data:`STATES`), ``nonblank``. The dataclasses below parse by these
    tables, and :mod:`cybmem.store.arrow_records` derives the Arrow schema and the bulk checks from them.
    """

    name: str
    kind: str = "str"
    required: bool = False
    rule: str | None = None
    nested: tuple["Field", ...] = ()


#: ``lineage``: where a run sits (all optional; an empty string means none).
LINEAGE_FIELDS = (
    Field("parentRunId", rule="run_id"),
    Field("chatSessionId"),
    Field("previousRunId", rule="run_id"),
    Field("rootRunId", rule="run_id"),
)
#: ``outcome``: what the run did.
OUTCOME_FIELDS = (
    Field("summary"),
    Field("accomplished", "str_list"),
    Field("issues", "str_list"),
    Field("next", "str_list"),
)
#: ``workers[]``: one worker of a run and the state it ended in.
WORKER_FIELDS = (
    Field("agentId", required=True),
    Field("provider"),
    Field("state", required=True),
)
#: A record, in the order written on disk (records/<runId>.json; docs/store-format.md).
RECORD_FIELDS = (
    Field("runId", required=True, rule="run_id"),
    Field("cwd", required=True, rule="nonblank"),
    Field("workflowName", required=True),
    Field("task", required=True),
    Field("state", required=True, rule="state"),
    Field("startedAt", "ms", required=True),
    Field("endedAt", "ms", required=True),
    Field("lineage", "object", required=True, nested=LINEAGE_FIELDS),
    Field("outcome", "object", required=True, nested=OUTCOME_FIELDS),
    Field("workers", "objects", nested=WORKER_FIELDS),
    Field("verdictSummary"),
    Field("files", "str_list"),  # the files the run edited (an agent's turn: its Edit/Write tools' paths)
    Field("commands", "str_list"),  # the commands it ran (an agent's turn: its Bash tool's commands)
    Field("supersededBy", rule="run_id"),
    Field("supersedes", rule="run_id"),
)
#: The largest epoch-millisecond value a record may hold (exclusive).
MAX_MS = 10**14
#: The end of the moments an argument may name (exclusive): 10000-01-01T00:00Z, the first an ISO
#: date cannot write.
MAX_MOMENT = 253_402_300_800_000


def _names(fields: tuple[Field, ...], **match: Any) -> tuple[str, ...]:
    """The names of the fields whose attributes equal ``match`` (all of them when none given)."""
    return tuple(f.name for f in fields if all(getattr(f, k) == v for k, v in match.items()))


#: The optional links to other runs, checked against :data:`RUN_ID_PATTERN` when set.
_RECORD_LINKS = tuple(f.name for f in RECORD_FIELDS if f.rule == "run_id" and not f.required)
_LINEAGE_LINKS = _names(LINEAGE_FIELDS, rule="run_id")


def iso_to_ms(text: str) -> int:
    """Epoch milliseconds of an ISO 8601 date or date-time (UTC unless it names a zone).

    Raises ValueError when ``text`` is not ISO 8601; callers word the message.
    """
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def parse_time(value: Any, what: str = "time") -> int | None:
    """Epoch milliseconds (as in the store) or an ISO date/time (UTC unless it says otherwise).

    What :func:`parse_moment`, the one reader of a moment given as an argument (``--as-of``, ``--now``,
    the MCP tools' ``as_of``), reads a moment with once a bare year, month or date is ruled out:
    :func:`check_moment` holds it to the range an ISO date can write, from the epoch on. Anything
    else (a bool, a fraction, a list: what JSON can send) is refused with the same message.

    Raises:
        ValidationError: naming ``what`` (e.g. ``--as-of``), the accepted forms and range.
    """
    if value is None or value == "":
        return None
    ms = None
    if isinstance(value, str):
        text = value.strip()
        try:
            ms = int(text) if text.isascii() and text.lstrip("+-").isdigit() else iso_to_ms(text)  # not "１２３"
        except (ValueError, OverflowError):
            pass
    elif isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer():
        ms = int(value)  # a whole float too (1.7e12): JSON Schema's integer
    if ms is None:  # JSON's true, 1.5 or [1] (from an MCP client) are no moment either
        shown = repr(value) if isinstance(value, str) else json.dumps(value, default=repr)
        raise ValidationError(f"{what} {shown} is neither epoch milliseconds nor an ISO date "
                              "(e.g. 2026-11-01 or 2026-11-01T09:30)")
    return check_moment(ms, what, value)


_PERIOD = re.compile(r"(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?")


def parse_moment(value: Any, what: str = "time", *, end_of_day: bool = False) -> int | None:
    """:func:`parse_time`, where a bare year, month or date given as text (``2024``, ``2024-05``,
    ``2024-05-31``) means its start, or with ``end_of_day`` its last millisecond (an ``--until``):
    the one reading of a moment argument, the CLI's options and the MCP tools' ``as_of`` alike (a
    number is epoch milliseconds; ``"2024"`` is the year, not 2 seconds after the epoch).

    Raises:
        ValidationError: naming ``what``, as :func:`parse_time` does.
    """
    period = _PERIOD.fullmatch(value.strip()) if isinstance(value, str) else None
    if period is None:
        return parse_time(value, what)
    text = value.strip()
    y, m, d = int(period[1]), int(period[2] or 1), int(period[3] or 1)
    try:
        start = datetime(y, m, d, tzinfo=timezone.utc)
    except ValueError as exc:
        raise ValidationError(f"{what} {text!r}: {exc}") from None
    start_ms = check_moment(int(start.timestamp() * 1000), what, text)  # the range of every moment
    if not end_of_day:
        return start_ms
    nxt = (start.replace(year=y + 1) if not period[2] else
           start.replace(year=y + (m == 12), month=m % 12 + 1) if not period[3] else None)
    end_ms = int(nxt.timestamp() * 1000) if nxt else start_ms + 86_400_000
    return check_moment(end_ms - 1, what, text)


def check_moment(ms: int, what: str = "time", given: Any = None) -> int:
    """``ms`` if it is a moment an ISO date can name from the epoch on (0 <= ms <
    :data:`MAX_MOMENT`), else ValidationError naming ``what``, the value ``given`` (default:
    ``ms``) and the accepted range."""
    if not 0 <= ms < MAX_MOMENT:
        raise ValidationError(f"{what} {ms if given is None else given!r} is out of range: give a moment from "
                              f"1970-01-01 to 9999-12-31 (epoch milliseconds 0 to {MAX_MOMENT - 1})")
    return ms


def ms_to_iso(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC with milliseconds: ``2026-10-01T00:18:00.000Z`` (sorts as text)."""
    return datetime.fromtimestamp(ms // 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def ms_to_utc(ms: int) -> str:
    """An epoch-millisecond timestamp as ``YYYY-MM-DD HH:MM`` in UTC (tables and one-liners)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


#: How far past the writer's clock a record may end: a day, room for clocks that disagree and
#: time zones written as UTC. Later than that is a broken clock or a typed year (3000): such a
#: record would take full recency and top every MEMORY block and `list` for as long as it stays.
FUTURE_SLACK_MS = 86_400_000


def check_not_future(ended_at: int, now_ms: int, where: str = "endedAt") -> None:
    """Raise ValidationError when ``ended_at`` is more than :data:`FUTURE_SLACK_MS` past ``now_ms``.

    Refused, not clamped: the writer's clock or the run's time is wrong, and a clamped time would
    store a moment the run never had; the run.json is left as it is to be fixed and written again.
    """
    if ended_at > now_ms + FUTURE_SLACK_MS:
        raise ValidationError(
            f"{where} {ms_to_utc(ended_at)} UTC is more than a day after this machine's clock ({ms_to_utc(now_ms)} UTC); "
            f"a run cannot end in the future: fix the run's {where} or this machine's clock, then write it again")


def validate_run_id(value: Any, where: str = "runId") -> str:
    """Return ``value`` if it is a safe run id (``[A-Za-z0-9._-]{1,128}``, not starting with ``.``)."""
    if not isinstance(value, str) or not RUN_ID_RE.fullmatch(value):
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
    if not 0 <= value < MAX_MS:
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

    _KNOWN = _names(LINEAGE_FIELDS)

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

    _KNOWN = _names(OUTCOME_FIELDS)

    @classmethod
    def from_dict(cls, d: Any, where: str = "outcome") -> "Outcome":
        d = _obj(d, where)
        w = where + "."
        values: dict[str, Any] = {}
        for f in OUTCOME_FIELDS:
            values[f.name] = _str_list(d, f.name, w) if f.kind == "str_list" else (_str(d, f.name, w, required=False) or "")
        return cls(**values, extra=_extra(d, cls._KNOWN))

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

    _KNOWN = _names(WORKER_FIELDS)

    @classmethod
    def from_dict(cls, d: Any, where: str = "workers[]") -> "Worker":
        d = _obj(d, where)
        w = where + "."
        # required fields first (their message wins), then the optional ones
        values = {f.name: _str(d, f.name, w, required=f.required) for f in sorted(WORKER_FIELDS, key=lambda f: not f.required)}
        return cls(**values, extra=_extra(d, cls._KNOWN))

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
    files: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    supersededBy: str | None = None
    supersedes: str | None = None
    extra: dict = field(default_factory=dict)

    _KNOWN = _names(RECORD_FIELDS)

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
        links = {}
        for name in _RECORD_LINKS:  # supersededBy, supersedes: a run id when set
            links[name] = _str(d, name, "", required=False) or None
            if links[name] is not None:
                validate_run_id(links[name], name)
        values: dict[str, Any] = {"runId": run_id, "state": state, "workers": workers, **links}
        for f in RECORD_FIELDS:  # the rest, in the order of the table
            if f.name in values:
                continue
            if f.kind == "ms":
                values[f.name] = _ms(d, f.name, "")
            elif f.kind == "str_list":
                values[f.name] = _str_list(d, f.name, "")
            elif f.kind == "object":
                values[f.name] = _NESTED[f.name].from_dict(d[f.name])
            else:
                values[f.name] = _str(d, f.name, "", required=f.required, empty_ok=f.rule != "nonblank")
        rec = cls(**values, extra=_extra(d, cls._KNOWN))
        for name in _LINEAGE_LINKS:
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
        for name in ("files", "commands"):  # optional: written only when the run has some
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        _put(out, "supersededBy", self.supersededBy)
        _put(out, "supersedes", self.supersedes)
        _merge_extra(out, self.extra, self._KNOWN)
        return out


#: The dataclass of each nested object of :data:`RECORD_FIELDS`.
_NESTED: dict[str, Any] = {"lineage": Lineage, "outcome": Outcome, "workers": Worker}


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
