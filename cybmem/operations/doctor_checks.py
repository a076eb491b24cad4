"""The checks of ``cybmem doctor``: one per kind of file, per project (records, the ledger,
embeddings.jsonl, index.json, the Arrow cache, the weight files, supersession links, cwd paths,
symbolic links, temp files, an unfinished ``cybmem redact``, and with ``--secrets`` the secret
shapes already on disk) and per memory root (projects.json and its slugs). Each returns
:class:`~cybmem.operations.doctor_report.Finding` s; none changes a file. What each check looks at:
USAGE.md, "Checking a store".
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from .. import _io
from .._io import TMP_PREFIX
from ..errors import NotFoundError, StoreError, ValidationError
from ..settings import Settings
from ..store import cache as _cache, supersession
from ..store.embeddings import newest_dims, read_rows, superseded
from ..store.ledger import OPEN, event_from_dict, repeats
from ..store.memory_store import MAX_LEDGER_BYTES, MemoryStore
from ..store.projects import (LOOK_ALIKE_RULE, MAX_PROJECTS_BYTES, PROJECTS_FILE, is_safe_slug, known_projects, owning_dir,
                              project_dirs, slug_key)
from ..store.records import check_not_future, ms_to_utc
from .doctor_report import Finding, ProjectStats

__all__ = ["check_memory_root", "check_project", "check_weights"]


def _is_temp(name: str) -> bool:
    # cybmem's own temp files (everything is written through cybmem._io), and the
    # ".<name>.<random>.tmp" ones earlier versions of save_weights left.
    return name.startswith(TMP_PREFIX) or (name.startswith(".") and name.endswith(".tmp"))


def _temp_files(dirs: Iterable[Path]) -> list[Path]:
    out = []
    for d in dirs:
        try:
            with os.scandir(d) as it:
                out += [Path(e.path) for e in it if _is_temp(e.name) and e.is_file(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
    return sorted(out)


def _check_temp(dirs: Iterable[Path], project: str | None, temp_age: float, now: float) -> list[Finding]:
    findings = []
    for path in _temp_files(dirs):
        try:
            age = now - path.lstat().st_mtime
        except FileNotFoundError:
            continue  # its writer just finished
        if _io.temp_owned(path):
            findings.append(Finding("temp", "warning", str(path),
                                    f"temp file of a writer at work ({age:.0f}s old; it may be waiting for a lock): "
                                    "left alone, whatever its age, until its writer lets go of it", project))
        elif age >= temp_age:
            findings.append(Finding("temp", "repairable", str(path),
                                    f"temp file left by an interrupted writer ({age:.0f}s old); readers ignore it",
                                    project))
        else:
            findings.append(Finding("temp", "warning", str(path),
                                    f"temp file {age:.0f}s old: a writer may be at work (removed once older than {temp_age:g}s)",
                                    project))
    return findings


def _jsonl_lines(raw: bytes) -> list[tuple[int, bytes, bool]]:
    """(line number, line, torn) for each non-blank line; torn = the last line, with no newline."""
    lines = raw.split(b"\n")
    out = []
    for i, line in enumerate(lines, 1):
        if line.strip():
            out.append((i, line, i == len(lines)))
    return out


def _check_ledger(store: MemoryStore, stats: ProjectStats) -> tuple[list[Finding], list[tuple[int, dict]]]:
    """Ledger lines: whole, valid, no event that repeats its issue's state (ledger.repeats), stamped in
    order. Returns findings and (line, event) pairs."""
    findings: list[Finding] = []
    events: list[tuple[int, dict]] = []
    try:
        raw = _io.read_file(store.issues_path, limit=MAX_LEDGER_BYTES)
    except FileNotFoundError:
        return findings, events
    except StoreError as exc:
        return [Finding("ledger", "error", str(store.issues_path), str(exc), store.slug)], events
    name = store.issues_path.name
    states: dict[str, str] = {}
    last: dict[str, tuple[int, int, str]] = {}  # issue -> (line, at, event) of its latest event in file order
    since: dict[str, int] = {}  # issue -> the line of the event that gave it its current state
    for lineno, line, torn in _jsonl_lines(raw):
        where = f"{store.issues_path}:{lineno}"
        try:
            d = _io.loads(line)
        except ValueError as exc:
            if torn:
                msg = "torn last line (no newline: a writer was interrupted); readers skip it, the next append starts a fresh line"
            else:
                msg = f"unreadable line, skipped by readers (a writer interrupted mid-line, or damage: {exc}); the ledger is never rewritten"
            findings.append(Finding("ledger", "warning", where, msg, store.slug))
            continue
        try:
            ev = event_from_dict(d)
        except ValidationError as exc:
            findings.append(Finding("ledger", "error", where,
                                    f"{name}:{lineno} is not a valid issue event ({exc}); readers skip it", store.slug))
            continue
        if torn:
            findings.append(Finding("ledger", "warning", where,
                                    "last line has no newline yet (a writer was interrupted after writing it); it is readable", store.slug))
        if repeats(states.get(ev.issueId), ev.event):
            state = states[ev.issueId]
            counted = "; reopenCount counts it once more" if ev.event == "reopened" else ""
            findings.append(Finding("ledger", "warning", where,
                                    f"issue {ev.issueId} {ev.event} again while {'open' if state in OPEN else state} "
                                    f"(so since line {since[ev.issueId]}): a repeated event, from writers at once before "
                                    f"cybmem checked the state under the lock, or one that ignored it; harmless, the "
                                    f"issue's state is unchanged{counted}", store.slug))
        else:
            since[ev.issueId] = lineno
        latest = last.get(ev.issueId)
        if latest is not None and ev.at < latest[1]:
            findings.append(Finding("ledger", "warning", where,
                                    f"issue {ev.issueId}: line {lineno} ({ev.event} at {ms_to_utc(ev.at)} UTC) is stamped "
                                    f"before line {latest[0]} ({latest[2]} at {ms_to_utc(latest[1])} UTC), which comes first "
                                    "(two writers' clocks apart?); the fold follows file order, and issue ages count the "
                                    "gap as no time", store.slug))
        else:
            last[ev.issueId] = (lineno, ev.at, ev.event)
        states[ev.issueId] = ev.event
        events.append((lineno, d))
    stats.events = len(events)
    return findings, events


def _check_embeddings(store: MemoryStore, stats: ProjectStats) -> list[Finding]:
    findings: list[Finding] = []
    try:
        rows, problems = read_rows(store.embeddings_path)
    except StoreError as exc:
        return [Finding("embeddings", "error", str(store.embeddings_path), str(exc), store.slug)]
    for lineno, reason, torn in problems:
        where = f"{store.embeddings_path}:{lineno}"
        if torn or reason.startswith("not valid JSON"):
            findings.append(Finding("embeddings", "warning", where, f"{reason}; readers skip it", store.slug))
        else:
            findings.append(Finding("embeddings", "error", where, f"{reason}; readers skip it", store.slug))
    stats.embeddings = len(rows)
    path = str(store.embeddings_path)
    extra = superseded(rows)
    gone = set(extra)
    if extra:
        runs = len({(row["runId"], row["model"]) for lineno, row in rows if lineno in gone})
        findings.append(Finding("embeddings", "repairable", path,
                                f"{runs} run(s) have more than one vector of a model ({len(extra)} line(s) replaced by a later one, "
                                f"first at line {extra[0]}); search uses the last; `cybmem doctor --repair` keeps only it",
                                store.slug))
    newest = newest_dims(rows)
    counts: dict[str, dict[int, int]] = {}
    for lineno, row in rows:
        if lineno not in gone:
            by_dims = counts.setdefault(row["model"], {})
            by_dims[len(row["vector"])] = by_dims.get(len(row["vector"]), 0) + 1
    for model, by_dims in sorted(counts.items()):
        if len(by_dims) > 1:
            now = newest[model]
            older = ", ".join(f"{d} ({c} run{'s' * (c != 1)})" for d, c in sorted(by_dims.items()) if d != now)
            findings.append(Finding("embeddings", "warning", path,
                                    f"model {model!r} has vectors of {now} dimensions ({by_dims[now]} runs, its newest) and of "
                                    f"{older}; search compares only the newest with a query: `cybmem embed` gives the other "
                                    "runs one", store.slug))
    return findings


def _check_records(store: MemoryStore, stats: ProjectStats, home: str | None = None, now: float | None = None
                   ) -> tuple[list[Finding], set[str]]:
    """Every record file parses, validates and is named after its runId, does not end in the future
    (:func:`check_not_future`, against ``now`` in seconds) and (when the project's directory ``home``
    is known) carries a cwd in that project. Returns findings and bad file names."""
    findings: list[Finding] = []
    bad: set[str] = set()
    foreign: dict[str, list[str]] = {}  # a cwd outside the project -> the runs that carry it
    now_ms = int((time.time() if now is None else now) * 1000)
    try:
        names = sorted(os.listdir(store.records_dir))
    except FileNotFoundError:
        return findings, bad
    except OSError as exc:
        return [Finding("records", "error", str(store.records_dir), f"cannot list: {exc}", store.slug)], bad
    for name in names:
        path = store.records_dir / name
        if name.startswith("."):
            continue  # temp files (checked separately), locks
        if not name.endswith(".json"):
            findings.append(Finding("records", "warning", str(path), "not a record file (no .json suffix); readers ignore it", store.slug))
            continue
        if path.is_symlink():
            bad.add(name)
            stats.unreadable += 1
            findings.append(Finding("records", "error", str(path),
                                    f"is a symbolic link (to {os.readlink(path)}); records must be real files inside the memory root",
                                    store.slug))
            continue
        try:
            rec = store.read_record(name[:-5])
            stats.records += 1
            if home is not None and owning_dir({store.slug: {"cwd": home}}, rec.cwd) is None:
                foreign.setdefault(rec.cwd, []).append(rec.runId)
            try:
                check_not_future(rec.endedAt, now_ms)
            except ValidationError as exc:
                when = str(exc).split("; ", 1)[0]
                findings.append(
                    Finding("records", "warning", str(path), f"{when}; superseded by {rec.supersededBy}, so it has left "
                            "search and the MEMORY block (`list` still shows it first, marked *)", store.slug)
                    if rec.supersededBy else
                    Finding("records", "error", str(path), f"{when}; it takes full recency and tops every MEMORY block "
                            f"and `list`: correct it with `cybmem supersede {rec.runId} FIXED.json` (its run.json with "
                            "the right endedAt)", store.slug))
            if rec.startedAt > rec.endedAt:  # `write` refuses it; another writer may not
                findings.append(Finding(
                    "records", "warning", str(path), f"startedAt {ms_to_utc(rec.startedAt)} UTC is after endedAt "
                    f"{ms_to_utc(rec.endedAt)} UTC (`cybmem write` refuses such a run): correct it with "
                    f"`cybmem supersede {rec.runId} FIXED.json`", store.slug))
        except NotFoundError:
            continue
        except (ValidationError, StoreError) as exc:
            bad.add(name)
            stats.unreadable += 1
            msg = str(exc)
            if name in msg:
                msg = msg.split(": ", 1)[-1] if msg.startswith(name) else msg
            findings.append(Finding("records", "error", str(path), f"{msg}; readers skip it", store.slug))
    for cwd, runs in sorted(foreign.items()):
        findings.append(Finding(
            "records", "warning", str(store.record_path(runs[0])),
            f"{_count(len(runs), 'record')} ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}) carry the cwd {cwd}, "
            f"outside the project's directory {home} (filed with --project from elsewhere by an older cybmem); readers "
            f"are unaffected, but should projects.json lose its entry the backfill could register {store.slug} there",
            store.slug))
    return findings, bad


def _count(n: int, what: str) -> str:
    return f"{n} {what if n == 1 else what + 's'}"


def _check_index(store: MemoryStore) -> list[Finding]:
    """index.json against a rebuild from records/; a compacted index (entries past the cap moved
    to its archived rows and archive-summary.md) is as good as a full one."""
    fresh, fresh_skipped = store.index.fresh_index()
    path = str(store.index_path)
    if not store.index_path.exists():
        if fresh or fresh_skipped:
            return [Finding("index", "repairable", path, "index.json is missing (readers rebuild it in memory each time)", store.slug)]
        return []
    probe = MemoryStore(store.root, store.slug)  # its own problem list
    doc = probe.index.read_index()
    if doc is None:
        return [Finding("index", "repairable", path, "index.json is unreadable or damaged", store.slug)]
    # The inode numbers are a cache key, not content: a copied store (cp -r, a restore, a git
    # checkout) has new ones, which the next read takes up on its own.
    entries = [{k: v for k, v in e.items() if k != "inode"} for e in doc[0]]
    fresh = [{k: v for k, v in e.items() if k != "inode"} for e in fresh]
    skipped, archived = doc[1], doc[2]
    fresh_by_id = {e["runId"]: e for e in fresh}
    archived_ok = all(rid in fresh_by_id and (row[0], row[2], row[3]) == (
        fresh_by_id[rid]["endedAt"], fresh_by_id[rid].get("supersedes"), fresh_by_id[rid].get("supersededBy"))
        for rid, row in archived.items())
    in_order = [e["runId"] for e in fresh if e["runId"] not in archived]
    if (entries == [fresh_by_id.get(e["runId"]) for e in entries] and [e["runId"] for e in entries] == in_order
            and archived_ok and set(skipped) == set(fresh_skipped)):
        return []
    have = {e["runId"] for e in entries} | set(archived)
    want = set(fresh_by_id)
    parts = []
    if want - have:
        parts.append(f"{len(want - have)} record(s) missing from it")
    if have - want:
        parts.append(f"{len(have - want)} entr(ies) without a readable record")
    differ = sum(1 for e in entries if e["runId"] in fresh_by_id and e != fresh_by_id[e["runId"]])
    differ += sum(1 for rid, row in archived.items() if rid in fresh_by_id and (row[0], row[2], row[3]) != (
        fresh_by_id[rid]["endedAt"], fresh_by_id[rid].get("supersedes"), fresh_by_id[rid].get("supersededBy")))
    if differ:
        parts.append(f"{differ} entr(ies) differ from their record")
    if [e["runId"] for e in entries] != in_order and not parts:
        parts.append("entries out of order")
    if set(skipped) != set(fresh_skipped):
        parts.append("its list of unreadable records is out of date")
    return [Finding("index", "repairable", path, "index.json is stale: " + ", ".join(parts), store.slug)]


def _check_cache(store: MemoryStore, bad: set[str], ledger_whole: int) -> list[Finding]:
    """The Arrow cache against records/ and the ledger (only when a cache exists), and its rows
    against files edited in place since (a hand edit keeps the inode: the cache would go on
    serving the old text, a removed secret included)."""
    cache = _cache.cache_dir(store.dir)
    if cache.is_symlink():
        return []  # _check_dirs names it; nothing is read through it
    verdict = _cache.check(store.records_dir, store.issues_path, cache, store.listing(), bad, ledger_whole)
    if verdict.state in ("ok", "behind"):
        from ..store.refresh import cache_problem

        problem = cache_problem(store)  # files that read but are not what the manifest lists
        if problem:
            verdict = _cache.CacheCheck("broken", [f"its files are not what its manifest lists ({problem})"])
    if verdict.state == "broken":
        return [Finding("cache", "repairable", str(cache), "cache disagrees with the store: " + ", ".join(verdict.reasons),
                        store.slug)]
    if verdict.state == "ok":
        from ..store.refresh import cached_snapshot

        snap = cached_snapshot(store)
        stale = snap.stale_rows(range(snap.n), settle=False) if snap is not None else []
        if stale:
            return [Finding("cache", "repairable", str(cache),
                            f"{len(stale)} cached record(s) edited in place since they were cached (the cache still "
                            "holds their old text)", store.slug)]
    if verdict.state == "behind":
        return [Finding("cache", "warning", str(cache),
                        f"cache is behind ({', '.join(verdict.reasons)}); the next read refreshes it", store.slug)]
    return []


def check_weights(settings: Settings, store: MemoryStore | None) -> list[Finding]:
    """The weight files production reads (and CYBERINE_MEMORY_W_* variables): each must load."""
    from ..retrieval.weights import load_weights, weight_files

    files = weight_files(settings, store)
    if store is not None:
        files = files[1:2]  # the project's own file; the root's and the environment's are checked once
    loaded = load_weights(files, settings.weights if store is None else None, lenient=True)
    where = str(files[0]) if files else "environment"
    return [Finding("weights", "error", where, f"{problem} (inject falls back past it with a warning; search and tune stop with this error)",
                    store.slug if store is not None else None) for problem in loaded.problems]


def _check_supersession(store: MemoryStore) -> list[Finding]:
    """Supersession links that name a run with no record (every reader ignores them)."""
    rows, ended = store.link_rows()  # archived records too
    links = [row for row in rows if row[2] or row[3]]
    return [Finding("supersession", "warning", str(store.record_path(rid)),
                    f"{field} names {target}, which has no record; readers ignore the link", store.slug, field=field)
            for rid, field, target in supersession.dangling(links, ended)]


def _check_dirs(store: MemoryStore) -> list[Finding]:
    return [Finding("paths", "error", str(d),
                    f"is a symbolic link (to {os.readlink(d)}); nothing is written through it, as it would land "
                    "outside the memory root" + ("; remove it (the cache is rebuilt)" if d.name == ".cache" else ""),
                    store.slug)
            for d in store.symlinked_dirs()]


def _secret_findings_in(value, field_path: str, path: str, project: str, out: list[Finding]) -> None:
    from ..store.secrets import scan

    stack = [(value, field_path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            for kind in sorted({f.kind for f in scan(v)}):
                out.append(Finding("secrets", "error", path, f"secret of kind {kind} stored here (value not shown)", project,
                                   field=where, kind=kind))
        elif isinstance(v, dict):
            stack.extend((item, f"{where}.{k}" if where else str(k)) for k, item in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((item, f"{where}[{i}]") for i, item in reversed(list(enumerate(v))))


def _check_derived_secrets(store: MemoryStore, out: list[Finding]) -> None:
    """Secret shapes in the files derived from records and the ledger: index.json,
    archive-summary.md and every text column of the Arrow cache (``--repair`` rebuilds them)."""
    try:
        doc = _io.loads(_io.read_file(store.index_path, limit=MAX_LEDGER_BYTES))
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict):
        for i, entry in enumerate(doc.get("entries") or []):
            if isinstance(entry, dict):
                _secret_findings_in({k: v for k, v in entry.items() if k != "runId"}, f"entries[{i}]",
                                    str(store.index_path), store.slug, out)
    summary = store.dir / "archive-summary.md"
    try:
        text = _io.read_file(summary, limit=MAX_LEDGER_BYTES).decode("utf-8", "replace")
    except OSError:
        text = ""
    for n, line in enumerate(text.splitlines(), 1):
        _secret_findings_in(line, f"line {n}", str(summary), store.slug, out)
    cache = _cache.cache_dir(store.dir)
    if cache.is_symlink() or not cache.is_dir():
        return
    import pyarrow as pa

    for path in sorted(cache.glob("*.arrow")):
        try:
            table = _cache.read_table(path)
        except (OSError, ValueError, pa.ArrowException):
            continue
        for name in table.column_names:
            col = table.column(name)
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                    or (pa.types.is_list(col.type) and pa.types.is_string(col.type.value_type))):
                continue
            kinds: set[str] = set()
            for value in col.to_pylist():
                for text in (value if isinstance(value, list) else [value]):
                    if text:
                        kinds |= {f.kind for f in _scan(text)}
            for kind in sorted(kinds):
                out.append(Finding("secrets", "repairable", str(path), f"secret of kind {kind} in the cached "
                                   f"column {name} (value not shown); `cybmem doctor --repair` rebuilds the cache",
                                   store.slug, field=name, kind=kind))


def _scan(text: str):
    from ..store.secrets import scan

    return scan(text)


def _check_secrets(store: MemoryStore, bad: set[str], events: list[tuple[int, dict]]) -> list[Finding]:
    """Secret shapes already on disk: in every field of every readable record, in the ledger and
    in the derived files (index.json, archive-summary.md, the cache)."""
    out: list[Finding] = []
    for run_id in store.run_ids():
        if f"{run_id}.json" in bad:
            continue
        try:
            rec = store.read_record(run_id)
        except (NotFoundError, ValidationError, StoreError):
            continue
        data = rec.to_dict()
        for key in ("runId",):
            data.pop(key, None)
        _secret_findings_in(data, "", str(store.record_path(run_id)), store.slug, out)
    for lineno, d in events:
        fields = {k: v for k, v in d.items() if k not in ("issueId", "at", "event", "byRunId")}
        _secret_findings_in(fields, "", f"{store.issues_path}:{lineno}", store.slug, out)
    _check_derived_secrets(store, out)
    return out


def _check_redaction(store: MemoryStore) -> list[Finding]:
    """A `cybmem redact` that was killed: its journal is still there (the repair finishes it)."""
    from .redaction import pending

    try:
        plan = pending(store)
    except StoreError as exc:
        return [Finding("redact", "error", str(store.dir / "redact-pending.json"), str(exc), store.slug)]
    if plan is None:
        return []
    if plan["running"]:
        return [Finding("redact", "warning", plan["path"], f"a redaction of {plan['runs']} run(s) is at work "
                        f"(begun {ms_to_utc(plan['startedAt'])})", store.slug)]
    return [Finding("redact", "repairable", plan["path"], f"a redaction of {plan['runs']} run(s) begun "
                    f"{ms_to_utc(plan['startedAt'])} was interrupted (done: {', '.join(plan['done']) or 'nothing'}); "
                    "`cybmem doctor --repair` or the next `cybmem redact` finishes it", store.slug)]


def check_project(store: MemoryStore, settings: Settings, *, secrets: bool, temp_age: float, now: float,
                   home: str | None = None) -> tuple[ProjectStats, list[Finding]]:
    stats = ProjectStats(store.slug)
    findings = _check_dirs(store)
    rec_findings, bad = _check_records(store, stats, home, now)
    led_findings, events = _check_ledger(store, stats)
    findings += rec_findings + led_findings
    findings += _check_embeddings(store, stats)
    findings += _check_index(store)
    try:
        raw = _io.read_file(store.issues_path, limit=MAX_LEDGER_BYTES)
        ledger_whole = raw.rfind(b"\n") + 1
    except OSError:
        ledger_whole = 0
    findings += _check_cache(store, bad, ledger_whole)
    findings += _check_supersession(store)
    findings += check_weights(settings, store)
    findings += _check_temp([store.dir, store.records_dir, store.dir / ".cache"], store.slug, temp_age, now)
    findings += _check_redaction(store)
    if secrets:
        findings += _check_secrets(store, bad, events)
    return stats, findings


def check_memory_root(root: Path, temp_age: float, now: float) -> tuple[list[Finding], dict[str, dict]]:
    """projects.json and the slug dirs of the root."""
    findings: list[Finding] = []
    path = root / PROJECTS_FILE
    projects: dict[str, dict] = {}
    raw_keys: list[str] = []
    try:
        raw = _io.read_file(path, limit=MAX_PROJECTS_BYTES)
    except FileNotFoundError:
        raw = None
    except StoreError as exc:
        findings.append(Finding("projects", "error", str(path), str(exc)))
        raw = None
    if raw is not None:
        try:
            data = _io.loads(raw)
        except ValueError as exc:
            findings.append(Finding("projects", "error", str(path),
                                    f"not valid JSON ({exc}); fix it or move it aside (it is rebuilt from the records' cwd, "
                                    "but same-basename projects may then swap slugs)"))
            data = {}
        if not isinstance(data, dict):
            findings.append(Finding("projects", "error", str(path), "must be a JSON object mapping slug to {\"cwd\": ...}"))
            data = {}
        for slug, value in data.items():
            raw_keys.append(slug)
            if not is_safe_slug(slug):
                findings.append(Finding("projects", "error", str(path),
                                        f"slug {slug!r} is not a safe directory name; cybmem ignores this entry"))
            elif not isinstance(value, dict) or not isinstance(value.get("cwd"), str) or not value["cwd"]:
                findings.append(Finding("projects", "error", str(path), f"slug {slug!r} has no \"cwd\" string; cybmem ignores it"))
            else:
                projects[slug] = value
    owners: dict[str, list[str]] = {}
    for slug, value in projects.items():
        owners.setdefault(value["cwd"], []).append(slug)
    for cwd, slugs in sorted(owners.items()):
        if len(slugs) > 1:
            findings.append(Finding("projects", "error", str(path),
                                    f"cwd {cwd} has {len(slugs)} slugs ({', '.join(sorted(slugs))}); keep one, "
                                    "move the other's records into it"))
    registered = dict(projects)
    backfilled = known_projects(root, projects)
    names = set(raw_keys) | set(project_dirs(root))
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(slug_key(name), []).append(name)
    for group in sorted(sorted(g) for g in groups.values() if len(g) > 1):
        shown = ", ".join(repr(n) + ("" if n.isascii() else f" ({ascii(n)[1:-1]})") for n in group)
        if len({slug_key(n, separators=False) for n in group}) == len(group):
            # Only their separators differ: directories named so get these slugs by the contract's rule.
            findings.append(Finding("projects", "warning", str(path),
                                    f"projects {shown} differ only in '-', '_' and '.'; a --project name is held to them "
                                    "(refused as a look-alike), so each is reached by its exact name or its cwd; if one "
                                    "was made by a mistyped --project, move its records into the other"))
            continue
        findings.append(Finding("projects", "error", str(path),
                                f"projects {shown} look alike ({LOOK_ALIKE_RULE}) and `cybmem projects` shows them "
                                "the same; keep one: move the others' records into it and remove their entries and directories"))
    for slug in project_dirs(root):
        if slug in registered:
            continue
        if slug in backfilled:
            findings.append(Finding("projects", "warning", str(root / slug),
                                    f"not in projects.json yet; registered on next use as the project of {backfilled[slug]['cwd']}"))
        else:
            findings.append(Finding("projects", "warning", str(root / slug),
                                    "not in projects.json and no readable record names its cwd; use it with --project"))
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        entries = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            findings.append(Finding("paths", "error", entry.path,
                                    f"is a symbolic link (to {os.readlink(entry.path)}); cybmem ignores it and never writes through it"))
        elif entry.is_dir() and not is_safe_slug(entry.name):
            findings.append(Finding("paths", "warning", entry.path, "directory name is not a safe slug; cybmem ignores it"))
        elif not entry.is_dir() and entry.name in registered:  # the project's place holds a FIFO or a file
            findings.append(Finding("paths", "error", entry.path,
                                    f"is not a directory (a FIFO, socket, device or file), though {PROJECTS_FILE} names it "
                                    f"as project {entry.name}: its runs cannot be read or written; move it aside"))
    findings += _check_temp([root], None, temp_age, now)
    return findings, backfilled
