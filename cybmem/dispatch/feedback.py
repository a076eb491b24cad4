"""What memory showed a run, and what the run then used: two append-only logs per project.

``<project>/shown.jsonl``: one line per answer memory gave (the block ``cybmem inject`` built,
through :func:`cybmem.dispatch.inject.inject_task`; each MCP tool's answer, through
:attr:`cybmem.mcp.tools.Memory.observers`), naming the run it was for (``CYBERINE_RUN_ID``, else
a hash of the task) and holding only ids and numbers, so nothing needs redacting.
``<project>/used.jsonl``: one line per written run (:func:`cybmem.operations.write.write_run`) that was shown
something, saying which shown runs and issues it used; :func:`used_judgments` turns these into the
"used" judgments ``cybmem tune`` takes. The shown log is capped (``CYBERINE_MEMORY_SHOWN_CAP``);
``CYBERINE_MEMORY_FEEDBACK=0`` turns both off. Neither log is on the failure path: keeping a line
never changes what inject prints, a tool's answer or a write's outcome (a failure is one warning),
and costs one locked append (benchmarks/bench_store.py). The rules in full: USAGE.md, "What memory
showed, and what the runs used".
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .. import _io
from ..errors import StoreError
from ..settings import DEFAULT_SHOWN_CAP
from .preamble import strip

if TYPE_CHECKING:  # pragma: no cover
    from .inject import Injection
    from ..retrieval.judgments import Judgment
    from ..settings import Settings
    from ..store.snapshot import Snapshot
    from ..store.memory_store import MemoryStore

__all__ = ["SHOWN_FILE", "USED_FILE", "DEFAULT_SHOWN_CAP", "enabled", "shown_cap", "task_hash", "block_entry",
           "mcp_entry", "keep_shown", "keep_block", "keep_used", "mcp_observer", "read_lines", "parse_lines",
           "shown_for", "match_used", "note_used", "read_used", "used_judgments", "names_run", "rename_issues",
           "shown_line_ok", "used_line_ok", "skipped_warning", "clock_problem", "CLOCK_SLACK_MS", "MAX_RUN_MS",
           "WRITE_LAG_MS", "MAX_USED_PER_RUN"]

SHOWN_FILE = "shown.jsonl"
USED_FILE = "used.jsonl"
_LOCK = ".feedback.lock"
#: ``cybmem write`` cuts the shown log back to the cap once it holds this share more.
_SLACK = 1.25
#: An appender cuts the log back once it holds this many bytes a line of the cap (a log no write trims).
_VALVE_BYTES = 4096
#: The MCP answers worth keeping: the tools and resources that return runs or issues (writes are not fetches).
_MCP_READS = ("search", "show", "chain", "issues", "memory_block", "open-issues", "run-record")


def enabled(settings: "Settings") -> bool:
    """Whether the logs are kept (``CYBERINE_MEMORY_FEEDBACK``, default on)."""
    return settings.feedback.enabled


def shown_cap(settings: "Settings") -> tuple[int, str | None]:
    """The cap of shown.jsonl in lines, and what is wrong with ``CYBERINE_MEMORY_SHOWN_CAP`` (None: nothing)."""
    return settings.feedback.shown_cap, settings.feedback.problem


def task_hash(task: str | None) -> str | None:
    """What names a run by its task when no run id does: ``sha256:`` and 16 hex digits of the task
    as the record will hold it (MEMORY block and TASK: wrapper removed, whitespace collapsed);
    None for an empty task. The same on both sides: inject hashes the task it is given, the write
    path the run's task before anything is redacted."""
    text = " ".join(strip(task or "").split())
    if not text:
        return None
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _who(settings: "Settings", task: str | None) -> dict[str, str | None]:
    """The run a line is for: its id when named, else the task's hash (never both, never the task)."""
    if settings.run_id:
        return {"runId": settings.run_id, "taskHash": None}
    return {"runId": None, "taskHash": task_hash(task)}


def _weights_source(sources: Mapping[str, str], tuned: Mapping[str, Any] | None) -> str:
    """Where the weights came from, as one word: env, argument, tuned, file or default (the most
    specific source of any weight)."""
    values = set(sources.values())
    if any(v.startswith("CYBERINE_") for v in values):
        return "env"
    if "argument" in values:
        return "argument"
    if any(not v.startswith("default") for v in values):
        return "tuned" if tuned else "file"
    return "default"


