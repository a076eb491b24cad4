"""Remove a secret from one run's memory, everywhere it was copied: ``cybmem redact RUN``.

The write path redacts the secret shapes it knows; a secret it does not know (a passphrase, an
internal hostname) is found later by a person, and this is the procedure for it, in one step:
the run's record and its ledger lines are rewritten with every string redacted and each given
text replaced by ``[REDACTED:manual]``, an issue id spelled from such a text is renamed
everywhere, the run's vectors are dropped, the derived files rebuilt or emptied, the exports in
``exports.json`` brought in line, and every file of the project searched for what is left.
It is journalled (``redact-pending.json``): each step is idempotent and marked once done, so a
redaction killed at any point is finished by the next ``cybmem redact`` or ``cybmem doctor
--repair``. The source rewrites hold the project lock, the derived files and exports do not, and
one redaction of a project runs at a time (``.redact.lock``). This is the second of the two
rewrites cybmem ever makes of a record or the ledger (the first is ``supersededBy``); the steps
in full: USAGE.md, "Guarantees".
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _io
from ..store import cache as _cache
from ..errors import StoreError, ValidationError
from ..store.outcome import issue_slug
from ..store.secrets import redact_value
from ..store.records import validate_run_id
from ..store.memory_store import MAX_LEDGER_BYTES, MAX_RECORD_BYTES, MemoryStore, dumps, parse_record

__all__ = ["JOURNAL", "MANUAL", "REDACT_LOCK", "ScrubResult", "complete_pending", "pending", "scrub_run", "scrub_runs"]

#: What a given text is replaced with.
MANUAL = "[REDACTED:manual]"
#: The journal of a redaction under way, in the project directory.
JOURNAL = "redact-pending.json"
#: Ledger keys that are identities, never rewritten (a secret in them is reported instead).
_LEDGER_KEYS = ("issueId", "at", "event", "byRunId")
#: The steps of a redaction, in order; the journal lists those done. The first ones rewrite the
#: store's own files (under the project lock); the last ones only what is derived from them, and
#: the exports (writers go on meanwhile). One redaction at a time: REDACT_LOCK.
_SOURCE_STEPS = ("records", "ledger", "relink", "archive", "vectors")
_STEPS = _SOURCE_STEPS + ("derived", "exports")
REDACT_LOCK = ".redact.lock"
_MARKER = r"\[REDACTED:[A-Za-z0-9_]+\]"


@dataclass
class ScrubResult:
    """What :func:`scrub_run` changed, and what still holds a given text."""

    run_id: str
    project: str
    kinds: list[str] = field(default_factory=list)  # secret shapes the pattern pass found
    replaced: int = 0  # occurrences of the given texts replaced
    fields: list[str] = field(default_factory=list)  # record fields rewritten (of the run, or of all runs)
    runs: dict[str, list[str]] = field(default_factory=dict)  # run id -> its record fields rewritten
    renamed: dict[str, str] = field(default_factory=dict)  # issue ids renamed: old -> new
    records_relinked: list[str] = field(default_factory=list)  # other runs whose issue list was renamed
    ledger_lines: int = 0
    archive_lines: int = 0
    embeddings_dropped: int = 0
    rebuilt: list[str] = field(default_factory=list)
    emptied: list[str] = field(default_factory=list)  # caches emptied (the next read rebuilds them)
    exports: list[str] = field(default_factory=list)  # exports brought in line (what was done to each)
    unreachable: list[str] = field(default_factory=list)  # exports it cannot rewrite, and how to redo them
    remaining: list[str] = field(default_factory=list)  # files (and why) still holding a given text
    completed: "ScrubResult | None" = None  # an interrupted redaction this one finished first
    started_at: int = 0  # epoch ms: when the redaction was planned
    targets: list[str] = field(default_factory=list)  # the runs it was asked to redact

    @property
    def changed(self) -> bool:
        return bool(self.runs or self.ledger_lines or self.archive_lines or self.embeddings_dropped
                     or self.records_relinked)

    def to_dict(self) -> dict:
        out = {"runId": self.run_id or None, "runs": self.runs, "project": self.project, "kinds": self.kinds,
               "replaced": self.replaced, "fields": self.fields, "renamedIssues": self.renamed,
               "recordsRelinked": self.records_relinked, "ledgerLines": self.ledger_lines,
               "archiveLines": self.archive_lines, "embeddingsDropped": self.embeddings_dropped,
               "rebuilt": self.rebuilt, "emptied": self.emptied, "exports": self.exports, "unreachable": self.unreachable,
               "remaining": self.remaining}
        out["startedAt"] = self.started_at
        out["completed"] = self.completed.to_dict() if self.completed is not None else None
        return out


class _Cleaner:
    """Strings in, strings out: the pattern pass, then the given texts; counts what it did.

    A given text inside a marker already written (``manual`` in ``[REDACTED:manual]``) is left
    alone, so cleaning twice changes nothing (a redaction finished after a crash redoes steps).
    """

    def __init__(self, secrets: list[str], patterns: bool):
        self.secrets = sorted(secrets, key=len, reverse=True)  # a longer text before a text inside it
        self.patterns = patterns
        self.kinds: set[str] = set()
        self.replaced = 0
        self._given = _finder(self.secrets) if self.secrets else None

    def _sub(self, m: re.Match[str]) -> str:
        if m.group(1) is None:
            return m.group(0)  # a marker: kept
        self.replaced += 1
        return MANUAL

    def text(self, value: str) -> str:
        if self.patterns:
            value, _ = redact_value(value, self.kinds)
        if self._given is not None and any(s in value for s in self.secrets):
            value = self._given.sub(self._sub, value)
        return value

    def value(self, value: Any, where: str, changed: list[str], keep: tuple[str, ...] = ()) -> Any:
        if isinstance(value, str):
            out = self.text(value)
            if out != value:
                changed.append(where or "(value)")
            return out
        if isinstance(value, list):
            return [self.value(v, f"{where}[{i}]", changed) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: v if k in keep else self.value(v, f"{where}.{k}" if where else k, changed)
                    for k, v in value.items()}
        return value


def _finder(texts: list[str]) -> re.Pattern[str]:
    """A marker, or (group 1) one of ``texts``, longest first."""
    alts = "|".join(re.escape(t) for t in sorted(set(texts), key=len, reverse=True))
    return re.compile(f"{_MARKER}|({alts})")


def _secrets(secrets: list[str]) -> list[str]:
    out = [s for s in (s.strip("\r\n") for s in secrets) if s]
    short = [s for s in out if len(s) < 4]
    if short:
        raise ValidationError(f"a text to remove must be at least 4 characters (got {len(short)} shorter); a "
                              "shorter one would match inside ordinary words")
    return out


# --- the journal ---------------------------------------------------------------------------


@dataclass
class _Plan:
    """A redaction as the journal holds it: enough to finish it without the person who began it."""

    runs: list[str]  # the records to clean
    texts: list[str]  # the given texts
    patterns: bool
    renamed: dict[str, str]  # issue ids to rename: old -> new
    changed: list[str]  # runs whose record the redaction rewrites (their vectors are dropped)
    started_at: int
    done: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return dumps({
            "version": 1, "startedAt": self.started_at, "runs": self.runs,
            # base64: the journal is not itself a file that a search for the text finds
            "texts": [_b64(t) for t in self.texts],
            "patterns": self.patterns, "changed": self.changed, "done": self.done,
            "renamed": [[_b64(old), new] for old, new in self.renamed.items()],  # an old id spells a text
        }, JOURNAL, indent=True) + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes) -> "_Plan":
        d = _io.loads(raw)
        plan = cls([str(r) for r in d["runs"]], [_unb64(t) for t in d["texts"]], bool(d["patterns"]),
                   {_unb64(old): str(new) for old, new in d["renamed"]}, [str(r) for r in d["changed"]],
                   int(d["startedAt"]), [str(s) for s in d["done"]])
        for rid in plan.runs + plan.changed:
            validate_run_id(rid)
        return plan


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text, validate=True).decode("utf-8", "surrogatepass")


def _journal_path(store: MemoryStore) -> Path:
    return store.dir / JOURNAL


def _read_plan(store: MemoryStore) -> _Plan | None:
    path = _journal_path(store)
    try:
        raw = _io.read_file(path, limit=MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    try:
        return _Plan.from_bytes(raw)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, ValidationError):
        raise StoreError(f"{path}, the journal of an interrupted `cybmem redact`, is damaged; move it aside and run "
                         "that redaction again (with the same texts)") from None


def _save(store: MemoryStore, plan: _Plan) -> None:
    _io.atomic_write(_journal_path(store), plan.to_bytes())


def pending(store: MemoryStore) -> dict | None:
    """The unfinished redaction of a project (when, how many runs, the steps done, whether a
    process is at it now), or None.

    Raises:
        StoreError: the journal is damaged.
    """
    plan = _read_plan(store)
    if plan is None:
        return None
    return {"path": str(_journal_path(store)), "startedAt": plan.started_at, "runs": len(plan.runs),
            "done": list(plan.done), "running": _io.is_locked(store.dir / REDACT_LOCK)}


def complete_pending(store: MemoryStore) -> ScrubResult | None:
    """Finish the project's interrupted redaction, if there is one (what ``doctor --repair`` calls).

    Returns:
        What finishing it did, or None when no redaction was interrupted.
    """
    with _redaction(store):
        return _complete(store)


@contextlib.contextmanager
def _redaction(store: MemoryStore) -> Iterator[None]:
    """One redaction of a project at a time, from its plan to the removal of its journal; only where
    cybmem may write (MemoryStore.check_writable)."""
    store.check_writable()
    with _io.locked(store.dir / REDACT_LOCK):
        yield


def _complete(store: MemoryStore) -> ScrubResult | None:
    """Finish the journal's redaction, if any (:func:`_redaction` held)."""
    with store.lock():
        plan = _read_plan(store)
        if plan is None:
            return None
        result = ScrubResult(plan.runs[0] if len(plan.runs) == 1 else "", store.slug, renamed=dict(plan.renamed),
                             started_at=plan.started_at, targets=list(plan.runs))
        clean = _Cleaner(plan.texts, plan.patterns)
        _execute(store, plan, clean, result, _SOURCE_STEPS)
    _execute(store, plan, clean, result, _STEPS)
    return result


