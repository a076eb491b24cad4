"""What ``cybmem doctor`` found: each finding (where, what, how bad), what was checked in each
project, and the report of a check as JSON and as the lines a person reads.

Severities: ``error`` needs a person and is never changed by ``--repair``; ``repairable`` is derived
state that ``--repair`` rebuilds; ``warning`` is reported, harmless and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store.projects import PROJECTS_FILE

__all__ = ["SEVERITIES", "DoctorReport", "Finding", "ProjectStats", "finding_line"]

SEVERITIES = ("error", "repairable", "warning")


@dataclass
class Finding:
    """One thing doctor found: where, what, how bad; for secrets also the field and kind."""

    check: str
    severity: str
    path: str
    message: str
    project: str | None = None
    field: str | None = None
    kind: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ProjectStats:
    """What was checked in one project."""

    slug: str
    records: int = 0
    unreadable: int = 0
    events: int = 0
    embeddings: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class DoctorReport:
    """The result of a check (after repairs, when asked)."""

    root: str
    projects: list[ProjectStats]
    findings: list[Finding]
    repaired: list[str] = field(default_factory=list)
    secrets_scanned: bool = False
    not_repaired: list[str] = field(default_factory=list)  # repairs tried that failed, each with why

    @property
    def problems(self) -> list[Finding]:
        """Findings that make the store not clean (errors and repairable ones)."""
        return [f for f in self.findings if f.severity != "warning"]

    @property
    def clean(self) -> bool:
        """No error or repairable finding, and every repair tried was done."""
        return not self.problems and not self.not_repaired

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "clean": self.clean,
            "projects": [p.to_dict() for p in self.projects],
            "findings": [f.to_dict() for f in self.findings],
            "repaired": list(self.repaired),
            "notRepaired": list(self.not_repaired),
            "secretsScanned": self.secrets_scanned,
            "counts": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
        }

    def lines(self) -> list[str]:
        """The human report: one block per project, then a one-line summary."""
        out = [f"Memory root: {self.root}"]
        by_project: dict[str | None, list[Finding]] = {}
        for f in self.findings:
            by_project.setdefault(f.project, []).append(f)
        for action in self.repaired:
            out.append(f"repaired: {action}")
        for action in self.not_repaired:
            out.append(f"not repaired: {action}")
        root_findings = by_project.get(None, [])
        out.append(f"{PROJECTS_FILE}: " + ("ok" if not root_findings else f"{len(root_findings)} finding(s)"))
        out += [finding_line(f) for f in root_findings]
        for p in self.projects:
            found = by_project.get(p.slug, [])
            head = f"{p.slug}: {p.records} records, {p.events} ledger events"
            if p.embeddings:
                head += f", {p.embeddings} embeddings"
            out.append(head + (": ok" if not found else ""))
            out += [finding_line(f) for f in found]
        errors = sum(f.severity == "error" for f in self.findings)
        fixable = sum(f.severity == "repairable" for f in self.findings)
        warnings = sum(f.severity == "warning" for f in self.findings)
        records = sum(p.records for p in self.projects)
        checked = f"{len(self.projects)} project(s), {records} records"
        tail = f", {warnings} warning(s)" if warnings else ""
        if self.clean:
            out.append(f"clean: {checked} checked{tail}.")
        else:
            parts = []
            if errors:
                parts.append(f"{errors} error(s) to fix by hand")
            if fixable:
                parts.append(f"{fixable} repairable (run `cybmem doctor --repair`)")
            if self.not_repaired:
                parts.append(f"{len(self.not_repaired)} repair(s) failed (see above)")
            out.append(f"problems: {', '.join(parts)}{tail}; {checked} checked.")
        return out


def finding_line(f: Finding) -> str:
    where = f.path
    if f.field:
        where += f" [{f.field}]"
    return f"  {f.severity:<10} {where}: {f.message}"
