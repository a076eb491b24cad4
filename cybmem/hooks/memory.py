"""What the agent hooks ask of memory, in one place: write a turn's run once, the MEMORY block for a
prompt, the project's latest runs and open issues. The only module of the hooks front that calls
the library's memory functions (write_run, inject_task, list_records, list_issues), so that one
handle on memory can take their place.
"""

from __future__ import annotations

import contextlib
import dataclasses

from ..errors import ConflictError, NotFoundError
from ..settings import Settings

__all__ = ["written", "write", "prompt_block", "latest"]

#: How many of the latest runs and open issues the orientation is offered (its budget cuts it).
_LATEST_RUNS = 12
_OPEN_ISSUES = 12


def _store(settings: Settings, cwd: str | None):
    from ..store.memory_store import MemoryStore

    return MemoryStore.open(settings, cwd=cwd)


def written(settings: Settings, cwd: str | None, run_id: str) -> bool:
    """Whether the project at ``cwd`` holds a record ``run_id`` already (a cheap look before a
    transcript is read; the write itself checks again under the project lock)."""
    try:
        return _store(settings, cwd).record_path(run_id).exists()
    except NotFoundError:  # no project there yet
        return False


def write(settings: Settings, run: dict, *, while_distilling=contextlib.nullcontext):
    """Write a turn's run (:func:`cybmem.operations.write.write_run`; ``while_distilling``: the
    context the optional distillation call runs in, which may abandon it); None when its record was
    there already (another hook, or another session's, wrote it first: the check is under the lock)."""
    from ..operations.write import write_run

    try:
        return write_run(run, settings, cwd=run.get("cwd"), while_distilling=while_distilling)
    except ConflictError:
        return None


def prompt_block(settings: Settings, prompt: str, *, cwd: str | None, session_id: str | None, run_id: str | None):
    """The MEMORY block for a prompt (what ``cybmem inject --system`` prints), shown to the run
    ``run_id`` (what shown.jsonl names, so that the turn's record can say what it used): the
    :class:`cybmem.dispatch.inject.Injection`, which never raises; None when the project has no
    memory yet (a new user's first prompts: nothing to say, and nothing wrong)."""
    from ..dispatch.inject import inject_task

    try:
        if not _store(settings, cwd).exists():
            return None
    except NotFoundError:
        return None
    return inject_task(prompt, dataclasses.replace(settings, run_id=run_id), cwd=cwd, chat_session_id=session_id)


def latest(settings: Settings, cwd: str | None) -> tuple[list[dict], list, int]:
    """The project's latest runs (as ``cybmem list --json`` gives them), its open issues newest
    first, and how many are open in all; nothing when the project has no memory yet."""
    from ..retrieval.filters import IssueFilter, list_issues, list_records

    try:
        store = _store(settings, cwd)
    except NotFoundError:
        return [], [], 0
    if not store.exists():
        return [], [], 0
    runs = list_records(store, limit=_LATEST_RUNS).items
    issues = list_issues(store, IssueFilter.make(state="open"), limit=_OPEN_ISSUES).page
    return runs, issues.items, issues.total
