"""A block that can say nothing: tasks from other projects against real tasks, with and without the floor.

The floor this measured is gone (the block now judges each run's evidence: benchmarks/bench_block.py,
which reuses this module's History); its rows that set a floor now measure the block as it is.

    python benchmarks/bench_floor.py [--corpus pytest-memory,mypy-memory,sphinx-memory,pytest-memory-1k]
                                     [--sample 300] [--floors 0.8,1.0,1.2,1.4,1.6] [--json out.json]

For every history (the target store) and its judged queries (qrels merged per queryRunId, at most
``--sample`` of them, the same ones for every row), the MEMORY block is built through
cybmem.dispatch.inject as production would have built it at the query's moment (runs that ended by then,
issues folded as of then, the query's own run left out):

- ``real``: the query's own text (references stripped, as the corpora give it), dispatched alone:
  does the block name a judged-relevant run; is the judged issue, when still open then, named
  anywhere in the block (a run's raised: line or the issue section);
- ``follow-up``: the same, dispatched with the query run's recorded parent (the corpora's
  "follow-up run dispatched from it", a judged-relevant run by construction), which dispatch shows
  first whatever its match;
- ``foreign``: the text of a query from another history (drawn at random, seeded), dispatched into
  this store at the same moment: does the block show any run at all.

Rows: "today" is the old defaults (0.45 / 0.4 / 0.15, 60 days) without a floor, open issues ranked
with the runs' weights; then the new defaults without a floor, with the default floor and the
issues ranked with the runs' weights (as before ``Weights.for_issues``), and with the default floor as
cybmem ranks issues now (recency at ``ISSUE_REC_SHARE`` of the weights); then the floor swept (pooled over the
histories, each history weighing the same). Targets (the self-tuning issue): at most 25% of the
foreign tasks get a run; real tasks keep a judged-relevant run in >= 55% of blocks; the judged
open issue named at least as often as today.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sys
import time
from dataclasses import replace
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402
from bench_dispatch import merged_qrels  # noqa: E402

from cybmem.dispatch import inject as dispatch  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.retrieval.weights import LoadedWeights, Weights  # noqa: E402

OLD = Weights(w_kw=0.45, w_rec=0.4, w_lin=0.15, half_life_days=60.0, floor=0.0)


@contextlib.contextmanager
def runs_mix_for_issues(on: bool):
    """Rank open issues with the runs' own weights, as cybmem did before Weights.for_issues (the
    rows "today" and "issues by the runs' mix" measure that ranking beside today's)."""
    if not on:
        yield
        return
    own = Weights.for_issues
    Weights.for_issues = lambda self: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        Weights.for_issues = own  # type: ignore[method-assign]


def short(name: str) -> str:
    return name.removesuffix("-memory").replace("-memory-", "-")


class History:
    def __init__(self, name: str, sample: int, rng: random.Random):
        self.name = name
        root = _corpus.ensure_corpus(name)
        self.store = MemoryStore(root, _corpus.slug_of(root))
        self.snap = load_snapshot(self.store)
        ids = self.snap.records.column("runId").to_pylist()
        self.ended = dict(zip(ids, self.snap.ended_ms().tolist()))
        self.issues_of = dict(zip(ids, self.snap.records.column("issues").to_pylist()))
        self.parent_of = dict(zip(ids, self.snap.records.column("parentRunId").to_pylist()))
        qs = [q for q in merged_qrels(root) if any(self.ended.get(r, 1 << 62) <= q["asOf"] for r in q["relevant"])]
        self.queries = qs if len(qs) <= sample else rng.sample(qs, sample)
        self.settings = Settings.from_env({}, memory_dir=root)

    def block(self, task: str, q: dict, weights: Weights, parent: str | None = None) -> str:
        return dispatch._build(self.store, task, self.settings, LoadedWeights(weights, {}), as_of=q["asOf"], now_ms=None,
                               parent_run_id=parent, chat_session_id=None, exclude=q["queryRunId"]).block

    def judged_open(self, q: dict) -> set[str]:
        rel = [r for r in q["relevant"] if self.ended.get(r, 1 << 62) <= q["asOf"]]
        judged = set(self.issues_of.get(q["queryRunId"]) or []) & {i for r in rel for i in self.issues_of.get(r) or []}
        return judged & set(self.snap.open_issues(q["asOf"]).column("issueId").to_pylist()) if judged else set()


