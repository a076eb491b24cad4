"""In-process query latency of cybmem's scorer vs bm25s, rank_bm25 and a scipy "floor".

Usage:
    python benchmarks/bench_query.py                      # sizes 7761,100000,1000000
    python benchmarks/bench_query.py --sizes 7761,100000 --queries 200 --json out.json

Documents are the pytest corpus records (task + outcome text, cybmem.store.tokens.tokenize);
100k and 1M are replicated copies (benchmarks/_corpus.replicate_columns). Every system gets
the same token lists. Queries: 3-8 consecutive distinct tokens of deterministically drawn
records. Each call is timed alone (perf_counter_ns) after a warm-up, systems round-robin per
query so a busy shared machine slows them alike; medians and p90s.

Systems:
  cybmem-kw     KeywordIndex.scores + top_k(10)
  cybmem-full   the production ranking, cybmem.retrieval.search.rank_query on a prepared snapshot:
                tokenize the query, BM25 over the postings, lineage, then keyword + recency +
                lineage scored exactly over the records that can reach the top 10 (below 20k
                records all of them; above, the bounded pool of candidates.candidate_pool), top 10
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

from cybmem.store import keyword_index as bm25, tokens as text  # noqa: E402
from cybmem.store.run_ids import RunLookup  # noqa: E402
from cybmem.retrieval import scoring as S, weights as W  # noqa: E402

K = 10


def _stats(ns: list[int]) -> dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3  # microseconds
    return {"median_us": float(np.median(a)), "p90_us": float(np.percentile(a, 90)), "n": len(a)}


def _time_queries(fn, queries, warmup: int = 5) -> list[int]:
    return C.time_round_robin({"fn": fn}, queries, warmup)["fn"]


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


#: The seed of the query set: bench_peers.py draws the same queries (:func:`query_set`).
QUERY_SEED = 1


def corpus_tokens(records) -> list[list[str]]:
    """Each record's benchmark text (_corpus.record_text), tokenized as cybmem indexes text."""
    return text.tokenize_many(C.record_text(r) for r in records)


def query_set(base_tokens: list[list[str]], n: int) -> list[list[str]]:
    """The benchmark's n queries (the first n of any longer set are the same)."""
    return make_queries(base_tokens, n, seed=QUERY_SEED)


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
    lookup = RunLookup.build(run_ids)
    print(f"prepare (replicate + columns + RunLookup): {time.perf_counter() - t0:.1f}s", flush=True)
    res: dict = {"n_docs": n}

    # ---- cybmem build / IPC round trip / refresh -------------------------------------
    gc.collect()
    t0 = time.perf_counter()
    idx = bm25.KeywordIndex.build(docs)
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
        loaded = bm25.KeywordIndex.from_arrow(pa.ipc.open_file(mm).read_all())
        loads.append(time.perf_counter_ns() - t0)
    res["cybmem_ipc_load_ms"] = float(np.median(loads)) / 1e6
    res["ipc_file_mb"] = path.stat().st_size / 2**20
    print(f"IPC write {res['cybmem_ipc_write_s']:.2f}s, file {res['ipc_file_mb']:.0f} MiB, "
          f"mmap load median {res['cybmem_ipc_load_ms']:.2f} ms", flush=True)

    queries = query_set(base_tokens, args.queries)
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
    weights = W.Weights()
    now = int(ended.max()) + 3_600_000
    # the new run: dispatched by the second-newest run, after the newest one
    ctx = S.LineageContext(parent_run_id=cols["runId"][-2], previous_run_id=cols["runId"][-1],
                           root_run_id=cols["rootRunId"][-1])

    # (scores(q, out=buf) is possible, but a fresh np.zeros measured faster than buf.fill(0))
    def cyb_kw(q):
        return S.top_k(idx.scores(q), K)

    from cybmem.store.snapshot import Snapshot
    from cybmem.retrieval.search import rank_query

    nulls = pa.nulls(n, pa.string())
    table = pa.table({
        "runId": pa.array(run_ids, pa.string()), "parentRunId": pa.array(parents, pa.string()),
        "previousRunId": pa.array(cols["previousRunId"], pa.string()), "rootRunId": pa.array(roots, pa.string()),
        "chatSessionId": pa.array(chats, pa.string()), "endedAt": pa.array(ended, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "supersedes": nulls, "supersededBy": nulls,
    })
    # Held as a long-lived caller holds it (load_snapshot's holders: the MCP server, the widget): prepared.
    snap = Snapshot(None, table, None, idx).prepare()
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

    times = C.time_round_robin(fns, queries)
    systems: dict[str, dict] = {name: _stats(ts) for name, ts in times.items()}
    X = retr = prior = None  # free them (the closures above are done)

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="7761,100000,1000000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    ap.add_argument("--skip-bm25s", action="store_true")
    ap.add_argument("--skip-rank-bm25", action="store_true")
    args = ap.parse_args(argv)
    out: dict = {"python": sys.version.split()[0], "numpy": np.__version__, "pyarrow": pa.__version__}
    t0 = time.perf_counter()
    root = C.ensure_corpus()
    base_recs = C.load_records(root)
    base_tokens = corpus_tokens(base_recs)
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
