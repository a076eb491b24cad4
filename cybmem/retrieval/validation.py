"""The check on time that decides whether tuned weights may be saved: the earlier judgments tune,
the later ones score (:class:`Validation`), with a bootstrap interval of the difference and the
kinds of judgment balanced; :func:`refusal_of` is the one guard of ``cybmem tune --save``, the
automatic re-tune and the tuning widget's Save.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .judgments import MAX_USED_SHARE, Judgment
from .weights import Weights


__all__ = ["MIN_KEYWORD_JUDGMENTS", "MIN_JUDGMENTS", "MIN_OWN_JUDGMENTS", "MIN_FOLD", "Validation", "refusal_of", "bootstrap_interval",
           "time_folds", "kind_weights"]

#: Fewer judgments that test keywords than this, and the keyword weight is not searched.
MIN_KEYWORD_JUDGMENTS = 10
#: Fewer judgments that test the weights than this (those lineage decides do not count), and
#: ``tune --save`` keeps the weights there are: below it the later half is too small to tell.
MIN_JUDGMENTS = 30
#: With "used" judgments among them, fewer of the store's own judgments that test the weights than
#: this (15), and ``tune --save`` keeps the weights there are: "used" judgments may be at most
#: MAX_USED_SHARE of the MIN_JUDGMENTS a tuning needs, so the store's own must be the rest, or the
#: check on the store's own history (which no run can write) has too little behind it.
MIN_OWN_JUDGMENTS = math.ceil(MIN_JUDGMENTS * (1 - MAX_USED_SHARE))
#: Each time-ordered fold needs at least this many judgments for the check to mean anything.
MIN_FOLD = 5


@dataclass
class Validation:
    """The tuning checked on time: searched on the earlier judgments, scored on the later ones.

    ``tuned`` is what ``cybmem tune --save`` saves: the weights checked here, never ones fitted to
    the judgments they are checked on.
    """

    earlier: int  # judgments tuned on
    later: int  # judgments scored on
    tuned: Weights  # the best weights on the earlier judgments
    tuned_earlier: float
    current_earlier: float
    tuned_later: float
    current_later: float
    interval: tuple[float, float] = (0.0, 0.0)  # 90% bootstrap interval of tuned - current on the later judgments
    # The same check with every judgment asked as text alone (no parent, no chat): None when no
    # judgment names a parent or chat, so the check above already is one.
    text_tuned_later: float | None = None
    text_current_later: float | None = None
    # With "used" judgments: tuned and current weights on the store's own history alone (every other
    # kind of judgment, all of them): None when no "used" judgment is in the set.
    history_judgments: int | None = None
    history_tests: int | None = None  # those of them that test the weights (0: none can be evaluated)
    history_tuned: float | None = None
    history_current: float | None = None

    @property
    def gain(self) -> float:
        return self.tuned_later - self.current_later

    def to_dict(self) -> dict[str, Any]:
        out = {"earlier": self.earlier, "later": self.later, "tuned": self.tuned.to_dict(),
               "tunedEarlier": round(self.tuned_earlier, 6), "currentEarlier": round(self.current_earlier, 6),
               "tunedLater": round(self.tuned_later, 6), "currentLater": round(self.current_later, 6),
               "interval": [round(self.interval[0], 6), round(self.interval[1], 6)]}
        if self.text_tuned_later is not None:
            out["textOnly"] = {"tunedLater": round(self.text_tuned_later, 6),
                               "currentLater": round(self.text_current_later or 0.0, 6)}
        if self.history_tests is not None:
            out["history"] = {"judgments": self.history_judgments or 0, "testsWeights": self.history_tests,
                              "tuned": None if self.history_tuned is None else round(self.history_tuned, 6),
                              "current": None if self.history_current is None else round(self.history_current, 6)}
        return out


def refusal_of(tests: int, judgments: int, v: Validation | None, current: Weights, *,
               keyword_held: str = "") -> str | None:
    """Why checked weights (``v.tuned``) must not be saved without --force (None: they may): the
    one guard of ``cybmem tune --save``, the automatic re-tune and the tuning widget's Save.

    Args:
        tests: judgments that test the weights (not answered by the parent dispatch shows first).
        judgments: evaluable judgments.
        v: the check on time (:func:`check_weights`); None: too few judgments for one.
        current: the weights in use.
        keyword_held: why w_kw was not searched (tune only).
    """
    if tests < MIN_JUDGMENTS:
        lineage = f" (the other {judgments - tests} are answered by the parent dispatch shows first)" \
            if tests < judgments else ""
        return (f"only {tests} judgment(s) test the weights{lineage}; at least {MIN_JUDGMENTS} are needed to "
                "tell tuned weights from noise, so the current weights stay")
    if v is not None and v.history_tests is not None and v.history_tests < MIN_OWN_JUDGMENTS:
        return (f"only {v.history_tests} of the store's own judgments (the ledger and the lineage, without what runs "
                f"said they used) test the weights; with \"used\" judgments among them at least {MIN_OWN_JUDGMENTS} "
                f"must, since used ones may be at most half of the {MIN_JUDGMENTS} a tuning needs, or the check on the "
                "store's own history has too little behind it")
    if keyword_held:
        return ("too few of these judgments test keywords, and a larger w_lin also lowers what the words count "
                f"for, which they cannot measure; give at least {MIN_KEYWORD_JUDGMENTS} judgments that test "
                "keywords (e.g. --judgments qrels.jsonl)")
    if v is None:
        return (f"too few judgments ({judgments}) to check the weights on later ones; "
                f"at least {2 * MIN_FOLD} are needed")
    if v.tuned == current:
        return f"no grid point beats the current weights on the earlier {v.earlier} judgments"
    if v.tuned.w_kw == 0:
        return "the tuned weights switch the keyword axis off (w_kw=0): the block would ignore what the task says"
    lo, hi = v.interval
    if not lo > 0:
        return (f"the weights tuned on the earlier {v.earlier} judgments do not beat the current ones on the later "
                f"{v.later} ({v.tuned_later:.4f} vs {v.current_later:.4f}; 90% interval of the difference "
                f"{lo:+.4f} to {hi:+.4f}): the grid would be fitting these judgments, not learning")
    if v.text_tuned_later is not None and v.text_tuned_later < (v.text_current_later or 0.0):
        return (f"asked as text alone (no parent, no chat), the later {v.later} judgments score lower with the tuned "
                f"weights ({v.text_tuned_later:.4f} vs {v.text_current_later:.4f}): lineage would be deciding them")
    if v.history_tuned is not None and v.history_tuned < (v.history_current or 0.0) - 1e-9:
        return (f"on the {v.history_judgments} judgments of the store's own history alone (the ledger and the lineage, "
                f"without what runs said they used) the tuned weights score lower ({v.history_tuned:.4f} vs "
                f"{v.history_current:.4f}): the runs' feedback would be steering them")
    return None


def bootstrap_interval(diff: np.ndarray, *, weights: np.ndarray | None = None, resamples: int = 2000,
                       level: float = 0.9, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the (weighted) mean of paired per-judgment differences."""
    n = len(diff)
    if n == 0:
        return (0.0, 0.0)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = (diff[idx] * w[idx]).sum(axis=1) / np.maximum(w[idx].sum(axis=1), 1e-12)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


