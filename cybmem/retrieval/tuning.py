"""The weight search behind ``cybmem tune``, ``eval``, the tuning widget and notebook: one
:class:`Bench` (a store's judgments made ready to score any weights on), :func:`tune` (judgments ->
axis values -> grid, checked on time) and the evidence a saved tuning keeps.

The parts it puts together have modules of their own: each judgment's axis values over its candidate
pool (:mod:`cybmem.retrieval.axis_matrices`: why the pools are exact), the grid kernel
(:mod:`cybmem.retrieval.grid`: how a whole grid of weights is scored at once), the check on
time and the one guard before saving (:mod:`cybmem.retrieval.validation`), and saving a project's
weights (:mod:`cybmem.retrieval.weights`). Their public names are importable from here too.
Re-tuning a store on its own, as its history grows, is an operation:
:mod:`cybmem.operations.retune`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..settings import Settings
from ..store.memory_store import MemoryStore
from ..store.loading import load_snapshot
from ..store.snapshot import Snapshot
from .axis_matrices import AxisMatrices, axis_matrices
from .grid import DEFAULT_HALF_LIVES, GridResult, comparison_frame, evaluate, grid_search, weight_vector
from .judgments import JUDGMENT_KINDS, METRICS, Judgment, JudgmentSet, check_metric, judgment_set, kinds_of
from .validation import (MIN_FOLD, MIN_JUDGMENTS, MIN_KEYWORD_JUDGMENTS, Validation, bootstrap_interval, kind_weights,
                         refusal_of, time_folds)
from .vectors import query_vectors
from .weights import Weights, load_weights, save_project_weights, weights_for, weights_state

__all__ = [
    "DEFAULT_HALF_LIVES",
    "AxisMatrices",
    "axis_matrices",
    "evaluate",
    "comparison_frame",
    "GridResult",
    "grid_search",
    "tune",
    "Validation",
    "time_folds",
    "kind_weights",
    "Evaluation",
    "evaluate_weights",
    "compare_weights",
    "Bench",
    "prepare",
    "check_weights",
    "check_evidence",
    "refusal_of",
    "save_project_weights",
    "evidence_of",
    "MIN_KEYWORD_JUDGMENTS",
    "MIN_FOLD",
    "MIN_JUDGMENTS",
    "bootstrap_interval",
    "weights_state",
]


def _without_lineage(js: Sequence[Judgment]) -> list[Judgment]:
    """The judgments asked as text alone: no parent, no chat session (what a task dispatched on its own gets)."""
    return [dataclasses.replace(j, parent_run_id=None, chat_session_id=None) for j in js]


@dataclass
class Bench:
    """A store's judgments made ready to score any weights on: what ``cybmem tune`` and ``eval``,
    the tuning widget and the notebook share (:func:`prepare`), so that each reports the same score
    for the same weights: the same judgments (:func:`cybmem.retrieval.judgments.judgment_set`), the
    same mean (the kinds balanced by :func:`kind_weights`), the same split in time (:func:`time_folds`)."""

    snapshot: Snapshot
    judgment_set: JudgmentSet
    matrices: AxisMatrices  # the evaluable judgments, with their weights in the mean
    text: AxisMatrices | None  # the same asked as text alone (None: no judgment names a parent or chat)
    history: AxisMatrices | None  # with "used" judgments: the store's other judgments alone (else None)
    own_tests: int | None  # with "used" judgments: those of the store's own that test the weights (else None)
    keyword_tests: int  # judgments that test the weights (not answered by the parent shown first)
    vector_note: str  # why w_vec is not searched although the store has vectors ("" otherwise)
    as_of: int | None
    state: tuple[int, int, int] | None  # weights.json when the bench was made (weights_state)
    records: int  # runs that existed at as_of

    @functools.cached_property
    def folds(self) -> tuple[AxisMatrices, AxisMatrices] | None:
        """The judgments split in time (:func:`time_folds`; None: too few)."""
        return time_folds(self.matrices)

    @property
    def kinds(self) -> dict[str, int]:
        """Evaluable judgments per kind."""
        out: dict[str, int] = {}
        for j in self.matrices.judgments:
            out[j.kind or "given"] = out.get(j.kind or "given", 0) + 1
        return out

    def score(self, weights: Weights, *, metric: str = "mrr", k: int | None = None) -> dict[str, float | None]:
        """``weights``' metric on all judgments and on the earlier and later halves (None: too few to split)."""
        folds = self.folds
        return {"all": float(evaluate(self.matrices, weights, metric=metric, k=k)),
                "earlier": float(evaluate(folds[0], weights, metric=metric, k=k)) if folds else None,
                "later": float(evaluate(folds[1], weights, metric=metric, k=k)) if folds else None}


