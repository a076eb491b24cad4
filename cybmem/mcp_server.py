"""``cybmem mcp``: one memory root served to agents over the Model Context Protocol.

The MEMORY block reaches an agent once, at dispatch; through MCP an agent can look memory up
when it needs to, mid-run. Built on the official MCP Python SDK (``mcp`` 2.x, its
:class:`~mcp.server.mcpserver.MCPServer`), over stdio, or streamable HTTP on 127.0.0.1. Each tool
is a thin call of the library that answers with what the CLI prints under ``--json``, as
structured content and as JSON text (:func:`cybmem.store.outcome.printable_json`); the write tools are
offered only with ``--allow-writes``. The server reads under
:func:`cybmem.store.loading.holding_snapshots` (snapshots stay warm between calls while the cache is
fresh). Every call goes through :meth:`Memory.call`: one at a time, on the event loop (a worker
thread's switches cost more than a call: benchmarks/bench_mcp.py), a library error becomes an MCP
error with the CLI's message, and ``observers`` see each answer (:func:`serve` keeps it in
shown.jsonl, :func:`cybmem.dispatch.feedback.mcp_observer`). Tools and resources: USAGE.md, "Memory for
agents mid-run".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import inspect
import logging
import os
import re
import socket
import sys
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from . import __version__
from .errors import CybmemError, NotFoundError, ValidationError
from .store.ledger import IssueState
from .store.outcome import printable, printable_json
from .store.records import MAX_MOMENT, RECORD_FIELDS, ms_to_iso, parse_time
from .settings import Settings
from .store.loading import holding_snapshots, load_snapshot
from .store.snapshot import Snapshot
from .store.memory_store import MemoryStore
from .store.projects import list_projects

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import BaseModel, ConfigDict, Field, create_model
except ImportError as exc:  # an install without the dependency, or mcp 1.x
    raise CybmemError("cybmem mcp needs the MCP Python SDK 2.x: pip install 'mcp>=2.3,<3' "
                      f"(importing it failed: {exc})") from None

__all__ = ["Memory", "build_server", "serve"]

#: A tool's answer as the library gives it, before it becomes an MCP result.
Answer = dict[str, Any]


# --- arguments ------------------------------------------------------------------------

Project = Annotated[str | None, Field(description="Project slug, e.g. 'web' (the projects tool lists them). Leave it "
                                                  "out to use the server's default project; when the server has none, "
                                                  "the answer is an error that lists the slugs to pass.")]
RunId = Annotated[str, Field(description="A run id from a search hit (its runId), a chain or an issue, or a unique "
                                         "prefix of it (8 characters are usually enough).")]
AsOf = Annotated[str | int | None, Field(description="Replay memory as it was at a moment: an ISO 8601 date or time "
                                                     "(UTC unless it names a zone, e.g. 2026-10-01 or "
                                                     "2026-10-01T09:30Z) or epoch milliseconds, from 1970-01-01 to "
                                                     "9999-12-31; later records are ignored and recency is measured "
                                                     "from then. Leave it out for now.")]
#: An ISO 8601 time in UTC with milliseconds (2026-10-01T00:18:00.000Z), as every answer gives times.
Time = Annotated[str, Field(description="ISO 8601, UTC.")]


# --- answers (the library's dicts; fields it adds later pass through) -----------------


#: The fields that hold a time: epoch milliseconds in the store and the library's answers, ISO 8601
#: (UTC) in every answer an agent gets (:func:`_for_agents`, which also takes any other ``...At``
#: field for one). Records, index entries and search hits (startedAt, endedAt), issues (openedAt,
#: lastAt, resolvedAt), ledger events (at), a search's asOf and now.
_TIMES = frozenset({f.name for f in RECORD_FIELDS if f.kind == "ms"} | {"openedAt", "lastAt", "resolvedAt", "at",
                                                                         "asOf", "now"})
#: Fields of the library's answers that only mean something inside the store (the index's inode).
_INTERNAL = frozenset({"inode"})


def _for_agents(value: Any, key: str | None = None) -> Any:
    """An answer as an agent gets it: times as ISO 8601 UTC, internal fields left out, warnings in
    tool terms."""
    if isinstance(value, dict):
        return {k: _for_agents(v, k) for k, v in value.items() if k not in _INTERNAL}
    if isinstance(value, list):
        return [_for_agents(v, key) for v in value]
    if (key in _TIMES or key and key.endswith("At")) and type(value) is int and 0 <= value < MAX_MOMENT:
        return ms_to_iso(value)
    if key == "warnings" and isinstance(value, str):
        return _in_tool_terms(value)
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


def _in_tool_terms(message: str) -> str:
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


def _warnings(*sources) -> list[str]:
    """Messages of read problems and warning strings, each once, in order."""
    out: dict[str, None] = {}
    for source in sources:
        for item in source:
            out[getattr(item, "message", item)] = None
    return list(out)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Memory:
    """What the server serves: one memory root, its default project, whether writes are on.

    The tool methods return the library's answers as dicts, so they are the same call in-process.
    """

    def __init__(self, settings: Settings, *, cwd: str | os.PathLike | None = None, project: str | None = None,
                 allow_writes: bool = False):
        self.settings = settings
        self.cwd = cwd
        self.project = project
        self.allow_writes = allow_writes
        #: Called as ``observer(name, arguments, answer)`` after every call that answered (a tool
        #: or a resource): the place to keep what an agent fetched. An observer that raises is
        #: reported on stderr; the call still answers.
        self.observers: list[Callable[[str, dict, Answer], None]] = []
        self._lock = threading.Lock()
        self._issue_lists: dict[Path, tuple[Snapshot, dict]] = {}

    def store(self, project: str | None) -> MemoryStore:
        """The store of ``project``, else of the server's project (NotFoundError names the known ones;
        without a default project, it says to pass ``project``)."""
        if project or self.project:
            return MemoryStore.open(self.settings, cwd=self.cwd, project=project or self.project)
        try:
            return MemoryStore.open(self.settings, cwd=self.cwd)
        except (NotFoundError, ValidationError):  # e.g. a desktop client starts its servers in /
            where = Path(self.cwd or os.getcwd()).absolute()
            slugs = ", ".join(p["slug"] for p in list_projects(self.settings.memory_dir)) or "none yet"
            raise NotFoundError(f"no default project: this server was started in {where}, which is no project's "
                                f"directory under {self.settings.memory_dir}; pass the `project` argument, one of: "
                                f"{slugs} (the projects tool lists them with their run counts)") from None

    def default_project(self) -> str | None:
        """The project a call that names none works on, or None when there is none."""
        try:
            return self.store(None).slug
        except CybmemError:
            return None

    def call(self, name: str, arguments: dict, fn: Callable[[], Answer], *, resource: bool = False) -> Answer:
        """Answer one call: one at a time, as agents get answers (:func:`_for_agents`); a library
        error becomes the MCP error that carries its message in tool terms (ToolError: an
        ``isError`` result; for a resource, a protocol error)."""
        with self._lock:
            try:
                answer = _for_agents(fn())
            except CybmemError as exc:
                kind = (ResourceNotFoundError if isinstance(exc, NotFoundError) else ResourceError) if resource else ToolError
                raise kind(_in_tool_terms(str(exc))) from None
            except OSError as exc:  # a store broken in a way the library did not name (as the CLI says it)
                where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
                raise (ResourceError if resource else ToolError)(f"{where}{exc.strerror or exc}") from None
            for observe in self.observers:
                try:
                    observe(name, arguments, answer)
                except Exception as exc:  # noqa: BLE001 - keeping a log never fails the answer
                    print(f"cybmem mcp: warning: observer {observe!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return answer

    # --- tools ------------------------------------------------------------------------

    def search(
        self,
        query: Annotated[str, Field(description="What to look for: free text, e.g. the task at hand.")],
        k: Annotated[int, Field(ge=1, description="How many results.")] = 10,
        project: Project = None,
        as_of: AsOf = None,
        explain: Annotated[bool, Field(description="Add each hit's per-axis contributions and values.")] = False,
    ) -> SearchAnswer:
        """Find the past runs of a project that relate to a text, best first (scored on keywords,
        recency and lineage).

        Call it before starting work, and whenever a past run may have met the same problem: a failing
        test, an error message, a file or feature name. Each hit has its runId, task, summary, the
        issues it raised and its next steps. Pass a hit's runId to `show` for the whole record, or to
        `chain` for the runs before and after it. For the known open problems, call `issues`.
        """
        from .retrieval.search import search

        store = self.store(project)
        result = search(store, query, k=k, settings=self.settings, as_of=parse_time(as_of, "as_of"))
        return {"project": store.slug, **result.to_dict(explain=explain),
                "warnings": _warnings(result.snapshot.problems, result.warnings)}

    def show(
        self,
        run_id: RunId,
        project: Project = None,
        original: Annotated[bool, Field(description="The asked record itself even when a later one corrects it.")] = False,
    ) -> ShowAnswer:
        """The whole record of one run: its task, outcome (summary, accomplished, issues raised,
        next steps), workers, lineage and times.

        Call it with a runId (or a prefix) from `search`, `chain` or `issues` when a summary is not
        enough. When a later run corrected the record, the correction is shown and supersededChain
        names the runs it corrects; original=true shows the asked record itself.
        """
        from .explore.lineage import show_record

        store = self.store(project)
        shown = show_record(store, run_id, original=original)
        return {"project": store.slug, "record": shown.record.to_dict(), "supersededChain": shown.superseded,
                "warnings": _warnings(store.problems)}

    def chain(
        self,
        run_id: RunId,
        context: Annotated[int, Field(ge=0, description="Runs shown each side of the run; 0: the whole chain.")] = 5,
        project: Project = None,
    ) -> ChainAnswer:
        """A run's place in history: the runs before and after it in its project, the run that
        dispatched it (parentRunId) and the ones it dispatched (children), the runs of its chat
        session, and the issues it raised that are still open.

        Call it with a runId from `search` or `show` to see what was tried before a run and what
        followed it. Every run it lists can go to `show`.
        """
        from .explore.lineage import chain

        store = self.store(project)
        snap = load_snapshot(store)
        run = snap.resolve_run_id(run_id)
        result = chain(store, run, snap).window(context=context or None).verified(store)
        return {"project": store.slug, **result.to_dict(), "warnings": _warnings(store.problems)}

    def issues(
        self,
        status: Annotated[Literal["open", "all"], Field(description="open, or all (closed ones too).")] = "open",
        query: Annotated[str | None, Field(description="Rank the open issues against this text, with the scorer the "
                                                       "MEMORY block uses (best first, each with its score).")] = None,
        limit: Annotated[int, Field(ge=0, description="At most this many (0: all).")] = 50,
        project: Project = None,
    ) -> IssuesAnswer:
        """A project's issues from its issue ledger: the open ones oldest first (status='all': then
        the closed ones, most recently closed first); with a query, the open ones ranked against it.

        Call it to learn the known problems before working on something, or to find an issue's
        issueId (for `mark_issue`). openedBy is the run that raised the issue: pass it to `show`.
        """
        store = self.store(project)
        snap = load_snapshot(store)
        listed = self._issue_list(snap, status)
        warnings = [snap.problems]
        if not query:
            items = [s.to_dict() for s in (listed[:limit] if limit else listed)]
        else:
            from .retrieval.issue_ranking import rank_issues
            from .retrieval.search import search

            result = search(snap, query, k=1, settings=self.settings)
            warnings.append(result.warnings)
            by_id = self._issue_list(snap, "by id")
            items = []
            for issue in rank_issues(result, result.weights, limit=limit or None):
                if issue.ids[0] in by_id:
                    scored = issue.to_dict()
                    items.append({**by_id[issue.ids[0]].to_dict(), "score": scored["score"],
                                  "contributions": scored["contributions"], "via": scored["via"]})
            if status == "all":  # the closed ones after them, in the order listed
                items += [s.to_dict() for s in listed if not s.is_open][:max(limit - len(items), 0) if limit else None]
        return {"project": store.slug, "status": status, "query": query, "total": len(listed), "issues": items,
                "warnings": _warnings(*warnings)}

    def _issue_list(self, snap: Snapshot, status: str):
        """The issues of ``status`` in the order `cybmem issues` lists them ("by id": all, by id), kept
        with the snapshot they came from: a held snapshot answers many calls, and a ledger can hold
        tens of thousands of issues."""
        from .retrieval.filters import IssueFilter, select_issues
        from .store.ledger import states_from_table

        held, lists = self._issue_lists.get(snap.store.dir, (None, {}))
        if held is not snap:
            lists = {}
            self._issue_lists[snap.store.dir] = (snap, lists)
        if status not in lists:
            if status == "by id":
                lists[status] = {s.issueId: s for s in self._issue_list(snap, "all")}
            else:
                wanted = IssueFilter.make(state="open" if status == "open" else None)
                lists[status] = select_issues(states_from_table(snap.fold()), wanted, now_ms=_now_ms())[0].items
        return lists[status]

    def memory_block(
        self,
        task: Annotated[str, Field(description="The task the block is for.")],
        project: Project = None,
        as_of: AsOf = None,
        parent_run_id: Annotated[str | None, Field(description="Parent run of the run the block is for: it comes first "
                                                               "(default: the server's $CYBERINE_PARENT_RUN_ID).")] = None,
        chat_session_id: Annotated[str | None, Field(description="Chat session of that run (default: the server's "
                                                                 "$CYBERINE_CHAT_SESSION_ID).")] = None,
    ) -> BlockAnswer:
        """The MEMORY block for a task: the most relevant prior runs and open issues within a token
        budget, as the text a dispatcher puts ahead of a new task.

        Call it once when you start a task and want that overview; to look something specific up
        mid-task, `search` is more direct. The runs it names can go to `show` and `chain`.
        """
        from .dispatch.inject import inject_task

        store = self.store(project)  # an unknown project is an error here; inject would go on without a block
        injection = inject_task(task, self.settings, project=store.slug, as_of=parse_time(as_of, "as_of"),
                                parent_run_id=parent_run_id, chat_session_id=chat_session_id,
                                keep=False)  # kept as mcp:memory_block by serve's observer
        answer = {k: v for k, v in injection.to_dict().items() if k not in ("task", "prompt")}
        return {**answer, "block": printable(injection.block)}

    def mark_issue(
        self,
        issue_id: Annotated[str, Field(description="Issue id (see the issues tool).")],
        event: Annotated[Literal["resolved", "wontfix", "reopened"], Field(description="The new state.")],
        by: Annotated[str | None, Field(description="Run id that caused the change (default: the server's "
                                                    "$CYBERINE_RUN_ID).")] = None,
        detail: Annotated[str | None, Field(description="Why, in a sentence (secrets in it are redacted).")] = None,
        project: Project = None,
    ) -> MarkAnswer:
        """Record that an issue was resolved, will not be fixed (wontfix) or came back (reopened): one
        event appended to the ledger, which is never rewritten.

        Call it when your work fixed or reopened an issue that `issues` lists; pass its issueId, and
        your own run id as `by` when you know it.
        """
        store = self.store(project)
        before = store.issue_states_for([issue_id]).get(issue_id)
        written = store.mark_issue(issue_id, event, by=by or self.settings.run_id, detail=detail,
                                   redact_secrets=self.settings.redact_secrets)
        return {"project": store.slug, "issueId": issue_id, "before": before.state,
                "after": event if written else before.state, "written": [e.to_dict() for e in written]}

    def supersede(
        self,
        old_run_id: Annotated[str, Field(description="Run id (or unique prefix) of the record to correct.")],
        run: Annotated[dict[str, Any], Field(description="The corrected run as a JSON object: id (a new run id), "
                                                         "cwd, workflowName, task, status (done, error or cancelled), "
                                                         "startedAt and endedAt (epoch milliseconds), workers "
                                                         "([{agentId, state, output}]).")],
        run_id: Annotated[str | None, Field(description="Run id of the correcting record (default: the run's own).")] = None,
        project: Project = None,
    ) -> SupersedeAnswer:
        """Correct a past run's record: write a new record that supersedes it (the old one gains
        supersededBy; `show` and `search` give the correction from then on).

        Call it only when a record is wrong; old_run_id comes from `search` or `show`.
        """
        from .operations.write import write_run

        store = self.store(project)
        old = store.resolve_run_id(old_run_id)
        result = write_run(run, self.settings, cwd=str(self.cwd) if self.cwd else None, project=store.slug,
                           run_id=run_id, supersedes=old)
        return {**result.to_dict(), "supersedes": old}

    def projects(self) -> ProjectsAnswer:
        """The projects of this memory, with their directories and how many runs each recorded, and
        the project the other tools use when `project` is left out (defaultProject; null: none).

        Call it first when you do not know a project's slug, or when a tool answers that there is no
        default project; then pass a slug as `project` to the other tools.
        """
        listed = list_projects(self.settings.memory_dir)
        return {"memoryRoot": str(self.settings.memory_dir), "defaultProject": self.default_project(),
                "projects": [{"slug": p["slug"], "cwd": p["cwd"], "runs": p["records"]} for p in listed]}

    # --- resources --------------------------------------------------------------------

    def open_issues(self, project: str) -> list[dict]:
        """The project's open issues, as `cybmem issues --state open --all --json` prints them."""
        return self.issues(status="open", limit=0, project=project)["issues"]

    def record(self, project: str, run_id: str) -> dict:
        """A run's record, as `cybmem show RUN --json` prints it (its newest truth)."""
        from .explore.lineage import show_record

        return show_record(self.store(project), run_id).to_dict()


