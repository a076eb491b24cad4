"""Chains: previous / next along previousRunId, parent and children, chat sessions, supersession."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import CybmemError, NotFoundError
from .store import MemoryStore, index_entry

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
    length: int = 0  # runs in the whole chain, the run included
    omitted_before: int = 0  # runs of the chain before those shown (that passed the filter), not shown
    omitted_after: int = 0  # ... after those shown
    unmatched: int = 0  # runs of the chain a filter left out

    def verified(self, store: MemoryStore) -> "ChainResult":
        """The same chain with its shown runs checked against their files (:func:`verified_runs`)."""
        runs = verified_runs(store, self.runs)
        ids = {e["runId"] for e in runs}
        return replace(self, runs=runs, previous=[i for i in self.previous if i in ids],
                       next=[i for i in self.next if i in ids])

    def window(self, *, keep: set[str] | None = None, context: int | None = 5, offset: int = 0,
               limit: int | None = None) -> "ChainResult":
        """Part of the chain: ``context`` runs each side of the run, or one page of it.

        Args:
            keep: run ids to keep (e.g. those a :class:`cybmem.filters.RecordFilter` selects);
                None keeps every run. In context mode the run itself is always kept.
            context: runs each side of the run (0 or None: all of them); ignored when paging.
            offset, limit: page through the (kept) chain oldest first instead (limit 0 or None:
                to the end).

        Returns:
            A new ChainResult whose ``runs``, ``previous`` and ``next`` hold the runs shown and
            whose ``omitted_*`` and ``unmatched`` say how many were left out.
        """
        ids = [e["runId"] for e in self.runs]
        me = ids.index(self.run_id) if self.run_id in ids else 0
        paging = bool(offset or limit)
        sel = [i for i, rid in enumerate(ids) if keep is None or rid in keep or (i == me and not paging)]
        unmatched = len(ids) - len(sel) if keep is not None else 0
        if paging:
            lo, hi = offset, (offset + limit if limit else len(sel))
        else:
            pos = sel.index(me)
            lo, hi = (max(pos - context, 0), pos + context + 1) if context else (0, len(sel))
        shown = sel[lo:hi]
        return replace(
            self,
            runs=[self.runs[i] for i in shown],
            previous=[ids[i] for i in shown if i < me],
            next=[ids[i] for i in shown if i > me],
            omitted_before=min(lo, len(sel)),
            omitted_after=max(len(sel) - hi, 0),
            unmatched=unmatched,
        )

    def to_dict(self) -> dict:
        return {
            "runId": self.run_id,
            "chainLength": self.length,
            "omitted": {"before": self.omitted_before, "after": self.omitted_after, "unmatched": self.unmatched},
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


#: Above this many runs shown, the index entries are trusted as they are (reading every record
#: of a whole 100k chain would take seconds).
VERIFY_MAX = 500


def verified_runs(store: MemoryStore, runs: list[dict]) -> list[dict]:
    """The runs a chain shows, each checked against its record file: a record that no longer
    reads (corrupted after it was indexed) is left out with a problem on ``store``, and one
    edited in place is shown as it reads now (the index entry of its current content)."""
    if len(runs) > VERIFY_MAX:
        return runs
    out = []
    for entry in runs:
        try:
            rec, st = store.read_record_st(entry["runId"])
        except NotFoundError:
            out.append(entry)  # the run a chain starts from may have no record here
            continue
        except CybmemError as exc:
            store._problem(str(store.records_dir / f"{entry['runId']}.json"), f"{exc}; not shown")
            continue
        out.append({**entry, **index_entry(rec, st.st_ino)})
    return out


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
    states = store.issue_states_for(me.get("issues", []))
    return ChainResult(
        run_id=run_id,
        runs=[by_id[i] for i in previous] + [me] + [by_id[i] for i in nxt],
        length=len(previous) + 1 + len(nxt),
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
