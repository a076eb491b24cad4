"""The learned ranker with and without the issue-ledger features, each history left out (issue 39).

    python benchmarks/bench_ledger.py [--corpus pytest-memory,mypy-memory,sphinx-memory,celery-memory]
                                      [--rounds 500] [--json out.json]

The protocol is cybmem.retrieval.ranker_training's (bench_rank.py's ``learned`` column): every judged
query ranked as of its moment against the runs ended then, text only; the first stage's pool
reordered by LambdaMART trained on the *other* histories (the shipped PARAMS and rounds). Two rows:

- ``without``: the shipped features (cybmem.retrieval.features.FEATURES);
- ``with ledger``: those and ranker_training.LEDGER_FEATURES, computed as of the query's moment
  (the run opened an issue still open then, it resolved one, how many it opened, and the share of
  the task's terms in the text of an open issue it opened).

In these corpora a judgment means "both runs name the same ticket", so a gain from the ledger
features measures how the labels were made at least as much as relevance: the shipped model
leaves them out and this table is what the issue asks to report beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

from cybmem.progress import Progress  # noqa: E402
from cybmem.retrieval import ranker_training as RT  # noqa: E402
from cybmem.retrieval.judgments import load_judgments  # noqa: E402
from cybmem.store.loading import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402

DEV = "pytest-memory,mypy-memory,sphinx-memory,celery-memory"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEV, help="comma-separated archives of ../shared/corpora or memory roots with qrels.jsonl")
    ap.add_argument("--rounds", type=int, default=RT.ROUNDS)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = [c.strip() for c in args.corpus.split(",") if c.strip()]
    plain, ledger = [], []
    for name in names:
        root = _corpus.ensure_corpus(name)
        snap = load_snapshot(MemoryStore(root, _corpus.slug_of(root)))
        js = [dataclasses.replace(j, parent_run_id=None, chat_session_id=None) for j in load_judgments(root / "qrels.jsonl")]
        t = time.perf_counter()
        h = RT.history(snap, js, name=name.removesuffix("-memory"), ledger=True, progress=True)
        n = len(RT.FEATURES)
        ledger.append(h)
        plain.append(dataclasses.replace(h, X=np.ascontiguousarray(h.X[:, :n]), features=RT.FEATURES))
        on = h.X[:, n:] > 0
        print(f"{h.name}: {h.queries} judged queries, {len(h.X):,} pool entries, features in "
              f"{time.perf_counter() - t:.1f}s; entries with a ledger feature set: "
              + ", ".join(f"{f} {on[:, i].mean():.3f}" for i, f in enumerate(RT.LEDGER_FEATURES))
              + f"; among relevant: {on[h.y == 1].any(axis=1).mean():.3f}", flush=True)
    bar = Progress(2, "leave one history out, without / with ledger", enabled=True)
    tables = {}
    for label, hs in (("without", plain), ("with ledger", ledger)):
        tables[label] = RT.leave_one_out(hs, rounds=args.rounds, progress=True)
        bar.update(note=label)
    bar.close()
    print(f"\nMRR@{RT.K}, each history scored by the model trained on the others:")
    heads = [r.name for r in tables["without"].rows]
    print(f"{'':<14}" + "".join(f"{h:>10}" for h in heads) + f"{'mean':>10}")
    print(f"{'linear':<14}" + "".join(f"{r.linear_mrr:>10.3f}" for r in tables["without"].rows)
          + f"{tables['without'].mean_linear:>10.3f}")
    for label, t in tables.items():
        print(f"{label:<14}" + "".join(f"{r.learned_mrr:>10.3f}" for r in t.rows) + f"{t.mean_learned:>10.3f}")
    if args.json:
        args.json.write_text(json.dumps({k: t.to_dict() for k, t in tables.items()}, indent=2))


if __name__ == "__main__":
    main()