def prepare(store: MemoryStore | Snapshot, *, judgments: Sequence[Judgment] | str | Path | None = None,
            kinds: Sequence[str] = JUDGMENT_KINDS, as_of: int | None = None, k: int = 10,
            settings: Settings, vectors: bool = True, progress: bool | None = None) -> Bench:
    """The judgments (:func:`cybmem.retrieval.judgments.judgment_set`: a list, a file the user
    names, or None for those the store implies) and their axis values, once.

    Args:
        vectors: embed the queries when the store has vectors (False: score without the vector axis).

    Raises:
        ValidationError: no judgment, or none that can be evaluated against the store.
    """
    snap = store if isinstance(store, Snapshot) else load_snapshot(store)
    state = weights_state(snap.store) if snap.store is not None else None
    jset = judgment_set(snap, judgments, kinds=kinds, as_of=as_of)
    js = jset.judgments
    if jset.derived and not js:
        when = f" as of {as_of}" if as_of is not None else ""
        wanted, why = kinds_of(kinds), []
        if set(wanted) - {"used"}:
            why.append("no run raised, resolved or reopened an issue that earlier runs carried, or was dispatched "
                       "by a finished parent")
        if "used" in wanted:
            why.append("no written run used an earlier run it was shown: used.jsonl notes that for runs "
                       "dispatched through `cybmem inject` or served by `cybmem mcp`")
        raise ValidationError(f"project {snap.store.slug} implies no judgments yet{when} ({'; '.join(why)}); pass a "
                              "judgments file with --judgments")
    if not jset.derived and as_of is not None:
        js = jset.judgments = [j for j in js if j.as_of <= as_of]
        if not js:
            raise ValidationError(f"no judgment was asked by {as_of} (--as-of); give a later moment")
    qv, vector_note, model = query_vectors(snap, js, settings, progress) if vectors else (None, "", None)
    m = axis_matrices(snap, js, k=k, query_vectors=qv, model=model, progress=progress)
    if not m.n:
        reasons = sorted({why for _, why in m.skipped})
        raise ValidationError(f"none of the {len(js)} judgments can be evaluated ({'; '.join(reasons)}); "
                              "check their asOf and relevant run ids against this project")
    m.weights, keyword_tests = kind_weights(m.judgments)
    text = None
    if any(j.parent_run_id or j.chat_session_id for j in m.judgments):
        text = axis_matrices(snap, _without_lineage(m.judgments), k=k, query_vectors=qv, model=model, progress=progress)
        text.weights = m.weights
        if text.n != m.n:  # a judgment answerable only through its parent: compare like with like
            text = None
    history, own_tests = None, None
    if any(j.kind == "used" for j in m.judgments):
        own_tests = 0
        if jset.history:
            history = axis_matrices(snap, jset.history, k=k, query_vectors=qv, model=model, progress=progress)
            history.weights, own_tests = kind_weights(history.judgments)
            history = history if history.n else None
    records = int(snap.candidates(as_of).sum()) if snap.n else 0
    return Bench(snap, jset, m, text, history, own_tests, keyword_tests, vector_note, as_of, state, records)