def _weights(weights: Mapping[str, float], sources: Mapping[str, str], tuned: Mapping[str, Any] | None) -> dict:
    out: dict[str, Any] = {"source": _weights_source(sources, tuned)}
    if tuned and isinstance(tuned.get("at"), int):
        out["tunedAt"] = tuned["at"]
    out.update({k: float(v) for k, v in weights.items()})
    return out


def _runs(hits: Iterable[Mapping[str, Any]]) -> list[dict]:
    out = []
    for i, h in enumerate(hits, 1):
        row: dict[str, Any] = {"runId": h["runId"], "rank": h.get("rank", i)}
        if h.get("score") is not None:
            row["score"] = round(float(h["score"]), 6)
        if h.get("pinned"):
            row["pinned"] = True
        out.append(row)
    return out


def _line(source: str, at: int, who: Mapping[str, str | None], runs: list[dict], issues: Iterable[str],
          **extra: Any) -> dict:
    out: dict[str, Any] = {"at": at, "source": source, "runId": who["runId"], "taskHash": who["taskHash"],
                           "runs": runs, "issues": list(dict.fromkeys(issues))}
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def block_entry(inj: "Injection", settings: "Settings", *, at: int | None = None, source: str = "inject") -> dict:
    """The shown.jsonl line of a MEMORY block: the runs it shows (rank, score), the issue ids it
    lists (its issues section, then the open issues on the shown runs' ``raised:`` lines), the
    weights and their source, the moment."""
    runs = _runs(h.to_dict() for h in inj.runs)
    listed = [i for c in inj.issues if c.listed == "issues" for i in c.ids]
    weights = None
    if inj.weights is not None:
        weights = _weights(inj.weights.weights.to_dict(), inj.weights.sources, inj.weights.tuned)
    return _line(source, at if at is not None else _now_ms(), _who(settings, inj.task), runs, listed + inj.raised,
                 weights=weights)


def mcp_entry(name: str, arguments: Mapping[str, Any], answer: Any, settings: "Settings", *,
              at: int | None = None) -> dict | None:
    """The shown.jsonl line of an MCP answer (source ``mcp:<tool>``), or None for a tool that
    fetches no run or issue. ``fetched`` names the runs asked for one by one (show, the record
    resource, chain's own run): a run an agent fetched counts as used."""
    if name not in _MCP_READS:
        return None
    when = at if at is not None else _now_ms()
    task = arguments.get("task") if name == "memory_block" else None
    who = _who(settings, task if isinstance(task, str) else None)
    source = f"mcp:{name}"
    if name == "search":
        return _line(source, when, who, _runs(answer.get("hits", [])), [])
    if name == "memory_block":
        listed = [i for issue in answer.get("issues", []) if issue.get("listed") != "no" for i in issue.get("ids", [])]
        weights = (_weights(answer["weights"], answer.get("weightSources", {}), None) if "weights" in answer else None)
        if weights is not None and answer.get("tuned"):
            weights["source"] = "tuned"
        return _line(source, when, who, _runs(answer.get("runs", [])), listed, weights=weights)
    if name in ("show", "run-record"):
        record = answer.get("record", answer)
        chain = answer.get("supersededChain", answer.get("_supersededChain", []))
        ids = [record.get("runId")] + list(chain)
        return _line(source, when, who, _runs({"runId": r} for r in ids if r), [], fetched=[r for r in ids if r])
    if name == "chain":
        return _line(source, when, who, _runs({"runId": r.get("runId")} for r in answer.get("runs", []) if r.get("runId")),
                     answer.get("openIssues", []), fetched=[answer["runId"]] if answer.get("runId") else None)
    issues = answer if isinstance(answer, list) else answer.get("issues", [])  # issues, open-issues
    return _line(source, when, who, [], [i.get("issueId") for i in issues if isinstance(i, Mapping) and i.get("issueId")])


def _dump(entry: Mapping[str, Any]) -> bytes:
    return orjson.dumps(entry)


