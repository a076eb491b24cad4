"""In-process query latency of cybmem's scorer vs bm25s, rank_bm25 and a scipy "floor".

Usage:
    python benchmarks/bench_query.py                      # sizes 7761,100000,1000000
    python benchmarks/bench_query.py --sizes 7761,100000 --queries 200 --json out.json
    python benchmarks/bench_query.py --quality            # MRR@10 / recall@10 on the qrels

Documents are the pytest corpus records (task + outcome text, cybmem.scoring.tokenize);
100k and 1M are replicated copies (benchmarks/_corpus.replicate_columns). Every system gets
the same token lists. Queries: 3-8 consecutive distinct tokens of deterministically drawn
records. Each call is timed alone (perf_counter_ns) after a warm-up, systems round-robin per
query so a busy shared machine slows them alike; medians and p90s.

Systems:
  cybmem-kw     KeywordIndex.scores + top_k(10)
  cybmem-full   the production ranking, cybmem.retrieval.rank_query: tokenize the query, BM25 over the
                postings, lineage, then keyword + recency + lineage scored exactly over the pool
                that can reach the top 10 (records with a keyword or lineage score + the 10
                newest others), top 10
  bm25s         bm25s.BM25 (numpy backend, method "lucene") .retrieve([q], k=10)
  rank_bm25     BM25Okapi.get_scores (7.7k and 100k only, few queries: it is slow)
  floor         scipy CSC of precomputed idf*tf impacts: X[:, cols].sum(axis=1), one dense
                re-rank pass (a*kw + precomputed prior), argpartition(10), sort 10
  floor-sum     the floor's X[:, cols].sum(axis=1) alone: a bound that does not even rank
                (np.argpartition is slow on heavily tied scores, which the floor pays)
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus as C  # noqa: E402

from cybmem import scoring as S  # noqa: E402

K = 10


def _stats(ns: list[int]) -> dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3  # microseconds
    return {"median_us": float(np.median(a)), "p90_us": float(np.percentile(a, 90)), "n": len(a)}


def _time_queries(fn, queries, warmup: int = 5) -> list[int]:
    return _time_round_robin({"fn": fn}, queries, warmup)["fn"]


def _time_round_robin(fns: dict, queries, warmup: int = 5) -> dict[str, list[int]]:
    """Time each system on query i in turn, so load changes on a shared machine hit all
    systems alike. Each call is timed alone with perf_counter_ns."""
    for q in queries[:warmup]:
        for fn in fns.values():
            fn(q)
    out: dict[str, list[int]] = {name: [] for name in fns}
    gc.disable()
    try:
        for q in queries:
            for name, fn in fns.items():
                t0 = time.perf_counter_ns()
                fn(q)
                out[name].append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return out


def make_queries(token_lists: list[list[str]], n: int, seed: int = 0) -> list[list[str]]:
    """n queries of 3-8 distinct consecutive tokens from randomly drawn documents."""
    rng = random.Random(seed)
    out: list[list[str]] = []
    while len(out) < n:
        toks = list(dict.fromkeys(token_lists[rng.randrange(len(token_lists))]))
        if len(toks) < 3:
            continue
        L = rng.randint(3, min(8, len(toks)))
        s = rng.randrange(len(toks) - L + 1)
        out.append(toks[s : s + L])
    return out


def _lineage_columns(cols: dict):
    """Id columns as the frame layer would hand them over: Arrow string run ids (plus a
    RunLookup), dictionary-encoded root/chat ids, object parent ids, float64 endedAt."""
    run_ids = pa.array(cols["runId"], pa.string())
    roots = pa.array(cols["rootRunId"], pa.string(), from_pandas=True).dictionary_encode()
    chats = pa.array(cols["chatSessionId"], pa.string(), from_pandas=True).dictionary_encode()
    return run_ids, cols["parentRunId"], roots, chats, cols["endedAt"].astype(np.float64)


def bench_size(n: int, base_recs, base_tokens, args, out: dict) -> None:
    print(f"\n=== {n:,} docs ===", flush=True)
    t0 = time.perf_counter()
    cols = C.replicate_columns(base_recs, n)
    docs = [base_tokens[i] for i in cols["source"].tolist()]
    run_ids, parents, roots, chats, ended = _lineage_columns(cols)
    lookup = S.RunLookup.build(run_ids)
    print(f"prepare (replicate + columns + RunLookup): {time.perf_counter() - t0:.1f}s", flush=True)
    res: dict = {"n_docs": n}

    # ---- cybmem build / IPC round trip / refresh -------------------------------------
    gc.collect()
    t0 = time.perf_counter()
    idx = S.KeywordIndex.build(docs)
    build_s = time.perf_counter() - t0
    res["cybmem_build_s"] = build_s
    print(f"cybmem build: {build_s:.2f}s ({idx!r})", flush=True)
    path = C.DATA_DIR / f"bench-index-{n}.arrow"
    C.DATA_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    table = idx.to_arrow()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    res["cybmem_ipc_write_s"] = time.perf_counter() - t0
    del table
    loads = []
    for _ in range(7):
        t0 = time.perf_counter_ns()
        mm = pa.memory_map(str(path), "r")
        loaded = S.KeywordIndex.from_arrow(pa.ipc.open_file(mm).read_all())
        loads.append(time.perf_counter_ns() - t0)
    res["cybmem_ipc_load_ms"] = float(np.median(loads)) / 1e6
    res["ipc_file_mb"] = path.stat().st_size / 2**20
    print(f"IPC write {res['cybmem_ipc_write_s']:.2f}s, file {res['ipc_file_mb']:.0f} MiB, "
          f"mmap load median {res['cybmem_ipc_load_ms']:.2f} ms", flush=True)

    queries = make_queries(base_tokens, args.queries, seed=1)
    # cold first query on the memory-mapped index (page cache warm, process state cold)
    t0 = time.perf_counter_ns()
    S.top_k(loaded.scores(queries[0]), K)
    res["cybmem_first_query_after_load_ms"] = (time.perf_counter_ns() - t0) / 1e6
    print(f"first query on the memory-mapped index: {res['cybmem_first_query_after_load_ms']:.2f} ms",
          flush=True)
    ref = idx.scores(queries[0])
    assert np.allclose(ref, loaded.scores(queries[0]), atol=1e-5)
    del loaded, mm

    t0 = time.perf_counter_ns()
    ext = idx.extend([base_tokens[0]])
    res["cybmem_extend_1_ms"] = (time.perf_counter_ns() - t0) / 1e6
    t0 = time.perf_counter_ns()
    ext.scores(queries[0])
    res["cybmem_query_after_extend_ms"] = (time.perf_counter_ns() - t0) / 1e6
    print(f"extend(1 doc) {res['cybmem_extend_1_ms']:.2f} ms, first query after it "
          f"{res['cybmem_query_after_extend_ms']:.2f} ms (stale main-segment impacts)", flush=True)
    del ext

    # ---- systems under test ----------------------------------------------------------------
    weights = S.Weights()
    now = int(ended.max()) + 3_600_000
    # the new run: dispatched by the second-newest run, after the newest one
    ctx = S.LineageContext(parent_run_id=cols["runId"][-2], previous_run_id=cols["runId"][-1],
                           root_run_id=cols["rootRunId"][-1])

    # (scores(q, out=buf) is possible, but a fresh np.zeros measured faster than buf.fill(0))
    def cyb_kw(q):
        return S.top_k(idx.scores(q), K)

    from cybmem.frames import Snapshot
    from cybmem.retrieval import rank_query

    nulls = pa.nulls(n, pa.string())
    table = pa.table({
        "runId": pa.array(run_ids, pa.string()), "parentRunId": pa.array(parents, pa.string()),
        "previousRunId": pa.array(cols["previousRunId"], pa.string()), "rootRunId": pa.array(roots, pa.string()),
        "chatSessionId": pa.array(chats, pa.string()), "endedAt": pa.array(ended, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "supersedes": nulls, "supersededBy": nulls,
    })
    snap = Snapshot(None, table, None, idx)
    texts = {id(q): " ".join(q) for q in queries}

    def cyb_full(q):
        return rank_query(snap, texts.get(id(q)) or " ".join(q), k=K, weights=weights, now_ms=now,
                          parent_run_id=ctx.parent_run_id).top

    fns = {"cybmem-kw": cyb_kw, "cybmem-full": cyb_full}

    # floor: scipy CSC of precomputed impacts (idf folded in)
    import scipy.sparse as sp

    seg = idx._segments[0]  # one segment after build(); its impacts already hold idf
    X = sp.csc_array((seg.impact, seg.doc_ids, seg.indptr), shape=(n, len(seg.indptr) - 1))
    vocab = {t: i for i, t in enumerate(seg.vocab.to_pylist())}
    prior = (S.recency(ended, now, weights.half_life_days) * np.float32(weights.w_rec)
             + S.lineage_affinity(run_ids, parents, None, roots, chats, ctx, lookup=lookup)
             * np.float32(weights.w_lin))

    def floor_sum(q):
        cols = [vocab[t] for t in dict.fromkeys(q) if t in vocab]
        return X[:, cols].sum(axis=1)

    def floor(q):
        v = floor_sum(q)
        mx = v.max()
        tot = v * np.float32(weights.w_kw / mx if mx > 0 else 0.0) + prior
        part = np.argpartition(tot, n - K)[n - K :]
        return part[np.argsort(-tot[part])]

    fns["floor"] = floor
    fns["floor-sum"] = floor_sum
    v = floor_sum(queries[1])
    assert np.allclose(v, idx.scores(queries[1]), rtol=1e-4, atol=1e-4), "floor differs"

    retr = None
    if not args.skip_bm25s:
        import bm25s

        t0 = time.perf_counter()
        retr = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
        retr.index(docs, show_progress=False)
        res["bm25s_build_s"] = time.perf_counter() - t0
        print(f"bm25s build: {res['bm25s_build_s']:.1f}s", flush=True)
        assert np.allclose(retr.get_scores(list(dict.fromkeys(queries[2]))), idx.scores(queries[2]),
                           rtol=1e-3, atol=1e-3), "bm25s scores differ"

        def b25(q):
            return retr.retrieve([list(dict.fromkeys(q))], k=K, show_progress=False, n_threads=0)

        fns["bm25s"] = b25

    times = _time_round_robin(fns, queries)
    systems: dict[str, dict] = {name: _stats(ts) for name, ts in times.items()}
    del X, retr, prior

    if n <= 100_000 and not args.skip_rank_bm25:
        from rank_bm25 import BM25Okapi

        t0 = time.perf_counter()
        okapi = BM25Okapi(docs, k1=1.2, b=0.75)
        res["rank_bm25_build_s"] = time.perf_counter() - t0
        nq = max(5, min(len(queries), 400_000 // n))
        systems["rank_bm25"] = _stats(_time_queries(okapi.get_scores, queries[:nq], warmup=1))
        del okapi

    base = systems["cybmem-kw"]["median_us"]
    print(f"{'system':<13}{'median':>11}{'p90':>11}{'n':>6}{'x cybmem-kw':>13}{'x cybmem-full':>15}")
    for name, st in systems.items():
        print(f"{name:<13}{st['median_us']:>9.0f}us{st['p90_us']:>9.0f}us{st['n']:>6}"
              f"{st['median_us'] / base:>12.2f}x{st['median_us'] / systems['cybmem-full']['median_us']:>14.2f}x")
    if "bm25s" in systems:
        print(f"target: cybmem-kw >= 10x faster than bm25s: "
              f"{systems['bm25s']['median_us'] / base:.1f}x; "
              f"cybmem-full vs bm25s: {systems['bm25s']['median_us'] / systems['cybmem-full']['median_us']:.1f}x")
    print(f"target: within 2x of floor: cybmem-kw/floor = {base / systems['floor']['median_us']:.2f}, "
          f"cybmem-full/floor = {systems['cybmem-full']['median_us'] / systems['floor']['median_us']:.2f}")
    res["systems"] = systems
    out[str(n)] = res
    path.unlink(missing_ok=True)


# ---- retrieval quality on the qrels -----------------------------------------------------

def _suffix_strip(tokens: list[str]) -> list[str]:
    """The tiny stemmer that was tried and rejected (see cybmem.scoring's docstring)."""
    out = []
    for x in tokens:
        if len(x) > 4 and x.endswith("ies"):
            x = x[:-3] + "y"
        elif len(x) > 5 and x.endswith("ing"):
            x = x[:-3]
        elif len(x) > 4 and x.endswith("ed"):
            x = x[:-2]
        elif len(x) > 3 and x.endswith("es"):
            x = x[:-2]
        elif len(x) > 3 and x.endswith("s") and not x.endswith("ss"):
            x = x[:-1]
        out.append(x)
    return out


def quality(k: int = 10, stem: bool = False) -> dict:
    """MRR@k / recall@k on the full corpus qrels for default weights vs single axes.

    Per query: candidates = records with endedAt <= asOf minus the query run; the index is
    built over the record prefix that holds them (idf as of then); lineage context = the
    query run's previousRunId and rootRunId. Its parentRunId is NOT used: by construction
    it is one of the judged-relevant runs.
    """
    root = C.ensure_corpus()
    recs = C.load_records(root)
    qrels = C.load_qrels(root)
    tok = (lambda t: _suffix_strip(S.tokenize(t))) if stem else S.tokenize
    toks = [tok(C.record_text(r)) for r in recs]
    ids = np.array([r["runId"] for r in recs], dtype=object)
    ended = np.array([r["endedAt"] for r in recs], dtype=np.int64)
    parents = np.array([(r["lineage"] or {}).get("parentRunId") for r in recs], dtype=object)
    roots = np.array([(r["lineage"] or {}).get("rootRunId") for r in recs], dtype=object)
    chats = np.array([(r["lineage"] or {}).get("chatSessionId") for r in recs], dtype=object)
    pos = {r: i for i, r in enumerate(ids)}
    prepared = []
    for q in qrels:
        qi = pos[q["queryRunId"]]
        cand = ended <= q["asOf"]
        cand[qi] = False
        rel = {pos[r] for r in q["relevant"] if r in pos and cand[pos[r]]}
        if not rel:
            continue
        m = int(np.flatnonzero(cand).max()) + 1
        raw = S.KeywordIndex.build(toks[:m]).scores(tok(q["query"]))
        lin = recs[qi]["lineage"] or {}
        ctx = S.LineageContext(previous_run_id=lin.get("previousRunId"), root_run_id=lin.get("rootRunId"))
        la = S.lineage_affinity(ids[:m], parents[:m], None, roots[:m], chats[:m], ctx)
        prepared.append((raw, ended[:m], q["asOf"], la, cand[:m], rel))

    def metrics(w: S.Weights) -> tuple[float, float]:
        mrr = rec = 0.0
        for raw, e, now, la, mask, rel in prepared:
            top = S.rank(S.score(keyword_raw=raw, ended_at_ms=e, now_ms=now, lineage=la,
                                 vector_cos=None, weights=w, mask=mask), k)
            mrr += next((1.0 / (r + 1) for r, i in enumerate(top) if i in rel), 0.0)
            rec += len(rel.intersection(top)) / len(rel)
        return mrr / len(prepared), rec / len(prepared)

    configs = {
        "defaults": S.Weights(),
        "bm25-only": S.Weights(w_kw=1, w_rec=0, w_lin=0),
        "recency-only": S.Weights(w_kw=0, w_rec=1, w_lin=0),
        "kw+lineage": S.Weights(w_kw=0.85, w_rec=0, w_lin=0.15),
    }
    out = {"queries": len(prepared)}
    print(f"qrels: {len(prepared)} queries (merged per queryRunId, judged runs after asOf dropped)"
          + (", tokens suffix-stripped" if stem else ""))
    print(f"{'weights':<14}{'MRR@10':>8}{'R@10':>8}")
    for name, w in configs.items():
        mrr, rec = metrics(w)
        out[name] = {"mrr@10": mrr, "recall@10": rec, "weights": w.to_dict()}
        print(f"{name:<14}{mrr:>8.3f}{rec:>8.3f}")
    print("grid (w_kw = 1 - w_rec - 0.15, w_lin = 0.15):")
    for hl in (7.0, 14.0, 30.0, 60.0, 120.0):
        cells = []
        for wr in (0.1, 0.25, 0.4, 0.55, 0.7):
            mrr, _ = metrics(S.Weights(w_kw=max(0.0, 0.85 - wr), w_rec=wr, w_lin=0.15, half_life_days=hl))
            cells.append(f"rec={wr:.2f}:{mrr:.3f}")
        print(f"  half_life={hl:>5.0f}d  " + "  ".join(cells))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="7761,100000,1000000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    ap.add_argument("--quality", action="store_true", help="only measure MRR@10 / recall@10 on the qrels")
    ap.add_argument("--skip-bm25s", action="store_true")
    ap.add_argument("--skip-rank-bm25", action="store_true")
    args = ap.parse_args(argv)
    out: dict = {"python": sys.version.split()[0], "numpy": np.__version__, "pyarrow": pa.__version__}
    if args.quality:
        out["quality"] = quality()
        print()
        out["quality_suffix_strip"] = quality(stem=True)
    else:
        t0 = time.perf_counter()
        root = C.ensure_corpus()
        base_recs = C.load_records(root)
        base_tokens = S.tokenize_many(C.record_text(r) for r in base_recs)
        print(f"corpus: {len(base_recs)} records, tokenized in {time.perf_counter() - t0:.1f}s "
              f"({sum(map(len, base_tokens)) / len(base_tokens):.1f} tokens/doc)")
        for n in (int(x) for x in args.sizes.split(",") if x.strip()):
            bench_size(n, base_recs, base_tokens, args, out)
            gc.collect()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