def check_weights(bench: Bench, weights: Weights, current: Weights, *, metric: str = "mrr", k: int | None = None,
                  earlier: float | None = None) -> Validation | None:
    """Weights chosen on the earlier judgments (the grid's, or set by hand) checked against the
    current ones on the later judgments, as text alone, and on the store's own history alone
    (None: too few judgments to split in time). :func:`refusal_of` reads the answer.

    Args:
        earlier: their metric on the earlier judgments when already known (the grid's).
    """
    folds = bench.folds
    if folds is None:
        return None
    early, late = folds
    cur_ok = any(weight_vector(current, True))
    per_t = evaluate(late, weights, metric=metric, k=k, per_query=True)
    per_c = evaluate(late, current, metric=metric, k=k, per_query=True) if cur_ok else np.zeros(late.n)
    mean = lambda v: float((v * late.weights).sum() / late.weights.sum()) if late.weights is not None else float(v.mean())  # noqa: E731
    v = Validation(earlier=early.n, later=late.n, tuned=weights,
                   tuned_earlier=float(evaluate(early, weights, metric=metric, k=k)) if earlier is None else earlier,
                   current_earlier=float(evaluate(early, current, metric=metric, k=k)) if cur_ok else 0.0,
                   tuned_later=mean(per_t), current_later=mean(per_c),
                   interval=bootstrap_interval(per_t - per_c, weights=late.weights))
    if bench.text is not None:
        t_late = time_folds(bench.text)[1]
        v.text_tuned_later = float(evaluate(t_late, weights, metric=metric, k=k))
        v.text_current_later = float(evaluate(t_late, current, metric=metric, k=k)) if cur_ok else 0.0
    v.history_tests = bench.own_tests
    if bench.history is not None:
        v.history_judgments = bench.history.n
        v.history_tuned = float(evaluate(bench.history, weights, metric=metric, k=k))
        v.history_current = float(evaluate(bench.history, current, metric=metric, k=k)) if cur_ok else 0.0
    return v


def _validate(bench: Bench, axes: dict[str, Any], metric: str, k: int, current: Weights,
              progress: bool | None = False) -> Validation | None:
    """Search on the earlier half of the judgments (by asOf), check the best there (:func:`check_weights`)."""
    if bench.folds is None:
        return None
    g = grid_search(bench.folds[0], metric=metric, k=k, progress=progress, **axes)
    return check_weights(bench, g.best, current, metric=metric, k=k, earlier=g.best_metric)


def tune(store: MemoryStore | Snapshot, *, judgments: Sequence[Judgment] | str | Path | None = None,
         as_of: int | None = None, metric: str = "mrr", k: int = 10, steps: int = 11,
         half_lives: Iterable[float] | None = None, w_kw: Iterable[float] | None = None,
         w_rec: Iterable[float] | None = None, w_lin: Iterable[float] | None = None,
         w_vec: Iterable[float] | None = None, current: Weights | None = None, settings: Settings,
         kinds: Sequence[str] = JUDGMENT_KINDS, hold_few: bool = True, topk: int | None = None,
         progress: bool | None = None, bench: Bench | None = None) -> GridResult:
    """Search the weights for a project: judgments -> axis values -> grid, checked on time.

    Args:
        store: the project (or its snapshot).
        judgments: a list, a judgments JSONL path, or None to derive them from the store
            (:func:`cybmem.retrieval.judgments.judgment_set` with ``kinds``).
        as_of: tune as of this moment (epoch ms): only the runs, ledger events and judgments that
            existed then, so that the result can be checked on what came after.
        metric, k, steps, half_lives, w_kw, w_rec, w_lin, w_vec: see :func:`grid_search`.
        current: the weights to compare with (default: what production reads for the project).
        hold_few: with fewer than MIN_KEYWORD_JUDGMENTS judgments that test keywords, search w_lin only
            (False: search every axis anyway).
        topk: accepted for callers of earlier versions; the block has no floor to learn any more
            (its evidence is judged per run: cybmem.retrieval.evidence).
        settings: for the production weights and the embeddings.
        progress: progress bars on stderr (None: when stderr is a TTY).
        bench: judgments already prepared (:func:`prepare`; ``store``, ``judgments``, ``as_of``
            and ``kinds`` are then not read again).

    Returns:
        :class:`GridResult`: the best weights on all judgments (:attr:`~GridResult.best`), the
        weights tuned on the earlier half and scored on the later half (:attr:`~GridResult.validation`,
        what ``--save`` saves) and why they would not be saved (:attr:`~GridResult.refusal`).
    """
    check_metric(metric, k)
    if bench is None:
        bench = prepare(store, judgments=judgments, kinds=kinds, as_of=as_of, k=k, settings=settings, progress=progress)
    snap, m, keyword_tests = bench.snapshot, bench.matrices, bench.keyword_tests
    if current is None:
        current = weights_for(settings, snap.store).weights
    held = ""
    if hold_few and keyword_tests < MIN_KEYWORD_JUDGMENTS and all(x is None for x in (w_kw, w_rec, half_lives)):
        # Judgments that lineage decides say nothing about words or time: they tune w_lin only.
        w_kw, w_rec, half_lives = [current.w_kw], [current.w_rec], [current.half_life_days]
        why = ("the others include the run's parent, which dispatch shows first whatever the words say"
               if keyword_tests < m.n else f"fewer than {MIN_KEYWORD_JUDGMENTS} would tune them to noise")
        held = (f"only {keyword_tests} judgment(s) test keywords ({why}), so only w_lin is searched; w_kw, "
                f"w_rec and the half-life stay at {current.w_kw:g}, {current.w_rec:g} and "
                f"{current.half_life_days:g} days (--all-weights searches them anyway)")
    axes = dict(steps=steps, w_kw=w_kw, w_rec=w_rec, w_lin=w_lin, w_vec=w_vec, half_lives=half_lives, current=current)
    result = grid_search(m, metric=metric, k=k, progress=progress, **axes)
    result.bench = bench
    result.source = bench.judgment_set.source
    result.derived = bench.judgment_set.derived
    result.as_of = bench.as_of
    result.keyword_held = held
    result.vector_note = bench.vector_note
    result.tests = keyword_tests
    result.state = bench.state
    result.records = bench.records
    met = m.pinned_relevant & ((m.n_relevant == 1) | (metric == "mrr"))  # the parent shown first is all they ask
    if m.n and met.all():
        result.met_note = ("every judgment is met whatever the weights (each asks for the run's parent, which dispatch "
                           "shows first), so there is nothing to tune here; tune on judgments of your own "
                           "(--judgments, e.g. qrels.jsonl or ids from `cybmem search --json`)")
    result.kinds = bench.kinds
    # Tune for the dispatch runs will get: judgments that name a parent or chat are also checked as text alone.
    result.validation = _validate(bench, axes, metric, k, current, progress)
    return result


