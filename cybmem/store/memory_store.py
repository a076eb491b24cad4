"""MemoryStore: one project's records and issue ledger on disk.

Records are written once (temp file, fsync, hard link: an existing runId can never be replaced);
the one later change the write path makes is adding ``supersededBy`` when a correction is written
(cybmem.store.supersession), the only rewrite a person's ``cybmem redact``. The ledger is appended
whole lines at a time under an OS lock. The derived index.json and its compaction are the store's
index (``store.index``, a :class:`~cybmem.store.index.ProjectIndex` it holds and reads records for).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from .. import _io
from . import embeddings, ledger as issues, supersession
from .._io import append_lines, atomic_write, locked, publish, stage, sync_path
from ..errors import WARNING_PREFIX, AmbiguousError, ConflictError, NotFoundError, StoreError, ValidationError
from .index import ProjectIndex
from .ledger import MAX_LEDGER_BYTES, IssueState
from .projects import select_project, validate_slug
from .records import ISSUE_ID_RE, IssueEvent, MemoryRecord, check_not_future, validate_run_id
from ..settings import DEFAULT_INDEX_CAP, Settings

__all__ = ["MemoryStore", "ReadProblem", "MAX_RECORD_BYTES", "MAX_LEDGER_BYTES", "parse_record"]

LOCK_FILE = ".lock"
MAX_RECORD_BYTES = 64 * 1024 * 1024


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


def dumps(obj, what: str, *, indent: bool = False) -> bytes:
    """orjson.dumps with a ValidationError that names the field that cannot be stored."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0)
    except TypeError as exc:
        where = _first_unstorable(obj, "") or "a value"
        raise ValidationError(
            f"{what}: {where} cannot be stored as JSON ({exc}); text must be valid UTF-8 (no lone surrogates)"
        ) from None


def parse_record(name: str, raw: bytes) -> MemoryRecord:
    """Decode and validate the bytes of ``records/<name>``; the one record parser.

    Raises:
        ValidationError: naming the file and the field at fault.
    """
    try:
        data = _io.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"{name}: not valid JSON ({exc})") from None
    try:
        rec = MemoryRecord.from_dict(data)
    except ValidationError as exc:
        raise ValidationError(f"{name}: {exc}") from None
    if rec.runId != name[:-5]:
        raise ValidationError(f"{name}: runId {rec.runId!r} does not match its file name")
    return rec


def _is_record_name(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


@dataclass(frozen=True)
class ReadProblem:
    """A file or line that could not be read; readers skip it and report it once."""

    path: str
    message: str


@dataclass
class _LedgerView:
    """What one process has folded of one ledger file: whole lines up to ``offset``.

    Only the fold is kept (not the events), so a ledger of millions of events costs memory in
    proportion to its issues.
    """

    ino: int
    offset: int = 0
    lines: int = 0
    head: bytes = b""  # the first bytes and the last consumed bytes: an append-only file never changes them
    tail: bytes = b""
    folded: dict[str, IssueState] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)


_LEDGERS: dict[str, _LedgerView] = {}
_LEDGERS_LOCK = threading.Lock()
_CHECK_BYTES = 256


def _ledger_problem(path: Path, lineno: int, why: str) -> tuple[str, str]:
    return f"{path}:{lineno}", f"{path.name}:{lineno}: {why}"


