"""Figures for notebooks and reports: each function returns a matplotlib Figure.

Figures are built with the object API (``matplotlib.figure.Figure``), never through pyplot:
no backend is selected, no global figure list grows (nothing to close, no "too many figures"
warning), and nothing is shown. Jupyter displays a returned Figure inline; ``fig.savefig``
renders it with Agg anywhere, headless included. Nothing in the write or inject path imports
this module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._extras import require

try:
    from matplotlib import dates as mdates
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
except ImportError:  # the base install: say which extra brings it
    require("matplotlib", extra="report", what="cybmem's figures")
    raise

from .frames import (SHORTEST_AGE_S, Histogram, IssueAgeData, dispatch_trees, epoch_days, lineage_lanes, period_starts,
                     resolve_run, tree_members, tree_roots)
from ..store.display import head_line

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..retrieval.tuning import GridResult

__all__ = [
    "STATE_COLORS",
    "lineage_lanes",
    "lineage_graph",
    "lineage_trees",
    "dispatch_trees",
    "issue_age_histograms",
    "lineage_summary",
    "runs_over_time",
    "weight_heatmap",
    "feedback_over_time",
    "feedback_by_rank",
]

#: node / bar colour per run state
STATE_COLORS = {"done": "#2e9e44", "error": "#d62728", "cancelled": "#8c8c8c"}
_EDGE_STYLE = {
    "previous": {"color": "#b0b0b0", "linewidth": 0.8, "linestyle": "-", "label": "previous run (previousRunId)"},
    "parent": {"color": "#1f5fbf", "linewidth": 1.4, "linestyle": "-", "label": "dispatched by (parentRunId)"},
    "superseded": {"color": "#d62728", "linewidth": 1.2, "linestyle": ":", "label": "superseded by (correction)"},
}
_CHAT_COLORS = ["#fdd49e", "#c6dbef", "#d9f0a3", "#fcc5c0", "#dadaeb", "#ccebc5", "#fee391", "#c7e9b4"]


class _Figure(Figure):
    """A Figure whose repr names it (``<Figure: Lineage of 47 runs>``): readable as text/plain
    in notebooks and as the alt text of the image in reports."""

    def __repr__(self) -> str:
        title = self.get_suptitle() or next((ax.get_title() for ax in self.axes if ax.get_title()), "")
        return f"<Figure: {' '.join(title.split())}>" if title else super().__repr__()


def _head(text: Any, limit: int) -> str:
    return head_line(str(text or ""), limit)


def _date_axis(ax) -> None:
    loc = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))


# --------------------------------------------------------------------------------------
# Lineage graph
# --------------------------------------------------------------------------------------


def lineage_graph(records: "pd.DataFrame", *, focus: str | None = None, scope: str = "project",
                  highlight: str | None = None, labels: bool | None = None, x: str | None = None,
                  title: str | None = None, figsize: tuple[float, float] | None = None,
                  max_runs: int = 400, trees: str = "largest", max_trees: int = 12,
                  previous_max: int = 200) -> Figure:
    """Runs as nodes over time, one lane per dispatch tree, with their lineage edges.

    Nodes are coloured by state (hollow when superseded); previousRunId links are thin grey
    lines, parentRunId links blue arrows, corrections red dotted lines; each chat session is a
    shaded band around its runs. Lanes come from :func:`lineage_lanes`.

    Thousands of runs on one axis read as nothing (a curtain of previous-run links, lanes
    without names), so a project of more than ``max_runs`` runs is drawn as its ``max_trees``
    largest (or most recent) dispatch trees by :func:`lineage_trees`, with run ids; and above
    ``previous_max`` runs the previous-run links are counted in the legend but not drawn.

    Args:
        records: a records DataFrame (:func:`cybmem.explore.frames.records_frame` / ``Snapshot.records_frame``).
        focus: a run id (or unique prefix) to centre on; with ``scope="tree"`` only its
            dispatch tree and the chat sessions it touches are drawn.
        scope: ``"project"`` (every run) or ``"tree"``.
        highlight: a run id (or prefix) to mark and label (default: ``focus``).
        labels: label every node with its task head (default: when there are at most 40 runs).
        x: ``"time"`` (when each run ended) or ``"order"`` (evenly spaced in the order runs
            ended: readable when runs bunch up); default time for a project, order for a tree.
        title: figure title (default describes the scope).
        figsize: inches (default grows with the number of lanes).
        max_runs: above this many runs (project scope), draw the dispatch trees instead.
        trees: which trees then: ``"largest"`` or ``"recent"``.
        max_trees: how many trees then.
        previous_max: above this many runs drawn, previous-run links are not drawn.

    Returns:
        The Figure (one Axes). Node collections carry gids ``nodes-<state>``.
    """
    if scope not in ("project", "tree"):
        from ..errors import ValidationError

        raise ValidationError(f"scope must be 'project' or 'tree', not {scope!r}")
    x_mode = x or ("order" if scope == "tree" else "time")
    if x_mode not in ("time", "order"):
        from ..errors import ValidationError

        raise ValidationError(f"x must be 'time' or 'order', not {x!r}")
    df = records.sort_values(["endedAt", "runId"], kind="stable").reset_index(drop=True)
    focus_id = resolve_run(df, focus)
    if scope == "tree":
        if focus_id is None:
            from ..errors import ValidationError

            raise ValidationError("scope='tree' needs focus=<run id>")
        df = df[df["runId"].isin(tree_members(df, focus_id))].reset_index(drop=True)
    if scope == "project" and len(df) > max_runs:
        return lineage_trees(df, n=max_trees, by=trees, highlight=highlight or focus, title=title)
    hl = resolve_run(df, highlight) if highlight else focus_id
    n = len(df)
    lanes = lineage_lanes(df) if n else None
    alone_lane: int | None = 0
    if n and not (lanes["lane"] == 0).any():
        lanes["lane"] -= 1  # one tree alone: no lane of runs without parent or children to leave empty
        alone_lane = None
    n_lanes = int(lanes["lane"].max()) + 1 if n else 1
    fig = _Figure(figsize=figsize or (11, min(2.2 + 0.45 * n_lanes, 12)), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title or (f"Lineage of {n} runs" + (f" (dispatch tree of {focus_id[:8]})" if scope == "tree" else "")))
    ax.set_xlabel("run ended (UTC)" if x_mode == "time" else "runs in the order they ended")
    ax.set_ylabel("lane (dispatch tree)")
    if not n:
        ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
        return fig
    ended = epoch_days(df["endedAt"])
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
        if kind == "previous" and n > previous_max:
            handles.append(Line2D([], [], label=f"{label}: {len(segs)}, not drawn above {previous_max} runs", **style))
            continue
        if kind == "previous" and n > 150:
            style.update(linewidth=0.5, alpha=0.45)
        if kind == "parent" and len(segs) <= 300:
            width = max(float(x.max() - x.min()), 1e-9)
            for (x0, y0), (x1, y1) in segs:
                # Same lane: arc above the lane (the y axis is inverted) so the arrow does not hide
                # under the previous line; the longer the arc, the flatter, so it stays in the axes.
                rad = -min(0.45, 0.06 * width / max(abs(x1 - x0), 1e-9)) if y0 == y1 else (0.2 if y1 > y0 else -0.2)
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
        if lane == alone_lane:
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


def lineage_trees(records: "pd.DataFrame", *, n: int = 12, by: str = "largest", max_width: int = 16,
                  highlight: str | None = None, title: str | None = None) -> Figure:
    """A project too large to draw run by run: how its runs link over time, and its largest trees.

    Two panels. On top, the whole history: runs per month (or week, or year: by the span) as
    grey bars, and in front of them the runs in a dispatch tree, in a chat session and the
    corrections (records that supersede another), on a log count axis when they differ by orders
    of magnitude; each tree drawn below is numbered where it started. Below, the ``n`` largest
    (or most recent) dispatch trees side by side, as many to a row as their width allows: each
    tree's runs in the order they ended, coloured by state (hollow when superseded), named by
    their ids; parentRunId links are blue brackets under them, from the parent down and up to
    each run it dispatched (arrowheads); above, the tree's number, root id and task; below, its
    size and time span. Previous-run links are left out: they run through every tree. This is
    what :func:`lineage_graph` draws for a project of more than ``max_runs`` runs.

    Args:
        records: a records DataFrame.
        n: how many trees.
        by: ``"largest"`` or ``"recent"`` (see :func:`dispatch_trees`).
        max_width: runs drawn per tree; a larger tree shows its first ``max_width - 1`` runs and
            its last one, with how many were left out between them.
        highlight: a run id (or prefix) to ring.
        title: figure title (the suptitle).

    Returns:
        The Figure: ``axes[0]`` the history, ``axes[1]`` the trees. In the trees, node
        collections carry gids ``nodes-<state>``, each drawn run's id label ``run-<runId>`` and
        each tree's label ``tree-<rootRunId>``.
    """
    from ..store.display import subject_line

    df = records.sort_values(["endedAt", "runId"], kind="stable").reset_index(drop=True)
    all_trees = dispatch_trees(df, by=by)
    chosen = all_trees.head(n).reset_index(drop=True)
    roots = tree_roots(df).astype(str)
    in_tree = roots.isin(all_trees["root"]).to_numpy()
    rows_of_trees = len(chosen)
    what = "largest" if by == "largest" else "most recent"
    heading = title or (f"The {rows_of_trees} {what} of {len(all_trees)} dispatch trees ({len(df):,} runs; "
                        f"{int(in_tree.sum()):,} in a tree)" if rows_of_trees else f"Dispatch trees ({len(df):,} runs)")

    # Trees side by side: as many to a row as about 32 run widths hold.
    widths = [min(int(r), max_width) + (1.2 if r > max_width else 0.0) for r in chosen["runs"]] or [1.0]
    cell = max(max(widths), 3.0)
    pitch = cell + 1.6
    cols = max(1, min(4, int(32 // pitch), rows_of_trees or 1))
    grid_rows = max(1, math.ceil(rows_of_trees / cols))
    row_h = 1.9  # data units per row of trees: label, ids, nodes, brackets, span
    fig = _Figure(figsize=(12, 3.4 + 1.2 * grid_rows), layout="constrained")
    timeline, ax = fig.subplots(2, 1, height_ratios=[2.3, 0.35 + 1.2 * grid_rows])
    fig.suptitle(heading, fontsize=11)
    _lineage_timeline(timeline, df, in_tree, chosen, len(all_trees))

    ax.set_title("Each tree's runs in the order they ended, named by their ids (previous-run links not drawn)",
                 fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if not rows_of_trees:
        ax.text(0.5, 0.5, "no dispatch trees: no run was dispatched by another run of this project",
                ha="center", va="center", transform=ax.transAxes, color="#555555")
        return fig
    hl = resolve_run(df, highlight) if highlight else None
    state_of = dict(zip(df["runId"].astype(str), df["state"].astype(str)))
    sup_of = dict(zip(df["runId"].astype(str), df["superseded"].astype(bool))) if "superseded" in df else {}
    parent_of = dict(zip(df["runId"].astype(str), df["parentRunId"]))
    points: dict[str, list[tuple[float, float, bool]]] = {s: [] for s in STATE_COLORS}
    pos: dict[str, tuple[float, float]] = {}
    label_chars = int(11.0 / cols * 72 / 4.3)  # what a cell's width (about 11 in / cols) holds at 7.5 pt
    for i, tree in enumerate(chosen.itertuples(index=False)):
        x0, y = (i % cols) * pitch, (i // cols) * row_h
        ids = df.loc[roots == tree.root, "runId"].astype(str).tolist()
        left_out = 0
        if len(ids) > max_width:
            left_out = len(ids) - max_width
            ids = ids[: max_width - 1] + ids[-1:]
        for j, rid in enumerate(ids):
            xx = x0 + float(j) + (1.2 if left_out and j == len(ids) - 1 else 0.0)
            pos[rid] = (xx, y)
            points.setdefault(state_of.get(rid, "done"), []).append((xx, y, bool(sup_of.get(rid, False))))
            ax.annotate(rid[:8], (xx, y), xytext=(-1, 5), textcoords="offset points", fontsize=6, rotation=60,
                        ha="left", va="bottom", color="#333333", gid=f"run-{rid}")
        if left_out:
            ax.annotate(f"… {left_out} more …", (x0 + len(ids) - 0.9, y), fontsize=6, ha="center", va="center",
                        color="#555555", bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"}, zorder=4)
        name = f"{i + 1}  {tree.root[:8]}  {subject_line(tree.task, label_chars - 14)}"
        ax.text(x0 - 0.3, y - 0.75, name, fontsize=7.5, ha="left", va="bottom", gid=f"tree-{tree.root}",
                fontweight="bold" if hl is not None and hl in ids else "normal")
        span = f"{tree.first:%Y-%m-%d}" + (f" to {tree.last:%Y-%m-%d}" if f"{tree.last:%Y-%m-%d}" != f"{tree.first:%Y-%m-%d}" else "")
        ax.text(x0 - 0.3, y + 0.6, f"{tree.runs} runs, {span}", fontsize=6.5, ha="left", va="top", color="#555555")
    # parentRunId links as brackets under the row (a run that dispatched dozens would otherwise be
    # a fan of crossing arcs): a line drops from the parent to a bus at its depth, the bus runs
    # under its children, and a tick with an arrowhead rises to each child.
    children: dict[str, list[str]] = {}
    for rid in pos:
        par = parent_of.get(rid)
        if isinstance(par, str) and par in pos:
            children.setdefault(par, []).append(rid)
    depth: dict[str, int] = {}
    for rid in pos:
        d, cur = 0, parent_of.get(rid)
        while isinstance(cur, str) and cur in pos and d < 50:
            d, cur = d + 1, parent_of.get(cur)
        depth[rid] = d
    segs, heads = [], []
    for par, kids in children.items():
        px, py = pos[par]
        bus = py + 0.2 + 0.09 * min(depth[par], 3)
        xs_ = [px] + [pos[k][0] for k in kids]
        segs.append([(px, py + 0.08), (px, bus)])
        segs.append([(min(xs_), bus), (max(xs_), bus)])
        for k in kids:
            segs.append([(pos[k][0], bus), (pos[k][0], pos[k][1] + 0.1)])
            heads.append((pos[k][0], pos[k][1] + 0.12))
    arrows = sum(len(k) for k in children.values())
    if segs:
        ax.add_collection(LineCollection(segs, colors=_EDGE_STYLE["parent"]["color"], linewidths=1.0, zorder=2,
                                         gid="edges-parent"))
        hx, hy = zip(*heads)
        ax.scatter(hx, hy, marker="^", s=14, color=_EDGE_STYLE["parent"]["color"], zorder=2, gid="arrowheads")
    handles: list[Any] = [Line2D([], [], color=_EDGE_STYLE["parent"]["color"], linewidth=1.0, marker="^", markersize=4,
                                 label=f"dispatched by (parentRunId): {arrows}")]
    for state, color in STATE_COLORS.items():
        pts = points.get(state) or []
        if not pts:
            continue
        xs, ys, sup = (np.array(v) for v in zip(*pts))
        ax.scatter(xs, ys, s=40, c=list(np.where(sup, "none", color)), edgecolors=color, linewidths=1.0, zorder=3,
                   gid=f"nodes-{state}")
        handles.append(Line2D([], [], marker="o", linestyle="", markersize=7, markerfacecolor=color,
                              markeredgecolor=color, label=f"{state}: {len(pts)}"))
    if hl is not None and hl in pos:
        ax.plot([pos[hl][0]], [pos[hl][1]], marker="o", markersize=15, markerfacecolor="none", markeredgecolor="black",
                markeredgewidth=2.0, zorder=4, gid="highlight")
        handles.append(Line2D([], [], marker="o", linestyle="", markersize=10, markerfacecolor="none",
                              markeredgecolor="black", markeredgewidth=2, label=f"highlighted run {hl[:8]}"))
    ax.set_xlim(-0.6, cols * pitch - 1.2)
    ax.set_ylim((grid_rows - 1) * row_h + 1.0, -0.9)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=len(handles), fontsize=7.5,
              frameon=False)
    return fig


#: what the history panel of :func:`lineage_trees` counts beside all runs: (label, what none of them is, colour)
_LINKED = {"tree": ("in a dispatch tree", "no dispatch trees", _EDGE_STYLE["parent"]["color"]),
           "chat": ("in a chat session", "no chat sessions", "#fdae6b"),
           "correction": ("a correction (supersedes a record)", "no corrections", _EDGE_STYLE["superseded"]["color"])}


def _lineage_timeline(ax, df: "pd.DataFrame", in_tree: np.ndarray, chosen: "pd.DataFrame", n_trees: int) -> None:
    """The history panel of :func:`lineage_trees`: runs per period, the linked ones in front, the drawn trees numbered."""
    import pandas as pd

    n = len(df)
    ax.set_ylabel("runs ended")
    if not n:
        ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
        return
    periods, name = period_starts(df["endedAt"])
    linked = {"tree": in_tree, "chat": df["chatSessionId"].notna().to_numpy(),
              "correction": df["supersedes"].notna().to_numpy()}
    table = pd.DataFrame({"all": np.ones(n, dtype=np.int64), **{k: v.astype(np.int64) for k, v in linked.items()}})
    table = table.groupby(periods.to_numpy()).sum().sort_index()
    x = mdates.date2num(table.index.to_numpy())
    width = float(np.median(np.diff(x))) * 0.85 if len(x) > 1 else 0.8
    totals = {k: int(table[k].sum()) for k in table}
    log = _spans_orders(table.to_numpy().ravel())
    ax.bar(x, table["all"], width=width, align="edge", color="#c8c8c8", zorder=1, label=f"all runs: {n:,}")
    empty = []
    for shrink, (key, (label, none, color)) in zip((0.6, 0.35, 0.2), _LINKED.items()):
        if not totals[key]:
            empty.append(none)
            continue
        v = table[key].to_numpy().astype(float)
        v[v <= 0] = np.nan
        extra = f" ({n_trees:,} trees)" if key == "tree" else ""
        ax.bar(x + width * (1 - shrink) / 2, v, width=width * shrink, align="edge", color=color, zorder=2,
               label=f"{label}: {totals[key]:,} runs{extra}")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(0.7, float(table["all"].max()) * 4)
        ax.set_ylabel("runs ended (log scale)")
    else:
        ax.set_ylim(0, float(table["all"].max()) * 1.35)
    _date_axis(ax)
    handles, _ = ax.get_legend_handles_labels()
    if empty:
        handles.append(Line2D([], [], linestyle="", label=", ".join(empty)))
    # Each drawn tree's number where it started; numbers that would collide step down.
    starts = mdates.date2num(chosen["first"].dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()) if len(chosen) else []
    span = max(float(x.max() + width - x.min()), 1e-9)
    placed: list[tuple[float, int]] = []
    for i in np.argsort(starts, kind="stable"):
        level = 0
        while any(abs(starts[i] - px) < span * 0.018 and lvl == level for px, lvl in placed):
            level += 1
        placed.append((starts[i], level))
        ax.annotate(str(i + 1), (starts[i], 0.93 - 0.13 * (level % 5)), xycoords=("data", "axes fraction"),
                    fontsize=6.5, ha="center", va="center", color="white", fontweight="bold", zorder=5,
                    bbox={"boxstyle": "circle,pad=0.2", "fc": _EDGE_STYLE["parent"]["color"], "ec": "none"})
    ax.set_title(f"Runs per {name} (UTC), the linked ones in front; numbered: where the trees below started",
                 fontsize=9)
    ax.legend(handles=handles, fontsize=7.5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4)


# --------------------------------------------------------------------------------------
# Issues and runs
# --------------------------------------------------------------------------------------


_TIME_TICKS = ((60, "1 min"), (3600, "1 h"), (86_400, "1 day"), (7 * 86_400, "1 week"), (30 * 86_400, "1 month"),
               (365 * 86_400, "1 year"), (3650 * 86_400, "10 years"), (36_500 * 86_400, "100 years"))


def _spans_orders(values: np.ndarray, ratio: float = 50.0) -> bool:
    """True when positive counts differ by at least ``ratio`` (a linear axis would hide the small ones)."""
    v = np.asarray(values, dtype=float)
    v = v[v > 0]
    return len(v) > 1 and v.max() / v.min() >= ratio


def _log_time_hist(ax, hist: Histogram, color: str, what: str) -> None:
    """A histogram of durations on a log time axis (1 min ... years) with its median."""
    edges = hist.edges
    lo, hi = float(edges[0]), float(edges[-1])
    # the counts drawn as ax.hist draws values: one weighted value per bin
    counts, _, _ = ax.hist(edges[:-1], bins=edges, weights=hist.counts, color=color, edgecolor="white")
    ax.set_xscale("log")
    ticks: list[tuple[float, str]] = []
    apart = max(10.0, (hi / lo) ** (1 / 6))  # about six labels at most, so that they never run into each other
    for t, label in _TIME_TICKS:
        if lo <= t <= hi * 1.5 and (not ticks or t >= ticks[-1][0] * apart):
            ticks.append((t, label))
    ax.set_xticks([t for t, _ in ticks], [label for _, label in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_xlim(lo * 0.8, hi)
    median = hist.median
    ax.axvline(max(median, SHORTEST_AGE_S), color="black", linestyle="--", linewidth=1,
               label=f"median {_duration(median) if median >= SHORTEST_AGE_S else 'under a minute'}")
    if hist.short:
        ax.plot([], [], " ", label=f"{hist.short} under a minute, counted at 1 min")
    if _spans_orders(counts):
        ax.set_yscale("log")
        ax.set_ylim(0.7, None)
        ax.set_ylabel("issues (log scale)")
    ax.set_xlabel(f"{what} (log scale)")
    ax.legend(fontsize=7.5, frameon=False)


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86_400), ("days", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size or unit == "min":
            value = seconds / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{seconds:.0f} s"  # pragma: no cover


def issue_age_histograms(fold: "pd.DataFrame | IssueAgeData", *, title: str | None = None) -> Figure:
    """Three panels: ages of open issues, time to resolve, and reopen counts.

    Ages and times to resolve span minutes to years, so both use a log time axis (1 min, 1 h,
    1 day ... 10 years; shorter times are counted at one minute); counts that differ by orders of
    magnitude (thousands of issues never reopened, a few reopened once) use a log count axis.

    Args:
        fold: one row per issue (:func:`cybmem.explore.frames.issue_fold`; ``openAge`` is measured at
            the ``now`` it was folded with), or the counts already made (:class:`IssueAgeData`,
            e.g. over a fleet by :meth:`cybmem.exchange.fleet.Fleet.issue_age_data`).
        title: figure title.

    Returns:
        The Figure (three Axes).
    """
    data = fold if isinstance(fold, IssueAgeData) else IssueAgeData.of(fold)
    fig = _Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    fig.suptitle(title or f"Issue ages ({data.issues} issues)")
    for ax, hist, color, name, what in ((axes[0], data.open, "#ff7f0e", "Open issues: age", "age"),
                                        (axes[1], data.resolved, "#2e9e44", "Resolved issues: time to resolve", "time to resolve")):
        ax.set_title(f"{name} (n={hist.n})", fontsize=10)
        ax.set_ylabel("issues")
        if hist.n:
            _log_time_hist(ax, hist, color, what)
        else:
            ax.set_xlabel(what)
            ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes, color="#777777")
    ax = axes[2]
    ax.set_title("Reopen count per issue", fontsize=10)
    ax.set_xlabel("times reopened")
    ax.set_ylabel("issues")
    if data.reopens:
        xs = np.asarray(list(data.reopens), dtype=int)
        counts = np.asarray(list(data.reopens.values()))
        bars = ax.bar(xs, counts, color="#9467bd", edgecolor="white", label="issues")
        ax.bar_label(bars, fontsize=8)
        ax.set_xticks(xs)
        if _spans_orders(counts):
            ax.set_yscale("log")
            ax.set_ylim(0.7, counts.max() * 3)
            ax.set_ylabel("issues (log scale)")
        ax.legend(fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes, color="#777777")
    return fig


#: Lineage link kinds of :func:`cybmem.explore.frames.lineage_edges`, as :func:`lineage_summary` draws them.
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
            :func:`cybmem.explore.frames.lineage_edges` (``previous``, ``parent``, ``chat``,
            ``superseded``), as :meth:`cybmem.exchange.fleet.Fleet.lineage_summary` makes it.
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


def runs_over_time(records: "pd.DataFrame", *, freq: str | None = None, log: bool | None = None,
                   title: str | None = None) -> Figure:
    """Runs ended per period, by state: stacked bars, or on a log scale layered bars.

    When the states' totals differ by orders of magnitude (7,749 done, 12 cancelled), stacked
    bars hide the small ones; then the count axis is logarithmic and each state's bars stand
    in front of the larger ones' (narrower), so every state shows.

    Args:
        records: a records DataFrame.
        freq: a pandas frequency (``"D"``, ``"W"``, ``"MS"``, ``"YS"``...); default from the span.
        log: a log count axis; default when state totals differ 50-fold or more.
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
    periods, name = period_starts(records["endedAt"], freq)
    table = pd.crosstab(periods, records["state"]).sort_index()
    x = mdates.date2num(table.index.to_numpy())
    width = np.median(np.diff(x)) * 0.85 if len(x) > 1 else 0.8
    totals = {state: int(table[state].sum()) for state in STATE_COLORS if state in table}
    if log is None:
        log = _spans_orders(np.array(list(totals.values())))
    if log:
        # The most common state as bars; the rarer ones as markers at their counts, which a log
        # axis keeps visible however small (a bar of 1 would be a sliver at the bottom).
        order = sorted(totals, key=lambda st: -totals[st])
        markers = {"error": "o", "cancelled": "v", "done": "s"}
        for rank, state in enumerate(order):
            v = table[state].to_numpy().astype(float)
            v[v <= 0] = np.nan
            if rank == 0:
                ax.bar(x, v, width=width, color=STATE_COLORS[state], align="edge", label=f"{state} ({totals[state]})", zorder=2)
            else:
                ax.scatter(x + width / 2, v, s=22, marker=markers.get(state, "o"), color=STATE_COLORS[state],
                           edgecolors="black", linewidths=0.4, zorder=3 + rank, label=f"{state} ({totals[state]})")
        ax.set_yscale("log")
        ax.set_ylim(0.5, table.to_numpy().max() * 1.6)
    else:
        bottom = np.zeros(len(table))
        for state, color in STATE_COLORS.items():
            if state in table:
                v = table[state].to_numpy()
                ax.bar(x, v, width=width, bottom=bottom, color=color, label=f"{state} ({int(v.sum())})", align="edge")
                bottom += v
    ax.set_title(title or f"Runs per {name} by state ({n} runs{'; log scale' if log else ''})")
    ax.set_xlabel(f"{name} (UTC)")
    ax.set_ylabel("runs ended" + (" (log scale)" if log else ""))
    _date_axis(ax)
    ax.legend(fontsize=8, frameon=False)
    return fig


