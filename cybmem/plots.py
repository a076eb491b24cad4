"""Figures for notebooks and reports: each function returns a matplotlib Figure.

Figures are built with the object API (``matplotlib.figure.Figure``), never through pyplot:
no backend is selected, no global figure list grows (nothing to close, no "too many figures"
warning), and nothing is shown. Jupyter displays a returned Figure inline; ``fig.savefig``
renders it with Agg anywhere, headless included. Nothing in the write or inject path imports
this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib import dates as mdates
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from .outcome import head_line

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .tuning import GridResult

__all__ = [
    "STATE_COLORS",
    "lineage_lanes",
    "lineage_graph",
    "issue_age_histograms",
    "issue_age_values",
    "histogram_bins",
    "histogram_edges",
    "Histogram",
    "IssueAgeData",
    "lineage_summary",
    "runs_over_time",
    "weight_heatmap",
]

#: node / bar colour per run state
STATE_COLORS = {"done": "#2e9e44", "error": "#d62728", "cancelled": "#8c8c8c"}
_EDGE_STYLE = {
    "previous": {"color": "#b0b0b0", "linewidth": 0.8, "linestyle": "-", "label": "previous run (previousRunId)"},
    "parent": {"color": "#1f5fbf", "linewidth": 1.4, "linestyle": "-", "label": "dispatched by (parentRunId)"},
    "superseded": {"color": "#d62728", "linewidth": 1.2, "linestyle": ":", "label": "superseded by (correction)"},
}
_CHAT_COLORS = ["#fdd49e", "#c6dbef", "#d9f0a3", "#fcc5c0", "#dadaeb", "#ccebc5", "#fee391", "#c7e9b4"]
_MS_PER_DAY = 86_400_000


class _Figure(Figure):
    """A Figure whose repr names it (``<Figure: Lineage of 47 runs>``): readable as text/plain
    in notebooks and as the alt text of the image in reports."""

    def __repr__(self) -> str:
        title = self.get_suptitle() or next((ax.get_title() for ax in self.axes if ax.get_title()), "")
        return f"<Figure: {' '.join(title.split())}>" if title else super().__repr__()


def _head(text: Any, limit: int) -> str:
    return head_line(str(text or ""), limit)


def _datenum(ts: "pd.Series") -> np.ndarray:
    """tz-aware timestamps -> matplotlib date numbers (days since 1970-01-01)."""
    import pandas as pd

    ms = (ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")
    return ms.to_numpy(dtype=np.float64) / _MS_PER_DAY


def _date_axis(ax) -> None:
    loc = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))


# --------------------------------------------------------------------------------------
# Lineage graph
# --------------------------------------------------------------------------------------


def lineage_lanes(records: "pd.DataFrame") -> "pd.DataFrame":
    """One row per run: its dispatch-tree root and the lane it is drawn in.

    A dispatch tree is a run plus everything dispatched from it (parentRunId, transitively).
    Runs that neither have nor are a parent share lane 0; each tree gets a lane of its own,
    re-used by later trees that start after it ended (interval packing), so hundreds of runs
    stay within a few lanes.

    Returns:
        DataFrame indexed like ``records`` with columns ``treeRoot`` and ``lane``.
    """
    import pandas as pd

    ids = records["runId"].astype(str).tolist()
    known = set(ids)
    parent = {r: (p if isinstance(p, str) and p in known else None) for r, p in zip(ids, records["parentRunId"].tolist())}
    root: dict[str, str] = {}
    for r in ids:
        path, cur = [], r
        while cur not in root and parent.get(cur) and cur not in path and len(path) < 10_000:
            path.append(cur)
            cur = parent[cur]
        top = root.get(cur, cur)
        for x in path + [cur]:
            root[x] = top
    roots = pd.Series([root[r] for r in ids], index=records.index)
    sizes = roots.value_counts()
    start = _datenum(records["startedAt"])
    end = _datenum(records["endedAt"])
    span = pd.DataFrame({"root": roots, "start": start, "end": end})
    trees = span[span["root"].map(sizes) > 1].groupby("root").agg(start=("start", "min"), end=("end", "max"))
    trees = trees.sort_values(["start", "end"])
    gap = max((np.nanmax(end) - np.nanmin(start)) * 0.01, 1e-6) if len(records) else 0.0
    lane_end: list[float] = []
    lane_of: dict[str, int] = {}
    for r, row in trees.iterrows():
        for i, e in enumerate(lane_end):
            if e + gap < row["start"]:
                lane_end[i] = row["end"]
                lane_of[r] = i + 1
                break
        else:
            lane_end.append(row["end"])
            lane_of[r] = len(lane_end)
    lanes = roots.map(lambda x: lane_of.get(x, 0)).astype("int64")
    return pd.DataFrame({"treeRoot": roots.astype("string"), "lane": lanes}, index=records.index)


def _tree_members(records: "pd.DataFrame", run_id: str) -> set[str]:
    lanes = lineage_lanes(records)
    root = lanes.loc[records["runId"] == run_id, "treeRoot"]
    members = set(records.loc[lanes["treeRoot"] == root.iloc[0], "runId"]) if len(root) else {run_id}
    chats = set(records.loc[records["runId"].isin(members), "chatSessionId"].dropna())
    if chats:
        members |= set(records.loc[records["chatSessionId"].isin(chats), "runId"])
    return members


def _resolve(records: "pd.DataFrame", run: str | None) -> str | None:
    if not run:
        return None
    ids = records["runId"].astype(str)
    hit = ids[ids.str.startswith(run)]
    if len(hit) != 1:
        from .errors import AmbiguousError, NotFoundError

        if len(hit) == 0:
            raise NotFoundError(f"no run starts with {run!r} in these records")
        raise AmbiguousError(f"run prefix {run!r} matches {len(hit)} runs: {', '.join(hit.str[:8].head(5))}…; give more characters")
    return str(hit.iloc[0])


def lineage_graph(records: "pd.DataFrame", *, focus: str | None = None, scope: str = "project",
                  highlight: str | None = None, labels: bool | None = None, x: str | None = None,
                  title: str | None = None, figsize: tuple[float, float] | None = None) -> Figure:
    """Runs as nodes over time, one lane per dispatch tree, with their lineage edges.

    Nodes are coloured by state (hollow when superseded); previousRunId links are thin grey
    lines, parentRunId links blue arrows, corrections red dotted lines; each chat session is a
    shaded band around its runs. Lanes come from :func:`lineage_lanes`.

    Args:
        records: a records DataFrame (:func:`cybmem.frames.records_frame` / ``Snapshot.records_frame``).
        focus: a run id (or unique prefix) to centre on; with ``scope="tree"`` only its
            dispatch tree and the chat sessions it touches are drawn.
        scope: ``"project"`` (every run) or ``"tree"``.
        highlight: a run id (or prefix) to mark and label (default: ``focus``).
        labels: label every node with its task head (default: when there are at most 40 runs).
        x: ``"time"`` (when each run ended) or ``"order"`` (evenly spaced in the order runs
            ended: readable when runs bunch up); default time for a project, order for a tree.
        title: figure title (default describes the scope).
        figsize: inches (default grows with the number of lanes).

    Returns:
        The Figure (one Axes). Node collections carry gids ``nodes-<state>``.
    """
    if scope not in ("project", "tree"):
        from .errors import ValidationError

        raise ValidationError(f"scope must be 'project' or 'tree', not {scope!r}")
    x_mode = x or ("order" if scope == "tree" else "time")
    if x_mode not in ("time", "order"):
        from .errors import ValidationError

        raise ValidationError(f"x must be 'time' or 'order', not {x!r}")
    df = records.sort_values(["endedAt", "runId"], kind="stable").reset_index(drop=True)
    focus_id = _resolve(df, focus)
    if scope == "tree":
        if focus_id is None:
            from .errors import ValidationError

            raise ValidationError("scope='tree' needs focus=<run id>")
        df = df[df["runId"].isin(_tree_members(df, focus_id))].reset_index(drop=True)
    hl = _resolve(df, highlight) if highlight else focus_id
    n = len(df)
    lanes = lineage_lanes(df) if n else None
    n_lanes = int(lanes["lane"].max()) + 1 if n else 1
    fig = _Figure(figsize=figsize or (11, min(2.2 + 0.45 * n_lanes, 12)), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title or (f"Lineage of {n} runs" + (f" (dispatch tree of {focus_id[:8]})" if scope == "tree" else "")))
    ax.set_xlabel("run ended (UTC)" if x_mode == "time" else "runs in the order they ended")
    ax.set_ylabel("lane (dispatch tree)")
    if not n:
        ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
        return fig
    ended = _datenum(df["endedAt"])
    x = ended if x_mode == "time" else np.arange(n, dtype=float)
    y = lanes["lane"].to_numpy(dtype=float)
    pos = {rid: (xx, yy) for rid, xx, yy in zip(df["runId"].astype(str), x, y)}
    handles: list[Any] = []

    # Chat sessions: a shaded band around each session's runs.
    chats = df.dropna(subset=["chatSessionId"]).groupby("chatSessionId", sort=False)
    for i, (chat, g) in enumerate(chats):
        gx, gy = x[g.index.to_numpy()], lanes.loc[g.index, "lane"].to_numpy(dtype=float)
        pad = max((x.max() - x.min()) * 0.006, 0.01)
        color = _CHAT_COLORS[i % len(_CHAT_COLORS)]
        ax.add_patch(Rectangle((gx.min() - pad, gy.min() - 0.35), gx.max() - gx.min() + 2 * pad, gy.max() - gy.min() + 0.7,
                               facecolor=color, edgecolor="none", alpha=0.6, zorder=0, gid=f"chat-{chat}"))
        if i < 8:
            handles.append(Patch(facecolor=color, alpha=0.6, label=f"chat session {_head(chat, 24)} ({len(g)} runs)"))
        elif i == 8:
            handles.append(Patch(facecolor="#eeeeee", label="more chat sessions"))

    # Edges.
    edges = _edges(df)
    for kind in ("previous", "superseded", "parent"):
        segs = [(pos[s], pos[d]) for s, d, k in edges if k == kind and s in pos and d in pos]
        if not segs:
            continue
        style = dict(_EDGE_STYLE[kind])
        label = style.pop("label")
        if kind == "previous" and n > 150:
            style.update(linewidth=0.5, alpha=0.45)
        if kind == "parent" and len(segs) <= 300:
            for (x0, y0), (x1, y1) in segs:
                # Same lane: arc above the lane so the arrow does not hide under the previous line.
                rad = 0.45 if y0 == y1 else (0.2 if y1 > y0 else -0.2)
                ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=9,
                                             connectionstyle=f"arc3,rad={rad}", color=style["color"],
                                             linewidth=style["linewidth"], zorder=2, shrinkA=3, shrinkB=3))
        else:
            ax.add_collection(LineCollection(segs, zorder=1 if kind == "previous" else 2, gid=f"edges-{kind}", **style))
        handles.append(Line2D([], [], label=f"{label}: {len(segs)}", **style))

    # Nodes by state.
    size = 46 if n <= 150 else (18 if n <= 1500 else 6)
    sup = df["superseded"].to_numpy(dtype=bool) if "superseded" in df else np.zeros(n, dtype=bool)
    for state, color in STATE_COLORS.items():
        m = (df["state"] == state).to_numpy()
        if not m.any():
            continue
        face = np.where(sup[m], "none", color)
        ax.scatter(x[m], y[m], s=size, c=list(face), edgecolors=color, linewidths=1.0, zorder=3,
                   gid=f"nodes-{state}", label=f"{state}: {int(m.sum())}")
        handles.append(Line2D([], [], marker="o", linestyle="", markersize=7, markerfacecolor=color,
                              markeredgecolor=color, label=f"{state}: {int(m.sum())}"))
    if sup.any():
        handles.append(Line2D([], [], marker="o", linestyle="", markersize=7, markerfacecolor="none",
                              markeredgecolor="#444444", label=f"superseded: {int(sup.sum())}"))

    if labels is None:
        labels = n <= 40
    if labels:
        for rid, xx, yy, task in zip(df["runId"], x, y, df["task"]):
            ax.annotate(_head(task, 28), (xx, yy), xytext=(0, 6), textcoords="offset points", fontsize=6.5,
                        rotation=25, ha="left", va="bottom", color="#333333")
    if hl is not None and hl in pos:
        hx, hy = pos[hl]
        ax.plot([hx], [hy], marker="o", markersize=15, markerfacecolor="none", markeredgecolor="black",
                markeredgewidth=2.0, zorder=4, gid="highlight")
        task = df.loc[df["runId"] == hl, "task"].iloc[0]
        ax.annotate(f"{hl[:8]}: {_head(task, 40)}", (hx, hy), xytext=(10, -18), textcoords="offset points",
                    fontsize=8, fontweight="bold", bbox={"boxstyle": "round", "fc": "white", "ec": "black", "alpha": 0.9},
                    zorder=5)
        handles.append(Line2D([], [], marker="o", linestyle="", markersize=10, markerfacecolor="none",
                              markeredgecolor="black", markeredgewidth=2, label=f"highlighted run {hl[:8]}"))

    # Lanes: tick labels name the tree's root task.
    roots = df.groupby(lanes["lane"])["runId"].first()
    ticks = list(range(n_lanes))
    names = []
    for lane in ticks:
        if lane == 0:
            names.append("no parent / children")
        else:
            members = lanes.index[lanes["lane"] == lane]
            first_root = lanes.loc[members[0], "treeRoot"]
            task = df.loc[df["runId"] == first_root, "task"]
            trees = lanes.loc[members, "treeRoot"].nunique()
            names.append(_head(task.iloc[0] if len(task) else roots.get(lane, ""), 26) + (f" (+{trees - 1} trees)" if trees > 1 else ""))
    if n_lanes <= 40:
        ax.set_yticks(ticks, names, fontsize=7)
    ax.set_ylim(-0.8, n_lanes - 0.2)
    ax.invert_yaxis()
    pad = max((x.max() - x.min()) * 0.03, 0.05 if x_mode == "time" else 0.5)
    ax.set_xlim(x.min() - pad, x.max() + pad)
    if x_mode == "time":
        _date_axis(ax)
    else:
        step = max(1, int(math.ceil(n / 30)))
        ticks = list(range(0, n, step))
        stamps = df["endedAt"].dt.strftime("%m-%d %H:%M")
        ax.set_xticks(ticks, [f"{df['runId'].iloc[i][:8]}\n{stamps.iloc[i]}" for i in ticks], fontsize=6.5)
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False)
    return fig


def _edges(df: "pd.DataFrame") -> list[tuple[str, str, str]]:
    from .frames import lineage_edges

    e = lineage_edges(df)
    return list(zip(e["src"].astype(str), e["dst"].astype(str), e["kind"].astype(str)))


# --------------------------------------------------------------------------------------
# Issues and runs
# --------------------------------------------------------------------------------------


#: Ages and reopen counts of a fold, as :func:`issue_age_histograms` draws them.
AGE_PANELS = ("open", "resolved")


def issue_age_values(fold: "pd.DataFrame") -> dict[str, np.ndarray]:
    """What the issue-age figure counts, from a fold (:func:`cybmem.frames.issue_fold`).

    Returns:
        ``open``: ages in days of open (opened / reopened) issues; ``resolved``: days from
        opening to resolution of resolved issues (wontfix left out); ``reopens``: each issue's
        reopen count. Float64 / int64 arrays, missing ages dropped.
    """
    if not len(fold):
        return {"open": np.zeros(0), "resolved": np.zeros(0), "reopens": np.zeros(0, dtype=np.int64)}
    days = fold["age"].dt.total_seconds() / 86400
    open_ = fold["state"].isin(["opened", "reopened"])
    resolved = fold["state"].eq("resolved")
    return {
        "open": days[open_].dropna().to_numpy(dtype=float),
        "resolved": days[resolved].dropna().to_numpy(dtype=float),
        "reopens": fold["reopenCount"].to_numpy(dtype=np.int64),
    }


def histogram_bins(n: int) -> int:
    """How many bins a histogram of ``n`` values gets: sqrt(n) + 3, within [5, 30]."""
    return min(30, max(5, int(math.sqrt(n)) + 3))


@dataclass
class Histogram:
    """Counts of values in equal-width bins over their range, plus their median.

    ``edges`` are ``np.histogram_bin_edges(values, histogram_bins(n))`` and ``counts`` are
    ``np.histogram(values, edges)``: a collection counted in parts (the partitions of a fleet)
    sums its parts' counts over the edges of the whole range and gets the same numbers.
    """

    n: int
    edges: np.ndarray
    counts: np.ndarray
    median: float | None

    @classmethod
    def of(cls, values: np.ndarray) -> "Histogram":
        values = np.asarray(values, dtype=float)
        if not len(values):
            return cls(0, np.zeros(0), np.zeros(0, dtype=np.int64), None)
        edges = histogram_edges(float(values.min()), float(values.max()), len(values))
        return cls(len(values), edges, np.histogram(values, edges)[0].astype(np.int64), float(np.median(values)))

    def to_dict(self) -> dict:
        return {"n": self.n, "edges": self.edges.tolist(), "counts": self.counts.tolist(), "median": self.median}


def histogram_edges(lo: float, hi: float, n: int) -> np.ndarray:
    """Bin edges of :class:`Histogram` for ``n`` values ranging over [lo, hi] (numpy's rule)."""
    return np.histogram_bin_edges(np.array([lo, hi], dtype=float), histogram_bins(n))


@dataclass
class IssueAgeData:
    """What :func:`issue_age_histograms` draws: ages of open issues, times to resolve, reopen counts."""

    issues: int
    open: Histogram
    resolved: Histogram
    reopens: dict[int, int]  # reopen count -> issues, ascending

    @classmethod
    def of(cls, fold: "pd.DataFrame") -> "IssueAgeData":
        """From one fold (:func:`cybmem.frames.issue_fold`); ages as measured when it was folded."""
        v = issue_age_values(fold)
        counts = np.unique(v["reopens"], return_counts=True)
        return cls(len(fold), Histogram.of(v["open"]), Histogram.of(v["resolved"]),
                   {int(a): int(b) for a, b in zip(*counts)})

    def to_dict(self) -> dict:
        return {"issues": self.issues, "open": self.open.to_dict(), "resolved": self.resolved.to_dict(),
                "reopens": {str(k): v for k, v in self.reopens.items()}}


def issue_age_histograms(fold: "pd.DataFrame | IssueAgeData", *, title: str | None = None) -> Figure:
    """Three panels: ages of open issues, time to resolve, and reopen counts.

    Args:
        fold: one row per issue (:func:`cybmem.frames.issue_fold`; ``age`` is measured at the
            ``now`` it was folded with), or the counts already made (:class:`IssueAgeData`,
            e.g. over a fleet by :meth:`cybmem.fleet.Fleet.issue_age_data`).
        title: figure title.

    Returns:
        The Figure (three Axes).
    """
    data = fold if isinstance(fold, IssueAgeData) else IssueAgeData.of(fold)
    fig = _Figure(figsize=(12, 3.6), layout="constrained")
    axes = fig.subplots(1, 3)
    fig.suptitle(title or f"Issue ages ({data.issues} issues)")
    for ax, hist, color, name in ((axes[0], data.open, "#ff7f0e", "Open issues: age"),
                                  (axes[1], data.resolved, "#2e9e44", "Resolved issues: time to resolve")):
        ax.set_title(f"{name} (n={hist.n})", fontsize=10)
        ax.set_xlabel("days")
        ax.set_ylabel("issues")
        if hist.n:
            # the counts drawn as ax.hist draws values: one weighted value per bin
            ax.hist(hist.edges[:-1], bins=hist.edges, weights=hist.counts, color=color, edgecolor="white")
            ax.axvline(hist.median, color="black", linestyle="--", linewidth=1, label=f"median {hist.median:.1f} d")
            ax.legend(fontsize=8, frameon=False)
        else:
            ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes, color="#777777")
    ax = axes[2]
    ax.set_title("Reopen count per issue", fontsize=10)
    ax.set_xlabel("times reopened")
    ax.set_ylabel("issues")
    if data.reopens:
        xs = list(data.reopens)
        bars = ax.bar(xs, list(data.reopens.values()), color="#9467bd", edgecolor="white", label="issues")
        ax.bar_label(bars, fontsize=8)
        ax.set_xticks(xs)
        ax.legend(fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes, color="#777777")
    return fig


