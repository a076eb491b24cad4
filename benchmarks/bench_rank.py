"""The learned ranker against the linear defaults and a strong lexical baseline, each history left out.

    python benchmarks/bench_rank.py [--corpus pytest-memory,mypy-memory,sphinx-memory,celery-memory]
                                    [--sample 300] [--no-block] [--json out.json]
    python benchmarks/bench_rank.py --latency pytest-memory [--latency-rounds 21] [--latency-records 100000]
    python benchmarks/bench_rank.py --search-latency 7761,100000 [--search-queries 200]
    python benchmarks/bench_rank.py --shap pytest-memory [--latency-rounds 21]

The protocol is bench_fit's: every judged query of each history (qrels.jsonl lines merged per
queryRunId) is ranked as of its moment against the runs that had ended then, its own run left out,
from its text alone (no parent). MRR@10 and recall@8 (a relevant run in the top 8) per history for

- ``linear``: cybmem's formula at the defaults (cybmem.retrieval.weights.Weights()), the first stage;
- ``bm25+rec``: BM25 (k1 1.5, b 0.5) over the same tokens, normalised per query, plus
  w x exp(-age / 7 days), w chosen on the other histories (the issue's strong lexical baseline);
- ``learned``: the first stage's pool reordered by LambdaMART trained on the *other* histories
  (cybmem.retrieval.ranker_training.leave_one_out's protocol; the shipped model is trained on all).

Then the MEMORY block as dispatch builds it (``dispatch._build``, evidence on, at most --sample
queries a history, seeded) with the linear ranking and with the learned one (the model trained
without that history): ``hit`` is the share of blocks that show a judged-relevant run, ``chars``
their mean length. Targets (issue 39): learned mean MRR@10 >= 0.58 and above linear on every
history; the block's hit at least the linear one's on every history.

``--latency CORPUS``: a warm ``cybmem inject`` with each ranker, taking turns with the import floor
(bench_store.py's ``python -c "import numpy, pyarrow, pyarrow.ipc, typer, orjson"``); the target is
at most 1.5x the floor. ``--latency-records N``: the same on bench_store.py's store of N records
(pytest's history replicated; written once under benchmarks/.data/). ``--search-latency SIZES``:
``search()`` on a held snapshot (the public search) with each ranker, in process, taking turns.

``--shap CORPUS``: what ``--explain`` adds, the shipped model's tree SHAP values
(``Forest.shap``) of 20 pool entries, against scoring the same query's whole pool
(``Forest.predict``), taking turns (medians); and the first call of a process, which tables every
leaf's values once. The budget (issue 39's explain): a few tens of ms for 20 runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

from cybmem.dispatch import inject as dispatch  # noqa: E402
from cybmem.retrieval import ranker as R  # noqa: E402
from cybmem.retrieval import ranker_training as RT  # noqa: E402
from cybmem.retrieval.features import FEATURES  # noqa: E402
from cybmem.retrieval.judgments import load_judgments  # noqa: E402
from cybmem.retrieval.trees import pack  # noqa: E402
from cybmem.retrieval.weights import LoadedWeights, Weights  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.keyword_index import KeywordIndex  # noqa: E402
from cybmem.store.loading import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.store.tokens import tokenize, tokenize_arrow  # noqa: E402

DEV = "pytest-memory,mypy-memory,sphinx-memory,celery-memory"
K, HIT_K = RT.K, RT.HIT_K
REC_W = (0.05, 0.1, 0.2, 0.3, 0.5, 0.8)  # the baseline's recency weights searched
DAY_MS = 86_400_000


def short(name: str) -> str:
    return name.removesuffix("-memory")


def baseline(snap, judgments) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """BM25 (k1 1.5, b 0.5) / its max + w exp(-age / 7 d): MRR@10 terms and top-8 hits per judgment
    (the judgments :func:`RT.history` keeps, in its order), for each w of REC_W."""
    index = KeywordIndex.build(tokenize_arrow(snap.records.column("task")), k1=1.5, b=0.5)
    ids = snap.records.column("runId").to_pylist()
    row_of = {rid: i for i, rid in enumerate(ids)}
    ended = snap.ended_ms()
    out = {w: ([], []) for w in REC_W}
    for j in judgments:
        mask = snap.candidates(j.as_of)
        own = row_of.get(j.query_run_id)
        if own is not None:
            mask[own] = False
        rel = {row_of[r] for r in j.relevant if r in row_of and mask[row_of[r]]}
        if not rel:
            continue
        idx = np.flatnonzero(mask)
        kw = index.scores(tokenize(j.query))[idx].astype(np.float64)
        top = kw.max()
        kw = kw / top if top > 0 else kw
        rec = np.exp(-np.maximum(j.as_of - ended[idx], 0) / (7 * DAY_MS))
        for w in REC_W:
            s = kw + w * rec
            order = np.lexsort((-idx, -s))[:max(K, HIT_K)]
            is_rel = np.isin(idx[order], list(rel))
            first = np.flatnonzero(is_rel[:K])
            out[w][0].append(1.0 / (first[0] + 1) if len(first) else 0.0)
            out[w][1].append(bool(is_rel[:HIT_K].any()))
    return {w: (np.asarray(a), np.asarray(b)) for w, (a, b) in out.items()}


def block_hits(store, snap, judgments, settings, sample: int, seed: int = 7) -> tuple[float, float, int]:
    """The share of MEMORY blocks (dispatch's own build, evidence on) that show a relevant run, their
    mean length, and how many tasks (at most ``sample``, seeded)."""
    ended = dict(zip(snap.records.column("runId").to_pylist(), snap.ended_ms().tolist()))
    qs = [j for j in judgments if any(ended.get(r, 1 << 62) <= j.as_of for r in j.relevant)]
    qs = qs if len(qs) <= sample else random.Random(seed).sample(qs, sample)
    hit, chars = 0, []
    for j in qs:
        inj = dispatch._build(store, j.query, settings, LoadedWeights(Weights(), {}), as_of=j.as_of, now_ms=None,
                              parent_run_id=None, chat_session_id=None, exclude=j.query_run_id)
        hit += any(h.run_id in j.relevant for h in inj.runs)
        chars.append(len(inj.block))
    return hit / max(len(qs), 1), float(np.mean(chars)) if chars else 0.0, len(qs)


DISPATCH_FLOOR = ("numpy", "pyarrow", "pyarrow.ipc", "typer", "orjson")  # bench_store.py's import floor


def latency(corpus: str, rounds: int, records: int | None = None) -> dict:
    """A warm ``cybmem inject`` with each ranker, taking turns with the import floor (medians of
    ``rounds``; each round asks another judged task's subject line). ``records``: on bench_store.py's
    store of that many records (pytest's history replicated) instead of the corpus itself."""
    import os
    import shutil
    import statistics
    import subprocess

    root = _corpus.ensure_corpus(corpus)
    tasks = [j.query.strip().split("\n", 1)[0] for j in load_judgments(root / "qrels.jsonl")][:rounds]
    if records:
        import bench_store

        root = bench_store.store_for(records)
    slug = _corpus.slug_of(root)
    exe = shutil.which("cybmem") or "cybmem"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    base_env["CYBERINE_MEMORY_DIR"] = str(root)
    floor = [sys.executable, "-c", "import " + ", ".join(DISPATCH_FLOOR)]
    runs = {"floor": [], "linear": [], "learned": []}

    def run(argv, env):
        t = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t

    envs = {r: dict(base_env, CYBERINE_MEMORY_RANKER=r) for r in ("linear", "learned")}
    for r, env in envs.items():  # warm: the cache is built, the files are in the page cache
        run([exe, "inject", tasks[0], "--project", slug], env)
    for task in tasks:
        runs["floor"].append(run(floor, base_env))
        for r, env in envs.items():
            runs[r].append(run([exe, "inject", task, "--project", slug], env))
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"corpus": corpus, "records": records, "rounds": len(tasks), **{f"{k}_s": v for k, v in med.items()},
            "linear_vs_floor": med["linear"] / med["floor"], "learned_vs_floor": med["learned"] / med["floor"]}


def search_latency(corpus: str, sizes: list[int], queries: int) -> list[dict]:
    """``search()`` on a held, prepared snapshot (the public search, k=10) with each ranker, taking
    turns query by query; per size, the medians and the learned/linear ratio. A size that is the
    corpus' own runs the corpus; others bench_store.py's replicated store."""
    import dataclasses
    import statistics

    import bench_store
    from cybmem.retrieval.search import search

    root = _corpus.ensure_corpus(corpus)
    tasks = [j.query.strip().split("\n", 1)[0] for j in load_judgments(root / "qrels.jsonl")][:queries]
    base = Settings.from_env({})
    rows = []
    for n in sizes:
        store_root = bench_store.store_for(n)
        snap = load_snapshot(MemoryStore(store_root, _corpus.slug_of(store_root))).prepare()
        settings = {r: dataclasses.replace(base, ranker=r) for r in ("linear", "learned")}
        for r, st in settings.items():  # warm: the trees read, the word cache filled
            for task in tasks[:5]:
                search(snap, task, k=10, settings=st)
        times = {r: [] for r in settings}
        for task in tasks:
            for r, st in settings.items():
                t = time.perf_counter()
                search(snap, task, k=10, settings=st)
                times[r].append(time.perf_counter() - t)
        med = {r: statistics.median(v) for r, v in times.items()}
        rows.append({"records": snap.n, "queries": len(tasks), "linear_ms": med["linear"] * 1e3,
                     "learned_ms": med["learned"] * 1e3, "ratio": med["learned"] / med["linear"]})
    return rows


def shap_timing(corpus: str, rounds: int, n: int = 20) -> dict:
    """Forest.shap of ``n`` pool entries against Forest.predict of the whole pool, for ``rounds``
    judged queries of ``corpus`` taking turns (medians), and the first call (tables built)."""
    import statistics

    from cybmem.retrieval.trees import Forest

    root = _corpus.ensure_corpus(corpus)
    snap = load_snapshot(MemoryStore(root, _corpus.slug_of(root)))
    js = [dataclasses.replace(j, parent_run_id=None, chat_session_id=None) for j in load_judgments(root / "qrels.jsonl")]
    h = RT.history(snap, js[:rounds], name=short(corpus))
    packed = orjson.loads(R.MODEL_PATH.read_bytes())["trees"]
    fresh = Forest.from_packed(packed)
    t = time.perf_counter()
    fresh.shap(h.X[:n])
    first = time.perf_counter() - t
    forest = R.model().forest
    forest.shap(h.X[:1])
    shap_t, pred_t = [], []
    for q in range(h.queries):
        X = h.X[h.offsets[q]:h.offsets[q + 1]]
        t = time.perf_counter()
        forest.predict(X)
        pred_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        forest.shap(X[:n])
        shap_t.append(time.perf_counter() - t)
    med_s, med_p = statistics.median(shap_t), statistics.median(pred_t)
    return {"corpus": corpus, "queries": h.queries, "rows": n, "pool": float(np.mean(np.diff(h.offsets))),
            "first_call_s": first, "shap_s": med_s, "predict_pool_s": med_p, "shap_vs_predict": med_s / med_p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEV, help="comma-separated archives of ../shared/corpora or memory roots with qrels.jsonl")
    ap.add_argument("--sample", type=int, default=300, help="judged queries a history for the block")
    ap.add_argument("--rounds", type=int, default=RT.ROUNDS)
    ap.add_argument("--no-block", action="store_true", help="skip the block's run hit")
    ap.add_argument("--latency", metavar="CORPUS", help="only time a warm inject with each ranker against the import "
                    "floor on this corpus (taking turns, --rounds medians)")
    ap.add_argument("--latency-rounds", type=int, default=21)
    ap.add_argument("--search-latency", metavar="SIZES", help="only time search() on a held snapshot with each ranker "
                    "at these record counts (e.g. 7761,100000: pytest's history and bench_store.py's replica)")
    ap.add_argument("--search-queries", type=int, default=200)
    ap.add_argument("--latency-records", type=int, help="with --latency pytest-memory: time inject on bench_store.py's "
                    "replicated store of this many records (e.g. 100000) instead")
    ap.add_argument("--shap", metavar="CORPUS", help="only time the tree SHAP values of 20 pool entries (what --explain "
                    "adds) against scoring the whole pool, --latency-rounds queries")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.search_latency:
        for row in search_latency("pytest-memory", [int(x) for x in args.search_latency.split(",")], args.search_queries):
            print(f"search() at {row['records']:,} records ({row['queries']} queries, medians, taking turns): linear "
                  f"{row['linear_ms']:.2f} ms, learned {row['learned_ms']:.2f} ms (x{row['ratio']:.2f})")
        return
    if args.latency:
        out = latency(args.latency, args.latency_rounds, args.latency_records)
        where = out["corpus"] + (f" replicated to {out['records']:,} records" if out["records"] else "")
        print(f"warm inject on {where} ({out['rounds']} rounds, medians, taking turns): floor "
              f"{out['floor_s'] * 1e3:.1f} ms, linear {out['linear_s'] * 1e3:.1f} ms (x{out['linear_vs_floor']:.2f}), "
              f"learned {out['learned_s'] * 1e3:.1f} ms (x{out['learned_vs_floor']:.2f})")
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
        return
    if args.shap:
        out = shap_timing(args.shap, args.latency_rounds)
        print(f"tree SHAP on {out['corpus']} ({out['queries']} queries, medians, taking turns): {out['rows']} pool entries "
              f"{out['shap_s'] * 1e3:.1f} ms against scoring the whole pool ({out['pool']:.0f} entries) "
              f"{out['predict_pool_s'] * 1e3:.1f} ms (x{out['shap_vs_predict']:.1f}); a process's first call "
              f"(every leaf's values tabled) {out['first_call_s'] * 1e3:.0f} ms")
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
        return
    names = [c.strip() for c in args.corpus.split(",") if c.strip()]
    loaded = []
    for name in names:
        root = _corpus.ensure_corpus(name)
        store = MemoryStore(root, _corpus.slug_of(root))
        snap = load_snapshot(store)
        js = [dataclasses.replace(j, parent_run_id=None, chat_session_id=None) for j in load_judgments(root / "qrels.jsonl")]
        t = time.perf_counter()
        h = RT.history(snap, js, name=short(name))
        print(f"{short(name)}: {snap.n:,} records, {h.queries} judged queries ({h.skipped} without a relevant run then), "
              f"features in {time.perf_counter() - t:.1f}s", flush=True)
        loaded.append((root, store, snap, js, h))
    hs = [x[4] for x in loaded]
    base = {x[4].name: baseline(x[2], x[3]) for x in loaded}

    tmp = Path(tempfile.mkdtemp(prefix="bench-rank-"))
    rows = {}
    for i, (root, store, snap, js, held) in enumerate(loaded):
        others = [h for h in hs if h is not held] or [held]
        t = time.perf_counter()
        booster = RT.fit(others, rounds=args.rounds)
        rr, hit = RT.scores_of(held, booster.predict)
        path = tmp / f"{held.name}.json"
        path.write_bytes(orjson.dumps({"format": 2, "features": list(FEATURES), "provenance": {},
                                       "trees": pack(booster.dump_model())}))
        # the baseline's w: the best mean MRR over the other histories
        w = max(REC_W, key=lambda w: np.mean([base[h.name][w][0].mean() for h in others]))
        rows[held.name] = {"queries": held.queries, "records": held.records,
                           "linear": {"mrr": float(held.linear_rr.mean()), "recall8": float(held.linear_hit.mean())},
                           "bm25+rec": {"mrr": float(base[held.name][w][0].mean()), "recall8": float(base[held.name][w][1].mean()), "w": w},
                           "learned": {"mrr": float(rr.mean()), "recall8": float(hit.mean())}, "model": str(path),
                           "trainSeconds": time.perf_counter() - t}
    print(f"\nMRR@{K} / recall@{HIT_K}, each history scored by what was chosen or trained on the others:")
    print(f"{'':<10}{'queries':>8}" + "".join(f"{c:>20}" for c in ("linear", "bm25+rec (w)", "learned")))
    for name, r in rows.items():
        print(f"{name:<10}{r['queries']:>8}{r['linear']['mrr']:>11.3f} / {r['linear']['recall8']:.3f}"
              f"{r['bm25+rec']['mrr']:>7.3f} / {r['bm25+rec']['recall8']:.3f} ({r['bm25+rec']['w']:g})"
              f"{r['learned']['mrr']:>9.3f} / {r['learned']['recall8']:.3f}")
    mean = {c: float(np.mean([r[c]["mrr"] for r in rows.values()])) for c in ("linear", "bm25+rec", "learned")}
    print(f"{'mean':<10}{'':>8}{mean['linear']:>11.3f}{'':>8}{mean['bm25+rec']:>7.3f}{'':>14}{mean['learned']:>9.3f}")
    above = all(r["learned"]["mrr"] > r["linear"]["mrr"] for r in rows.values())
    print(f"learned mean >= 0.58: {'yes' if mean['learned'] >= 0.58 else 'NO'}; above linear on every history: "
          f"{'yes' if above else 'NO'}")

    if not args.no_block:
        print(f"\nThe MEMORY block (dispatch's build, evidence on; at most {args.sample} tasks a history): "
              "a relevant run shown / mean chars")
        for root, store, snap, js, held in loaded:
            r = rows[held.name]
            for ranker in ("linear", "learned"):
                settings = Settings.from_env({"CYBERINE_MEMORY_RANKER": ranker}, memory_dir=root)
                R.use_model(r["model"] if ranker == "learned" else None)
                t = time.perf_counter()
                hit, chars, n = block_hits(store, snap, js, settings, args.sample)
                r[f"block_{ranker}"] = {"hit": hit, "chars": chars, "tasks": n, "seconds": time.perf_counter() - t}
            R.use_model(None)
            print(f"{held.name:<10} linear {r['block_linear']['hit']:.3f} / {r['block_linear']['chars']:.0f}   "
                  f"learned {r['block_learned']['hit']:.3f} / {r['block_learned']['chars']:.0f}   ({r['block_learned']['tasks']} tasks)",
                  flush=True)
        ok = all(r["block_learned"]["hit"] >= r["block_linear"]["hit"] for r in rows.values())
        print(f"block hit at least linear's on every history: {'yes' if ok else 'NO'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "mean": mean}, indent=2))


if __name__ == "__main__":
    main()
