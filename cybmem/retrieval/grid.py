"""The grid kernel of the weight search: any grid of weights scored at once against relevance
judgments (cybmem.retrieval.judgments), from each judgment's axis values over its candidate pool
(:mod:`cybmem.retrieval.axis_matrices`, which also says why the pools are exact), and the grid
search with its result (:func:`grid_search`, :class:`GridResult`).

For each (judgment, relevant run) pair: the pool records that beat it whatever the weights
are counted once; those it beats whatever the weights are dropped; the rest form a small
difference matrix ``D`` (records x axes). For a grid of weight vectors ``W`` (axes x G),
``D @ W > 0`` counts, at every grid point at once, the records ranked above the relevant run
(ties go to the higher row, as :func:`cybmem.retrieval.scoring.top_k` breaks them), which gives its rank.
Weight vectors that are multiples of each other rank identically and are evaluated once.

So the grid costs ``pairs x uncertain records x grid points`` multiply-adds per half-life, with
no re-scoring of the store (benchmarks/bench_tune.py has the figures).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import ValidationError
from ..progress import Progress
from .axis_matrices import AxisMatrices
from .judgments import METRICS, JudgmentSet, check_metric
from .validation import refusal_of
from .weights import Weights, check_range

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .validation import Validation

__all__ = ["DEFAULT_HALF_LIVES", "weight_vector", "evaluate", "comparison_frame", "GridResult", "grid_search"]

DEFAULT_HALF_LIVES = (1.0, 3.0, 7.0, 14.0, 30.0, 60.0, 120.0, 365.0)
_AXES = ("w_kw", "w_rec", "w_lin", "w_vec")
_BLOCK_ROWS = 512  # padded difference rows per block of pairs
_TILE_ELEMENTS = 1 << 17  # float32 elements per tile of D @ W (512 kB: stays in L2)


@dataclass
class _Pairs:
    """(judgment, relevant run) pairs with the pool entries whose order against them depends on W."""

    query: np.ndarray  # int64 judgment of each pair
    rel: np.ndarray  # int64 flat pool index of the relevant entry
    always: np.ndarray  # int64 entries ranked above it under every weighting
    ge_idx: np.ndarray  # int64 (pairs x Uge) flat pool indices that win ties (higher row); -1 = pad
    gt_idx: np.ndarray  # int64 (pairs x Ugt) flat pool indices that lose ties; -1 = pad


def _pairs(m: AxisMatrices) -> _Pairs:
    """Classify every pool entry against every relevant entry of its judgment (cached on ``m``)."""
    if m.pairs is None:
        m.pairs = _classify(m)
    return m.pairs


def _classify(m: AxisMatrices) -> _Pairs:
    # Recency is monotone in age, so comparisons on "newness" hold for every half-life.
    cols = [m.keyword, -m.age_ms, m.lineage] + ([m.vector] if m.vector is not None else [])
    feats = np.stack(cols, axis=1)
    q_list, r_list, always, ge_rows, gt_rows = [], [], [], [], []
    for q in range(m.n):
        s, e = int(m.offsets[q]), int(m.offsets[q + 1])
        f = feats[s:e]
        rows = m.rows[s:e]
        for ri in np.flatnonzero(m.relevant[s:e]):
            d = f - f[ri]
            higher = rows > rows[ri]
            ge0 = (d >= 0).all(axis=1)
            le0 = (d <= 0).all(axis=1)
            certain_win = ge0 & higher  # d.w >= 0 always, ties go to it
            never = le0 & ~higher  # d.w <= 0 always, ties go to the relevant run
            never[ri] = True
            n_always = int(certain_win.sum()) + int(m.pinned[q] >= 0)  # the parent shown first
            if n_always >= m.k:
                continue  # below the cut-off under every weighting: contributes 0
            unsure = ~(certain_win | never)
            q_list.append(q)
            r_list.append(s + ri)
            always.append(n_always)
            ge_rows.append(s + np.flatnonzero(unsure & higher))
            gt_rows.append(s + np.flatnonzero(unsure & ~higher))

    def pad(lists: list[np.ndarray]) -> np.ndarray:
        width = max((len(x) for x in lists), default=0)
        out = np.full((len(lists), width), -1, dtype=np.int64)
        for i, x in enumerate(lists):
            out[i, : len(x)] = x
        return out

    order = np.argsort([max(len(a), len(b)) for a, b in zip(ge_rows, gt_rows)], kind="stable")  # similar widths per block
    pick = lambda xs: [xs[i] for i in order]  # noqa: E731
    return _Pairs(query=np.asarray(pick(q_list), dtype=np.int64), rel=np.asarray(pick(r_list), dtype=np.int64),
                  always=np.asarray(pick(always), dtype=np.int64), ge_idx=pad(pick(ge_rows)), gt_idx=pad(pick(gt_rows)))


def _ranks_block(axes: np.ndarray, pairs: _Pairs, sl: slice, W: np.ndarray) -> np.ndarray:
    """Ranks (1-based) of the relevant entries of pairs[sl] at every column of W (axes x G).

    D @ W is computed in cache-sized tiles (a 2-D GEMM with 3-4 inner dims is bound by memory
    traffic, so tiles that stay in L2 run faster than one big product).
    """
    rel = axes[pairs.rel[sl]]  # (b, A)
    b, G = len(rel), W.shape[1]
    counts = np.zeros((b, G), dtype=np.uint16)
    for idx, strict in ((pairs.ge_idx[sl], False), (pairs.gt_idx[sl], True)):
        used = int((idx >= 0).sum(axis=1).max()) if idx.size else 0
        if not used:
            continue
        idx = idx[:, :used]
        pad = idx < 0
        d = axes[np.where(pad, 0, idx)] - rel[:, None, :]  # (b, U, A)
        d[pad] = -1.0  # d.w < 0 for any non-zero w: never counted
        d2 = d.reshape(b * used, -1)
        step = max(1, _TILE_ELEMENTS // (b * used))
        for g0 in range(0, G, step):
            s = d2 @ W[:, g0 : g0 + step]
            hit = (s > 0) if strict else (s >= 0)
            counts[:, g0 : g0 + step] += np.add.reduce(hit.view(np.uint8).reshape(b, used, -1), axis=1, dtype=np.uint16)
    ranks = counts.astype(np.int32)
    ranks += pairs.always[sl, None].astype(np.int32) + 1
    return ranks


def _blocks(pairs: _Pairs) -> list[slice]:
    """Consecutive pair ranges of at most _BLOCK_ROWS padded rows (pairs are sorted by width)."""
    widths = np.maximum((pairs.ge_idx >= 0).sum(axis=1), (pairs.gt_idx >= 0).sum(axis=1))
    out, start, n = [], 0, len(widths)
    while start < n:
        end = start + 1
        while end < n and (end + 1 - start) * max(int(widths[end]), 1) <= _BLOCK_ROWS:
            end += 1
        out.append(slice(start, end))
        start = end
    return out


def _metric_values(m: AxisMatrices, pairs: _Pairs, W_by_h: Sequence[tuple[float, np.ndarray]], metric: str,
                   k: int, bar: Progress | None = None, per_query: bool = False) -> list[np.ndarray]:
    """Mean metric over the judgments for each (half-life, W) block: a list of (G,) arrays
    (``per_query``: of (judgments, G) arrays)."""
    out = []
    n_rel = m.n_relevant.astype(np.float64)
    ideal = np.array([sum(1.0 / math.log2(i + 1) for i in range(1, min(int(c), k) + 1)) for c in m.n_relevant])
    disc = np.zeros(k + 1)
    disc[1:] = 1.0 / np.log2(np.arange(2, k + 2))
    for h, W in W_by_h:
        axes = m.axes(h)
        G = W.shape[1]
        acc = np.zeros((m.n, G), dtype=np.float64)
        for sl in _blocks(pairs):
            ranks = _ranks_block(axes, pairs, sl, W)
            inside = ranks <= k
            q = pairs.query[sl]
            if metric == "mrr":
                np.maximum.at(acc, q, np.where(inside, 1.0 / ranks, 0.0))
            elif metric == "recall":
                np.add.at(acc, q, inside / n_rel[q, None])
            else:
                np.add.at(acc, q, disc[np.minimum(ranks, k) * inside] / ideal[q, None])
            if bar is not None:
                bar.update(0)
        first = np.flatnonzero(m.pinned_relevant)  # a relevant parent: first under every weighting
        if len(first):
            if metric == "mrr":
                acc[first] = 1.0
            elif metric == "recall":
                acc[first] += 1.0 / n_rel[first, None]
            else:
                acc[first] += disc[1] / ideal[first, None]
        if per_query:
            out.append(acc)
        elif m.weights is None:
            out.append(acc.sum(axis=0) / max(m.n, 1))
        else:  # a weighted mean (see tune: kinds of judgments count alike)
            out.append((acc * m.weights[:, None]).sum(axis=0) / max(float(m.weights.sum()), 1e-12))
        if bar is not None:
            bar.update()
    return out


def weight_vector(w: Weights, with_vec: bool) -> list[float]:
    """The axis weights in the kernel's order (keyword, recency, lineage, and cosine ``with_vec``)."""
    return [w.w_kw, w.w_rec, w.w_lin] + ([w.w_vec] if with_vec else [])