def _read_ledger(path: Path) -> tuple[_LedgerView, bytes | None]:
    """Fold what was appended to a ledger since this process last read it.

    Returns the view (folded states, unreadable whole lines) and the torn tail (bytes after the
    last newline) if any. The tail is not consumed: once the next append has closed it with a
    newline it is read, and skipped, as a whole line. The ledger is append-only, so a file with
    the same inode and the same first and last-consumed bytes that has not shrunk only grew;
    anything else is folded again from the start.
    """
    with _LEDGERS_LOCK:
        key = str(path)
        try:
            raw, st = _io.read_file_st(path, limit=MAX_LEDGER_BYTES)
        except FileNotFoundError:
            _LEDGERS.pop(key, None)
            return _LedgerView(ino=0), None
        view = _LEDGERS.get(key)
        if view is None or view.ino != st.st_ino or len(raw) < view.offset or (
            view.offset and (raw[: len(view.head)] != view.head or raw[view.offset - len(view.tail): view.offset] != view.tail)
        ):
            view = _LEDGERS[key] = _LedgerView(ino=st.st_ino)
        fresh = raw[view.offset:] if view.offset else raw
        problems: list[tuple[int, str]] = []
        for _, ev in issues.iter_ledger(fresh, problems, first_line=view.lines + 1):
            issues.fold_into(view.folded, ev)  # streamed: the events are never all held
        consumed = fresh.rfind(b"\n") + 1
        lines = fresh.count(b"\n", 0, consumed)
        view.problems += [_ledger_problem(path, n, why) for n, why in problems]
        if consumed:
            done = view.offset + consumed
            view.head = raw[: min(done, _CHECK_BYTES)]
            view.tail = raw[max(done - _CHECK_BYTES, 0): done]
            view.offset = done
            view.lines += lines
        tail = fresh[consumed:]
        return view, (tail if tail.strip() else None)


def _copy(st: IssueState) -> IssueState:
    """A shallow copy: callers get their own objects; the per-process fold stays untouched."""
    out = IssueState.__new__(IssueState)
    out.__dict__.update(st.__dict__)
    return out


def _with_superseded_by(raw: bytes, new_id: str) -> bytes:
    """The record's bytes with ``"supersededBy": new_id`` added, every other byte unchanged."""
    body = raw.rstrip()
    if not body.endswith(b"}"):
        raise ValidationError("record does not end with '}'")
    value = orjson.dumps(new_id)
    if b'\n  "' in body:  # indented as cybmem and JSON.stringify(rec, null, 2) write it
        return body[:-1].rstrip() + b',\n  "supersededBy": ' + value + b"\n}\n"
    return body[:-1].rstrip() + b',"supersededBy":' + value + b"}"


