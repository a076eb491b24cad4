"""What the MEMORY block gives an agent, replayed over the corpus qrels, before and after.

    python benchmarks/bench_dispatch.py [--corpus pytest-memory] [--topk 3,4,5,6,8] [--json out.json]

Every judged query (qrels lines merged per queryRunId) is dispatched as production would have
dispatched it at its moment: the block is built through cybmem.dispatch.inject as of the query's
asOf (records that ended by then, issues folded as of then, recency from then), the query's own
run left out. Printed per layout:

- the share of the block spent on prior runs and on the open-issues section;
- the fraction of queries whose runs part names a judged-relevant run (one that existed then);
- the fraction of queries with a judged issue still open then (an issue the query's run and
  its relevant runs both carry) whose block lists it (on a run's "raised:" line or in the
  issues section).

"before" is the earlier layout, rebuilt here from the same parts as the baseline: the top 3
runs, then the open issues raised by them, then the newest other open issues, line by line
until the budget is full. "after" is cybmem.dispatch.inject as it is, at several top-k.

Then the same queries as follow-ups: dispatched with the query run's recorded parentRunId (the
corpus' "follow-up run dispatched from it") as the dispatcher's parent, ranked by score alone
(the earlier rule) and with the parent shown first (cybmem.dispatch.inject now): how often the parent
is in the block. The parent is a judged-relevant run by construction, so these rows are about
lineage, not text matching.
Targets (the dispatch issue): relevant run for >= 55% of queries, judged open issue listed for
>= 90%, issue section <= 35% of the block.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

from cybmem.dispatch import inject as dispatch  # noqa: E402
from cybmem.dispatch.preamble import OpenIssue, PreambleEntry, estimate_tokens, layout  # noqa: E402
from cybmem.retrieval.search import search  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.retrieval.weights import LoadedWeights, Weights  # noqa: E402


def merged_qrels(root: Path) -> list[dict]:
    by_query: dict[str, dict] = {}
    for q in _corpus.load_qrels(root):
        m = by_query.setdefault(q["queryRunId"], {**q, "relevant": []})
        m["relevant"] += [r for r in q["relevant"] if r not in m["relevant"]]
    return list(by_query.values())


def legacy_block(snap, task: str, settings: Settings, as_of: int, exclude: str) -> str:
    """The earlier layout (the baseline): top 3 runs, then raised-first, newest open issues."""
    result = search(snap, task, k=3, weights=Weights(), settings=settings, as_of=as_of, exclude=exclude)
    table = snap.open_issues(as_of)
    rows = table.to_pylist()
    raised = {i for h in result.hits for i in h.issues}
    rows = [r for r in rows if r["issueId"] in raised] + [r for r in rows if r["issueId"] not in raised]
    open_ids = {r["issueId"] for r in rows}
    entries = [PreambleEntry(h.run_id, h.ended_at_ms, h.state, h.task, h.summary,
                             [i for i in h.issues if i in open_ids and i in raised], h.next) for h in result.hits]
    issues = [OpenIssue(r["issueId"], r["title"], int(r["openedAt"].timestamp() * 1000), r["openedBy"] or "")
              for r in rows[: settings.max_tokens // 10]]
    return layout(entries, issues, max_tokens=settings.max_tokens, top_k=3).text


def block_parts(block: str) -> tuple[int, int]:
    """Characters of the runs part and of the issues section of a block."""
    if not block:
        return 0, 0
    head, _, rest = block.partition("\n")
    runs, sep, issues = rest.rpartition("\nOpen issues in this project:") if "Open issues in this project:" in rest \
        else (rest, "", "")
    if not sep and rest.startswith("Open issues in this project:"):
        runs, issues = "", rest
    return len(runs), len(issues) + len(sep)


def measure(name, snap, qrels, ended, issues_of, settings, build, parent_of=None) -> dict:
    runs_hit, issue_hit, issue_judged, run_share, issue_share, shown, tokens = 0, 0, 0, [], [], [], []
    parents, parent_hit = 0, 0
    t0 = time.perf_counter()
    n = 0
    for q in qrels:
        rel = [r for r in q["relevant"] if ended.get(r, 1 << 62) <= q["asOf"]]
        if not rel:
            continue
        n += 1
        block = build(q)
        runs_text = block.split("\nOpen issues in this project:")[0]
        if any(f"- run {r[:8]} " in runs_text for r in rel):
            runs_hit += 1
        parent = parent_of(q) if parent_of else None
        if parent:
            parents += 1
            parent_hit += f"- run {parent[:8]} " in runs_text
        judged = set(issues_of.get(q["queryRunId"], [])) & {i for r in rel for i in issues_of.get(r, [])}
        open_now = set(snap.open_issues(q["asOf"]).column("issueId").to_pylist()) & judged
        if open_now:
            issue_judged += 1
            if any(re.search(rf"(?<![\w.-]){re.escape(i)}(?![\w.-])", block) for i in open_now):
                issue_hit += 1
        shown.append(block.count("\n- run "))
        tokens.append(estimate_tokens(block))
        r_chars, i_chars = block_parts(block)
        total = max(len(block), 1)
        run_share.append(r_chars / total)
        issue_share.append(i_chars / total)
    return {"name": name, "queries": n, "relevantRun": runs_hit / n, "judgedIssueQueries": issue_judged,
            "judgedIssueListed": issue_hit / max(issue_judged, 1), "runShare": statistics.fmean(run_share),
            "issueShare": statistics.fmean(issue_share), "runsShown": statistics.fmean(shown),
            "blockTokens": statistics.median(tokens), "msPerQuery": (time.perf_counter() - t0) / n * 1e3,
            "parents": parents, "parentShown": parent_hit / max(parents, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="pytest-memory", help="an archive of ../shared/corpora (pytest-memory, pytest-memory-1k) or the path of a memory root with qrels.jsonl")
    ap.add_argument("--topk", default="3,4,5,6,8", help="comma-separated top-k values for the current layout")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = _corpus.ensure_corpus(args.corpus)
    qrels = merged_qrels(root)
    store = MemoryStore(root, _corpus.slug_of(root))
    snap = load_snapshot(store)
    ids = snap.records.column("runId").to_pylist()
    ended = dict(zip(ids, snap.ended_ms().tolist()))
    issues_of = dict(zip(ids, snap.records.column("issues").to_pylist()))
    base = Settings.from_env({}, memory_dir=root)
    print(f"{args.corpus}: {snap.n:,} records, {len(qrels)} judged queries, budget {base.max_tokens} tokens, "
          f"issue cap {base.issues}")
    loaded = LoadedWeights(Weights(), {})
    results = [measure("before (top 3, newest issues)", snap, qrels, ended, issues_of, base,
                       lambda q: legacy_block(snap, q["query"], base, q["asOf"], q["queryRunId"]))]
    for k in [int(x) for x in args.topk.split(",")]:
        settings = replace(base, topk=k)
        results.append(measure(f"after  (top {k})", snap, qrels, ended, issues_of, settings,
                               lambda q, s=settings: dispatch._build(store, q["query"], s, loaded, as_of=q["asOf"], now_ms=None,
                                                                     parent_run_id=None, chat_session_id=None,
                                                                     exclude=q["queryRunId"]).block))
    print(f"{'layout':<32} {'runs':>6} {'issues':>7} {'runs shown':>11} {'tokens':>7} {'relevant run':>13} "
          f"{'judged open issue listed':>25} {'ms/query':>9}")
    for r in results:
        print(f"{r['name']:<32} {r['runShare']:6.0%} {r['issueShare']:7.0%} {r['runsShown']:11.1f} {r['blockTokens']:7.0f} "
              f"{r['relevantRun']:13.0%} {r['judgedIssueListed']:>18.0%} of {r['judgedIssueQueries']:<3} {r['msPerQuery']:9.1f}")
    print("targets: relevant run >= 55%, judged open issue listed >= 90%, issue section <= 35% of the block")
    # Follow-ups: the same queries dispatched with the query run's recorded parentRunId as
    # CYBERINE_PARENT_RUN_ID, as an orchestrator dispatching a follow-up would. The corpus sets
    # parentRunId to the latest earlier run that references the same issue number, so the parent
    # is a judged-relevant run by construction: these rows show what the dispatcher's lineage
    # gives an agent, not how well the text is matched (the targets are for the rows above).
    parent_of_run = dict(zip(ids, snap.records.column("parentRunId").to_pylist()))

    def parent_of(q):
        p = parent_of_run.get(q["queryRunId"])
        return p if p and ended.get(p, 1 << 62) <= q["asOf"] else None

    settings = replace(base, topk=8)

    def follow_up(q):
        return dispatch._build(store, q["query"], settings, loaded, as_of=q["asOf"], now_ms=None, parent_run_id=parent_of(q),
                               chat_session_id=None, exclude=q["queryRunId"]).block

    real_search = dispatch.search
    dispatch.search = lambda *a, **kw: real_search(*a, **{**kw, "pin_parent": False})  # the earlier rule
    try:
        follow = [measure("follow-ups, by score (top 8)", snap, qrels, ended, issues_of, settings, follow_up, parent_of)]
    finally:
        dispatch.search = real_search
    follow.append(measure("follow-ups, parent first (top 8)", snap, qrels, ended, issues_of, settings, follow_up, parent_of))
    print(f"\nfollow-ups (the query run's parentRunId passed as CYBERINE_PARENT_RUN_ID; a judged-relevant run by "
          f"construction):\n{'layout':<34} {'parent shown':>13} {'relevant run':>13} {'judged open issue listed':>25}")
    for r in follow:
        print(f"{r['name']:<34} {r['parentShown']:>6.0%} of {r['parents']:<3} {r['relevantRun']:13.0%} "
              f"{r['judgedIssueListed']:>18.0%} of {r['judgedIssueQueries']:<3}")
    results += follow
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"corpus": args.corpus, "results": results}, indent=2))


if __name__ == "__main__":
    main()
