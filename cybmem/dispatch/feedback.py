"""What dispatch records of what memory showed a run: one line in the project's shown.jsonl per
answer memory gave, and when it is kept.

A line for each MEMORY block ``cybmem inject`` built (:func:`keep_block`, through
:func:`cybmem.dispatch.inject.inject_task`) and each MCP tool's answer (:func:`mcp_observer`, one of
:attr:`cybmem.mcp.tools.Memory.observers`), naming the run it was for (``CYBERINE_RUN_ID``, else a
hash of the task: :func:`task_hash`, which the write path takes the same way) and holding only ids
and numbers, so nothing needs redacting. The shown log is capped (``CYBERINE_MEMORY_SHOWN_CAP``);
``CYBERINE_MEMORY_FEEDBACK=0`` turns it and used.jsonl off. Keeping a line is not on the failure
path: it never changes what inject prints or a tool's answer (a failure is one warning), and costs
one locked append (benchmarks/bench_store.py). The logs' format and I/O:
:mod:`cybmem.store.feedback_log`; what a written run used of what it was shown:
:mod:`cybmem.store.feedback_match`; the "used" judgments: :func:`cybmem.retrieval.judgments.used_judgments`.
The rules in full: USAGE.md, "What memory showed, and what the runs used".
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import StoreError
from ..store.feedback_log import LINE_ITEMS, SHOWN_FILE, keep_shown
from .preamble import strip

if TYPE_CHECKING:  # pragma: no cover
    from ..retrieval.issue_ranking import ChosenIssue
    from ..retrieval.search import Hit
    from ..retrieval.weights import LoadedWeights
    from ..settings import Settings
    from ..store.memory_store import MemoryStore

__all__ = ["ShownBlock", "enabled", "shown_cap", "task_hash", "block_entry", "mcp_entry", "keep_block", "mcp_observer"]

#: The MCP answers worth keeping: the tools and resources that return runs or issues (writes are not fetches).
_MCP_READS = ("search", "show", "chain", "issues", "memory_block", "open-issues", "run-record")


class ShownBlock(Protocol):
    """What :func:`block_entry` reads of a MEMORY block: a :class:`cybmem.dispatch.inject.Injection`,
    named by its fields (inject keeps its block here; this module does not import it back)."""

    task: str
    issues: list[ChosenIssue]
    raised: list[str]
    weights: LoadedWeights | None

    @property
    def runs(self) -> list[Hit]: ...


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
    """A shown line; its lists name at most LINE_ITEMS each (the first), with a count of the rest
    (``runsCut``, ``issuesCut``, ``fetchedCut``), so that no answer makes a line of hundreds of kB."""
    out: dict[str, Any] = {"at": at, "source": source, "runId": who["runId"], "taskHash": who["taskHash"],
                           "runs": runs, "issues": list(dict.fromkeys(issues))}
    out.update({k: v for k, v in extra.items() if v is not None})
    for key in ("runs", "issues", "fetched"):
        items = out.get(key)
        if items is not None and len(items) > LINE_ITEMS:
            out[key] = items[:LINE_ITEMS]
            out[f"{key}Cut"] = len(items) - LINE_ITEMS
    return out


def block_entry(inj: ShownBlock, settings: "Settings", *, at: int | None = None, source: str = "inject") -> dict:
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


def keep_block(store: "MemoryStore", inj: ShownBlock, settings: "Settings", *, now_ms: int | None = None) -> str | None:
    """Keep what an inject showed (:func:`block_entry`); returns a warning line, or None. Never raises."""
    try:
        if not enabled(settings):
            return None
        cap, problem = shown_cap(settings)
        store.check_writable()  # never through a symlinked project dir (nor its lock)
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
            store = store_of(project or arguments.get("project"))
            where = store.dir
            store.check_writable()  # never through a symlinked project dir (nor its lock)
            keep_shown(where, [entry], cap)
        except Exception as exc:  # noqa: BLE001 - keeping the log never fails the answer
            if str(where) not in warned:
                warned.add(str(where))
                path = where / SHOWN_FILE
                print(f"cybmem mcp: warning: what agents fetch is not kept in {path}: {_why(exc, path)}", file=sys.stderr)

    return observe
