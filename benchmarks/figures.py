"""Render the notebooks' figures on the real corpus (7,761 runs) and a 100,000-run replica of it.

    python benchmarks/figures.py                      # both sizes -> benchmarks/out/figures/{7.7k,100k}/
    python benchmarks/figures.py --sizes 7.7k         # the corpus only
    python benchmarks/figures.py --memory-dir DIR -p SLUG --sizes 7.7k   # any store

The corpus is unpacked once into benchmarks/.data/ (see _corpus.py); the replica is written there
once too (about 30 s) and its Arrow cache built on first load. Each figure is a PNG a person can
open; the script prints where they went and how long each took. The figures are the ones the
report notebooks draw: the lineage view (largest and most recent dispatch trees), one dispatch
tree, issue ages, runs over time and the weight-tuning heatmaps (on the qrels.jsonl the corpus carries, named, when it
has one, else on derived judgments).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _corpus  # noqa: E402

import cybmem  # noqa: E402
from cybmem.explore import plots  # noqa: E402
from cybmem.retrieval import tuning  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402

OUT = HERE / "out" / "figures"


def replica_100k() -> Path:
    """benchmarks/.data/pytest-memory-100k: the corpus replicated to 100,000 runs (written once)."""
    dest = _corpus.DATA_DIR / "pytest-memory-100k"
    if (dest / "pytest" / "issues.jsonl").exists():
        return dest
    root = _corpus.ensure_corpus()
    recs, events = _corpus.load_records(root), _corpus.load_issues(root)
    tmp = dest.with_name(dest.name + ".tmp")
    _corpus.write_store(_corpus.replicate(recs, 100_000), tmp,
                        issues=_corpus.replicate_issues(events, recs, 100_000))
    tmp.rename(dest)
    return dest


def render(store: cybmem.MemoryStore, out: Path, *, heatmaps: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    snap = load_snapshot(store)
    records = cybmem.records_frame(snap).sort_values(["endedAt", "runId"]).reset_index(drop=True)
    print(f"{store.root} ({store.slug}): {len(records):,} runs loaded in {time.perf_counter() - t:.1f}s")

    def save(name: str, make) -> None:
        t0 = time.perf_counter()
        fig = make()
        fig.savefig(out / name, dpi=90)
        print(f"  {out / name}  ({time.perf_counter() - t0:.1f}s)  {fig!r}")

    save("lineage.png", lambda: plots.lineage_graph(records))
    save("lineage-recent.png", lambda: plots.lineage_graph(records, trees="recent"))
    edges = cybmem.lineage_edges(snap)
    parents = edges.loc[edges["kind"] == "parent", "src"]
    if len(parents):
        focus = parents.value_counts().idxmax()
        save("lineage-one-tree.png", lambda: plots.lineage_graph(records, focus=focus, scope="tree"))
    now = records["endedAt"].max()
    fold = cybmem.issue_fold(snap, now=now)
    save("issue-ages.png", lambda: plots.issue_age_histograms(
        fold, title=f"Issue ages in {store.slug} (measured at {now:%Y-%m-%d %H:%M} UTC)"))
    save("runs-over-time.png", lambda: plots.runs_over_time(records))
    if heatmaps:
        t0 = time.perf_counter()
        settings = cybmem.Settings.from_env(memory_dir=store.root)
        # The corpus's qrels, named (a file lying in the root is never taken on its own): derived
        # judgments mostly ask for the parent a follow-up is shown first, which every weighting
        # meets (a flat map).
        qrels = store.root / "qrels.jsonl"
        bench = tuning.prepare(snap, judgments=qrels if qrels.is_file() else None, k=10, settings=settings)
        result = tuning.grid_search(bench.matrices, metric="mrr", k=10, current=cybmem.weights_for(settings, store).weights)
        print(f"  grid search on {bench.matrices.n} judgments {bench.judgment_set.source} in {time.perf_counter() - t0:.1f}s")
        save("weights-kw-rec.png", lambda: plots.weight_heatmap(result, x="w_kw", y="w_rec"))
        save("weights-lin-half-life.png", lambda: plots.weight_heatmap(result, x="w_lin", y="half_life_days", reduce="max"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="7.7k,100k", help="comma-separated: 7.7k (the corpus), 100k (its replica)")
    ap.add_argument("--memory-dir", type=Path, help="render this store instead of the corpus (with --sizes 7.7k)")
    ap.add_argument("-p", "--project", default="pytest")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--no-heatmaps", action="store_true", help="skip the weight grid (the slow part at 100k)")
    args = ap.parse_args(argv)
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        if size == "7.7k":
            root = args.memory_dir or _corpus.ensure_corpus()
        elif size == "100k":
            root = replica_100k()
        else:
            ap.error(f"unknown size {size!r}")
        render(cybmem.MemoryStore(root, args.project), args.out / size, heatmaps=not args.no_heatmaps)


if __name__ == "__main__":
    main()
