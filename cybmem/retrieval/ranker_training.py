"""Training the learned ranker (LambdaMART with LightGBM) and its leave-one-history-out table.

Needs the ``train`` extra (LightGBM); nothing on the dispatch path imports this module.

The protocol (benchmarks/bench_fit.py's): every judged query of a history (its qrels.jsonl, lines
merged per queryRunId) is ranked as of its moment against the runs that had ended then, its own
run left out, from its text alone (no parent). The first stage is the linear formula at the
default weights; the second reorders the pool it finds (:func:`cybmem.retrieval.features.pool`)
by the trees. A relevant run outside the pool is a miss.

Histories weigh the same (each query's weight is one over its history's query count), and every
choice (the parameters in :data:`PARAMS`) is judged by leaving one history out: trained on the
others, scored on it (:func:`leave_one_out`). The shipped model is trained on them all
(:func:`train`), with its provenance.

The issue-ledger features (:data:`LEDGER_FEATURES`, :func:`ledger_features`; ``history(...,
ledger=True)``) are an option of the evaluation only, never of the shipped model: in the judged
corpora a judgment means "both runs name the same ticket", so whether a run raised a ticket says
how the labels were made more than what is relevant (issue 39). benchmarks/bench_ledger.py
reports the leave-one-out table with and without them.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..progress import Progress
from ..store.snapshot import Snapshot
from ..store.tokens import tokenize
from .features import FEATURES, pool_features
from .judgments import Judgment, load_judgments
from .ranker import order_of
from .scoring import lineage_affinity, score, top_k
from .search import dispatch_context
from .trees import pack
from .weights import Weights

__all__ = ["PARAMS", "History", "history", "fit", "leave_one_out", "train", "K", "LEDGER_FEATURES", "Ledger",
           "ledger_features"]

K = 10  # MRR@K
HIT_K = 8  # recall: a relevant run in the top HIT_K (the block's runs in full)

#: LightGBM parameters, chosen by the leave-one-history-out mean (benchmarks/RESULTS.md).
PARAMS: dict[str, Any] = {
    "objective": "lambdarank", "metric": "ndcg", "ndcg_eval_at": [10], "lambdarank_truncation_level": 20,
    "num_leaves": 7, "learning_rate": 0.03, "min_data_in_leaf": 400, "feature_fraction": 0.8,
    "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0, "verbose": -1, "seed": 7,
    "num_threads": 2, "deterministic": True, "force_row_wise": True,
}
ROUNDS = 500


@dataclass
class History:
    """One history's judged queries: the pools' features and labels, and the first stage's figures."""

    name: str
    records: int
    X: np.ndarray  # float32 (pool entries, features)
    y: np.ndarray  # int: 1 relevant
    offsets: np.ndarray  # int64 (queries + 1,)
    first_rank: np.ndarray  # int64 per entry: its first-stage rank (0 best)
    linear_rr: np.ndarray  # per query: the first stage's reciprocal rank at K (0: none in the top K)
    linear_hit: np.ndarray  # per query: a relevant run in the first stage's top HIT_K
    rows: np.ndarray | None = None  # int64 per entry: its row of the snapshot
    features: tuple[str, ...] = FEATURES  # X's columns (FEATURES, then LEDGER_FEATURES with ledger=True)
    skipped: int = 0
    seconds: float = 0.0

    @property
    def queries(self) -> int:
        return len(self.offsets) - 1


#: The issue-ledger features of a (task, candidate), as of the task's moment (evaluation only).
LEDGER_FEATURES: tuple[str, ...] = ("ledger_opened_open", "ledger_resolved", "ledger_opened_log", "ledger_open_match")


