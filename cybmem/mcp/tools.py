"""What the MCP server serves: :class:`Memory`, one memory root, its default project and whether
writes are on; each tool a thin call of the library (the same one the command line makes), its
answer as agents get it (:mod:`cybmem.mcp.schema`). Every call goes through :meth:`Memory.call`:
one at a time, a library error becomes an MCP error with the message the command line gives it
(:func:`cybmem.answers.error_message`, in tool terms), and ``observers`` see each answer."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from ..answers import error_message, warnings_of
from ..errors import CybmemError, NotFoundError, ValidationError
from ..settings import Settings
from ..store.memory_store import MemoryStore
from ..store.outcome import printable
from ..store.projects import list_projects
from ..store.records import parse_moment
from ..store.loading import load_snapshot
from ..store.snapshot import Snapshot

try:
    from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
    from pydantic import Field
except ImportError as exc:  # an install without the dependency, or mcp 1.x
    raise CybmemError("cybmem mcp needs the MCP Python SDK 2.x: pip install 'mcp>=2.3,<3' "
                      f"(importing it failed: {exc})") from None

from .schema import (AsOf, Answer, BlockAnswer, ChainAnswer, IssuesAnswer, MarkAnswer, Project, ProjectsAnswer, RunId,
                     SearchAnswer, ShowAnswer, SupersedeAnswer, for_agents, in_tool_terms)

__all__ = ["Memory"]


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
        #: The stores the call being answered opened, by the project asked (None: the default one):
        #: its observers find the project without looking it up on disk again.
        self._opened: dict[str | None, MemoryStore] | None = None

    def store(self, project: str | None) -> MemoryStore:
        """The store of ``project``, else of the server's project (NotFoundError names the known ones;
        without a default project, it says to pass ``project``). Looked up on disk once a call."""
        key = project or self.project
        if self._opened is not None and key in self._opened:
            return self._opened[key]
        store = self._open(key)
        if self._opened is not None:
            self._opened[key] = store
        return store

    def _open(self, project: str | None) -> MemoryStore:
        if project:
            return MemoryStore.open(self.settings, cwd=self.cwd, project=project)
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
        from ..retrieval.search import search

        store = self.store(project)
        result = search(store, query, k=k, settings=self.settings, as_of=parse_moment(as_of, "as_of"))
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
        from ..explore.lineage import show_record

        store = self.store(project)
        shown = show_record(store, run_id, original=original)
        return {"project": store.slug, "record": shown.record.to_dict(), "supersededChain": shown.superseded,
                "warnings": warnings_of(store.problems)}

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
        from ..explore.lineage import chain_view

        store = self.store(project)
        result = chain_view(store, run_id, context=context or None)
        return {"project": store.slug, **result.to_dict(), "warnings": warnings_of(store.problems)}

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
            from ..retrieval.issue_ranking import rank_open_issues

            ranked, _, found = rank_open_issues(snap, query, settings=self.settings, limit=limit or None,
                                                states=self._issue_list(snap, "by id"))
            warnings.append(found)
            items = [issue.to_dict() for issue in ranked]
            if status == "all":  # the closed ones after them, in the order listed
                items += [s.to_dict() for s in listed if not s.is_open][:max(limit - len(items), 0) if limit else None]
        return {"project": store.slug, "status": status, "query": query, "total": len(listed), "issues": items,
                "warnings": warnings_of(*warnings)}

    def _issue_list(self, snap: Snapshot, status: str):
        """The issues of ``status`` in the order `cybmem issues` lists them ("by id": all, by id), kept
        with the snapshot they came from: a held snapshot answers many calls, and a ledger can hold
        tens of thousands of issues."""
        from ..retrieval.filters import IssueFilter, select_issues
        from ..store.ledger import states_from_table

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
        from ..dispatch.inject import inject_task

        store = self.store(project)  # an unknown project is an error here; inject would go on without a block
        injection = inject_task(task, self.settings, project=store.slug, as_of=parse_moment(as_of, "as_of"),
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
        from ..operations.write import mark_issue

        return mark_issue(self.store(project), issue_id, event, self.settings, by=by, detail=detail).to_dict()

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
        from ..operations.write import supersede_run

        return supersede_run(self.store(project), old_run_id, run, self.settings,
                             cwd=str(self.cwd) if self.cwd else None, run_id=run_id).to_dict()

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
        from ..explore.lineage import show_record

        return show_record(self.store(project), run_id).to_dict()