# --------------------------------------------------------------------------------------
# Weight space
# --------------------------------------------------------------------------------------


def _level_norm(z: np.ndarray, cmap):
    """Colour levels that show the differences a grid has, however they are spread.

    Few distinct values (a plateau of ties and a handful of others): one colour per value.
    Many: a dozen bins at quantiles of the distinct values, so a plateau or a few low outliers
    do not squash everything else into one colour. Returns (norm, colorbar ticks, their labels);
    the colorbar gives every level the same room.
    """
    from matplotlib.colors import BoundaryNorm

    vals = np.unique(np.round(z[np.isfinite(z)], 6))
    if len(vals) < 2:
        return None, None, None
    if len(vals) <= 12:
        mids = (vals[:-1] + vals[1:]) / 2
        pad = (vals[-1] - vals[0]) * 1e-3 or 1e-6
        bounds = np.concatenate([[vals[0] - pad], mids, [vals[-1] + pad]])
        return BoundaryNorm(bounds, cmap.N), (bounds[:-1] + bounds[1:]) / 2, _labels(vals)
    bounds = np.unique(np.quantile(vals, np.linspace(0, 1, 13)))
    return BoundaryNorm(bounds, cmap.N), bounds, _labels(bounds)


def _labels(values: np.ndarray) -> list[str]:
    """Values with as few decimals (3 to 6) as keep them apart."""
    for digits in range(3, 7):
        labels = [f"{v:.{digits}f}" for v in values]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def weight_heatmap(result: "GridResult", *, x: str = "w_kw", y: str = "w_rec", reduce: str = "best",
                   title: str | None = None, annotate: bool | None = None) -> Figure:
    """A retrieval metric over two axes of a weight search, the best and the current weights outlined.

    Colours are levels of the values the slice has (:func:`_level_norm`): with judgments that
    mostly tie (e.g. derived ones, which a lineage weight answers perfectly) a linear colour
    range is one flat block; levels show every difference, and each cell is labelled with its
    value when the grid is small enough to read. The subtitle says how many points tie at the
    best value. The best and the current weights are outlined (so the cell's value stays readable)
    only on a slice that contains them (:func:`_cell_on_slice`: with ``reduce="max"``, a cell whose
    value is theirs); otherwise the legend says they are not on it, and why.

    Args:
        result: from :func:`cybmem.retrieval.tuning.grid_search` / :func:`cybmem.retrieval.tuning.tune`.
        x, y: grid axes (``w_kw``, ``w_rec``, ``w_lin``, ``w_vec``, ``half_life_days``).
        reduce: ``"best"`` (other axes fixed at the best point) or ``"max"`` (max over them).
        title: figure title.
        annotate: write each cell's value (default: at most 15 x 15 cells).

    Returns:
        The Figure (heatmap Axes plus colorbar).
    """
    import matplotlib

    z = result.slice2d(x, y, reduce=reduce)
    xs, ys = result.axes[x], result.axes[y]
    fig = _Figure(figsize=(6.8, 5.4), layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"]
    norm, levels, level_labels = _level_norm(z, cmap)
    im = ax.imshow(np.ma.masked_invalid(z), origin="lower", aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    cb = fig.colorbar(im, ax=ax, spacing="uniform")
    cb.set_label(result.label + (" (a colour per level)" if norm is not None else ""))
    if levels is not None:
        cb.set_ticks(levels, labels=level_labels)
        cb.ax.minorticks_off()
    if annotate is None:
        annotate = z.shape[0] <= 15 and z.shape[1] <= 15
    if annotate:
        for (i, j), v in np.ndenumerate(z):
            if np.isfinite(v):
                r, g, b, _ = cmap(norm(v) if norm is not None else 0.5)
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if dark else "black")

    def ticks(vals: np.ndarray) -> tuple[list[int], list[str]]:
        step = max(1, int(math.ceil(len(vals) / 11)))
        idx = list(range(0, len(vals), step))
        return idx, [f"{vals[i]:g}" for i in idx]

    ax.set_xticks(*ticks(xs))
    ax.set_yticks(*ticks(ys))
    ax.set_xlabel(x + (" (days)" if x == "half_life_days" else ""))
    ax.set_ylabel(y + (" (days)" if y == "half_life_days" else ""))
    others = [a for a in result.axes if a not in (x, y) and len(result.axes[a]) > 1]
    fixed = ("max over " + ", ".join(others) if others else "") if reduce == "max" else ", ".join(
        f"{a}={result.axes[a][_fixed_index(result, a)]:g}" for a in others)  # the grid values the slice is cut at
    finite = z[np.isfinite(z)]
    ties = int(np.isclose(finite, finite.max()).sum()) if len(finite) else 0
    note = f"{ties} of {len(finite)} points tie at the best {finite.max():.3f}" if ties > 1 else ""
    sub = "; ".join(p for p in (fixed, note) if p)
    ax.set_title(title or f"{result.label} over {x} x {y}" + (f"\n({sub})" if sub else ""), fontsize=10)

    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    handles = []
    for who, w, value, color, style in (("current", result.current, result.current_metric, "white", "--"),
                                        ("best", result.best, result.best_metric, "#ff4040", "-")):
        cell, why = _cell_on_slice(result, w, x, y, reduce, z=z, value=value)
        if cell is not None:  # an outline around its cell: the cell's value stays readable
            inset = 0.06 if who == "current" else 0.0
            ax.add_patch(Rectangle((cell[1] - 0.5 + inset, cell[0] - 0.5 + inset), 1 - 2 * inset, 1 - 2 * inset,
                                   fill=False, edgecolor=color, linewidth=2.2, linestyle=style, zorder=3))
            text = f"{who} ({value:.3f})"
        else:
            text = f"{who} ({value:.3f}): not on this slice ({why})"
        handles.append(Line2D([], [], color=color if color != "white" else "0.35", linestyle=style, linewidth=2,
                              label=text))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.13), ncol=1, fontsize=8, frameon=False)
    return fig


