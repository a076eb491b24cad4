"""The fleet report: its figures, tables and page, written into one directory.

What :meth:`cybmem.exchange.fleet.Fleet.report` computed over every machine, drawn with the figures
of :mod:`cybmem.explore.plots`: ``issue-ages.png``, ``lineage-summary.png``, the two tables as CSV
and ``index.html`` showing them.
"""

from __future__ import annotations

import html
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .. import _io
from ..errors import ValidationError
from . import plots  # at import: a base install says which extra draws them before a directory is made

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .frames import IssueAgeData

__all__ = ["report_dir", "write_fleet_report"]


def report_dir(out: str | os.PathLike) -> Path:
    """``out`` as the report's directory, created with its parents.

    Raises:
        ValidationError: ``out`` is a file.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValidationError(f"{out} is a file; give a directory to write the report into")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_fleet_report(out: Path, *, dataset: str | os.PathLike, lineage: "pd.DataFrame", issue_summary: "pd.DataFrame",
                       ages: "IssueAgeData", now: "pd.Timestamp", machines: int, projects: int, claimed: int = 0,
                       differ: int = 0, skipped: Sequence[str] = ()) -> list[str]:
    """Write the fleet's figures and tables into ``out`` (a :func:`report_dir`), each file atomically.

    Files: ``issue-ages.png`` (:func:`cybmem.explore.plots.issue_age_histograms` over the whole
    fleet), ``lineage-summary.png`` (:func:`cybmem.explore.plots.lineage_summary`, one row per machine
    and project), ``lineage-summary.csv``, ``issue-summary.csv`` and ``index.html`` showing them.

    Args:
        out: the report's directory.
        dataset: the dataset the fleet read (named on the page).
        lineage: the fleet's lineage summary, one row per machine and project.
        issue_summary: the fleet's issue summary, one row per machine and project.
        ages: the fleet's issue-age histograms.
        now: the moment the issue ages were measured to.
        machines, projects: how many (a project exported by two machines is one).
        claimed, differ: run ids exported by more than one (machine, project), and how many of those
            differ between their claimants.
        skipped: one line per part file the fleet left out.

    Returns:
        The files written, in the order above.
    """
    files = []

    def save(name: str, data: bytes) -> None:
        _io.atomic_write(out / name, data)
        files.append(str(out / name))

    def png(fig) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        return buf.getvalue()

    save("issue-ages.png", png(plots.issue_age_histograms(
        ages, title=f"Issue ages across {machines} machine{'s' if machines != 1 else ''} "
                    f"({ages.issues:,} issues, measured at {now:%Y-%m-%d %H:%M} UTC)")))
    save("lineage-summary.png", png(plots.lineage_summary(lineage)))
    save("lineage-summary.csv", lineage.to_csv(index=False).encode())
    save("issue-summary.csv", issue_summary.to_csv(index=False).encode())
    page = _report_html(str(dataset), lineage, issue_summary, ages, now, machines, projects,
                        _claims_html(claimed, differ) + _skipped_html(skipped))
    save("index.html", page.encode())
    return files


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def _report_html(dataset: str, lineage: "pd.DataFrame", summary: "pd.DataFrame", ages: "IssueAgeData",
                 now: "pd.Timestamp", machines: int, projects: int, notes: str) -> str:
    def table(df: "pd.DataFrame") -> str:
        return df.to_html(index=False, border=0, na_rep="-", float_format=lambda v: f"{v:.1f}")

    shown = lineage.assign(firstEnded=lineage["firstEnded"].dt.strftime("%Y-%m-%d"),
                           lastEnded=lineage["lastEnded"].dt.strftime("%Y-%m-%d"))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>cybmem fleet report: {html.escape(dataset)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:80em}} table{{border-collapse:collapse;font-size:90%}}
td,th{{padding:2px 8px;text-align:right}} td:first-child,td:nth-child(2){{text-align:left}} img{{max-width:100%}}</style>
</head><body>
<h1>Fleet report</h1>
<p>Dataset <code>{html.escape(dataset)}</code>: {_plural(int(lineage['runs'].sum()), 'run')} and
{_plural(ages.issues, 'issue')} of {_plural(projects, 'project')} on {_plural(machines, 'machine')}; issue ages measured at
{now:%Y-%m-%d %H:%M} UTC.{notes}</p>
<h2>Issue ages</h2>
<img src="issue-ages.png" alt="Issue-age histograms">
{table(summary)}
<h2>Lineage</h2>
<img src="lineage-summary.png" alt="Runs by state and lineage links per machine and project">
{table(shown)}
</body></html>
"""


def _claims_html(claimed: int, differ: int) -> str:
    if not claimed:
        return ""
    return (f" {_plural(claimed, 'run id')} exported by more than one machine or project count once, for the "
            f"first that exported them ({differ} of them with other records elsewhere).")


def _skipped_html(skipped: Sequence[str]) -> str:
    if not skipped:
        return ""
    return " Left out: " + "; ".join(html.escape(line) for line in skipped) + "."
