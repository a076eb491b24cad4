"""An ipywidgets view for tuning the retrieval weights by hand (imported by notebooks only).

Sliders for every weight and the recency half-life, a query box, the live top-k with each
hit's per-axis contribution (:func:`cybmem.retrieval.search.search`, the code path dispatch uses), the
metric of the slider weights against the judgments ``cybmem tune`` scores on (the same
judgments, mean and split in time: :class:`cybmem.retrieval.tuning.Bench`), and Save / Reload
buttons for the project's ``weights.json`` (what ``cybmem search`` and ``cybmem inject`` read).
Save passes the guard ``cybmem tune --save`` passes (:func:`cybmem.retrieval.tuning.refusal_of`)
and writes the same evidence, or says why not; the Force box is ``--force``. Every callback is a
plain method, so tests drive the view without a browser: set ``view.sliders[...].value``,
``view.query.value``, or call ``view.save()`` / ``view.load()``.
"""

from __future__ import annotations

import dataclasses

import html
import math
from pathlib import Path
from typing import Any, Sequence

from .._extras import require

try:
    import ipywidgets as W
except ImportError:  # the base install: say which extra brings it
    require("ipywidgets", extra="notebook", what="the weight-tuning widget")
    raise

from ..errors import CybmemError, ValidationError
from ..store.loading import load_snapshot
from ..store.snapshot import Snapshot
from ..store.display import head_line
from ..store.records import ms_to_utc
from ..retrieval.search import SearchResult, search
from ..settings import Settings
from ..store.memory_store import MemoryStore
from ..retrieval.judgments import METRICS, Judgment
from ..retrieval.tuning import (AxisMatrices, Bench, check_evidence, check_weights, evaluate, prepare, refusal_of,
                                save_project_weights, weights_state)
from ..retrieval.weights import LoadedWeights, Weights, project_weights_file, weights_for

__all__ = ["TuningView", "tuning_view"]

_WEIGHTS = ("w_kw", "w_rec", "w_lin", "w_vec")
_LABELS = {"w_kw": "keyword", "w_rec": "recency", "w_lin": "lineage", "w_vec": "vector", "half_life_days": "half-life (d)"}


