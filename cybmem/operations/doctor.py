"""Check a memory store and rebuild what is derived: ``cybmem doctor`` (and ``cybmem rebuild``,
index.json alone: :func:`rebuild`). The checks are :mod:`cybmem.operations.doctor_checks`, the
repair :mod:`cybmem.operations.doctor_repair`, the report :mod:`cybmem.operations.doctor_report`;
this module runs them.

One check per kind of file, per project (records, the ledger, embeddings.jsonl, index.json, the
Arrow cache, cwd paths, symbolic links, temp files, an unfinished ``cybmem redact``) and per
memory root (projects.json and its slugs), then the repair. Each finding has a severity:
``error`` needs a person and is never changed by ``--repair``; ``repairable`` is derived state
that ``--repair`` rebuilds; ``warning`` is reported, harmless and not counted. ``--repair`` always
rebuilds index.json and the cache from records/ and the ledger, removes the temp files no live
writer owns (:func:`cybmem._io.temp_owned`) once older than ``temp_age`` seconds, finishes a killed redaction from its journal (cybmem.operations.redaction) and keeps one
vector per run and model in embeddings.jsonl (:func:`cybmem.store.embeddings.superseded`); it never
otherwise touches records/ or issues.jsonl. What each check looks at: USAGE.md, "Checking a store".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NotFoundError, StoreError
from ..settings import Settings
from ..store.memory_store import MemoryStore
from ..store.projects import check_root, project_cwd, project_dirs, select_project
from .doctor_checks import check_memory_root, check_project, check_weights
from .doctor_repair import Repairs, repair_store
from .doctor_report import DoctorReport, Finding, ProjectStats

__all__ = ["doctor", "DEFAULT_TEMP_AGE", "Rebuilt", "rebuild"]

DEFAULT_TEMP_AGE = 60  # seconds; a younger temp file may belong to a writer at work


def _select(root: Path, backfilled: dict[str, dict], *, project: str | None, cwd, all_projects: bool) -> list[str]:
    if all_projects:
        return sorted(set(project_dirs(root)) | {s for s in backfilled if (root / s).is_dir()})
    try:
        return [select_project(root, cwd=cwd, project=project, peek=True, known=backfilled)]
    except NotFoundError as exc:
        raise NotFoundError(f"{exc}; or check every project with --all") from None


def doctor(
    settings: Settings,
    *,
    project: str | None = None,
    cwd: str | os.PathLike | None = None,
    all_projects: bool = False,
    repair: bool = False,
    secrets: bool = False,
    temp_age: float = DEFAULT_TEMP_AGE,
) -> DoctorReport:
    """Check a memory store; with ``repair``, rebuild its derived files and check again.

    Args:
        settings: where the memory root is.
        project / cwd: the project to check (default: the one of the current directory).
        all_projects: check every project of the root.
        repair: rebuild index.json and the Arrow cache, remove temp files no live writer owns
            that are older than ``temp_age`` seconds and drop replaced vectors from
            embeddings.jsonl; records and issues.jsonl are touched only to finish a killed
            ``cybmem redact``. Each repair is tried on its own; one that fails is listed in
            ``report.not_repaired`` (and the report is not clean).
        secrets: also scan records and issue titles / details for secret shapes (reported by
            file, field and kind; the secret itself is never printed, nothing is rewritten).
        temp_age: a temp file no process owns is removed only once older than this (an older
            cybmem took no lock on its temp files); one a live writer owns is never removed.

    Returns:
        A :class:`DoctorReport`; ``report.clean`` is True when no error or repairable finding remains.
    """
    root = check_root(settings.memory_dir)
    if not root.exists():
        raise NotFoundError(f"no memory at {root}; nothing has been written there yet")

    def run() -> tuple[list[ProjectStats], list[Finding], dict[str, MemoryStore]]:
        now = time.time()
        findings, backfilled = check_memory_root(root, temp_age, now)
        findings += check_weights(settings, None)
        slugs = _select(root, backfilled, project=project, cwd=cwd, all_projects=all_projects)
        stats, stores = [], {}
        for slug in slugs:
            store = stores[slug] = MemoryStore(root, slug, index_cap=settings.index_cap)
            try:
                st, found = check_project(store, settings, secrets=secrets, temp_age=temp_age, now=now,
                                           home=project_cwd(root, slug, backfilled))
            except StoreError as exc:  # one project that cannot be read (records/ a FIFO): the others are still checked
                st, found = ProjectStats(slug), [Finding("paths", "error", str(store.dir), f"cannot be checked: {exc}", slug)]
            stats.append(st)
            findings += found
        return stats, findings, stores

    stats, findings, stores = run()
    repairs = Repairs()
    if repair:
        # Always, not only when a check saw it: derived files are cheap to rebuild, and a rebuild
        # is what makes a hand edit of a record (removing a secret) reach every copy.
        repairs = repair_store(root, findings, stores)
        stats, findings, stores = run()
    return DoctorReport(str(root), stats, findings, repairs.done, secrets, repairs.failed)


@dataclass
class Rebuilt:
    """What ``cybmem rebuild`` did: index.json regenerated from ``records`` records, ``archived`` of
    them listed compactly; the re-tune's line when the history had grown enough for one."""

    store: MemoryStore
    records: int
    archived: int
    warnings: list[str] = field(default_factory=list)  # what the rebuild could not read
    retuned: str | None = None

    @property
    def entries(self) -> int:
        return self.records - self.archived

    def to_dict(self) -> dict:
        return {"project": self.store.slug, "records": self.records, "entries": self.entries, "archived": self.archived,
                "index": str(self.store.index_path), **({"retuned": self.retuned} if self.retuned else {})}


def rebuild(store: MemoryStore, settings: Settings, *, full: bool = False) -> Rebuilt:
    """Regenerate index.json from records/ alone, compacted to CYBERINE_MEMORY_INDEX_CAP entries
    unless ``full``; with CYBERINE_MEMORY_RETUNE=N and a history grown N% since its last tuning, the
    weights are re-tuned too (:func:`cybmem.operations.retune.auto_tune`)."""
    count = store.rebuild_index(full=full)
    done = Rebuilt(store, count, 0, [p.message for p in store.problems])
    done.archived = len(store.index.archived_ids())
    if settings.retune > 0:
        from .retune import auto_tune, retune_due

        if retune_due(store, settings, count):
            done.retuned = auto_tune(store, settings)
    return done
