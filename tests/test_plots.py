"""Figures: object-API Figures with titles, labelled axes and legends; what they draw is counted."""

import io

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from cybmem import plots
from cybmem import judgments as J
from cybmem import tuning as T
from cybmem.frames import issue_events_frame, issue_fold, records_frame
from cybmem.snapshot import load_snapshot
from cybmem.weights import Weights
from cybmem.store import MemoryStore


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
    assert [ax.get_xlabel() for ax in fig.axes] == ["days", "days", "times reopened"]
    assert all(ax.get_ylabel() == "issues" for ax in fig.axes)
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
    assert cbar.get_ylabel() == "MRR@5"
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