def keep_shown(directory: Path, entries: Iterable[Mapping[str, Any]], cap: int = DEFAULT_SHOWN_CAP) -> None:
    """Append lines to ``directory``/shown.jsonl (one O_APPEND write, under the logs' lock, no
    fsync: a line lost to a power cut costs one run's feedback). Raises OSError / StoreError."""
    lines = [_dump(e) for e in entries]
    if not lines:
        return
    path = directory / SHOWN_FILE
    with _io.locked(directory / _LOCK):
        _io.append_lines(path, lines, sync=False)
        if os.stat(path).st_size > cap * _VALVE_BYTES:
            _trim(path, cap)


def _trim(path: Path, cap: int) -> int:
    """Keep the newest ``cap`` lines of ``path`` (the logs' lock held); returns the lines dropped."""
    raw = _io.read_file(path)
    lines = raw.splitlines(keepends=True)
    if len(lines) <= cap:
        return 0
    _io.atomic_write(path, b"".join(lines[-cap:]), durable=False)
    return len(lines) - cap


def keep_block(store: "MemoryStore", inj: "Injection", settings: "Settings", *, now_ms: int | None = None) -> str | None:
    """Keep what an inject showed (:func:`block_entry`); returns a warning line, or None. Never raises."""
    try:
        if not enabled(settings):
            return None
        cap, problem = shown_cap(settings)
        keep_shown(store.dir, [block_entry(inj, settings, at=now_ms)], cap)
        return problem
    except Exception as exc:  # noqa: BLE001 - keeping the log never fails the dispatcher
        return f"what was shown was not kept in {store.dir / SHOWN_FILE}: {_why(exc, store.dir / SHOWN_FILE)}"


def _why(exc: BaseException, path: Path) -> str:
    """One line: what went wrong, naming the file when it is not ``path`` (e.g. the lock)."""
    if isinstance(exc, OSError):
        other = exc.filename and str(exc.filename) != str(path)
        return f"{exc.strerror or exc}" + (f" ({exc.filename})" if other else "")
    return str(exc) if isinstance(exc, StoreError) else " ".join(f"{type(exc).__name__}: {exc}".split())


def mcp_observer(settings: "Settings", store_of: Callable[[str | None], "MemoryStore"]) -> Callable[[str, dict, Any], None]:
    """An observer for :attr:`cybmem.mcp.tools.Memory.observers` that keeps each answer's
    :func:`mcp_entry` in its project's shown.jsonl (``store_of(project)`` finds the project). A
    failure to keep one is one line on stderr, once per file; the answer goes out regardless."""
    warned: set[str] = set()
    cap, problem = shown_cap(settings)
    if problem:
        print(f"cybmem mcp: warning: {problem}", file=sys.stderr)

    def observe(name: str, arguments: dict, answer: Any) -> None:
        if not enabled(settings):
            return
        where = Path(".")
        try:
            entry = mcp_entry(name, arguments, answer, settings)
            if entry is None:
                return
            project = answer.get("project") if isinstance(answer, Mapping) else None
            where = store_of(project or arguments.get("project")).dir
            keep_shown(where, [entry], cap)
        except Exception as exc:  # noqa: BLE001 - keeping the log never fails the answer
            if str(where) not in warned:
                warned.add(str(where))
                path = where / SHOWN_FILE
                print(f"cybmem mcp: warning: what agents fetch is not kept in {path}: {_why(exc, path)}", file=sys.stderr)

    return observe


# --- reading -----------------------------------------------------------------------------


def read_lines(path: Path, *, valid: Callable[[dict], bool] | None = None, bad: list[bytes] | None = None) -> list[dict]:
    """The JSON objects of a log file, in file order (a line that is not one is skipped; no file: []).
    ``valid`` and ``bad``: as :func:`parse_lines`."""
    try:
        return parse_lines(_io.read_file(path), valid=valid, bad=bad)
    except FileNotFoundError:
        return []


