"""Per-call latency of `cybmem mcp` on the real corpus, beside the in-process ranking and the CLI.

    python benchmarks/bench_mcp.py                    # 7,761 records, 60 queries, 12 CLI runs each
    python benchmarks/bench_mcp.py --queries 200 --cli-runs 20 --json out.json

One `cybmem mcp` subprocess over stdio and one over streamable HTTP (`cybmem mcp --http 0`, on
127.0.0.1), each driven by the MCP SDK's own client (what an agent's host does), are asked `search` (a query's subject line, k 10) and `memory_block` (the whole task) for
the corpus qrels queries, after a warm-up: the snapshot is held in memory, the cache is fresh.
In the same run, on the same queries, each call is timed against what it wraps, in process
(`cybmem.search` and `cybmem.inject_task`, under the same held snapshot, and `cybmem.search` on
the store, which loads the warm cache each time, as a one-shot process does), and against the
CLI (`cybmem search`, `cybmem inject --system` as subprocesses) on a prefix of the queries.
The calls take turns on each query, so load on a shared machine hits them alike. The protocol's
own cost per call is the difference between the server and the in-process call; the SDK client's
check of each answer against the tool's output schema (jsonschema, in the client) is timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402
from bench_store import SLUG, store_for  # noqa: E402


def _ms(ns: list[float]) -> tuple[float, float]:
    """Median and 90th percentile, in ms, of durations in seconds."""
    ordered = sorted(ns)
    return statistics.median(ordered) * 1000, ordered[min(int(0.9 * len(ordered)), len(ordered) - 1)] * 1000


@contextmanager
def _http_server(exe: str, root: Path, env: dict):
    """A `cybmem mcp --http 0` on ``root``; yields its URL (from the line it prints on stderr)."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with log.open("w") as errlog:
            proc = subprocess.Popen([exe, "mcp", "--http", "0", "--memory-dir", str(root), "--project", SLUG],
                                    stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog, env=env)
        try:
            deadline, found = time.monotonic() + 60, None
            while not found and proc.poll() is None and time.monotonic() < deadline:
                found = re.search(r"serving streamable HTTP at (http://127\.0\.0\.1:\d+/mcp)", log.read_text())
                time.sleep(0.05)
            if not found:
                raise SystemExit(f"cybmem mcp --http did not start: {log.read_text()}")
            yield found.group(1)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def measure(root: Path, queries: list[dict], cli_runs: int) -> dict[str, list[float]]:
    import anyio
    from mcp import Client, StdioServerParameters

    from cybmem import MemoryStore, Settings, inject_task, load_snapshot, search
    from cybmem.store.snapshot import holding_snapshots

    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # warm: bytecode cached, as an installed package has it
    exe = shutil.which("cybmem") or "cybmem"
    settings = Settings.from_env(memory_dir=root)
    store = MemoryStore.open(settings, project=SLUG)
    load_snapshot(store)  # a fresh cache
    subjects = [q["query"].strip().splitlines()[0] for q in queries]
    tasks = [q["query"] for q in queries]
    times: dict[str, list[float]] = {name: [] for name in (
        "in-process search (held snapshot)", "in-process search (store: warm cache load)", "mcp search (stdio)",
        "mcp search (HTTP)", "  of which the client's output-schema check", "cybmem search (CLI)",
        "in-process memory block (held snapshot)", "mcp memory_block (stdio)", "mcp memory_block (HTTP)",
        "cybmem inject --system (CLI)")}

    def timed(name: str, fn) -> object:
        t = time.perf_counter()
        out = fn()
        times[name].append(time.perf_counter() - t)
        return out

    def cli(argv: list[str]) -> None:
        subprocess.run([exe, *argv, "--project", SLUG, "--memory-dir", str(root)], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    server = StdioServerParameters(command=exe, args=["mcp", "--memory-dir", str(root), "--project", SLUG], env=env)

    async def call(client, name: str, tool: str, args: dict):
        t = time.perf_counter()
        result = await client.call_tool(tool, args)
        times[name].append(time.perf_counter() - t)
        assert not result.is_error, result.content[0].text
        return result

    async def run() -> None:
        t = time.perf_counter()
        with _http_server(exe, root, env) as url:
            async with Client(server) as client, Client(url) as web:
                print(f"servers up and connected in {time.perf_counter() - t:.2f}s", flush=True)
                for subject, task in list(zip(subjects, tasks))[:5]:  # warm-up: imports, the held snapshot
                    for c in (client, web):
                        await c.call_tool("search", {"query": subject})
                        await c.call_tool("memory_block", {"task": task})
                with holding_snapshots():
                    for subject, task in zip(subjects, tasks):
                        timed("in-process search (held snapshot)", lambda: search(store, subject, k=10, settings=settings))
                        result = await call(client, "mcp search (stdio)", "search", {"query": subject, "k": 10})
                        await call(web, "mcp search (HTTP)", "search", {"query": subject, "k": 10})
                        t = time.perf_counter()  # what call_tool spent checking the answer against the tool's outputSchema
                        await client.session.validate_tool_result("search", result)
                        times["  of which the client's output-schema check"].append(time.perf_counter() - t)
                        timed("in-process memory block (held snapshot)", lambda: inject_task(task, settings, project=SLUG))
                        await call(client, "mcp memory_block (stdio)", "memory_block", {"task": task})
                        await call(web, "mcp memory_block (HTTP)", "memory_block", {"task": task})
            for i, (subject, task) in enumerate(zip(subjects, tasks)):
                timed("in-process search (store: warm cache load)", lambda: search(store, subject, k=10, settings=settings))
                if i < cli_runs:
                    timed("cybmem search (CLI)", lambda: cli(["search", subject]))
                    timed("cybmem inject --system (CLI)", lambda: cli(["inject", "--system", task]))

    anyio.run(run)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=60, help="qrels queries to ask (default 60)")
    ap.add_argument("--cli-runs", type=int, default=12, help="CLI subprocesses per command (default 12)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    corpus = _corpus.ensure_corpus()
    queries = _corpus.load_qrels(corpus)[: args.queries]
    root = store_for(len(_corpus.load_records(corpus)))
    print(f"corpus: {root} ({SLUG}), {len(queries)} queries, {args.cli_runs} CLI runs per command", flush=True)
    times = measure(root, queries, args.cli_runs)
    print(f"{'what':<45}{'median':>10}{'p90':>10}{'n':>6}")
    figures = {}
    for name, seconds in times.items():
        median, p90 = _ms(seconds)
        figures[name] = {"median_ms": round(median, 2), "p90_ms": round(p90, 2), "n": len(seconds)}
        print(f"{name:<45}{median:>8.1f}ms{p90:>8.1f}ms{len(seconds):>6}")
    f = {k: v["median_ms"] for k, v in figures.items()}
    print(f"mcp search: {f['mcp search (stdio)'] - f['in-process search (held snapshot)']:.1f} ms over the in-process "
          f"call (the protocol), 1/{f['cybmem search (CLI)'] / f['mcp search (stdio)']:.0f} of a CLI call")
    print(f"mcp memory_block: {f['mcp memory_block (stdio)'] - f['in-process memory block (held snapshot)']:.1f} ms "
          f"over the in-process call, 1/{f['cybmem inject --system (CLI)'] / f['mcp memory_block (stdio)']:.0f} of a CLI call")
    for what, inproc in (("search", "in-process search (held snapshot)"), ("memory_block", "in-process memory block (held snapshot)")):
        http = f[f"mcp {what} (HTTP)"]
        print(f"mcp {what} over HTTP: {http:.1f} ms, {http / f[inproc]:.1f}x the in-process call "
              f"({http - f[inproc]:.1f} ms of protocol, validation and serialisation; target: within 2x)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
