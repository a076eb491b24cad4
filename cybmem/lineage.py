"""Chains: previous / next along previousRunId, parent and children, chat sessions, supersession."""

from __future__ import annotations

from dataclasses import dataclass, field

from .store import MemoryStore

__all__ = ["ChainResult", "chain"]

_MAX_WALK = 100_000  # guards against cycles written by other tools


@dataclass
class ChainResult:
    """A run's place in its project's history."""

    run_id: str
    runs: list[dict]  # index entries, oldest first: earlier runs, the run, later runs
    previous: list[str]
    next: list[str]
    parent: str | None
    parent_known: bool
    root: str | None
    children: list[str] = field(default_factory=list)
    chat_session: str | None = None
    chat_runs: list[str] = field(default_factory=list)
    open_issues: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "runId": self.run_id,
            "previous": self.previous,
            "next": self.next,
            "parentRunId": self.parent,
            "rootRunId": self.root,
            "children": self.children,
            "chatSessionId": self.chat_session,
            "chatRuns": self.chat_runs,
            "openIssues": self.open_issues,
            "runs": self.runs,
        }


def chain(store: MemoryStore, run_id: str) -> ChainResult:
    """Walk previousRunId both directions from ``run_id`` and collect its parent and chat links.

    Backwards follows each record's previousRunId; forwards follows the records
    that name the current one as previous (the earliest-ended one when several
    runs started from the same predecessor). Runs compaction moved out of index.json are
    read from their records, so the chain reaches every record.
    """
    entries = store.all_entries()
    by_id = {e["runId"]: e for e in entries}
    followers: dict[str, list[dict]] = {}
    for e in sorted(entries, key=lambda e: (e["endedAt"], e["runId"])):
        if e.get("previousRunId"):
            followers.setdefault(e["previousRunId"], []).append(e)
    me = by_id.get(run_id) or {"runId": run_id, "endedAt": 0, "state": "?", "task": ""}
    previous: list[str] = []
    seen = {run_id}
    cur = me
    while cur.get("previousRunId") in by_id and cur["previousRunId"] not in seen and len(previous) < _MAX_WALK:
        cur = by_id[cur["previousRunId"]]
        seen.add(cur["runId"])
        previous.append(cur["runId"])
    previous.reverse()
    nxt: list[str] = []
    cur = me
    while followers.get(cur["runId"]) and len(nxt) < _MAX_WALK:
        cand = [f for f in followers[cur["runId"]] if f["runId"] not in seen]
        if not cand:
            break
        cur = cand[0]
        seen.add(cur["runId"])
        nxt.append(cur["runId"])
    parent = me.get("parentRunId")
    chat = me.get("chatSessionId")
    states = store.issue_states()
    return ChainResult(
        run_id=run_id,
        runs=[by_id[i] for i in previous] + [me] + [by_id[i] for i in nxt],
        previous=previous,
        next=nxt,
        parent=parent,
        parent_known=parent in by_id,
        root=me.get("rootRunId"),
        children=[e["runId"] for e in sorted(entries, key=lambda e: (e["endedAt"], e["runId"])) if e.get("parentRunId") == run_id],
        chat_session=chat,
        chat_runs=[e["runId"] for e in sorted(entries, key=lambda e: (e["endedAt"], e["runId"])) if chat and e.get("chatSessionId") == chat],
        open_issues=[i for i in me.get("issues", []) if states.get(i) and states[i].state in ("opened", "reopened")],
    )
