"""What memory's feedback says, for notebooks and reports: how often the runs the MEMORY block
showed were used, by rank and over time, and which weights would have put the used runs higher.

It reads a project's used.jsonl (:mod:`cybmem.store.feedback_log`: one line per written run that was shown
something). :func:`replay` makes the same lines for a history that has none yet, through the same
functions dispatch and the write path use, with a simulated agent: each past run is dispatched
again as of its start, and it uses the shown runs the store's own judgments say it should have
seen (the earlier runs that carried an issue it raised, resolved or reopened; its parent). So a
replay shows what the page will show once real runs are matched, not what agents did.

Nothing in the write or inject path imports this module (it imports pandas).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..dispatch import feedback
from ..retrieval.judgments import ISSUE_KINDS, Judgment, judgments_from_store, used_judgments
from ..store import feedback_log
from ..store.feedback_match import match_used
from ..store.display import head_line
from ..settings import DEFAULT_SHOWN_CAP, Settings
from ..store.loading import load_snapshot
from ..store.snapshot import Snapshot
from ..store.memory_store import MemoryStore

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..retrieval.tuning import GridResult

__all__ = ["Feedback", "load_feedback", "replay", "used_frame", "usage_by_rank", "usage_over_time", "WeightsCheck",
           "check_weights"]


@dataclass
class Feedback:
    """A project's used.jsonl lines, and where they come from; ``str()`` says so."""

    snapshot: Snapshot
    used: list[dict]
    replayed: bool  # made by :func:`replay`, not read from the store
    described: str

    def __str__(self) -> str:
        return self.described


def _snap(source: MemoryStore | Snapshot) -> Snapshot:
    return source if isinstance(source, Snapshot) else load_snapshot(source)


def load_feedback(source: MemoryStore | Snapshot, settings: Settings, *, replay_: bool | None = None,
                  last: int | None = 300) -> Feedback:
    """The project's feedback: its used.jsonl; without one (``replay_`` None) or always
    (``replay_=True``), a replay of its newest ``last`` runs (:func:`replay`); ``replay_=False``
    never replays. :attr:`Feedback.described` says which.
    """
    snap = _snap(source)
    have = feedback_log.read_used(snap.store.dir)
    slug = snap.store.slug
    if have and replay_ is not True:
        return Feedback(snap, have, False, f"Feedback of project {slug}: {len(have)} written runs matched to what "
                                           f"they were shown ({snap.store.dir / feedback_log.USED_FILE})")
    if replay_ is False:
        return Feedback(snap, [], False, f"Feedback of project {slug}: none yet (no {feedback_log.USED_FILE}: no "
                                         "written run has been matched to what it was shown)")
    used = replay(snap, settings, last=last)
    why = "asked for" if replay_ else f"the project has no {feedback_log.USED_FILE} yet"
    runs = sum(1 for x in snap.records.column("supersedes").to_pylist() if not x)  # corrections are not replayed
    runs = min(last, runs) if last is not None else runs
    return Feedback(snap, used, True, f"Feedback of project {slug}: a replay of its newest {runs} runs ({why}; "
                                      f"{len(used)} were shown something): each dispatched again as of its start, using "
                                      "the shown runs its issues and parent relate it to (a simulated agent, not what "
                                      "agents did)")


