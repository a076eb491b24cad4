"""MemoryStore: one project's records, issue ledger and derived index on disk.

Records are written once (temp file, fsync, hard link: an existing runId can
never be replaced) and never rewritten. Corrections are new records that name
the run they supersede. The ledger is appended whole lines at a time under an
OS lock, so an id that is already open is not opened twice even when runs end
at the same moment. index.json is derived and can be
rebuilt from records/ alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import orjson

from ._io import TMP_PREFIX, append_lines, atomic_write, ensure_dir, locked
from .errors import AmbiguousError, ConflictError, NotFoundError, StoreError, ValidationError
from .projects import resolve_slug
from .schema import IssueEvent, MemoryRecord, validate_run_id
from .settings import Settings

__all__ = ["MemoryStore", "IssueState", "ReadProblem", "fold_issues", "record_line"]

LOCK_FILE = ".lock"
MAX_RECORD_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ReadProblem:
    """A file or line that could not be read; readers skip it and report it once."""

    path: str
    message: str


@dataclass
class IssueState:
    """The fold of one issue's events: current state and its history."""

    issueId: str
    title: str
    state: str
    openedAt: int
    openedBy: str | None
    lastAt: int
    lastBy: str | None
    resolvedAt: int | None = None
    resolvedBy: str | None = None
    reopenCount: int = 0
    events: int = 0
    detail: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def fold_issues(events: Iterable[IssueEvent]) -> dict[str, IssueState]:
    """Current state per issue: the fold of its events in file order, last one wins."""
    states: dict[str, IssueState] = {}
    for ev in events:
        st = states.get(ev.issueId)
        if st is None:
            st = states[ev.issueId] = IssueState(
                issueId=ev.issueId, title=ev.title or ev.issueId, state=ev.event, openedAt=ev.at,
                openedBy=ev.byRunId, lastAt=ev.at, lastBy=ev.byRunId, detail=ev.detail,
            )
        else:
            st.state = ev.event
            st.lastAt, st.lastBy = ev.at, ev.byRunId
            if ev.title and st.title == st.issueId:
                st.title = ev.title
        st.events += 1
        if ev.event == "reopened":
            st.reopenCount += 1
            st.resolvedAt = st.resolvedBy = None
        elif ev.event in ("resolved", "wontfix"):
            st.resolvedAt, st.resolvedBy = ev.at, ev.byRunId
        elif ev.event == "opened" and st.events > 1:
            st.resolvedAt = st.resolvedBy = None
    return states


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def _one_line(text: str, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _task_head(task: str, limit: int = 100) -> str:
    for line in (task or "").splitlines():
        if line.strip():
            return _one_line(line, limit)
    return ""


def record_line(entry: dict) -> str:
    """The human one-liner of an index entry: ``2026-11-29 14:02 UTC  done  3f2a9c1e  task head``."""
    return f"{_iso(entry['endedAt'])} UTC  {entry['state']:<9}  {entry['runId'][:8]}  {entry['task']}"


def _index_entry(rec: MemoryRecord, superseded_by: str | None) -> dict:
    entry = {
        "runId": rec.runId,
        "startedAt": rec.startedAt,
        "endedAt": rec.endedAt,
        "state": rec.state,
        "workflowName": rec.workflowName,
        "task": _task_head(rec.task),
        "summary": _one_line(rec.outcome.summary, 200),
        "issues": list(rec.outcome.issues),
    }
    if rec.lineage.previousRunId:
        entry["previousRunId"] = rec.lineage.previousRunId
    if rec.lineage.parentRunId:
        entry["parentRunId"] = rec.lineage.parentRunId
    if rec.lineage.chatSessionId:
        entry["chatSessionId"] = rec.lineage.chatSessionId
    if rec.lineage.rootRunId:
        entry["rootRunId"] = rec.lineage.rootRunId
    if superseded_by:
        entry["supersededBy"] = superseded_by
    if rec.supersedes:
        entry["supersedes"] = rec.supersedes
    return entry


def _sort_key(entry: dict) -> tuple:
    return (entry["endedAt"], entry["runId"])


class MemoryStore:
    """One project's memory: ``<root>/<slug>/``."""

    def __init__(self, root: str | os.PathLike, slug: str):
        if not slug or "/" in slug or "\x00" in slug or slug in (".", "..") or slug.startswith("."):
            raise ValidationError(f"project slug {slug!r} is not a single safe directory name")
        self.root = Path(root)
        self.slug = slug
        self.dir = self.root / slug
        self.records_dir = self.dir / "records"
        self.issues_path = self.dir / "issues.jsonl"
        self.index_path = self.dir / "index.json"
        self.archive_path = self.dir / "archive-summary.md"
        self.embeddings_path = self.dir / "embeddings.jsonl"
        self.problems: list[ReadProblem] = []

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.root)!r}, {self.slug!r})"

    # --- opening -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        cwd: str | os.PathLike | None = None,
        project: str | None = None,
        create: bool = False,
    ) -> "MemoryStore":
        """The store of ``project`` (a slug) or of the project at ``cwd`` (default: the current dir)."""
        root = settings.memory_dir
        if project:
            store = cls(root, project)
            if not create and not store.dir.is_dir():
                from .projects import load_projects, project_dirs

                known = sorted(set(project_dirs(root)) | set(load_projects(root)))
                raise NotFoundError(
                    f"no project {project!r} under {root}; known projects: {', '.join(known) or 'none'}"
                )
            return store
        slug = resolve_slug(root, cwd if cwd is not None else os.getcwd(), create=create)
        return cls(root, slug)

    def exists(self) -> bool:
        return self.records_dir.is_dir() or self.issues_path.exists()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock for the ledger and the derived index of this project."""
        with locked(self.dir / LOCK_FILE):
            yield

    # --- records -----------------------------------------------------------------

    def record_path(self, run_id: str) -> Path:
        return self.records_dir / f"{validate_run_id(run_id)}.json"

    def run_ids(self) -> list[str]:
        """Run ids of every record file, sorted; temp leftovers and stray files are ignored."""
        try:
            names = os.listdir(self.records_dir)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))

    def read_record(self, run_id: str) -> MemoryRecord:
        """Read and validate one record; NotFoundError / ValidationError say which and why."""
        path = self.record_path(run_id)
        try:
            size = path.stat().st_size
            if size > MAX_RECORD_BYTES:
                raise ValidationError(f"{path}: {size} bytes is larger than a record can be ({MAX_RECORD_BYTES})")
            raw = path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"no record {run_id} in project {self.slug}; see `cybmem list`") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        return self._parse_record(path, raw)

    @staticmethod
    def _parse_record(path: Path, raw: bytes) -> MemoryRecord:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValidationError(f"{path.name}: not valid JSON ({exc})") from None
        try:
            rec = MemoryRecord.from_dict(data)
        except ValidationError as exc:
            raise ValidationError(f"{path.name}: {exc}") from None
        if rec.runId != path.name[:-5]:
            raise ValidationError(f"{path.name}: runId {rec.runId!r} does not match its file name")
        return rec

    def iter_records(self) -> Iterator[MemoryRecord]:
        """Every readable record; unreadable ones are skipped and added to ``self.problems``."""
        for run_id in self.run_ids():
            try:
                yield self.read_record(run_id)
            except (ValidationError, StoreError, NotFoundError) as exc:
                self._problem(str(self.records_dir / f"{run_id}.json"), str(exc))

    def records(self) -> list[MemoryRecord]:
        """All readable records, oldest first (by endedAt, then runId)."""
        return sorted(self.iter_records(), key=lambda r: (r.endedAt, r.runId))

    def _problem(self, path: str, message: str) -> None:
        problem = ReadProblem(path, message)
        if problem not in self.problems:
            self.problems.append(problem)

    def resolve_run_id(self, prefix: str) -> str:
        """The run id that ``prefix`` names: exact, or a unique prefix."""
        prefix = (prefix or "").strip()
        if not prefix:
            raise ValidationError("a run id or prefix is required")
        ids = self.run_ids()
        if prefix in ids:
            return prefix
        matches = [i for i in ids if i.startswith(prefix)]
        if not matches:
            raise NotFoundError(f"no record matches {prefix!r} in project {self.slug}; see `cybmem list`")
        if len(matches) > 1:
            shown = ", ".join(matches[:10]) + (f", … ({len(matches)} in all)" if len(matches) > 10 else "")
            raise AmbiguousError(f"prefix {prefix!r} matches {len(matches)} records: {shown}; give more characters")
        return matches[0]

    def write_record(self, rec: MemoryRecord, events: Iterable[IssueEvent] = ()) -> Path:
        """Write a new record (never overwriting) and append its issue events.

        Raises ConflictError if the runId already has a record: records are append-only;
        use :meth:`supersede` to correct one.
        """
        data = rec.to_dict()
        MemoryRecord.from_dict(data)  # validate exactly what goes to disk
        path = self.record_path(rec.runId)
        if rec.supersedes and rec.supersedes == rec.runId:
            raise ValidationError("supersedes: a record cannot supersede itself")
        payload = orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"
        ensure_dir(self.records_dir)
        try:
            atomic_write(path, payload, overwrite=False)
        except FileExistsError:
            raise ConflictError(
                f"record {rec.runId} already exists in project {self.slug}; records are append-only, "
                f"use `cybmem supersede {rec.runId} NEW.json` to correct it"
            ) from None
        with self.lock():
            self._append_events_locked(list(events))
            self._update_index_locked(rec)
        return path

    def supersede(self, old_run_id: str, new: MemoryRecord, events: Iterable[IssueEvent] = ()) -> Path:
        """Write ``new`` as the correction of ``old_run_id``; the old record stays as it is."""
        old_id = self.resolve_run_id(old_run_id)
        current = self.superseded_map().get(old_id)
        if current:
            raise ConflictError(
                f"record {old_id} is already superseded by {current}; supersede {self.newest_truth(old_id)} instead"
            )
        if new.runId == old_id:
            raise ValidationError("the correcting record needs a new runId; the old record is never rewritten")
        new.supersedes = old_id
        return self.write_record(new, events)

    def superseded_map(self) -> dict[str, str]:
        """old runId -> runId that supersedes it (from ``supersedes`` and ``supersededBy`` fields)."""
        out: dict[str, str] = {}
        for rec in self.iter_records():
            if rec.supersededBy and rec.supersededBy != rec.runId:
                out.setdefault(rec.runId, rec.supersededBy)
        for rec in self.iter_records():
            if rec.supersedes and rec.supersedes != rec.runId:
                out[rec.supersedes] = rec.runId
        return out

    def newest_truth(self, run_id: str, superseded: dict[str, str] | None = None) -> str:
        """Follow supersession from ``run_id`` to the newest record (cycles and dangling links stop it)."""
        superseded = self.superseded_map() if superseded is None else superseded
        seen = {run_id}
        current = run_id
        while current in superseded:
            nxt = superseded[current]
            if nxt in seen or not self.record_path(nxt).exists():
                break
            seen.add(nxt)
            current = nxt
        return current

    def latest_run_id(self, *, before_ms: int | None = None, exclude: str | None = None) -> str | None:
        """The latest record (by endedAt) that ended at or before ``before_ms``."""
        for entry in self.index_entries():
            if entry["runId"] == exclude:
                continue
            if before_ms is None or entry["endedAt"] <= before_ms:
                return entry["runId"]
        return None

    # --- the issue ledger --------------------------------------------------------

    def issue_events(self) -> list[IssueEvent]:
        """The ledger in file order; a torn or invalid line is skipped and reported once."""
        try:
            raw = self.issues_path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot read {self.issues_path}: {exc}") from exc
        events = []
        for lineno, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                events.append(IssueEvent.from_dict(orjson.loads(line)))
            except (orjson.JSONDecodeError, ValidationError) as exc:
                self._problem(f"{self.issues_path}:{lineno}", f"skipped unreadable ledger line ({exc})")
        return events

    def issue_states(self) -> dict[str, IssueState]:
        return fold_issues(self.issue_events())

    def open_issues(self) -> list[IssueState]:
        """Issues whose last event is opened or reopened, oldest first."""
        states = [s for s in self.issue_states().values() if s.state in ("opened", "reopened")]
        return sorted(states, key=lambda s: (s.openedAt, s.issueId))

    def append_issue_events(self, events: Iterable[IssueEvent]) -> list[IssueEvent]:
        """Append events that change something; returns those actually written."""
        events = list(events)
        if not events:
            return []
        with self.lock():
            return self._append_events_locked(events)

    def _append_events_locked(self, events: list[IssueEvent]) -> list[IssueEvent]:
        if not events:
            return []
        states = {k: v.state for k, v in self.issue_states().items()}
        written = []
        for ev in events:
            IssueEvent.from_dict(ev.to_dict())
            current = states.get(ev.issueId)
            is_open = current in ("opened", "reopened")
            if ev.event == "opened" and is_open:
                continue  # an id already open is not opened again
            if ev.event == "opened" and current is not None:
                ev = IssueEvent(**{**ev.__dict__, "event": "reopened"})
            if ev.event in ("resolved", "wontfix") and current == ev.event:
                continue
            states[ev.issueId] = ev.event
            written.append(ev)
        append_lines(self.issues_path, [orjson.dumps(ev.to_dict()) for ev in written])
        return written

    # --- the derived index -------------------------------------------------------

    def index_entries(self) -> list[dict]:
        """index.json's entries, newest first; rebuilt in memory if missing or unreadable."""
        try:
            data = orjson.loads(self.index_path.read_bytes())
            entries = data["entries"]
            if isinstance(entries, list) and all(isinstance(e, dict) and "runId" in e and "endedAt" in e for e in entries):
                return entries
        except FileNotFoundError:
            pass
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            self._problem(str(self.index_path), "index.json is unreadable; run `cybmem rebuild`")
        return self._compute_index()[0]

    def _compute_index(self) -> tuple[list[dict], int]:
        recs = list(self.iter_records())
        superseded = {}
        for rec in recs:
            if rec.supersededBy:
                superseded.setdefault(rec.runId, rec.supersededBy)
        for rec in recs:
            if rec.supersedes:
                superseded[rec.supersedes] = rec.runId
        entries = [_index_entry(r, superseded.get(r.runId)) for r in recs]
        entries.sort(key=_sort_key, reverse=True)
        return entries, len(entries)

    def rebuild_index(self) -> int:
        """Regenerate index.json from records/ alone; returns the record count."""
        ensure_dir(self.dir)
        with self.lock():
            entries, count = self._compute_index()
            self._write_index_locked(entries)
        return count

    def _write_index_locked(self, entries: list[dict]) -> None:
        # One compact JSON object per line: diff- and grep-friendly, still one JSON document.
        body = b",\n".join(b"  " + orjson.dumps(e) for e in entries)
        data = (
            b'{"version": 1, "count": ' + str(len(entries)).encode() + b', "entries": [\n'
            + body + (b"\n" if entries else b"") + b"]}\n"
        )
        atomic_write(self.index_path, data)

    def _update_index_locked(self, rec: MemoryRecord) -> None:
        try:
            data = orjson.loads(self.index_path.read_bytes())
            entries = list(data["entries"])
            complete = data.get("count") == len(entries) and all(isinstance(e, dict) and "runId" in e for e in entries)
        except (FileNotFoundError, OSError, orjson.JSONDecodeError, KeyError, TypeError):
            complete = False
        if not complete:
            # Missing or damaged: the full truth is records/.
            entries, _ = self._compute_index()
            self._write_index_locked(entries)
            return
        entries = [e for e in entries if e.get("runId") != rec.runId]
        superseded_by = None
        if rec.supersededBy:
            superseded_by = rec.supersededBy
        for e in entries:
            if e.get("supersedes") == rec.runId:
                superseded_by = e["runId"]
        entries.append(_index_entry(rec, superseded_by))
        if rec.supersedes:
            for e in entries:
                if e["runId"] == rec.supersedes:
                    e["supersededBy"] = rec.runId
        entries.sort(key=_sort_key, reverse=True)
        self._write_index_locked(entries)

    def report_problems(self, stream=None) -> None:
        """Print each read problem once to stderr (as ``warning: ...``)."""
        stream = stream or sys.stderr
        for p in self.problems:
            print(f"warning: {p.message}", file=stream)
