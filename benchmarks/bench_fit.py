"""Memory that fits each project: defaults that hold on every history, and self-tuning, side by side.

    python benchmarks/bench_fit.py [--corpus pytest-memory,mypy-memory,sphinx-memory,pytest-memory-1k]
                                   [--steps 21] [--json out.json]

Every judged query of every history (qrels.jsonl lines merged per queryRunId) is replayed as of
its moment, its own run left out, asked as text alone (no parent: in these corpora the parent is
derived from the same issue references as the judgments). MRR@10 per history, side by side:

- ``README baseline``: the corpora README's BM25 + recency figure (bs25s over task + summary,
  normalised, + 0.3 x exp(-age / 14 days)), as published;
- ``baseline``: that formula through cybmem's scorer (w_kw 1, w_rec 0.3, w_lin 0, 14 days);
- ``old defaults``: 0.45 / 0.4 / 0.15, 60 days (tuned on pytest alone);
- ``new defaults``: cybmem.retrieval.weights.Weights();
- recency at the project's pace, each variant at its own best default by the same rule:
  ``in runs`` (recency counts the runs that ended since, not days) and ``in gaps`` (days over the
  project's median gap between runs, as of the query).

The rule that chose the defaults: over a grid (``--steps`` values per weight x time constants),
the weighting whose *worst* ratio to the baseline across the histories is highest. Then
leave-one-history-out: the rule applied to the other histories, scored on the one left out.

Self-tuning: ``cybmem.retrieval.tuning.tune`` on the judgments the store derives about itself (no qrels),
as of the median query moment, exactly as ``cybmem tune --as-of T --save`` runs; what it would
save (or the defaults, when it refuses) is scored on the qrels queries asked after that moment,
beside the defaults on the same queries. Targets (the self-tuning issue): new defaults beat the
baseline on every history; self-tuned never loses more than 0.01 to the defaults on any history's
later queries, and gains on average; tuning the 10k-run mypy store takes under a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _corpus  # noqa: E402

from cybmem.retrieval import tuning as T  # noqa: E402
from cybmem.retrieval.judgments import Judgment, merge_judgments  # noqa: E402
from cybmem.retrieval.scoring import MS_PER_DAY  # noqa: E402
from cybmem.settings import Settings  # noqa: E402
from cybmem.store.snapshot import load_snapshot  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402
from cybmem.retrieval.weights import Weights  # noqa: E402

K = 10
#: The corpora README's BM25 + recency baseline (MRR@10), as published there.
README_BASELINE = {"pytest-memory": 0.279, "mypy-memory": 0.497, "sphinx-memory": 0.196}
BASELINE = Weights(w_kw=1.0, w_rec=0.3, w_lin=0.0, half_life_days=14.0)
OLD = Weights(w_kw=0.45, w_rec=0.4, w_lin=0.15, half_life_days=60.0)
CLOCKS = {  # recency variant -> time constants searched (days, runs, median gaps)
    "days": (3.0, 7.0, 14.0, 21.0, 30.0, 45.0, 60.0, 90.0, 120.0),
    "runs": (5.0, 10.0, 20.0, 30.0, 50.0, 80.0, 120.0, 200.0, 300.0),
    "gaps": (2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 80.0, 120.0, 200.0),
}
GAP_WINDOW = 100  # runs over which the typical gap is measured


def short(name: str) -> str:
    return name.removesuffix("-memory").replace("-memory-", "-")


def qrels_judgments(root: Path) -> list[Judgment]:
    return merge_judgments(Judgment(query=q["query"], as_of=q["asOf"], relevant=tuple(q["relevant"]),
                                    query_run_id=q["queryRunId"]) for q in _corpus.load_qrels(root))


def with_clock(m: T.AxisMatrices, snap, clock: str) -> T.AxisMatrices:
    """``m`` with recency measured on another clock: ``age_ms`` holds that clock's units in days' place."""
    if clock == "days":
        return m
    ended = snap.ended_ms()
    age = np.zeros(len(m.rows), dtype=np.float32)
    for q, j in enumerate(m.judgments):
        s, e = int(m.offsets[q]), int(m.offsets[q + 1])
        times = np.sort(ended[snap.candidates(j.as_of)])
        if clock == "runs":  # runs that ended after this one, as of the query
            units = len(times) - np.searchsorted(times, ended[m.rows[s:e]], side="right")
        else:  # days over the median gap between the last runs
            tail = times[-GAP_WINDOW:]
            gap = float(np.median(np.diff(tail))) if len(tail) > 2 else MS_PER_DAY
            units = m.age_ms[s:e].astype(np.float64) / max(gap, 1.0)
        age[s:e] = np.asarray(units, dtype=np.float64) * MS_PER_DAY
    return replace(m, age_ms=age)


def grid(m: T.AxisMatrices, clock: str, steps: int) -> tuple[dict, np.ndarray]:
    g = T.grid_search(m, steps=steps, half_lives=CLOCKS[clock], current=Weights(half_life_days=CLOCKS[clock][0]),
                      progress=False)
    return g.axes, g.values[:, :, :, 0, :]


def robust(values: dict[str, np.ndarray], base: dict[str, float], names: list[str]) -> tuple[tuple, float]:
    """The grid point whose worst ratio to the baseline over ``names`` is highest (ties: the first)."""
    ratio = np.stack([values[n] / base[n] for n in names])
    with np.errstate(all="ignore"):
        worst = np.where(np.isnan(ratio).any(axis=0), -np.inf, ratio.min(axis=0))
    ix = np.unravel_index(int(np.argmax(worst)), worst.shape)
    return ix, float(worst[ix])


def weights_at(axes: dict, ix: tuple) -> Weights:
    return Weights(w_kw=float(axes["w_kw"][ix[0]]), w_rec=float(axes["w_rec"][ix[1]]), w_lin=float(axes["w_lin"][ix[2]]),
                   half_life_days=float(axes["half_life_days"][ix[3]]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="pytest-memory,mypy-memory,sphinx-memory,pytest-memory-1k",
                    help="comma-separated archives of ../shared/corpora or paths of memory roots with qrels.jsonl")
    ap.add_argument("--steps", type=int, default=21, help="grid values per weight, 0 to 1")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = [c.strip() for c in args.corpus.split(",") if c.strip()]
    hist: dict[str, dict] = {}
    for name in names:
        root = _corpus.ensure_corpus(name)
        snap = load_snapshot(MemoryStore(root, _corpus.slug_of(root)))
        js = qrels_judgments(root)
        t = time.perf_counter()
        m = T.axis_matrices(snap, js, k=K, progress=False)
        hist[name] = {"root": root, "snap": snap, "judgments": js, "m": m}
        print(f"{short(name)}: {snap.n:,} records, {m.n} judged queries (axis values in {time.perf_counter() - t:.1f}s)", flush=True)
    base = {n: float(T.evaluate(h["m"], BASELINE)) for n, h in hist.items()}

    # Each recency clock at its own robust default, over the same grid.
    variants: dict[str, tuple[Weights, dict[str, float]]] = {}
    loho: dict[str, tuple[Weights, float]] = {}
    for clock in CLOCKS:
        t = time.perf_counter()
        mats = {n: with_clock(h["m"], h["snap"], clock) for n, h in hist.items()}
        grids = {n: grid(mats[n], clock, args.steps) for n in names}
        axes = grids[names[0]][0]
        values = {n: g[1] for n, g in grids.items()}
        ix, worst = robust(values, base, names)
        w = weights_at(axes, ix)
        variants[clock] = (w, {n: float(values[n][ix]) for n in names})
        print(f"  recency in {clock}: best worst-ratio {worst:.3f} at {w.w_kw:g}/{w.w_rec:g}/{w.w_lin:g}, "
              f"time constant {w.half_life_days:g} ({time.perf_counter() - t:.0f}s)", flush=True)
        if clock == "days":
            for held in names:
                others = [n for n in names if n != held]
                hix, _ = robust(values, base, others)
                loho[held] = (weights_at(axes, hix), float(values[held][hix]))

    new = Weights()
    rows = {
        "README baseline": {n: README_BASELINE.get(Path(n).name) for n in names},
        "baseline": base,
        "old defaults": {n: float(T.evaluate(h["m"], OLD)) for n, h in hist.items()},
        "new defaults": {n: float(T.evaluate(h["m"], new)) for n, h in hist.items()},
        "chosen here (days)": variants["days"][1],
        "recency in runs": variants["runs"][1],
        "recency in gaps": variants["gaps"][1],
    }
    print(f"\nMRR@{K}, every judged query as of its moment, text alone:")
    print(f"{'':<22}" + "".join(f"{short(n):>12}" for n in names) + f"{'worst/base':>12}")
    for label, vals in rows.items():
        ratios = [vals[n] / base[n] for n in names if vals.get(n) is not None]
        cells = "".join(f"{vals[n]:12.3f}" if vals.get(n) is not None else f"{'-':>12}" for n in names)
        print(f"{label:<22}{cells}{min(ratios):12.3f}" if label != "README baseline" else f"{label:<22}{cells}")
    for clock, (w, _) in variants.items():
        print(f"  {clock:>5}: w_kw {w.w_kw:g}, w_rec {w.w_rec:g}, w_lin {w.w_lin:g}, time constant {w.half_life_days:g} {clock}")
    print(f"  new defaults: w_kw {new.w_kw:g}, w_rec {new.w_rec:g}, w_lin {new.w_lin:g}, {new.half_life_days:g} days")
    beat = all(rows["new defaults"][n] > base[n] for n in names)
    print(f"new defaults beat the baseline on every history: {'yes' if beat else 'NO'}")

    print("\nleave one history out (chosen by the rule on the others, scored on the one left out):")
    for held, (w, v) in loho.items():
        print(f"  {short(held):<10} {w.w_kw:g}/{w.w_rec:g}/{w.w_lin:g}, {w.half_life_days:g} days: {v:.3f} "
              f"vs baseline {base[held]:.3f} (x{v / base[held]:.2f})")

    print("\nself-tuned: `cybmem tune --save` as of the median query moment on the judgments the store derives "
          "about itself,\nscored on the qrels queries asked after that moment (text alone):")
    print(f"{'':<12}{'as of':>12}{'judgments':>10}{'saved?':>8}{'defaults':>10}{'self-tuned':>12}{'gain':>8}{'seconds':>9}")
    gains, tuned_rows = [], {}
    settings = Settings.from_env({})
    for name, h in hist.items():
        moment = int(np.median([j.as_of for j in h["judgments"]]))
        t = time.perf_counter()
        result = T.tune(h["snap"], as_of=moment, current=new, settings=settings, progress=False)
        seconds = time.perf_counter() - t
        saved = result.refusal is None
        w = result.saves if saved else new
        later = [j for j in h["judgments"] if j.as_of > moment]
        ml = T.axis_matrices(h["snap"], later, k=K, progress=False)
        d, s = float(T.evaluate(ml, new)), float(T.evaluate(ml, w))
        gains.append(s - d)
        tuned_rows[name] = {"asOf": moment, "judgments": result.judgments, "saved": saved, "weights": w.to_dict(),
                            "defaults": d, "selfTuned": s, "seconds": seconds, "refusal": result.refusal}
        day = time.strftime("%Y-%m-%d", time.gmtime(moment / 1000))
        print(f"{short(name):<12}{day:>12}{result.judgments:>10}{'yes' if saved else 'no':>8}{d:10.3f}{s:12.3f}"
              f"{s - d:+8.3f}{seconds:9.1f}")
        if not saved:
            print(f"{'':<12}kept the defaults: {result.refusal}")
    ok = min(gains) >= -0.01 and float(np.mean(gains)) > 0
    print(f"self-tuned never loses more than 0.01 and gains on average: {'yes' if ok else 'NO'} "
          f"(worst {min(gains):+.3f}, mean {np.mean(gains):+.3f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "rows": rows, "variants": {c: {"weights": w.to_dict(), "values": v} for c, (w, v) in variants.items()},
            "loho": {n: {"weights": w.to_dict(), "value": v} for n, (w, v) in loho.items()},
            "selfTuned": tuned_rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
