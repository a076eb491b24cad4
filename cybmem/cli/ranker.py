"""``cybmem ranker ACTION``: the learned ranker's model: ``show`` (its provenance) and ``train``
(retrain it on memory roots with judgments: :meth:`cybmem.memory.Memory.train_ranker`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..memory import Memory
from .framework import Ctx, ProgressOpt, WordGroup, app, command, short_help
from .render import echo, print_json, table

__all__ = ["RANKER_JOBS", "ranker_app"]

RANKER_JOBS = ("show", "train")


class _JobGroup(WordGroup):
    """``cybmem ranker ACTION``: one sub-command per job."""

    words, hint = RANKER_JOBS, "ACTION"


ranker_app = typer.Typer(
    cls=_JobGroup, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
    help="""Show or retrain the learned ranker that orders search, inject and the MEMORY block.

    show: the shipped model's provenance (the histories it was trained on, the commit, the LightGBM
    version, its leave-one-history-out table). train ROOT...: retrain it on memory roots that hold
    judgments (qrels.jsonl), print the leave-one-history-out table and write the model (--out; by
    default over the shipped one). CYBERINE_MEMORY_RANKER=linear turns the ranker off.

    Example: cybmem ranker train ~/corpora/pytest-memory ~/corpora/mypy-memory --out model.json
    """,
)
app.add_typer(ranker_app, name="ranker", short_help=short_help(ranker_app.info.help))


def _loo_table(loo: dict | None) -> None:
    if not loo:
        echo("No leave-one-history-out table (one history: nothing to leave out).")
        return
    rows = [[h["name"], f"{h['records']:,}", str(h["queries"]), f"{h['linear_mrr']:.3f}", f"{h['learned_mrr']:.3f}",
             f"{h['linear_recall']:.3f}", f"{h['learned_recall']:.3f}"] for h in loo["histories"]]
    rows.append(["mean", "", "", f"{loo['meanLinear']:.3f}", f"{loo['meanLearned']:.3f}", "", ""])
    table(["HISTORY", "RECORDS", "QUERIES", "LINEAR MRR@10", "LEARNED MRR@10", "LINEAR R@8", "LEARNED R@8"], rows,
          fit=lambda text, room: text)


@command("show", group=ranker_app, project=False, memory=False)
def ranker_show_cmd(
    ctx: Ctx,
    model: Annotated[Optional[Path], typer.Option("--model", help="A model file (default: the shipped one).", show_default=False)] = None,
):
    """The learned ranker's model: what it was trained on, from which commit, and how it scored.

    Example: cybmem ranker show
    """
    info = Memory.ranker_model(model)
    if ctx.json:
        print_json(info)
        return
    hs = ", ".join(f"{h['name']} ({h['records']:,} runs, {h['queries']} queries)" for h in info.get("histories") or [])
    model = Path(info["model"]).resolve()
    package = Path(__file__).resolve().parents[1]  # the model shipped in the package is named as such, wherever it is installed
    echo(f"Model: cybmem/{model.relative_to(package).as_posix()} (shipped with cybmem)" if model.is_relative_to(package)
         else f"Model: {model}")
    echo(f"{info['trees']} trees over {len(info['features'])} features; trained {info.get('trainedAt') or '?'} "
         f"from commit {(info.get('commit') or '?')[:12]} with LightGBM {info.get('lightgbm') or '?'}.")
    echo(f"Histories: {hs or '?'}.")
    _loo_table(info.get("leaveOneOut"))


@command("train", group=ranker_app, project=False, memory=False)
def ranker_train_cmd(
    ctx: Ctx,
    roots: Annotated[list[Path], typer.Argument(help="Memory roots, each with its judgments (qrels.jsonl).", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write the model (default: over the shipped one).", show_default=False)] = None,
    progress: ProgressOpt = None,
):
    """Retrain the learned ranker on memory roots with judgments and print its leave-one-history-out table.

    Each root's judged queries are ranked as of their moment, text only; the model is scored on each
    history after training on the others, then trained on them all and written to --out.

    Exit codes: 0 trained, 1 a root without projects.json or qrels.jsonl, or LightGBM missing
    (pip install 'cybmem[train]'), 2 a usage mistake.

    Example: cybmem ranker train ~/corpora/pytest-memory ~/corpora/mypy-memory --out model.json
    """
    done = Memory.train_ranker(roots, out=out, progress=progress)
    if ctx.json:
        print_json(done)
        return
    _loo_table(done["leaveOneOut"])
    echo(f"Wrote {done['model']}: {done['trees']} trees over {done['features']} features, trained on "
         f"{', '.join(h['name'] for h in done['histories'])}.")