#: Lineage link kinds of :func:`cybmem.frames.lineage_edges`, as :func:`lineage_summary` draws them.
_LINK_STYLE = {
    "previous": ("#b0b0b0", "previous run"),
    "parent": ("#1f5fbf", "dispatched by a parent"),
    "chat": ("#fdae6b", "same chat session"),
    "superseded": ("#d62728", "superseded by a correction"),
}


def lineage_summary(summary: "pd.DataFrame", *, title: str | None = None) -> Figure:
    """Runs by state and lineage links by kind, one row per machine and project.

    Args:
        summary: one row per machine and project with columns ``machine``, ``project``, the run
            states (``done``, ``error``, ``cancelled``) and the link kinds of
            :func:`cybmem.frames.lineage_edges` (``previous``, ``parent``, ``chat``,
            ``superseded``), as :meth:`cybmem.fleet.Fleet.lineage_summary` makes it.
        title: figure title.

    Returns:
        The Figure (two Axes sharing the machine/project rows).
    """
    n = len(summary)
    fig = _Figure(figsize=(12, min(2.2 + 0.42 * max(n, 1), 14)), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    runs = int(summary[[c for c in STATE_COLORS if c in summary]].to_numpy().sum()) if n else 0
    machines = summary["machine"].nunique() if n else 0
    fig.suptitle(title or f"Lineage of {runs:,} runs on {machines} machine{'s' if machines != 1 else ''}")
    left.set_title("Runs by state", fontsize=10)
    left.set_xlabel("runs")
    right.set_title("Lineage links by kind", fontsize=10)
    right.set_xlabel("links")
    if not n:
        for ax in (left, right):
            ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes, color="#777777")
        return fig
    y = np.arange(n, dtype=float)
    labels = [f"{m} / {p}" for m, p in zip(summary["machine"], summary["project"])]
    start = np.zeros(n)
    for state, color in STATE_COLORS.items():
        if state not in summary:
            continue
        v = summary[state].to_numpy(dtype=float)
        left.barh(y, v, left=start, color=color, label=f"{state} ({int(v.sum()):,})", height=0.7)
        start += v
    fig.legend(*left.get_legend_handles_labels(), fontsize=8, frameon=False, loc="outside lower left", ncol=3)
    kinds = [k for k in _LINK_STYLE if k in summary]
    h = 0.8 / max(len(kinds), 1)
    for i, kind in enumerate(kinds):
        color, name = _LINK_STYLE[kind]
        v = summary[kind].to_numpy(dtype=float)
        right.barh(y - 0.4 + h * (i + 0.5), v, height=h, color=color, label=f"{name} ({int(v.sum()):,})")
    if summary[kinds].to_numpy().max(initial=0) > 0:
        right.set_xscale("symlog", linthresh=1)
    fig.legend(*right.get_legend_handles_labels(), fontsize=8, frameon=False, loc="outside lower right", ncol=2)
    left.set_yticks(y, labels, fontsize=8)
    left.invert_yaxis()
    for ax in (left, right):
        ax.grid(axis="x", color="#eeeeee", zorder=0)
        ax.set_axisbelow(True)
    return fig