_READS = ("projects", "search", "show", "chain", "issues", "memory_block")
_WRITES = ("mark_issue", "supersede")
_TITLES = {"projects": "List projects", "search": "Search past runs", "show": "Show a run's record", "chain": "A run's chain",
           "issues": "Issues", "memory_block": "MEMORY block for a task", "mark_issue": "Mark an issue",
           "supersede": "Correct a record"}


def _text(name: str, answer: Answer) -> str:
    """The text of an answer: the block itself for memory_block, else the JSON that --json prints."""
    if name != "memory_block":
        return printable_json(answer)
    if answer["block"]:
        return answer["block"]
    return "\n".join([f"No MEMORY block for this task in project {answer['project']}."] + answer["warnings"])


def _add_tool(server: MCPServer, memory: Memory, name: str) -> None:
    method = getattr(memory, name)
    sig = inspect.signature(method, eval_str=True)

    @functools.wraps(method)
    async def tool(**arguments) -> CallToolResult:  # async: answered on the event loop (module docstring)
        answer = memory.call(name, arguments, lambda: method(**arguments))
        return CallToolResult(content=[TextContent(type="text", text=_text(name, answer))], structured_content=answer)

    del tool.__wrapped__  # the SDK reads the signature below: the method's, answering CallToolResult checked
    tool.__signature__ = sig.replace(return_annotation=Annotated[CallToolResult, sig.return_annotation])
    write = name in _WRITES
    server.add_tool(tool, name=name, title=_TITLES[name], description=inspect.getdoc(method),
                    annotations=ToolAnnotations(title=_TITLES[name], read_only_hint=not write, destructive_hint=False,
                                                idempotent_hint=name != "supersede", open_world_hint=False))


