"""Two checkouts of cybmem, each installed in its own venv, measured taking turns in one run.

    python benchmarks/compare_trees.py BEFORE AFTER [--size 7761] [--rounds 9] [--cli-runs 30]

BEFORE and AFTER are repository roots, each with ``.venv`` (``pip install -e '.[bench]'``) and a
store under ``benchmarks/.data/store-<size>`` (``bench_store.py --sizes <size>`` writes it). On a
shared machine whose load moves from minute to minute, running whole benchmarks one tree after the
other compares two minutes, not two trees; here each round runs the trees in turn (alternating which
goes first) in a fresh process each: a cold load (the cache thrown away), the median of 300 warm
loads, one refresh after a new record, ``rank_query`` (top 10) over 50 queries; then ``--cli-runs``
warm ``cybmem inject`` and ``cybmem search`` of the console script each, alternating. Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SLUG = "pytest"
QUERY = "fixture teardown order with parametrize and xdist"
QUERIES = [QUERY, "flaky test xdist worker crash", "assertion rewriting import hook", "capture fixture stdout stderr",
           "parametrize ids with unicode", "conftest plugin discovery order", "tmp_path cleanup on windows",
           "marker registration strict", "doctest collection modules", "junitxml report properties"] * 5

#: What one round measures in one tree, run by that tree's interpreter.
_ROUND = r"""
import json, statistics, sys, time
from pathlib import Path
import orjson
from cybmem.retrieval.search import rank_query
from cybmem.retrieval.weights import Weights
from cybmem.store import cache
from cybmem.store.loading import load_snapshot
from cybmem.store.memory_store import MemoryStore

root, slug, queries = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
store = MemoryStore(root, slug)
out = {}
cache.discard(cache.cache_dir(store.dir))
t = time.perf_counter(); load_snapshot(store); out["cold load (ms)"] = (time.perf_counter() - t) * 1e3
warm = []
for _ in range(300):
    t = time.perf_counter(); snap = load_snapshot(store); warm.append(time.perf_counter() - t)
out["warm load (us)"] = statistics.median(warm) * 1e6
template = orjson.loads(next((root / slug / "records").iterdir()).read_bytes())
rec = dict(template, runId=f"compare-new-{time.time_ns()}", endedAt=template["endedAt"] + 1, task="a brand new task")
path = root / slug / "records" / f"{rec['runId']}.json"
path.write_bytes(orjson.dumps(rec))
try:
    t = time.perf_counter(); assert load_snapshot(store).parsed == 1; out["refresh, 1 new (ms)"] = (time.perf_counter() - t) * 1e3
finally:
    path.unlink()
load_snapshot(store)
snap = load_snapshot(store)
w = Weights()
rank_query(snap, queries[0], k=10, weights=w)
times = []
for q in queries:
    t = time.perf_counter(); rank_query(snap, q, k=10, weights=w); times.append(time.perf_counter() - t)
out["rank_query (us)"] = statistics.median(times) * 1e6
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--size", default="7761")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cli-runs", type=int, default=30)
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    cli: dict[str, dict[str, list[float]]] = {name: {"inject": [], "search": []} for name in trees}

    def order(i: int) -> list[str]:
        return list(trees) if i % 2 == 0 else list(reversed(trees))

    for i in range(args.rounds):
        for name in order(i):
            root = f"{trees[name]}/benchmarks/.data/store-{args.size}"
            done = subprocess.run([f"{trees[name]}/.venv/bin/python", "-c", _ROUND, root, SLUG, json.dumps(QUERIES)],
                                  capture_output=True, text=True, check=True, cwd=trees[name])
            rounds[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"round {i + 1} of {args.rounds}", file=sys.stderr, flush=True)
    for i in range(args.cli_runs):
        for name in order(i):
            env = {**os.environ, "CYBERINE_MEMORY_DIR": f"{trees[name]}/benchmarks/.data/store-{args.size}"}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            for cmd in cli[name]:
                t = time.perf_counter()
                subprocess.run([f"{trees[name]}/.venv/bin/cybmem", cmd, QUERY, "--project", SLUG], env=env,
                               capture_output=True, check=True)
                cli[name][cmd].append((time.perf_counter() - t) * 1e3)
    print(f"{args.size} records; {args.rounds} rounds, {args.cli_runs} console-script runs each, trees taking turns")
    print(f"{'figure':<28}{'before':>12}{'after':>12}{'after/before':>14}")
    for key in rounds["before"][0]:
        b = statistics.median(r[key] for r in rounds["before"])
        a = statistics.median(r[key] for r in rounds["after"])
        print(f"{key:<28}{b:12.1f}{a:12.1f}{a / b:13.2f}x")
    for cmd in ("inject", "search"):
        b, a = statistics.median(cli["before"][cmd]), statistics.median(cli["after"][cmd])
        print(f"{'cybmem ' + cmd + ' warm (ms)':<28}{b:12.1f}{a:12.1f}{a / b:13.2f}x")


if __name__ == "__main__":
    main()