def foreign_tasks(hist: list[History], rng: random.Random) -> dict[str, list[str]]:
    """Per history, one task drawn (seeded) from the other histories' queries for each of its
    queries; a slice of one history (pytest-1k) never draws from that history."""
    out = {}
    for h in hist:
        pool = [q["query"] for o in hist if o is not h and not short(o.name).startswith(short(h.name).split("-")[0])
                for q in merged_qrels(o.store.root)]
        out[h.name] = [rng.choice(pool) for _ in h.queries]
    return out


def runs_part(block: str) -> str:
    return block.split("\nOpen issues in this project:")[0]


def measure(h: History, weights: Weights, foreign: list[str]) -> dict:
    real = hit = follow = follow_n = judged = named = 0
    foreign_any = 0
    for q, other in zip(h.queries, foreign):
        rel = [r for r in q["relevant"] if h.ended.get(r, 1 << 62) <= q["asOf"]]
        block = h.block(q["query"], q, weights)
        real += 1
        hit += any(f"- run {r[:8]} " in runs_part(block) for r in rel)
        open_judged = h.judged_open(q)
        if open_judged:
            judged += 1
            named += any(re.search(rf"(?<![\w.-]){re.escape(i)}(?![\w.-])", block) for i in open_judged)
        parent = h.parent_of.get(q["queryRunId"])
        if parent and h.ended.get(parent, 1 << 62) <= q["asOf"]:
            follow_n += 1
            follow += any(f"- run {r[:8]} " in runs_part(h.block(q["query"], q, weights, parent)) for r in rel)
        foreign_any += "\n- run " in h.block(other, q, weights)
    return {"queries": real, "relevantRun": hit / real, "followUps": follow_n, "followUpRelevant": follow / max(follow_n, 1),
            "judgedIssueQueries": judged, "judgedIssueNamed": named / max(judged, 1), "foreignWithRun": foreign_any / real}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="pytest-memory,mypy-memory,sphinx-memory,pytest-memory-1k")
    ap.add_argument("--sample", type=int, default=300, help="judged queries per history (seeded sample)")
    ap.add_argument("--floors", default="0.8,1.0,1.2,1.4,1.6", help="floors to sweep (new defaults otherwise)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(7)
    hist = [History(c.strip(), args.sample, rng) for c in args.corpus.split(",") if c.strip()]
    foreign = foreign_tasks(hist, rng)
    for h in hist:
        print(f"{short(h.name)}: {h.snap.n:,} records, {len(h.queries)} judged queries, foreign tasks from the other histories")
    new = Weights()
    configs = {"today (old, no floor)": OLD, "new defaults, no floor": replace(new, floor=0.0),
               f"new defaults, floor {new.floor:g}, issues by the runs' mix": new,
               f"new defaults, floor {new.floor:g}": new}
    results: dict[str, dict[str, dict]] = {}
    for label, w in configs.items():
        t = time.perf_counter()
        with runs_mix_for_issues(label.startswith("today") or label.endswith("the runs' mix")):
            results[label] = {h.name: measure(h, w, foreign[h.name]) for h in hist}
        print(f"  {label} ({time.perf_counter() - t:.0f}s)", flush=True)
    print(f"\n{'':<28}" + "".join(f"{short(h.name):>11}" for h in hist) + f"{'mean':>9}")

    def line(label: str, key: str, rows: dict, fmt="{:11.0%}") -> None:
        vals = [rows[h.name][key] for h in hist]
        print(f"{label:<28}" + "".join(fmt.format(v) for v in vals) + f"{sum(vals) / len(vals):9.0%}")

    for label, rows in results.items():
        print(label)
        line("  foreign task gets a run", "foreignWithRun", rows)
        line("  real: relevant run shown", "relevantRun", rows)
        line("  follow-up: relevant shown", "followUpRelevant", rows)
        line("  judged open issue named", "judgedIssueNamed", rows)
    sweep = {}
    print("\nthe floor swept (new defaults):")
    print(f"{'floor':>7} {'foreign with a run':>19} {'real: relevant shown':>21} {'judged issue named':>19}")
    for f in [float(x) for x in args.floors.split(",") if x]:
        rows = {h.name: measure(h, replace(new, floor=f), foreign[h.name]) for h in hist}
        sweep[f] = rows
        mean = lambda k: sum(rows[h.name][k] for h in hist) / len(hist)  # noqa: E731
        per = lambda k: " ".join(f"{rows[h.name][k]:.0%}" for h in hist)  # noqa: E731
        print(f"{f:7.2f} {mean('foreignWithRun'):8.0%} ({per('foreignWithRun')}) {mean('relevantRun'):8.0%} "
              f"({per('relevantRun')}) {mean('judgedIssueNamed'):6.0%} ({per('judgedIssueNamed')})", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "sweep": sweep}, indent=2))


if __name__ == "__main__":
    main()
