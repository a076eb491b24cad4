"""``cybmem fleet ACTION``: search, the issue fold and the report over every machine's exported
memory (:meth:`cybmem.memory.Memory.fleet`), one sub-command per job."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..answers import shorten
from ..memory import Memory
from .framework import AsOfOpt, Ctx, ProgressOpt, WordGroup, app, command, moment, short_help
from .render import count, echo, fmt_axes, print_json, table, warn, when, whole

__all__ = ["FLEET_JOBS", "fleet_app"]


FLEET_JOBS = ("search", "issues", "report")


class _JobGroup(WordGroup):
    """``cybmem fleet ACTION``: one sub-command per job."""

    words, hint = FLEET_JOBS, "ACTION"


fleet_app = typer.Typer(
    cls=_JobGroup, no_args_is_help=True, rich_markup_mode=None, add_completion=False,
    help="""Search, fold issues and report over every machine's exported memory, on Dask.

    search QUERY: the top k records of the whole fleet, ranked by the linear formula as `cybmem
    search` ranks one store holding them all with CYBERINE_MEMORY_RANKER=linear. issues: the
    issue fold of every machine and project (counts, or --open). report: issue-age histograms and
    the lineage summary per machine and project (PNG, CSV and HTML) in --out. A small dataset runs
    in this process, a larger one on a LocalCluster (the last line says which); --scheduler
    chooses, or names a running cluster. A part file that cannot be
    read is skipped with one line naming it; a run id that several machines exported counts once,
    for the first that exported it, and its hit names them all.

    Example: cybmem fleet search "flaky login test" --dataset ~/fleet -k 5
    """,
)
app.add_typer(fleet_app, name="fleet", short_help=short_help(fleet_app.info.help))

DatasetOpt = Annotated[Optional[Path], typer.Option("--dataset", "-d", help="The Parquet dataset every machine exports to (`cybmem export parquet --out DIR`).", show_default=False)]
SchedulerOpt = Annotated[str, typer.Option("--scheduler", help="auto: in this process for a small dataset, else a LocalCluster; inline; local (a LocalCluster); or a Dask scheduler's address (tcp://host:8786).")]
WorkersOpt = Annotated[int, typer.Option("--workers", help="LocalCluster worker processes.", min=1)]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for --scheduler to answer.", min=0.1)]
MachinesOpt = Annotated[Optional[list[str]], typer.Option("--machine", "-m", help="Only this machine (repeat for more).", show_default=False)]
ProjectsOpt = Annotated[Optional[list[str]], typer.Option("--project", "-p", help="Only this project (repeat for more).", show_default=False)]
NowOpt = Annotated[Optional[str], typer.Option("--now", help="Measure ages to this moment (epoch ms or ISO date; default: now).", show_default=False)]


@contextlib.contextmanager
def _fleet(dataset, scheduler, workers, timeout, machine, project, progress):
    """The fleet the shared options describe; the part files it skipped are said once."""
    if dataset is None:
        raise typer.BadParameter("give the dataset directory (`cybmem export parquet --out DIR` writes it)", param_hint="--dataset")
    with Memory.fleet(dataset, scheduler=scheduler, machines=machine, projects=project, workers=workers, progress=progress,
               timeout=timeout) as fleet:
        warn(fleet.skipped)
        yield fleet


@command("search", group=fleet_app, project=False, memory=False, free_text=True, teardown=False)
def fleet_search_cmd(
    ctx: Ctx,
    query: Annotated[Optional[str], typer.Argument(help="What to look for (free text).", show_default=False)] = None,
    dataset: DatasetOpt = None, scheduler: SchedulerOpt = "auto", workers: WorkersOpt = 2, timeout: TimeoutOpt = 10.0,
    machine: MachinesOpt = None, project: ProjectsOpt = None,
    k: Annotated[int, typer.Option("-k", "--top", help="How many results.", min=1)] = 10,
    explain_: Annotated[bool, typer.Option("--explain", help="Each result's per-axis contributions and the weights.")] = False,
    as_of: AsOfOpt = None,
    progress: ProgressOpt = None,
):
    """The top k records of the whole fleet, ranked by the linear formula (as `cybmem search` ranks
    one store holding them all with CYBERINE_MEMORY_RANKER=linear).

    Example: cybmem fleet search "flaky login test" --dataset ~/fleet -k 5
    """
    if not query:
        raise typer.BadParameter("search needs a QUERY", param_hint="QUERY")
    with _fleet(dataset, scheduler, workers, timeout, machine, project, progress) as fleet:
        result = fleet.search(query, k=k, as_of=moment(as_of, "--as-of"))
        if ctx.json:
            print_json(result.to_dict(explain=explain_))
            return
        if not result.hits:
            echo(f"No matching records in {result.records} records of {len(fleet.groups)} projects.")
            echo(f"Ran {fleet.ran_on}.")
            return
        rows = [[str(h.rank), f"{h.score:.3f}", h.machine + ("*" if h.claimed_by else ""), h.project, h.run_id[:8],
                 when(h.ended_at_ms), h.state, h.task] for h in result.hits]
        table(["#", "SCORE", "MACHINE", "PROJECT", "RUN", "ENDED (UTC)", "STATE", "TASK"], rows)
        if explain_:
            w = result.weights
            echo("")
            echo(f"weights: w_kw={w.w_kw:g} w_rec={w.w_rec:g} w_lin={w.w_lin:g} w_vec={w.w_vec:g} half_life_days={w.half_life_days:g}"
                  + (f"  as of {when(result.as_of)} UTC" if result.as_of is not None else ""))
            for h in result.hits:
                echo(f"{h.rank:>2}. {h.run_id[:8]}  {fmt_axes(h.contributions)}  = {h.score:.3f}")
        for h in (h for h in result.hits if h.claimed_by):
            echo(f"* run {h.run_id[:8]} was exported by {', '.join(h.claimed_by)}"
                  + (" with different records" if h.conflict else ", the same record")
                  + f"; shown as {h.claimed_by[0]}, the first to export it.")
        echo(f"Ran {fleet.ran_on}.")


@command("issues", group=fleet_app, project=False, memory=False, teardown=False)
def fleet_issues_cmd(
    ctx: Ctx,
    dataset: DatasetOpt = None, scheduler: SchedulerOpt = "auto", workers: WorkersOpt = 2, timeout: TimeoutOpt = 10.0,
    machine: MachinesOpt = None, project: ProjectsOpt = None,
    open_: Annotated[bool, typer.Option("--open", help="List the open issues, oldest first, instead of counts per machine and project.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", help="--open: show at most N (0: all).", min=0)] = 20,
    now: NowOpt = None,
    progress: ProgressOpt = None,
):
    """The issue fold of every machine and project: counts per machine and project, or --open.

    Example: cybmem fleet issues --dataset ~/fleet --open -n 10
    """
    now_ms = moment(now, "--now")
    with _fleet(dataset, scheduler, workers, timeout, machine, project, progress) as fleet:
        ran = f"Ran {fleet.ran_on}."
        if open_:
            opened = fleet.open_issues(now=now_ms)
            shown = opened if not limit else opened.head(limit)
            if ctx.json:
                print_json(json.loads(shown.drop(columns=["openAge", "timeToResolve"])
                                       .to_json(orient="records", date_format="epoch", date_unit="ms")))
                return
            if not len(opened):
                echo(f"No open issues in {len(fleet.groups)} projects.")
                echo(ran)
                return
            rows = [[m, p, i, when(int(o.value // 1_000_000)), f"{a:.1f}", st, t]
                    for m, p, i, o, a, st, t in zip(shown["machine"], shown["project"], shown["issueId"],
                                                     shown["openedAt"].dt.as_unit("ns"), shown["ageDays"], shown["state"], shown["title"])]
            table(["MACHINE", "PROJECT", "ISSUE", "OPENED (UTC)", "AGE (D)", "STATE", "TITLE"], rows, fit=shorten)
            if len(shown) < len(opened):
                echo(f"... {len(opened) - len(shown)} more open issues (-n 0 shows all)")
            echo(ran)
            return
        summary = fleet.issue_summary(now=now_ms)
        if ctx.json:
            print_json(json.loads(summary.to_json(orient="records")))
            return
        rows = [[r.machine, r.project, str(r.issues), str(r.opened + r.reopened), str(r.resolved), str(r.wontfix),
                 str(r.reopens), "-" if r.medianOpenDays != r.medianOpenDays else f"{r.medianOpenDays:.1f}"]
                for r in summary.itertuples()]
        table(["MACHINE", "PROJECT", "ISSUES", "OPEN", "RESOLVED", "WONTFIX", "REOPENS", "MEDIAN OPEN AGE (D)"], rows,
               fit=whole)
        echo(ran)


@command("report", group=fleet_app, project=False, memory=False, teardown=False)
def fleet_report_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="The directory to write the figures and tables into.", show_default=False)],
    dataset: DatasetOpt = None, scheduler: SchedulerOpt = "auto", workers: WorkersOpt = 2, timeout: TimeoutOpt = 10.0,
    machine: MachinesOpt = None, project: ProjectsOpt = None,
    now: NowOpt = None,
    progress: ProgressOpt = None,
):
    """Issue-age histograms and the lineage summary per machine and project (PNG, CSV and HTML) in --out.

    Example: cybmem fleet report --dataset ~/fleet --out fleet-report
    """
    now_ms = moment(now, "--now")
    with _fleet(dataset, scheduler, workers, timeout, machine, project, progress) as fleet:
        result = fleet.report(out, now=now_ms)
        if ctx.json:
            print_json(result.to_dict())
            return
        names = ", ".join(Path(f).name for f in result.files)
        n = count
        echo(f"Wrote {names} to {out}: {n(result.runs, 'run')} and {n(result.issues, 'issue')} of "
              f"{n(result.projects, 'project')} on {n(result.machines, 'machine')}."
              + (f" {n(result.claimed, 'run id')} exported by more than one machine or project count once."
                 if result.claimed else ""))
        echo(f"Ran {fleet.ran_on}.")

