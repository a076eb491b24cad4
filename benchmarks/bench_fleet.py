"""The fleet on Dask vs one process: search and issue-fold times and peak memory over millions of runs.

Usage:
    python benchmarks/bench_fleet.py                       # 8 machines x 33 corpus copies = 2,048,904 runs
    python benchmarks/bench_fleet.py --machines 8 --copies 33 --inline-sizes 1,2,4,8 --json out.json
    python benchmarks/bench_fleet.py --crossover 1k,1x1,4x1,8x1,8x2,8x4   # where a LocalCluster starts to pay off

``--crossover`` times what a user runs, ``cybmem fleet search`` in a fresh process, with
``--scheduler inline`` and ``--scheduler local`` on datasets of growing size (``1k``: the 1,011-run
pytest history exported once; ``MxC``: M machines of C corpus copies, generated as below), and
prints the Parquet size where the LocalCluster starts to win: ``scheduler="auto"``'s threshold
(cybmem.exchange.fleet.INLINE_MAX_BYTES).

The dataset is generated once under ``benchmarks/.data/fleet-<machines>x<copies>/``, directly as
Parquet in the export's schema (never as JSON files): the 7,761-run pytest corpus is exported once
with ``cybmem.exchange.export.export_parquet`` (the real writer), then each machine gets ``copies`` copies
of that table with run ids (and every link to them) and issue ids suffixed ``.m<machine>c<copy>``,
times shifted by a minute per copy, ledger lines renumbered after the previous copy's; one
Hive partition per machine, project and month, as an export writes it.

Each measurement runs in a fresh subprocess (so peak RSS is its own):

  dask    ``Fleet(dataset)``: a LocalCluster of 2 worker processes, 1 thread each
  inline  ``Fleet(dataset, scheduler="inline")``: the same partition functions in one process
          (the single-process pandas run), at growing sizes (first 1, 2, 4, 8 machines) until the
          next size's projected peak exceeds the memory budget (default: 60% of RAM)

and reports: open (cluster start), the first search (reads, tokenizes and indexes every
partition, then scores), warm searches (indexes kept; median of 20 queries of 3-8 corpus
tokens), the issue fold gathered as one pandas frame (``Fleet.issues``, median of 3), the fold
kept on the cluster and counted (``Fleet.issue_summary``, median of 3); peak RSS of the driver
process and of each worker (``VmHWM``).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _corpus as C  # noqa: E402

CORPUS = Path("/work/corpus/pytest-memory")
QUERIES = 20
NOW_MS = 1_800_000_000_000  # 2027-01-15: after every generated run


# --- the dataset ----------------------------------------------------------------------------


def _corpus_root() -> Path:
    return CORPUS if (CORPUS / "projects.json").is_file() else C.ensure_corpus()


def _base_tables(work: Path):
    """The corpus exported once with the real writer, read back: (records, events) in the export schema."""
    import shutil

    from cybmem.exchange.export import export_parquet, read_dataset
    from cybmem.store.memory_store import MemoryStore

    base = work / "base"
    if not (base / "records").is_dir():
        src = work / "corpus"  # a private copy: loading writes the Arrow cache next to the store
        if not src.exists():
            shutil.copytree(_corpus_root(), src)
        export_parquet(MemoryStore(src, "pytest"), base, machine="base", progress=False)
    recs = read_dataset(base, "records").to_table()
    evs = read_dataset(base, "issues").to_table()
    drop = ["machine", "project", "month"]
    return recs.drop_columns(drop).sort_by([("endedAt", "ascending"), ("runId", "ascending")]), \
        evs.drop_columns(drop).sort_by("line")


def _suffix(col, suffix: str):
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(col, pa.scalar(suffix), "")


def _suffix_list(col, suffix: str):
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    values = pc.binary_join_element_wise(arr.values, pa.scalar(suffix), "")
    return pa.ListArray.from_arrays(arr.offsets, values, mask=arr.is_null())


def generate(out: Path, machines: int, copies: int) -> Path:
    """Write the dataset (skipped when it is already there); returns its directory."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from cybmem.exchange.export import ISSUES_SCHEMA, PARTITION_SCHEMA, RECORDS_SCHEMA

    done = out / ".complete"
    if done.exists():
        return out
    C.DATA_DIR.mkdir(parents=True, exist_ok=True)
    gi = C.DATA_DIR / ".gitignore"
    if not gi.exists():
        gi.write_text("# benchmark cache, never committed\n*\n")
    recs, evs = _base_tables(C.DATA_DIR)
    t0 = time.perf_counter()
    n_events = evs.num_rows
    for m in range(machines):
        name = f"m{m:02d}"
        rparts, eparts = [], []
        for c in range(copies):
            sfx = f".m{m}c{c}"
            shift = pa.scalar(c * 60_000 + m * 1_000, pa.duration("ms"))
            r = recs
            for col in ("runId", "parentRunId", "previousRunId", "rootRunId", "chatSessionId", "supersedes", "supersededBy"):
                r = r.set_column(r.schema.get_field_index(col), col, _suffix(r.column(col), sfx))
            for col in ("startedAt", "endedAt"):
                r = r.set_column(r.schema.get_field_index(col), col, pc.add(r.column(col), shift))
            r = r.set_column(r.schema.get_field_index("issues"), "issues", _suffix_list(r.column("issues"), sfx))
            rparts.append(r)
            e = evs
            for col in ("issueId", "byRunId"):
                e = e.set_column(e.schema.get_field_index(col), col, _suffix(e.column(col), sfx))
            e = e.set_column(e.schema.get_field_index("at"), "at", pc.add(e.column("at"), shift))
            e = e.set_column(e.schema.get_field_index("line"), "line", pc.add(e.column("line"), c * n_events))
            eparts.append(e)
        for table, parts, schema, tcol in (("records", rparts, RECORDS_SCHEMA, "endedAt"),
                                           ("issues", eparts, ISSUES_SCHEMA, "at")):
            t = pa.concat_tables(parts).cast(schema)
            n = t.num_rows
            t = t.append_column("machine", pa.array([name] * n, pa.string()))
            t = t.append_column("project", pa.array(["pytest"] * n, pa.string()))
            t = t.append_column("month", pc.strftime(t.column(tcol), format="%Y-%m"))
            ds.write_dataset(t, out / table, format="parquet", partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
                             basename_template=f"part-gen-{name}-{{i}}.parquet", existing_data_behavior="overwrite_or_ignore",
                             file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
                             max_rows_per_group=1 << 20)
        print(f"  machine {name}: {copies * recs.num_rows:,} runs, {copies * n_events:,} events "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    done.write_text(json.dumps({"machines": machines, "copies": copies, "runs": machines * copies * recs.num_rows}))
    return out


def _queries(n: int, seed: int = 0) -> list[str]:
    from cybmem.store.tokens import tokenize

    recs = C.load_records(_corpus_root())
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        toks = list(dict.fromkeys(tokenize(C.record_text(rng.choice(recs)))))
        if len(toks) < 3:
            continue
        k = rng.randint(3, min(8, len(toks)))
        i = rng.randint(0, len(toks) - k)
        out.append(" ".join(toks[i:i + k]))
    return out


# --- one measurement (a subprocess) ----------------------------------------------------------


def _peak_mb() -> float:
    """This process's peak RSS in MB: VmHWM, which starts afresh at exec (ru_maxrss keeps the parent's
    peak across fork + exec, so a child of a big process would report the parent's)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker_peak_mb() -> float:
    return _peak_mb()


def measure(dataset: Path, mode: str, what: str, n_machines: int, workers: int) -> dict:
    from cybmem.exchange.fleet import Fleet, scan_dataset

    machines = sorted({g.machine for g in scan_dataset(dataset)})[:n_machines]
    kw = {"scheduler": "inline"} if mode == "inline" else {"scheduler": "local", "workers": workers, "threads_per_worker": 1,
                                                           "processes": True}
    out: dict = {"mode": mode, "what": what, "machines": len(machines)}
    t = time.perf_counter()
    with Fleet(dataset, machines=machines, progress=False, **kw) as fleet:
        out["open_s"] = time.perf_counter() - t
        if what == "search":
            qs = _queries(QUERIES + 1)
            t = time.perf_counter()
            first = fleet.search(qs[0], k=10, now_ms=NOW_MS)
            out["first_search_s"] = time.perf_counter() - t
            out["runs"] = first.records
            times = []
            for q in qs[1:]:
                t = time.perf_counter()
                fleet.search(q, k=10, now_ms=NOW_MS)
                times.append(time.perf_counter() - t)
            out["search_median_s"] = statistics.median(times)
            out["search_p90_s"] = sorted(times)[int(0.9 * len(times))]
        else:
            times, summ = [], []
            for _ in range(3):
                t = time.perf_counter()
                fold = fleet.issues(now=NOW_MS)
                times.append(time.perf_counter() - t)
                out["issues"] = len(fold)
                del fold
                t = time.perf_counter()
                fleet.issue_summary(now=NOW_MS)
                summ.append(time.perf_counter() - t)
            out["fold_median_s"] = statistics.median(times)
            out["summary_median_s"] = statistics.median(summ)
        if fleet.client is not None:
            out["worker_peak_mb"] = sorted(fleet.client.run(_worker_peak_mb).values())
    out["driver_peak_mb"] = _peak_mb()
    out["total_peak_mb"] = out["driver_peak_mb"] + sum(out.get("worker_peak_mb", []))
    return out


def _run(dataset: Path, mode: str, what: str, n: int, workers: int) -> dict:
    p = subprocess.run([sys.executable, __file__, "--measure", mode, what, str(n), "--dataset", str(dataset),
                        "--workers", str(workers)], capture_output=True, text=True)
    if p.returncode != 0:
        return {"mode": mode, "what": what, "machines": n, "error": p.stderr.strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _crossover_dataset(size: str) -> Path:
    """``1k``: the 1k-run pytest history exported as one machine; ``MxC``: :func:`generate`'s dataset."""
    if size == "1k":
        out = C.DATA_DIR / "fleet-1k"
        if not (out / ".complete").exists():
            from cybmem.exchange.export import all_stores, export_parquet

            src = C.DATA_DIR / "fleet-1k-memory"  # a private copy: loading writes the Arrow cache next to the store
            if not src.exists():
                import shutil

                shutil.copytree(C.ensure_corpus("pytest-memory-1k"), src)
            export_parquet(all_stores(src), out, machine="m00", progress=False)
            (out / ".complete").write_text("{}")
        return out
    m, c = (int(x) for x in size.split("x"))
    return generate(C.DATA_DIR / f"fleet-{m}x{c}", m, c)


def crossover(sizes: list[str], workers: int, repeat: int) -> list[dict]:
    """`cybmem fleet search` in a fresh process, inline and on a LocalCluster, at each size (best of ``repeat``)."""
    query = _queries(1)[0]
    rows = []
    print(f"== `cybmem fleet search {query!r} -k 10 --json` in a fresh process, best of {repeat}; LocalCluster of {workers} "
          "worker processes", flush=True)
    print(f"   {'dataset':>8} {'runs':>9} {'Parquet':>9} {'inline':>8} {'local':>8}", flush=True)
    for size in sizes:
        dataset = _crossover_dataset(size)
        mb = sum(p.stat().st_size for p in dataset.rglob("*.parquet")) / 1e6
        row = {"dataset": size, "parquet_mb": round(mb, 1)}
        for mode in ("inline", "local"):
            best = None
            for _ in range(repeat):
                t = time.perf_counter()
                p = subprocess.run([sys.executable, "-m", "cybmem.cli", "fleet", "search", query, "--dataset", str(dataset),
                                    "-k", "10", "--json", "--scheduler", mode, "--workers", str(workers), "--no-progress"],
                                   capture_output=True, text=True)
                took = time.perf_counter() - t
                if p.returncode != 0:
                    raise SystemExit(f"{mode} at {size}: {p.stderr.strip()}")
                best = took if best is None else min(best, took)
                row["runs"] = json.loads(p.stdout)["records"]
            row[f"{mode}_s"] = round(best, 2)
        rows.append(row)
        print(f"   {size:>8} {row['runs']:>9,} {mb:>6.1f} MB {row['inline_s']:>6.1f} s {row['local_s']:>6.1f} s", flush=True)
    wins = [r for r in rows if r["local_s"] < r["inline_s"]]
    print("== the LocalCluster first wins at " + (f"{wins[0]['parquet_mb']} MB ({wins[0]['runs']:,} runs)" if wins
                                                   else "none of these sizes"), flush=True)
    return rows


def _mem_total_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            return int(line.split()[1]) / 1024
    return float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machines", type=int, default=8)
    ap.add_argument("--copies", type=int, default=33, help="corpus copies per machine (33 x 7,761 = 256,113 runs)")
    ap.add_argument("--inline-sizes", default="1,2,4,8", help="machines in each single-process run, growing")
    ap.add_argument("--dask-sizes", default="2,8", help="machines in each Dask run")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget-mb", type=float, default=None, help="single-process memory budget (default: 60%% of RAM)")
    ap.add_argument("--dataset", type=Path, default=None)
    ap.add_argument("--measure", nargs=3, metavar=("MODE", "WHAT", "MACHINES"), help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--crossover", default=None, help="sizes (1k, MxC) at which to time `cybmem fleet search` inline and local")
    ap.add_argument("--repeat", type=int, default=2, help="--crossover: runs per size and scheduler (the best is kept)")
    a = ap.parse_args()
    if a.crossover:
        rows = crossover(a.crossover.split(","), a.workers, a.repeat)
        if a.json:
            a.json.write_text(json.dumps({"crossover": rows}, indent=2))
        return
    if a.measure:
        mode, what, n = a.measure
        print(json.dumps(measure(a.dataset, mode, what, int(n), a.workers)))
        return
    dataset = a.dataset or C.DATA_DIR / f"fleet-{a.machines}x{a.copies}"
    print(f"== dataset {dataset}", flush=True)
    t = time.perf_counter()
    generate(dataset, a.machines, a.copies)
    meta = json.loads((dataset / ".complete").read_text())
    files = sum(1 for _ in dataset.rglob("*.parquet"))
    size = sum(p.stat().st_size for p in dataset.rglob("*.parquet"))
    print(f"   {meta['runs']:,} runs from {meta['machines']} machines, {files:,} Parquet files, {size / 2**20:.0f} MiB "
          f"(ready in {time.perf_counter() - t:.0f} s)", flush=True)
    per_machine = meta["runs"] // meta["machines"]
    budget = a.budget_mb or 0.6 * _mem_total_mb()
    results = []

    print(f"== single process (scheduler='inline'), memory budget {budget / 1024:.1f} GiB", flush=True)
    last: dict[str, dict] = {}
    for n in [int(x) for x in a.inline_sizes.split(",")]:
        runs = []
        for what in ("search", "fold"):
            prev = last.get(what)
            if prev and prev.get("total_peak_mb") and prev["total_peak_mb"] / prev["machines"] * n > budget:
                print(f"   {n} machines: {what} skipped, projected peak {prev['total_peak_mb'] / prev['machines'] * n / 1024:.1f} GiB "
                      "is over the budget", flush=True)
                continue
            r = _run(dataset, "inline", what, n, a.workers)
            last[what] = r
            runs.append(r)
            results.append(r)
        for r in runs:
            print("   " + _line(r, per_machine), flush=True)
    print(f"== Dask LocalCluster, {a.workers} worker processes x 1 thread", flush=True)
    for n in [int(x) for x in a.dask_sizes.split(",")]:
        for what in ("search", "fold"):
            r = _run(dataset, "dask", what, n, a.workers)
            results.append(r)
            print("   " + _line(r, per_machine), flush=True)

    print("== ratios (Dask / single process, same size; < 1: Dask faster or smaller)")
    for what, keys in (("search", ("first_search_s", "search_median_s", "total_peak_mb")),
                       ("fold", ("fold_median_s", "summary_median_s", "total_peak_mb"))):
        for n in [int(x) for x in a.dask_sizes.split(",")]:
            d = next((r for r in results if r["mode"] == "dask" and r["what"] == what and r["machines"] == n), None)
            s = next((r for r in results if r["mode"] == "inline" and r["what"] == what and r["machines"] == n), None)
            if not d or not s or "error" in d or "error" in s:
                print(f"   {what} at {n * per_machine:,} runs: no single-process run of this size to compare with")
                continue
            print(f"   {what} at {n * per_machine:,} runs: " + ", ".join(f"{k} {d[k] / s[k]:.2f}x" for k in keys))
    if a.json:
        a.json.write_text(json.dumps({"dataset": meta, "budget_mb": budget, "results": results}, indent=2))


def _line(r: dict, per_machine: int) -> str:
    runs = r["machines"] * per_machine
    if "error" in r:
        return f"{r['mode']:6} {r['what']:6} {runs:>9,} runs: failed: {' '.join(r['error'])}"
    mem = f"peak {r['total_peak_mb'] / 1024:.2f} GiB (driver {r['driver_peak_mb']:.0f} MB" + (
        f", workers {' + '.join(f'{w:.0f}' for w in r['worker_peak_mb'])} MB)" if r.get("worker_peak_mb") else ")")
    if r["what"] == "search":
        return (f"{r['mode']:6} search {runs:>9,} runs: open {r['open_s']:.1f} s, first search {r['first_search_s']:.1f} s, "
                f"then median {r['search_median_s'] * 1000:.0f} ms (p90 {r['search_p90_s'] * 1000:.0f} ms); {mem}")
    return (f"{r['mode']:6} fold   {runs:>9,} runs: open {r['open_s']:.1f} s, fold gathered median {r['fold_median_s']:.1f} s "
            f"({r['issues']:,} issues), counted on the cluster median {r['summary_median_s']:.1f} s; {mem}")


if __name__ == "__main__":
    main()