def _auto_freq(span_days: float) -> tuple[str, str]:
    if span_days <= 60:
        return "D", "day"
    if span_days <= 2 * 365:
        return "W", "week"
    if span_days <= 15 * 365:
        return "MS", "month"
    return "YS", "year"


def runs_over_time(records: "pd.DataFrame", *, freq: str | None = None, title: str | None = None) -> Figure:
    """Stacked bars: runs ended per period, by state.

    Args:
        records: a records DataFrame.
        freq: a pandas frequency (``"D"``, ``"W"``, ``"MS"``, ``"YS"``...); default from the span.
        title: figure title.

    Returns:
        The Figure (one Axes).
    """
    import pandas as pd

    fig = _Figure(figsize=(11, 3.8), layout="constrained")
    ax = fig.add_subplot()
    n = len(records)
    if not n:
        ax.set_title(title or "Runs over time")
        ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("period")
        ax.set_ylabel("runs")
        return fig
    ended = records["endedAt"].dt.tz_convert("UTC").dt.tz_localize(None)
    span = (ended.max() - ended.min()).total_seconds() / 86400
    name = {"D": "day", "W": "week", "MS": "month", "YS": "year"}.get(freq or "", freq)
    if freq is None:
        freq, name = _auto_freq(span)
    periods = ended.dt.to_period(freq[0] if freq in ("MS", "YS") else freq).dt.start_time
    table = pd.crosstab(periods, records["state"]).sort_index()
    x = mdates.date2num(table.index.to_numpy())
    width = np.median(np.diff(x)) * 0.85 if len(x) > 1 else 0.8
    bottom = np.zeros(len(table))
    for state, color in STATE_COLORS.items():
        if state in table:
            v = table[state].to_numpy()
            ax.bar(x, v, width=width, bottom=bottom, color=color, label=f"{state} ({int(v.sum())})", align="edge")
            bottom += v
    ax.set_title(title or f"Runs per {name} by state ({n} runs)")
    ax.set_xlabel(f"{name} (UTC)")
    ax.set_ylabel("runs ended")
    _date_axis(ax)
    ax.legend(fontsize=8, frameon=False)
    return fig