# --- the redaction -------------------------------------------------------------------------


def scrub_run(store: MemoryStore, run_id: str, *, secrets: list[str] = (), patterns: bool = True) -> ScrubResult:
    """Redact one run's record, its ledger lines and archive line, drop its vectors, rebuild the
    derived files, bring the known exports in line, and check that no file of the project still
    holds a given text. An interrupted redaction of the project is finished first.

    Args:
        store: the project.
        run_id: the run (an id or a unique prefix).
        secrets: texts to remove wherever they appear in those files (at least 4 characters).
        patterns: also apply the write path's secret patterns (cybmem.store.secrets).

    Raises:
        NotFoundError / AmbiguousError: no such run, or a prefix of several.
        ValidationError: a given text shorter than 4 characters.
    """
    return scrub_runs(store, [run_id], secrets=secrets, patterns=patterns)


def scrub_runs(store: MemoryStore, run_ids: list[str] | None, *, secrets: list[str] = (),
               patterns: bool = True, after_step: Callable[[str], None] | None = None) -> ScrubResult:
    """:func:`scrub_run` for several runs at once (ids or unique prefixes; one lock, one rebuild);
    ``run_ids=None``: every run whose record holds a given text (a leaked password quoted by many
    runs), and with no such record, every other file of the project and its exports that still
    holds one. ``after_step`` is called with the name of each part once it is done: ``journal``
    (the plan written), ``record`` (each record rewritten), each of the steps, ``end`` (the journal
    removed); where a test stops a redaction as a crash would (tests/operations/test_redaction.py)."""
    if run_ids is not None:
        run_ids = [store.resolve_run_id(r) for r in run_ids]
    given = _secrets(list(secrets))
    if run_ids is None and not given:
        raise ValidationError("to redact every run that holds a text, give the text (--secret or --secrets-from)")
    with _redaction(store):
        completed = _complete(store)
        with store.lock():
            held_elsewhere = True
            if run_ids is None:
                run_ids = _runs_holding(store, given)
                held_elsewhere = bool(run_ids) or bool(_still_holding(store.dir, given))
            clean = _Cleaner(given, patterns)
            plan = _plan(store, run_ids, given, patterns)
            result = ScrubResult(run_ids[0] if len(run_ids) == 1 else "", store.slug, renamed=dict(plan.renamed),
                                 started_at=plan.started_at, targets=list(run_ids))
            _save(store, plan)
            if after_step is not None:
                after_step("journal")
            _execute(store, plan, clean, result, _SOURCE_STEPS, after_step)
        _execute(store, plan, clean, result, _STEPS, after_step)
    result.completed = completed
    result.fields = (result.runs.get(result.run_id, []) if result.run_id
                     else sorted({f for fs in result.runs.values() for f in fs}))
    result.remaining = _still_holding(store.dir, given) + result.remaining
    if not (held_elsewhere or result.changed or result.exports or result.remaining or result.unreachable):
        raise ValidationError(f"no file of project {store.slug} (nor an export of it) holds a given text; "
                              "nothing to redact")
    return result


