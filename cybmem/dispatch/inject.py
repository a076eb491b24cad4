"""What production dispatch calls on every run: the MEMORY block for a new task, put ahead of it.

:func:`inject_task` owns the dispatch rules. Memory off (``CYBERINE_MEMORY=0``) gives the task
back unchanged. Without ``strict`` (what ``cybmem inject`` does) nothing that is wrong with
memory ever fails the dispatcher: the task comes back with whatever block could be built
(possibly none) and each problem is one line in ``warnings``; ``strict=True`` raises instead.

The block (:func:`cybmem.dispatch.preamble.layout`; in full: USAGE.md, "``cybmem inject`` and ``cybmem strip``"):

- **Runs**: the ranking of :func:`cybmem.retrieval.search.search` over the runs with evidence about the
  task (:mod:`cybmem.retrieval.evidence`): up to ``CYBERINE_MEMORY_TOPK`` shown in full (strong
  evidence) and up to ``CYBERINE_MEMORY_POINTERS`` as one-line pointers (weaker evidence), full
  entries first; the parent the dispatcher names (``CYBERINE_PARENT_RUN_ID``) first, in full and
  labelled as the run the task follows up, whatever its score (``pinned: parent``).
- **Issues**: the open issues with evidence about the task, ranked on the runs' axes
  (:mod:`cybmem.retrieval.issue_ranking`), one line per distinct title (the ids of a repeated title
  join it). At most ``CYBERINE_MEMORY_ISSUES``, in at most :data:`ISSUE_SHARE` of the token budget,
  none already on a shown run's ``raised:``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import CybmemError, NotFoundError
from .preamble import Layout, OpenIssue, PreambleEntry, estimate_tokens, inject, layout
from ..store.projects import known_projects
from ..retrieval.evidence import Evidence
from ..retrieval.issue_ranking import ChosenIssue, score_issues
from ..retrieval.search import Hit, SearchResult, search
from ..settings import Settings
from ..store.display import merged_title
from ..store.loading import load_snapshot
from ..store.memory_store import MemoryStore
from ..retrieval.weights import LoadedWeights, Weights, weights_for

__all__ = ["ISSUE_SHARE", "Injection", "inject_task", "memory_block", "shown_order"]

#: The largest share of the token budget the open-issues section may take.
ISSUE_SHARE = 1 / 3


@dataclass
class Injection:
    """The result of :func:`inject_task`: the prompt to dispatch and how it was made."""

    task: str
    block: str
    project: str | None
    warnings: list[str] = field(default_factory=list)
    result: SearchResult | None = field(default=None, repr=False)
    issues: list[ChosenIssue] = field(default_factory=list)  # shown first, then the next ones considered
    open_issues: int = 0
    layout: Layout | None = field(default=None, repr=False)
    weights: LoadedWeights | None = field(default=None, repr=False)
    topk: int = 0
    pointers: int = 0
    max_tokens: int = 0
    issue_cap: int = 0
    evidence: Evidence | None = None  # the task's terms in this store (None: nothing was ranked)
    raised: list[str] = field(default_factory=list)  # open issues on the shown runs' "raised:" lines
    #: Why what the block showed could not be kept in shown.jsonl (cybmem.dispatch.feedback), or None. Never
    #: in ``warnings`` nor ``to_dict``: keeping the log changes nothing inject prints.
    feedback_warning: str | None = None

    @property
    def prompt(self) -> str:
        """The task with the block and one blank line ahead of it (the task alone when there is no block)."""
        return inject(self.task, self.block)

    #: The hits in the order the block shows them (the pinned parent, full entries, pointers).
    shown_order: list[Hit] = field(default_factory=list, repr=False)
    #: How the block shows each of ``shown_order``: "full" or "pointer".
    shown_tiers: list[str] = field(default_factory=list, repr=False)

    @property
    def runs(self) -> list[Hit]:
        """The prior runs shown in the block, in the block's order."""
        shown = self.layout.runs if self.layout is not None else 0
        return self.shown_order[:shown]

    @property
    def relates(self) -> bool:
        """Whether the block shows anything of the project about the task: a run, or an open issue
        in its issues section (a block of only the line saying that nothing relates does not)."""
        return bool(self.runs) or any(i.listed == "issues" for i in self.issues)

    def to_dict(self) -> dict:
        """Everything ``cybmem inject --json`` prints: the prompt and how it was made."""
        out: dict = {"project": self.project, "block": self.block, "task": self.task, "prompt": self.prompt,
                     "warnings": list(self.warnings)}
        lay = self.layout
        out["tokens"] = {
            "block": estimate_tokens(self.block), "budget": self.max_tokens,
            "runs": math.ceil(lay.run_chars / 4) if lay else 0, "issues": math.ceil(lay.issue_chars / 4) if lay else 0,
        }
        out["runs"] = []
        for h, tier in zip(self.runs, self.shown_tiers or ["full"] * len(self.runs)):
            run = h.to_dict(explain=True)
            run["shown"] = tier
            # evidence enough for a full entry, but the runs in full (CYBERINE_MEMORY_TOPK) were taken
            run["cutToPointer"] = tier == "pointer" and h.tier == "full" and h.pinned is None
            out["runs"].append(run)
        if self.evidence is not None:
            from ..retrieval.evidence import COMMON_SHARE, FULL_NATS

            ev = self.evidence
            out["evidence"] = {"terms": ev.terms, "documentFrequency": ev.df.tolist(), "runs": ev.n_docs,
                               "commonAt": ev.common_df, "commonShare": COMMON_SHARE, "fullNats": FULL_NATS,
                               "specific": ev.specific}
            if not self.runs and self.result is not None:
                out["evidence"]["reason"] = ev.reason()
        out["issues"] = [i.to_dict() for i in self.issues]
        out["openIssues"] = self.open_issues
        out["cut"] = {
            "runs": [h.run_id for h in self.shown_order[lay.runs:]] if lay else [],
            "issuesOverBudget": lay.issues_cut if lay else 0,
            "issuesNotShown": max(self.open_issues - (lay.issues if lay else 0), 0),
        }
        out["settings"] = {"topk": self.topk, "pointers": self.pointers, "maxTokens": self.max_tokens, "issues": self.issue_cap,
                           "issueShare": round(ISSUE_SHARE, 4)}
        if self.weights is not None:
            out["weights"] = self.weights.weights.to_dict()
            out["weightSources"] = dict(self.weights.sources)
            iw = self.weights.weights.for_issues()
            out["issueWeights"] = {k: round(getattr(iw, k), 6) for k in ("w_kw", "w_rec", "w_lin")}
            if self.weights.tuned:
                out["tuned"] = self.weights.tuned_note()
        return out


