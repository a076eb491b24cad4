"""What production dispatch calls on every run: the MEMORY block for a new task, put ahead of it.

:func:`inject_task` owns the dispatch rules: memory off (``CYBERINE_MEMORY=0``) or a project with
no memory gives the task back unchanged, and with ``strict=False`` (the default, what
``cybmem inject`` does) nothing that is wrong with memory ever fails the dispatcher: the task
comes back with whatever block could be built (possibly none) and each problem is one line in
``warnings``. :func:`memory_block` renders the block itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from .errors import CybmemError, NotFoundError
from .preamble import OpenIssue, PreambleEntry, inject, render_block
from .search import SearchResult, search
from .settings import Settings
from .snapshot import load_snapshot
from .store import MemoryStore
from .weights import Weights

__all__ = ["Injection", "memory_block", "inject_task"]


@dataclass
class Injection:
    """The result of :func:`inject_task`: the prompt to dispatch and how it was made."""

    task: str
    block: str
    project: str | None
    warnings: list[str] = field(default_factory=list)
    result: SearchResult | None = field(default=None, repr=False)

    @property
    def prompt(self) -> str:
        """The task with the block and one blank line ahead of it (the task alone when there is no block)."""
        return inject(self.task, self.block)

    def to_dict(self) -> dict:
        return {"project": self.project, "block": self.block, "task": self.task, "prompt": self.prompt,
                "warnings": list(self.warnings)}


def memory_block(
    store: MemoryStore,
    task: str,
    settings: Settings,
    *,
    as_of: int | None = None,
    now_ms: int | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    weights: Weights | None = None,
) -> str:
    """The MEMORY block for a new task ("" when the project has no memory).

    Top ``settings.topk`` prior runs plus the project's open issues, bounded by
    ``settings.max_tokens``; deterministic for the same store, task and moment.
    """
    return _build(store, task, settings, as_of=as_of, now_ms=now_ms, parent_run_id=parent_run_id,
                  chat_session_id=chat_session_id, weights=weights)[0]


def _build(store: MemoryStore, task: str, settings: Settings, **kwargs) -> tuple[str, SearchResult | None]:
    if not store.exists():
        return "", None
    snap = load_snapshot(store)
    store.problems.extend(p for p in snap.problems if p not in store.problems)  # reported by the caller
    as_of = kwargs.get("as_of")
    result = search(snap, task, k=settings.topk, settings=settings, **kwargs)
    table = snap.open_issues(as_of)
    raised = sorted({i for h in result.hits for i in h.issues})
    open_ids: set[str] = set()
    if table.num_rows and raised:
        # Issues raised by the retrieved runs first (most relevant), then the newest others.
        is_raised = pc.is_in(table.column("issueId"), value_set=pa.array(raised, pa.string()))
        table = pa.concat_tables([table.filter(is_raised), table.filter(pc.invert(is_raised))])
        open_ids = set(table.filter(is_raised).column("issueId").to_pylist())
    # No block line is shorter than ~40 characters, so more than this can never fit.
    limit = max(1, settings.max_tokens * 4 // 40)
    rows = table.slice(0, limit).to_pylist()
    entries = [
        PreambleEntry(run_id=h.run_id, ended_at_ms=h.ended_at_ms, state=h.state, task=h.task, summary=h.summary,
                      open_issues=[i for i in h.issues if i in open_ids], next=h.next)
        for h in result.hits
    ]
    open_issues = [OpenIssue(issue_id=i["issueId"], title=i["title"], opened_at_ms=int(i["openedAt"].timestamp() * 1000),
                             by_run_id=i["openedBy"] or "") for i in rows]
    return render_block(entries, open_issues, max_tokens=settings.max_tokens, top_k=settings.topk), result


def inject_task(
    task: str,
    settings: Settings,
    *,
    cwd: str | os.PathLike | None = None,
    project: str | None = None,
    as_of: int | None = None,
    now_ms: int | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    weights: Weights | None = None,
    strict: bool = False,
) -> Injection:
    """The prompt to dispatch for ``task``: the MEMORY block of its project ahead of it.

    Args:
        task: the new run's task (the human text).
        settings: memory root, on/off, top-k, token budget, lineage of the new run.
        cwd / project: the project (default: the one of the current directory).
        as_of / now_ms: replay memory as of a moment / measure recency from a moment.
        parent_run_id / chat_session_id: lineage of the new run (default: from ``settings``).
        weights: axis weights (default: what production reads for the project).
        strict: raise instead of warning when memory is broken or the project is unknown.

    Returns:
        An :class:`Injection`; ``prompt`` is what to dispatch. Without ``strict`` this never
        raises a :class:`~cybmem.errors.CybmemError` or an OSError: problems become ``warnings``.
    """
    if not settings.enabled:
        return Injection(task, "", project)
    warnings: list[str] = []
    try:
        try:
            store = MemoryStore.open(settings, cwd=cwd, project=project)
        except NotFoundError:
            if strict or project:
                raise
            return Injection(task, "", None)  # a project that never wrote memory has no block
        block, result = _build(store, task, settings, as_of=as_of, now_ms=now_ms, parent_run_id=parent_run_id,
                               chat_session_id=chat_session_id, weights=weights)
        warnings += [p.message for p in store.problems]
        warnings += result.warnings if result is not None else []  # e.g. the vector axis fell back
        return Injection(task, block, store.slug, warnings, result)
    except (CybmemError, OSError) as exc:
        if strict:
            raise
        return Injection(task, "", project, warnings + [f"memory not injected: {exc}"])
