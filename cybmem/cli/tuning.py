"""The commands that tune and score the retrieval weights: ``tune`` (the grid search, checked on
later judgments, and saving: :func:`cybmem.operations.retune.tune_and_save`) and ``eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import CybmemError
from ..memory import Memory
from .framework import Ctx, command, moment
from .render import echo, print_json, table, warn, when, whole

__all__ = ["REFUSED_EXIT", "tune_cmd", "eval_cmd"]


def _floats(text: Optional[str], param: str) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of numbers (e.g. 7,30,90)", param_hint=param) from None
    if not values:
        raise typer.BadParameter("give at least one value", param_hint=param)
    return values


_W_FIELDS = ("w_kw", "w_rec", "w_lin", "w_vec", "half_life_days")


def _weights_row(name: str, w, *values: str) -> list[str]:
    return [name] + [f"{getattr(w, a):g}" for a in _W_FIELDS] + list(values)


JudgmentsOpt = Annotated[Optional[Path], typer.Option("--judgments", "-j", help="Judgments JSONL: one {\"query\", \"asOf\", \"relevant\": [runIds]} a line (qrels.jsonl works). Default: derived from the store (runs that raised, resolved or reopened an issue earlier runs carried; parent runs; what runs used); a file lying in the memory root is never taken unless named here.", show_default=False)]
MetricOpt = Annotated[str, typer.Option("--metric", help="mrr, ndcg or recall (each cut at -k).")]
DeriveOpt = Annotated[str, typer.Option("--derive", help="Without --judgments: which judgments to derive, comma-separated: raised, resolved, reopened (a run that raised, resolved or reopened an issue should see the earlier runs that carried it; issue = all three), parent (a dispatched run should see its parent), used (a run should see first the runs it used of those memory showed it: used.jsonl).")]


#: The exit code of ``cybmem tune --save`` when it refuses to save (not 0, nor 1: a failure, nor 2: a usage mistake).
REFUSED_EXIT = 3


def _metric_and_kinds(metric: str, derive: str) -> list[str]:
    try:
        Memory.check_metric(metric)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--metric") from None
    try:
        return Memory.judgment_kinds(derive)
    except CybmemError as exc:
        raise typer.BadParameter(str(exc), param_hint="--derive") from None


@command("tune", quick=True)
def tune_cmd(
    ctx: Ctx,
    judgments: JudgmentsOpt = None,
    metric: MetricOpt = "mrr",
    k: Annotated[int, typer.Option("-k", help="Metric cut-off: MRR@k, nDCG@k, recall@k.", min=1)] = 10,
    steps: Annotated[int, typer.Option("--steps", help="Values per weight: STEPS points from 0 to 1.", min=2)] = 11,
    half_lives: Annotated[Optional[str], typer.Option("--half-lives", help="Comma-separated half-lives in days (default: 1,3,7,14,30,60,120,365 and the current one).", show_default=False)] = None,
    derive: DeriveOpt = "issue,parent,used",
    as_of: Annotated[Optional[str], typer.Option("--as-of", help="Tune as of this moment (ISO date/time or epoch ms): only the runs, ledger events and judgments that existed then, so the result can be checked on what came after.", show_default=False)] = None,
    save: Annotated[bool, typer.Option("--save", help="Write the weights tuned on the earlier half of the judgments, and checked on the later half, to the project's weights.json with the evidence (refused, exit 3, when they do not beat the current ones there: see --force).")] = False,
    force: Annotated[bool, typer.Option("--force", help="With --save: save even weights that do not beat the current ones on the later judgments, switch the keyword axis off, or come from too few judgments.")] = False,
    all_weights: Annotated[bool, typer.Option("--all-weights", help="Search w_kw, w_rec and the half-life even when fewer than 10 judgments test keywords (by default only w_lin is searched then).")] = False,
    auto: Annotated[bool, typer.Option("--auto", help="Tune on the store's own judgments, save only what passes every check, print one line, exit 0 (what CYBERINE_MEMORY_RETUNE runs as the history grows).")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Grid-search the retrieval weights against relevance judgments; check them on later judgments; save them.

    Without --judgments the judgments come from the project's own history: a run that raised,
    resolved or reopened an issue should have been shown the earlier runs that carried it (asked
    with its task, the issue's references taken out, as text alone), and a dispatched run its
    parent. Every query is replayed as dispatch would have answered it at its moment (only runs
    that had ended count). The weights are searched on the earlier half of the judgments and
    scored on the later half; --save writes those checked weights (never ones fitted to the
    judgments they are checked on), with the evidence, and only when they beat the current weights
    there (90% bootstrap interval above 0) and hold up asked as text alone; with fewer than 30
    judgments that test the weights it keeps the current ones. --force saves anyway.
    "used" judgments (what runs said they used of what memory showed them) count only from runs
    whose clock is plausible, at most 3 used runs each, and never more than half of the judgments;
    weights that lose on the store's other judgments alone are not saved either.

    Exit codes: 0 tuned (and saved, with --save), 1 a failure (no project, an unreadable file),
    2 a usage mistake, 3 --save refused (the reason on stderr; --json: "notSaved").

    Example: cybmem tune --project web --as-of 2026-06-01 --save
    """
    if auto:
        line = ctx.memory.auto_tune(progress=progress)
        print_json({"result": line}) if ctx.json else echo(line[0].upper() + line[1:] + ".")
        return
    kinds = _metric_and_kinds(metric, derive)
    hl = _floats(half_lives, "--half-lives")
    at = moment(as_of, "--as-of") if as_of is not None else None
    done = ctx.memory.tune(save=save, force=force, judgments=judgments, as_of=at, metric=metric, k=k, steps=steps,
                           half_lives=hl, kinds=kinds, hold_few=not all_weights, progress=progress)
    warn(done.result.warnings)
    if ctx.json:
        print_json(done.to_dict())
        if done.refused:
            raise typer.Exit(REFUSED_EXIT)
        return
    _render_tuning(done.result)
    if done.saved:
        what = ("the weights tuned on the earlier judgments and checked on the later ones" if done.result.saves is not None
                else "the best weights on all judgments (not checked on later ones)")
        echo(f"Saved {what} to {done.saved}, with the evidence; `cybmem search` and `cybmem inject` use them from now on.")
        if done.overridden:
            echo(f"Note: still overridden by {', '.join(done.overridden)}.", err=True)
    elif done.refused and not force:
        echo(f"Not saved: {done.refused}. Add --force to save them anyway.", err=True)
        raise typer.Exit(REFUSED_EXIT)
    elif save:
        echo("Nothing to save: no weights beat the current ones; weights.json left as it is.")
    else:
        refusal = done.result.refusal
        advice = f"add --save to write the checked weights to {done.target}" if refusal is None else f"--save would keep the current weights: {refusal}"
        echo(f"Not saved; {advice}.")