def _plan(store: MemoryStore, run_ids: list[str], given: list[str], patterns: bool) -> _Plan:
    """What the redaction will do, worked out before anything is rewritten (project lock held)."""
    renamed = _renamed_ids(store, given)
    dry = _Cleaner(given, patterns)
    changed = [rid for rid in run_ids if _cleaned_record(store, rid, dry, renamed)[1]]
    return _Plan(list(run_ids), list(given), patterns, renamed, changed, int(time.time() * 1000))


def _cleaned_record(store: MemoryStore, rid: str, clean: _Cleaner, renamed: dict[str, str]) -> tuple[bytes, list[str]]:
    """A record's bytes with every string cleaned and its issue list renamed, and the fields changed."""
    fields: list[str] = []
    path = store.record_path(rid)
    raw = _io.read_file(path, limit=MAX_RECORD_BYTES)
    parse_record(path.name, raw)  # a record that does not read is not rewritten blind
    data = _io.loads(raw)
    new = clean.value({k: v for k, v in data.items() if k != "outcome"}, "", fields, keep=("runId",))
    outcome = data.get("outcome")
    if isinstance(outcome, dict):
        ids = outcome.get("issues")
        new["outcome"] = {**clean.value({k: v for k, v in outcome.items() if k != "issues"}, "outcome", fields),
                          **({"issues": _relinked(ids, renamed, fields)} if "issues" in outcome else {})}
        new = {k: new[k] for k in data}  # the record's own key order
    if not fields:
        return raw, fields
    out = dumps(new, f"record {rid}", indent=True) + b"\n"
    parse_record(path.name, out)
    return out, fields


