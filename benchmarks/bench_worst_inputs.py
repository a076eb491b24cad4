"""The crafted inputs that once took quadratic time, at 1x, 2x and 4x size: linear is ~2x and ~4x.

    python benchmarks/bench_worst_inputs.py                 # the sizes of issue 41, 3 runs each
    python benchmarks/bench_worst_inputs.py --scale 0.25 --repeat 5

Each worst input of issue 41 is built at 1x, 2x and 4x its size and sent down the path the issue
timed (in process where it named a function, the whole ``cybmem`` process where it named a
command), with the time's ratio to the 1x time: linear work shows ~2x and ~4x, quadratic ~4x and
~16x. Beside each, in the same run, ordinary text of the 4x size down the same path (lines of
words, in a ``TASK:`` wrapper for strip; a plain record; a trailer of ordinary bullets): the last
column is what the crafted shape costs over it. Medians of ``--repeat`` rounds (five times as many
in process), the inputs of a row taking turns in each round; every ``cybmem write`` goes to a fresh
memory root.

- ``strip``: nested ``TASK:`` wrappers, each hiding a MEMORY block that the lift before it makes
  whole (``TASK:<HEADER>`` / ``END MEMORY`` pairs: strip used to peel one a round, a pass over
  every line each); ``cybmem write`` of a run with that task.
- ``neutralize``: a summary that nests inline blocks, each removal joining the next HEADER (the
  neutraliser used to remove one level a pass); ``cybmem inject`` of a task that shows a dropped-in
  record with that summary.
- ``NEXT bullets``: a trailer with 75,000-300,000 NEXT items (13 MB at 4x): ``cybmem write``, then
  ``cybmem inject`` of a task that shows the record (the block used to format every item).
- ``ISSUES bullets``: 12,500-50,000 ISSUES items: ``cybmem write`` (a run opens at most
  MAX_RUN_ISSUES; the rest are counted in a warning).
- ``wrapped bullet``: one ISSUES bullet wrapped over 50,000-200,000 indented lines: ``parse_trailer``.
- ``empty bullets``: an answer of 75,000-300,000 lines of ``-``: ``extractive_summary`` (found while
  looking for the same shape: the head of the answer was summed again at each line).
- ``shown log``: MCP ``search`` answers of 100,000 hits kept in shown.jsonl (40, 80, 160 of them,
  the log capped at 20 lines so that they pass its byte cap): the time of making and appending the
  lines, and the log's size after them (a line names at most LINE_ITEMS runs; the log is cut back in
  bytes once a quarter over, found by a stat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _corpus  # noqa: E402

from cybmem.dispatch.feedback import mcp_entry  # noqa: E402
from cybmem.dispatch.preamble import FOOTER, HEADER, neutralize, strip  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.feedback_log import LINE_BYTES, LINE_ITEMS, SHOWN_FILE, keep_shown  # noqa: E402
from cybmem.store.outcome import extractive_summary, parse_trailer  # noqa: E402

CWD = "/home/dev/bench"
T0 = 1_790_000_000_000
TASK = "Fix the cart drawer animation"
WORDS = "the cart drawer animation races the assertion on slow machines".split()


def words(n_chars: int) -> str:
    """Ordinary text of about n_chars characters: lines of words."""
    line = " ".join(WORDS) + "\n"
    return line * max(1, n_chars // len(line))


def nested_wrappers(layers: int) -> str:
    """``TASK:<HEADER>`` / ``END MEMORY`` pairs: each lift makes the next block whole."""
    return f"TASK:{HEADER}\n{FOOTER}\n" * layers + TASK


def nested_inline(layers: int) -> str:
    """Inline blocks nested so that each removal joins the next HEADER out of its two halves."""
    return HEADER[:7] * layers + HEADER + FOOTER + (HEADER[7:] + FOOTER) * layers + " The drawer is fixed."


def trailer(section: str, items: int) -> str:
    return f"Done.\n\nACCOMPLISHED:\n- fixed the drawer\n{section}:\n" + "".join(f"- item {i} of the list\n" for i in range(items))


class Cli:
    """``cybmem`` subprocesses against memory roots under one temporary directory."""

    def __init__(self, tmp: Path):
        self.exe, self.tmp, self.n = _corpus.cybmem_exe(), tmp, 0

    def root(self) -> Path:
        self.n += 1
        return self.tmp / f"root-{self.n}"

    def run(self, root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "CYBERINE_MEMORY_DIR": str(root), "CYBERINE_MEMORY_RETUNE": "0"}
        for key in ("CYBERINE_MEMORY_MODEL", "CYBERINE_MEMORY_EMBEDDINGS", "CYBERINE_RUN_ID"):
            env.pop(key, None)
        p = subprocess.run([self.exe, *args], env=env, input=stdin, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"cybmem {' '.join(args[:2])} failed: {p.stderr.strip()[-500:]}")
        return p

    def write(self, root: Path, run_id: str, task: str, output: str = "Done.") -> subprocess.CompletedProcess:
        run = {"id": run_id, "cwd": CWD, "task": task, "status": "done", "startedAt": T0, "endedAt": T0 + 60_000,
               "workers": [{"agentId": "impl-1", "state": "done", "output": output}]}
        path = self.tmp / f"{run_id}.json"
        path.write_text(json.dumps(run))
        try:
            return self.run(root, "write", str(path), "--cwd", CWD)
        finally:
            path.unlink()

    def timed_write(self, task: str, output: str) -> float:
        """The wall time of one `cybmem write` of a run, to a fresh memory root."""
        root = self.root()
        t = time.perf_counter()
        self.write(root, "run-1", task, output)
        took = time.perf_counter() - t
        shutil.rmtree(root, ignore_errors=True)
        return took

    def store_with(self, record: dict) -> Path:
        """A memory root holding one written run and ``record`` dropped into records/ by hand, its
        cache built (by one inject)."""
        root = self.root()
        self.write(root, "seed", "Set up the project")
        slug = json.loads((root / "projects.json").read_text()).popitem()[0]
        (root / slug / "records" / f"{record['runId']}.json").write_text(json.dumps(record))
        self.run(root, "inject", TASK, "--cwd", CWD)
        return root

    def timed_inject(self, root: Path) -> float:
        """The wall time of one `cybmem inject` of TASK."""
        t = time.perf_counter()
        self.run(root, "inject", TASK, "--cwd", CWD)
        return time.perf_counter() - t


def dropped_record(summary: str, next_items: list[str] | None = None) -> dict:
    return {"runId": "dropped-1", "cwd": CWD, "workflowName": "implement-task", "task": TASK, "state": "done",
            "startedAt": T0 + 120_000, "endedAt": T0 + 180_000, "lineage": {},
            "outcome": {"summary": summary, "accomplished": [], "issues": [], "next": next_items or []},
            "workers": [{"agentId": "impl-1", "state": "done"}]}


SHOWN_CAP = 20  # lines: a byte cap of 80 kB, so that 40 answers pass it (the default, 2000, holds 8 MB)


def shown_log(tmp: Path, calls: int, sizes: dict[int, int], hits: int = 100_000) -> float:
    """The seconds of keeping ``calls`` MCP search answers of ``hits`` runs in a fresh shown.jsonl
    capped at SHOWN_CAP lines; ``sizes[calls]``: the log's bytes after them."""
    settings = Settings.from_env({"CYBERINE_RUN_ID": "run-1"}, memory_dir=str(tmp))
    answer = {"hits": [{"runId": f"{i:08x}-0000-4000-8000-000000000000", "rank": i + 1, "score": 1.0 / (i + 1)}
                       for i in range(hits)]}
    folder = tmp / "shown"
    folder.mkdir()
    t = time.perf_counter()
    for _ in range(calls):
        keep_shown(folder, [mcp_entry("search", {"query": "x", "k": hits}, answer, settings)], SHOWN_CAP)
    took = time.perf_counter() - t
    sizes[calls] = (folder / SHOWN_FILE).stat().st_size
    shutil.rmtree(folder)
    return took


