"""Per-call latency of `cybmem mcp` on the real corpus, beside the in-process ranking and the CLI.

    python benchmarks/bench_mcp.py                    # 7,761 records, 60 queries, 12 CLI runs each
    python benchmarks/bench_mcp.py --queries 200 --cli-runs 20 --json out.json

One `cybmem mcp` subprocess over stdio and one over streamable HTTP (`cybmem mcp --http 0`, on
127.0.0.1), each driven by the MCP SDK's own client (what an agent's host does), are asked `search`
(a query's subject line, k 10) and `memory_block` (the whole task) for the corpus qrels queries,
after a warm-up: the snapshot is held in memory, the cache is fresh. The HTTP server is also asked
by the plainest client there is (:class:`PlainClient`: httpx, one kept-alive connection, one
JSON-RPC POST a call, the answer parsed and nothing checked), once in a session opened by the
initialize handshake and once with the 2026-07-28 revision's self-contained requests (the SDK's
client speaks that one to this server): its figure is the server's own cost per call plus one
loopback round trip, with almost nothing of a client's. In the same run, on the same queries, each
call is timed against what it wraps, in process (`cybmem.search` and `cybmem.inject_task`, under
the same held snapshot, and `cybmem.search` on the store, which loads the warm cache each time, as a
one-shot process does), and against the CLI (`cybmem search`, `cybmem inject --system` as
subprocesses) on a prefix of the queries. The calls take turns on each query, so load on a shared
machine hits them alike. The protocol's own cost per call is the difference between the server and
the in-process call; the SDK client's check of each answer against the tool's output schema
(jsonschema, in the client) is timed apart.
"""

from __future__ import annotations

import argparse
import json
import os
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