def _execute(store: MemoryStore, plan: _Plan, clean: _Cleaner, result: ScrubResult, steps: tuple[str, ...],
             after_step: Callable[[str], None] | None = None) -> None:
    """Do ``steps`` of ``plan`` not done yet, marking each in the journal; when the last one is
    done, remove the journal. The source steps want the project lock held. ``after_step``: see
    :func:`scrub_runs`."""
    given, renamed, wanted_runs = plan.texts, plan.renamed, set(plan.runs)
    done = after_step or (lambda step: None)
    for step in steps:
        if step in plan.done:
            continue
        if step == "records":
            # 1. the records (an issue list keeps its ids, renamed where they spell a given text)
            for rid in plan.runs:
                try:
                    out, fields = _cleaned_record(store, rid, clean, renamed)
                except FileNotFoundError:
                    continue  # removed since the plan was made: nothing of it is left to clean
                if fields:
                    _io.atomic_write(store.record_path(rid), out)
                    result.runs[rid] = fields
                    done("record")
        elif step == "ledger":
            # 2. the ledger: the runs' lines, any line holding a given text, the renamed issues' lines
            def change(d: dict) -> dict:
                d = clean.value(d, "", [], keep=_LEDGER_KEYS)
                return {**d, "issueId": renamed[d["issueId"]]} if d.get("issueId") in renamed else d

            result.ledger_lines = _rewrite_lines(store.issues_path, lambda d, line: isinstance(d, dict) and (
                d.get("byRunId") in wanted_runs or d.get("issueId") in renamed or any(s.encode() in line for s in given)),
                change)
        elif step == "relink" and renamed:
            # 2b. other runs' records that name a renamed issue: only that list changes; and the
            # shown / used logs, which hold issue ids (cybmem.store.feedback_log)
            result.records_relinked = _relink_records(store, wanted_runs, renamed)
            from ..store.feedback_log import rename_issues

            rename_issues(store.dir, renamed)
        elif step == "archive":
            # 3. archive-summary.md (compaction's one-liners; writers append there under the index lock)
            with store.index.index_lock():
                result.archive_lines = _rewrite_text_lines(store.archive_path, wanted_runs, given, clean)
        elif step == "vectors":
            # 4. the vectors of the runs whose record changed (made from the old text)
            result.embeddings_dropped = _drop_vectors(store.embeddings_path, set(plan.changed))
        elif step == "derived":
            # 5. the derived files, from the files: always, as a killed redaction (or a hand edit)
            # may have left them behind the records
            count = store.rebuild_index()
            result.rebuilt.append(f"{store.index_path} ({count} record{'s' if count != 1 else ''})")
            cache = _cache.cache_dir(store.dir)
            if cache.is_dir() and not store.symlinked_dirs():
                # Emptied, not rebuilt: the next reader rebuilds it from the redacted files.
                _cache.discard(cache, files=True)
                result.emptied.append(str(cache))
        elif step == "exports":
            # 6. the exports the project knows of
            _reach_exports(store, plan, result)
        plan.done.append(step)
        _save(store, plan)
        done(step)
    result.kinds = sorted(clean.kinds)
    result.replaced = clean.replaced
    if not set(_STEPS) <= set(plan.done):
        return
    try:
        os.unlink(_journal_path(store))
    except FileNotFoundError:
        pass
    _io.sync_path(store.dir)
    done("end")


