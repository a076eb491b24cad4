"""Figures: object-API Figures with titles, labelled axes and legends; what they draw is counted."""

import io

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from cybmem.explore import plots
from cybmem.retrieval import judgments as J
from cybmem.retrieval import tuning as T
from cybmem.explore.frames import issue_events_frame, issue_fold, records_frame
from cybmem.store.snapshot import load_snapshot
from cybmem.retrieval.weights import Weights
from cybmem.store.memory_store import MemoryStore


@pytest.fixture
def web(fixture_copy):
    snap = load_snapshot(MemoryStore(fixture_copy, "web"))
    return snap, records_frame(snap)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    return buf.getvalue()


def _nodes(ax) -> dict[str, int]:
    return {c.get_gid(): len(c.get_offsets()) for c in ax.collections
            if isinstance(c, PathCollection) and (c.get_gid() or "").startswith("nodes-")}


def test_lineage_graph_of_a_project(web):
    _, df = web
    fig = plots.lineage_graph(df, highlight=df["runId"].iloc[3][:8])
    ax = fig.axes[0]
    assert isinstance(fig, Figure)
    assert ax.get_title() == f"Lineage of {len(df)} runs"
    assert ax.get_xlabel() == "run ended (UTC)" and ax.get_ylabel() == "lane (dispatch tree)"
    nodes = _nodes(ax)
    assert sum(nodes.values()) == len(df)
    assert nodes == {f"nodes-{s}": int(n) for s, n in df["state"].value_counts().items()}
    assert [ln.get_gid() for ln in ax.lines] == ["highlight"]
    prev = [c for c in ax.collections if isinstance(c, LineCollection) and c.get_gid() == "edges-previous"]
    assert len(prev) == 1 and len(prev[0].get_segments()) == int(df["previousRunId"].notna().sum())
    chats = [p for p in ax.patches if (p.get_gid() or "").startswith("chat-")]
    assert len(chats) == df["chatSessionId"].nunique()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("dispatched by (parentRunId)") for t in legend)
    assert any(t.startswith("previous run (previousRunId)") for t in legend)
    assert _png(fig).startswith(b"\x89PNG")


def test_lineage_graph_of_one_dispatch_tree(web):
    _, df = web
    plan = df.loc[df["task"].str.startswith("Plan the shopping cart"), "runId"].iloc[0]
    fig = plots.lineage_graph(df, focus=plan, scope="tree")
    ax = fig.axes[0]
    kids = set(df.loc[df["parentRunId"] == plan, "runId"])
    drawn = sum(_nodes(ax).values())
    assert len(kids) == 3 and drawn >= 1 + len(kids)
    assert drawn < len(df)
    assert plan[:8] in ax.get_title()
    assert ax.get_xlabel() == "runs in the order they ended", "a tree is spaced by order by default"
    assert ax.get_xticklabels()[0].get_text().startswith(df.sort_values("endedAt").loc[lambda d: d["runId"].isin(
        set(kids) | {plan}), "runId"].iloc[0][:8])
    assert plots.lineage_graph(df, x="order").axes[0].get_xlabel() == "runs in the order they ended"
    with pytest.raises(Exception, match="focus"):
        plots.lineage_graph(df, scope="tree")


def test_lineage_lanes_pack_trees(web):
    _, df = web
    lanes = plots.lineage_lanes(df)
    alone = ~df["runId"].isin(df["parentRunId"].dropna()) & df["parentRunId"].isna()
    assert (lanes.loc[alone, "lane"] == 0).all(), "runs with no parent and no children share lane 0"
    assert lanes["lane"].max() < lanes["treeRoot"].nunique(), "trees that do not overlap in time share a lane"


def test_lineage_graph_scales_to_hundreds_of_runs(web):
    """Many runs: small markers, line collections, still one node per run."""
    import pandas as pd

    _, df = web
    big = pd.concat([df.assign(runId=df["runId"] + f"-{i}",
                               previousRunId=df["previousRunId"] + f"-{i}",
                               parentRunId=df["parentRunId"] + f"-{i}",
                               endedAt=df["endedAt"] + pd.Timedelta(days=40 * i),
                               startedAt=df["startedAt"] + pd.Timedelta(days=40 * i)) for i in range(8)], ignore_index=True)
    fig = plots.lineage_graph(big)
    assert sum(_nodes(fig.axes[0]).values()) == len(big) == 8 * len(df)
    _png(fig)