def shown_order(hits: list[Hit], topk: int, pointers: int) -> list[tuple[Hit, str]]:
    """The hits a block shows and how, in its order: the pinned parent (in full), then up to
    ``topk`` runs with strong evidence in full, then up to ``pointers`` weaker ones as pointers
    (a strong run beyond ``topk`` among them), each group in ranking order."""
    pinned = [(h, "full") for h in hits if h.pinned == "parent"]
    rest = [h for h in hits if h.pinned != "parent"]
    full = [h for h in rest if h.tier == "full"][: max(topk - len(pinned), 0)]
    chosen = {id(h) for h in full}
    weak = [(h, "pointer") for h in rest if id(h) not in chosen and h.tier != "out"][:pointers]
    return pinned + [(h, "full") for h in full] + weak


def _build(store: MemoryStore, task: str, settings: Settings, loaded: LoadedWeights, *, as_of: int | None,
           now_ms: int | None, parent_run_id: str | None, chat_session_id: str | None,
           exclude: str | None = None, evidence: bool = True) -> Injection:
    inj = Injection(task, "", store.slug, weights=loaded, topk=settings.topk, pointers=settings.pointers,
                    max_tokens=settings.max_tokens, issue_cap=settings.issues)
    if not store.exists():
        return inj
    snap = load_snapshot(store)
    store.note_problems(snap.problems)  # reported by the caller
    weights = loaded.weights
    # CYBERINE_MEMORY_TOPK=0: no runs at all (the issues alone), pointers included.
    result = search(snap, task, k=settings.topk + settings.pointers if settings.topk else 0, weights=loaded, settings=settings, as_of=as_of,
                    now_ms=now_ms, parent_run_id=parent_run_id, chat_session_id=chat_session_id, exclude=exclude,
                    pin_parent=True, evidence=evidence)
    if result.weights != weights:  # the vector axis' default weight joined (embeddings configured and stored)
        weights = result.weights
        inj.weights = LoadedWeights(weights, {**loaded.sources, "w_vec": "default (embeddings)"}, loaded.problems)
    snap = result.snapshot  # a hit edited in place since it was cached makes search read the store again
    inj.evidence = result.ranked.evidence if result.ranked is not None else None
    ranking = score_issues(result, weights, as_of=as_of) if settings.issues else None
    inj.open_issues = len(ranking) if ranking is not None else len(snap.open_rows(as_of))
    open_ids: set[str] = set()  # of the issues the hits raised, those still open
    if ranking is not None:
        still_open = ranking.with_ids({i for h in result.hits for i in h.issues})
        open_ids = {ranking.issue_id(int(i)) for i in np.flatnonzero(still_open)}
    order = shown_order(result.hits, settings.topk, settings.pointers)
    entries = [
        PreambleEntry(run_id=h.run_id, ended_at_ms=h.ended_at_ms, state=h.state, task=h.task, summary=h.summary,
                      open_issues=[i for i in h.issues if i in open_ids], next=h.next, tier=tier,
                      follows=h.pinned == "parent", terms=h.evidence.specific if h.evidence else ())
        for h, tier in order
    ]
    inj.shown_order = [h for h, _ in order]
    inj.shown_tiers = [tier for _, tier in order]
    nothing = None
    if not entries and inj.evidence is not None:
        nothing = inj.evidence.reason()
    # An open issue a shown run names on its "raised:" line is not listed again: the section
    # brings the next ones. Laid out twice when the budget cuts runs, so that their issues
    # come back.
    shown_runs = len(entries)
    chosen: list[ChosenIssue] = []
    for _ in range(2):
        named = {i for e in entries[:shown_runs] for i in e.open_issues}
        beyond = 0
        if ranking is not None:
            chosen, beyond = ranking.distinct_titles(ranking.with_ids(named), settings.issues)
        # An issue line in full only on evidence: its own text, or the run that carries it shown in full.
        in_full = {e.run_id for e in entries[:shown_runs] if e.tier != "pointer" or e.follows}
        for c in chosen:
            c.tier = "full" if c.own_evidence or c.via in in_full else "pointer"
        shown_issues = [OpenIssue(issue_id=c.ids[0], title=merged_title(c.title, lambda c=c: snap.task_of(c.by_run_id)),
                                  opened_at_ms=c.opened_at_ms, by_run_id=c.by_run_id or "", also=tuple(c.ids[1:]),
                                  tier=c.tier) for c in chosen]
        lay = layout(entries, shown_issues, max_tokens=settings.max_tokens, issue_share=ISSUE_SHARE,
                     more_issues=beyond, nothing=nothing)
        if lay.runs >= shown_runs:
            break
        shown_runs = lay.runs
    for c in chosen[: lay.issues]:
        c.listed = "issues"
    named = {i for e in entries[: lay.runs] for i in e.open_issues}
    rest: list[ChosenIssue] = []
    if ranking is not None:
        leaders = {c.ids[0] for c in chosen}
        for i in ranking.top(max(settings.issues, 5) + len(leaders), ~ranking.related).tolist():
            if len(rest) >= max(settings.issues, 5):
                break
            if ranking.issue_id(i) in leaders:
                continue
            issue = ranking.issue(i)
            if named & set(issue.ids):
                issue.listed = "raised"
            rest.append(issue)
    inj.block, inj.result, inj.layout = lay.text, result, lay
    inj.raised = list(dict.fromkeys(i for e in entries[: lay.runs] for i in e.open_issues))
    inj.issues = chosen + rest
    return inj


