"""What a written run used of what memory showed it: the run's used.jsonl line.

:func:`shown_for` finds the shown.jsonl lines that were for the run (by its id, else by its task's
hash); :func:`match_used` decides what it used of them: the shown runs its output names
(:func:`names_run`) or it fetched, the shown issues it resolved, reopened or named. :func:`note_used`
does both for a run just written (:func:`cybmem.operations.write.write_run`) and appends the line
(:mod:`cybmem.store.feedback_log`); the replay of :mod:`cybmem.explore.usage` matches by the same rule.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .. import _io
from ..errors import StoreError
from .feedback_log import SHOWN_FILE, cut_shown, keep_used, parse_lines, shown_line_ok, skipped_warning

if TYPE_CHECKING:  # pragma: no cover
    from ..settings import Settings
    from .memory_store import MemoryStore

__all__ = ["shown_for", "names_run", "match_used", "note_used"]


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
    shown (``shownAt``: first, last), which :func:`cybmem.retrieval.judgments.used_judgments` checks
    against each other.
    A malformed shown.jsonl line is skipped, with one line in ``warnings``.

    Raises:
        OSError / StoreError: a log could not be read or written (the caller reports it).
    """
    shown = store.dir / SHOWN_FILE
    try:
        raw = _io.read_file(shown)
    except FileNotFoundError:
        return None
    cut_shown(store.dir, raw, settings.feedback.shown_cap)
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
    entry = {"at": now_ms if now_ms is not None else int(time.time() * 1000), "runId": run_id, "startedAt": started_at,
             "endedAt": ended_at, "shownAt": [min(d["at"] for d in lines), max(d["at"] for d in lines)],
             "matchedBy": how, "lines": len(lines), **found}
    keep_used(store.dir, [entry])
    return entry
