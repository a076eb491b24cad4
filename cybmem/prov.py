"""W3C PROV provenance of a project's history, built with the ``prov`` package (PROV-JSON, PROV-N).

The store already is a provenance trail (records are append-only, lineage links runs, the ledger
says which run changed which issue); this module says it in the W3C PROV data model, in the spirit
of PROV-AGENT (arXiv:2508.02866), so PROV tools can read it. Identifiers live in the ``cybmem``
namespace (:data:`NAMESPACE`) and carry the project slug, so documents of several projects merge.
Runs are activities; tasks, records, outcomes and each open period of an issue are entities;
workers are agents. The full mapping: USAGE.md, "W3C PROV". Only runs in the document are
referenced; an issue close with no open period before it (a ledger cut short) closes a period
with no generation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from .errors import CybmemError, ValidationError
from .store import MemoryStore

if TYPE_CHECKING:  # pragma: no cover
    from prov.model import ProvDocument

__all__ = ["NAMESPACE", "PREFIX", "provenance", "prov_counts", "export_prov", "ProvSummary"]

PREFIX = "cybmem"
NAMESPACE = "urn:cybmem:"
_INSTALL_HINT = "the `prov` package is needed for PROV exports: pip install 'cybmem[export]'"


def _prov_model():
    try:
        import prov.model as pm
    except ImportError:
        raise CybmemError(_INSTALL_HINT) from None
    return pm


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _part(text: str) -> str:
    """A safe piece of a qualified name's local part (run and issue ids are already safe)."""
    return quote(text, safe="-_.~")


def _chain_ids(store: MemoryStore, run: str) -> set[str]:
    from .lineage import chain

    result = chain(store, store.resolve_run_id(run))
    return {e["runId"] for e in result.runs}


def provenance(
    stores: MemoryStore | Iterable[MemoryStore],
    *,
    chain: str | None = None,
) -> "ProvDocument":
    """The history of one or more projects (or of one chain) as a PROV document.

    Args:
        stores: a project's store, or several (their documents are merged; ids carry the slug).
        chain: a run id (or unique prefix): only the runs of its ``previousRunId`` chain, walked both
            ways, and the issues those runs opened or closed. Needs exactly one store.

    Returns:
        A ``prov.model.ProvDocument``; serialize it with ``doc.serialize(format="json")``
        (PROV-JSON) or ``doc.get_provn()`` (PROV-N). See the module docstring for the mapping.

    Raises:
        CybmemError: the ``prov`` package is not installed (``pip install 'cybmem[export]'``).
        NotFoundError / AmbiguousError: ``chain`` names no run, or several.
    """
    pm = _prov_model()
    stores = [stores] if isinstance(stores, MemoryStore) else list(stores)
    if chain is not None and len(stores) != 1:
        raise ValidationError("a chain is a walk inside one project: give one project with --chain")
    doc = pm.ProvDocument()
    ns = doc.add_namespace(PREFIX, NAMESPACE)
    for store in stores:
        _add_project(doc, ns, pm, store, _chain_ids(store, chain) if chain is not None else None)
    return doc