def evaluate(m: AxisMatrices, weights: Weights, *, metric: str = "mrr", k: int | None = None,
             per_query: bool = False) -> float | np.ndarray:
    """The metric of one weighting over the judgments of ``m``.

    Args:
        m: from :func:`cybmem.retrieval.axis_matrices.axis_matrices`.
        weights: the weights (and half-life) to evaluate.
        metric: one of :data:`METRICS`.
        k: cut-off (default and maximum: ``m.k``).
        per_query: return each judgment's value instead of the mean.

    Returns:
        The mean metric in [0, 1] (0.0 when there is no judgment), or the per-judgment array.
    """
    k = m.k if k is None else k
    check_metric(metric, k)
    if k > m.k:
        raise ValidationError(f"k={k} is deeper than the pools were built for (k={m.k}); rebuild with axis_matrices(k={k})")
    if not m.n:
        return np.zeros(0) if per_query else 0.0
    W = np.asarray(weight_vector(weights, m.has_vectors), dtype=np.float32)[:, None]
    if not W.any():
        raise ValidationError("all weights are 0; give at least one axis a positive weight")
    vals = _metric_values(m, _pairs(m), [(weights.half_life_days, W)], metric, k, per_query=per_query)[0]
    return vals[:, 0] if per_query else float(vals[0])