class TuningView:
    """Weight sliders, a query box, the live top-k and the metric; Save writes the project's weights.json.

    Attributes:
        sliders: weight name (``w_kw`` ... ``half_life_days``) -> slider.
        query, k, metric: the query Text, the top-k IntSlider and the metric Dropdown.
        table, score, status: HTML outputs (top-k table, metric line, save/load messages).
        save_button, reload_button: the buttons.
        force: the Force checkbox (``cybmem tune --force``): Save writes weights the guard refuses.
        result: the last :class:`~cybmem.retrieval.search.SearchResult`.
        bench: the judgments as ``cybmem tune`` scores them (:func:`cybmem.retrieval.tuning.prepare`;
            ``judgments=None``: those the store implies, never a file lying in the memory root); None
            without judgments, with the reason in ``no_judgments``.
        matrices: ``bench.matrices`` (None without judgments).
        widget: the whole view (a VBox); displaying the TuningView displays it.
    """

    def __init__(self, store: MemoryStore | Snapshot, *, settings: Settings,
                 judgments: Sequence[Judgment] | str | Path | None = None, query: str = "", k: int = 5,
                 metric: str = "mrr", metric_k: int = 10, now_ms: int | None = None, bench: Bench | None = None):
        self.snapshot = store if isinstance(store, Snapshot) else load_snapshot(store)
        self.store = self.snapshot.store
        self.settings = settings
        self.now_ms = now_ms
        self.bench: Bench | None = bench
        self.no_judgments = "no judgments given (judgments=[])"
        if bench is not None:
            metric_k = bench.matrices.k
        elif judgments is None or isinstance(judgments, (str, Path)) or len(judgments):
            try:
                self.bench = prepare(self.snapshot, judgments=judgments, k=metric_k, settings=self.settings, progress=False)
            except ValidationError as exc:
                self.no_judgments = str(exc)
        self.matrices: AxisMatrices | None = self.bench.matrices if self.bench is not None else None
        # The judgments split in time, so the view shows whether weights that win on the earlier
        # ones also hold on the later ones (what `cybmem tune --save` checks before saving).
        self.folds = self.bench.folds if self.bench is not None else None
        self.metric_k = metric_k
        self._state = weights_state(self.store)  # weights.json as this view last saw it
        saved = self.production().weights
        self._muted = False
        self.sliders: dict[str, W.ValueWidget] = {}
        for name in _WEIGHTS:
            v = getattr(saved, name)
            self.sliders[name] = W.FloatSlider(value=v, min=0.0, max=max(1.0, v), step=0.01, description=_LABELS[name],
                                               continuous_update=False, readout_format=".2f")
        self.sliders["half_life_days"] = W.FloatLogSlider(value=saved.half_life_days, base=10, min=-1.0,
                                                          max=max(3.0, math.log10(saved.half_life_days)), step=0.01,
                                                          description=_LABELS["half_life_days"], continuous_update=False,
                                                          readout_format=".1f")
        self.query = W.Text(value=query, placeholder="a task, e.g. fix the flaky cart drawer test",
                            description="query", continuous_update=False, layout=W.Layout(width="60%"))
        self.k = W.IntSlider(value=k, min=1, max=20, description="top k", continuous_update=False)
        self.metric = W.Dropdown(options=[(f"{label}@{metric_k}", key) for key, label in METRICS.items()], value=metric,
                                 description="metric")
        self.table = W.HTML()
        self.score = W.HTML()
        self.status = W.HTML()
        self.save_button = W.Button(description="Save", button_style="success", icon="save",
                                    tooltip=f"write {self.weights_path}")
        self.reload_button = W.Button(description="Reload", icon="refresh", tooltip="read the saved weights again")
        self.force = W.Checkbox(value=False, description="Force (tune --force)", indent=False,
                                tooltip="save even weights that do not beat the weights in use on the later judgments")
        self.save_button.on_click(lambda _b: self.save())
        self.reload_button.on_click(lambda _b: self.load())
        for w in list(self.sliders.values()) + [self.query, self.k, self.metric]:
            w.observe(self._on_change, names="value")
        self.result: SearchResult | None = None
        self.widget = W.VBox([
            W.HTML(f"<b>Retrieval weights for project {html.escape(self.store.slug)}</b> "
                   f"(saved to <code>{html.escape(str(self.weights_path))}</code>)"),
            W.HBox([W.VBox([self.sliders[n] for n in ("w_kw", "w_rec", "w_lin")]),
                    W.VBox([self.sliders["w_vec"], self.sliders["half_life_days"], self.metric])]),
            W.HBox([self.query, self.k]),
            self.score,
            self.table,
            W.HBox([self.save_button, self.force, self.reload_button, self.status]),
        ])
        self.refresh()

    # -- state -----------------------------------------------------------------------
    def production(self) -> LoadedWeights:
        """The weights ``cybmem search`` and ``inject`` use for the project now, and their sources."""
        return weights_for(self.settings, self.store)

    def production_label(self) -> str:
        """What the weights in use are, for the metric line: "saved weights", or what sets them."""
        loaded = self.production()
        sources = set(loaded.sources.values())
        if str(self.weights_path) in sources:
            return "saved weights"
        if all(src.startswith("default") for src in sources):
            return "default weights (nothing saved)"
        return "weights in use"

    @property
    def weights_path(self) -> Path:
        """The project's weights.json (what Save writes)."""
        return project_weights_file(self.store)

    def weights(self) -> Weights | None:
        """The weights the sliders show, with the project's floors; None while every weight is 0
        (nothing would score)."""
        values = {name: float(s.value) for name, s in self.sliders.items()}
        if not any(values[a] > 0 for a in _WEIGHTS):
            return None
        return dataclasses.replace(self.production().weights, **values)

    def set_weights(self, weights: Weights) -> None:
        """Move the sliders to ``weights`` (one refresh, not one per slider)."""
        self._muted = True
        try:
            for name, s in self.sliders.items():
                v = getattr(weights, name)
                if name == "half_life_days":
                    s.max = max(s.max, math.log10(v))
                    s.min = min(s.min, math.log10(v))
                else:
                    s.max = max(s.max, v)
                s.value = v
        finally:
            self._muted = False
        self.refresh()

    # -- callbacks -------------------------------------------------------------------
    def _on_change(self, _change: Any = None) -> None:
        if not self._muted:
            self.refresh()

    def refresh(self) -> None:
        """Re-run the search and the metric for the current slider values."""
        w = self.weights()
        if w is None:
            self.result = None
            self.table.value = "<i>All weights are 0: nothing would score; move a slider up.</i>"
            self.score.value = self.score_html()
            return
        try:
            self.result = search(self.snapshot, self.query.value, k=int(self.k.value), weights=w,
                                 settings=self.settings, now_ms=self.now_ms)
        except CybmemError as exc:
            self.table.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            self.result = None
        else:
            self.table.value = self.table_html()
        self.score.value = self.score_html()

    def save(self) -> Path | None:
        """Write the slider weights to the project's weights.json (production reads it) with the
        evidence ``cybmem tune --save`` writes, when they pass its guard
        (:func:`cybmem.retrieval.tuning.refusal_of`: checked against the weights in use on the later
        judgments) or Force is ticked. None, and why in the status line, when nothing is written."""
        w = self.weights()
        if w is None:
            self.status.value = "<span style='color:#b00'>Not saved: the weights are all 0; give one of them a positive value.</span>"
            return None
        current = self.production().weights
        if w == current:
            self.status.value = "Nothing to save: the sliders are the weights in use."
            return None
        metric = self.metric.value
        if self.bench is None:
            v, refusal = None, f"there are no judgments to check them on ({self.no_judgments})"
        else:
            v = check_weights(self.bench, w, current, metric=metric, k=self.metric_k)
            refusal = refusal_of(self.bench.keyword_tests, self.bench.matrices.n, v, current)
        if refusal and not self.force.value:
            self.status.value = (f"<span style='color:#b00'>Not saved: {html.escape(refusal)}. Tick Force to save "
                                 "them anyway (as <code>cybmem tune --save --force</code>).</span>")
            return None
        evidence = None
        if self.bench is not None:
            how = (f"set by hand in the tuning view, checked on the later {v.later} judgments" if v is not None
                   else "set by hand in the tuning view (too few judgments to check on later ones)")
            evidence = check_evidence(self.bench, v, metric=metric, k=self.metric_k,
                                      saved=how + (f"; saved with Force although {refusal}" if refusal else ""))
        try:
            path, overridden = save_project_weights(self.store, w, self.settings, evidence=evidence, expect=self._state)
        except CybmemError as exc:
            self.status.value = f"<span style='color:#b00'>Not saved: {html.escape(str(exc))}</span>"
            return None
        self._state = weights_state(self.store)
        msg = f"Saved to <code>{html.escape(str(path))}</code>; <code>cybmem search</code> / <code>inject</code> use it now."
        if refusal:
            msg += f" <b>Forced:</b> {html.escape(refusal)}."
        if overridden:
            msg += " <b>Note:</b> still overridden by " + html.escape(", ".join(overridden)) + "."
        self.status.value = msg
        self.score.value = self.score_html()
        return path

    def load(self) -> Weights:
        """Read the weights production uses for this project and move the sliders there."""
        w = self.production().weights
        self._state = weights_state(self.store)
        self.set_weights(w)
        self.score.value = self.score_html()
        self.status.value = f"Loaded the weights production uses ({html.escape(str(self.weights_path))} "\
                            f"{'exists' if self.weights_path.is_file() else 'absent: defaults'})."
        return w

    # -- rendering -------------------------------------------------------------------
    def _metric_of(self, w: Weights | None, matrices: AxisMatrices | None = None) -> float | None:
        m = self.matrices if matrices is None else matrices
        if m is None or not m.n or w is None:
            return None
        return float(evaluate(m, w, metric=self.metric.value if hasattr(self, "metric") else "mrr", k=self.metric_k))

    def fold_metrics(self, w: Weights | None = None) -> tuple[float | None, float | None]:
        """The metric on the earlier and on the later half of the judgments in time (None: too few)."""
        if self.folds is None:
            return None, None
        w = self.weights() if w is None else w
        return self._metric_of(w, self.folds[0]), self._metric_of(w, self.folds[1])

    def current_metric(self) -> float | None:
        """The metric of the slider weights over the judgments (None without judgments): the number
        ``cybmem tune`` and ``cybmem eval`` report for the same weights."""
        return self._metric_of(self.weights())

    def score_html(self) -> str:
        """The metric line: the slider weights on all judgments and on the earlier / later halves,
        beside the weights in use (named for what they are: saved, or the defaults)."""
        if self.matrices is None or not self.matrices.n:
            return f"<i>No judgments to score against: {html.escape(self.no_judgments)}.</i>"
        label = f"{METRICS[self.metric.value]}@{self.metric_k}"
        cur = self.current_metric()
        in_use = self.production().weights
        cur_s = "n/a (all weights 0)" if cur is None else f"{cur:.4f}"
        out = f"<b>{label} = {cur_s}</b> over {self.matrices.n} judgments"
        early, late = self.fold_metrics()
        name = html.escape(self.production_label())
        if early is not None and late is not None:
            s_early, s_late = self.fold_metrics(in_use)
            out += (f" &middot; earlier half {early:.4f}, <b>later half {late:.4f}</b>"
                    f" ({name}: {s_early:.4f} / {s_late:.4f})")
        out += f" &middot; {name}: {self._metric_of(in_use):.4f}"
        if self.matrices.skipped:
            out += f" &middot; {len(self.matrices.skipped)} skipped"
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The live top-k as plain rows (rank, run, ended, state, score, per-axis contributions, task)."""
        if self.result is None:
            return []
        return [{"rank": h.rank, "run": h.run_id[:8], "ended": ms_to_utc(h.ended_at_ms), "state": h.state,
                 "score": round(h.score, 4), **{a: round(h.contributions.get(a, 0.0), 4) for a in ("keyword", "recency", "lineage", "vector")},
                 "task": head_line(h.task, 70)} for h in self.result.hits]

    def table_html(self) -> str:
        """The live top-k as an HTML table."""
        rows = self.rows()
        if not rows:
            return "<i>No hits.</i>"
        cols = ["rank", "run", "ended", "state", "score", "keyword", "recency", "lineage", "vector", "task"]
        head = "".join(f"<th style='text-align:left;padding:2px 6px'>{c}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td style='padding:2px 6px'>{html.escape(str(r[c]))}</td>" for c in cols) + "</tr>"
                       for r in rows)
        return f"<table style='border-collapse:collapse;font-size:12px'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def snapshot_html(self) -> str:
        """A static rendering (weights, metric, table) for exports where widgets do not run."""
        w = self.weights()
        ws = ", ".join(f"{k}={v:g}" for k, v in w.to_dict().items()) if w is not None else "all 0"
        q = html.escape(self.query.value) or "<i>(empty query: recency and lineage only)</i>"
        return (f"<div><b>Tuning view</b> (static snapshot) &middot; weights: {ws}<br>query: {q}<br>"
                f"{self.score_html()}<br>{self.table_html()}</div>")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs) or {}
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        bundle = dict(bundle)
        bundle["text/html"] = self.snapshot_html()
        w = self.weights()
        bundle["text/plain"] = f"TuningView(project={self.store.slug!r}, weights={w.to_dict() if w else 'all 0'})"
        return bundle


def tuning_view(store: MemoryStore | Snapshot, **kwargs: Any) -> TuningView:
    """Build a :class:`TuningView` (arguments as its constructor); display it in a notebook."""
    return TuningView(store, **kwargs)
