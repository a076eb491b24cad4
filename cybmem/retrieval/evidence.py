"""Evidence per run: whether a candidate run is shown in full, as a one-line pointer, or left out.

The MEMORY block never hides what retrieval found; it spends its length where the evidence is.
Each run the ranking reaches is judged on its own keyword (and vector) evidence about the task,
measured against what chance gives in its own store, from the document frequencies the keyword
index already holds (nothing fitted per store, no judgments, nothing extra at dispatch but a
look-up of the few ranked rows' postings):

- **Matched terms**: the task's index terms the run holds. A term no run holds counts for nothing,
  neither for nor against (a Change-Id hash, a contributor's name, a new file path never lower a
  task's match: no normalisation by the task's length or idf mass).
- **Common terms**: a term at least :data:`COMMON_SHARE` of the store's runs hold (of
  :data:`COMMON_MIN_RUNS` in a smaller store) ("fix", "test",
  "merge" in most histories) is what any task, of any project, shares with such a store by chance.
  A run whose matched terms are all common has no evidence: it is left out. Recency and lineage
  order the runs and break ties; they never put a run in on their own (the parent a dispatcher
  names is shown whatever its evidence).
- **Nats**: ``sum(idf(t) for matched t) - ln N``: minus the natural log of how many of the N runs
  would hold that set of terms if terms fell on runs independently (``N * prod(df_t / N)``; BM25's
  idf is ``ln(N / df)`` up to its smoothing). At 0 one run would by chance; each further nat is
  e-fold less likely. This is the surprise of the co-occurrence, the same quantity the
  query-likelihood and divergence-from-randomness models score a document by (Amati and van
  Rijsbergen, TOIS 2002), taken per run instead of summed into one score.
- **Tiers**: ``full`` when the nats reach :data:`FULL_NATS` (or the run is the pinned parent);
  ``pointer`` (id, date, title: an agent fetches the rest with ``cybmem show`` or the MCP
  server's ``show``) when it matched a term that is not common, or its cosine with the task reaches
  the weights' ``floor_vec``; ``out`` otherwise.

:data:`COMMON_SHARE` and :data:`FULL_NATS` (with the block's runs in full and pointers) were chosen
by leaving one history out: the rule fitted on three of the four dev histories was scored on the
fourth, each in turn
(benchmarks/bench_block.py; figures in benchmarks/RESULTS.md, "The block shows what memory found").
A task without a single index term (a chat session's block at its start) has nothing to judge by:
every run it reaches counts as strong (the block's first runs in full, the next as pointers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..store.keyword_index import KeywordIndex

__all__ = ["COMMON_MIN_RUNS", "COMMON_SHARE", "FULL_NATS", "FULL", "POINTER", "OUT", "Evidence", "RunEvidence", "judge", "specific_terms"]

#: A term at least this share of a store's runs hold is common there: a match on it alone is chance.
COMMON_SHARE = 0.3
#: A store of fewer runs is judged as if it held this many (the others holding none of the task's
#: terms): in a store of ten runs a word two of them hold is not yet "every project's word", and
#: two words one run holds are not yet chance.
COMMON_MIN_RUNS = 100
#: The surprise (in nats, module docstring) a run's matched terms need for it to be shown in full.
FULL_NATS = 2.0

FULL, POINTER, OUT = "full", "pointer", "out"


@dataclass(frozen=True)
class RunEvidence:
    """One ranked run's evidence about the task and the tier it earned."""

    tier: str  # FULL, POINTER or OUT
    nats: float  # surprise of its matched terms (module docstring); -inf with none
    terms: tuple[str, ...]  # the task terms it holds
    common: tuple[str, ...]  # those of them that are common in the store
    cosine: float | None = None

    @property
    def specific(self) -> tuple[str, ...]:
        """The task terms it holds that are not common: what its evidence rests on."""
        return tuple(t for t in self.terms if t not in self.common)

    def to_dict(self) -> dict:
        out = {"tier": self.tier, "nats": round(self.nats, 3) if math.isfinite(self.nats) else None,
               "terms": list(self.terms), "common": list(self.common)}
        if self.cosine is not None:
            out["cosine"] = round(self.cosine, 4)
        return out