def replay(source: MemoryStore | Snapshot, settings: Settings, *, last: int | None = None,
           relevant: Mapping[str, Iterable[str]] | None = None, into: Path | None = None) -> list[dict]:
    """Dispatch a project's past runs again and note what a simulated agent used: used.jsonl lines.

    Each run (oldest first; the newest ``last`` when given; corrections left out) gets the block
    :func:`cybmem.dispatch.inject.inject_task` builds for its task as of its start (its parent and chat
    session as dispatch would have named them), kept as :func:`cybmem.dispatch.feedback.block_entry`
    keeps it; its "output" names the shown runs in ``relevant`` (default: what the store's issue
    and parent judgments say it should have seen) by the 8 characters the block prints, and its
    issue events are its ledger lines; :func:`cybmem.store.feedback_match.match_used` then decides what it
    used, as the write path does.

    Args:
        source: the project.
        settings: weights, top-k and budget of the blocks (as dispatch reads them).
        last: replay only the newest ``last`` runs.
        relevant: run id -> the runs its simulated agent uses when shown.
        into: also append the shown and used lines to this project directory's logs (a copy of
            the store, e.g. for benchmarks/feedback_replay.py).

    Returns:
        The used.jsonl lines, oldest run first (one per run that was shown a run or an issue).
    """
    from ..dispatch.inject import inject_task

    snap = _snap(source)
    r = snap.records
    if not r.num_rows:
        return []
    if relevant is None:
        relevant = {}
        for j in judgments_from_store(snap, kinds=ISSUE_KINDS + ("parent",)):
            relevant.setdefault(j.query_run_id, set()).update(j.relevant)
    cols = {c: r.column(c).to_pylist() for c in ("runId", "task", "parentRunId", "chatSessionId", "supersedes")}
    cols.update({c: r.column(c).cast("int64").to_pylist() for c in ("startedAt", "endedAt")})
    order = sorted((i for i in range(r.num_rows) if not cols["supersedes"][i]),
                   key=lambda i: (int(cols["startedAt"][i]), cols["runId"][i]))
    if last is not None:
        order = order[-last:]
    events: dict[str, list[tuple[str, str]]] = {}
    ev = snap.events
    if ev.num_rows:
        for issue, event, by in zip(ev.column("issueId").to_pylist(), ev.column("event").to_pylist(),
                                    ev.column("byRunId").to_pylist()):
            events.setdefault(by, []).append((issue, event))
    store = snap.store
    out, shown_lines = [], []
    for i in order:
        rid, start = cols["runId"][i], int(cols["startedAt"][i])
        mine = dataclasses.replace(settings, run_id=rid, enabled=True)
        inj = inject_task(cols["task"][i], mine, project=store.slug, as_of=start, now_ms=start,
                          parent_run_id=cols["parentRunId"][i], chat_session_id=cols["chatSessionId"][i], keep=False)
        entry = feedback.block_entry(inj, mine, at=start)
        if not entry["runs"] and not entry["issues"]:
            continue
        wanted = set(relevant.get(rid, ()))
        text = "\n".join(f"as run {h.run_id[:8]} did" for h in inj.runs if h.run_id in wanted)
        found = match_used([entry], run_id=rid, text=text, issue_events=events.get(rid, []))
        shown_lines.append(entry)
        out.append({"at": int(cols["endedAt"][i]), "runId": rid, "startedAt": start, "matchedBy": "runId", "lines": 1,
                    **found})
    if into is not None:
        feedback_log.keep_shown(into, shown_lines, cap=max(len(shown_lines), DEFAULT_SHOWN_CAP))
        feedback_log.keep_used(into, out)
    return out


def used_frame(used: Sequence[Mapping[str, Any]]) -> "pd.DataFrame":
    """One row per written run that was shown something, oldest start first.

    Columns: ``runId``, ``startedAt`` (UTC), ``matchedBy``, ``blockRuns`` (runs the block showed),
    ``usedRuns`` (runs it used), ``usedFromBlock`` (of them, shown in the block), ``usedRanks``
    (their ranks in the block), ``fetched`` (runs it fetched through ``cybmem mcp``),
    ``usedIssues``, ``weightsSource`` (where the block's weights came from).
    """
    import pandas as pd

    rows = []
    for d in used:
        block = d.get("block") or []
        u = [x for x in d.get("used") or [] if isinstance(x, Mapping)]
        ranks = sorted(int(x["rank"]) for x in u if isinstance(x.get("rank"), int))
        rows.append({"runId": d.get("runId"), "startedAt": d.get("startedAt"), "matchedBy": d.get("matchedBy"),
                     "blockRuns": len(block), "usedRuns": len(u), "usedFromBlock": len(ranks), "usedRanks": ranks,
                     "fetched": sum("fetched" in (x.get("how") or []) for x in u),
                     "usedIssues": len(d.get("usedIssues") or []),
                     "weightsSource": (d.get("weights") or {}).get("source")})
    df = pd.DataFrame(rows, columns=["runId", "startedAt", "matchedBy", "blockRuns", "usedRuns", "usedFromBlock",
                                     "usedRanks", "fetched", "usedIssues", "weightsSource"])
    df["startedAt"] = pd.to_datetime(df["startedAt"].astype("int64"), unit="ms", utc=True)
    return df.sort_values("startedAt", kind="stable").reset_index(drop=True)


def usage_by_rank(frame: "pd.DataFrame") -> "pd.DataFrame":
    """Per rank of the block: how many blocks showed a run there (``shown``), how many of those
    runs were used (``used``) and the share (``rate``)."""
    import numpy as np
    import pandas as pd

    depth = int(frame["blockRuns"].max()) if len(frame) else 0
    ranks = np.arange(1, depth + 1)
    shown = np.array([(frame["blockRuns"] >= k).sum() for k in ranks], dtype=np.int64)
    used = np.zeros(depth, dtype=np.int64)
    for rs in frame["usedRanks"]:
        for k in rs:
            if 1 <= k <= depth:
                used[k - 1] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(shown > 0, used / np.maximum(shown, 1), np.nan)
    return pd.DataFrame({"rank": ranks, "shown": shown, "used": used, "rate": rate})


