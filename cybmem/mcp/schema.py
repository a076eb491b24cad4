"""The MCP tools' arguments and answers as agents see them: the argument types with their
descriptions, pydantic models of the answers (the JSON schemas a client reads; fields the library
adds later pass through), times as ISO 8601 UTC, and the command line's flags in the library's
messages put as the tools' arguments (:func:`for_agents`, :func:`in_tool_terms`)."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, create_model

from ..answers import MAX_MOMENT, RECORD_FIELDS, IssueState, ms_to_iso

__all__ = ["Answer", "Project", "RunId", "AsOf", "Time", "for_agents", "in_tool_terms", "SearchHit", "SearchAnswer",
           "ShowAnswer", "ChainAnswer", "Issue", "IssuesAnswer", "BlockAnswer", "ProjectEntry", "ProjectsAnswer",
           "MarkAnswer", "SupersedeAnswer"]

#: A tool's answer as the library gives it, before it becomes an MCP result.
Answer = dict[str, Any]


# --- arguments ------------------------------------------------------------------------

Project = Annotated[str | None, Field(description="Project slug, e.g. 'web' (the projects tool lists them). Leave it "
                                                  "out to use the server's default project; when the server has none, "
                                                  "the answer is an error that lists the slugs to pass.")]
RunId = Annotated[str, Field(description="A run id from a search hit (its runId), a chain or an issue, or a unique "
                                         "prefix of it (8 characters are usually enough).")]
#: Passed as sent to :meth:`cybmem.memory.Memory.moment`, the one reader of a moment (the
#: schema still says string or integer): pydantic took JSON's ``true`` for 1 ms and answered ``1.5``
#: with its own two-error text.
AsOf = Annotated[SkipValidation[str | int | None], Field(
    description="Replay memory as it was at a moment: an ISO 8601 date or time (UTC unless it names a zone, e.g. "
                "2026-10-01 or 2026-10-01T09:30Z) or epoch milliseconds, from 1970-01-01 to 9999-12-31; later records "
                "are ignored and recency is measured from then. Leave it out for now.")]
#: An ISO 8601 time in UTC with milliseconds (2026-10-01T00:18:00.000Z), as every answer gives times.
Time = Annotated[str, Field(description="ISO 8601, UTC.")]


# --- answers (the library's dicts; fields it adds later pass through) -----------------


#: The fields that hold a time: epoch milliseconds in the store and the library's answers, ISO 8601
#: (UTC) in every answer an agent gets (:func:`for_agents`, which also takes any other ``...At``
#: field for one). Records, index entries and search hits (startedAt, endedAt), issues (openedAt,
#: lastAt, resolvedAt), ledger events (at), a search's asOf and now.
_TIMES = frozenset({f.name for f in RECORD_FIELDS if f.kind == "ms"} | {"openedAt", "lastAt", "resolvedAt", "at",
                                                                         "asOf", "now"})
#: Fields of the library's answers that only mean something inside the store (the index's inode).
_INTERNAL = frozenset({"inode"})


def for_agents(value: Any, key: str | None = None) -> Any:
    """An answer as an agent gets it: times as ISO 8601 UTC, internal fields left out, warnings in
    tool terms."""
    if isinstance(value, dict):
        return {k: for_agents(v, k) for k, v in value.items() if k not in _INTERNAL}
    if isinstance(value, list):
        return [for_agents(v, key) for v in value]
    if (key in _TIMES or key and key.endswith("At")) and type(value) is int and 0 <= value < MAX_MOMENT:
        return ms_to_iso(value)
    if key == "warnings" and isinstance(value, str):
        return in_tool_terms(value)
    return value


#: The library words its messages for the command line; an agent passes tool arguments instead.
_TOOL_TERMS = (
    (re.compile(r" \(pass --project SLUG or --cwd DIR\)"), "; pass the `project` argument (the projects tool lists "
                                                           "the projects)"),
    (re.compile(r"--project ([^\s,;)]+)"), r"project='\1'"),
    (re.compile(r"see `cybmem issues --all`"), "the issues tool with status='all' lists every issue id"),
    (re.compile(r"see `cybmem list`"), "the search tool finds a project's run ids"),
    (re.compile(r"see `cybmem projects`"), "the projects tool lists the projects"),
    (re.compile(r"use `cybmem supersede (\S+) NEW\.json`"), r"the supersede tool with old_run_id='\1'"),
    (re.compile(r", pass --run-id or set CYBERINE_RUN_ID"), " or pass the `run_id` argument"),
    (re.compile(r"--parent / CYBERINE_PARENT_RUN_ID"), "parent_run_id"),
    (re.compile(r"--as-of"), "as_of"),
)


def in_tool_terms(message: str) -> str:
    """A library message with the command line's flags put as the tools' arguments."""
    for pattern, words in _TOOL_TERMS:
        message = pattern.sub(words, message)
    return message


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class SearchHit(_Answer):
    rank: int
    runId: str
    score: float
    endedAt: Time
    state: str
    task: str
    summary: str
    issues: list[str] = Field(description="Issue ids the run raised.")
    next: list[str]
    pinned: str | None = Field(None, description="'parent': shown first as the parent of the run dispatched.")
    contributions: dict[str, float] | None = Field(None, description="With explain: each axis' weighted share of the score.")
    values: dict[str, float] | None = Field(None, description="With explain: each axis' raw value.")


class SearchAnswer(_Answer):
    project: str
    query: str
    asOf: Time | None = Field(description="The moment memory was replayed at (as_of), or null.")
    now: Time = Field(description="The moment recency was measured from.")
    candidates: int = Field(description="Records that could be returned.")
    weights: dict[str, float]
    hits: list[SearchHit]
    warnings: list[str] = Field(description="What could not be read, or an axis that was left out.")


class ShowAnswer(_Answer):
    project: str
    record: dict[str, Any] = Field(description="The whole record: runId, cwd, "
                                               "workflowName, task, state, startedAt, endedAt, lineage, outcome "
                                               "(summary, accomplished, issues, next), workers, verdictSummary, ...")
    supersededChain: list[str] = Field(description="The runs the record shown supersedes, from the one asked for on; "
                                                   "[] when it was not corrected.")
    warnings: list[str]


class ChainAnswer(_Answer):
    project: str
    runId: str
    chainLength: int
    omitted: dict[str, int] = Field(description="Runs of the chain not shown: before, after; unmatched.")
    previous: list[str]
    next: list[str]
    parentRunId: str | None
    rootRunId: str | None
    children: list[str] = Field(description="Runs this run dispatched.")
    chatSessionId: str | None
    chatRuns: list[str]
    openIssues: list[str] = Field(description="Issues the run raised that are still open.")
    runs: list[dict[str, Any]] = Field(description="The runs shown, oldest first: runId, startedAt, endedAt, state, "
                                                   "workflowName, task, summary, issues, previousRunId, rootRunId.")
    warnings: list[str]


def _fields_of(cls, *, leave_out: tuple[str, ...] = ()) -> dict:
    """The fields of a library dataclass as pydantic field definitions: an answer that carries its
    ``to_dict`` gets its schema from the one place the fields are declared (times as agents get them)."""
    hints = typing.get_type_hints(cls)
    return {f.name: ((Time | None if f.default is None else Time) if f.name in _TIMES else hints[f.name],
                     ... if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(cls) if f.name not in leave_out}


Issue = create_model(
    "Issue", __base__=_Answer, **_fields_of(IssueState, leave_out=("titled",)),
    score=(float | None, Field(None, description="With a query: the open issue's score against it.")),
    contributions=(dict[str, float] | None, Field(None, description="With a query: keyword, lineage, recency.")),
    via=(str | None, Field(None, description="With a query: the run that carries the issue and matched best.")),
)


class IssuesAnswer(_Answer):
    project: str
    status: str
    query: str | None
    total: int = Field(description="Issues that match, before the limit.")
    issues: list[Issue]
    warnings: list[str]


class BlockAnswer(_Answer):
    project: str | None
    block: str = Field(description="The MEMORY block, the text a dispatcher puts ahead of the task ('' when no "
                                   "prior run relates to it).")
    warnings: list[str]
    runs: list[dict[str, Any]] = Field(description="The prior runs the block shows, with their scores.")
    issues: list[dict[str, Any]] = Field(description="The open issues considered, with where each was listed.")
    openIssues: int


class ProjectEntry(_Answer):
    slug: str = Field(description="What to pass as `project`.")
    cwd: str | None = Field(description="The project's directory.")
    runs: int = Field(description="Runs recorded.")


class ProjectsAnswer(_Answer):
    memoryRoot: str
    defaultProject: str | None = Field(description="The project the tools use when `project` is left out; null: "
                                                   "none, so every call must pass `project`.")
    projects: list[ProjectEntry] = Field(description="By slug.")


class MarkAnswer(_Answer):
    project: str
    issueId: str
    before: str
    after: str
    written: list[dict[str, Any]] = Field(description="The ledger events appended ([] when it was already so).")


class SupersedeAnswer(_Answer):
    runId: str
    project: str
    supersedes: str
    path: str
    events: list[dict[str, Any]]
    redacted: list[str] = Field(description="Kinds of secret redacted before writing.")
    warnings: list[str]

