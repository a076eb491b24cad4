"""Run every benchmark and write benchmarks/RESULTS.md.

    pip install -e '.[bench,test]'              # the test extra: torch and the model for bench_embed.py
    python benchmarks/run_all.py                 # 7.7k, 100k and 1M records (about 25-40 minutes)
    python benchmarks/run_all.py --quick         # 7.7k and 100k only

Each script prints medians and ratios measured in the same run; this runner keeps
their printed output verbatim in RESULTS.md, under the machine they ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    import numpy
    import pyarrow

    return (f"{platform.platform()}, {os.cpu_count()} cores ({cpu}){mem}; Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, pyarrow {pyarrow.__version__}; load average at start {load:.1f}")


def run(title: str, argv: list[str], what: str) -> str:
    print(f"== {title}: {' '.join(argv)}", flush=True)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, *argv], cwd=HERE.parent, capture_output=True, text=True)
    took = time.perf_counter() - t
    sys.stdout.write(p.stdout[-3000:])
    status = "" if p.returncode == 0 else f" (exit {p.returncode})\n\n```\n{p.stderr[-4000:]}\n```"
    return (f"## {title}\n\n{what}\n\n`python {' '.join(argv)}` ({took:.0f} s){status}\n\n```\n{p.stdout.strip()}\n```\n")


KEPT = "<!-- kept by hand: benchmarks/run_all.py rewrites the sections above and keeps this one -->"


def kept_by_hand(out: Path) -> str:
    """The part of ``out`` from the KEPT line on (figures the docs quoted, with their history), which
    no benchmark prints and a new run must not lose; empty when there is none."""
    try:
        text = out.read_text()
    except OSError:
        return ""
    at = text.find(KEPT)
    return "\n" + text[at:] if at >= 0 else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 1M-record sizes")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = ap.parse_args()
    sizes = "7761,100000" if args.quick else "7761,100000,1000000"
    parts = [
        run("In-process query latency", ["benchmarks/bench_query.py", "--sizes", sizes, "--queries", "200"],
            "cybmem's ranking against bm25s and rank_bm25 on the same records and queries, and against a "
            "scipy sparse-matrix floor (postings of the query terms + one dense re-rank pass). Medians of "
            "200 queries of 3-8 words; systems timed in turn on each query."),
        run("Against Tantivy and SQLite FTS5", ["benchmarks/bench_peers.py", "--sizes", "7761" if args.quick else "7761,100000"],
            "cybmem's BM25 kernel, its full ranking and the public `search()` on a held snapshot against Tantivy, "
            "SQLite FTS5 and bm25s on the same token lists and bench_query.py's queries (300 queries, engines taking "
            "turns on each, three runs, medians and ratios to Tantivy); top-10 agreement with ties counted; index "
            "build, size on disk, the load from the record files with its peak memory, and their growth from 10k "
            "records. 1M records is opt-in (`--sizes 7761,100k,1M`, about 20 minutes)."),
        run("Load, refresh and warm CLI", ["benchmarks/bench_store.py", "--sizes", "7761,100000"],
            "Cold load against read + orjson-parse of the same files; refresh after one new record "
            "against the cold load; warm `cybmem search` / `cybmem inject` wall time against a bare "
            "interpreter importing exactly the packages the command imports."),
        run("Retrieval quality", ["benchmarks/bench_quality.py"],
            "MRR@10, recall@10 and nDCG@10 on the corpus qrels, replayed as of each query's moment through "
            "the production search path, default weights against single axes."),
        run("Defaults that hold on every history, and self-tuning", ["benchmarks/bench_fit.py"],
            "MRR@10 on the judged queries of pytest, mypy, sphinx and the newest 1k of pytest, side by side: "
            "the corpora's BM25 + recency baseline, the old and new defaults, recency measured in runs or in "
            "the project's typical gap, leave-one-history-out, and `cybmem tune --save` as of the median query "
            "moment scored on the queries after it."),
        run("The block shows what memory found", ["benchmarks/bench_block.py", "--sample", "150"],
            "Per dev history, each threshold chosen with that history left out: a real task's judged-relevant "
            "run in the block (in full or as a pointer), the blocks' length, the judged open issue named, "
            "follow-ups with their parent first, and how often tasks from elsewhere (the other histories, "
            "react-router's and nginx's changelogs) get the one line; no gate, the old floor and the rule."),
        run("What the dispatch block holds", ["benchmarks/bench_dispatch.py"],
            "The MEMORY block on the corpus qrels, before (top 3, newest issues first) and after (ranked "
            "issues, top k): the share of runs and issues in the block, tokens, how often a judged relevant "
            "run is shown and how often a judged open issue is listed."),
        run("Stemming", ["benchmarks/bench_stem.py"],
            "Snowball stemming against the plain tokenizer: MRR@10 on the qrels, cold index build and query "
            "time ratios."),
        run("Redaction", ["benchmarks/bench_redact.py"],
            "Precision and recall per secret kind on the redaction corpus, false alarms on real commit "
            "messages and synthetic worker output, throughput."),
        run("Secret detection on shapes cybmem was not written from", ["benchmarks/bench_secrets.py"],
            "Recall on gitleaks' and detect-secrets' own examples (data-fixtures/secret-examples.jsonl), "
            "recall on the issue 29 secret families (tests/data/secret-families.jsonl: dev and held-out), "
            "false alarms on every commit message of the four dev histories, cost per record, and "
            "detect-secrets and Kingfisher on the same examples when installed (the bench extra)."),
        run("Weight search", ["benchmarks/bench_tune.py"],
            "Grid search over w_kw, w_rec, w_lin on the corpus replicated to 20k records, 500 queries."),
        run("Embeddings and the vector axis", ["benchmarks/bench_embed.py", "--size", "100000", "--queries", "200"],
            "The corpus embedded through a real all-MiniLM-L6-v2 HTTP server (`cybmem embed`) against the model "
            "alone; MRR@10 on the qrels with and without the vector axis (a sweep of w_vec); the cost of the "
            "cosine axis per query at 100k records, exact mat-vec against binary quantisation with exact "
            "rescoring, and the ranking agreement. Needs the test extra (torch, the model)."),
        run("The fleet on Dask", ["benchmarks/bench_fleet.py"] + (["--copies", "8", "--inline-sizes", "1,2,4,8",
                                                                   "--dask-sizes", "4,8"] if args.quick else []),
            "Search and the issue fold over every machine's export (8 machines, millions of runs as Parquet): "
            "Dask on a LocalCluster against the same partition functions in one process; times and each "
            "process's own peak memory."),
        run("The MCP server", ["benchmarks/bench_mcp.py"],
            "Per-call latency of `cybmem mcp` over stdio, driven by the MCP SDK's client, for `search` and "
            "`memory_block` on the 7.7k corpus (warm: the snapshot held in the server), beside the same calls "
            "in process and the CLI (`cybmem search`, `cybmem inject --system` subprocesses) on the same queries."),
        run("The agent hooks", ["benchmarks/bench_hooks.py"],
            "`cybmem hook` as Claude Code runs it, whole processes, on mypy's 10.2k runs: UserPromptSubmit and "
            "SessionStart on a warm store taking turns with the import floor of a warm inject (`import numpy, "
            "pyarrow, pyarrow.ipc, typer, orjson`), what they send the model (characters, tokens), and Stop and "
            "SessionEnd at the end of a 50 MB transcript."),
        run("The SQLite export beside sqlite-utils", ["benchmarks/bench_sqlite_export.py"],
            "`cybmem export sqlite` against sqlite-utils writing the same database (its upsert of every row, "
            "and of the new and changed rows only) on the fixtures and the 7.7k corpus: the format compared, "
            "then a first export and a re-export with nothing new."),
        run("The worst inputs, at 1x, 2x and 4x", ["benchmarks/bench_worst_inputs.py"],
            "The crafted inputs that once took quadratic time (issue 41: nested `TASK:` wrappers, nested inline "
            "blocks, 300,000 NEXT and 50,000 ISSUES bullets, a bullet wrapped over 200,000 lines, MCP answers of "
            "100,000 hits in the shown log) down the path they were timed on, each at 1x, 2x and 4x with its ratio "
            "to 1x (linear: ~2x, ~4x), and ordinary text of the 4x size down the same path."),
        run("Index compaction", ["benchmarks/bench_compaction.py", "--sizes", "7761,100000"],
            "index.json compacted to 500 entries against the full index: its size, the check against records/ "
            "every reader of the index makes, the write path's latest_run_id, and `cybmem chain` (it walks the "
            "cached snapshot, archived runs included)."),
    ]
    header = (f"# Benchmark results\n\nLatest run: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"`python benchmarks/run_all.py{' --quick' if args.quick else ''}`.\n\nMachine: {machine()}.\n\n"
              "The machines are shared and noisy: read the ratios (measured in the same run), not the absolute "
              "times.\n\n")
    args.out.write_text(header + "\n".join(parts) + kept_by_hand(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