@dataclass
class Ledger:
    """A snapshot's issue events by the run that made them (:meth:`of`), in time order (ties: the
    ledger's line order), for :func:`ledger_features` as of any moment."""

    at: list[int]  # per event: epoch ms
    kind: list[str]  # opened, resolved, reopened, ...
    issue: list[int]  # per event: the issue's code
    by_row: dict[int, list[int]]  # record row -> the events it made
    of_issue: list[list[int]]  # issue code -> its events
    words: list[set[str]]  # per event: the tokens of its title and detail

    @classmethod
    def of(cls, snap: Snapshot) -> "Ledger":
        ev = snap.events
        n = ev.num_rows
        at = [x or 0 for x in ev.column("at").cast("int64").to_pylist()] if n else []  # epoch ms
        line = ev.column("line").to_pylist() if n and "line" in ev.column_names else list(range(n))
        order = sorted(range(n), key=lambda i: (at[i], line[i] if line[i] is not None else i))
        cols = {c: ev.column(c).to_pylist() for c in ("issueId", "event", "byRunId", "title", "detail")} if n else {}
        row_of = {rid: i for i, rid in enumerate(snap.records.column("runId").to_pylist())}
        code: dict[str, int] = {}
        led = cls([], [], [], {}, [], [])
        for k, i in enumerate(order):
            iid = cols["issueId"][i]
            c = code.setdefault(iid, len(code))
            if c == len(led.of_issue):
                led.of_issue.append([])
            led.at.append(at[i])
            led.kind.append(cols["event"][i] or "")
            led.issue.append(c)
            led.of_issue[c].append(k)
            led.words.append(set(tokenize(f"{cols['title'][i] or ''}\n{cols['detail'][i] or ''}")))
            row = row_of.get(cols["byRunId"][i] or "")
            if row is not None:
                led.by_row.setdefault(row, []).append(k)
        return led

    def is_open(self, issue: int, as_of: int) -> bool:
        """The issue's state after its events up to ``as_of``: open unless the last opening or
        closing one resolved it."""
        state = False
        for e in self.of_issue[issue]:
            if self.at[e] > as_of:
                break
            if self.kind[e] in ("opened", "reopened"):
                state = True
            elif self.kind[e] == "resolved":
                state = False
        return state


def ledger_features(led: Ledger, tokens: Sequence[str], rows: np.ndarray, as_of: int) -> np.ndarray:
    """:data:`LEDGER_FEATURES` of each candidate row (rows x 4) for a task of ``tokens`` as of
    ``as_of`` (events after it unseen): the run opened an issue still open then; it resolved one;
    how many it opened (log); the largest share of the task's distinct terms that the text of an
    issue it opened and still open holds (the task's words matching an open issue it raised)."""
    out = np.zeros((len(rows), len(LEDGER_FEATURES)), np.float32)
    terms = set(tokens)
    for j, row in enumerate(np.asarray(rows).tolist()):
        opened, resolved, still_open, match = 0, 0.0, 0.0, 0.0
        for e in led.by_row.get(row, ()):
            if led.at[e] > as_of:
                continue
            if led.kind[e] == "resolved":
                resolved = 1.0
            elif led.kind[e] == "opened":
                opened += 1
                if led.is_open(led.issue[e], as_of):
                    still_open = 1.0
                    if terms:
                        match = max(match, len(terms & led.words[e]) / len(terms))
        out[j] = (still_open, resolved, math.log1p(opened), match)
    return out


def history(snap: Snapshot, judgments: Sequence[Judgment], *, name: str = "", weights: Weights | None = None,
            progress: bool | None = None, ledger: bool = False) -> History:
    """The pools of ``judgments`` (text only: parents dropped) over ``snap`` as the ranker sees them;
    ``ledger``: with :data:`LEDGER_FEATURES` after :data:`FEATURES` (evaluation only)."""
    t0 = time.perf_counter()
    led = Ledger.of(snap) if ledger else None
    weights = weights or Weights()
    ids = snap.records.column("runId").to_pylist()
    row_of = {rid: i for i, rid in enumerate(ids)}
    ended = snap.ended_ms()
    corrected = snap.supersession()
    tasks = snap.records.column("task").to_pylist()
    Xs, ys, ranks, rr, hit, pool_rows = [], [], [], [], [], []
    skipped = 0
    bar = Progress(len(judgments), f"features {name}".strip(), enabled=progress)
    for j in judgments:
        bar.update()
        mask = snap.candidates(j.as_of)
        own = row_of.get(j.query_run_id) if j.query_run_id else None
        if own is not None:
            mask[own] = False
        rel = set()
        for rid in j.relevant:
            seen: set[str] = set()
            while rid in row_of and not mask[row_of[rid]] and rid in corrected and rid not in seen:
                seen.add(rid)
                rid = corrected[rid]
            if rid in row_of and mask[row_of[rid]]:
                rel.add(row_of[rid])
        if not rel:
            skipped += 1
            continue
        idx = np.flatnonzero(mask)
        tokens = tokenize(j.query)
        kw_all = snap.index.scores(tokens)
        lin_all = lineage_affinity(*snap.lineage_columns(), dispatch_context(snap, mask, None, None), lookup=snap.run_lookup())
        kw_raw = kw_all[idx]
        scored = score(keyword_raw=kw_raw, ended_at_ms=ended[idx], now_ms=j.as_of, lineage=lin_all[idx], vector_cos=None,
                       weights=weights)
        top = idx[top_k(scored.total, max(K, HIT_K))]
        is_rel = np.isin(top, list(rel))
        first = np.flatnonzero(is_rel[:K])
        rr.append(1.0 / (first[0] + 1) if len(first) else 0.0)
        hit.append(bool(is_rel[:HIT_K].any()))
        local, X, rank = pool_features(snap, j.query, idx, scored, kw_raw, j.as_of, tokens=tokens, tasks=tasks)
        rows = idx[local]
        if led is not None:
            X = np.hstack([X, ledger_features(led, tokens, rows, j.as_of)])
        pool_rows.append(rows)
        Xs.append(X)
        ys.append(np.isin(rows, list(rel)).astype(np.int32))
        ranks.append(rank)
    bar.close()
    offsets = np.zeros(len(Xs) + 1, np.int64)
    np.cumsum([len(x) for x in Xs], out=offsets[1:])
    cat = (lambda parts, dt, width=None: np.concatenate(parts).astype(dt) if parts  # noqa: E731
           else np.zeros((0, width) if width else 0, dt))
    names = FEATURES + (LEDGER_FEATURES if ledger else ())
    return History(name=name, records=snap.n, X=cat(Xs, np.float32, len(names)), y=cat(ys, np.int32), offsets=offsets,
                   first_rank=cat(ranks, np.int64), linear_rr=np.asarray(rr), linear_hit=np.asarray(hit, bool),
                   rows=cat(pool_rows, np.int64), features=names, skipped=skipped, seconds=time.perf_counter() - t0)