def row(name: str, path: str, inputs: list, plain: object, once: Callable[[object], float], repeat: int,
        size: Callable[[object], str] = lambda x: f"{len(x) / 1e6:.2f} MB") -> None:
    """One line of the table: the median of ``repeat`` runs of ``once`` (which returns seconds) on each
    input (1x, 2x, 4x) with its ratio to the 1x time, and on ``plain`` (ordinary input of the 4x size;
    None: no such column) with the 4x time's ratio to it. The inputs take turns in each round, so
    that load on a shared machine falls on all of them alike."""
    every = [*inputs, plain] if plain is not None else list(inputs)
    runs: list[list[float]] = [[] for _ in every]
    for _ in range(repeat):
        for times, x in zip(runs, every):
            times.append(once(x))
    times = [statistics.median(t) for t in runs]
    cells = [f"{size(inputs[0]):>9} {times[0]:8.3f}s"]
    cells += [f"{size(x):>9} {t:8.3f}s {t / times[0]:5.2f}x" for x, t in zip(inputs[1:], times[1:3])]
    tail = f"{times[3]:8.3f}s {times[2] / times[3]:6.2f}x" if plain is not None else f"{'-':>9} {'-':>7}"
    print(f"{name:<16} {path:<22} {'  '.join(cells)}   {tail}", flush=True)