# --------------------------------------------------------------------------------------
# Weight space
# --------------------------------------------------------------------------------------


def weight_heatmap(result: "GridResult", *, x: str = "w_kw", y: str = "w_rec", reduce: str = "best",
                   title: str | None = None) -> Figure:
    """A retrieval metric over two axes of a weight search, best and current points marked.

    Args:
        result: from :func:`cybmem.tuning.grid_search` / :func:`cybmem.tuning.tune`.
        x, y: grid axes (``w_kw``, ``w_rec``, ``w_lin``, ``w_vec``, ``half_life_days``).
        reduce: ``"best"`` (other axes fixed at the best point) or ``"max"`` (max over them).
        title: figure title.

    Returns:
        The Figure (heatmap Axes plus colorbar).
    """
    z = result.slice2d(x, y, reduce=reduce)
    xs, ys = result.axes[x], result.axes[y]
    fig = _Figure(figsize=(6.4, 5.2), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(z), origin="lower", aspect="auto", cmap="viridis", interpolation="nearest")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(result.label)

    def ticks(vals: np.ndarray) -> tuple[list[int], list[str]]:
        step = max(1, int(math.ceil(len(vals) / 11)))
        idx = list(range(0, len(vals), step))
        return idx, [f"{vals[i]:g}" for i in idx]

    ax.set_xticks(*ticks(xs))
    ax.set_yticks(*ticks(ys))
    ax.set_xlabel(x + (" (days)" if x == "half_life_days" else ""))
    ax.set_ylabel(y + (" (days)" if y == "half_life_days" else ""))
    others = [a for a in result.axes if a not in (x, y) and len(result.axes[a]) > 1]
    fixed = "max over " + ", ".join(others) if reduce == "max" else ", ".join(f"{a}={getattr(result.best, a):g}" for a in others)
    ax.set_title(title or f"{result.label} over {x} x {y}" + (f"\n({fixed})" if fixed else ""), fontsize=10)

    def at(vals: np.ndarray, v: float) -> float:
        return float(np.interp(v, vals, np.arange(len(vals)))) if len(vals) > 1 else 0.0

    b, c = result.best, result.current
    ax.plot([at(xs, getattr(c, x))], [at(ys, getattr(c, y))], marker="o", markersize=11, markerfacecolor="none",
            markeredgecolor="white", markeredgewidth=2, linestyle="", label=f"current ({result.current_metric:.3f})")
    ax.plot([at(xs, getattr(b, x))], [at(ys, getattr(b, y))], marker="*", markersize=15, color="#ff4040",
            markeredgecolor="white", linestyle="", label=f"best ({result.best_metric:.3f})")
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.13), ncol=2, fontsize=8, frameon=False)
    return fig
