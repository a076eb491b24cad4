"""index.json compaction at 7.7k and 100k records: size, the index check, the write path's reads, chain.

    python benchmarks/bench_compaction.py [--sizes 7761,100000] [--repeat 5]

For each size, a copy of the store (the real corpus, or it replicated as bench_store.py writes
it) gets a compacted index (CYBERINE_MEMORY_INDEX_CAP 500, the default) and a full one
(`rebuild --full`), and both are timed the same way: index.json's size; the check every reader
of the index makes (read index.json, list records/, merge: ``MemoryStore.index_entries``), which
must not re-read archived records; ``latest_run_id`` (what every `cybmem write` asks to link
previousRunId); ``all_entries`` (every entry, archived ones read from their record files: what
the Python API gives a tool that wants index entries); and the wall time of `cybmem chain <newest
run>` as a subprocess (it walks the Arrow snapshot, not index.json, as `cybmem list` does).
Medians; the full index is the baseline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _corpus  # noqa: E402
from bench_store import median_time, store_for  # noqa: E402

from cybmem.store.memory_store import MemoryStore  # noqa: E402

SLUG = "pytest"


def median(fn, repeat: int) -> float:
    """bench_store's median wall time, after one warm-up call."""
    fn()
    return median_time(fn, repeat)


def bench(n: int, repeat: int) -> None:
    src = store_for(n)
    root = _corpus.DATA_DIR / f"compaction-{n}"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(src, root, ignore=shutil.ignore_patterns(".cache", "*.lock", "qrels.jsonl", "archive-summary.md", "index.json"))
    print(f"\n=== {n:,} records ===", flush=True)
    figures = {}
    for label, full in (("full", True), ("compacted (cap 500)", False)):
        store = MemoryStore(root, SLUG, index_cap=500)
        t = time.perf_counter()
        store.rebuild_index(full=full)
        rebuilt = time.perf_counter() - t
        size = store.index_path.stat().st_size
        reads = []
        real = MemoryStore.read_record_st
        MemoryStore.read_record_st = lambda self, rid: reads.append(rid) or real(self, rid)
        try:
            MemoryStore(root, SLUG).index_entries()
        finally:
            MemoryStore.read_record_st = real
        check = median(lambda: MemoryStore(root, SLUG).index_entries(), repeat)
        top = median(lambda: MemoryStore(root, SLUG).latest_run_id(), repeat)
        every = median(lambda: MemoryStore(root, SLUG).all_entries(), max(1, repeat // 2))
        newest = MemoryStore(root, SLUG).latest_run_id()
        env = {**os.environ, "CYBERINE_MEMORY_DIR": str(root)}
        exe = _corpus.cybmem_exe()
        cli = median(lambda: subprocess.run([exe, "chain", newest, "-p", SLUG], env=env, capture_output=True, check=True),
                     max(1, repeat // 2))
        figures[label] = (size, check, top, every, cli)
        print(f"  {label:<20} index.json {size / 2**20:6.2f} MB (rebuilt in {rebuilt:.1f}s); records read by the check: "
              f"{len(reads)}; check {check * 1e3:7.1f} ms; latest_run_id {top * 1e3:7.1f} ms; all_entries {every:6.2f} s; "
              f"`cybmem chain` {cli:5.2f} s", flush=True)
    f, c = figures["full"], figures["compacted (cap 500)"]
    print(f"  compacted / full: index.json {c[0] / f[0]:.3f}x, check {c[1] / f[1]:.2f}x, latest_run_id {c[2] / f[2]:.2f}x, "
          f"all_entries {c[3] / f[3]:.2f}x, `cybmem chain` {c[4] / f[4]:.2f}x")
    shutil.rmtree(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="7761,100000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for n in (int(x) for x in args.sizes.split(",")):
        bench(n, args.repeat)


if __name__ == "__main__":
    main()
