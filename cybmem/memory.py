"""The library handle: one memory root and its settings, opened once, with every operation a front
offers as one method (:class:`Memory`).

The command line (:mod:`cybmem.cli`), the MCP server (:mod:`cybmem.mcp`) and the agent hooks
translate their arguments, make one call on a handle and render the library's answer (each result
has its ``to_dict``). The rules a front used to hold live here once: the dispatch block that never
fails the dispatcher (:meth:`Memory.memory_block` with ``never_fail``), hook mode's failure line
(:func:`not_written`), the window of the default issue view (:meth:`Memory.issue_filter`), one issue
listing for every front (:meth:`Memory.issues`). :meth:`Memory.from_env` is the one call that reads
the environment, and only fronts make it; a notebook or a test builds ``Memory(settings)``.

Each method imports what it needs when called: the dispatch path (``cybmem inject``) loads no more
than the block needs (tests/cli/test_startup.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .errors import CybmemError, ValidationError
from .settings import Settings

if TYPE_CHECKING:  # pragma: no cover - what editors see; each method imports its module when called
    from .dispatch.inject import Injection
    from .exchange.fleet import Fleet
    from .exchange.summary import ExportSummary
    from .explore.lineage import ChainResult, Shown
    from .operations.doctor import Rebuilt
    from .operations.doctor_report import DoctorReport
    from .operations.hook_settings import HookChange, HookStatus
    from .operations.redaction import ScrubResult
    from .operations.report import NotebookFleet, NotebookStore, ReportResult
    from .operations.retune import Tuning
    from .operations.write import IssueMark, WriteResult
    from .retrieval.embed_backfill import EmbedResult
    from .retrieval.filters import IssueFilter, IssueListing, Page, RecordFilter
    from .retrieval.search import SearchResult
    from .retrieval.tuning import Evaluation
    from .store.memory_store import MemoryStore

__all__ = ["Memory", "NotWritten", "not_written", "EXPORT_FORMATS"]

#: The formats :meth:`Memory.export` writes.
EXPORT_FORMATS = ("ndjson", "csv", "parquet", "sqlite", "prov")

@dataclass(frozen=True)
class NotWritten:
    """What hook mode gives back instead of raising: the run was not recorded, and ``message`` (one
    line) says why; the run itself goes on."""

    message: str


def not_written(exc: BaseException, *, named: tuple[type[BaseException], ...] = ()) -> NotWritten:
    """Hook mode's one rule for a failure: a failure cybmem named (a :class:`CybmemError`, an
    OSError, or one of ``named``, a front's own usage errors) reads as its message, anything else
    as ``unexpected Type: message``; always on one line."""
    message = str(exc) if isinstance(exc, (CybmemError, OSError, *named)) else f"unexpected {type(exc).__name__}: {exc}"
    return NotWritten(f"memory record not written: {' '.join(message.split())}")


class Memory:
    """One memory root and its settings, opened once: every operation the fronts offer.

    Args:
        settings: the memory root and every setting (:class:`~cybmem.settings.Settings`).
        cwd / project: the default project of the methods that take ``project`` (default: the
            project of the current directory).
        hold: keep each project's snapshot warm between calls while the handle is entered
            (``with memory: ...``), for a long-lived reader such as ``cybmem mcp``
            (:func:`cybmem.store.loading.holding_snapshots`).

    Methods take ``project``: a slug, or a store :meth:`store` opened (so that a front that opened
    it once does not look it up on disk again); None means the default project.

    Example::

        memory = Memory(Settings.from_env({}, memory_dir="data-fixtures/memory"), project="web")
        hits = memory.search("flaky cart drawer test", k=3).hits
    """

    def __init__(self, settings: Settings, *, cwd: str | os.PathLike | None = None, project: str | None = None,
                 hold: bool = False):
        self.settings = settings
        self.cwd = cwd
        self.project = project
        self.hold = hold
        self._held: contextlib.ExitStack | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, memory_dir: str | os.PathLike | None = None,
                 lenient: bool = False, cwd: str | os.PathLike | None = None, project: str | None = None,
                 hold: bool = False) -> "Memory":
        """A handle on the memory the environment names (``env``, default ``os.environ``): the one
        call that reads it (:meth:`Settings.from_env <cybmem.settings.Settings.from_env>`; ``lenient``:
        a malformed number falls back to its default and is listed in ``settings.problems``). Only
        fronts call it."""
        return cls(Settings.from_env(env, memory_dir=memory_dir, lenient=lenient), cwd=cwd, project=project, hold=hold)

    @staticmethod
    def for_notebook(memory_dir: str | os.PathLike | None = None, project: str | None = None, *,
                     env: Mapping[str, str] | None = None) -> "NotebookStore":
        """What a notebook reads (a front, as the command line is): its MEMORY_DIR and PROJECT
        parameters, else the environment (``env``, default ``os.environ``; a relative root is
        relative to where Jupyter was started), else the checkout's fixtures
        (:func:`cybmem.operations.report.open_notebook_store`); ``str()`` says which and why.

        Raises:
            NotFoundError: no such project, or several and none chosen (the message says how to name one).
        """
        from .operations.report import open_notebook_store

        return open_notebook_store(memory_dir, project, Settings.from_env(env, relative_to=Settings.started_in(env)))

    @staticmethod
    def fleet_for_notebook(dataset: str | os.PathLike | None = None, memory_dir: str | os.PathLike | None = None,
                           project: str | None = None, *, env: Mapping[str, str] | None = None) -> "NotebookFleet":
        """The fleet notebook's dataset: its DATASET parameter, else one exported from the store
        :meth:`for_notebook` would read (:func:`cybmem.operations.report.open_notebook_fleet`)."""
        from .operations.report import open_notebook_fleet

        settings = Settings.from_env(env, lenient=True, relative_to=Settings.started_in(env))
        return open_notebook_fleet(dataset, memory_dir, project, settings)

    def __repr__(self) -> str:
        return f"Memory({str(self.root)!r}, project={self.project!r})"

    @property
    def root(self) -> Path:
        """The memory root."""
        return self.settings.memory_dir

    def __enter__(self) -> "Memory":
        if self.hold and self._held is None:
            from .store.loading import holding_snapshots

            self._held = contextlib.ExitStack()
            self._held.enter_context(holding_snapshots())
        return self

    def __exit__(self, *exc: object) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    @contextlib.contextmanager
    def _redacting(self) -> "Iterator[None]":
        """The redaction passes within see with the scanner the settings name (``secret_scanner``),
        and the one before is back after: the passes take it from the caller, never from the
        environment. Nothing is imported when no scanner is named and none was loaded."""
        name = self.settings.secret_scanner
        if name is None and "cybmem.store.secret_scanner" not in sys.modules:
            yield
            return
        from .store import secret_scanner

        before = secret_scanner.use_scanner(name)
        try:
            yield
        finally:
            secret_scanner.use_scanner(before)

    # --- projects ----------------------------------------------------------------------

    def store(self, project: "str | MemoryStore | None" = None, *, create: bool = False) -> "MemoryStore":
        """The store of ``project`` (default: the handle's project, else the one of its ``cwd``).

        Raises:
            NotFoundError: no such project (the message names the known ones).
        """
        from .store.memory_store import MemoryStore

        if isinstance(project, MemoryStore):
            return project
        return MemoryStore.open(self.settings, cwd=self.cwd, project=project or self.project, create=create)

    def projects(self) -> list[dict]:
        """The projects of the memory root: slug, cwd, records (``cybmem projects``)."""
        from .store.projects import list_projects

        return list_projects(self.root)

    def check_project(self, project: str | None = None) -> None:
        """Refuse a project name as every verb would (one that only looks like a known project:
        ``web.7663e1`` beside ``web-7663e1``); a new name passes, as a write may make it."""
        name = project or self.project
        if name and self.root.is_dir():
            from .store.projects import select_project

            select_project(self.root, project=name, create=True, peek=True)

    @staticmethod
    def train_ranker(roots: Sequence[str | os.PathLike], *, out: str | os.PathLike | None = None,
                     progress: bool | None = None) -> dict:
        """Train the learned ranker on memory roots with judgments (each a qrels.jsonl), write its
        model (default: the shipped file) and give the leave-one-history-out table
        (:func:`cybmem.retrieval.ranker_training.train_roots`; needs the ``train`` extra)."""
        from .retrieval.ranker_training import train_roots

        return train_roots(list(roots), out=out, progress=progress)

    @staticmethod
    def ranker_model(path: str | os.PathLike | None = None) -> dict:
        """The learned ranker's model (default: the shipped one): its provenance and size
        (:func:`cybmem.retrieval.ranker.describe`)."""
        from .retrieval.ranker import describe

        return describe(path)

    @staticmethod
    def moment(value: str | int | None, name: str, *, end_of_day: bool = False) -> int | None:
        """A moment a front was given (epoch ms or ISO 8601; a bare year, month or date means its
        start, or with ``end_of_day`` its last millisecond) as epoch ms; None when not given.

        Raises:
            ValidationError: naming ``name``, with the forms accepted.
        """
        from .store.records import parse_moment

        return parse_moment(value, name, end_of_day=end_of_day)

    @staticmethod
    def record_filter(*, since: int | None = None, until: int | None = None, state: str | Sequence[str] | None = None,
                      grep: str | None = None, agent: str | None = None, issue: str | None = None) -> "RecordFilter":
        """Which records a read keeps (:class:`cybmem.retrieval.filters.RecordFilter`); unset: all.

        Raises:
            ValidationError: a state that is none of done, error, cancelled.
        """
        from .retrieval.filters import RecordFilter

        return RecordFilter.make(since=since, until=until, state=state, grep=grep, agent=agent, issue=issue)

    # --- reading -----------------------------------------------------------------------

    def runs(self, *, project: "str | MemoryStore | None" = None, filter: "RecordFilter | None" = None,
             offset: int = 0, limit: int | None = 50) -> "Page":
        """A project's records, newest first, one page (``cybmem list``; 0 or None: all)."""
        from .retrieval.filters import list_records

        return list_records(self.store(project), filter, offset=offset, limit=limit)

    def show(self, run_id: str, *, project: "str | MemoryStore | None" = None, original: bool = False) -> "Shown":
        """One record in full, its newest truth (``original``: the asked record itself)."""
        from .explore.lineage import show_record

        return show_record(self.store(project), run_id, original=original)

    def chain(self, run_id: str, *, project: "str | MemoryStore | None" = None, filter: "RecordFilter | None" = None,
              context: int | None = 5, offset: int = 0, limit: int | None = None,
              whole_tasks: bool = False) -> "ChainResult":
        """A run's chain: ``context`` runs each side (None: all), or one page of it; its parent,
        children, chat session and open issues."""
        from .explore.lineage import chain_view

        return chain_view(self.store(project), run_id, filter=filter, context=context, offset=offset, limit=limit,
                          whole_tasks=whole_tasks)

    def issue_filter(self, *, state: str | Sequence[str] | None = None, since: int | None = None,
                     until: int | None = None, grep: str | None = None, all: bool = False) -> "IssueFilter":
        """Which issues a listing keeps. The default view shows a closed issue for
        ``settings.issue_window_days`` after it closed; ``all`` keeps every issue.

        Raises:
            ValidationError: a state that is none of open, closed and the ledger's four.
        """
        from .retrieval.filters import IssueFilter

        return IssueFilter.make(state=state, since=since, until=until, grep=grep,
                                window_days=None if all else self.settings.issue_window_days)

    def issues(self, filter: "IssueFilter | None" = None, *, project: "str | MemoryStore | None" = None,
               query: str | None = None, events: bool = False, as_of: int | None = None, offset: int = 0,
               limit: int | None = 50, newest_first: bool = True) -> "IssueListing":
        """A project's issues, the one listing every front shows.

        Without ``query``: the issues ``filter`` keeps (default: :meth:`issue_filter`'s view), open
        ones first, newest opened first (``newest_first=False``: oldest first), then the closed ones,
        most recently closed first. ``events``: the ledger's events instead, in file order (those the
        filter's states name, since and until, grep). With ``query``: the open issues ranked against
        it, best first, each with its score, the keyword, lineage and recency contributions and the
        run it came through (the scorer of the MEMORY block). ``as_of``: the ledger as it was then.

        Raises:
            ValidationError: a query with a filter, events or ``newest_first=False``.
        """
        from .retrieval.filters import IssueListing, Page, list_issue_events, list_issues

        store = self.store(project)
        if query is not None:
            if filter is not None or events or not newest_first:
                raise ValidationError("a query ranks the open issues, best first; a filter, events and the order "
                                      "are for the listing (leave one of them out)")
            from .retrieval.issue_ranking import rank_open_issues
            from .store.loading import load_snapshot

            ranked, total, found = rank_open_issues(load_snapshot(store), query, settings=self.settings, as_of=as_of,
                                                    offset=offset, limit=limit or None)
            return IssueListing(Page(ranked, total, offset, limit or None), warnings=found)
        f = filter if filter is not None else self.issue_filter()
        if events:
            return list_issue_events(store, since=f.since, until=f.until, events_named=f.states, grep=f.grep,
                                     as_of=as_of, offset=offset, limit=limit)
        return list_issues(store, f, as_of=as_of, offset=offset, limit=limit, newest_first=newest_first)

    # --- retrieval and dispatch --------------------------------------------------------

    def search(self, query: str, *, project: "str | MemoryStore | None" = None, k: int = 10, offset: int = 0,
               as_of: int | None = None, now_ms: int | None = None, parent_run_id: str | None = None,
               chat_session_id: str | None = None, filter: "RecordFilter | None" = None) -> "SearchResult":
        """The top ``k`` records of a project for ``query`` (after ``offset``), scored on every axis."""
        from .retrieval.search import search

        return search(self.store(project), query, k=k, offset=offset, settings=self.settings, as_of=as_of,
                      now_ms=now_ms, parent_run_id=parent_run_id, chat_session_id=chat_session_id, filter=filter)

    def memory_block(self, task: str, *, project: "str | MemoryStore | None" = None, as_of: int | None = None,
                     now_ms: int | None = None, parent_run_id: str | None = None, chat_session_id: str | None = None,
                     never_fail: bool = False, keep: bool = True) -> "Injection":
        """The MEMORY block for ``task``, and the task with the block ahead of it (``.prompt``).

        ``never_fail`` (the dispatch path): whatever is wrong with memory, the task comes back, with
        the block that could be built (possibly none) and each problem as one line in ``warnings``;
        without it the first problem raises. ``keep``: note in shown.jsonl what the block showed.
        """
        from .dispatch.inject import inject_task

        named = project.slug if project is not None and not isinstance(project, str) else project
        try:
            return inject_task(task, self.settings, cwd=self.cwd, project=named or self.project, as_of=as_of,
                               now_ms=now_ms, parent_run_id=parent_run_id, chat_session_id=chat_session_id,
                               strict=not never_fail, keep=keep)
        except CybmemError:
            raise
        except Exception as exc:  # noqa: BLE001 - the dispatch path never fails the dispatcher
            if not never_fail:
                raise
            return self.not_injected(task, f"memory not injected (unexpected {type(exc).__name__}: {exc})",
                                     project=named or self.project)

    @staticmethod
    def not_injected(task: str, why: str, *, project: str | None = None) -> "Injection":
        """The task given back without a block, ``why`` its one warning: what the dispatch path
        gives when it cannot use what it was given (a moment that is none), reading no memory."""
        from .dispatch.inject import Injection

        return Injection(task, "", project, [why])

    @staticmethod
    def strip(text: str) -> str:
        """``text`` without the MEMORY block, the human task lifted out of a TASK: wrapper."""
        from .dispatch.preamble import strip

        return strip(text)

    def embed(self, *, project: "str | MemoryStore | None" = None, progress: bool | None = None) -> "EmbedResult":
        """Embed the records of a project that have no vector for the configured model."""
        from .retrieval.embed_backfill import embed_missing

        return embed_missing(self.store(project), self.settings, progress=progress)

    # --- writing -----------------------------------------------------------------------

    @staticmethod
    def read_run(path: str | os.PathLike) -> bytes:
        """The bytes of a run.json (a regular file, within the size cap).

        Raises:
            ValidationError: no such file, or one that may not be read.
        """
        from .operations.write import read_run_file

        return read_run_file(path)

    def write(self, run: "bytes | str | os.PathLike | BinaryIO | Mapping[str, Any]", *, project: str | None = None,
              cwd: str | os.PathLike | None = None, run_id: str | None = None, parent_run_id: str | None = None,
              chat_session_id: str | None = None, hook: bool = False,
              named: tuple[type[BaseException], ...] = (),
              while_distilling: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
              ) -> "WriteResult | NotWritten":
        """Record a finished run: ``run`` is its JSON (bytes or text: a run.json or a hook payload),
        a :class:`~pathlib.Path` or a binary stream to read it from, or the run decoded.

        ``hook``: never raise; a failure comes back as :class:`NotWritten` (:func:`not_written`,
        ``named`` the front's own errors) and the run goes on. ``while_distilling``: a context the
        model call runs in (a front's signal handling).
        """
        from .operations.write import load_run_payload, write_run

        try:
            if isinstance(run, os.PathLike):
                run = self.read_run(run)
            elif hasattr(run, "read"):
                run = run.read()
            payload = load_run_payload(run) if isinstance(run, (bytes, str)) else run
            where = cwd if cwd is not None else self.cwd
            with self._redacting():
                return write_run(payload, self.settings, cwd=str(where) if where else None,
                                 project=project or self.project, run_id=run_id, parent_run_id=parent_run_id,
                                 chat_session_id=chat_session_id,
                                 while_distilling=while_distilling or contextlib.nullcontext)
        except Exception as exc:  # noqa: BLE001 - hook mode: a memory failure must never take the run down
            if not hook:
                raise
            return not_written(exc, named=named)

    def supersede(self, old_run_id: str, run: "bytes | str | Mapping[str, Any]", *,
                  project: "str | MemoryStore | None" = None, run_id: str | None = None,
                  while_distilling: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> "WriteResult":
        """Correct a record: write ``run`` (with its own new run id) as a record that supersedes it."""
        from .operations.write import load_run_payload, supersede_run

        store = self.store(project)
        payload = load_run_payload(run) if isinstance(run, (bytes, str)) else run
        with self._redacting():
            return supersede_run(store, old_run_id, payload, self.settings, cwd=str(self.cwd) if self.cwd else None,
                                 run_id=run_id, while_distilling=while_distilling or contextlib.nullcontext)

    def mark(self, issue_id: str, event: str, *, project: "str | MemoryStore | None" = None, by: str | None = None,
             detail: str | None = None) -> "IssueMark":
        """Append an issue's change of state (resolved, wontfix, reopened) to the ledger."""
        from .operations.write import mark_issue

        store = self.store(project)
        with self._redacting():
            return mark_issue(store, issue_id, event, self.settings, by=by, detail=detail)

    def redact(self, run_ids: Sequence[str] | None, *, project: "str | MemoryStore | None" = None,
               secrets: Sequence[str] = (), patterns: bool = True) -> "ScrubResult":
        """Remove secrets from runs everywhere they were copied (``run_ids=None``: every run that
        holds one of ``secrets``)."""
        from .operations.redaction import scrub_runs

        store = self.store(project)
        with self._redacting():
            return scrub_runs(store, None if run_ids is None else list(run_ids), secrets=list(secrets),
                              patterns=patterns)

    def rebuild(self, *, project: "str | MemoryStore | None" = None, full: bool = False) -> "Rebuilt":
        """Regenerate index.json from records/ (``full``: no compaction)."""
        from .operations.doctor import rebuild

        return rebuild(self.store(project), self.settings, full=full)

    # --- tuning ------------------------------------------------------------------------

    @staticmethod
    def check_metric(metric: str) -> None:
        """Raise ValidationError unless ``metric`` is one the tuning scores with (mrr, ndcg, recall)."""
        from .retrieval.judgments import METRICS

        if metric not in METRICS:
            raise ValidationError(f"{metric!r} is not one of {', '.join(METRICS)}")

    @staticmethod
    def judgment_kinds(derive: str) -> list[str]:
        """The kinds of judgment ``derive`` names, comma-separated (``issue``: raised, resolved and
        reopened).

        Raises:
            ValidationError: none, or a kind that is not one.
        """
        from .retrieval.judgments import JUDGMENT_KINDS

        kinds = [x for x in derive.replace(" ", "").split(",") if x]
        if not kinds or set(kinds) - set(JUDGMENT_KINDS) - {"issue"}:
            raise ValidationError(f"{derive!r}: choose from issue, {', '.join(JUDGMENT_KINDS)}")
        return kinds

    def tune(self, *, project: "str | MemoryStore | None" = None, save: bool = False, force: bool = False,
             **kwargs: Any) -> "Tuning":
        """Tune a project's weights on judgments, check them on later ones and, with ``save``, write
        what passes to the project's weights file (``Tuning.target``)."""
        from .operations.retune import tune_and_save

        return tune_and_save(self.store(project), self.settings, save=save, force=force, **kwargs)

    def auto_tune(self, *, project: "str | MemoryStore | None" = None, progress: bool | None = False) -> str:
        """Tune on the store's own judgments and save only what passes every check: one line."""
        from .operations.retune import auto_tune

        return auto_tune(self.store(project), self.settings, progress=progress)

    def eval(self, *, project: "str | MemoryStore | None" = None, given: Mapping[str, float] | None = None,
             weights_file: str | os.PathLike | None = None, **kwargs: Any) -> "Evaluation":
        """Score fixed weights on judgments beside the ones production uses."""
        from .retrieval.tuning import compare_weights

        return compare_weights(self.store(project), self.settings, given=given, weights_file=weights_file, **kwargs)

    # --- looking after a store ---------------------------------------------------------

    def doctor(self, *, project: str | None = None, all_projects: bool = False, repair: bool = False,
               secrets: bool = False, temp_age: float = 60) -> "DoctorReport":
        """Check the store (a project, or ``all_projects``); ``repair`` rebuilds what is derived."""
        from .operations.doctor import doctor

        with self._redacting():
            return doctor(self.settings, project=project or self.project, cwd=self.cwd, all_projects=all_projects,
                          repair=repair, secrets=secrets, temp_age=temp_age)

    @staticmethod
    def report_parameters(pairs: Sequence[str]) -> dict[str, Any]:
        """``NAME=VALUE`` pairs as the notebooks' parameters (names as the notebooks spell them).

        Raises:
            ValidationError: a malformed pair, an unknown name, a value of the wrong kind.
        """
        from .operations.report import NOTEBOOKS, notebooks_dir, parse_parameters

        return parse_parameters(list(pairs), [notebooks_dir() / n for n in NOTEBOOKS])

    def report(self, out: str | os.PathLike, *, project: str | None = None, **kwargs: Any) -> "ReportResult":
        """Run the notebooks headless into HTML pages in ``out``. Without a project or a cwd the
        project is ``settings.project`` (CYBERINE_MEMORY_PROJECT), as for the notebooks."""
        from .operations.report import build_report

        if not (project or self.project) and self.cwd is None:
            project = self.settings.project
        return build_report(self.store(project), out, **kwargs)

    # --- exports -----------------------------------------------------------------------

    @staticmethod
    def export_tables(table: str | None) -> list[str] | None:
        """``table`` as the tables an export writes (None: the format's default).

        Raises:
            ValidationError: a table that is neither records nor issues.
        """
        from .exchange.export import TABLES

        if table is not None and table not in TABLES:
            raise ValidationError(f"{table!r} is not one of {', '.join(TABLES)}")
        return None if table is None else [table]

    @staticmethod
    def check_machine(machine: str | None) -> None:
        """Raise ValidationError unless ``machine`` (when given) is one safe path segment."""
        if machine is not None:
            from .exchange.export import validate_machine

            validate_machine(machine)

    def export_stores(self, *, project: str | None = None, all_projects: bool = False) -> list["MemoryStore"]:
        """The stores an export reads: the project, or with ``all_projects`` every one.

        Raises:
            NotFoundError: with ``all_projects``, when the root holds no project.
        """
        from .exchange.export import all_stores

        return all_stores(self.root, required=True) if all_projects else [self.store(project)]

    def export(self, fmt: str, out: str | os.PathLike | None, *, stores: Sequence["MemoryStore"] | None = None,
               table: str | None = None, machine: str | None = None, chain: str | None = None, provn: bool = False,
               progress: bool | None = None, force: bool = False) -> "ExportSummary":
        """Export the project's memory (or ``stores``, :meth:`export_stores`) as ``fmt``, one of
        :data:`EXPORT_FORMATS`, to ``out`` (ndjson and csv: None is stdout)."""
        from .exchange import export as ex

        stores = list(stores) if stores is not None else [self.store()]
        tables = self.export_tables(table)
        if fmt in ("ndjson", "csv"):
            fn = ex.export_ndjson if fmt == "ndjson" else ex.export_csv
            return fn(stores, out, table=tables[0] if tables else "records", progress=progress, force=force)
        if fmt == "parquet":
            return ex.export_parquet(stores, out, machine=machine, tables=tables or ex.TABLES, progress=progress)
        if fmt == "sqlite":
            return ex.export_sqlite(stores, out, tables=tables or ex.TABLES, progress=progress, force=force)
        if fmt == "prov":
            from .exchange.prov import export_prov

            return export_prov(stores, out, chain=chain, provn=provn, force=force)
        raise ValidationError(f"{fmt!r} is not one of {', '.join(EXPORT_FORMATS)}")

    @staticmethod
    def fleet(dataset: str | os.PathLike, **kwargs: Any) -> "Fleet":
        """Many machines' exported memory as one history (:class:`cybmem.exchange.fleet.Fleet`,
        a context manager)."""
        from .exchange.fleet import Fleet

        return Fleet(dataset, **kwargs)

    # --- what agents fetch -------------------------------------------------------------

    def fetch_observer(self, store_of: Callable[[str | None], "MemoryStore"] | None = None
                       ) -> Callable[[str, dict, Any], None]:
        """An observer of an MCP front's answers that keeps what each one showed in its project's
        shown.jsonl (:func:`cybmem.dispatch.feedback.mcp_observer`); ``store_of`` finds a project's
        store (default: :meth:`store`)."""
        from .dispatch.feedback import mcp_observer

        return mcp_observer(self.settings, store_of or self.store)

    # --- the agents people run: what their hooks ask (cybmem.hooks) ---------------------

    @staticmethod
    def check_hook_client(client: str) -> str:
        """``client`` if cybmem has hooks for it (``claude-code``, ``codex``); ValidationError naming them."""
        from .operations.agent_turns import check_client

        return check_client(client)

    def _hook_store(self, cwd: str | os.PathLike | None) -> "MemoryStore | None":
        """The store of the project at ``cwd``, None when it has no memory yet (a new user's first
        session: nothing to say, and nothing wrong)."""
        from .errors import NotFoundError
        from .store.memory_store import MemoryStore

        try:
            store = MemoryStore.open(self.settings, cwd=str(cwd) if cwd else self.cwd, project=self.project)
        except NotFoundError:
            return None
        return store if store.exists() else None

    def orientation(self, *, cwd: str | os.PathLike | None = None) -> str | None:
        """What a session start is told: the project's latest runs and its open issues as one-line
        pointers, at most 1,200 characters (:func:`cybmem.dispatch.orientation.orientation`); None
        when the project has no memory yet, or holds neither a run nor an open issue."""
        from .dispatch.orientation import LATEST_RUNS, OPEN_ISSUES, orientation
        from .retrieval.filters import IssueFilter, list_issues, list_records

        store = self._hook_store(cwd)
        if store is None:
            return None
        from .store.loading import load_snapshot

        snap = load_snapshot(store)
        runs = list_records(snap, limit=LATEST_RUNS).items
        issues = list_issues(store, IssueFilter.make(state="open"), limit=OPEN_ISSUES, snap=snap).page
        return orientation(runs, issues.items, open_issues=issues.total, task_of=snap.task_of) or None

    def prompt_block(self, prompt: str, *, client: str, session_id: str | None, key: str | None,
                     cwd: str | os.PathLike | None = None) -> "Injection | None":
        """The MEMORY block for a prompt an agent's user typed (what ``cybmem inject --system``
        builds, never raising), kept in shown.jsonl under the run id its turn will be written with
        (so that the turn's record can say what it used); None for a prompt that is the client's own
        or empty once its ``<private>`` spans are out, and for a project without memory yet."""
        import dataclasses

        from .dispatch.inject import inject_task
        from .operations.agent_turns import is_client_prompt, prompt_text, turn_run_id

        text = prompt_text(prompt or "")
        if not text or is_client_prompt(prompt) or self._hook_store(cwd) is None:
            return None
        run_id = turn_run_id(client, session_id or "", key) if key else None
        settings = dataclasses.replace(self.settings, run_id=run_id)
        return inject_task(text, settings, cwd=str(cwd) if cwd else self.cwd, project=self.project,
                           chat_session_id=session_id)

    def record_turns(self, client: str, event: str, *, session_id: str, cwd: str | None,
                     while_distilling: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                     **payload: str | None) -> list["WriteResult"]:
        """Write the turns a hook's event closes (:func:`cybmem.operations.agent_turns.event_runs`:
        Stop, SubagentStop, SessionEnd; ``payload``: ``transcript``, ``key``, ``reply``,
        ``agent_id``, ``agent_type``, ``agent_transcript``), each once: a turn another hook (or
        another session's) wrote first is left as it is. Returns what was written.

        Raises:
            CybmemError / OSError: the payload, the transcript or the store is not usable.
        """
        from .errors import ConflictError
        from .operations.agent_turns import event_runs

        def written(run_id: str) -> bool:
            store = self._hook_store(cwd)
            return store is not None and store.record_path(run_id).exists()

        done = []
        for run in event_runs(client, event, session_id=session_id, cwd=cwd, written=written, **payload):
            try:
                result = self.write(run, cwd=run.get("cwd"), while_distilling=while_distilling)
            except ConflictError:  # written meanwhile by another hook: the check under the project lock
                continue
            done.append(result)
        return done

    def _hook_settings_file(self, client: str, project_dir: str | os.PathLike | None) -> Path:
        from .operations.hook_settings import settings_path

        if project_dir is not None and not Path(project_dir).is_dir():
            raise ValidationError(f"{project_dir} is not a directory")
        hooks = self.settings.hooks
        return settings_path(self.check_hook_client(client), hooks.home, hooks.codex_home,
                             Path(project_dir).absolute() if project_dir is not None else None)

    def install_hooks(self, client: str, executable: str | list[str], *, project_dir: str | os.PathLike | None = None,
                      dry_run: bool = False, codex: str | None = None) -> "HookChange":
        """Put cybmem's hooks in ``client``'s settings (the user's, or ``project_dir``'s), running
        ``executable`` (the cybmem that installs them, by its absolute path); for Codex, have it
        trust them through its app-server, or note how the user gives that review
        (:mod:`cybmem.operations.hook_settings`, :mod:`cybmem.operations.codex_trust`)."""
        from .operations.hook_settings import hook_command, install

        path = self._hook_settings_file(client, project_dir)
        change = install(client, path, hook_command(executable, client), dry_run=dry_run)
        if client == "codex" and not dry_run:
            from .operations.codex_trust import trust_hooks

            result = trust_hooks(change.command, change.path, cwd=Path(project_dir or os.getcwd()).absolute(), codex=codex)
            change.notes.append(("Codex trusts them (saved through `codex app-server`)" if result.newly else
                                 "Codex trusts them") if result.trusted else result.message)
        return change

    def uninstall_hooks(self, client: str, *, project_dir: str | os.PathLike | None = None,
                        dry_run: bool = False) -> "HookChange":
        """Take cybmem's hooks, and only them, out of ``client``'s settings."""
        from .operations.hook_settings import uninstall

        return uninstall(client, self._hook_settings_file(client, project_dir), dry_run=dry_run)

    def hooks_status(self, clients: Sequence[str], *, project_dir: str | os.PathLike | None = None,
                     codex: str | None = None) -> list["HookStatus"]:
        """Which of cybmem's hooks each client's settings hold, whether they can run, and (Codex)
        whether Codex trusts them."""
        from .operations.hook_settings import status

        found = []
        for client in clients:
            st = status(client, self._hook_settings_file(client, project_dir))
            if client == "codex" and st.events:
                from .operations.codex_trust import list_hooks

                try:
                    st.trust = list_hooks(next(iter(st.events.values())), st.path,
                                          cwd=Path(project_dir or os.getcwd()).absolute(), codex=codex)
                except (OSError, RuntimeError, TimeoutError, ConnectionError) as exc:
                    st.problems.append(f"could not ask Codex whether it trusts them: {' '.join(str(exc).split())}")
            found.append(st)
        return found
