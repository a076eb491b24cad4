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
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ._io import append_lines, atomic_write, ensure_dir, locked, publish, stage, sync_path
from .errors import AmbiguousError, ConflictError, NotFoundError, StoreError, ValidationError
from .outcome import head_line, shorten
from .projects import resolve_slug, validate_slug
from .schema import ISSUE_EVENTS, ISSUE_ID_RE, IssueEvent, MemoryRecord, ms_to_utc, validate_run_id
from .settings import Settings

__all__ = ["MemoryStore", "IssueState", "ReadProblem", "fold_issues", "record_line"]

LOCK_FILE = ".lock"
INDEX_LOCK_FILE = ".index.lock"
MAX_RECORD_BYTES = 64 * 1024 * 1024
INDEX_VERSION = 1


def _first_unstorable(value, where: str) -> str | None:
    """The path of the first value orjson cannot store (lone surrogates, huge ints, deep nesting)."""
    stack = [(value, where, 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > 200:
            return path
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(v, bool) or v is None or isinstance(v, float):
            continue
        elif isinstance(v, int):
            if not -(2**63) <= v < 2**64:
                return path
        elif isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    return path
                stack.append((item, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(v, (list, tuple)):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v))
    return None


def _dumps(obj, what: str, *, indent: bool = False) -> bytes:
    """orjson.dumps with a ValidationError that names the field that cannot be stored."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0)
    except TypeError as exc:
        where = _first_unstorable(obj, "") or "a value"
        raise ValidationError(
            f"{what}: {where} cannot be stored as JSON ({exc}); text must be valid UTF-8 (no lone surrogates)"
        ) from None


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
        _fold_one(states, ev)
    return states


def _fold_one(states: dict[str, IssueState], ev: IssueEvent) -> None:
    """Fold one event into ``states`` (in place)."""
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


def _copy_state(st: IssueState) -> IssueState:
    """A shallow copy (callers get their own objects; the per-process fold stays untouched)."""
    out = IssueState.__new__(IssueState)
    out.__dict__.update(st.__dict__)
    return out


def record_line(entry: dict) -> str:
    """The human one-liner of an index entry: ``2026-11-29 14:02 UTC  done  3f2a9c1e  task head``."""
    return f"{ms_to_utc(entry['endedAt'])} UTC  {entry['state']:<9}  {entry['runId'][:8]}  {entry['task']}"


def _index_entry(rec: MemoryRecord, superseded_by: str | None) -> dict:
    entry = {
        "runId": rec.runId,
        "startedAt": rec.startedAt,
        "endedAt": rec.endedAt,
        "state": rec.state,
        "workflowName": rec.workflowName,
        "task": head_line(rec.task, 100),
        "summary": shorten(rec.outcome.summary, 200),
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


def _supersession(recs: list[MemoryRecord]) -> dict[str, str]:
    """old runId -> the runId that supersedes it.

    A ``supersededBy`` written by another tool counts unless a record's own
    ``supersedes`` says otherwise (that one wins); a record never supersedes itself.
    """
    out: dict[str, str] = {}
    for rec in recs:
        if rec.supersededBy and rec.supersededBy != rec.runId:
            out.setdefault(rec.runId, rec.supersededBy)
    for rec in recs:
        if rec.supersedes and rec.supersedes != rec.runId:
            out[rec.supersedes] = rec.runId
    return out


def _sort_key(entry: dict) -> tuple:
    return (entry["endedAt"], entry["runId"])


def _fast_event(d) -> bool:
    """Cheap check of a decoded ledger line; anything it rejects goes through full validation."""
    return (
        type(d) is dict and d.get("event") in ISSUE_EVENTS and type(d.get("issueId")) is str
        and ISSUE_ID_RE.fullmatch(d["issueId"]) is not None and type(d.get("at")) is int and 0 <= d["at"] < 10**14
        and d["issueId"].strip(".") != ""
    )


def _event_of(d) -> IssueEvent:
    """A decoded ledger line as an IssueEvent: the fast path for well-formed lines, else full validation."""
    if _fast_event(d):
        by, title, detail = d.get("byRunId"), d.get("title"), d.get("detail")
        if (by is None or type(by) is str) and (title is None or type(title) is str) and (detail is None or type(detail) is str):
            extra = {k: v for k, v in d.items() if k not in _EVENT_KEYS} if len(d) > 3 else {}
            return IssueEvent(issueId=d["issueId"], at=d["at"], event=d["event"], byRunId=by or None,
                              title=title, detail=detail, extra=extra)
    return IssueEvent.from_dict(d)


_EVENT_KEYS = frozenset(IssueEvent._KNOWN)


@dataclass
class _LedgerView:
    """What one process has parsed of one ledger file: whole lines up to ``offset``."""

    ino: int
    offset: int = 0
    lines: int = 0
    head: bytes = b""  # the first bytes and the last consumed bytes: an append-only file never changes them
    tail: bytes = b""
    events: list[IssueEvent] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    folded: dict[str, IssueState] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)


_LEDGERS: dict[str, _LedgerView] = {}
_LEDGERS_LOCK = threading.Lock()
_CHECK_BYTES = 256


def _read_ledger(path: Path) -> tuple[_LedgerView, bytes | None]:
    """Parse what was appended to a ledger since this process last read it.

    Returns the view (events, folded states, unreadable whole lines) and the torn tail (bytes
    after the last newline) if any. The tail is not consumed: once the next append has closed
    it with a newline it is read, and skipped, as a whole line. The ledger is append-only, so
    a file with the same inode that has not shrunk only ever grew.
    """
    with _LEDGERS_LOCK:
        return _read_ledger_locked(path)


def _read_ledger_locked(path: Path) -> tuple[_LedgerView, bytes | None]:
    key = str(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        _LEDGERS.pop(key, None)
        return _LedgerView(ino=0), None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    try:
        st = os.fstat(fd)
        view = _LEDGERS.get(key)
        # A file replaced by another one (an editor may reuse the inode number) or rewritten in
        # place is parsed again from the start.
        if view is None or view.ino != st.st_ino or st.st_size < view.offset or (
            view.offset and (
                os.pread(fd, len(view.head), 0) != view.head
                or os.pread(fd, len(view.tail), view.offset - len(view.tail)) != view.tail
            )
        ):
            view = _LEDGERS[key] = _LedgerView(ino=st.st_ino)
        raw = b""
        while len(raw) < st.st_size - view.offset:
            chunk = os.pread(fd, st.st_size - view.offset - len(raw), view.offset + len(raw))
            if not chunk:
                break
            raw += chunk
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    finally:
        os.close(fd)
    end = raw.rfind(b"\n") + 1
    lineno = view.lines
    for line in raw[:end].split(b"\n")[:-1]:
        lineno += 1
        if not line.strip():
            continue
        try:
            ev = _event_of(orjson.loads(line))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            view.problems.append((f"{path}:{lineno}", f"{path.name}:{lineno}: skipped unreadable ledger line ({exc})"))
            continue
        view.events.append(ev)
        view.states[ev.issueId] = ev.event
        _fold_one(view.folded, ev)
    if end:
        if len(view.head) < _CHECK_BYTES:
            view.head = (view.head + raw[:end])[:_CHECK_BYTES] if view.offset == 0 else view.head
        view.tail = (view.tail + raw[:end])[-_CHECK_BYTES:]
    view.offset += end
    view.lines = lineno
    tail = raw[end:]
    return view, (tail if tail.strip() else None)


def _embedding_problem(row) -> str | None:
    """Why an embeddings.jsonl row is unusable, or None."""
    if not isinstance(row, dict):
        return "a line that is not a JSON object"
    if not isinstance(row.get("runId"), str) or not row["runId"]:
        return "a row without a runId"
    if not isinstance(row.get("model"), str) or not row["model"]:
        return "a row without a model"
    vec = row.get("vector")
    if not isinstance(vec, list) or not vec or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in vec
    ):
        return "a row whose vector is not a non-empty list of numbers"
    return None


class MemoryStore:
    """One project's memory: ``<root>/<slug>/``."""

    def __init__(self, root: str | os.PathLike, slug: str):
        validate_slug(slug)
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
        """Exclusive lock for the ledger (and for linking records) of this project."""
        with locked(self.dir / LOCK_FILE):
            yield

    @contextlib.contextmanager
    def index_lock(self) -> Iterator[None]:
        """Exclusive lock for rewriting index.json.

        Separate from :meth:`lock` so that index updates coalesce: a writer links its record
        under the project lock, then takes this one and merges every record the index does not
        have yet, its own and those of writers that linked meanwhile; the writers queued behind
        it find nothing left to do and skip the rewrite (group commit).
        """
        with locked(self.dir / INDEX_LOCK_FILE):
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

    def _run_id_set(self) -> set[str]:
        """Like :meth:`run_ids`, unsorted (the index merge only needs membership)."""
        try:
            names = os.listdir(self.records_dir)
        except FileNotFoundError:
            return set()
        return {n[:-5] for n in names if n[-5:] == ".json" and n[:1] != "."}

    def read_record(self, run_id: str) -> MemoryRecord:
        """Read and validate one record; NotFoundError / ValidationError say which and why."""
        try:
            path = self.record_path(run_id)
        except ValidationError:
            raise ValidationError(f"{run_id}.json: the file name is not a valid run id, so it is not a record") from None
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
        events = list(events)
        payload = self.validate_write(rec, events)
        path = self.record_path(rec.runId)
        self._check_not_symlinked()
        if os.path.lexists(path):
            raise self._conflict(rec.runId)
        # The record is staged (written and fsynced under a .tmp- name readers ignore) outside
        # the lock; under the lock the ledger events go first, then the record is linked into
        # place, then the index follows. A writer killed at any point leaves no partial record;
        # killed after the events, a retry of the same run appends nothing twice (an open id is
        # not opened again) and links the record.
        tmp = stage(path, payload)
        try:
            with self.lock():
                if os.path.lexists(path):
                    raise self._conflict(rec.runId)
                written = self._append_events_locked(events, sync=False)
                try:
                    publish(tmp, path, overwrite=False, sync=False)
                except FileExistsError:
                    raise self._conflict(rec.runId) from None
                finally:
                    tmp = None
            # Durable before we return, but the fsyncs wait outside the lock.
            if written:
                sync_path(self.issues_path)
            sync_path(self.records_dir)
            with self.index_lock():
                self._update_index_locked(rec)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return path

    @staticmethod
    def validate_write(rec: MemoryRecord, events: Iterable[IssueEvent] = ()) -> bytes:
        """Everything :meth:`write_record` checks before touching the disk; returns the record's bytes.

        The write path calls it before registering a new project, so that bad input leaves
        nothing behind (not even a projects.json entry).
        """
        data = rec.to_dict()
        MemoryRecord.from_dict(data)  # validate exactly what goes to disk
        validate_run_id(rec.runId)
        if rec.supersedes and rec.supersedes == rec.runId:
            raise ValidationError("supersedes: a record cannot supersede itself")
        payload = _dumps(data, f"record {rec.runId}", indent=True) + b"\n"
        if len(payload) > MAX_RECORD_BYTES:
            raise ValidationError(
                f"record {rec.runId} would be {len(payload)} bytes, more than a record can be ({MAX_RECORD_BYTES}); "
                "shorten the task or the worker output"
            )
        for ev in events:
            IssueEvent.from_dict(ev.to_dict())
            _dumps(ev.to_dict(), f"issue event {ev.issueId}")
        return payload

    def _conflict(self, run_id: str) -> ConflictError:
        return ConflictError(
            f"record {run_id} already exists in project {self.slug}; records are append-only, "
            f"use `cybmem supersede {run_id} NEW.json` to correct it"
        )

    def _check_not_symlinked(self) -> None:
        """Refuse to write through a symlinked project or records dir: it would land outside the root."""
        for d in (self.dir, self.records_dir):
            if d.is_symlink():
                raise StoreError(
                    f"{d} is a symbolic link; cybmem writes only inside the memory root {self.root}. "
                    "Replace it with a real directory (see `cybmem doctor`)."
                )

    def supersede(self, old_run_id: str, new: MemoryRecord, events: Iterable[IssueEvent] = ()) -> Path:
        """Write ``new`` as the correction of ``old_run_id``; the old record stays as it is."""
        old_id = self.resolve_run_id(old_run_id)
        superseded = self.superseded_map()
        current = superseded.get(old_id)
        if current:
            raise ConflictError(
                f"record {old_id} is already superseded by {current}; supersede {self.newest_truth(old_id, superseded)} instead"
            )
        if new.runId == old_id:
            raise ValidationError("the correcting record needs a new runId; the old record is never rewritten")
        new.supersedes = old_id
        return self.write_record(new, events)

    def superseded_map(self) -> dict[str, str]:
        """old runId -> runId that supersedes it (from ``supersedes`` and ``supersededBy`` fields)."""
        return _supersession(list(self.iter_records()))

    def supersession_chain(self, run_id: str, superseded: dict[str, str] | None = None) -> list[str]:
        """Run ids that supersede ``run_id``, in order, ending with the newest truth ([] if none).

        Cycles and links to records that do not exist stop the walk.
        """
        superseded = self.superseded_map() if superseded is None else superseded
        out: list[str] = []
        seen = {run_id}
        current = run_id
        while current in superseded:
            nxt = superseded[current]
            if nxt in seen or not self.record_path(nxt).exists():
                break
            out.append(nxt)
            seen.add(nxt)
            current = nxt
        return out

    def newest_truth(self, run_id: str, superseded: dict[str, str] | None = None) -> str:
        """Follow supersession from ``run_id`` to the newest record."""
        chain = self.supersession_chain(run_id, superseded)
        return chain[-1] if chain else run_id

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
        """The ledger in file order; a torn or invalid line is skipped and reported once.

        Parsed lines are kept per process (keyed by the file's inode), so reading the ledger
        again only parses what was appended since: the write path reads it several times.
        """
        return list(self._ledger().events)

    def _ledger(self) -> "_LedgerView":
        """The ledger as parsed so far by this process, brought up to date; problems are recorded."""
        view, torn = _read_ledger(self.issues_path)
        for path, message in view.problems:
            self._problem(path, message)
        if torn is not None:
            lineno = view.lines + 1
            self._problem(f"{self.issues_path}:{lineno}",
                          f"{self.issues_path.name}:{lineno}: skipped a torn last line (no newline; "
                          "a writer was interrupted); the next append starts a fresh line")
        return view

    def embeddings(self) -> list[dict]:
        """Rows of embeddings.jsonl (``{"runId", "model", "vector"}``) in file order.

        A torn or invalid line is skipped and reported once in ``self.problems``.
        """
        try:
            raw = self.embeddings_path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot read {self.embeddings_path}: {exc}") from exc
        rows = []
        lines = raw.split(b"\n")
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                reason = _embedding_problem(row)
            except orjson.JSONDecodeError as exc:
                reason = f"not valid JSON ({exc})"
            if reason is None:
                rows.append(row)
                continue
            where = f"{self.embeddings_path.name}:{lineno}"
            if lineno == len(lines):
                reason = "a torn last line (no newline; a writer was interrupted)"
            self._problem(f"{self.embeddings_path}:{lineno}", f"{where}: skipped {reason}")
        return rows

    def issue_states(self) -> dict[str, IssueState]:
        """Current state of every issue (the fold of the ledger), in order of first appearance."""
        return {k: _copy_state(v) for k, v in self._ledger().folded.items()}

    def open_issues(self) -> list[IssueState]:
        """Issues whose last event is opened or reopened, oldest first."""
        states = [_copy_state(s) for s in self._ledger().folded.values() if s.state in ("opened", "reopened")]
        return sorted(states, key=lambda s: (s.openedAt, s.issueId))

    def append_issue_events(self, events: Iterable[IssueEvent]) -> list[IssueEvent]:
        """Append events that change something; returns those actually written."""
        events = list(events)
        if not events:
            return []
        with self.lock():
            return self._append_events_locked(events)

    def _ledger_states_locked(self) -> dict[str, str]:
        """issueId -> current event (call with the project lock held); see :func:`_read_ledger`."""
        return _read_ledger(self.issues_path)[0].states

    def _append_events_locked(self, events: list[IssueEvent], *, sync: bool = True) -> list[IssueEvent]:
        if not events:
            return []
        states = dict(self._ledger_states_locked())
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
        lines = [_dumps(ev.to_dict(), f"issue event {ev.issueId}") for ev in written]
        if lines:
            self._check_not_symlinked()
            try:
                append_lines(self.issues_path, lines, sync=sync)
            except OSError as exc:
                if self.issues_path.is_symlink():
                    raise StoreError(
                        f"{self.issues_path} is a symbolic link; the ledger is only ever appended inside the "
                        "memory root. Replace it with the real file (see `cybmem doctor`)."
                    ) from None
                raise StoreError(f"cannot append to {self.issues_path}: {exc}") from exc
        return written

    # --- the derived index -------------------------------------------------------
    #
    # index.json: {"version": 1, "count": N, "entries": [...newest first...], "skipped": {runId: why}}.
    # "skipped" names the record files that could not be read, so that the index can be checked
    # against records/ with one directory listing: entry ids + skipped ids == file names. A
    # writer killed between linking its record and updating the index leaves it stale; the next
    # write (or any reader) notices and merges the missing records in.

    def _read_index(self) -> tuple[list[dict], dict[str, str]] | None:
        """index.json's entries and skipped files, or None if it is missing or unreadable."""
        try:
            data = orjson.loads(self.index_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError):
            self._problem(str(self.index_path), "index.json is unreadable; run `cybmem rebuild` (or `cybmem doctor --repair`)")
            return None
        entries = data.get("entries") if isinstance(data, dict) else None
        skipped = data.get("skipped", {}) if isinstance(data, dict) else None
        ok = isinstance(entries, list) and data.get("count") == len(entries) and isinstance(skipped, dict)
        if ok:
            for e in entries:
                if (type(e) is not dict or type(e.get("runId")) is not str or type(e.get("endedAt")) is not int
                        or type(e.get("state")) is not str):
                    ok = False
                    break
        if not ok:
            self._problem(str(self.index_path), "index.json is damaged; run `cybmem rebuild` (or `cybmem doctor --repair`)")
            return None
        return entries, {str(k): str(v) for k, v in skipped.items()}

    def _merge_index(self, entries: list[dict], skipped: dict[str, str], present: set[str]) -> tuple[list[dict], dict[str, str], bool]:
        """Bring index entries up to date with the record files ``present``: drop vanished ones, add new ones."""
        by_id = {e["runId"]: e for e in entries}
        changed = len(by_id) != len(entries)
        for rid in [r for r in by_id if r not in present]:
            del by_id[rid]
            changed = True
        for rid in [r for r in skipped if r not in present]:
            del skipped[rid]
            changed = True
        new = sorted(r for r in present if r not in by_id and r not in skipped)
        added: list[MemoryRecord] = []
        for rid in new:
            try:
                added.append(self.read_record(rid))
            except NotFoundError:
                continue
            except (ValidationError, StoreError) as exc:
                skipped[rid] = str(exc)
                changed = True
        if not added and not changed:
            return entries, skipped, False
        for rec in added:
            by_id[rec.runId] = _index_entry(rec, rec.supersededBy)
        # Supersession as a full rebuild computes it: a record's own supersededBy, overridden by
        # the (greatest) runId of any record that names it in "supersedes".
        correctors: dict[str, str] = {}
        for e in by_id.values():
            target = e.get("supersedes")
            if target and target != e["runId"]:
                correctors[target] = max(correctors.get(target, ""), e["runId"])
        for rec in added:
            if rec.supersedes and rec.supersedes in by_id and rec.supersedes != rec.runId:
                by_id[rec.supersedes]["supersededBy"] = correctors[rec.supersedes]
            if rec.runId in correctors:
                by_id[rec.runId]["supersededBy"] = correctors[rec.runId]
        out = sorted(by_id.values(), key=_sort_key, reverse=True)
        return out, skipped, True

    def _report_skipped(self, skipped: dict[str, str]) -> None:
        for rid, why in sorted(skipped.items()):
            self._problem(str(self.records_dir / f"{rid}.json"), why)

    def index_entries(self) -> list[dict]:
        """index.json's entries, newest first, checked against records/ (one directory listing).

        Records the index does not know yet (a writer was killed before updating it, or one is
        writing right now) are merged in memory; a missing or damaged index is rebuilt in memory.
        Unreadable record files are reported once in ``self.problems``.
        """
        doc = self._read_index()
        if doc is None:
            entries, skipped = self._compute_index()
        else:
            entries, skipped, _ = self._merge_index(*doc, self._run_id_set())
        self._report_skipped(skipped)
        return entries

    def index_skipped(self) -> dict[str, str]:
        """Record files the index could not read: runId -> why."""
        doc = self._read_index()
        if doc is None:
            return self._compute_index()[1]
        return self._merge_index(*doc, self._run_id_set())[1]

    def _compute_index(self) -> tuple[list[dict], dict[str, str]]:
        """Index entries (newest first) and skipped files, from records/ alone."""
        recs: list[MemoryRecord] = []
        skipped: dict[str, str] = {}
        for run_id in self.run_ids():
            try:
                recs.append(self.read_record(run_id))
            except NotFoundError:
                continue
            except (ValidationError, StoreError) as exc:
                skipped[run_id] = str(exc)
        self._report_skipped(skipped)
        superseded = _supersession(recs)
        entries = [_index_entry(r, superseded.get(r.runId)) for r in recs]
        entries.sort(key=_sort_key, reverse=True)
        return entries, skipped

    def rebuild_index(self) -> int:
        """Regenerate index.json from records/ alone; returns the record count."""
        self._check_not_symlinked()
        ensure_dir(self.dir)
        with self.index_lock():
            entries, skipped = self._compute_index()
            self._write_index_locked(entries, skipped)
        return len(entries)

    @staticmethod
    def _index_bytes(entries: list[dict], skipped: dict[str, str]) -> bytes:
        # One compact JSON object per line: diff- and grep-friendly, still one JSON document.
        body = b",\n".join(b"  " + orjson.dumps(e) for e in entries)
        data = (
            b'{"version": ' + str(INDEX_VERSION).encode() + b', "count": ' + str(len(entries)).encode()
            + b', "entries": [\n' + body + (b"\n" if entries else b"") + b"]"
        )
        if skipped:
            data += b', "skipped": ' + orjson.dumps(dict(sorted(skipped.items())))
        return data + b"}\n"

    def _write_index_locked(self, entries: list[dict], skipped: dict[str, str] | None = None) -> None:
        # Derived and checked against records/ on every read: no fsync (a lost index is rebuilt).
        atomic_write(self.index_path, self._index_bytes(entries, skipped or {}), durable=False)

    def _update_index_locked(self, rec: MemoryRecord | None = None) -> None:
        """Bring index.json up to date with records/ (call with :meth:`index_lock` held).

        The directory is listed after the lock is taken, so every record linked before this
        call is merged; when another writer already merged ours, nothing is rewritten.
        """
        if rec is not None:
            # Group commit, the cheap way: if a writer that took the lock after our record was
            # linked has merged it already, there is nothing to do. Entries are written by
            # orjson with runId first, and inside a JSON string every quote is escaped, so this
            # byte pattern only ever matches the start of the entry itself.
            try:
                raw = self.index_path.read_bytes()
            except OSError:
                raw = b""
            if b'{"runId":' + orjson.dumps(rec.runId) + b"," in raw:
                return
        doc = self._read_index()
        if doc is None:
            # Missing or damaged: the full truth is records/.
            entries, skipped = self._compute_index()
        else:
            entries, skipped, changed = self._merge_index(doc[0], doc[1], self._run_id_set())
            if not changed:
                return
        self._write_index_locked(entries, skipped)

    def report_problems(self, stream=None) -> None:
        """Print each read problem once to stderr (as ``warning: ...``)."""
        stream = stream or sys.stderr
        for p in self.problems:
            print(f"warning: {p.message}", file=stream)