def usage_over_time(frame: "pd.DataFrame", *, freq: str | None = None) -> "pd.DataFrame":
    """Per period of the runs' starts (``freq``: a pandas frequency; None: by the span, as
    :func:`cybmem.explore.frames.period_starts`): the runs dispatched with a block that showed runs
    (``blocks``), those that used at least one of them (``usedBlock``), the share (``rate``) and
    the block runs used in all (``usedRuns``). ``attrs["period"]`` names the period."""
    import pandas as pd

    from .frames import period_starts

    withblock = frame[frame["blockRuns"] > 0]
    if not len(withblock):
        out = pd.DataFrame({"period": pd.Series([], dtype="datetime64[ns]"), "blocks": pd.Series([], dtype="int64"),
                            "usedBlock": pd.Series([], dtype="int64"), "rate": pd.Series([], dtype="float64"),
                            "usedRuns": pd.Series([], dtype="int64")})
        out.attrs["period"] = "period"
        return out
    period, name = period_starts(withblock["startedAt"], freq)
    g = withblock.assign(period=period, any=withblock["usedFromBlock"] > 0).groupby("period")
    out = pd.DataFrame({"blocks": g.size(), "usedBlock": g["any"].sum(), "usedRuns": g["usedFromBlock"].sum()})
    out["rate"] = out["usedBlock"] / out["blocks"]
    out = out.reset_index()[["period", "blocks", "usedBlock", "rate", "usedRuns"]]
    out.attrs["period"] = name
    return out


@dataclass
class WeightsCheck:
    """The tuning grid on the "used" judgments against the current weights, and each judgment's
    best rank of a used run under both."""

    judgments: list[Judgment]
    result: "GridResult"
    ranks: "pd.DataFrame"  # runId, task (its first line), used (8-character ids), currentRank, bestRank (NA: below k)

    def moves(self) -> dict[str, int]:
        """For how many judgments the best weights rank a used run higher, lower, the same (below
        the top k counts as just below it)."""
        k = self.result.k
        cur, best = self.ranks["currentRank"].fillna(k + 1), self.ranks["bestRank"].fillna(k + 1)
        return {"higher": int((best < cur).sum()), "lower": int((best > cur).sum()), "same": int((best == cur).sum())}

    def summary(self) -> str:
        r = self.result
        b = r.best
        return (f"{r.judgments} used judgments: {r.label} {r.current_metric:.4f} with the current weights, "
                f"{r.best_metric:.4f} with the best of the grid (w_kw={b.w_kw:g} w_rec={b.w_rec:g} w_lin={b.w_lin:g} "
                f"half_life_days={b.half_life_days:g})")


def check_weights(source: MemoryStore | Snapshot, used: Sequence[Mapping[str, Any]], settings: Settings, *,
                  metric: str = "mrr", k: int = 10, all_weights: bool = True) -> WeightsCheck | None:
    """Which weights would have put the used runs higher: :func:`cybmem.retrieval.tuning.tune` on the
    "used" judgments of ``used`` (``all_weights``: every axis searched, as ``tune --all-weights``),
    and each judgment replayed under the current and the best weights. None: no judgment.
    """
    import pandas as pd

    from ..retrieval.tuning import axis_matrices, tune

    snap = _snap(source)
    js = [j for _, j in used_judgments(snap, used=used)]
    if not js:
        return None
    result = tune(snap, judgments=js, metric=metric, k=k, settings=settings, hold_few=not all_weights, progress=False)
    m = axis_matrices(snap, js, k=k, progress=False)

    def best_rank(q: int, weights) -> int | None:
        ranked = m.ranking(q, weights, k)
        rel = set(m.judgments[q].relevant)
        return next((i for i, rid in enumerate(ranked, 1) if rid in rel), None)

    rows = [{"runId": j.query_run_id, "task": head_line(j.query, 100), "used": [u[:8] for u in j.relevant],
             "currentRank": best_rank(q, result.current), "bestRank": best_rank(q, result.best)}
            for q, j in enumerate(m.judgments)]
    ranks = pd.DataFrame(rows, columns=["runId", "task", "used", "currentRank", "bestRank"])
    for c in ("currentRank", "bestRank"):
        ranks[c] = ranks[c].astype("Int64")
    return WeightsCheck(js, result, ranks)
