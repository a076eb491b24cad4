"""Weight-search time on the pytest corpus replicated to 20k records, plus tuned-vs-default quality.

Usage:
    python benchmarks/bench_tune.py                            # 20,000 records, 500 queries, 20x20x20 grid
    python benchmarks/bench_tune.py --half-lives 1,3,7,14,30,60,120,365 --repeats 5 --json out.json
    python benchmarks/bench_tune.py --queries derived          # judgments derived from the store instead of qrels

What is timed (time.perf_counter, median of --repeats runs):
  precompute   cybmem.retrieval.tuning.axis_matrices: per query, once, BM25 + lineage + recency ages over the
               records that existed at the query's moment, reduced to its candidate pool
  grid         cybmem.retrieval.tuning.grid_search over w_kw x w_rec x w_lin (--steps values each, 0..1)
               x --half-lives, reusing the precomputed axis values (no re-scoring)

Queries: the corpus qrels (shared/corpora/README.md) mapped onto every replica copy that holds
their runs (run ids and asOf shifted like the records), sampled with replacement to --n-queries
(seeded), or with --queries derived, cybmem.retrieval.judgments.judgments_from_store on the replicated store.

Quality (--quality, on by default): MRR@10 / nDCG@10 / recall@10 of the default weights and of the
grid's best on the real 7,761-record corpus qrels and on judgments derived from data-fixtures/.
These are in-sample (tuned and scored on the same judgments): an upper bound of what tuning buys.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus as C  # noqa: E402

from cybmem.retrieval import judgments as J  # noqa: E402
from cybmem.retrieval import tuning as T  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.retrieval.weights import Weights  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def replicated_store(size: int) -> MemoryStore:
    """The corpus replicated to ``size`` records, written once under benchmarks/.data/."""
    root = C.DATA_DIR / f"pytest-tune-{size}"
    marker = C.DATA_DIR / f".pytest-tune-{size}.written"
    if not (marker.exists() and root.is_dir()):
        recs = C.load_records(C.ensure_corpus())
        issues = C.load_issues(C.ensure_corpus())
        C.write_store(C.replicate(recs, size), root, issues=C.replicate_issues(issues, recs, size))
        marker.write_text("ok\n")
    return MemoryStore(root, "pytest")


def qrels_on_copies(snap, n: int, seed: int) -> list[T.Judgment]:
    """Corpus qrels mapped onto every replica copy that holds all their runs; n sampled with replacement."""
    root = C.ensure_corpus()
    recs = C.load_records(root)
    span = max(r["endedAt"] for r in recs) - min(r["startedAt"] for r in recs) + 86_400_000
    ids = set(snap.records.column("runId").to_pylist())
    pool = []
    copies = (snap.n + len(recs) - 1) // len(recs)
    for q in C.load_qrels(root):
        for c in range(copies):
            qid = C.replica_id(q["queryRunId"], c)
            rel = tuple(C.replica_id(x, c) for x in q["relevant"])
            if qid in ids and any(x in ids for x in rel):
                pool.append(T.Judgment(query=q["query"], as_of=q["asOf"] + c * span, relevant=rel, query_run_id=qid,
                                       kind="qrels"))
    rng = random.Random(seed)
    return [rng.choice(pool) for _ in range(n)]


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def quality(snap, judgments, steps: int, label: str) -> dict:
    m = T.axis_matrices(snap, judgments, k=10, progress=False)
    out = {"set": label, "judgments": m.n, "skipped": len(m.skipped)}
    for metric in T.METRICS:
        res = T.grid_search(m, metric=metric, k=10, steps=steps, current=Weights(), progress=False)
        out[metric] = {"default": round(res.current_metric, 4), "best": round(res.best_metric, 4),
                       "bestWeights": res.best.to_dict()}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=20_000, help="records in the replicated store")
    ap.add_argument("--n-queries", type=int, default=500, help="judgments (sampled with replacement)")
    ap.add_argument("--queries", choices=["qrels", "derived"], default="qrels")
    ap.add_argument("--steps", type=int, default=20, help="values per weight (0..1)")
    ap.add_argument("--half-lives", default="30", help="comma-separated half-lives (days) in the grid")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-quality", action="store_true", help="skip the quality section")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    half_lives = [float(x) for x in args.half_lives.split(",") if x]

    t0 = time.perf_counter()
    store = replicated_store(args.size)
    snap = load_snapshot(store, use_cache=False)
    load_s = time.perf_counter() - t0
    if args.queries == "qrels":
        js = qrels_on_copies(snap, args.n_queries, args.seed)
    else:
        derived = J.judgments_from_store(snap)
        rng = random.Random(args.seed)
        js = [rng.choice(derived) for _ in range(args.n_queries)]
    print(f"store: {snap.n} records ({load_s:.1f}s to prepare and load); {len(js)} {args.queries} judgments", flush=True)

    m, pre_times = timed(lambda: T.axis_matrices(snap, js, k=10, progress=False), args.repeats)
    pre = statistics.median(pre_times)
    summary = m.summary()
    print(f"precompute: {pre:.2f}s median ({pre / len(js) * 1000:.2f} ms/query); {m.n} evaluable, "
          f"pool median {summary['poolMedian']:.0f} of {summary['candidatesMedian']:.0f} candidates", flush=True)

    vals = np.linspace(0, 1, args.steps)
    # The first run also classifies each (query, relevant run) pair's pool once (cached on m for later grids).
    res, grid_times = timed(lambda: T.grid_search(m, w_kw=vals, w_rec=vals, w_lin=vals, half_lives=half_lives,
                                                   current=Weights(), progress=False), args.repeats)
    grid = statistics.median(grid_times)
    shape = f"{args.steps}x{args.steps}x{args.steps} x {len(half_lives)} half-lives"
    print(f"grid {shape} = {res.points} points ({res.evaluated} distinct rankings): {grid:.2f}s median "
          f"(runs: {', '.join(f'{t:.2f}' for t in grid_times)}; the first includes pair classification)", flush=True)
    print(f"  MRR@10 default {res.current_metric:.4f} -> best {res.best_metric:.4f} at {res.best.to_dict()}", flush=True)

    out = {
        "records": snap.n, "judgments": len(js), "evaluable": m.n, "queries": args.queries, "grid": shape,
        "points": res.points, "evaluated": res.evaluated, "precomputeSeconds": pre_times,
        "precomputeMedianS": round(pre, 4), "precomputePerQueryMs": round(pre / len(js) * 1000, 3),
        "gridSeconds": grid_times, "gridMedianS": round(grid, 4), "pool": summary,
        "mrrDefault": round(res.current_metric, 4), "mrrBest": round(res.best_metric, 4),
    }
    if not args.no_quality:
        real = load_snapshot(MemoryStore(C.ensure_corpus(), C.slug_of(C.ensure_corpus())), use_cache=False)
        qrels = J.load_judgments(C.ensure_corpus() / "qrels.jsonl")
        fx = load_snapshot(MemoryStore(REPO / "data-fixtures" / "memory", "web"), use_cache=False)
        out["quality"] = [quality(real, qrels, 11, "pytest corpus qrels (7,761 records)"),
                          quality(real, J.judgments_from_store(real), 11, "pytest corpus, derived judgments"),
                          quality(fx, J.judgments_from_store(fx), 11, "data-fixtures web, derived judgments")]
        for q in out["quality"]:
            line = ", ".join(f"{T.METRICS[k]}@10 {q[k]['default']:.4f} -> {q[k]['best']:.4f}" for k in T.METRICS)
            print(f"quality, {q['set']} ({q['judgments']} judgments): {line}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