def _add_project(doc, ns, pm, store: MemoryStore, only: set[str] | None) -> None:
    slug = _part(store.slug)
    recs = store.records()  # oldest first
    if only is not None:
        recs = [r for r in recs if r.runId in only]
    ids = {r.runId: r for r in recs}
    PROV = pm.PROV

    def run(rid: str):
        return ns[f"{slug}/run/{rid}"]

    def record(rid: str):
        return ns[f"{slug}/record/{rid}"]

    chats: set[str] = set()
    agents: set = set()
    for r in recs:
        rid = r.runId
        attrs = [(PROV["type"], ns["Run"]), (ns["state"], r.state), (ns["workflowName"], r.workflowName),
                 (PROV["label"], r.task.strip().splitlines()[0][:120] if r.task.strip() else rid)]
        if r.lineage.rootRunId:
            attrs.append((ns["rootRunId"], r.lineage.rootRunId))
        doc.activity(run(rid), _dt(r.startedAt), _dt(r.endedAt), attrs)

        task = doc.entity(ns[f"{slug}/task/{rid}"], [(PROV["type"], ns["Task"]), (PROV["value"], r.task)])
        doc.used(run(rid), task, _dt(r.startedAt))

        rec_attrs = [(PROV["type"], ns["Record"]), (ns["runId"], rid), (ns["cwd"], r.cwd),
                     (PROV["location"], f"{store.slug}/records/{rid}.json")]
        doc.entity(record(rid), rec_attrs)
        doc.wasGeneratedBy(record(rid), run(rid), _dt(r.endedAt))

        out = r.outcome
        out_attrs = [(PROV["type"], ns["Outcome"]), (ns["summary"], out.summary)]
        out_attrs += [(ns["accomplished"], x) for x in out.accomplished]
        out_attrs += [(ns["issue"], x) for x in out.issues]
        out_attrs += [(ns["next"], x) for x in out.next]
        if r.verdictSummary:
            out_attrs.append((ns["verdict"], r.verdictSummary))
        outcome = doc.entity(ns[f"{slug}/outcome/{rid}"], out_attrs)
        doc.wasGeneratedBy(outcome, run(rid), _dt(r.endedAt))

        for w in r.workers:
            agent_id = ns[f"{slug}/worker/{rid}/{_part(w.agentId)}"]
            agent_attrs = [(PROV["type"], PROV["SoftwareAgent"]), (PROV["type"], ns["Worker"]),
                           (ns["agentId"], w.agentId), (ns["state"], w.state)]
            if w.provider:
                agent_attrs.append((ns["provider"], w.provider))
            if agent_id not in agents:
                agents.add(agent_id)
                doc.agent(agent_id, agent_attrs)
            doc.wasAssociatedWith(run(rid), agent_id, other_attributes=[(ns["state"], w.state)])

        lin = r.lineage
        if lin.previousRunId and lin.previousRunId in ids and lin.previousRunId != rid:
            doc.wasInformedBy(run(rid), run(lin.previousRunId), other_attributes=[(PROV["type"], ns["previousRun"])])
        if lin.parentRunId and lin.parentRunId in ids and lin.parentRunId != rid:
            doc.wasInformedBy(run(rid), run(lin.parentRunId), other_attributes=[(PROV["type"], ns["parentRun"])])
        if lin.chatSessionId:
            chat_id = ns[f"{slug}/chat/{_part(lin.chatSessionId)}"]
            if lin.chatSessionId not in chats:
                chats.add(lin.chatSessionId)
                doc.activity(chat_id, other_attributes=[(PROV["type"], ns["ChatSession"]),
                                                        (ns["chatSessionId"], lin.chatSessionId)])
            doc.wasStartedBy(run(rid), starter=chat_id, time=_dt(r.startedAt))

    # Supersession: the store's one fold (old -> new), both directions honoured; links to missing runs ignored.
    for old, new in sorted(store.superseded_map().items()):
        if old in ids and new in ids and old != new:
            doc.wasRevisionOf(record(new), record(old), activity=run(new))
            doc.wasInvalidatedBy(record(old), run(new), _dt(ids[new].endedAt))

    _add_issues(doc, ns, pm, store, slug, ids, only)


@dataclass
class _IssueLife:
    periods: int = 0
    open: bool = False


def _add_issues(doc, ns, pm, store: MemoryStore, slug: str, ids: dict, only: set[str] | None) -> None:
    PROV = pm.PROV
    events = store.issue_events()  # file order
    if only is not None:
        touched = {e.issueId for e in events if e.byRunId in only}
        events = [e for e in events if e.issueId in touched]
    lives: dict[str, _IssueLife] = {}

    def issue_entity(iid: str, title: str | None) -> None:
        attrs = [(PROV["type"], ns["Issue"]), (ns["issueId"], iid)]
        if title:
            attrs.append((PROV["label"], title))
        doc.entity(ns[f"{slug}/issue/{iid}"], attrs)

    def relation_attrs(e) -> list:
        attrs = [(ns["event"], e.event)]
        if e.byRunId:
            attrs.append((ns["byRunId"], e.byRunId))
        if e.detail:
            attrs.append((ns["detail"], e.detail))
        return attrs

    def start_period(e, life: _IssueLife, *, generated: bool) -> None:
        life.periods += 1
        n = life.periods
        sid = ns[f"{slug}/issue/{e.issueId}/{n}"]
        attrs = [(PROV["type"], ns["IssueState"]), (ns["issueId"], e.issueId), (ns["period"], n)]
        doc.entity(sid, attrs)
        doc.specializationOf(sid, ns[f"{slug}/issue/{e.issueId}"])
        activity = ns[f"{slug}/run/{e.byRunId}"] if e.byRunId in ids else None
        if generated:
            doc.wasGeneratedBy(sid, activity, _dt(e.at), other_attributes=relation_attrs(e))
        if n > 1:
            doc.wasRevisionOf(sid, ns[f"{slug}/issue/{e.issueId}/{n - 1}"], activity=activity if generated else None)
        life.open = True

    for e in events:
        life = lives.get(e.issueId)
        if life is None:
            life = lives[e.issueId] = _IssueLife()
            issue_entity(e.issueId, e.title)
        if e.event in ("opened", "reopened"):
            if not life.open:
                start_period(e, life, generated=True)
        elif life.open or life.periods == 0:
            if life.periods == 0:
                start_period(e, life, generated=False)  # closed before any opening we know of
            activity = ns[f"{slug}/run/{e.byRunId}"] if e.byRunId in ids else None
            doc.wasInvalidatedBy(ns[f"{slug}/issue/{e.issueId}/{life.periods}"], activity, _dt(e.at),
                                 other_attributes=relation_attrs(e))
            life.open = False


