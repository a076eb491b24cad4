"""What the Snowball stemmer costs: a cold keyword-index build and a query, with and without it.

    python benchmarks/bench_stem.py [--sizes 7761,100000] [--queries 200] [--repeat 3] [--json out.json]

The same records (the pytest corpus, replicated to the larger sizes) and the same queries, once
with cybmem's tokenizer as it is and once with its stemmer replaced by the identity, in the same
run. "cold build" = tokenize every record's keyword text with an empty word cache + build the
BM25 index (what a first load pays on top of parsing); "query" = tokenize a query (empty word
cache, as in a fresh CLI process) + score it over the index + take the top 10. Medians; the
dispatch issue's target is at most 1.20x for both.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus as C  # noqa: E402

from cybmem.retrieval import scoring  # noqa: E402
from cybmem.store import tokens as text  # noqa: E402
from cybmem.store.keyword_index import KeywordIndex  # noqa: E402

_STEM = text._STEM


def _stemming(on: bool) -> None:
    text._STEM = _STEM if on else (lambda word: word)
    text._WORD_CACHE.clear()


def cold_build(texts: list[str]) -> KeywordIndex:
    text._WORD_CACHE.clear()
    return KeywordIndex.build(text.tokenize_many(texts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="7761,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    recs = C.load_records(C.ensure_corpus())
    base = [C.record_text(r) for r in recs]
    rng = random.Random(11)
    queries = [" ".join(rng.choice(base).split()[:rng.randint(3, 8)]) for _ in range(args.queries)]
    out = {}
    for n in (int(x) for x in args.sizes.split(",")):
        texts = (base * (n // len(base) + 1))[:n]
        row = {}
        for on in (False, True):
            _stemming(on)
            build = statistics.median(_timed(lambda: cold_build(texts)) for _ in range(args.repeat))
            index = cold_build(texts)
            times = []
            for q in queries:
                text._WORD_CACHE.clear()
                t0 = time.perf_counter_ns()
                scoring.top_k(index.scores(text.tokenize(q)), 10)
                times.append(time.perf_counter_ns() - t0)
            row["stem" if on else "plain"] = {"cold_build_s": build, "query_median_us": statistics.median(times) / 1e3,
                                              "vocabulary": sum(len(s.vocab) for s in index._segments)}
        _stemming(True)
        plain, stem = row["plain"], row["stem"]
        row["build_ratio"] = stem["cold_build_s"] / plain["cold_build_s"]
        row["query_ratio"] = stem["query_median_us"] / plain["query_median_us"]
        out[str(n)] = row
        print(f"== {n:,} records")
        print(f"  cold build   plain {plain['cold_build_s']:7.2f} s   stemmed {stem['cold_build_s']:7.2f} s   x{row['build_ratio']:.2f}")
        print(f"  query        plain {plain['query_median_us']:7.0f} us  stemmed {stem['query_median_us']:7.0f} us  x{row['query_ratio']:.2f}")
        print(f"  vocabulary   plain {plain['vocabulary']:7,}     stemmed {stem['vocabulary']:7,}")
    print("target: stemming slows a query or a cold build by at most 1.20x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