def memory_block(
    store: MemoryStore,
    task: str,
    settings: Settings,
    *,
    as_of: int | None = None,
    now_ms: int | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    weights: Weights | None = None,
) -> str:
    """The MEMORY block for a new task ("" when the project has no memory).

    The most relevant prior runs and open issues (module docstring), bounded by
    ``settings.max_tokens``; deterministic for the same store, task and moment.
    """
    loaded = LoadedWeights(weights, {}) if weights is not None else weights_for(settings, store)
    return _build(store, task, settings, loaded, as_of=as_of, now_ms=now_ms, parent_run_id=parent_run_id,
                  chat_session_id=chat_session_id).block


def _no_memory(settings: Settings, cwd, project: str | None) -> str:
    """Why a project has no memory, naming what exists (a typo in the root or the slug shows)."""
    root = settings.memory_dir
    if not root.exists():
        return f"no memory at {root} (nothing written there yet, or a typo in CYBERINE_MEMORY_DIR / --memory-dir)"
    try:
        known = ", ".join(sorted(known_projects(root))) or "none"
    except CybmemError:
        known = "unreadable projects.json"
    where = f"project {project!r}" if project else f"the project at {os.path.abspath(cwd or os.getcwd())}"
    return f"no memory yet for {where} under {root} (known projects: {known})"