def build_server(memory: Memory) -> MCPServer:
    """The MCP server of ``memory``: its tools (the write tools only when ``memory.allow_writes``)
    and resources; while it runs, snapshots are held (module docstring)."""

    @contextlib.asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[dict]:
        with holding_snapshots():
            yield {}

    writes = ("on: mark_issue and supersede append to the store" if memory.allow_writes
              else "off (the server was started without --allow-writes)")
    server = MCPServer(
        "cybmem", version=__version__, lifespan=lifespan, log_level="WARNING",
        instructions=(f"Long-term memory of past coding-agent runs under {memory.settings.memory_dir}: what each run "
                      "was asked, what it did, the issues it left open, and how runs follow one another. Search it "
                      "before starting work and whenever a past run may have met the same problem; pass the runIds "
                      "it returns to show (the whole record) or chain (the runs around it); issues lists the known "
                      "problems; memory_block gives the preamble dispatch would give a task. Every tool takes "
                      "`project`; projects lists them and says which one is used when it is left out. Times are "
                      f"ISO 8601 in UTC. Writes are {writes}."),
    )
    for name in _READS + (_WRITES if memory.allow_writes else ()):
        _add_tool(server, memory, name)

    @server.resource("cybmem://projects/{project}/issues", name="open-issues", title="A project's open issues",
                     mime_type="application/json")
    async def open_issues(project: str) -> str:
        """The project's open issues, oldest first (as `cybmem issues --state open --json`)."""
        arguments = {"project": project}
        return printable_json(memory.call("open-issues", arguments, lambda: memory.open_issues(project), resource=True))

    @server.resource("cybmem://projects/{project}/runs/{run_id}", name="run-record", title="A run's record",
                     mime_type="application/json")
    async def run_record(project: str, run_id: str) -> str:
        """A run's record, its newest truth (as `cybmem show RUN --json`); the run id may be a unique prefix."""
        arguments = {"project": project, "run_id": run_id}
        return printable_json(memory.call("run-record", arguments, lambda: memory.record(project, run_id), resource=True))

    return server