def comparison_frame(m: AxisMatrices, weights: Mapping[str, Weights], *,
                     metrics: Sequence[str] = tuple(METRICS), k: int | None = None) -> "pd.DataFrame":
    """A before/after table: one row per named weighting, its weights and every metric.

    Args:
        m: from :func:`cybmem.retrieval.axis_matrices.axis_matrices`.
        weights: name -> weights, e.g. ``{"current": result.current, "best": result.best}``.
        metrics: metric names (:data:`METRICS`).
        k: cut-off (default ``m.k``).

    Returns:
        DataFrame indexed by name: w_kw, w_rec, w_lin, w_vec, half_life_days, then ``MRR@k``...
    """
    import pandas as pd

    k = m.k if k is None else k
    rows = {}
    for name, w in weights.items():
        row: dict[str, float] = dict(w.to_dict())
        for metric in metrics:
            row[f"{METRICS[metric]}@{k}"] = round(float(evaluate(m, w, metric=metric, k=k)), 4)
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


class ScoredOn(Protocol):
    """What a grid was scored on, as far as its result reads it (:class:`cybmem.retrieval.tuning.Bench`)."""

    judgment_set: JudgmentSet


@dataclass
class GridResult:
    """A weight search: the whole grid of metric values, the best point and the current one."""

    metric: str
    k: int
    axes: dict[str, np.ndarray]  # w_kw, w_rec, w_lin, w_vec, half_life_days -> searched values
    values: np.ndarray  # metric per grid point, shape = lengths of axes (NaN: all weights 0)
    best: Weights
    best_metric: float
    current: Weights
    current_metric: float
    judgments: int
    skipped: int
    points: int  # grid points
    evaluated: int  # distinct rankings actually evaluated (multiples of a weight vector rank alike)
    seconds: float  # grid search time (without the axis precompute)
    precompute_seconds: float = 0.0
    best_in_grid: bool = True  # False: no grid point beat the current weights, best = current
    source: str = ""  # where the judgments came from, for people
    kinds: dict[str, int] = field(default_factory=dict)  # evaluable judgments per kind
    keyword_held: str = ""  # why w_kw was not searched (empty: it was)
    vector_note: str = ""  # why w_vec was not searched although the store has vectors (empty: it was, or none)
    met_note: str = ""  # every judgment is met whatever the weights (empty: not so)
    validation: "Validation | None" = None  # the same search on the earlier judgments, scored on the later
    derived: bool = False  # the judgments were derived from the store
    as_of: int | None = None  # tuned as of this moment (None: everything)
    tests: int = 0  # judgments whose answer depends on the weights (not the pinned parent's)
    state: tuple[int, int, int] | None = None  # weights.json when tuning began (weights_state)
    records: int = 0  # runs the tuning saw
    bench: "ScoredOn | None" = field(default=None, repr=False)  # what tune() scored on, a tuning.Bench (None: a bare grid_search)

    @property
    def saves(self) -> Weights | None:
        """What ``--save`` writes: the weights tuned on the earlier judgments and checked on the
        later ones (None: too few judgments to check any)."""
        return self.validation.tuned if self.validation is not None else None

    @property
    def refusal(self) -> str | None:
        """Why ``cybmem tune --save`` will not save :attr:`saves` without --force (None: it will):
        :func:`refusal_of`, the guard every path that saves weights passes."""
        return refusal_of(self.tests, self.judgments, self.validation, self.current, keyword_held=self.keyword_held)

    @property
    def label(self) -> str:
        """e.g. ``MRR@10``."""
        return f"{METRICS[self.metric]}@{self.k}"

    @property
    def warnings(self) -> list[str]:
        """What reading the judgments skipped (e.g. malformed used.jsonl lines), one line each."""
        return list(self.bench.judgment_set.warnings) if self.bench is not None else []

    @property
    def left_out(self) -> dict[str, int]:
        """The "used" judgments left out, by why (clock, share) and used runs cut (capped)."""
        return dict(self.bench.judgment_set.left_out) if self.bench is not None else {}

    @property
    def improvement(self) -> float:
        return self.best_metric - self.current_metric

    def to_frame(self) -> "pd.DataFrame":
        """The grid as a long DataFrame: one row per point, a column per axis plus ``metric``."""
        import pandas as pd

        names = list(self.axes)
        mesh = np.meshgrid(*[self.axes[a] for a in names], indexing="ij")
        df = pd.DataFrame({a: g.ravel() for a, g in zip(names, mesh)})
        df["metric"] = self.values.ravel()
        return df

    def slice2d(self, x: str, y: str, *, reduce: str = "best") -> np.ndarray:
        """A 2-D view of the grid, shape (len(axes[y]), len(axes[x])).

        ``reduce="best"`` fixes every other axis at the best point's value (when the best point
        is the current one, at the nearest grid value); ``"max"`` takes the max over them.
        """
        names = list(self.axes)
        for a in (x, y):
            if a not in names:
                raise ValidationError(f"unknown grid axis {a!r}; choose from {', '.join(names)}")
        if x == y:
            raise ValidationError("x and y must be different grid axes")
        v = self.values
        if reduce == "max":
            other = tuple(i for i, a in enumerate(names) if a not in (x, y))
            with np.errstate(all="ignore"):
                v = np.nanmax(np.where(np.isnan(v), -np.inf, v), axis=other) if other else v
            v = np.where(np.isinf(v), np.nan, v)
            keep = [a for a in names if a in (x, y)]
        elif reduce == "best":
            best = self.best.to_dict()
            idx = []
            for a in names:
                if a in (x, y):
                    idx.append(slice(None))
                else:
                    idx.append(int(np.argmin(np.abs(self.axes[a] - best[a]))))
            v = v[tuple(idx)]
            keep = [a for a in names if a in (x, y)]
        else:
            raise ValidationError(f"reduce must be 'best' or 'max', not {reduce!r}")
        return v if keep == [y, x] else v.T

    def to_dict(self, *, grid: bool = False) -> dict[str, Any]:
        """JSON-ready summary (``grid=True`` adds every point)."""
        out: dict[str, Any] = {
            "kinds": dict(self.kinds), "keywordHeld": self.keyword_held or None,
            "vectorNote": self.vector_note or None, "metNote": self.met_note or None, "refusal": self.refusal,
            "validation": self.validation.to_dict() if self.validation is not None else None,
            "saves": self.saves.to_dict() if self.saves is not None else None, "asOf": self.as_of,
            "testsWeights": self.tests, "warnings": self.warnings,
            "usedLeftOut": self.left_out,
            "metric": self.metric, "k": self.k, "label": self.label,
            "current": {**self.current.to_dict(), "value": round(self.current_metric, 6)},
            "best": {**self.best.to_dict(), "value": round(self.best_metric, 6)},
            "improvement": round(self.improvement, 6), "bestInGrid": self.best_in_grid,
            "judgments": self.judgments, "skipped": self.skipped, "points": self.points, "evaluated": self.evaluated,
            "source": self.source, "seconds": round(self.seconds, 4), "precomputeSeconds": round(self.precompute_seconds, 4),
            "axes": {a: [float(x) for x in v] for a, v in self.axes.items()},
        }
        if grid:
            out["values"] = [None if math.isnan(x) else round(float(x), 6) for x in self.values.ravel()]
        return out