def test_issue_age_histograms(web):
    snap, df = web
    fold = issue_fold(issue_events_frame(snap), now=df["endedAt"].max())
    fig = plots.issue_age_histograms(fold)
    assert len(fig.axes) == 3
    titles = [ax.get_title() for ax in fig.axes]
    open_n = int(fold["state"].isin(["opened", "reopened"]).sum())
    assert titles[0] == f"Open issues: age (n={open_n})"
    assert titles[1] == f"Resolved issues: time to resolve (n={int((fold['state'] == 'resolved').sum())})"
    assert [ax.get_xlabel() for ax in fig.axes] == ["age (log scale)", "time to resolve (log scale)", "times reopened"]
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_xticklabels()[0].get_text() == "1 min"
    assert fig.axes[2].get_ylabel() == "issues"
    assert fig.get_suptitle() == f"Issue ages ({len(fold)} issues)"
    _png(fig)
    empty = plots.issue_age_histograms(fold.iloc[0:0])
    _png(empty)


def test_runs_over_time(web):
    _, df = web
    fig = plots.runs_over_time(df)
    ax = fig.axes[0]
    assert ax.get_title() == f"Runs per day by state ({len(df)} runs)"
    assert ax.get_ylabel() == "runs ended" and ax.get_xlabel() == "day (UTC)"
    heights = sum(p.get_height() for p in ax.patches)
    assert heights == len(df)
    assert sorted(t.get_text().split(" ")[0] for t in ax.get_legend().get_texts()) == sorted(df["state"].unique())
    weekly = plots.runs_over_time(df, freq="W")
    assert weekly.axes[0].get_title().startswith("Runs per week")
    _png(fig)


def test_weight_heatmap(web):
    snap, _ = web
    m = T.axis_matrices(snap, J.judgments_from_store(snap), k=5)
    res = T.grid_search(m, k=5, steps=5, half_lives=[3, 30], current=Weights())
    fig = plots.weight_heatmap(res, x="w_kw", y="w_rec")
    ax, cbar = fig.axes
    assert ax.get_xlabel() == "w_kw" and ax.get_ylabel() == "w_rec"
    assert cbar.get_ylabel() == "MRR@5 (a colour per level)"
    assert ax.get_title().startswith("MRR@5 over w_kw x w_rec")
    img = ax.get_images()[0].get_array()
    assert img.shape == (5, 5)
    expect = res.slice2d("w_kw", "w_rec")
    assert np.array_equal(np.ma.filled(img, np.nan), expect, equal_nan=True)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0].startswith("current (") and labels[1].startswith("best (")
    hl = plots.weight_heatmap(res, x="w_lin", y="half_life_days", reduce="max")
    assert hl.axes[0].get_ylabel() == "half_life_days (days)"
    _png(fig)


# --- figures at scale: a 100,000-run history (tests/conftest.py: synthetic_history) -----------------


def _save(fig: Figure, figures_dir, name: str) -> None:
    """Leave the PNG where a person can look at it (benchmarks/out/figures/tests/)."""
    fig.savefig(figures_dir / name, dpi=90)


def _tree_labels(ax) -> list[str]:
    """The root run ids of the trees drawn, in the order they are numbered."""
    return [t.get_gid()[5:] for t in ax.texts if (t.get_gid() or "").startswith("tree-")]


def test_lineage_at_100k_draws_the_largest_dispatch_trees_with_run_ids(history_100k, figures_dir):
    df, _ = history_100k
    fig = plots.lineage_graph(df)
    timeline, ax = fig.axes
    trees = plots.dispatch_trees(df)
    assert fig.get_suptitle() == f"The 12 largest of {len(trees)} dispatch trees (100,000 runs; {int(trees['runs'].sum()):,} in a tree)"
    assert _tree_labels(ax) == trees["root"].head(12).tolist(), "one tree each, largest first"
    assert trees["runs"].head(12).min() >= trees["runs"].iloc[12:].max()
    drawn = sum(_nodes(ax).values())
    assert drawn == int(trees["runs"].head(12).clip(upper=16).sum()), "a tree shows at most 16 runs"
    ids = [t for t in ax.texts if (t.get_gid() or "").startswith("run-")]
    assert len(ids) == drawn and all(t.get_text() == t.get_gid()[4:12] for t in ids), "every run named by its id"
    assert [c.get_gid() for c in ax.collections if isinstance(c, LineCollection)] == ["edges-parent"], \
        "parent links only: no curtain of previous-run links"
    assert any("more" in t.get_text() for t in ax.texts), "a tree larger than 16 runs says how many it left out"
    assert len({round(t.get_position()[1], 3) for t in ax.texts if (t.get_gid() or "").startswith("tree-")}) == 12, \
        "trees 16 runs wide take a row each"
    _save(fig, figures_dir, "lineage-100k-largest.png")
    recent = plots.lineage_graph(df, trees="recent", max_trees=8)
    latest = plots.dispatch_trees(df, by="recent")
    assert _tree_labels(recent.axes[1]) == latest["root"].head(8).tolist()
    assert recent.get_suptitle().startswith("The 8 most recent of")
    _save(recent, figures_dir, "lineage-100k-recent.png")