@dataclass
class Evidence:
    """What the task's terms are in this store: which ones can carry evidence at all."""

    terms: list[str]  # the task's distinct index terms
    df: np.ndarray  # documents holding each (0: no run does)
    n_docs: int
    common_df: int  # a term held by at least this many runs is common
    specific: list[str] = field(default_factory=list)  # terms some run holds that are not common
    candidates: int = 0  # the runs the task could be shown (set by the ranking, before evidence narrows them)

    @property
    def judged(self) -> bool:
        """False for a task without a single index term: nothing to judge evidence by."""
        return bool(self.terms)

    def reason(self) -> str:
        """The one line a block says when no run has evidence."""
        if not self.candidates:
            return "no earlier run in this project"
        known = int((self.df > 0).sum())
        if not known:
            return "no earlier run relates to this task: no run holds any of its words"
        return (f"no earlier run relates to this task: the words runs share with it ({known}) are common here, "
                f"each held by at least {self.common_df} of this project's {self.n_docs} runs")


def specific_terms(index: KeywordIndex, tokens: list[str], *, common_share: float | None = None) -> Evidence:
    """The task's terms as this store sees them (the common ones marked), once per task.
    ``common_share``: :data:`COMMON_SHARE` unless given (benchmarks/bench_block.py sweeps it)."""
    hits = index.term_hits(tokens, np.zeros(0, dtype=np.int64))
    n = max(index.n_docs, 1)
    common_df = max(2, math.ceil((COMMON_SHARE if common_share is None else common_share) * max(n, COMMON_MIN_RUNS)))
    specific = [t for t, d in zip(hits.terms, hits.df.tolist()) if 0 < d < common_df]
    return Evidence(hits.terms, hits.df, index.n_docs, common_df, specific)


def judge(index: KeywordIndex, ev: Evidence, rows: list[int], *, cosine: np.ndarray | None = None,
          floor_vec: float | None = None, pinned: int | None = None, full_nats: float | None = None) -> list[RunEvidence]:
    """The evidence and tier of each of ``rows`` (ranked rows of ``index``), in order.

    Args:
        index: the store's keyword index.
        ev: :func:`specific_terms` of the task.
        rows: the rows to judge.
        cosine: every row's cosine with the task (None: no vector axis).
        floor_vec: the cosine that is evidence on its own (a pointer at least).
        pinned: the row of the parent the dispatcher named: shown in full whatever its evidence.
        full_nats: :data:`FULL_NATS` unless given (benchmarks/bench_block.py sweeps it).
    """
    full_at = FULL_NATS if full_nats is None else full_nats
    rows = [int(r) for r in rows]
    if not rows:
        return []
    held = index.term_hits(ev.terms, np.asarray(rows, dtype=np.int64)).held if ev.terms else np.zeros((len(rows), 0), bool)
    n = max(ev.n_docs, COMMON_MIN_RUNS)  # a small store judged as if it held that many runs (the others holding none)
    df = np.maximum(ev.df, 1)
    idf = np.log1p((n - df + 0.5) / (df + 0.5))
    common = ev.df >= ev.common_df
    out = []
    for i, row in enumerate(rows):
        m = held[i]
        nats = float(idf[m].sum()) - math.log(n) if m.any() else -math.inf
        cos = float(cosine[row]) if cosine is not None else None
        if not ev.judged or row == pinned:
            tier = FULL
        elif nats >= full_at and (m & ~common).any():
            tier = FULL
        elif (m & ~common).any() or (cos is not None and floor_vec is not None and floor_vec > 0 and cos >= floor_vec):
            tier = POINTER
        else:
            tier = OUT
        terms = tuple(t for t, h in zip(ev.terms, m) if h)
        out.append(RunEvidence(tier, nats, terms, tuple(t for t, h, c in zip(ev.terms, m, common) if h and c), cos))
    return out