def parse_lines(raw: bytes, *, needle: bytes | None = None, valid: Callable[[dict], bool] | None = None,
                bad: list[bytes] | None = None) -> list[dict]:
    """The JSON objects (with an integer ``at``) of a log's bytes, in order; a line that is not
    one, or that ``valid`` rejects (:func:`shown_line_ok`, :func:`used_line_ok`), is skipped and,
    when ``bad`` is given, appended to it (:func:`skipped_warning` says so in one line). With
    ``needle``, only the lines that hold it (found before anything is parsed)."""
    out = []
    if needle is None:
        chunks: Iterable[bytes] = raw.split(b"\n")
    else:
        chunks, at = [], 0
        while (at := raw.find(needle, at)) >= 0:
            start = raw.rfind(b"\n", 0, at) + 1
            end = raw.find(b"\n", at)
            end = len(raw) if end < 0 else end
            chunks.append(raw[start:end])
            at = end
    for chunk in chunks:
        if not chunk.strip():
            continue
        try:
            d = _io.loads(chunk)
        except ValueError:
            d = None
        if isinstance(d, dict) and _is_int(d.get("at")) and (valid is None or valid(d)):
            out.append(d)
        elif bad is not None:
            bad.append(chunk)
    return out


def skipped_warning(path: Path, bad: list[bytes]) -> str | None:
    """One line saying that ``bad`` lines of ``path`` were skipped (None: none were)."""
    if not bad:
        return None
    return (f"skipped {len(bad)} malformed line(s) of {path} (not the JSON object the log holds); the rest was read. "
            "A torn or hand-edited line can be deleted")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str_or_none(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _list_of(v: Any, ok: Callable[[Any], bool], *, optional: bool = True) -> bool:
    return (optional and v is None) or (isinstance(v, list) and all(ok(x) for x in v))


def _run_entry_ok(r: Any) -> bool:
    return isinstance(r, Mapping) and isinstance(r.get("runId"), str) and (r.get("rank") is None or _is_int(r.get("rank")))


def shown_line_ok(d: Mapping[str, Any]) -> bool:
    """Whether a shown.jsonl object has the shape its writers give it (:func:`block_entry`,
    :func:`mcp_entry`): the fields :func:`match_used` reads, each of its type."""
    return (isinstance(d.get("source"), str) and _str_or_none(d.get("runId")) and _str_or_none(d.get("taskHash"))
            and _list_of(d.get("runs"), _run_entry_ok) and _list_of(d.get("issues"), lambda x: isinstance(x, str))
            and _list_of(d.get("fetched"), lambda x: isinstance(x, str))
            and (d.get("weights") is None or isinstance(d.get("weights"), Mapping)))


def used_line_ok(d: Mapping[str, Any]) -> bool:
    """Whether a used.jsonl object has the shape :func:`note_used` gives it (the fields
    :func:`used_judgments` and the feedback page read, each of its type)."""
    span = d.get("shownAt")
    return (isinstance(d.get("runId"), str) and (d.get("startedAt") is None or _is_int(d.get("startedAt")))
            and _list_of(d.get("used"), _run_entry_ok) and _list_of(d.get("block"), _run_entry_ok)
            and _list_of(d.get("usedIssues"), lambda x: isinstance(x, Mapping) and isinstance(x.get("issueId"), str))
            and (span is None or (isinstance(span, list) and len(span) == 2 and all(_is_int(x) for x in span))))


def shown_for(raw: bytes, run_id: str, hashed: str | None, *, started_at: int, ended_at: int,
              bad: list[bytes] | None = None) -> tuple[list[dict], str | None]:
    """The shown.jsonl lines (``raw``) that were for this run, and how they were matched.

    By run id: every line that names it. Else by the task's hash, among the lines that name no
    run: the newest inject line with that hash up to the run's end, and the MCP lines with it from
    then (or from the run's start, when no inject line has it) to the run's end. A malformed line
    among them is skipped (and added to ``bad``); the others still count.
    """
    mine = [d for d in parse_lines(raw, needle=f'"{run_id}"'.encode(), valid=shown_line_ok, bad=bad)
            if d.get("runId") == run_id]
    if mine:
        return mine, "runId"
    if not hashed:
        return [], None
    same = [d for d in parse_lines(raw, needle=hashed.encode(), valid=shown_line_ok, bad=bad)
            if d.get("runId") is None and d.get("taskHash") == hashed and d["at"] <= ended_at]
    injects = [d for d in same if d.get("source") == "inject"]
    since = injects[-1]["at"] if injects else started_at
    out = ([injects[-1]] if injects else []) + [d for d in same if d.get("source") != "inject" and d["at"] >= since]
    return (out, "taskHash") if out else ([], None)


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def names_run(text: str, run_id: str) -> bool:
    """Whether ``text`` names the run: its id, or a prefix of it of at least 8 characters (the
    block prints 8), standing alone (``run 9b6b1e00``, ``9b6b1e00-90b4``; not ``9b6b1e00ab``
    nor ``9b6b1e00-fix``, another run's id)."""
    head = run_id[:8]
    at = 0
    while (at := text.find(head, at)) >= 0:
        i, j = at + len(head), len(head)
        ok = at == 0 or not _word(text[at - 1])
        at += 1
        if not ok:
            continue
        while i < len(text) and j < len(run_id) and text[i] == run_id[j]:
            i, j = i + 1, j + 1
        if i == len(text) or not (_word(text[i]) or (text[i] == "-" and i + 1 < len(text) and _word(text[i + 1]))):
            return True
    return False


def _names_issue(text: str, issue_id: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(issue_id) + r"(?![\w-])", text) is not None


def match_used(lines: list[dict], *, run_id: str, text: str, issue_events: Iterable[tuple[str, str]] = ()) -> dict:
    """What a run used of what it was shown (``lines``, from :func:`shown_for`).

    Args:
        lines: the shown.jsonl lines that were for the run.
        run_id: the run (never counted as using itself).
        text: what the run's output says (the worker's final answer less any MEMORY block, the
            verdict, the outcome's lists; not the task nor the summary made from it), searched for
            the shown runs' ids and prefixes (:func:`names_run`) and issue ids.
        issue_events: (issue id, event) the run wrote: resolved, wontfix or reopened count.

    Returns:
        ``block`` (the runs the last inject line showed, with rank and score; None when no inject
        line was for it), ``blockIssues``, ``weights``, ``used`` (each used run: ``how`` it was used,
        named and/or fetched; its ``rank`` in the block or None; ``shownBy``, the sources that
        showed it) and ``usedIssues`` (``how``: resolved, reopened, named).
    """
    injects = [d for d in lines if d.get("source") == "inject"]
    block = injects[-1] if injects else None
    rank = {r.get("runId"): r.get("rank") for r in (block.get("runs") or [] if block else []) if isinstance(r, Mapping)}
    shown_by: dict[str, list[str]] = {}
    fetched: set[str] = set()
    issues_by: dict[str, list[str]] = {}
    for d in lines:
        src = str(d.get("source"))
        for r in d.get("runs") or []:
            if isinstance(r, Mapping) and isinstance(r.get("runId"), str) and src not in shown_by.setdefault(r["runId"], []):
                shown_by[r["runId"]].append(src)
        for r in d.get("fetched") or []:
            if isinstance(r, str):
                fetched.add(r)
                if src not in shown_by.setdefault(r, []):
                    shown_by[r].append(src)
        for i in d.get("issues") or []:
            if isinstance(i, str) and src not in issues_by.setdefault(i, []):
                issues_by[i].append(src)
    used = []
    for rid, by in shown_by.items():
        if rid == run_id:
            continue
        how = (["named"] if names_run(text, rid) else []) + (["fetched"] if rid in fetched else [])
        if how:
            used.append({"runId": rid, "how": how, "rank": rank.get(rid), "shownBy": by})
    used.sort(key=lambda u: (u["rank"] is None, u["rank"] or 0))
    did: dict[str, list[str]] = {}
    for iid, event in issue_events:
        kind = {"resolved": "resolved", "wontfix": "resolved", "reopened": "reopened"}.get(event)
        if kind and iid in issues_by and kind not in did.setdefault(iid, []):
            did[iid].append(kind)
    for iid in issues_by:
        if _names_issue(text, iid):
            did.setdefault(iid, []).append("named")
    used_issues = [{"issueId": i, "how": how, "shownBy": issues_by[i]} for i, how in did.items() if how]
    return {"block": block.get("runs") if block else None, "blockIssues": block.get("issues") if block else None,
            "weights": block.get("weights") if block else None, "used": used, "usedIssues": used_issues}


def note_used(store: "MemoryStore", settings: "Settings", *, run_id: str, task_hashed: str | None,
              started_at: int, ended_at: int, text: str, issue_events: Iterable[tuple[str, str]] = (),
              now_ms: int | None = None, warnings: list[str] | None = None) -> dict | None:
    """Match a run just written to what it was shown (:func:`shown_for`, :func:`match_used`) and
    append the result to used.jsonl; returns the line, or None when nothing was shown to it (no
    line is written then). Also cuts shown.jsonl back to its cap once it holds a quarter more.
    The line keeps the run's clock (``startedAt``, ``endedAt``) and when the lines it matched were
    shown (``shownAt``: first, last), which :func:`used_judgments` checks against each other.
    A malformed shown.jsonl line is skipped, with one line in ``warnings``.

    Raises:
        OSError / StoreError: a log could not be read or written (the caller reports it).
    """
    shown = store.dir / SHOWN_FILE
    try:
        raw = _io.read_file(shown)
    except FileNotFoundError:
        return None
    cap, _ = shown_cap(settings)
    if raw.count(b"\n") > cap * _SLACK:
        with _io.locked(store.dir / _LOCK):
            _trim(shown, cap)
    bad: list[bytes] = []
    lines, how = shown_for(raw, run_id, task_hashed, started_at=started_at, ended_at=ended_at, bad=bad)
    if warnings is not None and (problem := skipped_warning(shown, bad)):
        warnings.append(problem)
    if not lines:
        return None
    # The ledger lines this run wrote before its record (an MCP mark_issue during the run).
    events = list(issue_events)
    try:
        ledger = store.ledger_bytes()
    except StoreError:
        ledger = b""
    for d in parse_lines(ledger, needle=f'"{run_id}"'.encode()) if ledger else []:
        if d.get("byRunId") == run_id and isinstance(d.get("issueId"), str):
            events.append((d["issueId"], str(d.get("event"))))
    found = match_used(lines, run_id=run_id, text=text, issue_events=events)
    entry = {"at": now_ms if now_ms is not None else _now_ms(), "runId": run_id, "startedAt": started_at,
             "endedAt": ended_at, "shownAt": [min(d["at"] for d in lines), max(d["at"] for d in lines)],
             "matchedBy": how, "lines": len(lines), **found}
    keep_used(store.dir, [entry])
    return entry


def keep_used(directory: Path, entries: Iterable[Mapping[str, Any]]) -> None:
    """Append lines to ``directory``/used.jsonl (one O_APPEND write, fsynced: the write path's pace)."""
    _io.append_lines(directory / USED_FILE, [_dump(e) for e in entries])


def read_used(directory: Path, *, warnings: list[str] | None = None) -> list[dict]:
    """The lines of ``directory``/used.jsonl, in file order (one per written run that was shown
    something); a malformed line is skipped, with one line in ``warnings`` for them all."""
    bad: list[bytes] = []
    out = read_lines(directory / USED_FILE, valid=used_line_ok, bad=bad)
    if warnings is not None and (problem := skipped_warning(directory / USED_FILE, bad)):
        warnings.append(problem)
    return out


#: A "used" judgment counts only when the run's clock is plausible: its record written within
#: :data:`WRITE_LAG_MS` after it ended (and not before, beyond :data:`CLOCK_SLACK_MS` of skew), the
#: run no longer than :data:`MAX_RUN_MS`, and what it was shown shown while it ran. write accepts
#: any startedAt, so a run could otherwise place its judgment at any moment it likes (300 runs
#: backdated to just after a chosen moment got weights saved that lost on the store's own judgments).
CLOCK_SLACK_MS = 15 * 60_000
MAX_RUN_MS = 24 * 3_600_000
WRITE_LAG_MS = 24 * 3_600_000
#: Runs one run's "used" judgment names at most (its best-ranked ones): one run cannot outweigh many.
MAX_USED_PER_RUN = 3


def clock_problem(line: Mapping[str, Any], started: int, ended: int) -> str | None:
    """Why a used.jsonl ``line`` of a run that started and ended then cannot be a judgment (None: it can)."""
    at, span = line["at"], line.get("shownAt")
    if not 0 <= ended - started <= MAX_RUN_MS:
        return "clock"  # ends before it starts, or runs longer than a day
    if not ended - CLOCK_SLACK_MS <= at <= ended + WRITE_LAG_MS:
        return "clock"  # written before it ended, or long after
    if span is not None and not (started - CLOCK_SLACK_MS <= span[0] and span[1] <= ended + CLOCK_SLACK_MS):
        return "clock"  # shown what it used outside its own run
    return None


def used_judgments(snapshot: "Snapshot", *, as_of: int | None = None,
                   used: Iterable[Mapping[str, Any]] | None = None, warnings: list[str] | None = None,
                   left_out: dict[str, int] | None = None) -> list[tuple[int, "Judgment"]]:
    """The "used" judgments: a run R that used runs it was shown should have been shown them
    first. Query: R's task as its record holds it (as dispatched, less the block); asOf: R's
    start; relevant: the runs it used that had ended by then (its best-ranked
    :data:`MAX_USED_PER_RUN`); R's chat session, not its parent (asked as text alone, as the issue
    kinds are: see :func:`cybmem.retrieval.judgments.judgments_from_store`). A run whose clock is
    not plausible (:func:`clock_problem`) gives none.

    Args:
        snapshot: the project.
        as_of: only what was known then: lines written and runs ended by then.
        used: the used.jsonl lines (default: the project's file).
        warnings: gets one line when malformed used.jsonl lines were skipped.
        left_out: counts what was left out, by why: ``clock`` (judgments), ``capped`` (used runs).

    Returns:
        (R's start, the judgment), in file order; runs without a readable record, or whose used
        runs had not ended when they started, give none.
    """
    from ..retrieval.judgments import Judgment

    r = snapshot.records
    if used is None:
        used = read_used(snapshot.store.dir, warnings=warnings) if snapshot.store is not None else []
    else:
        used = [d for d in used if isinstance(d, Mapping) and _is_int(d.get("at")) and used_line_ok(d)]
    if r.num_rows == 0:
        return []
    left_out = {} if left_out is None else left_out
    ids = r.column("runId").to_pylist()
    row = {rid: i for i, rid in enumerate(ids)}
    tasks, chats = r.column("task").to_pylist(), r.column("chatSessionId").to_pylist()
    started = r.column("startedAt").cast("int64").to_pylist()
    ended = r.column("endedAt").cast("int64").to_pylist()
    out = []
    for d in used:
        i = row.get(d["runId"])
        if i is None or (as_of is not None and (ended[i] > as_of or d["at"] > as_of)):
            continue
        rel = [u["runId"] for u in d.get("used") or [] if u["runId"] in row
               and u["runId"] != ids[i] and ended[row[u["runId"]]] <= started[i]]
        rel = list(dict.fromkeys(rel))
        if not rel:
            continue
        if (why := clock_problem(d, started[i], ended[i])) is not None:
            left_out[why] = left_out.get(why, 0) + 1
            continue
        if len(rel) > MAX_USED_PER_RUN:
            left_out["capped"] = left_out.get("capped", 0) + len(rel) - MAX_USED_PER_RUN
        out.append((started[i], Judgment(query=tasks[i], as_of=started[i], relevant=tuple(rel[:MAX_USED_PER_RUN]),
                                         query_run_id=ids[i], chat_session_id=chats[i], kind="used")))
    return out


def rename_issues(directory: Path, renamed: Mapping[str, str]) -> int:
    """Rename issue ids in both logs (``cybmem redact`` renames an id spelled from a secret; the
    logs hold ids, so they follow). Returns the lines rewritten. Raises OSError / StoreError."""
    if not renamed:
        return 0
    n = 0
    with _io.locked(directory / _LOCK):
        for name in (SHOWN_FILE, USED_FILE):
            path = directory / name
            try:
                raw = _io.read_file(path)
            except FileNotFoundError:
                continue
            if not any(old.encode() in raw for old in renamed):
                continue
            lines = raw.split(b"\n")
            for k, line in enumerate(lines):
                if not any(old.encode() in line for old in renamed):
                    continue
                try:
                    d = _io.loads(line)
                except ValueError:
                    continue
                new = _renamed(d, renamed)
                if new != d:
                    lines[k], n = _dump(new), n + 1
            _io.atomic_write(path, b"\n".join(lines))
    return n


def _renamed(value: Any, renamed: Mapping[str, str]) -> Any:
    """``value`` with every issue id in ``renamed`` replaced (the lists and ``issueId`` fields of a log line)."""
    if isinstance(value, dict):
        return {k: (renamed.get(v, v) if k == "issueId" and isinstance(v, str) else _renamed(v, renamed))
                for k, v in value.items()}
    if isinstance(value, list):
        return [renamed.get(v, v) if isinstance(v, str) else _renamed(v, renamed) for v in value]
    return value
