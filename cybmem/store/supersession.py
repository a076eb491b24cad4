"""Supersession's one rule: which record corrects which.

Records are never rewritten except for one field: a correction is a new record that names the
run it corrects (``supersedes``), after which the corrected record gains ``supersededBy`` (the
field the seeds' TypeScript reader follows). Other writers may write only one direction, so
every reader honours either, with this rule (applied by store, snapshot, search, tuning,
lineage, frames and doctor through :func:`resolve`):

1. A link counts only when both records exist (as of the moment asked, when replaying the past:
   both ended by then) and they differ. A ``supersededBy`` naming a missing run is ignored (and
   reported by ``cybmem doctor``).
2. ``supersedes`` on the correcting record wins over ``supersededBy`` on the corrected one;
   among several records that supersede the same run, the latest (endedAt, then runId) wins.
3. Records on a cycle of corrections (A corrects B corrects A, written by hand) correct nothing:
   hiding all of them would lose memory.

The result maps each superseded run to its direct correction; :func:`newest_truth` follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = ["Link", "resolve", "walk", "newest_truth", "dangling"]

#: One record's links: (runId, endedAt ms, supersedes or None, supersededBy or None).
Link = tuple[str, int, "str | None", "str | None"]


def _ended_lookup(links: Sequence[Link], ended_of: Callable[[list[str]], Sequence[int | None]] | Mapping[str, int]) -> dict[str, int | None]:
    wanted = sorted({t for _, _, a, b in links for t in (a, b) if t} - {rid for rid, *_ in links})
    if isinstance(ended_of, Mapping):
        found = {rid: ended_of.get(rid) for rid in wanted}
    else:
        found = dict(zip(wanted, ended_of(wanted))) if wanted else {}
    found.update({rid: ended for rid, ended, _, _ in links})
    return found


def resolve(links: Iterable[Link], ended_of: Callable[[list[str]], Sequence[int | None]] | Mapping[str, int], *,
            as_of: int | None = None) -> dict[str, str]:
    """Superseded run -> the run that directly corrects it (rule: module docstring).

    Args:
        links: the records that carry a link (others may be left out).
        ended_of: endedAt of each given run id (None when no such record), as a callable over a
            list of ids or as a mapping; consulted only for ids the links name.
        as_of: replay the past: only records that ended by then exist.

    Returns:
        ``{old runId: correcting runId}``.
    """
    links = list(links)
    ended = _ended_lookup(links, ended_of)

    def exists(rid: str | None) -> bool:
        e = ended.get(rid) if rid else None
        return e is not None and (as_of is None or e <= as_of)

    out: dict[str, str] = {}
    by_supersedes: dict[str, tuple[int, str]] = {}
    for rid, end, target, _ in links:
        if target and target != rid and exists(rid) and exists(target):
            best = by_supersedes.get(target)
            if best is None or (end, rid) > best:
                by_supersedes[target] = (end, rid)
    for rid, _, _, by in links:
        if by and by != rid and exists(rid) and exists(by):
            out[rid] = by
    out.update({old: rid for old, (_, rid) in by_supersedes.items()})
    # Rule 3: drop the members of correction cycles.
    on_cycle: set[str] = set()
    for start in out:
        seen = [start]
        cur = out[start]
        while cur in out and cur not in seen:
            seen.append(cur)
            cur = out[cur]
        if cur in seen:
            on_cycle.update(seen[seen.index(cur):])
    for rid in on_cycle:
        del out[rid]
    return out


def walk(mapping: Mapping[str, str], run_id: str) -> list[str]:
    """The runs that supersede ``run_id``, in order, ending with the newest truth ([] if none)."""
    out: list[str] = []
    seen = {run_id}
    cur = run_id
    while cur in mapping and mapping[cur] not in seen:
        cur = mapping[cur]
        seen.add(cur)
        out.append(cur)
    return out


def newest_truth(mapping: Mapping[str, str], run_id: str) -> str:
    """Follow supersession from ``run_id`` to the record that nothing supersedes."""
    chain = walk(mapping, run_id)
    return chain[-1] if chain else run_id


def dangling(links: Iterable[Link], ended_of: Callable[[list[str]], Sequence[int | None]] | Mapping[str, int]) -> list[tuple[str, str, str]]:
    """Links that name a run that does not exist: (runId, field, target), for doctor."""
    links = list(links)
    ended = _ended_lookup(links, ended_of)
    out = []
    for rid, _, target, by in links:
        if target and ended.get(target) is None:
            out.append((rid, "supersedes", target))
        if by and ended.get(by) is None:
            out.append((rid, "supersededBy", by))
    return out
