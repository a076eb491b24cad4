"""Remove a secret from one run's memory, everywhere it was copied: ``cybmem redact RUN``.

The write path redacts the secret shapes it knows before anything is stored. A secret it does
not know (a passphrase, an internal hostname) is found later by a person; this is the procedure
for it, done safely in one step instead of by hand:

1. under the project lock, the run's record is rewritten with every string redacted by the
   write path's pass (cybmem.redact.redact_value) and each given text replaced by
   ``[REDACTED:manual]``, atomically (a reader sees the old file or the new one);
2. so are the ledger lines the run wrote (``byRunId``) and any ledger line holding a given
   text, and the run's lines of archive-summary.md;
3. the run's vectors are dropped from embeddings.jsonl (they were made from the old text;
   ``cybmem embed`` makes new ones);
4. the derived files (index.json, the Arrow cache) are rebuilt from the files;
5. an issue id spelled from a title that held a given text (``vault-phrase-purple-otter-42``)
   is renamed (the text becomes ``redacted``) in every ledger line and in every record that
   names it, so the link between them holds;
6. every file of the project is searched for each given text, and what still holds one is
   named.

This is the second of the two rewrites cybmem ever makes of a record or the ledger (the first
is ``supersededBy``); USAGE.md, "Guarantees", says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _io
from . import cache as _cache
from .errors import ValidationError
from .outcome import issue_slug
from .redact import redact_value
from .store import MAX_LEDGER_BYTES, MAX_RECORD_BYTES, MemoryStore, _dumps, parse_record

__all__ = ["MANUAL", "ScrubResult", "scrub_run", "scrub_runs"]

#: What a given text is replaced with.
MANUAL = "[REDACTED:manual]"
#: Ledger keys that are identities, never rewritten (a secret in them is reported instead).
_LEDGER_KEYS = ("issueId", "at", "event", "byRunId")


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
    remaining: list[str] = field(default_factory=list)  # files (and why) still holding a given text

    @property
    def changed(self) -> bool:
        return bool(self.runs or self.ledger_lines or self.archive_lines or self.embeddings_dropped
                     or self.records_relinked)

    def to_dict(self) -> dict:
        return {"runId": self.run_id or None, "runs": self.runs, "project": self.project, "kinds": self.kinds, "replaced": self.replaced,
                "fields": self.fields, "renamedIssues": self.renamed, "recordsRelinked": self.records_relinked,
                "ledgerLines": self.ledger_lines, "archiveLines": self.archive_lines,
                "embeddingsDropped": self.embeddings_dropped, "rebuilt": self.rebuilt, "remaining": self.remaining}


class _Cleaner:
    """Strings in, strings out: the pattern pass, then the given texts; counts what it did."""

    def __init__(self, secrets: list[str], patterns: bool):
        self.secrets = sorted(secrets, key=len, reverse=True)  # a longer text before a text inside it
        self.patterns = patterns
        self.kinds: set[str] = set()
        self.replaced = 0

    def text(self, value: str) -> str:
        if self.patterns:
            value, _ = redact_value(value, self.kinds)
        for secret in self.secrets:
            n = value.count(secret)
            if n:
                self.replaced += n
                value = value.replace(secret, MANUAL)
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


def _secrets(secrets: list[str]) -> list[str]:
    out = [s for s in (s.strip("\r\n") for s in secrets) if s]
    short = [s for s in out if len(s) < 4]
    if short:
        raise ValidationError(f"a text to remove must be at least 4 characters (got {len(short)} shorter); a "
                              "shorter one would match inside ordinary words")
    return out


def scrub_run(store: MemoryStore, run_id: str, *, secrets: list[str] = (), patterns: bool = True) -> ScrubResult:
    """Redact one run's record, its ledger lines and archive line, drop its vectors, rebuild the
    derived files, and check that no file of the project still holds a given text.

    Args:
        store: the project.
        run_id: the run (an id or a unique prefix).
        secrets: texts to remove wherever they appear in those files (at least 4 characters).
        patterns: also apply the write path's secret patterns (cybmem.redact).

    Raises:
        NotFoundError / AmbiguousError: no such run, or a prefix of several.
        ValidationError: a given text shorter than 4 characters.
    """
    return scrub_runs(store, [store.resolve_run_id(run_id)], secrets=secrets, patterns=patterns)


def scrub_runs(store: MemoryStore, run_ids: list[str] | None, *, secrets: list[str] = (),
               patterns: bool = True) -> ScrubResult:
    """:func:`scrub_run` for several runs at once (one lock, one rebuild); ``run_ids=None``: every
    run whose record holds a given text (a leaked password quoted by many runs)."""
    given = _secrets(list(secrets))
    if run_ids is None:
        if not given:
            raise ValidationError("to redact every run that holds a text, give the text (--secret or --secrets-from)")
        run_ids = _runs_holding(store, given)
    clean = _Cleaner(given, patterns)
    result = ScrubResult(run_ids[0] if len(run_ids) == 1 else "", store.slug)
    store._check_not_symlinked()
    wanted_runs = set(run_ids)
    with store.lock():
        renamed = result.renamed = _renamed_ids(store, given)
        # 1. the records (an issue list keeps its ids, renamed where they spell a given text)
        for rid in run_ids:
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
            if fields:
                out = _dumps(new, f"record {rid}", indent=True) + b"\n"
                parse_record(path.name, out)
                _io.atomic_write(path, out)
                result.runs[rid] = fields
        result.fields = result.runs.get(result.run_id, []) if result.run_id else sorted({f for fs in result.runs.values() for f in fs})

        # 2. the ledger: the runs' lines, any line holding a given text, the renamed issues' lines
        def change(d: dict) -> dict:
            d = clean.value(d, "", [], keep=_LEDGER_KEYS)
            return {**d, "issueId": renamed[d["issueId"]]} if d.get("issueId") in renamed else d

        result.ledger_lines = _rewrite_lines(store.issues_path, lambda d, line: isinstance(d, dict) and (
            d.get("byRunId") in wanted_runs or d.get("issueId") in renamed or any(s.encode() in line for s in given)),
            change)
        # 2b. other runs' records that name a renamed issue: only that list changes
        if renamed:
            result.records_relinked = _relink_records(store, wanted_runs, renamed)
        # 3. archive-summary.md (compaction's one-liners)
        result.archive_lines = _rewrite_text_lines(store.archive_path, wanted_runs, given, clean)
        # 4. the runs' vectors (made from the old text)
        result.embeddings_dropped = _drop_vectors(store.embeddings_path, set(result.runs))
    result.kinds = sorted(clean.kinds)
    result.replaced = clean.replaced
    # 5. the derived files, from the files
    if result.changed:
        count = store.rebuild_index()
        result.rebuilt.append(f"{store.index_path} ({count} record{'s' if count != 1 else ''})")
        if not _cache.disabled(store.root) and not store.symlinked_dirs():
            from .snapshot import load_snapshot

            _cache.discard(_cache.cache_dir(store.dir))
            load_snapshot(store)
            result.rebuilt.append(str(_cache.cache_dir(store.dir)))
    result.remaining = _still_holding(store.dir, given)
    return result


def _runs_holding(store: MemoryStore, given: list[str]) -> list[str]:
    """The run ids whose record file holds a given text (as UTF-8 or as JSON escapes it)."""
    needles = _needles(given)
    out = []
    for rid in store.run_ids():
        try:
            raw = _io.read_file(store.record_path(rid), limit=MAX_RECORD_BYTES)
        except OSError:
            continue
        if any(n in raw for n in needles):
            out.append(rid)
    if not out:
        raise ValidationError(f"no record of project {store.slug} holds a given text")
    return out


def _needles(given: list[str]) -> set[bytes]:
    return {s.encode() for s in given} | {_dumps(s, "text")[1:-1] for s in given}


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
            out_bytes = _dumps({**data, "outcome": {**outcome, "issues": ids}}, f"record {other}", indent=True) + b"\n"
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
            lines[i] = _dumps(new, f"{path.name} line {i + 1}")
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
        try:
            data = f.read_bytes()
        except OSError:
            continue
        if any(n in data for n in needles):
            if f.parent.name == "records" and f.suffix == ".json":
                why = f" (another run's record: `cybmem redact {f.stem}`, or --everywhere)"
            else:
                why = ""
            out.append(f"{f}{why}")
    return out