def _values(v: Iterable[float] | None, default: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(sorted(set(round(float(x), 6) for x in (default if v is None else v))), dtype=np.float64)
    if not len(arr):
        raise ValidationError(f"{name}: give at least one value")
    for x in arr:
        check_range(name, x)  # a weight of 1e300 would turn every score into NaN
    return arr


def grid_search(m: AxisMatrices, *, metric: str = "mrr", k: int | None = None, steps: int = 11,
                w_kw: Iterable[float] | None = None, w_rec: Iterable[float] | None = None,
                w_lin: Iterable[float] | None = None, w_vec: Iterable[float] | None = None,
                half_lives: Iterable[float] | None = None, current: Weights | None = None,
                progress: bool | None = None) -> GridResult:
    """Evaluate every combination of weight values and half-lives, reusing ``m``.

    Args:
        m: from :func:`cybmem.retrieval.axis_matrices.axis_matrices`.
        metric: one of :data:`METRICS`.
        k: cut-off (default and maximum: ``m.k``).
        steps: values per weight when a weight's values are not given: ``linspace(0, 1, steps)``.
        w_kw, w_rec, w_lin, w_vec: explicit values per weight. ``w_vec`` is searched only when
            ``m`` has a vector axis (otherwise it stays at the current value).
        half_lives: days; default :data:`DEFAULT_HALF_LIVES` plus the current half-life.
        current: the weights in use (default: :class:`~cybmem.retrieval.scoring.Weights` defaults).
        progress: progress bar on stderr (None: when stderr is a TTY).

    Returns:
        :class:`GridResult`. Among equal best points the one nearest the current weights
        (direction, then log half-life) wins; if no grid point beats the current weights, the
        current weights are reported as best (``best_in_grid=False``).
    """
    k = m.k if k is None else k
    check_metric(metric, k)
    if k > m.k:
        raise ValidationError(f"k={k} is deeper than the pools were built for (k={m.k}); rebuild with axis_matrices(k={k})")
    if steps < 2 and (w_kw is None or w_rec is None or w_lin is None):
        raise ValidationError(f"steps must be at least 2, got {steps}")
    current = current or Weights()
    lin = np.linspace(0.0, 1.0, steps).round(6).tolist() if steps >= 2 else [1.0]
    axes = {
        "w_kw": _values(w_kw, lin, "w_kw"),
        "w_rec": _values(w_rec, lin, "w_rec"),
        "w_lin": _values(w_lin, lin, "w_lin"),
        "w_vec": _values(w_vec, lin, "w_vec") if m.has_vectors else np.array([current.w_vec]),
        "half_life_days": _values(half_lives, sorted(set(DEFAULT_HALF_LIVES) | {current.half_life_days}), "half_life_days"),
    }
    t0 = time.perf_counter()
    wnames = list(_AXES) if m.has_vectors else list(_AXES[:3])
    mesh = np.stack(np.meshgrid(*[axes[a] for a in wnames], indexing="ij"), axis=-1).reshape(-1, len(wnames))
    sums = mesh.sum(axis=1)
    nonzero = sums > 0
    # Multiples of one weight vector rank identically: evaluate each direction once.
    directions = np.zeros_like(mesh)
    directions[nonzero] = mesh[nonzero] / sums[nonzero, None]
    # Grid values are rounded to 6 decimals, so equal directions agree to ~1e-6; 5 decimals merges them.
    uniq, inverse = np.unique(directions[nonzero].round(5), axis=0, return_inverse=True)
    W = np.ascontiguousarray(uniq.T, dtype=np.float32)
    hs = axes["half_life_days"]
    pairs = _pairs(m)
    bar = Progress(len(hs) + 1, f"grid {metric}@{k}", enabled=progress)
    per_h = _metric_values(m, pairs, [(float(h), W) for h in hs], metric, k, bar) if m.n else [np.zeros(W.shape[1]) for _ in hs]
    cur_w = np.asarray(weight_vector(current, m.has_vectors), dtype=np.float32)[:, None]
    if not cur_w.any():
        current_metric = float("nan")
    elif m.n:
        current_metric = float(_metric_values(m, pairs, [(current.half_life_days, cur_w)], metric, k)[0][0])
    else:
        current_metric = 0.0
    bar.update()
    bar.close()
    flat = np.full((len(hs), len(mesh)), np.nan)
    for i, vals in enumerate(per_h):
        flat[i, nonzero] = vals[inverse.ravel()]
    # values[..., h] with the weight axes first (and w_vec kept as an axis of length 1 without vectors).
    shape_w = [len(axes[a]) for a in wnames]
    vals = flat.reshape([len(hs)] + shape_w)
    vals = np.moveaxis(vals, 0, -1)
    if not m.has_vectors:
        vals = vals[:, :, :, None, :]
    seconds = time.perf_counter() - t0

    best_w, best_v, in_grid = current, current_metric, False
    if np.isfinite(vals).any():
        top = np.nanmax(vals)
        if math.isnan(current_metric) or top > current_metric + 1e-12:
            cand = np.argwhere(vals >= top - 1e-12)
            cur_dir = np.asarray(weight_vector(current, True))
            cur_dir = cur_dir / cur_dir.sum() if cur_dir.sum() > 0 else cur_dir
            names = list(axes)

            def dist(ix: np.ndarray) -> tuple[float, float]:
                p = np.array([axes[a][i] for a, i in zip(names, ix)])
                d = p[:4] / p[:4].sum()
                return (float(np.abs(d - cur_dir).sum()), abs(math.log(p[4] / current.half_life_days)))

            bi = min(cand, key=dist)
            best_w = dataclasses.replace(current, **{a: float(axes[a][i]) for a, i in zip(names, bi)})
            # Its exact value (the grid evaluated a representative of its direction).
            exact = _metric_values(m, pairs, [(best_w.half_life_days, np.asarray(weight_vector(best_w, m.has_vectors),
                                                                               dtype=np.float32)[:, None])], metric, k)
            best_v = float(exact[0][0])
            vals[tuple(bi)] = best_v
            in_grid = math.isnan(current_metric) or best_v > current_metric
            if not in_grid:
                best_w, best_v = current, current_metric
    return GridResult(metric=metric, k=k, axes=axes, values=vals, best=best_w, best_metric=float(best_v),
                      current=current, current_metric=current_metric, judgments=m.n, skipped=len(m.skipped),
                      points=int(vals.size), evaluated=int(W.shape[1] * len(hs)), seconds=seconds,
                      precompute_seconds=m.seconds, best_in_grid=in_grid)
