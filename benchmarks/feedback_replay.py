"""A store with feedback on a real history, and the feedback page's figures on it.

    python benchmarks/feedback_replay.py                  # newest 2000 pytest runs -> .data/feedback-pytest/
    python benchmarks/feedback_replay.py --runs 500 --corpus pytest-memory-1k

Copies the corpus into ``benchmarks/.data/feedback-<corpus>/`` (once) and replays its newest
``--runs`` runs through :func:`cybmem.explore.usage.replay`: each run is dispatched again as of its start
(the block ``cybmem inject`` would have shown it then, kept in ``shown.jsonl``), and a simulated
agent uses the shown runs the history's own issue and parent links relate it to (kept in
``used.jsonl``, as the write path notes it). Then it draws what ``notebooks/06-feedback.ipynb``
draws into ``benchmarks/out/figures/feedback/``: use over time, use by rank, and the tuning grid
on the "used" judgments against the current weights. Point ``cybmem report`` (or the notebook)
at the store to see the page:

    cybmem report --memory-dir benchmarks/.data/feedback-pytest -p pytest --out /tmp/feedback-report
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _corpus  # noqa: E402

from cybmem import MemoryStore, Settings, load_snapshot  # noqa: E402
from cybmem.explore import plots, usage  # noqa: E402
from cybmem.store.feedback_log import SHOWN_FILE, USED_FILE  # noqa: E402

OUT = HERE / "out" / "figures" / "feedback"


def build(corpus: str, runs: int) -> MemoryStore:
    """The corpus copied to benchmarks/.data/feedback-<corpus>/ with the replay's logs (made once per --runs)."""
    src = _corpus.ensure_corpus(corpus)
    dest = _corpus.DATA_DIR / f"feedback-{corpus}"
    marker = dest / f".replayed-{runs}"
    slug = next(p.name for p in src.iterdir() if (p / "records").is_dir())
    if marker.exists():
        return MemoryStore(dest, slug)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("qrels.jsonl", ".cache"))
    store = MemoryStore(dest, slug)
    settings = Settings.from_env({}, memory_dir=dest)
    t = time.perf_counter()
    snap = load_snapshot(store)
    used = usage.replay(snap, settings, last=runs, into=store.dir)
    took = time.perf_counter() - t
    print(f"replayed the newest {runs} of {snap.n} runs of {corpus} in {took:.1f}s ({took / runs * 1000:.1f} ms a run): "
          f"{len(used)} shown something; {store.dir / SHOWN_FILE}, {store.dir / USED_FILE}")
    marker.write_text("ok")
    return store


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="pytest-memory")
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args(argv)
    store = build(args.corpus, args.runs)
    settings = Settings.from_env({}, memory_dir=store.root)
    fb = usage.load_feedback(store, settings)
    print(fb)
    frame = usage.used_frame(fb.used)
    OUT.mkdir(parents=True, exist_ok=True)
    by_time, by_rank = usage.usage_over_time(frame), usage.usage_by_rank(frame)
    print(by_rank.to_string(index=False))
    t = time.perf_counter()
    check = usage.check_weights(store, fb.used, settings)
    print(f"{check.summary()} ({time.perf_counter() - t:.1f}s)")
    moved = check.ranks.dropna()
    print(f"used runs ranked higher by the best weights: {(moved['bestRank'] < moved['currentRank']).sum()}, "
          f"lower: {(moved['bestRank'] > moved['currentRank']).sum()}, of {len(check.ranks)}")
    for name, fig in (("over-time.png", plots.feedback_over_time(by_time)),
                      ("by-rank.png", plots.feedback_by_rank(by_rank)),
                      ("weights.png", plots.weight_heatmap(check.result))):
        fig.savefig(OUT / name, dpi=90)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