def _render_tuning(result) -> None:
    """What a tuning found, for people: the judgments, the notes, the grid, the weights and their check on time."""
    shape = " x ".join(str(len(result.axes[a])) for a in ("w_kw", "w_rec", "w_lin"))
    if len(result.axes["w_vec"]) > 1:
        shape += f" x {len(result.axes['w_vec'])}"
    kinds_text = ", ".join(f"{n} {kind}" for kind, n in sorted(result.kinds.items()))
    as_of = f" as of {when(result.as_of)}" if result.as_of is not None else ""
    echo(f"Judgments: {result.judgments} {result.source.split(' (')[0]}{as_of} ({kinds_text})"
          + (f"; {result.skipped} skipped (no relevant run existed yet)" if result.skipped else "") + ".")
    for note in (result.keyword_held, result.vector_note, result.met_note):
        if note:
            echo(f"Note: {note}.")
    if result.left_out:
        echo(f"Note: {_left_out_text(result.left_out)}.")
    echo(f"Grid: {shape} weights x {len(result.axes['half_life_days'])} half-lives = {result.points} points "
          f"({result.evaluated} distinct rankings) in {result.seconds:.2f}s.")
    echo("")
    v = result.validation
    heads = ["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", result.label.upper()]
    rows = [_weights_row("current", result.current, f"{result.current_metric:.4f}"),
            _weights_row("best on all", result.best, f"{result.best_metric:.4f}  ({result.improvement:+.4f})")]
    table(heads, rows, fit=whole)
    if v is not None:
        echo("")
        echo(f"Checked on time: searched on the earlier {v.earlier} judgments, scored on the later {v.later} "
              f"(90% interval of the gain {v.interval[0]:+.4f} to {v.interval[1]:+.4f}):")
        later = [f"{v.current_later:.4f}", f"{v.tuned_later:.4f}"]
        heads2 = ["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", "EARLIER", "LATER"]
        text = v.text_tuned_later is not None
        if text:
            heads2.append("LATER AS TEXT")
        table(heads2, [
            _weights_row("current", result.current, f"{v.current_earlier:.4f}", later[0], *([f"{v.text_current_later:.4f}"] if text else [])),
            _weights_row("tuned on earlier", v.tuned, f"{v.tuned_earlier:.4f}", later[1], *([f"{v.text_tuned_later:.4f}"] if text else [])),
        ], fit=whole)
    echo("")