#: Connections the kernel queues before the server accepts them (also how many the loop accepts
#: at a time).
_BACKLOG = 128


def _listen(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:port (0: a free one); only this machine can connect.

    It listens before the line that names the URL is printed: a client that connects as soon as it
    reads the line waits in the backlog while the HTTP app starts, instead of being refused.

    The protocol is named (IPPROTO_TCP, not 0): asyncio turns Nagle's algorithm off only on sockets
    that say they are TCP, and the connections accepted here inherit it. With Nagle on, the end of
    a chunked answer waited for the client's delayed ACK: every call on a kept-alive connection
    took 40 ms more (benchmarks/bench_mcp.py: a search over HTTP 53 ms against 1.5 ms in process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise CybmemError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} (choose another --http PORT, "
                          "or 0 for a free one)") from None
    return sock


#: Seconds an HTTP client has to send a whole request (its headers and its body), counted from
#: when it connects or its last answer was sent; an idle connection is closed after as long.
REQUEST_TIMEOUT = 5.0


class _Deadlines:
    """The HTTP server's per-connection deadlines (:data:`REQUEST_TIMEOUT`): a connection that is
    due a request and has not sent all of it in time is closed (``408`` first when part came).

    Two halves meet here: :meth:`protocol` wraps uvicorn's protocol for each connection (it sees
    the connection open, bytes arrive and the connection close) and :meth:`app` wraps the ASGI app
    (it sees the headers complete, the body read and the answer sent), keyed by the client's
    address. The time the app takes to answer is not bounded: a search may take long, a stream
    stays open."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.connections: dict[tuple, _Guarded] = {}

    def protocol(self, inner: type[asyncio.Protocol]) -> Callable[..., asyncio.Protocol]:
        """The protocol factory uvicorn calls (with its keyword arguments) for each connection."""
        return lambda **kwargs: _Guarded(inner(**kwargs), self)

    def app(self, app: Callable) -> Callable:
        async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
            guard = self.connections.get(tuple(scope.get("client") or ())) if scope["type"] == "http" else None
            if guard is None:
                return await app(scope, receive, send)
            guard.in_app = True
            if not any(name in (b"content-length", b"transfer-encoding") for name, _ in scope["headers"]):
                guard.met()  # no body to wait for (a GET, e.g. a stream the client listens on)

            async def body() -> dict:
                message = await receive()
                if message["type"] == "http.request" and not message.get("more_body"):
                    guard.met()
                return message

            async def answer(message: dict) -> None:
                await send(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    guard.due()  # the next request on this connection has its own deadline

            await app(scope, body, answer)

        return guarded


class _Guarded(asyncio.Protocol):
    """One HTTP connection: uvicorn's protocol, with the deadline of :class:`_Deadlines`."""

    def __init__(self, inner: asyncio.Protocol, deadlines: _Deadlines):
        self.inner, self.deadlines = inner, deadlines
        self.transport: asyncio.Transport | None = None
        self.peer: tuple = ()
        self.timer: asyncio.TimerHandle | None = None
        self.in_app = self.partial = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = tuple((transport.get_extra_info("peername") or ())[:2])
        self.deadlines.connections[self.peer] = self
        self.due()
        self.inner.connection_made(transport)

    def due(self) -> None:
        """A request is due: all of it must arrive within the deadline."""
        self.met()
        self.in_app = self.partial = False
        self.timer = asyncio.get_running_loop().call_later(self.deadlines.seconds, self._expired)

    def met(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.partial and not self.in_app:  # headers begun, never ended: the client is told why
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                                 b"connection: close\r\ncontent-length: 25\r\n\r\nrequest not sent in time\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.partial = True
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.met()
        if self.deadlines.connections.get(self.peer) is self:
            del self.deadlines.connections[self.peer]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _loop_errors(sock: socket.socket) -> Callable[[asyncio.AbstractEventLoop, dict], None]:
    """The event loop's error handler: running out of file descriptors is one line, once a minute
    at most (the loop waits a second and accepts again; connections wait in the backlog
    meanwhile), without the traceback whose printing needs descriptors. The loop's later tries to
    accept again on ``sock`` once it is closed (at shutdown) are not errors; the rest is said as the
    loop says it."""
    said = -60.0

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        nonlocal said
        exc = context.get("exception")
        if isinstance(exc, ValueError) and sock.fileno() == -1:
            return None
        if not (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)):
            return loop.default_exception_handler(context)
        if time.monotonic() - said >= 60:
            said = time.monotonic()
            print(f"cybmem mcp: warning: out of file descriptors ({exc.strerror}); new connections wait until "
                  "some close", file=sys.stderr, flush=True)

    return handle


async def _serve_http(server: MCPServer, sock: socket.socket) -> None:
    """Serve ``server`` on ``sock``: only its own origin (the scheme, host and port it listens on)
    is accepted, each request has :data:`REQUEST_TIMEOUT` to arrive, and running out of
    descriptors makes new connections wait instead of ending the server."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings
    from uvicorn.protocols.http.h11_impl import H11Protocol

    asyncio.get_running_loop().set_exception_handler(_loop_errors(sock))
    port = sock.getsockname()[1]
    own = TransportSecuritySettings(allowed_hosts=[f"127.0.0.1:{port}", f"localhost:{port}"],
                                    allowed_origins=[f"http://127.0.0.1:{port}"])
    deadlines = _Deadlines(REQUEST_TIMEOUT)
    app = deadlines.app(server.streamable_http_app(host="127.0.0.1", transport_security=own))
    config = uvicorn.Config(app, http=deadlines.protocol(H11Protocol), log_level="warning", lifespan="on",
                            timeout_keep_alive=int(REQUEST_TIMEOUT), backlog=_BACKLOG)
    await uvicorn.Server(config).serve(sockets=[sock])


def serve(settings: Settings, *, cwd: str | os.PathLike | None = None, project: str | None = None,
          http: int | None = None, allow_writes: bool = False) -> None:
    """Run ``cybmem mcp``: over stdio, or streamable HTTP at http://127.0.0.1:PORT/mcp (``http``;
    0 takes a free port). One line on stderr says what is served and where; returns when the
    client closes stdin, or on Ctrl-C / SIGTERM."""
    import anyio

    from .dispatch.feedback import mcp_observer

    # Plain lines on stderr, before the SDK would set up its rich handler: printing through that one
    # imports modules as it goes, which fails (and took the server down) once descriptors run out.
    logging.basicConfig(level=logging.WARNING, format="cybmem mcp: %(levelname)s: %(name)s: %(message)s")
    memory = Memory(settings, cwd=cwd, project=project, allow_writes=allow_writes)
    memory.observers.append(mcp_observer(settings, memory.store))  # what agents fetch, kept (cybmem.dispatch.feedback)
    server = build_server(memory)
    where, slug = Path(cwd or os.getcwd()).absolute(), project or memory.default_project()
    default = (f"default project {project}" if project else f"default project {slug} (of {where})" if slug else
               f"no default project ({where} is no project's directory: each call names one)")
    what = f"cybmem mcp: memory root {settings.memory_dir}, {default}, writes {'on' if allow_writes else 'off'}"
    try:
        if http is None:
            print(f"{what}; serving over stdio", file=sys.stderr, flush=True)
            server.run()
        else:
            sock = _listen(http)
            print(f"{what}; serving streamable HTTP at http://127.0.0.1:{sock.getsockname()[1]}/mcp",
                  file=sys.stderr, flush=True)
            anyio.run(_serve_http, server, sock)
    except KeyboardInterrupt:
        pass