def test_lineage_of_thousands_of_runs_is_not_mostly_white_space(history_100k, figures_dir):
    """6,000 runs whose recent trees hold two or three runs each (as the pytest corpus has them): the
    trees sit side by side, and a history panel counts every run, so the figure shows the project."""
    import matplotlib.image as mpimg

    df = history_100k[0].iloc[-6000:]
    fig = plots.lineage_graph(df, trees="recent")
    timeline, ax = fig.axes
    trees = plots.dispatch_trees(df, by="recent")
    assert trees["runs"].head(12).max() <= 5
    assert _tree_labels(ax) == trees["root"].head(12).tolist()
    rows = {round(t.get_position()[1], 3) for t in ax.texts if (t.get_gid() or "").startswith("tree-")}
    assert len(rows) == 3, "12 small trees, four to a row"
    bars = {c.get_label(): np.nansum([p.get_height() for p in c.patches]) for c in timeline.containers}
    assert bars["all runs: 6,000"] == 6000, "the history counts every run"
    in_trees = int(plots.dispatch_trees(df)["runs"].sum())
    assert [v for k, v in bars.items() if k.startswith("in a dispatch tree")] == [in_trees]
    numbers = [t.get_text() for t in timeline.texts]
    assert sorted(numbers, key=int) == [str(i) for i in range(1, 13)], "each drawn tree numbered on the time line"
    path = figures_dir / "lineage-6k-recent.png"
    fig.savefig(path, dpi=90)
    pixels = mpimg.imread(path)[..., :3]
    ink = float((pixels.min(axis=2) < 0.9).mean())
    assert ink > 0.10, f"only {ink:.0%} of the figure is drawn on (the one tree a row layout drew on 4%)"