# --- counting and writing ---------------------------------------------------------------------

_KINDS = {
    "ProvActivity": "activities",
    "ProvEntity": "entities",
    "ProvAgent": "agents",
}


def prov_counts(doc: "ProvDocument") -> dict[str, int]:
    """How many elements and relations of each PROV kind a document holds.

    Keys: ``activities``, ``entities``, ``agents`` and one per relation named as in PROV-N
    (``wasGeneratedBy``, ``used``, ``wasInformedBy``, ``wasRevisionOf``, ...), plus ``relations``
    (their sum).
    """
    pm = _prov_model()
    out: dict[str, int] = {"activities": 0, "entities": 0, "agents": 0}
    relations = 0
    for rec in doc.get_records():
        name = type(rec).__name__
        if name in _KINDS:
            out[_KINDS[name]] += 1
        else:
            key = pm.PROV_N_MAP[rec.get_type()]
            if key == "wasDerivedFrom" and pm.PROV["Revision"] in rec.get_asserted_types():
                key = "wasRevisionOf"  # PROV-JSON writes it as a typed wasDerivedFrom
            out[key] = out.get(key, 0) + 1
            relations += 1
    out["relations"] = relations
    return out


@dataclass
class ProvSummary:
    """What :func:`export_prov` wrote."""

    projects: list[str]
    chain: str | None
    files: dict[str, str] = field(default_factory=dict)  # format -> path
    counts: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"format": "prov", "projects": self.projects, "chain": self.chain, "files": self.files,
                "counts": self.counts, "warnings": self.warnings, "seconds": round(self.seconds, 3)}


def provn_path(out: str | os.PathLike) -> Path:
    """Where ``--provn`` writes PROV-N next to the PROV-JSON file: the same name with ``.provn``."""
    path = Path(out)
    return path.with_suffix(".provn") if path.suffix != ".provn" else path.with_name(path.name + ".provn")


def export_prov(
    stores: MemoryStore | Iterable[MemoryStore],
    out: str | os.PathLike,
    *,
    chain: str | None = None,
    provn: bool = False,
    force: bool = False,
) -> ProvSummary:
    """Write :func:`provenance` as PROV-JSON to ``out`` (and PROV-N to :func:`provn_path` with ``provn``).

    Files are written to a temp file and renamed into place; what ``out`` may not be (a link, a
    device, a path inside the memory root, an existing file without ``force``) is
    :func:`cybmem.export.check_out`'s rule, checked for both files before either is written.
    """
    from .export import Sink, check_out, note_export  # one atomic-file writer for every export

    started = time.perf_counter()
    stores = [stores] if isinstance(stores, MemoryStore) else list(stores)
    if not stores:
        raise ValidationError("nothing to export: no project given (see `cybmem projects`)")
    path = Path(out)
    roots = [s.root for s in stores]
    for p in [path] + ([provn_path(path)] if provn else []):
        check_out(p, force=force, roots=roots)
    doc = provenance(stores, chain=chain)
    summary = ProvSummary([s.slug for s in stores], chain)
    note_export(stores, {"format": "prov", "out": str(path), "all": len(stores) > 1, "chain": chain, "provn": provn},
                summary.warnings)
    with Sink(path, force=force, roots=roots) as fh:
        fh.write(doc.serialize(format="json").encode("utf-8"))
    summary.files["json"] = str(path)
    if provn:
        npath = provn_path(path)
        with Sink(npath, force=force, roots=roots) as fh:
            fh.write(doc.get_provn().encode("utf-8") + b"\n")
        summary.files["provn"] = str(npath)
    summary.counts = prov_counts(doc)
    summary.warnings += [f"{s.slug}: {p.message}" for s in stores for p in s.problems]
    summary.seconds = time.perf_counter() - started
    return summary
