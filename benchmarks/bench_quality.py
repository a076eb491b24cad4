"""Retrieval quality on the corpus qrels, through the production search path.

    python benchmarks/bench_quality.py [--corpus pytest-memory] [--json out.json]

For every judged query (qrels.jsonl lines merged per queryRunId), memory is
replayed as of the query's moment (``search(..., as_of=asOf, exclude=queryRunId)``:
only records that had ended by then, recency measured from then), and the top 10
are scored against the relevant runs that existed then. The query run's own
parentRunId is NOT passed as dispatch context: in this corpus it is derived from
the same issue references as the judgments (it points at a relevant run by
construction), so it would leak the answer; lineage still contributes through the
run's predecessor (the latest record as of then). Reports MRR@10, recall@10 and
nDCG@10 for the default weights, BM25 alone, recency alone, lineage alone, and the
weights production would load for the store (if a weights.json was saved).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.retrieval.weights import Weights  # noqa: E402
from cybmem.retrieval.search import search  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.retrieval.judgments import metric_at_k  # noqa: E402

K = 10


def configs() -> dict[str, Weights]:
    d = Weights()
    return {
        "default": d,
        "bm25 only": Weights(w_kw=1, w_rec=0, w_lin=0, w_vec=0, half_life_days=d.half_life_days),
        "recency only": Weights(w_kw=0, w_rec=1, w_lin=0, w_vec=0, half_life_days=d.half_life_days),
        "lineage only": Weights(w_kw=0, w_rec=0, w_lin=1, w_vec=0, half_life_days=d.half_life_days),
    }


def evaluate(snap, qrels: list[dict], weights: Weights, ended: dict[str, int]) -> dict:
    scores = {"mrr": [], "recall": [], "ndcg": []}
    settings = Settings.from_env({}, memory_dir=snap.store.root)
    for q in qrels:
        rel = [r for r in q["relevant"] if ended.get(r, 1 << 62) <= q["asOf"]]
        if not rel:
            continue  # nothing relevant existed yet (one line of the full set)
        res = search(snap, q["query"], k=K, weights=weights, settings=settings, as_of=q["asOf"],
                     exclude=q["queryRunId"])
        ranked = [h.run_id for h in res.hits]
        for m in scores:
            scores[m].append(metric_at_k(ranked, rel, metric=m, k=K))
    return {m: statistics.fmean(v) for m, v in scores.items()} | {"queries": len(scores["mrr"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="pytest-memory", help="pytest-memory (7,761 records), pytest-memory-1k, or the path of a memory root with qrels.jsonl")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    root = _corpus.ensure_corpus(args.corpus)
    qrels = _corpus.load_qrels(root)
    store = MemoryStore(root, _corpus.slug_of(root))
    t = time.perf_counter()
    snap = load_snapshot(store)
    print(f"{args.corpus}: {snap.n:,} records, {len(qrels)} judged queries (loaded in {time.perf_counter() - t:.2f}s)")
    ids = snap.records.column("runId").to_pylist()
    ended = dict(zip(ids, snap.ended_ms().tolist()))
    results = {}
    print(f"{'weights':<14} {'MRR@10':>7} {'R@10':>7} {'nDCG@10':>8}  (w_kw, w_rec, w_lin, half-life)")
    for name, w in configs().items():
        t = time.perf_counter()
        r = evaluate(snap, qrels, w, ended)
        r["seconds"] = time.perf_counter() - t
        r["weights"] = w.to_dict()
        results[name] = r
        print(f"{name:<14} {r['mrr']:7.3f} {r['recall']:7.3f} {r['ndcg']:8.3f}  ({w.w_kw:g}, {w.w_rec:g}, {w.w_lin:g}, {w.half_life_days:g}d)")
    d, b, rec = results["default"], results["bm25 only"], results["recency only"]
    print(f"default vs BM25 alone: MRR x{d['mrr'] / b['mrr']:.2f}; vs recency alone: MRR x{d['mrr'] / max(rec['mrr'], 1e-9):.2f}"
          f"  ({d['queries']} queries; {d['seconds'] / d['queries'] * 1e3:.1f} ms per as-of search)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"corpus": args.corpus, "results": results}, indent=2))


if __name__ == "__main__":
    main()