def inject_task(
    task: str,
    settings: Settings,
    *,
    cwd: str | os.PathLike | None = None,
    project: str | None = None,
    as_of: int | None = None,
    now_ms: int | None = None,
    parent_run_id: str | None = None,
    chat_session_id: str | None = None,
    weights: Weights | None = None,
    strict: bool = False,
    keep: bool = True,
) -> Injection:
    """The prompt to dispatch for ``task``: the MEMORY block of its project ahead of it.

    Args:
        task: the new run's task (the human text).
        settings: memory root, on/off, top-k, issue cap, token budget, lineage of the new run.
        cwd / project: the project (default: the one of the current directory).
        as_of / now_ms: replay memory as of a moment / measure recency from a moment.
        parent_run_id / chat_session_id: lineage of the new run (default: from ``settings``).
        weights: axis weights (default: what production reads for the project; a broken
            source is skipped with a warning unless ``strict``).
        strict: raise instead of warning when anything is wrong with memory (the project unknown, a
            file that cannot be read, a broken setting).
        keep: append what the block shows to the project's shown.jsonl (cybmem.dispatch.feedback; not for
            a replay with ``as_of``); a failure to is ``feedback_warning``, never an error.

    Returns:
        An :class:`Injection`; ``prompt`` is what to dispatch. Without ``strict`` this never
        raises a :class:`~cybmem.errors.CybmemError` or an OSError: problems become ``warnings``.
    """
    if not settings.enabled:
        return Injection(task, "", project)
    warnings = list(settings.problems)
    if strict and warnings:
        from ..errors import ValidationError

        raise ValidationError(warnings[0])
    try:
        try:
            store = MemoryStore.open(settings, cwd=cwd, project=project)
        except NotFoundError as exc:
            if strict:
                raise NotFoundError(_no_memory(settings, cwd, project)) from exc
            return Injection(task, "", project, warnings + [f"{_no_memory(settings, cwd, project)}; the task goes out without a MEMORY block"])
        loaded = LoadedWeights(weights, {k: "argument" for k in weights.to_dict()}) if weights is not None \
            else weights_for(settings, store, lenient=not strict)
        warnings += loaded.problems
        inj = _build(store, task, settings, loaded, as_of=as_of, now_ms=now_ms, parent_run_id=parent_run_id,
                     chat_session_id=chat_session_id)
        # then the search's: a parent that names no run, the vector axis that fell back
        inj.warnings = warnings + [p.message for p in store.problems] + (inj.result.warnings if inj.result is not None else [])
        if strict and inj.warnings:
            from ..errors import StoreError

            raise StoreError(inj.warnings[0] + (f" (and {len(inj.warnings) - 1} more)" if len(inj.warnings) > 1 else ""))
        if keep and as_of is None and inj.result is not None:  # a block was built (the project has memory)
            from .feedback import keep_block  # what was shown, kept; never raises

            inj.feedback_warning = keep_block(store, inj, settings, now_ms=now_ms)
        return inj
    except (CybmemError, OSError) as exc:
        if strict:
            raise
        return Injection(task, "", project, warnings + [f"memory not injected: {exc}"])