class Split(Protocol):
    """What :func:`time_folds` splits: the grid's axis matrices (:class:`cybmem.retrieval.axis_matrices.AxisMatrices`)."""

    judgments: list[Judgment]

    @property
    def n(self) -> int: ...

    def subset(self, keep: Sequence[int]) -> "Split": ...


def time_folds(m: Split) -> "tuple[Split, Split] | None":
    """The judgments split in time: the earlier half by asOf and the later half (None: too few)."""
    if m.n < 2 * MIN_FOLD:
        return None
    order = sorted(range(m.n), key=lambda q: (m.judgments[q].as_of, q))
    half = m.n // 2
    return m.subset(order[:half]), m.subset(order[half:])


def kind_weights(judgments: Sequence[Judgment]) -> tuple[np.ndarray | None, int]:
    """Weights that make the judgments lineage decides count as much, together, as all the others.

    A derived judgment whose relevant runs include the dispatched run's parent ("parent",
    "issue+parent") is answered whatever the words say (dispatch shows the parent first);
    left to outnumber the others, such judgments would flatten every difference the others make.

    Returns:
        (weights, or None when there is one group only; the number of judgments that test keywords).
    """
    parent = np.array([not j.tests_weights for j in judgments], dtype=bool)
    others = int((~parent).sum())
    if not parent.any() or not others:
        return None, others
    w = np.where(parent, 0.5 / parent.sum(), 0.5 / others)
    return w.astype(np.float64), others