@dataclass
class Evaluation:
    """Fixed weights scored on judgments: overall, per kind and on the earlier / later halves."""

    metric: str
    k: int
    judgments: int
    skipped: int
    source: str
    rows: dict[str, dict[str, Any]]  # name -> {"weights", "all", "earlier", "later", "kinds": {kind: value}}
    warnings: list[str] = field(default_factory=list)  # e.g. malformed used.jsonl lines skipped

    @property
    def label(self) -> str:
        return f"{METRICS[self.metric]}@{self.k}"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "k": self.k, "label": self.label, "judgments": self.judgments,
                "skipped": self.skipped, "source": self.source, "warnings": self.warnings,
                "rows": {n: {**r, "weights": r["weights"].to_dict()} for n, r in self.rows.items()}}


def evaluate_weights(store: MemoryStore | Snapshot | Bench, weights: Mapping[str, Weights], *, settings: Settings,
                     judgments: Sequence[Judgment] | str | Path | None = None, metric: str = "mrr", k: int = 10,
                     kinds: Sequence[str] = JUDGMENT_KINDS, progress: bool | None = None) -> Evaluation:
    """Score fixed weights on judgments (what ``cybmem eval`` prints).

    Args:
        store: the project (or its snapshot, or judgments already prepared: :func:`prepare`).
        weights: name -> weights to score, e.g. ``{"current": ..., "given": ...}``.
        settings: the embeddings, for the queries' vectors when a weighting has a vector axis.
        judgments: a list, a JSONL path, or None to derive them from the store.
        metric, k: the metric and its cut-off.

    Returns:
        :class:`Evaluation`: each weighting's metric over all judgments, per kind, and on the
        earlier and the later half of the judgments in time: the numbers ``cybmem tune`` reports
        for the same weights (the same judgments, mean and split: :class:`Bench`).
    """
    check_metric(metric, k)
    for name, w in weights.items():
        if not any(weight_vector(w, True)):
            raise ValidationError(f"weights {name!r} are all 0; give at least one axis a positive weight")
    bench = store if isinstance(store, Bench) else prepare(
        store, judgments=judgments, kinds=kinds, k=k, settings=settings,
        vectors=any(w.w_vec > 0 for w in weights.values()), progress=progress)
    m = bench.matrices
    by_kind: dict[str, list[int]] = {}
    for q, j in enumerate(m.judgments):
        by_kind.setdefault(j.kind or "given", []).append(q)
    subsets = {kind: m.subset(qs) for kind, qs in by_kind.items()} if len(by_kind) > 1 else {}
    rows: dict[str, dict[str, Any]] = {}
    for name, w in weights.items():
        row: dict[str, Any] = {"weights": w, **bench.score(w, metric=metric, k=k)}
        row["kinds"] = {kind: float(evaluate(sub, w, metric=metric, k=k)) for kind, sub in subsets.items()}
        rows[name] = row
    return Evaluation(metric=metric, k=k, judgments=m.n, skipped=len(m.skipped), source=bench.judgment_set.source,
                      rows=rows, warnings=list(bench.judgment_set.warnings))