def timed(fn: Callable[[object], object]) -> Callable[[object], float]:
    """``fn`` as a ``once`` of :func:`row`: the seconds of one call."""
    def once(x: object) -> float:
        t = time.perf_counter()
        fn(x)
        return time.perf_counter() - t
    return once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every 1x size (0.25: a quick run)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (the median is printed)")
    args = ap.parse_args()
    r, rr = args.repeat, 5 * args.repeat  # in process: milliseconds, so more runs
    at = lambda n: [max(1, int(n * args.scale)) * f for f in (1, 2, 4)]  # noqa: E731
    print(f"{'input':<16} {'path':<22} {'1x':>19}  {'2x (ratio to 1x)':>26}  {'4x (ratio to 1x)':>26}   "
          f"{'plain 4x':>9} {'4x/plain':>7}")
    with tempfile.TemporaryDirectory(prefix="bench-worst-") as name:
        cli = Cli(Path(name))
        write = lambda task: lambda output: cli.timed_write(task, output)  # noqa: E731

        # 1. Nested TASK: wrappers (1x: 1,000 layers, 74 KB).
        texts = [nested_wrappers(n) for n in at(1000)]
        plain = f"You are an implementer.\nTASK:\n{words(len(texts[-1]))}\nINSTRUCTIONS:\n- test\n"  # a wrapper, lifted once
        row("TASK: wrappers", "strip (in process)", texts, plain, timed(strip), rr)
        row("TASK: wrappers", "cybmem write", texts, plain, lambda task: cli.timed_write(task, "Done."), r)

        # 2. Inline blocks nested in a dropped-in record's summary (1x: 19,000 levels, 1.3 MB).
        texts = [nested_inline(n) for n in at(19_000)]
        row("inline blocks", "neutralize (in proc.)", texts, words(len(texts[-1])), timed(neutralize), rr)
        roots = {cli.store_with(dropped_record(t)): len(t) for t in [*texts, words(len(texts[-1]))]}
        mb = lambda root: f"{roots[root] / 1e6:.2f} MB"  # noqa: E731
        row("inline blocks", "cybmem inject", list(roots)[:3], list(roots)[3], cli.timed_inject, r, mb)

        # 3. NEXT bullets (1x: 75,000 items, 3 MB): written, then shown by inject.
        outputs = [trailer("NEXT", n) for n in at(75_000)]
        plain = "Done.\n\n" + words(len(outputs[-1]))
        row("NEXT bullets", "cybmem write", outputs, plain, write(TASK), r)
        roots = {cli.store_with(dropped_record("The drawer is fixed.", [f"item {i} of the list" for i in range(n)])): len(o)
                 for n, o in zip(at(75_000), outputs)}
        roots[cli.store_with(dropped_record("The drawer is fixed. " + words(len(outputs[-1]))))] = len(plain)
        row("NEXT bullets", "cybmem inject", list(roots)[:3], list(roots)[3], cli.timed_inject, r, mb)

        # 4. ISSUES bullets (1x: 12,500 items).
        outputs = [trailer("ISSUES", n) for n in at(12_500)]
        row("ISSUES bullets", "cybmem write", outputs, "Done.\n\n" + words(len(outputs[-1])), write(TASK), r)

        # 5. One bullet wrapped over many indented lines (1x: 50,000 lines).
        texts = ["ISSUES:\n- the drawer\n" + "  races the assertion on slow machines\n" * n for n in at(50_000)]
        plain = "ISSUES:\n" + "".join(f"- the drawer races {i}\n" for i in range(len(texts[-1]) // 24))
        row("wrapped bullet", "parse_trailer", texts, plain, timed(parse_trailer), rr)

        # 6. An answer of empty bullets (1x: 75,000 lines), summarised.
        texts = ["-\n" * n + "The drawer is fixed.\n" for n in at(75_000)]
        plain = "```\n" + "x = 1\n" * (len(texts[-1]) // 6) + "```\nThe drawer is fixed.\n"  # a long code block first
        row("empty bullets", "extractive_summary", texts, plain, timed(lambda out: extractive_summary(TASK, "done", None, out)), rr)

        # 7. The shown log: MCP search answers of 100,000 hits (1x: 40 of them), the log capped at 20 lines.
        sizes: dict[int, int] = {}
        row("shown log", "mcp_entry + keep_shown", at(40), None, lambda calls: shown_log(Path(name), calls, sizes), r,
            lambda calls: f"{calls} calls")
        print(f"{'':<16} {'':<22} shown.jsonl after them (cap {SHOWN_CAP} lines, {SHOWN_CAP * LINE_BYTES // 1000} kB): "
              + ", ".join(f"{b / 1e3:.0f} kB" for b in sizes.values()) + f"; one line names at most {LINE_ITEMS} runs")


if __name__ == "__main__":
    main()