class MemoryStore:
    """One project's memory: ``<root>/<slug>/`` (its index.json and compaction: :attr:`index`, a
    :class:`~cybmem.store.index.ProjectIndex`)."""

    def __init__(self, root: str | os.PathLike, slug: str, *, index_cap: int = DEFAULT_INDEX_CAP):
        validate_slug(slug)
        self.root = Path(root)
        self.slug = slug
        self.dir = self.root / slug
        self.records_dir = self.dir / "records"
        self.issues_path = self.dir / "issues.jsonl"
        self.embeddings_path = self.dir / "embeddings.jsonl"
        self.index_cap = max(int(index_cap), 0)  # 0: no cap
        self.problems: list[ReadProblem] = []
        #: index.json and its compaction, over this store's records (read problems noted here)
        self.index = ProjectIndex(self, self._problem)
        self.index_path, self.archive_path = self.index.index_path, self.index.archive_path

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
        """The store of ``project`` (a slug) or of the project at ``cwd`` (default: the current dir).

        Raises:
            NotFoundError: the project has no memory (and ``create`` is False); the message names
                the known projects.
        """
        return cls(settings.memory_dir, select_project(settings.memory_dir, cwd=cwd, project=project, create=create),
                   index_cap=settings.index_cap)

    def exists(self) -> bool:
        return self.records_dir.is_dir() or self.issues_path.exists()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock for the ledger (and for linking records) of this project; taken only
        where cybmem may write (:meth:`check_writable`), so no lock file lands through a link."""
        self.check_writable()
        with locked(self.dir / LOCK_FILE):
            yield

    def _problem(self, path: str, message: str) -> None:
        self.note_problems([ReadProblem(path, message)])

    def note_problems(self, problems: Iterable[ReadProblem]) -> None:
        """Add read problems found elsewhere (e.g. by a snapshot load) to :attr:`problems`, each once."""
        for problem in problems:
            if problem not in self.problems:
                self.problems.append(problem)

    def report_problems(self, stream=None) -> None:
        """Print each read problem once to stderr (as ``warning: ...``, :data:`WARNING_PREFIX`)."""
        stream = stream or sys.stderr
        for p in self.problems:
            print(f"{WARNING_PREFIX}{p.message}", file=stream)

    # --- the index (store.index), its reads the callers use most ---------------------

    def index_entries(self) -> list[dict]:
        """:meth:`ProjectIndex.index_entries <cybmem.store.index.ProjectIndex.index_entries>`."""
        return self.index.index_entries()

    def all_entries(self) -> list[dict]:
        """:meth:`ProjectIndex.all_entries <cybmem.store.index.ProjectIndex.all_entries>`."""
        return self.index.all_entries()

    def latest_run_id(self, *, before_ms: int | None = None, exclude: str | None = None) -> str | None:
        """:meth:`ProjectIndex.latest_run_id <cybmem.store.index.ProjectIndex.latest_run_id>`."""
        return self.index.latest_run_id(before_ms=before_ms, exclude=exclude)

    def rebuild_index(self, *, full: bool = False) -> int:
        """Regenerate index.json from records/ alone (:meth:`ProjectIndex.rebuild_index
        <cybmem.store.index.ProjectIndex.rebuild_index>`), never through a symlinked project dir."""
        self.check_writable()
        return self.index.rebuild_index(full=full)

    # --- records -----------------------------------------------------------------

    def record_path(self, run_id: str) -> Path:
        return self.records_dir / f"{validate_run_id(run_id)}.json"

    def listing(self) -> dict[str, int]:
        """name -> inode of every record file in records/ (temp files and dotfiles are not records).

        Raises:
            StoreError: records/ exists but cannot be listed.
        """
        try:
            with os.scandir(self.records_dir) as it:
                return {e.name: e.inode() for e in it if _is_record_name(e.name)}
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"cannot list {self.records_dir}: {exc.strerror or exc}") from None

    def run_ids(self) -> list[str]:
        """Run ids of every record file, sorted; temp leftovers and stray files are ignored."""
        return sorted(n[:-5] for n in self.listing())

    def read_record_st(self, run_id: str) -> tuple[MemoryRecord, os.stat_result]:
        """Read and validate one record; also the stat of the file that was read."""
        try:
            path = self.record_path(run_id)
        except ValidationError:
            raise ValidationError(f"{run_id}.json: the file name is not a valid run id, so it is not a record") from None
        try:
            raw, st = _io.read_file_st(path, limit=MAX_RECORD_BYTES)
        except FileNotFoundError:
            raise NotFoundError(f"no record {run_id} in project {self.slug}; see `cybmem list`") from None
        return parse_record(path.name, raw), st

    def read_record(self, run_id: str) -> MemoryRecord:
        """Read and validate one record; NotFoundError / ValidationError / StoreError say which and why."""
        return self.read_record_st(run_id)[0]

    def iter_records(self) -> Iterator[MemoryRecord]:
        """Every readable record; unreadable ones are skipped and added to ``self.problems``."""
        for run_id in self.run_ids():
            try:
                yield self.read_record(run_id)
            except NotFoundError:
                continue
            except (ValidationError, StoreError) as exc:
                self._problem(str(self.records_dir / f"{run_id}.json"), str(exc))

    def records(self) -> list[MemoryRecord]:
        """All readable records, oldest first (by endedAt, then runId)."""
        return sorted(self.iter_records(), key=lambda r: (r.endedAt, r.runId))

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

    # --- writing -----------------------------------------------------------------

    def write_record(self, rec: MemoryRecord, events: Iterable[IssueEvent] = ()) -> Path:
        """Write a new record (never overwriting) and append its issue events.

        Raises ConflictError if the runId already has a record: records are append-only;
        use :meth:`supersede` to correct one.
        """
        return self.commit(rec, events)[0]

    def commit(self, rec: MemoryRecord, events: Iterable[IssueEvent] = (), *,
               corrects: str | None = None) -> tuple[Path, list[IssueEvent]]:
        """Write a new record and its issue events; returns its path and the events appended.

        With ``corrects`` the record is the correction of that run (see :meth:`supersede`).
        """
        events = list(events)
        if corrects is not None:
            if rec.runId == corrects:
                raise ValidationError("the correcting record needs a new runId; the old record is never rewritten")
            self._check_correctable(corrects, rec.runId)
            rec.supersedes = corrects
        payload = self.validate_write(rec, events)
        path = self.record_path(rec.runId)
        self.check_writable()
        if os.path.lexists(path):
            raise self._conflict(rec.runId)
        # The record is staged (written and fsynced under a .tmp- name readers ignore) outside
        # the lock, owned by this process until it is linked (cybmem._io.Staged: doctor never
        # removes a live writer's temp file, however long it waits for the lock). Under the lock
        # the staged file is checked to be there still (re-staged if something removed it), the
        # ledger events go next, then (for a correction) the corrected record gains
        # supersededBy, then the record is linked into place; the index follows. A writer killed
        # at any point leaves no partial record: killed after the events, a retry appends nothing
        # twice (an open id is not opened again); killed after supersededBy, that link names a
        # missing run, which every reader ignores, and the retry completes it.
        tmp = stage(path, payload)
        try:
            with self.lock():
                if os.path.lexists(path):
                    raise self._conflict(rec.runId)
                if corrects is not None:
                    self._check_correctable(corrects, rec.runId)
                if not tmp.present():  # removed by hand or by another tool: no event without its record
                    tmp.release()
                    tmp = stage(path, payload)
                written = self._append_events_locked(events, sync=False)
                if corrects is not None:
                    self._mark_superseded_locked(corrects, rec.runId)
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
            try:
                with self.index.index_lock():
                    self.index.update_locked(rec.runId)
            except OSError as exc:
                # The record and its events are committed; the index is derived and every reader
                # merges what it lacks, so this is a warning, never a failed write.
                self._problem(str(self.index_path), f"record {rec.runId} written, but index.json was not updated ({exc}); "
                              "run `cybmem rebuild`")
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                tmp.release()
        return path, written

    @staticmethod
    def validate_write(rec: MemoryRecord, events: Iterable[IssueEvent] = ()) -> bytes:
        """Everything :meth:`write_record` checks before touching the disk; returns the record's bytes.

        The write path calls it before registering a new project, so that bad input leaves
        nothing behind (not even a projects.json entry).
        """
        data = rec.to_dict()
        MemoryRecord.from_dict(data)  # validate exactly what goes to disk
        validate_run_id(rec.runId)
        check_not_future(rec.endedAt, int(time.time() * 1000))
        if rec.supersedes and rec.supersedes == rec.runId:
            raise ValidationError("supersedes: a record cannot supersede itself")
        payload = dumps(data, f"record {rec.runId}", indent=True) + b"\n"
        if len(payload) > MAX_RECORD_BYTES:
            raise ValidationError(
                f"record {rec.runId} would be {len(payload)} bytes, more than a record can be ({MAX_RECORD_BYTES}); "
                "shorten the task or the worker output"
            )
        for ev in events:
            IssueEvent.from_dict(ev.to_dict())
            dumps(ev.to_dict(), f"issue event {ev.issueId}")
        return payload

    def _conflict(self, run_id: str) -> ConflictError:
        return ConflictError(
            f"record {run_id} already exists in project {self.slug}; records are append-only, "
            f"use `cybmem supersede {run_id} NEW.json` to correct it"
        )

    def symlinked_dirs(self) -> list[Path]:
        """The project's directories that are symbolic links (the one path guard): the project
        dir, records/ and .cache/. Nothing is written through them: it would land outside the
        memory root (and the cache's clean-up would delete files there)."""
        return [d for d in (self.dir, self.records_dir, self.dir / ".cache") if d.is_symlink()]

    def check_writable(self) -> None:
        """May cybmem write in this project? The one rule, asked before every file or lock of the
        project is created or written (records, the ledger, embeddings, index.json, the feedback
        logs, weights.json, the re-tune state, exports.json, redaction, every lock): not through
        a symlinked project or records dir, which would land outside the memory root (a symlinked
        .cache is not refused here: the cache is then neither read nor written).

        Raises:
            StoreError: naming the link and what to do.
        """
        for d in self.symlinked_dirs():
            if d.name != ".cache":
                raise StoreError(
                    f"{d} is a symbolic link; cybmem writes only inside the memory root {self.root}. "
                    "Replace it with a real directory (see `cybmem doctor`)."
                )

    # --- supersession --------------------------------------------------------------

    def links(self) -> list[supersession.Link]:
        """(runId, endedAt, supersedes, supersededBy) of the records that carry a link (archived ones too)."""
        return [link for link in self.link_rows()[0] if link[2] or link[3]]

    def link_rows(self, _index: tuple | None = None) -> tuple[list[supersession.Link], dict[str, int]]:
        """(runId, endedAt, supersedes, supersededBy) of every indexed and archived record, and the
        endedAt of each (no archived record file is read)."""
        entries, _, archived = _index or self.index.current()
        rows = [(e["runId"], e["endedAt"], e.get("supersedes"), e.get("supersededBy")) for e in entries]
        rows += [(rid, a[0], a[2], a[3]) for rid, a in archived.items()]
        return rows, {rid: ended for rid, ended, _, _ in rows}

    def superseded_map(self, _index: tuple | None = None) -> dict[str, str]:
        """superseded runId -> the runId that directly corrects it (cybmem.store.supersession's rule)."""
        rows, ended = self.link_rows(_index)
        return supersession.resolve([r for r in rows if r[2] or r[3]], ended)

    def supersession_chain(self, run_id: str, superseded: dict[str, str] | None = None) -> list[str]:
        """Run ids that supersede ``run_id``, in order, ending with the newest truth ([] if none)."""
        return supersession.walk(self.superseded_map() if superseded is None else superseded, run_id)

    def newest_truth(self, run_id: str, superseded: dict[str, str] | None = None) -> str:
        """Follow supersession from ``run_id`` to the newest record."""
        return supersession.newest_truth(self.superseded_map() if superseded is None else superseded, run_id)

    def _check_correctable(self, old_id: str, new_id: str) -> None:
        current = self.superseded_map().get(old_id)
        if current and current != new_id:
            raise ConflictError(
                f"record {old_id} is already superseded by {current}; supersede {self.newest_truth(old_id)} instead"
            )

    def supersede(self, old_run_id: str, new: MemoryRecord, events: Iterable[IssueEvent] = ()) -> Path:
        """Write ``new`` as the correction of ``old_run_id``.

        The new record carries ``supersedes``; then the old record gains ``supersededBy`` by
        atomic replace (temp file + rename), every other byte unchanged: the one change the
        store ever makes to an existing record, so that readers that only follow
        ``supersededBy`` (the seeds' TypeScript reader) see the correction too.
        """
        return self.commit(new, events, corrects=self.resolve_run_id(old_run_id))[0]

    def _mark_superseded_locked(self, old_id: str, new_id: str) -> None:
        """Add ``supersededBy`` to the corrected record (project lock held)."""
        path = self.record_path(old_id)
        raw = _io.read_file(path, limit=MAX_RECORD_BYTES)
        old = parse_record(path.name, raw)
        if old.supersededBy == new_id:
            return
        data = _io.loads(raw)
        if "supersededBy" in data:
            # A stale link written by another tool: replace its value, keep every other field.
            out = dumps({**data, "supersededBy": new_id}, f"record {old_id}", indent=True) + b"\n"
        else:
            out = _with_superseded_by(raw, new_id)
            if _io.loads(out) != {**data, "supersededBy": new_id}:
                out = dumps({**data, "supersededBy": new_id}, f"record {old_id}", indent=True) + b"\n"
        atomic_write(path, out)

    # --- the issue ledger --------------------------------------------------------

    def ledger_bytes(self) -> bytes:
        """The ledger's bytes as they are now (b"" when there is no ledger yet); a ledger that
        cannot be read raises :class:`StoreError` (cybmem._io.read_file)."""
        try:
            return _io.read_file(self.issues_path, limit=MAX_LEDGER_BYTES)
        except FileNotFoundError:
            return b""

    def iter_issue_events(self) -> Iterator[tuple[int, IssueEvent]]:
        """(line number, event) of the ledger in file order, parsed as it is read.

        A torn or invalid line is skipped and reported once in ``self.problems``; a ledger that cannot
        be read (not a regular file: a FIFO there) is reported so and read as empty, as the cache's
        loader reads it (an export of the issues skips it with one line, as it skips any such file).
        """
        try:
            raw = self.ledger_bytes()
        except StoreError as exc:
            self._problem(str(self.issues_path), f"{exc}; issues are left out")
            return
        problems: list[tuple[int, str]] = []
        yield from issues.iter_ledger(raw, problems)
        for lineno, why in problems:
            self._problem(*_ledger_problem(self.issues_path, lineno, why))
        consumed = raw.rfind(b"\n") + 1
        if raw[consumed:].strip():
            self._problem(*_ledger_problem(self.issues_path, raw.count(b"\n") + 1, "skipped a torn last line (no "
                                           "newline; a writer was interrupted); the next append starts a fresh line"))

    def issue_events(self) -> list[IssueEvent]:
        """The ledger's events in file order (see :meth:`iter_issue_events`)."""
        return [ev for _, ev in self.iter_issue_events()]

    def _ledger(self) -> _LedgerView:
        """The ledger as folded so far by this process, brought up to date; problems are recorded."""
        view, torn = _read_ledger(self.issues_path)
        for path, message in view.problems:
            self._problem(path, message)
        if torn is not None:
            self._problem(*_ledger_problem(self.issues_path, view.lines + 1,
                                           "skipped a torn last line (no newline; a writer was interrupted); "
                                           "the next append starts a fresh line"))
        return view

    def issue_states_for(self, ids: Iterable[str]) -> dict[str, IssueState]:
        """The fold of just these issues (ids the ledger never names are absent), reading only the
        ledger lines that name one of them: what the write path needs of a ledger of millions
        of events. A line is found by its ``"issueId":"<id>"`` pair as JSON writers put it."""
        wanted = {i for i in ids if isinstance(i, str) and ISSUE_ID_RE.fullmatch(i)}
        if not wanted:
            return {}
        raw = self.ledger_bytes()
        end = raw.rfind(b"\n") + 1
        alternatives = b"|".join(re.escape(i.encode()) for i in sorted(wanted, key=len, reverse=True))
        pattern = re.compile(rb'"issueId"\s*:\s*"(?:' + alternatives + rb')"')
        states: dict[str, IssueState] = {}
        previous = -1
        for m in pattern.finditer(raw, 0, end):
            start = raw.rfind(b"\n", 0, m.start()) + 1
            if start == previous:
                continue
            previous = start
            try:
                ev = issues.event_from_dict(_io.loads(raw[start:raw.index(b"\n", m.end())]))
            except (ValueError, ValidationError):
                continue  # an unreadable line: the full readers report it
            if ev.issueId in wanted:
                issues.fold_into(states, ev)
        return states

    def issue_states(self) -> dict[str, IssueState]:
        """Current state of every issue (cybmem.store.ledger' fold), in order of first appearance."""
        return {k: _copy(v) for k, v in self._ledger().folded.items()}

    def open_issues(self) -> list[IssueState]:
        """Issues whose last event is opened or reopened, oldest first."""
        return issues.open_states(_copy(s) for s in self._ledger().folded.values())

    def append_issue_events(self, events: Iterable[IssueEvent]) -> list[IssueEvent]:
        """Append events that change something; returns those actually written."""
        events = list(events)
        if not events:
            return []
        with self.lock():
            written = self._append_events_locked(events, sync=False)
        if written:
            sync_path(self.issues_path)
        return written

    def mark_issue(self, issue_id: str, event: str, *, by: str | None = None, detail: str | None = None,
                   at: int | None = None, redact_secrets: bool = True) -> list[IssueEvent]:
        """Append a state change (resolved, wontfix or reopened) for an existing issue.

        ``detail`` goes through the write path's redaction pass (cybmem.store.secrets.redact_value)
        unless ``redact_secrets`` is False (CYBERINE_MEMORY_REDACT=0).

        Returns the event written, or [] when the issue is already in that state.

        Raises:
            ValidationError: ``event`` is not resolved, wontfix or reopened.
            NotFoundError: no issue with that id (the message says how to list them).
        """
        if event not in ("resolved", "wontfix", "reopened"):
            raise ValidationError(f"{event!r} is not one of resolved, wontfix, reopened")
        if redact_secrets and detail:
            from .secrets import redact_value

            detail = redact_value(detail)[0]
        # The state is read under the lock the append takes: two marks at once cannot both find
        # the issue closed and both reopen it.
        with self.lock():
            found = self.issue_states_for([issue_id])
            if issue_id not in found:
                raise NotFoundError(f"no issue {issue_id!r} in project {self.slug}; see `cybmem issues --all`")
            st = found[issue_id]
            ev = IssueEvent(issueId=issue_id, at=at if at is not None else int(time.time() * 1000), event=event,
                            byRunId=by, title=st.title if st.titled else None, detail=detail)
            written = self._append_events_locked([ev], sync=False, states={issue_id: st.state})
        if written:
            sync_path(self.issues_path)
        return written

    def _append_events_locked(self, events: list[IssueEvent], *, sync: bool = True,
                              states: dict[str, str] | None = None) -> list[IssueEvent]:
        """Append the events that change their issue's state (project lock held; ``states``: the
        current state of their ids, when the caller has just read it under the same lock).

        An event that would not change the fold's state is dropped: opened or reopened while
        open, resolved while resolved, wontfix while wontfix (doctor reports such lines that
        another writer left). An opened of an issue that is closed becomes reopened.
        """
        if not events:
            return []
        if states is None:
            states = {k: v.state for k, v in self.issue_states_for(ev.issueId for ev in events).items()}
        states = dict(states)
        written = []
        for ev in events:
            IssueEvent.from_dict(ev.to_dict())
            current = states.get(ev.issueId)
            if ev.event == "opened" and current is not None and current not in issues.OPEN:
                ev = IssueEvent(**{**ev.__dict__, "event": "reopened"})
            if issues.repeats(current, ev.event):
                continue  # an id already open is not opened again; a closed one not closed the same way again
            states[ev.issueId] = ev.event
            written.append(ev)
        lines = [dumps(ev.to_dict(), f"issue event {ev.issueId}") for ev in written]
        if lines:
            try:
                append_lines(self.issues_path, lines, sync=sync)
            except OSError as exc:
                if self.issues_path.is_symlink():
                    raise StoreError(
                        f"{self.issues_path} is a symbolic link; the ledger is only ever appended inside the "
                        "memory root. Replace it with the real file (see `cybmem doctor`)."
                    ) from None
                raise StoreError(f"cannot append to {self.issues_path}: {exc.strerror or exc}") from None
        return written

    # --- embeddings -----------------------------------------------------------------

    def append_embeddings(self, rows: Sequence[tuple[str, str, np.ndarray]], *, since: int = 0) -> tuple[int, int]:
        """Append ``(runId, model, vector)`` rows to embeddings.jsonl, at most one line per (runId, model).

        Under the project lock, the bytes after ``since`` are checked for lines of the same keys
        (another writer, e.g. a backfill, may have embedded the same record meanwhile); the caller
        promises that none exists before ``since`` (a record's vector cannot predate its record;
        a backfill passes the offset up to which it knows the file).

        Returns:
            (lines written, the file's size after the append): the next call's ``since``.
        """
        with self.lock():
            have = embeddings.keys_in(self.embeddings_path, {(rid, model) for rid, model, _ in rows}, offset=since)
            lines = []
            for rid, model, vec in rows:
                if (rid, model) not in have:
                    have.add((rid, model))
                    lines.append(embeddings.row_bytes(validate_run_id(rid), model, vec))
            try:
                append_lines(self.embeddings_path, lines, sync=False)
                size = self.embeddings_path.stat().st_size if self.embeddings_path.exists() else 0
            except OSError as exc:
                if self.embeddings_path.is_symlink():
                    raise StoreError(f"{self.embeddings_path} is a symbolic link; cybmem appends only inside the memory "
                                     "root. Replace it with the real file (see `cybmem doctor`).") from None
                raise StoreError(f"cannot append to {self.embeddings_path}: {exc.strerror or exc}") from None
        if lines:
            sync_path(self.embeddings_path)
        return len(lines), size