def _fixed_index(result: "GridResult", axis: str) -> int:
    """Where a ``reduce="best"`` slice cuts ``axis``: the grid value nearest the best weights'
    (:meth:`cybmem.retrieval.tuning.GridResult.slice2d`)."""
    return int(np.argmin(np.abs(result.axes[axis] - getattr(result.best, axis))))


def _cell_on_slice(result: "GridResult", w: Any, x: str, y: str, reduce: str, *, z: np.ndarray | None = None,
                   value: float | None = None) -> tuple[tuple[int, int] | None, str]:
    """The (row, column) of the heatmap cell that holds the weights ``w`` (None when the slice does
    not contain them), and why not: their x or y value is no grid value, or (``reduce="best"``)
    another axis is cut elsewhere. A ``"max"`` cell holds the best over the other axes: it holds
    ``w`` when ``w`` is a grid point and its ``value`` is that best (``z``: the slice drawn)."""
    def index(axis: str) -> int | None:
        hit = np.flatnonzero(np.isclose(result.axes[axis], getattr(w, axis), rtol=1e-6, atol=1e-9))
        return int(hit[0]) if len(hit) else None

    for a in (x, y):
        if index(a) is None:
            return None, f"{a}={getattr(w, a):g} is between grid values"
    cell = (index(y), index(x))
    others = [a for a in result.axes if a not in (x, y)]
    if reduce == "max":
        off = [a for a in others if index(a) is None]
        if off:
            return None, ", ".join(f"{a}={getattr(w, a):g}" for a in off) + " is no grid value"
        best_there = None if z is None else float(z[cell])
        if value is None or best_there is None or not math.isclose(best_there, value, rel_tol=1e-9, abs_tol=1e-9):
            return None, f"its cell holds the best over {', '.join(others)}, {best_there:.3f}" if best_there is not None \
                else f"its cells are the best over {', '.join(others)}"
        return cell, ""
    for a in others:
        cut = result.axes[a][_fixed_index(result, a)]
        if index(a) is None or not math.isclose(cut, getattr(w, a), rel_tol=1e-6, abs_tol=1e-9):
            return None, f"{a}={getattr(w, a):g}, the slice's {a}={cut:g}"
    return cell, ""