def _reach_exports(store: MemoryStore, plan: _Plan, result: ScrubResult) -> None:
    """Bring the project's known exports in line with the redacted store (after its own files).

    A Parquet dataset: this machine's rows of the redacted runs (and of runs naming a renamed
    issue) and every ledger event that differs from the ledger now are rewritten in place (one
    atomic replace per file). A SQLite database: updated as a re-export does (an UPSERT; deleted
    content zeroed, the full-text index merged). A file export (NDJSON, CSV, PROV) cannot be
    edited: one that holds a given text, a redacted run's id or a renamed issue id is named,
    with the command that writes it again.
    """
    from ..exchange.export import known_exports, redo_command, refresh_dataset, refresh_sqlite

    exports = known_exports(store)
    if not exports:
        return
    needles = _needles(plan.texts)
    ids = [r.encode() for r in plan.changed] + [f'"{old}"'.encode() for old in plan.renamed]
    for entry in exports:
        fmt, out = entry["format"], Path(entry["out"])
        if fmt == "parquet":
            if not out.is_dir():
                continue  # gone (or moved: then it is out of reach, and nothing here can find it)
            files, holding = refresh_dataset(store, out, entry.get("machine") or "", run_ids=plan.runs,
                                             issue_ids=list(plan.renamed),
                                             holds=_holder(plan.texts) if plan.texts else None)
            if files:
                result.exports.append(f"rewrote {len(files)} file{'s' if len(files) != 1 else ''} of the Parquet "
                                      f"dataset {out} (machine {entry.get('machine')})")
            result.remaining += holding
            continue
        try:
            data = _io.read_file(out)
        except (FileNotFoundError, StoreError):
            continue  # gone, or no longer a regular file: nothing of ours to reach
        if fmt == "sqlite" and data.startswith(b"SQLite format 3\x00"):
            updated = refresh_sqlite(store, out, entry.get("tables") or ["records", "issues"])
            if updated:
                result.exports.append(f"updated {updated} row{'s' if updated != 1 else ''} of the SQLite database {out}")
            data = _io.read_file(out)
            if any(n in data for n in needles) and _holds(data, plan.texts):
                result.remaining.append(f"{out} (a row of another run: `cybmem redact --everywhere`)")
            continue
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(int(entry.get("at") or 0) / 1000))
        if any(n in data for n in needles) and _holds(data, plan.texts):
            why = "still holds a given text"
        elif any(i in data for i in ids):
            why = "was written before this redaction and holds what it changed: it may still hold the secret"
        else:
            continue
        result.unreachable.append(f"the {fmt} export {out} (written {when}) {why}; cybmem cannot edit it: "
                                  f"write it again with `{redo_command(store, entry)}` (or delete it)")