def compare_weights(store: MemoryStore, settings: Settings, *, given: Mapping[str, float] | None = None,
                    weights_file: str | Path | None = None, **kwargs: Any) -> Evaluation:
    """The weights production uses for ``store`` ("current") beside the ones given ("given": read
    from ``weights_file`` and/or set in ``given``, the others production's), scored on judgments
    by :func:`evaluate_weights` with ``kwargs`` (what ``cybmem eval`` prints)."""
    current = weights_for(settings, store).weights
    candidates = {"current": current}
    if weights_file is not None or given:
        base = load_weights([weights_file]).weights if weights_file is not None else current
        candidates["given"] = Weights.from_dict(dict(given or {}), base=base)
    return evaluate_weights(store, candidates, settings=settings, **kwargs)


def evidence_of(result: GridResult, *, forced: bool = False) -> dict[str, Any]:
    """What weights.json keeps of the tuning that wrote it (under "tuned"): the judgments used (per
    kind, and the "used" ones left out), the metric before and after on the later half, its bootstrap
    interval, when, and what was saved (``forced``: saved with --force, and what it overrode)."""
    v = result.validation
    saved = (f"tuned on the earlier {v.earlier} judgments, checked on the later {v.later}" if v is not None else
             "the best on all judgments (too few to check on later ones; saved with --force)")
    if forced and v is not None and result.refusal:
        saved += f"; saved with --force although {result.refusal}"
    out = _evidence(result.bench, v, result.metric, result.k, saved, tests=result.tests, judgments=result.judgments,
                    kinds=result.kinds, source=result.source, derived=result.derived, as_of=result.as_of,
                    records=result.records)
    return out


def _evidence(bench: Bench | None, v: Validation | None, metric: str, k: int, saved: str, *, tests: int,
              judgments: int, kinds: Mapping[str, int], source: str, derived: bool, as_of: int | None,
              records: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "at": int(time.time() * 1000), "asOf": as_of, "records": records,
        "source": "derived" if derived else source.removeprefix("from "),
        "kinds": dict(kinds), "judgments": judgments, "testsWeights": tests,
        "metric": metric, "k": k, "label": f"{METRICS[metric]}@{k}", "saved": saved,
    }
    if bench is not None and bench.judgment_set.left_out:
        out["usedLeftOut"] = dict(sorted(bench.judgment_set.left_out.items()))
    if v is not None:
        out["earlier"] = {"judgments": v.earlier, "before": round(v.current_earlier, 6), "after": round(v.tuned_earlier, 6)}
        out["later"] = {"judgments": v.later, "before": round(v.current_later, 6), "after": round(v.tuned_later, 6),
                        "interval90": [round(v.interval[0], 6), round(v.interval[1], 6)]}
        if v.text_tuned_later is not None:
            out["later"]["textOnly"] = {"before": round(v.text_current_later or 0.0, 6), "after": round(v.text_tuned_later, 6)}
        if v.history_tuned is not None:
            out["history"] = {"judgments": v.history_judgments, "testsWeights": v.history_tests,
                              "before": round(v.history_current or 0.0, 6), "after": round(v.history_tuned, 6)}
    return out


def check_evidence(bench: Bench, v: Validation | None, *, metric: str, k: int, saved: str) -> dict[str, Any]:
    """The evidence of weights checked on ``bench`` by :func:`check_weights` (the tuning widget's Save),
    in the shape :func:`evidence_of` gives ``cybmem tune --save``'s."""
    jset = bench.judgment_set
    return _evidence(bench, v, metric, k, saved, tests=bench.keyword_tests, judgments=bench.matrices.n,
                     kinds=bench.kinds, source=jset.source, derived=jset.derived, as_of=bench.as_of,
                     records=bench.records)