def history_of_root(root: Path, *, progress: bool | None = None, ledger: bool = False) -> History:
    """:func:`history` of a memory root's first project and its qrels.jsonl."""
    from ..settings import Settings
    from ..store.loading import load_snapshot
    from ..store.memory_store import MemoryStore
    import orjson

    root = Path(root)
    slug = next(iter(orjson.loads((root / "projects.json").read_bytes())))
    snap = load_snapshot(MemoryStore(root, slug))
    del Settings
    js = [dataclasses.replace(j, parent_run_id=None, chat_session_id=None) for j in load_judgments(root / "qrels.jsonl")]
    return history(snap, js, name=root.name, progress=progress, ledger=ledger)


def _query_weights(hs: Sequence[History]) -> list[np.ndarray]:
    """Each entry's weight: one over its history's query count (histories weigh the same)."""
    return [np.repeat(np.full(h.queries, 1.0 / max(h.queries, 1)), np.diff(h.offsets)) for h in hs]


def fit(hs: Sequence[History], *, params: dict[str, Any] | None = None, rounds: int = ROUNDS):
    """A LightGBM booster trained on ``hs`` (queries without a relevant run in the pool left out)."""
    import lightgbm as lgb

    params = dict(PARAMS, **(params or {}))
    X, y, w, groups = [], [], [], []
    for h, wt in zip(hs, _query_weights(hs)):
        for q in range(h.queries):
            s, e = h.offsets[q], h.offsets[q + 1]
            if h.y[s:e].any():
                X.append(h.X[s:e])
                y.append(h.y[s:e])
                w.append(wt[s:e] * sum(x.queries for x in hs) / len(hs))
                groups.append(e - s)
    data = lgb.Dataset(np.concatenate(X), np.concatenate(y), weight=np.concatenate(w), group=groups,
                       feature_name=list(hs[0].features), free_raw_data=False)
    return lgb.train(params, data, num_boost_round=rounds)


def scores_of(h: History, predict) -> tuple[np.ndarray, np.ndarray]:
    """MRR@K terms and top-HIT_K hits of each query of ``h`` when its pool is ordered by ``predict(X)``
    as dispatch orders it (:func:`cybmem.retrieval.ranker.order_of`: what shares something with the
    query first; ties: the first stage's order)."""
    s = np.asarray(predict(h.X), np.float64) if len(h.X) else np.zeros(0)
    rr = np.zeros(h.queries)
    hit = np.zeros(h.queries, bool)
    for q in range(h.queries):
        a, b = h.offsets[q], h.offsets[q + 1]
        order = order_of(s[a:b], h.X[a:b], h.first_rank[a:b])
        rel = h.y[a:b][order]
        first = np.flatnonzero(rel[:K])
        rr[q] = 1.0 / (first[0] + 1) if len(first) else 0.0
        hit[q] = bool(rel[:HIT_K].any())
    return rr, hit