def _runs_holding(store: MemoryStore, given: list[str]) -> list[str]:
    """The run ids whose record file holds a given text (as UTF-8 or as JSON escapes it)."""
    needles = _needles(given)
    out = []
    for rid in store.run_ids():
        try:
            raw = _io.read_file(store.record_path(rid), limit=MAX_RECORD_BYTES)
        except OSError:
            continue
        if any(n in raw for n in needles) and _holds(raw, given):
            out.append(rid)
    return out


def _needles(given: list[str]) -> set[bytes]:
    return {s.encode() for s in given} | {dumps(s, "text")[1:-1] for s in given}


def _holder(given: list[str]):
    """A test of whether some bytes or text hold a given text (as written, or as JSON escapes it)
    outside a marker: a text such as ``manual`` is part of every ``[REDACTED:manual]``, and is not
    left over there."""
    forms = sorted({f for s in given for f in (s, dumps(s, "text")[1:-1].decode("utf-8", "surrogateescape"))})
    finder = _finder(forms) if forms else None

    def holds(data: bytes | str) -> bool:
        if finder is None:
            return False
        text = data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data
        return any(f in text for f in forms) and any(m.group(1) is not None for m in finder.finditer(text))

    return holds


def _holds(data: bytes | str, given: list[str]) -> bool:
    return _holder(given)(data)


def _renamed_ids(store: MemoryStore, given: list[str]) -> dict[str, str]:
    """Issue ids of the ledger that spell a given text (as issue_slug folds it), each with the id
    it becomes: the text's slug replaced by ``redacted`` (a number added if that id is taken)."""
    slugs = [issue_slug(s) for s in given]
    slugs = [s for s in slugs if len(s) >= 4 and not s.startswith("issue-")]
    if not slugs:
        return {}
    raw = store.ledger_bytes()
    ids: list[str] = []
    for line in _lines(raw):
        try:
            d = _io.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("issueId"), str) and d["issueId"] not in ids:
            ids.append(d["issueId"])
    taken = set(ids)
    out: dict[str, str] = {}
    for iid in ids:
        new = iid
        for slug in slugs:
            new = new.replace(slug, "redacted")
        if new != iid:
            base, n = new, 2
            while new in taken:
                new, n = f"{base}-{n}", n + 1
            taken.add(new)
            out[iid] = new
    return out


def _relinked(ids: Any, renamed: dict[str, str], changed: list[str]) -> Any:
    if not isinstance(ids, list) or not any(i in renamed for i in ids):
        return ids
    changed.append("outcome.issues")
    return [renamed.get(i, i) if isinstance(i, str) else i for i in ids]


