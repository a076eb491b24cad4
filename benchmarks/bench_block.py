"""The block shows what memory found, sized by its evidence: no gate, yesterday's floor and the
evidence rule on every dev history, each threshold chosen with that history left out.

    python benchmarks/bench_block.py [--corpus pytest-memory,mypy-memory,sphinx-memory,celery-memory,pytest-memory-1k]
                                     [--sample 300] [--json out.json]

For every history and its judged queries (qrels merged per queryRunId, at most ``--sample``, seeded),
the block is built as dispatch would have built it at the query's moment (runs that ended by then,
the query's own run left out), from the query's text alone:

- ``hit``: a judged-relevant run is in the block (in full or as a pointer); ``full``: of those
  hits, how often the relevant run is shown in full; ``chars``: the blocks' mean length;
- ``issue``: the judged open issue (when one is still open then) is named anywhere in the block;
- ``parent``: dispatched with the query run's recorded parent, the parent comes first;
- foreign tasks, dispatched into the store at the same moments, and how often each gets the one
  line that says nothing relates: ``dev`` (the other dev histories' judged tasks), ``js``
  (react-router's changelog entries: another language and domain) and ``ops`` (nginx's
  changelog entries), both built from public material (benchmarks/data/README.md).

Rows: ``no gate`` (the top-k ranking, every run in full: the floor at 0), ``floor 0.4`` (the
rule cybmem used before: the task's best keyword match over sqrt(idf mass x largest idf) must
reach 0.4, then runs within a tenth of the best), and ``evidence`` (cybmem.retrieval.evidence, at
the defaults). Then the leave-one-history-out check: for each history, the grid of
(COMMON_SHARE, FULL_NATS, runs in full (CYBERINE_MEMORY_TOPK), CYBERINE_MEMORY_POINTERS) is scored
on the other dev histories (a slice of one history is never trained on with it), and the setting
chosen there by the targets in their order (on every training history: the hit at least no gate's
less one point; then the relevant run in full in at least half of the hits; then blocks at most 60%
of no gate's length; then a margin on the first two: the relevant run in full in 60% of the hits
and no hit lost, on the worst training history; then the shorter blocks, then most foreign
one-liners) is scored on the one left out. ``--dispatch-only`` skips the sweep and runs the defaults through inject's own path.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402
import bench_floor  # noqa: E402
from bench_dispatch import merged_qrels  # noqa: E402

from cybmem.settings import Settings
from cybmem.dispatch import inject as dispatch  # noqa: E402
from cybmem.dispatch.preamble import PreambleEntry, layout  # noqa: E402
from cybmem.retrieval import evidence as evidence_mod  # noqa: E402
from cybmem.retrieval.search import search  # noqa: E402
from cybmem.retrieval.weights import LoadedWeights, Weights  # noqa: E402
from cybmem.settings import DEFAULT_POINTERS, DEFAULT_TOPK, Settings  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.store.tokens import tokenize  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
DEV = ("pytest-memory", "mypy-memory", "sphinx-memory", "celery-memory")
SHARES = (0.1, 0.2, 0.3)
NATS = (2.0, 5.0, 8.0)
TOPKS = (1, 2, 3, 4, 8)
POINTERS = (6, 8, 10, 12)
POOL = 48  # ranked runs judged offline per query (the evidence rule keeps at most topk + pointers of them)
OLD_FLOOR, OLD_SHARE = 0.4, 0.1
FULL_MARGIN = 0.6  # the share of hits in full a setting is asked for on its training histories (the target: 0.5)


def short(name: str) -> str:
    return name.removesuffix("-memory").replace("-memory-", "-")


def family(name: str) -> str:
    return short(name).split("-")[0]


def public_tasks(name: str) -> list[str]:
    return [json.loads(line)["task"] for line in (DATA / f"{name}.jsonl").read_text().splitlines() if line.strip()]


class History(bench_floor.History):
    """A dev history and its judged queries (bench_floor's), with the block built either way."""

    def relevant(self, q: dict) -> set[str]:
        return {r for r in q["relevant"] if self.ended.get(r, 1 << 62) <= q["asOf"]}

    def block(self, task: str, q: dict, parent: str | None = None, *, gate: bool = True) -> dispatch.Injection:  # type: ignore[override]
        settings = self.settings if gate else _no_pointers(self.settings)
        return dispatch._build(self.store, task, settings, LoadedWeights(Weights(), {}), as_of=q["asOf"], now_ms=None,
                               parent_run_id=parent, chat_session_id=None, exclude=q["queryRunId"], evidence=gate)


def _no_pointers(settings: Settings) -> Settings:
    """No gate: the block cybmem printed before evidence, the top 8 in full."""
    from dataclasses import replace

    return replace(settings, topk=8, pointers=0)


def shown_ids(inj: dispatch.Injection) -> dict[str, str]:
    """run id -> how the block shows it ("full" or "pointer")."""
    return {h.run_id: ("pointer" if h.tier == "pointer" and h.pinned is None else "full") for h in inj.runs}


def names(block: str, issues: set[str]) -> bool:
    return any(re.search(rf"(?<![\w.-]){re.escape(i)}(?![\w.-])", block) for i in issues)


# -- the rules offline, over one ranking per task (for the sweep) --------------------------------------

class Ranking:
    """A task's no-gate ranking (top POOL) with what the evidence rule needs, computed once."""

    def __init__(self, h: History, task: str, q: dict):
        res = search(h.snap, task, k=POOL, weights=Weights(), as_of=q["asOf"], exclude=q["queryRunId"], settings=Settings.from_env())
        self.hits = res.hits
        self.rows = list(res.ranked.top) if res.ranked is not None else []
        self.tokens = tokenize(task)
        self.index = h.snap.index
        self.candidates = res.candidates
        kw = res.ranked.keyword if res.ranked is not None else None
        self.raw = [float(kw[r]) if kw is not None else 0.0 for r in self.rows]  # raw BM25 (yesterday's floor)
        self.entries = [PreambleEntry(x.run_id, x.ended_at_ms, x.state, x.task, x.summary, [], x.next) for x in self.hits]
        self._ev: dict = {}

    def evidence(self, share: float):
        if share not in self._ev:
            ev = evidence_mod.specific_terms(self.index, self.tokens, common_share=share)
            tiers = evidence_mod.judge(self.index, ev, self.rows, full_nats=0.0)
            self._ev[share] = (ev, tiers)
        return self._ev[share]

    def shown(self, share: float, nats: float, topk: int = 8, pointers: int = 8) -> list[tuple[int, str]]:
        ev, tiers = self.evidence(share)
        if not ev.judged:  # nothing to judge by: inject's shown_order, every run strong
            n = len(self.hits)
            return [(i, "full") for i in range(min(topk, n))] + [(i, "pointer") for i in range(min(topk, n), min(topk + pointers, n))]
        keep = [(i, "full" if t.tier == "full" and t.nats >= nats else "pointer") for i, t in enumerate(tiers) if t.tier != "out"]
        full = [i for i, t in keep if t == "full"][:topk]
        weak = [i for i, t in keep if i not in set(full)][:pointers]
        return [(i, "full") for i in full] + [(i, "pointer") for i in weak]

    def old_floor(self, topk: int = 8) -> list[tuple[int, str]]:
        """Yesterday's rule, for its row: best match >= 0.4, then runs within a tenth of it."""
        terms = list(dict.fromkeys(self.tokens))
        if not terms:
            return [(i, "full") for i in range(min(topk, len(self.hits)))]
        n = self.index.n_docs
        df = np.array([self.index.document_frequency(t) for t in terms], dtype=np.float64)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        top = math.log1p((n + 0.5) / 0.5)
        scale = 1 / math.sqrt(idf.sum() * top)
        match = [x * scale for x in self.raw]
        best = max(match, default=0.0)
        if best < OLD_FLOOR:
            return []
        return [(i, "full") for i, m in enumerate(match) if m >= OLD_SHARE * best and m > 0][:topk]

    def chars(self, shown: list[tuple[int, str]]) -> int:
        from dataclasses import replace

        entries = [replace(self.entries[i], tier=t) for i, t in shown]
        return len(layout(entries, [], max_tokens=1500).text)


def collect(hist: list[History], foreign: dict, rng: random.Random) -> dict:
    out = {}
    for h in hist:
        t = time.perf_counter()
        rows = []
        for q, other in zip(h.queries, foreign[h.name]):
            rows.append({"q": q, "rel": h.relevant(q), "real": Ranking(h, q["query"], q),
                         **{k: Ranking(h, text, q) for k, text in other.items()}})
        out[h.name] = rows
        print(f"  ranked {short(h.name)}: {len(rows)} queries x 4 tasks ({time.perf_counter() - t:.0f}s)", flush=True)
    return out


def score(rows: list[dict], rule) -> dict:
    n = len(rows)
    hit = full = 0
    chars = []
    one = {"dev": 0, "js": 0, "ops": 0}
    for r in rows:
        shown = rule(r["real"])
        chars.append(r["real"].chars(shown))
        kinds = [t for i, t in shown if r["real"].hits[i].run_id in r["rel"]]
        if kinds:
            hit += 1
            full += "full" in kinds
        for k in one:
            one[k] += not rule(r[k])
    return {"hit": hit / n, "full": full / max(hit, 1), "chars": float(np.mean(chars)), **{k: v / n for k, v in one.items()}}


def sweep(data: dict) -> dict:
    res = {}
    for name, rows in data.items():
        base = score(rows, lambda r: [(i, "full") for i in range(min(8, len(r.hits)))])
        grid = {}
        for s, x, k, p in itertools.product(SHARES, NATS, TOPKS, POINTERS):
            grid[(s, x, k, p)] = score(rows, lambda r, s=s, x=x, k=k, p=p: r.shown(s, x, topk=k, pointers=p))
        res[name] = (base, grid)
    return res


def met(base: dict, m: dict) -> tuple[bool, bool, bool]:
    """The three targets on one history: the hit within a point of no gate's, the relevant run in
    full in half of the hits, blocks at most 60% of no gate's."""
    return (m["hit"] >= base["hit"] - 0.01, m["full"] >= 0.5, m["chars"] <= 0.6 * base["chars"])


def defaults() -> tuple[float, float, int, int]:
    return (evidence_mod.COMMON_SHARE, evidence_mod.FULL_NATS, DEFAULT_TOPK, DEFAULT_POINTERS)


def choose(res: dict, train: list[str]) -> tuple[float, float, int, int]:
    if not train:  # nothing to train on (a single history asked for): the defaults
        return defaults()
    def key(p):
        # In the issue's order: never hide what was found (the hit on every training history),
        # then the relevant run in full, then the length target. Then a margin on the first two
        # (FULL_MARGIN of the hits in full and no hit lost, on the worst training history, as far
        # as a setting gets there): a setting that only just meets a target where it was chosen
        # misses it on the history left out (before the margin, pytest's fold chose 4 in full and
        # got 48% of its hits in full, sphinx's FULL_NATS 5 and 41%). Then the shorter blocks, then
        # more foreign tasks with the one line.
        ms = [met(res[t][0], res[t][1][p]) for t in train]
        ratio = np.mean([res[t][1][p]["chars"] / res[t][0]["chars"] for t in train])
        one = np.mean([np.mean([res[t][1][p][k] for k in ("dev", "js", "ops")]) for t in train])
        full = min(res[t][1][p]["full"] for t in train)
        hit = min(res[t][1][p]["hit"] - res[t][0]["hit"] for t in train)
        return (sum(m[0] for m in ms), sum(m[1] for m in ms), sum(m[2] for m in ms),
                round(min(full, FULL_MARGIN), 3), round(min(hit, 0.0), 3), -round(float(ratio), 2), round(float(one), 3))
    return max(res[train[0]][1], key=key)


def describe(p: tuple) -> str:
    return f"COMMON_SHARE {p[0]:g}, FULL_NATS {p[1]:g}, topk {p[2]}, pointers {p[3]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=",".join(DEV) + ",pytest-memory-1k")
    ap.add_argument("--sample", type=int, default=300, help="judged queries per history (seeded sample)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-dispatch", action="store_true", help="only the sweep (no run through inject's own path)")
    ap.add_argument("--dispatch-only", action="store_true", help="only the defaults through inject's own path (no sweep)")
    args = ap.parse_args()
    rng = random.Random(7)
    hist = [History(c.strip(), args.sample, rng) for c in args.corpus.split(",") if c.strip()]
    js, ops = public_tasks("foreign-js"), public_tasks("foreign-ops")
    foreign = {}
    for h in hist:
        pool = [q["query"] for o in DEV if family(o) != family(h.name) for q in merged_qrels(_corpus.ensure_corpus(o))]
        foreign[h.name] = [{"dev": rng.choice(pool), "js": rng.choice(js), "ops": rng.choice(ops)} for _ in h.queries]
    for h in hist:
        print(f"{short(h.name)}: {h.snap.n:,} records, {len(h.queries)} judged queries")
    rows: dict = {}
    chosen: dict = {}
    if not args.dispatch_only:
        data = collect(hist, foreign, rng)
        res = sweep(data)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.with_suffix(".grid.json").write_text(json.dumps(
                {n: {"noGate": b, "grid": {"/".join(f"{x:g}" for x in k): v for k, v in g.items()}} for n, (b, g) in res.items()}, indent=1))

        print("\nleave one history out: the setting chosen on the other dev histories, scored on this one")
        chosen = {}
        for h in hist:
            train = [t.name for t in hist if t.name in DEV and family(t.name) != family(h.name)]
            p = choose(res, train)
            chosen[h.name] = p
            print(f"  {short(h.name):>9}: trained on {', '.join(short(t) for t in train)} -> {describe(p)}")
        default = defaults()
        print(f"  the defaults: {describe(default)}")

        rows = {
            "no gate": {n: res[n][0] for n in res},
            f"floor {OLD_FLOOR:g}": {n: score(data[n], lambda r: r.old_floor()) for n in res},
            "evidence, left out": {n: res[n][1][chosen[n]] for n in res},
            "evidence, defaults": {n: res[n][1].get(default) or score(data[n], lambda r: r.shown(*default[:2], topk=default[2], pointers=default[3]))
                                   for n in res},
        }
        print(f"\n{'':<30}" + "".join(f"{short(h.name):>10}" for h in hist))
        for label, per in rows.items():
            print(label)
            for key, fmt, what in (("hit", "{:10.0%}", "relevant run in the block"), ("full", "{:10.0%}", "  ... of those, in full"),
                                   ("chars", "{:10.0f}", "block chars (runs)"), ("dev", "{:10.0%}", "one line: other dev tasks"),
                                   ("js", "{:10.0%}", "one line: react-router"), ("ops", "{:10.0%}", "one line: nginx")):
                print(f"  {what:<28}" + "".join(fmt.format(per[h.name][key]) for h in hist))
            if label != "no gate":
                print(f"  {'chars vs no gate':<28}" + "".join(f"{per[h.name]['chars'] / rows['no gate'][h.name]['chars']:10.0%}" for h in hist))

    # The defaults through the real dispatch path: runs and issues as inject builds them, and follow-ups.
    if args.no_dispatch:
        return
    print("\nthrough dispatch (inject's own path), defaults against no gate:")
    real = {}
    for h in hist:
        t = time.perf_counter()
        m = {"hit": 0, "full": 0, "chars": 0, "nogate_chars": 0, "issues": 0, "issue_hit": 0, "nogate_issue_hit": 0,
             "follow": 0, "parent_first": 0}
        for q in h.queries:
            rel = h.relevant(q)
            inj, ng = h.block(q["query"], q), h.block(q["query"], q, gate=False)
            kinds = [t for r, t in shown_ids(inj).items() if r in rel]
            m["hit"] += bool(kinds)
            m["full"] += "full" in kinds
            m["chars"] += len(inj.block)
            m["nogate_chars"] += len(ng.block)
            judged = h.judged_open(q)
            if judged:
                m["issues"] += 1
                m["issue_hit"] += names(inj.block, judged)
                m["nogate_issue_hit"] += names(ng.block, judged)
            parent = h.parent_of.get(q["queryRunId"])
            if parent and h.ended.get(parent, 1 << 62) <= q["asOf"]:
                m["follow"] += 1
                runs = h.block(q["query"], q, parent=parent).runs
                m["parent_first"] += bool(runs) and runs[0].run_id == parent
        n = len(h.queries)
        real[h.name] = m
        print(f"  {short(h.name):>9}: relevant shown {m['hit'] / n:.0%} ({m['full'] / max(m['hit'], 1):.0%} in full); "
              f"block {m['chars'] / n:.0f} chars against {m['nogate_chars'] / n:.0f} with no gate "
              f"({m['chars'] / max(m['nogate_chars'], 1):.0%}); judged open issue named {m['issue_hit']}/{m['issues']} "
              f"(no gate {m['nogate_issue_hit']}/{m['issues']}); follow-ups with the parent first "
              f"{m['parent_first']}/{m['follow']} ({time.perf_counter() - t:.0f}s)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "chosen": {k: list(v) for k, v in chosen.items()},
                                         "dispatch": real}, indent=2))


if __name__ == "__main__":
    main()