def test_lineage_graph_hides_previous_links_past_a_size(history_100k, figures_dir):
    df, _ = history_100k
    part = df.iloc[-300:]
    fig = plots.lineage_graph(part)
    ax = fig.axes[0]
    assert sum(_nodes(ax).values()) == 300, "300 runs are still drawn run by run"
    assert not [c for c in ax.collections if c.get_gid() == "edges-previous"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "previous run (previousRunId): 299, not drawn above 200 runs" in legend
    _save(fig, figures_dir, "lineage-300-runs.png")


def test_issue_ages_at_100k_use_log_axes(history_100k, figures_dir):
    _, fold = history_100k
    fig = plots.issue_age_histograms(fold)
    ages, resolve, reopen = fig.axes
    assert ages.get_xscale() == resolve.get_xscale() == "log"
    assert resolve.get_xlabel() == "time to resolve (log scale)"
    labels = [t.get_text() for t in resolve.get_xticklabels()]
    assert labels[0] == "1 min" and "1 day" in labels and len(labels) <= 6, "about six labels, none running into another"
    legend = [t.get_text() for t in resolve.get_legend().get_texts()]
    zero = int(((fold["state"] == "resolved") & (fold["timeToResolve"].dt.total_seconds() < 60)).sum())
    assert legend[0] == "median under a minute" and f"{zero} under a minute, counted at 1 min" in legend
    heights = [p.get_height() for p in resolve.patches]
    assert sum(heights) == int((fold["state"] == "resolved").sum()), "every resolved issue is counted"
    assert reopen.get_yscale() == "log", "thousands never reopened, a few reopened: counts span orders of magnitude"
    counts = fold["reopenCount"].value_counts()
    assert [int(t.get_text()) for t in reopen.texts] == counts.sort_index().tolist(), "every bar is labelled"
    _save(fig, figures_dir, "issue-ages-100k.png")


def test_issue_ages_stay_linear_counts_when_they_do_not_span_orders(web):
    snap, df = web
    fold = issue_fold(issue_events_frame(snap), now=df["endedAt"].max())
    fig = plots.issue_age_histograms(fold)
    assert fig.axes[2].get_yscale() == "linear"


def test_runs_over_time_at_100k_shows_rare_states_on_a_log_axis(history_100k, figures_dir):
    df, _ = history_100k
    fig = plots.runs_over_time(df)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_title() == "Runs per month by state (100000 runs; log scale)"
    markers = {c.get_label(): c for c in ax.collections}
    for state in ("error", "cancelled"):
        total = int((df["state"] == state).sum())
        assert f"{state} ({total})" in markers, "the rare states are markers, visible however small"
        assert np.nansum(markers[f"{state} ({total})"].get_offsets()[:, 1]) == total
    assert sum(p.get_height() for p in ax.patches if np.isfinite(p.get_height())) == int((df["state"] == "done").sum())
    _save(fig, figures_dir, "runs-over-time-100k.png")
    assert plots.runs_over_time(df, log=False).axes[0].get_yscale() == "linear"


def _grid(values: np.ndarray) -> "T.GridResult":
    axes = {"w_kw": np.linspace(0, 1, 11), "w_rec": np.linspace(0, 1, 11), "w_lin": np.linspace(0, 1, values.shape[2]),
            "w_vec": np.array([0.0]), "half_life_days": np.array([1, 3, 7, 14, 30, 60, 120, 365.0])}
    v = values[..., None, :] if values.ndim == 4 else values
    best_i = np.unravel_index(np.nanargmax(v), v.shape)
    best = Weights(**{a: float(axes[a][i]) for a, i in zip(axes, best_i)})
    return T.GridResult(metric="mrr", k=10, axes=axes, values=v, best=best, best_metric=float(np.nanmax(v)),
                        current=Weights(), current_metric=0.65, judgments=132, skipped=0, points=v.size,
                        evaluated=v.size, seconds=0.1)


def test_weight_heatmap_colours_show_the_differences_under_a_plateau(figures_dir):
    """Derived judgments: any lineage weight ranks the parent first, so most of the grid ties at 1.0
    and the rest differ in the second decimal; a linear colour range paints one flat block."""
    values = np.ones((11, 11, 11, 8))
    values[:, :, 0, :] = [0.577, 0.599, 0.612, 0.614, 0.615, 0.626, 0.629, 0.612]  # w_lin = 0: per half-life
    values[0, 0, 0, :] = np.nan  # every weight 0: no ranking
    res = _grid(values)
    fig = plots.weight_heatmap(res, x="w_lin", y="half_life_days", reduce="max")
    ax, cbar = fig.axes
    img = ax.get_images()[0]
    z = res.slice2d("w_lin", "half_life_days", reduce="max")
    distinct = np.unique(z[np.isfinite(z)])
    colours = np.array([img.cmap(img.norm(v))[:3] for v in distinct])
    gaps = np.linalg.norm(np.diff(colours, axis=0), axis=1)
    assert len(distinct) >= 5 and gaps.min() > 0.05, "every level has its own, visibly different colour"
    import matplotlib.colors as mcolors

    linear = mcolors.Normalize(np.nanmin(z), np.nanmax(z))
    flat = np.array([img.cmap(linear(v))[:3] for v in distinct[:-1]])
    assert np.linalg.norm(np.diff(flat, axis=0), axis=1).min() < 0.05, "(a linear range would not tell them apart)"
    assert [t.get_text() for t in cbar.get_yticklabels()] == [f"{v:.3f}" for v in distinct]
    assert "80 of 88 points tie at the best 1.000" in ax.get_title()
    cells = [t.get_text() for t in ax.texts]
    assert len(cells) == 88 and "1.00" in cells, "small grids label every cell"
    _save(fig, figures_dir, "weight-heatmap-plateau.png")
    many = _grid(np.linspace(0.3, 0.9, 11 * 11 * 11 * 8).reshape(11, 11, 11, 8) ** 3)
    fig = plots.weight_heatmap(many, x="w_kw", y="w_rec")
    assert len(fig.axes[1].get_yticklabels()) == 13, "many values: a dozen quantile levels"
    _save(fig, figures_dir, "weight-heatmap-spread.png")