@dataclass
class LooRow:
    name: str
    records: int
    queries: int
    linear_mrr: float
    learned_mrr: float
    linear_recall: float
    learned_recall: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class LooTable:
    rows: list[LooRow] = field(default_factory=list)

    @property
    def mean_learned(self) -> float:
        return float(np.mean([r.learned_mrr for r in self.rows])) if self.rows else 0.0

    @property
    def mean_linear(self) -> float:
        return float(np.mean([r.linear_mrr for r in self.rows])) if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"histories": [r.to_dict() for r in self.rows], "meanLinear": round(self.mean_linear, 4),
                "meanLearned": round(self.mean_learned, 4)}


def leave_one_out(hs: Sequence[History], *, params: dict[str, Any] | None = None, rounds: int = ROUNDS,
                  progress: bool | None = None) -> LooTable:
    """Each history scored by a model trained on the others (with one history only: on itself,
    which the table cannot vouch for)."""
    table = LooTable()
    bar = Progress(len(hs), "leave one history out", enabled=progress)
    for i, held in enumerate(hs):
        others = [h for j, h in enumerate(hs) if j != i] or [held]
        booster = fit(others, params=params, rounds=rounds)
        rr, hit = scores_of(held, booster.predict)
        table.rows.append(LooRow(held.name, held.records, held.queries, float(held.linear_rr.mean()), float(rr.mean()),
                                 float(held.linear_hit.mean()), float(hit.mean())))
        bar.update(note=held.name)
    bar.close()
    return table


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def train(hs: Sequence[History], *, params: dict[str, Any] | None = None, rounds: int = ROUNDS, loo: bool = True,
          progress: bool | None = None) -> tuple[dict[str, Any], LooTable | None]:
    """The model file's content (packed trees and provenance) trained on every history of ``hs``,
    and the leave-one-out table (None: ``loo`` off)."""
    import lightgbm as lgb

    if any(h.features != FEATURES for h in hs):
        raise ValueError("the shipped model reads FEATURES only: the ledger features are for evaluation (issue 39)")
    table = leave_one_out(hs, params=params, rounds=rounds, progress=progress) if loo and len(hs) > 1 else None
    booster = fit(hs, params=params, rounds=rounds)
    model = {
        "format": 2,  # 2: the trees' covers (count, leaf_count) for tree SHAP
        "features": list(FEATURES),
        "provenance": {
            "histories": [{"name": h.name, "records": h.records, "queries": h.queries} for h in hs],
            "commit": _git_commit(), "lightgbm": lgb.__version__, "rounds": rounds,
            "params": {k: v for k, v in dict(PARAMS, **(params or {})).items() if k not in ("verbose", "num_threads")},
            "trainedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "leaveOneOut": table.to_dict() if table is not None else None,
        },
        "trees": pack(booster.dump_model()),
    }
    return model, table


def train_roots(roots: Sequence[str | Path], *, out: str | Path | None = None, rounds: int = ROUNDS,
                progress: bool | None = None) -> dict[str, Any]:
    """``cybmem ranker train``: the ranker trained on the memory roots ``roots`` (each with its
    qrels.jsonl), written to ``out`` (default: the shipped model's file), and the leave-one-out table.

    Raises:
        ValidationError: a root without projects.json or qrels.jsonl, or LightGBM not installed.
    """
    from ..errors import ValidationError
    from .ranker import MODEL_PATH

    try:
        import lightgbm  # noqa: F401
    except ImportError:
        raise ValidationError("training the ranker needs LightGBM: pip install 'cybmem[train]'") from None
    paths = [Path(r).expanduser() for r in roots]
    if not paths:
        raise ValidationError("name at least one memory root with a qrels.jsonl")
    for p in paths:
        for need in ("projects.json", "qrels.jsonl"):
            if not (p / need).is_file():
                raise ValidationError(f"{p} has no {need}: a training root is a memory root with its judgments (qrels.jsonl)")
    hs = [history_of_root(p, progress=progress) for p in paths]
    model, table = train(hs, rounds=rounds, progress=progress)
    target = Path(out) if out is not None else MODEL_PATH
    import orjson

    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(orjson.dumps(model))
    return {"model": str(target), "trees": len(model["trees"]["feature"]), "features": len(FEATURES),
            "histories": model["provenance"]["histories"], "leaveOneOut": table.to_dict() if table is not None else None}
