"""What the MCP server serves: :class:`MemoryTools`, the tools and resources over one library handle
(:class:`cybmem.memory.Memory`: a memory root, its default project) and whether writes are on; each
tool translates its arguments, makes one call on the handle (the same one the command line makes)
and gives its answer as agents get it (:mod:`cybmem.mcp.schema`). Every call goes through
:meth:`MemoryTools.call`: one at a time, a library error becomes an MCP error with the message the
command line gives it (:func:`cybmem.answers.error_message`, in tool terms), and ``observers`` see
each answer. The tools' descriptions (their docstrings) are what every connecting model reads;
tests/mcp/test_server.py holds their claims against what the tools answer."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from ..answers import error_message, printable, warnings_of
from ..errors import CybmemError, NotFoundError, ValidationError
from ..memory import Memory
from ..settings import Settings

try:
    from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
    from pydantic import Field
except ImportError as exc:  # an install without the dependency, or mcp 1.x
    raise CybmemError("cybmem mcp needs the MCP Python SDK 2.x: pip install 'mcp>=2.3,<3' "
                      f"(importing it failed: {exc})") from None

from .schema import (AsOf, Answer, BlockAnswer, ChainAnswer, IssuesAnswer, MarkAnswer, Project, ProjectsAnswer, RunId,
                     SearchAnswer, ShowAnswer, SupersedeAnswer, for_agents, in_tool_terms)

__all__ = ["MemoryTools", "DEFAULT_K", "DEFAULT_LIMIT", "DEFAULT_CONTEXT"]

#: The tools' defaults, named in their schemas (tests/mcp/test_server.py holds them against the answers).
DEFAULT_K = 10
DEFAULT_LIMIT = 50
DEFAULT_CONTEXT = 5


class MemoryTools:
    """What the server serves: a library handle (its memory root and default project) and whether
    writes are on.

    The tool methods return the library's answers as dicts, so they are the same call in-process.
    """

    def __init__(self, memory: Memory, *, allow_writes: bool = False):
        self.memory = memory
        self.allow_writes = allow_writes
        #: Called as ``observer(name, arguments, answer)`` after every call that answered (a tool
        #: or a resource): the place to keep what an agent fetched. An observer that raises is
        #: reported on stderr; the call still answers.
        self.observers: list[Callable[[str, dict, Answer], None]] = []
        self._lock = threading.Lock()
        #: The stores the call being answered opened, by the project asked (None: the default one):
        #: its observers find the project without looking it up on disk again.
        self._opened: dict[str | None, Any] | None = None

    @property
    def settings(self) -> Settings:
        return self.memory.settings

    def store(self, project: str | None) -> Any:
        """The store of ``project``, else of the server's project (NotFoundError names the known ones;
        without a default project, it says to pass ``project``). Looked up on disk once a call."""
        key = project or self.memory.project
        if self._opened is not None and key in self._opened:
            return self._opened[key]
        store = self._open(key)
        if self._opened is not None:
            self._opened[key] = store
        return store

    def _open(self, project: str | None) -> Any:
        if project:
            return self.memory.store(project)
        try:
            return self.memory.store()
        except (NotFoundError, ValidationError):  # e.g. a desktop client starts its servers in /
            where = Path(self.memory.cwd or os.getcwd()).absolute()
            slugs = ", ".join(p["slug"] for p in self.memory.projects()) or "none yet"
            raise NotFoundError(f"no default project: this server was started in {where}, which is no project's "
                                f"directory under {self.memory.root}; pass the `project` argument, one of: "
                                f"{slugs} (the projects tool lists them with their run counts)") from None

    def default_project(self) -> str | None:
        """The project a call that names none works on, or None when there is none."""
        try:
            return self.store(None).slug
        except CybmemError:
            return None

    def call(self, name: str, arguments: dict, fn: Callable[[], Answer], *, resource: bool = False) -> Answer:
        """Answer one call: one at a time, as agents get answers (:func:`for_agents`); a library
        error becomes the MCP error that carries its message in tool terms (ToolError: an
        ``isError`` result; for a resource, a protocol error)."""
        with self._lock:
            self._opened = {}
            try:
                answer = for_agents(fn())
            except (CybmemError, OSError) as exc:  # OSError: a store broken in a way the library did not name
                kind = (ResourceNotFoundError if isinstance(exc, NotFoundError) else ResourceError) if resource else ToolError
                raise kind(in_tool_terms(error_message(exc))) from None
            else:
                for observe in self.observers:
                    try:
                        observe(name, arguments, answer)
                    except Exception as exc:  # noqa: BLE001 - keeping a log never fails the answer
                        print(f"cybmem mcp: warning: observer {observe!r} failed: {type(exc).__name__}: {exc}",
                              file=sys.stderr)
            finally:
                self._opened = None
        return answer

    # --- tools ------------------------------------------------------------------------

    def search(
        self,
        query: Annotated[str, Field(description="What to look for: free text, e.g. the task at hand.")],
        k: Annotated[int, Field(ge=1, description="How many results.")] = DEFAULT_K,
        project: Project = None,
        as_of: AsOf = None,
        explain: Annotated[bool, Field(description="Add each hit's per-axis contributions and values.")] = False,
    ) -> SearchAnswer:
        """Find the past runs of a project that relate to a text, best first (scored on keywords,
        recency and lineage, and on meaning where the project has embeddings).

        Call it before starting work, and whenever a past run may have met the same problem: a failing
        test, an error message, a file or feature name. Each hit has its runId, task, summary, the
        issues it raised and its next steps. Pass a hit's runId to `show` for the whole record, or to
        `chain` for the runs before and after it. For the known open problems, call `issues`.
        """
        store = self.store(project)
        result = self.memory.search(query, project=store, k=k, as_of=Memory.moment(as_of, "as_of"))
        return {"project": store.slug, **result.to_dict(explain=explain),
                "warnings": warnings_of(result.snapshot.problems, result.warnings)}

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
        store = self.store(project)
        shown = self.memory.show(run_id, project=store, original=original)
        return {"project": store.slug, "record": shown.record.to_dict(), "supersededChain": shown.superseded,
                "warnings": warnings_of(store.problems)}

    def chain(
        self,
        run_id: RunId,
        context: Annotated[int, Field(ge=0, description="Runs shown each side of the run; 0: the whole chain.")] = DEFAULT_CONTEXT,
        project: Project = None,
    ) -> ChainAnswer:
        """A run's place in history: the runs before and after it in its project, the run that
        dispatched it (parentRunId) and the ones it dispatched (children), the runs of its chat
        session, and the issues it raised that are still open.

        Call it with a runId from `search` or `show` to see what was tried before a run and what
        followed it. Every run it lists can go to `show`.
        """
        store = self.store(project)
        result = self.memory.chain(run_id, project=store, context=context or None)
        return {"project": store.slug, **result.to_dict(), "warnings": warnings_of(store.problems)}

    def issues(
        self,
        status: Annotated[Literal["open", "all"], Field(description="open, or all (closed ones too).")] = "open",
        query: Annotated[str | None, Field(description="Rank the open issues against this text, with the scorer the "
                                                       "MEMORY block uses (best first, each with its score); "
                                                       "status must then be open.")] = None,
        limit: Annotated[int, Field(ge=0, description="At most this many (0: all).")] = DEFAULT_LIMIT,
        project: Project = None,
    ) -> IssuesAnswer:
        """A project's issues from its issue ledger: the open ones, newest opened first (status='all':
        then the closed ones, most recently closed first); with a query, the open ones ranked against
        it, best first, each with its score and its keyword, lineage and recency contributions.

        Call it to learn the known problems before working on something, or to find an issue's
        issueId (for `mark_issue`). openedBy is the run that raised the issue: pass it to `show`.
        """
        store = self.store(project)
        if query and status != "open":
            raise ValidationError("a query ranks the open issues: leave status out (or 'open') with a query, or leave "
                                  "the query out to list every issue with status='all'")
        if query:
            got = self.memory.issues(project=store, query=query, limit=limit)
        else:
            wanted = self.memory.issue_filter(state="open" if status == "open" else None, all=True)
            got = self.memory.issues(wanted, project=store, limit=limit)
        return {"project": store.slug, "status": status, "query": query, "total": got.page.total,
                "issues": [issue.to_dict() for issue in got.page.items], "warnings": warnings_of(got.warnings)}

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
        store = self.store(project)  # an unknown project is an error here; the block would go on without memory
        injection = self.memory.memory_block(task, project=store, as_of=Memory.moment(as_of, "as_of"),
                                             parent_run_id=parent_run_id, chat_session_id=chat_session_id,
                                             never_fail=True, keep=False)  # kept as mcp:memory_block by serve's observer
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
        return self.memory.mark(issue_id, event, project=self.store(project), by=by, detail=detail).to_dict()

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
        return self.memory.supersede(old_run_id, run, project=self.store(project), run_id=run_id).to_dict()

    def projects(self) -> ProjectsAnswer:
        """The projects of this memory, with their directories and how many runs each recorded, and
        the project the other tools use when `project` is left out (defaultProject; null: none).

        Call it first when you do not know a project's slug, or when a tool answers that there is no
        default project; then pass a slug as `project` to the other tools.
        """
        listed = self.memory.projects()
        return {"memoryRoot": str(self.memory.root), "defaultProject": self.default_project(),
                "projects": [{"slug": p["slug"], "cwd": p["cwd"], "runs": p["records"]} for p in listed]}

    # --- resources --------------------------------------------------------------------

    def open_issues(self, project: str) -> list[dict]:
        """The project's open issues, newest opened first (as `cybmem issues --state open --json`)."""
        return self.issues(status="open", limit=0, project=project)["issues"]

    def record(self, project: str, run_id: str) -> dict:
        """A run's record, its newest truth (as `cybmem show RUN --json`); the run id may be a unique prefix."""
        return self.memory.show(run_id, project=self.store(project)).to_dict()