# --------------------------------------------------------------------------------------
# Feedback: what the MEMORY block showed, used (cybmem.explore.usage)
# --------------------------------------------------------------------------------------

_USED_COLOR = "#1f77b4"


def feedback_over_time(table: "pd.DataFrame", *, title: str | None = None) -> Figure:
    """Runs dispatched with a block per period, those that used one of its runs in front, and the
    share that did as a line on its own axis (:func:`cybmem.explore.usage.usage_over_time`)."""
    fig = _Figure(figsize=(11, 3.8), layout="constrained")
    ax = fig.add_subplot()
    name = table.attrs.get("period", "period")
    n, used = int(table["blocks"].sum()) if len(table) else 0, int(table["usedBlock"].sum()) if len(table) else 0
    ax.set_title(title or f"Runs that used the MEMORY block, per {name} ({used} of {n} blocks)")
    ax.set_xlabel(f"{name} the run started (UTC)")
    ax.set_ylabel("runs dispatched with a block")
    if not n:
        ax.text(0.5, 0.5, "no run was shown a block", ha="center", va="center", transform=ax.transAxes)
        return fig
    x = mdates.date2num(table["period"].to_numpy())
    width = np.median(np.diff(x)) * 0.85 if len(x) > 1 else 0.8
    ax.bar(x, table["blocks"], width=width, align="edge", color="#d0d0d0", label="shown a block", zorder=2)
    ax.bar(x, table["usedBlock"], width=width, align="edge", color=_USED_COLOR, label="used a run of it", zorder=3)
    share = ax.twinx()
    share.plot(x + width / 2, table["rate"] * 100, color="#d62728", marker="o", markersize=3, linewidth=1.2,
               label="share that used one")
    share.set_ylim(0, 105)
    share.set_ylabel("share that used one (%)", color="#d62728")
    _date_axis(ax)
    handles = ax.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=3)
    return fig


def feedback_by_rank(table: "pd.DataFrame", *, title: str | None = None) -> Figure:
    """The share of the block's runs that were used, at each rank, each bar labelled used / shown
    (:func:`cybmem.explore.usage.usage_by_rank`)."""
    fig = _Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title or f"Block runs used, by rank ({int(table['used'].sum()) if len(table) else 0} used)")
    ax.set_xlabel("rank in the MEMORY block")
    ax.set_ylabel("share used (%)")
    if not len(table) or not int(table["shown"].sum()):
        ax.text(0.5, 0.5, "no run was shown a block", ha="center", va="center", transform=ax.transAxes)
        return fig
    rate = np.nan_to_num(table["rate"].to_numpy(dtype=float)) * 100
    ax.bar(table["rank"], rate, color=_USED_COLOR, zorder=2)
    top = max(float(rate.max()), 1.0)
    for k, r, u, s in zip(table["rank"], rate, table["used"], table["shown"]):
        ax.text(k, r + top * 0.02, f"{u}/{s}", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(table["rank"])
    ax.grid(axis="y", color="#eeeeee", zorder=0)
    return fig
