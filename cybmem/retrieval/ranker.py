"""The learned ranker: the second stage that reorders the linear formula's pool (issue 39).

The first stage is the interpretable formula (:mod:`cybmem.retrieval.scoring`, what ``cybmem tune``
fits); its pool (:func:`cybmem.retrieval.features.pool`) is reordered by a LambdaMART model whose
trees ship in the package (ranker_model.json, with the histories, the commit and the LightGBM
version it came from and its leave-one-history-out table; ``cybmem ranker show``). They are
evaluated in numpy (:mod:`cybmem.retrieval.trees`): dispatch never imports LightGBM.
``CYBERINE_MEMORY_RANKER=linear`` turns it off. Retrain with ``cybmem ranker train`` (the
``train`` extra; :mod:`cybmem.retrieval.ranker_training`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from ..errors import StoreError
from .features import FEATURES, pool_features
from .trees import Forest

if TYPE_CHECKING:  # pragma: no cover
    from ..store.snapshot import Snapshot
    from .scoring import Scored

__all__ = ["MODEL_PATH", "Model", "LearnedOrder", "model", "load_model", "use_model", "learned_order", "order_of",
           "shares_with_query", "describe"]

#: The shipped model.
MODEL_PATH = Path(__file__).resolve().parent / "ranker_model.json"


@dataclass
class Model:
    forest: Forest
    features: tuple[str, ...]
    provenance: dict[str, Any]
    path: Path

    def score(self, X: np.ndarray) -> np.ndarray:
        return self.forest.predict(X)


@dataclass
class LearnedOrder:
    """A query's pool as the learned ranker ordered it (indices into the first stage's scored rows)."""

    local: np.ndarray  # the pool, best first
    scores: np.ndarray  # the model's score of each, in that order
    X: np.ndarray  # their features, in that order

    def contributions(self, at: list[int]) -> list[dict[str, float]]:
        """Each feature's tree SHAP value (:meth:`cybmem.retrieval.trees.Forest.shap`, what LightGBM's
        ``pred_contrib=True`` gives) for the score of the pool entries at positions ``at`` of this
        order, with the base (the trees' expected value) as ``"(base)"``: they add up to the score."""
        if not at:
            return []
        contrib, base = model().forest.shap(self.X[at])
        return [{"(base)": round(float(b), 6), **{name: round(float(c), 6) for name, c in zip(FEATURES, row)}}
                for row, b in zip(contrib, base)]

    def shown_score(self, at: int) -> float:
        """The score a hit shows for the entry at ``at``: the trees' raw score through the logistic
        function (the same order, between 0 and 1 as the formula's totals are); 0 for an entry that
        shares nothing with the query (:func:`learned_order` lists those last)."""
        if not self.shares(at):
            return 0.0
        raw = float(self.scores[at])
        return 1.0 / (1.0 + math.exp(-raw)) if raw > -700 else 0.0

    def shares(self, at: int) -> bool:
        """Whether the entry at ``at`` shares a word or a lineage link with the query (:func:`shares_with_query`)."""
        return bool(shares_with_query(self.X[at:at + 1])[0])

    def values(self, at: int) -> dict[str, float]:
        return {name: round(float(v), 6) for name, v in zip(FEATURES, self.X[at])}


_MODELS: dict[Path, Model] = {}


def load_model(path: str | Path | None = None) -> Model:
    """The model file at ``path`` (default: the shipped one), read once per process."""
    p = Path(path) if path is not None else MODEL_PATH
    got = _MODELS.get(p)
    if got is not None:
        return got
    try:
        data = orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise StoreError(f"cannot read the learned ranker's model {p}: {exc}; reinstall cybmem, or set "
                         "CYBERINE_MEMORY_RANKER=linear") from None
    names = tuple(data.get("features") or ())
    if names != FEATURES:
        raise StoreError(f"the learned ranker's model {p} was trained on other features than this cybmem computes; "
                         "retrain it (`cybmem ranker train`) or set CYBERINE_MEMORY_RANKER=linear")
    got = _MODELS[p] = Model(Forest.from_packed(data["trees"]), names, dict(data.get("provenance") or {}), p)
    return got


_IN_USE: list[Path | None] = [None]


def model() -> Model:
    """The model this process ranks with: the shipped one, unless :func:`use_model` named another."""
    return load_model(_IN_USE[0])


def use_model(path: str | Path | None) -> None:
    """Rank with the model file at ``path`` in this process (None: the shipped one again): what the
    benchmarks do to score each history with the model trained without it (benchmarks/bench_rank.py)."""
    _IN_USE[0] = Path(path) if path is not None else None


def learned_order(snap: "Snapshot", query: str, idx: np.ndarray, scored: "Scored", kw_raw: np.ndarray, now_ms: int,
                  *, tokens: list[str] | None = None) -> LearnedOrder:
    """The first stage's pool among ``idx`` (its scored rows) in the shipped model's order (ties: the
    first stage's), the runs that share a word (BM25 above 0) or a lineage link with the query
    first: the trees' time prior ranks a project's latest runs high whatever they say, which a
    search by words should not show above the runs that hold them. Leave-one-history-out this costs
    MRR@10 0.000-0.014 a history (mean 0.610 -> 0.603; benchmarks/RESULTS.md, "The learned ranker")."""
    local, X, first = pool_features(snap, query, idx, scored, kw_raw, now_ms, tokens=tokens)
    s = model().score(X)
    o = order_of(s, X, first)
    return LearnedOrder(local[o], s[o], X[o])


_KEYWORD, _LINEAGE = FEATURES.index("first_keyword"), FEATURES.index("first_lineage")


def shares_with_query(X: np.ndarray) -> np.ndarray:
    """Which pool entries share a word (their keyword axis above 0) or a lineage link with the query,
    read from their features (:data:`cybmem.retrieval.features.FEATURES`)."""
    return (X[:, _KEYWORD] > 0) | (X[:, _LINEAGE] > 0)


def order_of(scores: np.ndarray, X: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The learned order of one query's pool: the entries that share something with the query
    (:func:`shares_with_query`) first, each group by the trees' score, ties by the first stage's
    rank ``first``. What dispatch shows and what the leave-one-out tables score
    (:func:`cybmem.retrieval.ranker_training.scores_of`)."""
    return np.lexsort((first, -np.asarray(scores), ~shares_with_query(X)))


def describe(path: str | Path | None = None) -> dict[str, Any]:
    """``cybmem ranker show``: the model file's provenance (what it was trained on, from which commit,
    with which LightGBM, its leave-one-out table) and its size."""
    m = load_model(path)
    return {"model": str(m.path), "trees": m.forest.n_trees, "features": list(m.features), **m.provenance}