def _relink_records(store: MemoryStore, skip: set[str], renamed: dict[str, str]) -> list[str]:
    """Rewrite the issue list of every other record that names a renamed issue (project lock held)."""
    needles = [f'"{old}"'.encode() for old in renamed]
    out = []
    for other in store.run_ids():
        if other in skip:
            continue
        path = store.record_path(other)
        try:
            raw = _io.read_file(path, limit=MAX_RECORD_BYTES)
        except OSError:
            continue
        if not any(n in raw for n in needles):
            continue
        try:
            parse_record(path.name, raw)
            data = _io.loads(raw)
        except (ValueError, ValidationError):
            continue  # unreadable: doctor reports it, and readers skip it
        outcome = data.get("outcome")
        if not isinstance(outcome, dict):
            continue
        fields: list[str] = []
        ids = _relinked(outcome.get("issues"), renamed, fields)
        if fields:
            out_bytes = dumps({**data, "outcome": {**outcome, "issues": ids}}, f"record {other}", indent=True) + b"\n"
            parse_record(path.name, out_bytes)
            _io.atomic_write(path, out_bytes)
            out.append(other)
    return out


def _lines(raw: bytes) -> list[bytes]:
    return raw.split(b"\n")


def _rewrite_lines(path: Path, wanted, change) -> int:
    """Rewrite the JSON lines of a JSONL file that ``wanted(decoded, raw line)`` picks, as
    ``change(decoded)`` makes them; atomically, only when one changed. Returns lines rewritten."""
    try:
        raw = _io.read_file(path, limit=MAX_LEDGER_BYTES)
    except FileNotFoundError:
        return 0
    lines = _lines(raw)
    n = 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = _io.loads(line)
        except ValueError:
            continue
        if not wanted(d, line):
            continue
        new = change(d)
        if new != d:
            lines[i] = dumps(new, f"{path.name} line {i + 1}")
            n += 1
    if n:
        _io.atomic_write(path, b"\n".join(lines))
    return n


def _rewrite_text_lines(path: Path, runs: set[str], given: list[str], clean: _Cleaner) -> int:
    try:
        raw = _io.read_file(path, limit=MAX_LEDGER_BYTES)
    except FileNotFoundError:
        return 0
    lines = raw.decode("utf-8", "surrogateescape").split("\n")
    n = 0
    for i, line in enumerate(lines):
        if any(r in line for r in runs) or any(s in line for s in given):
            new = clean.text(line)
            if new != line:
                lines[i], n = new, n + 1
    if n:
        _io.atomic_write(path, "\n".join(lines).encode("utf-8", "surrogateescape"))
    return n


def _drop_vectors(path: Path, runs: set[str]) -> int:
    try:
        raw = _io.read_file(path, limit=MAX_LEDGER_BYTES)
    except FileNotFoundError:
        return 0
    kept, dropped = [], 0
    for line in _lines(raw):
        try:
            d = _io.loads(line) if line.strip() else None
        except ValueError:
            d = None
        if isinstance(d, dict) and d.get("runId") in runs:
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        _io.atomic_write(path, b"\n".join(kept))
    return dropped


def _still_holding(directory: Path, given: list[str]) -> list[str]:
    """Every file under the project directory that still holds a given text (its bytes as
    UTF-8 and as JSON writes them), with a hint where the writer cannot remove it."""
    if not given:
        return []
    needles = _needles(given)
    out = []
    for f in sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()):
        if f.name == JOURNAL:
            continue  # the plan of a redaction under way (its texts base64-encoded)
        try:
            data = _io.read_file(f)
        except (OSError, StoreError):
            continue
        if any(n in data for n in needles) and _holds(data, given):
            if f.parent.name == "records" and f.suffix == ".json":
                why = f" (another run's record: `cybmem redact {f.stem}`, or --everywhere)"
            else:
                why = ""
            out.append(f"{f}{why}")
    return out
