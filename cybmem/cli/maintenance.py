"""The commands that look after a store: ``report`` (the notebooks run into HTML) and ``doctor``
(check a store, rebuild what is derived)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import ValidationError
from ..memory import Memory
from .framework import Ctx, command
from .render import echo, print_json

__all__ = ["report_cmd", "doctor_cmd"]


@command("report")
def report_cmd(
    ctx: Ctx,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the HTML pages (created).", show_default=False)],
    parameter: Annotated[Optional[list[str]], typer.Option("--parameter", "-P", help="NAME=VALUE for the notebooks' parameter cells, e.g. -P metric=ndcg -P k=5 -P judgments=judgments.jsonl (repeatable; names as in the notebooks, any case).", show_default=False)] = None,
    with_code: Annotated[bool, typer.Option("--with-code", help="Keep the notebooks' code cells in the pages.")] = False,
    timeout: Annotated[int, typer.Option("--timeout", help="Seconds allowed per notebook cell.", min=1)] = 600,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Cell progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Execute the notebooks (history, lineage, issue ages, weight tuning, feedback; the fleet with -P dataset=DIR) headless and write self-contained HTML.

    One page per notebook plus index.html; figures are embedded images, nothing is fetched
    from the network. Progress goes to stderr, a line per notebook with how long it took.
    Without --project or --cwd, CYBERINE_MEMORY_PROJECT names the project, as for the notebooks.

    Example: cybmem report --out reports/web --project web -P metric=ndcg -P k=5
    """
    try:
        params = Memory.report_parameters(parameter or [])
    except ValidationError as exc:  # a bad -P; a missing extra is no usage mistake
        raise typer.BadParameter(str(exc), param_hint="-P") from None
    result = ctx.memory.report(out, parameters=params, with_code=with_code, timeout=timeout, progress=progress)
    if ctx.json:
        print_json(result.to_dict())
        return
    echo(f"Wrote {len(result.pages)} pages to {result.out_dir}; open {result.index}")


@command("doctor")
def doctor_cmd(
    ctx: Ctx,
    repair: Annotated[bool, typer.Option("--repair", help="Rebuild derived files (index.json, .cache/), remove old temp files and finish a killed `cybmem redact`; records and the ledger are otherwise never touched.")] = False,
    secrets: Annotated[bool, typer.Option("--secrets", help="Also scan records and issue titles/details for secrets (reports file, field and kind, never the secret; rewrites nothing).")] = False,
    all_projects: Annotated[bool, typer.Option("--all", help="Check every project of the memory root.")] = False,
    temp_age: Annotated[float, typer.Option("--temp-age", help="Temp files younger than this many seconds may belong to a running writer and are left alone.", min=0)] = 60,
):
    """Check a memory store: records, ledger, index, projects.json, embeddings, cache, temp files.

    Exit 0 when clean, 1 when errors or repairable problems remain (warnings do not count).

    Example: cybmem doctor --all --repair
    """
    report = ctx.memory.doctor(all_projects=all_projects, repair=repair, secrets=secrets, temp_age=temp_age)
    if ctx.json:
        print_json(report.to_dict())
    else:
        echo("\n".join(report.lines()))
    if not report.clean:
        raise typer.Exit(1)