def _left_out_text(left_out: dict[str, int]) -> str:
    """``"used" judgments left out: 12 whose run's clock is implausible, 40 past as many as the store's own ...``."""
    parts = [f"{left_out['clock']} whose run's clock is implausible" if left_out.get("clock") else "",
             f"{left_out['share']} past as many as the store's own judgments that test the weights"
             if left_out.get("share") else "",
             f"{left_out['capped']} used run(s) past 3 a run" if left_out.get("capped") else ""]
    return '"used" judgments left out: ' + ", ".join(p for p in parts if p)


@command("eval", quick=True)
def eval_cmd(
    ctx: Ctx,
    judgments: JudgmentsOpt = None,
    weights_file: Annotated[Optional[Path], typer.Option("--weights", help="A weights JSON file to score (as tune --save writes it).", show_default=False)] = None,
    w_kw: Annotated[Optional[float], typer.Option("--w-kw", help="Score these weights: keyword weight (the others default to production's).", show_default=False, min=0)] = None,
    w_rec: Annotated[Optional[float], typer.Option("--w-rec", help="Recency weight.", show_default=False, min=0)] = None,
    w_lin: Annotated[Optional[float], typer.Option("--w-lin", help="Lineage weight.", show_default=False, min=0)] = None,
    w_vec: Annotated[Optional[float], typer.Option("--w-vec", help="Vector weight.", show_default=False, min=0)] = None,
    half_life: Annotated[Optional[float], typer.Option("--half-life-days", help="Recency time constant in days.", show_default=False, min=0)] = None,
    metric: MetricOpt = "mrr",
    k: Annotated[int, typer.Option("-k", help="Metric cut-off.", min=1)] = 10,
    derive: DeriveOpt = "issue,parent,used",
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Score fixed weights on relevance judgments, beside the weights production uses now.

    Reports the metric over all judgments, on the earlier and the later half in time, and per kind
    of judgment. Weights come from --weights FILE and/or --w-kw/--w-rec/--w-lin/--w-vec/--half-life-days
    (unset ones: what production reads for the project).

    Example: cybmem eval -j qrels.jsonl --w-kw 0.6 --w-rec 0.3 --project web
    """
    kinds = _metric_and_kinds(metric, derive)
    store = ctx.memory.store()
    given = {name: v for name, v in (("w_kw", w_kw), ("w_rec", w_rec), ("w_lin", w_lin), ("w_vec", w_vec),
                                     ("half_life_days", half_life)) if v is not None}
    if weights_file is not None and not weights_file.is_file():
        raise typer.BadParameter(f"no such file: {weights_file}", param_hint="--weights")
    result = ctx.memory.eval(project=store, given=given, weights_file=weights_file, judgments=judgments,
                             metric=metric, k=k, kinds=kinds, progress=progress)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
        return
    echo(f"Judgments: {result.judgments} {result.source}" + (f"; {result.skipped} skipped" if result.skipped else "") + ".")
    kinds_seen = sorted({kind for r in result.rows.values() for kind in r["kinds"]})
    heads = ["", "W_KW", "W_REC", "W_LIN", "W_VEC", "HALF_LIFE_DAYS", result.label.upper(), "EARLIER", "LATER", *[x.upper() for x in kinds_seen]]
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    table(heads, [_weights_row(name, r["weights"], fmt(r["all"]), fmt(r["earlier"]), fmt(r["later"]),
                                *[fmt(r["kinds"].get(x)) for x in kinds_seen]) for name, r in result.rows.items()], fit=whole)