class PlainClient:
    """An MCP client over streamable HTTP with nothing but httpx: one kept-alive connection, one
    JSON-RPC ``tools/call`` POST a call, the answer's JSON (a body or one SSE event) parsed, no
    validation. ``session``: open a session with the initialize handshake (2025-11-25) and send its
    id; else each request carries the 2026-07-28 envelope (``_meta`` and the routing headers)."""

    MODERN = "2026-07-28"

    def __init__(self, url: str, *, session: bool):
        import httpx

        self.url, self.ids = url, 0
        self.http = httpx.Client(headers={"Accept": "application/json, text/event-stream",
                                          "Content-Type": "application/json"}, timeout=30)
        self.headers: dict[str, str] = {}
        self.meta: dict | None = None
        if session:
            answer = self.http.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
            self._result(answer)
            self.headers = {"Mcp-Session-Id": answer.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
            self.http.post(url, headers=self.headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        else:
            self.headers = {"Mcp-Protocol-Version": self.MODERN, "Mcp-Method": "tools/call"}
            self.meta = {"io.modelcontextprotocol/protocolVersion": self.MODERN,
                         "io.modelcontextprotocol/clientCapabilities": {}}

    @staticmethod
    def _result(answer) -> dict:
        text = answer.text
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and '"id"' in line)
        message = json.loads(text)
        assert answer.status_code == 200 and "result" in message, text[:500]
        return message["result"]

    def call_tool(self, tool: str, args: dict) -> dict:
        self.ids += 1
        params = {"name": tool, "arguments": args} | ({"_meta": self.meta} if self.meta else {})
        headers = self.headers | ({"Mcp-Name": tool} if self.meta else {})
        result = self._result(self.http.post(self.url, headers=headers, json={
            "jsonrpc": "2.0", "id": self.ids, "method": "tools/call", "params": params}))
        assert not result.get("isError"), result["content"][0]["text"]
        return result

    def close(self) -> None:
        self.http.close()


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
    exe = _corpus.cybmem_exe()
    settings = Settings.from_env(memory_dir=root)
    store = MemoryStore.open(settings, project=SLUG)
    load_snapshot(store)  # a fresh cache
    subjects = [q["query"].strip().splitlines()[0] for q in queries]
    tasks = [q["query"] for q in queries]
    times: dict[str, list[float]] = {name: [] for name in (
        "in-process search (held snapshot)", "in-process search (store: warm cache load)", "mcp search (stdio)",
        "mcp search (HTTP)", "  of which the client's output-schema check", "mcp search (HTTP, plain: session)",
        "mcp search (HTTP, plain: 2026-07-28)", "cybmem search (CLI)", "in-process memory block (held snapshot)",
        "mcp memory_block (stdio)", "mcp memory_block (HTTP)", "mcp memory_block (HTTP, plain: session)",
        "mcp memory_block (HTTP, plain: 2026-07-28)", "cybmem inject --system (CLI)")}

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
            # the plain clients are synchronous: each call blocks the loop, as nothing else is asked meanwhile
            plain = {"session": PlainClient(url, session=True), "2026-07-28": PlainClient(url, session=False)}
            async with Client(server) as client, Client(url) as web:
                print(f"servers up and connected in {time.perf_counter() - t:.2f}s", flush=True)
                for subject, task in list(zip(subjects, tasks))[:5]:  # warm-up: imports, the held snapshot
                    for c in (client, web):
                        await c.call_tool("search", {"query": subject})
                        await c.call_tool("memory_block", {"task": task})
                    for p in plain.values():
                        p.call_tool("search", {"query": subject})
                        p.call_tool("memory_block", {"task": task})
                with holding_snapshots():
                    for subject, task in zip(subjects, tasks):
                        timed("in-process search (held snapshot)", lambda: search(store, subject, k=10, settings=settings))
                        result = await call(client, "mcp search (stdio)", "search", {"query": subject, "k": 10})
                        await call(web, "mcp search (HTTP)", "search", {"query": subject, "k": 10})
                        for how, p in plain.items():
                            timed(f"mcp search (HTTP, plain: {how})", lambda: p.call_tool("search", {"query": subject, "k": 10}))
                        t = time.perf_counter()  # what call_tool spent checking the answer against the tool's outputSchema
                        await client.session.validate_tool_result("search", result)
                        times["  of which the client's output-schema check"].append(time.perf_counter() - t)
                        timed("in-process memory block (held snapshot)", lambda: inject_task(task, settings, project=SLUG))
                        await call(client, "mcp memory_block (stdio)", "memory_block", {"task": task})
                        await call(web, "mcp memory_block (HTTP)", "memory_block", {"task": task})
                        for how, p in plain.items():
                            timed(f"mcp memory_block (HTTP, plain: {how})", lambda: p.call_tool("memory_block", {"task": task}))
            for p in plain.values():
                p.close()
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
    print(f"{'what':<48}{'median':>10}{'p90':>10}{'n':>6}")
    figures = {}
    for name, seconds in times.items():
        median, p90 = _ms(seconds)
        figures[name] = {"median_ms": round(median, 2), "p90_ms": round(p90, 2), "n": len(seconds)}
        print(f"{name:<48}{median:>8.1f}ms{p90:>8.1f}ms{len(seconds):>6}")
    f = {k: v["median_ms"] for k, v in figures.items()}
    print(f"mcp search: {f['mcp search (stdio)'] - f['in-process search (held snapshot)']:.1f} ms over the in-process "
          f"call (the protocol), 1/{f['cybmem search (CLI)'] / f['mcp search (stdio)']:.0f} of a CLI call")
    print(f"mcp memory_block: {f['mcp memory_block (stdio)'] - f['in-process memory block (held snapshot)']:.1f} ms "
          f"over the in-process call, 1/{f['cybmem inject --system (CLI)'] / f['mcp memory_block (stdio)']:.0f} of a CLI call")
    for what, inproc in (("search", "in-process search (held snapshot)"), ("memory_block", "in-process memory block (held snapshot)")):
        for client in ("", ", plain: session", ", plain: 2026-07-28"):
            http = f[f"mcp {what} (HTTP{client})"]
            print(f"mcp {what} over HTTP ({client[2:] or 'SDK client'}): {http:.1f} ms, {http / f[inproc]:.1f}x the "
                  f"in-process call ({http - f[inproc]:.1f} ms of protocol, validation and serialisation; target: within 2x)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
