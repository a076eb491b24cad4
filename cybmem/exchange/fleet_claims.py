"""Who speaks for a run id that more than one (machine, project) exported.

The (machine, project) that exported it first owns it (then machine and project by name); the
others' copies leave search and the counts, and a hit names every claimant. Found in two passes
over the partitions: the hashes of every group's run ids, then the records of the few ids whose
hash is in more than one group.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from .fleet_dataset import Group, group_records

__all__ = ["Claim", "find_claims", "hidden_ids"]

_CLAIM_COLUMNS = ("runId", "cwd", "workflowName", "task", "state", "startedAt", "endedAt", "summary", "verdictSummary")
_EXPORTED = re.compile(r"part-(\d{8}T\d{6,12}Z)")


def _exported_at(path: str) -> str:
    """When a part file was exported, sortable: the time in its name (``part-<UTC time>-...``), else its mtime."""
    m = _EXPORTED.search(Path(path).name)
    if m:
        return m.group(1)
    try:
        ns = os.stat(path).st_mtime_ns
    except OSError:
        return "~"  # unknown: after every known time
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 10**9)) + f"{ns % 10**9 // 1000:06d}Z"


def _hash_ids(ids) -> np.ndarray:
    """uint64 hashes of run ids, the same in every process (pandas' keyed hash, not Python's salted one)."""
    import pandas as pd

    ids = np.asarray(ids, dtype=object)
    return pd.util.hash_array(ids) if len(ids) else np.zeros(0, np.uint64)


def _id_hashes_part(groups: tuple[Group, ...]) -> list[np.ndarray]:
    """Ownership, pass 1: the hashes of each group's run ids (every id it exported, owned or not)."""
    return [_hash_ids(group_records(dataclasses.replace(g, hidden=frozenset()), ["runId"]).column("runId").to_pylist())
            for g in groups]


def _claims_part(groups: tuple[Group, ...], wanted: np.ndarray) -> list[tuple[str, str, str, str, str]]:
    """Ownership, pass 2: (runId, machine, project, exported, digest of the record) of the groups'
    run ids whose hash is in ``wanted`` (ids some other group exported too)."""
    import hashlib

    out = []
    for g in groups:
        t = group_records(dataclasses.replace(g, hidden=frozenset()), _CLAIM_COLUMNS, with_file=True)
        hit = np.isin(_hash_ids(t.column("runId").to_pylist()), wanted)
        if not hit.any():
            continue
        for row in t.filter(pa.array(hit)).to_pylist():
            digest = hashlib.sha256(repr([row[c] for c in _CLAIM_COLUMNS]).encode()).hexdigest()[:16]
            out.append((row["runId"], g.machine, g.project, _exported_at(g.records[row["__file"]]), digest))
    return out


@dataclass(frozen=True)
class Claim:
    """A run id that more than one (machine, project) exported: ``owner`` exported it first and
    speaks for it; ``differ``: the claimants' records of it are not the same."""

    run_id: str
    owner: tuple[str, str]
    others: tuple[tuple[str, str], ...]
    differ: bool

    @property
    def claimants(self) -> list[str]:
        """Every claimant as ``machine/project``, the owner first."""
        return [f"{m}/{p}" for m, p in (self.owner, *self.others)]


def _resolve_claims(rows: list[tuple[str, str, str, str, str]]) -> dict[str, Claim]:
    """Each run id claimed by more than one (machine, project): its owner is the first to export it
    (then machine and project by name)."""
    by: dict[str, list[tuple[str, str, str, str]]] = {}
    for rid, machine, project, exported, digest in rows:
        by.setdefault(rid, []).append((exported, machine, project, digest))
    out = {}
    for rid, found in sorted(by.items()):
        if len(found) < 2:
            continue  # two ids that share a hash: each has one claimant
        found.sort()
        out[rid] = Claim(rid, found[0][1:3], tuple(f[1:3] for f in found[1:]), len({f[3] for f in found}) > 1)
    return out


def find_claims(each: Callable[..., list], partitions: Sequence[tuple[Group, ...]]) -> dict[str, Claim]:
    """The run ids more than one (machine, project) of ``partitions`` exported, each with its owner.

    Args:
        each: ``each(fn, partitions, *args)`` runs ``fn(partition, *args)`` over some partitions
            (here or on a cluster) and returns the results in order.
        partitions: the packed (machine, project)s.
    """
    hashes = each(_id_hashes_part, partitions)
    flat = [h for part in hashes for h in part]
    every = np.concatenate(flat) if flat else np.zeros(0, np.uint64)
    uniq, counts = np.unique(every, return_counts=True)
    wanted = uniq[counts > 1]
    if not len(wanted):
        return {}
    parts = [p for p, hs in zip(partitions, hashes) if any(np.isin(h, wanted).any() for h in hs)]
    return _resolve_claims([r for rows in each(_claims_part, parts, wanted) for r in rows])


def hidden_ids(claims: dict[str, Claim]) -> dict[tuple[str, str], frozenset[str]]:
    """Per (machine, project): the run ids it exported that another one owns (readers leave them out)."""
    hidden: dict[tuple[str, str], set[str]] = {}
    for c in claims.values():
        for key in c.others:
            hidden.setdefault(key, set()).add(c.run_id)
    return {key: frozenset(ids) for key, ids in hidden.items()}
