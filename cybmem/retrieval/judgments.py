"""Relevance judgments and the metrics that score a ranking against them.

A *judgment* says: a run asking ``query`` at moment ``asOf`` should be shown the runs in
``relevant``. Judgments files are JSONL, one object a line::

    {"query": "...", "asOf": 1733000000000, "relevant": ["runId", ...],
     "queryRunId": "...", "parentRunId": "...", "chatSessionId": "..."}   # last three optional

(``../shared/corpora/*/qrels.jsonl`` is one; lines sharing a ``queryRunId`` are merged, their
relevant lists united). :func:`judgments_from_store` derives judgments from a store itself (its
ledger, its lineage, and what runs used of what memory showed them: :func:`used_judgments`);
:func:`judgment_set` is what every front end (``cybmem tune`` and ``eval``, the tuning widget, the
notebook) tunes and scores on: the file the user names, else the derived ones (never a file found
lying in the memory root), with the "used" kind bounded.

Metrics (:data:`METRICS`): MRR@k, nDCG@k (binary gains, ideal DCG over the relevant runs that
existed) and recall@k; :func:`metric_at_k` scores one ranked list (the reference the vectorised
grid of :mod:`cybmem.retrieval.tuning` is tested against).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import ValidationError
from ..store.feedback_log import read_used, valid_used
from ..store.snapshot import Snapshot

__all__ = ["METRICS", "JUDGMENT_KINDS", "ISSUE_KINDS", "Judgment", "kinds_of", "strip_references", "merge_judgments",
           "load_judgments", "save_judgments", "judgments_from_store", "judgment_set", "JudgmentSet", "MAX_USED_SHARE", "derived_source", "check_metric",
           "metric_at_k", "used_judgments", "clock_problem", "CLOCK_SLACK_MS", "MAX_RUN_MS", "WRITE_LAG_MS",
           "MAX_USED_PER_RUN"]

#: metric name -> label; every metric is cut at k.
METRICS = {"mrr": "MRR", "ndcg": "nDCG", "recall": "recall"}
#: what :func:`judgments_from_store` can derive ("used": from the project's used.jsonl, :func:`used_judgments`).
JUDGMENT_KINDS = ("raised", "resolved", "reopened", "parent", "used")


@dataclass(frozen=True)
class Judgment:
    """One query, the moment it is asked, and the runs it should retrieve."""

    query: str
    as_of: int
    relevant: tuple[str, ...]
    query_run_id: str | None = None
    parent_run_id: str | None = None
    chat_session_id: str | None = None
    kind: str | None = None  # informational: "qrels", "issue", "parent", "issue+parent", ...

    @property
    def tests_weights(self) -> bool:
        """False for a judgment the pinned parent answers ("parent", "issue+parent", ...): its relevant
        runs include the run's parent, which dispatch shows first, so it is met whatever the weights."""
        return "parent" not in (self.kind or "").split("+")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Judgment":
        """Parse one judgments-file object (camelCase keys; unknown keys are ignored).

        Raises:
            ValueError: naming the bad field.
        """
        if not isinstance(d, Mapping):
            raise ValueError("a judgment must be a JSON object")
        query, as_of, rel = d.get("query"), d.get("asOf"), d.get("relevant")
        if not isinstance(query, str):
            raise ValueError('"query" must be a string')
        if isinstance(as_of, bool) or not isinstance(as_of, int):
            raise ValueError('"asOf" must be epoch milliseconds (an integer)')
        if not isinstance(rel, list) or not all(isinstance(r, str) and r for r in rel):
            raise ValueError('"relevant" must be a list of run ids')
        opt = {}
        for key, attr in (("queryRunId", "query_run_id"), ("parentRunId", "parent_run_id"),
                          ("chatSessionId", "chat_session_id"), ("kind", "kind")):
            v = d.get(key)
            if v is not None and not isinstance(v, str):
                raise ValueError(f'"{key}" must be a string')
            opt[attr] = v or None
        return cls(query=query, as_of=as_of, relevant=tuple(dict.fromkeys(rel)), **opt)

    def to_dict(self) -> dict[str, Any]:
        """The judgments-file object (optional keys only when set)."""
        out: dict[str, Any] = {"query": self.query, "asOf": self.as_of, "relevant": list(self.relevant)}
        for key, v in (("queryRunId", self.query_run_id), ("parentRunId", self.parent_run_id),
                       ("chatSessionId", self.chat_session_id), ("kind", self.kind)):
            if v:
                out[key] = v
        return out


def _kind_order(kind: str) -> tuple[int, str]:
    return (JUDGMENT_KINDS.index(kind), "") if kind in JUDGMENT_KINDS else (len(JUDGMENT_KINDS), kind)


def merge_judgments(judgments: Iterable[Judgment]) -> list[Judgment]:
    """One judgment per query run and replay (relevant lists united in first-seen order).

    Lines with the same ``query_run_id``, query text and parent are one question asked once (the
    corpora's qrels repeat a query per issue it references); the same run asked another way (its
    task with the issue references taken out, and without its parent, beside its task with the
    parent pinned) stays a judgment of its own, and so does a "used" judgment (what the run used:
    evidence of another kind, scored apart). Judgments without a query run id are kept as they
    are. Order: first occurrence.
    """
    out: list[Judgment] = []
    pos: dict[tuple, int] = {}
    for j in judgments:
        if j.query_run_id is None:
            out.append(j)
            continue
        key = (j.query_run_id, j.query, j.parent_run_id, j.kind == "used")
        i = pos.get(key)
        if i is None:
            pos[key] = len(out)
            out.append(j)
            continue
        m = out[i]
        kinds = sorted({k for k in (m.kind or "").split("+") + (j.kind or "").split("+") if k}, key=_kind_order)
        out[i] = Judgment(query=m.query, as_of=m.as_of, relevant=tuple(dict.fromkeys(m.relevant + j.relevant)),
                          query_run_id=m.query_run_id, parent_run_id=m.parent_run_id or j.parent_run_id,
                          chat_session_id=m.chat_session_id or j.chat_session_id, kind="+".join(kinds) or None)
    return out


def load_judgments(path: str | Path) -> list[Judgment]:
    """Read a judgments JSONL file and merge lines per ``queryRunId``.

    Args:
        path: the file (blank lines are skipped).

    Returns:
        The merged judgments, in file order.

    Raises:
        ValidationError: the file is missing or a line is malformed (naming the line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"judgments file {p} does not exist; write one (JSONL: query, asOf, relevant) "
                              "or leave --judgments out to derive judgments from the store") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"cannot read judgments file {p}: {exc}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Judgment.from_dict(json.loads(line)))
        except (ValueError, TypeError) as exc:
            raise ValidationError(f"{p}:{lineno}: {exc}; each line needs "
                                  '{"query": "...", "asOf": <epoch ms>, "relevant": ["<runId>", ...]}') from None
    return merge_judgments(out)


def save_judgments(judgments: Iterable[Judgment], path: str | Path) -> Path:
    """Write judgments as JSONL (one object a line); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(j.to_dict(), ensure_ascii=False) + "\n" for j in judgments), encoding="utf-8")
    return p


#: The issue events a run can make, by the kind of judgment it gives (a run that merely lists an
#: issue in its outcome "raises" it, as does the run that opens it).
ISSUE_KINDS = ("raised", "resolved", "reopened")
_EVENT_KIND = {"opened": "raised", "resolved": "resolved", "wontfix": "resolved", "reopened": "reopened"}
# A ticket-style issue id, a word and a number (ticket-5207, GH-12, PROJ-123, issue_42): the number
# alone names it too. A slug that merely ends in a number (upgrade-to-react-19) is not one.
_NUMBERED_ID = re.compile(r"^([A-Za-z]+)[-_#]?(\d+)$")


def kinds_of(names: Iterable[str]) -> tuple[str, ...]:
    """The judgment kinds named by ``names`` (``issue`` stands for :data:`ISSUE_KINDS`).

    Raises:
        ValidationError: an unknown kind, naming the known ones.
    """
    out: list[str] = []
    for name in names:
        if name == "issue":
            out += ISSUE_KINDS
        elif name in JUDGMENT_KINDS:
            out.append(name)
        else:
            raise ValidationError(f"unknown judgment kind {name!r}; choose from {', '.join(('issue',) + JUDGMENT_KINDS)}")
    return tuple(dict.fromkeys(out))


_NUMBER_REF = re.compile(r"(?<![\w])(?:[A-Za-z]+(?:[-#]| (?=\d))?|#)?(\d+)(?![\w])")
_SPACES = re.compile(r"[ \t]{2,}")


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def strip_references(text: str, issue_ids: Iterable[str]) -> str:
    """``text`` without the references to ``issue_ids``: each id itself (any case) and, for an id
    that ends in a number (``ticket-5207``), that number standing alone (``#5207``, ``GH-5207``,
    ``fix-5207-crash``).

    A derived judgment links runs by the issue they share; a query that still names the issue
    would let the keyword axis find the link itself, so tuning would measure the id, not the task
    (the corpora's qrels strip references the same way).
    """
    ids = [i for i in dict.fromkeys(issue_ids) if i]
    if not ids:
        return text
    cut: list[tuple[int, int]] = []
    low = text.lower()
    for iid in ids:
        needle, at = iid.lower(), 0
        while (at := low.find(needle, at)) >= 0:
            end = at + len(needle)
            if (at == 0 or not _is_word(low[at - 1])) and (end == len(low) or not _is_word(low[end])):
                cut.append((at, end))
            at = end
    numbers = {m.group(2) for m in map(_NUMBERED_ID.match, ids) if m}
    if numbers:
        cut += [m.span() for m in _NUMBER_REF.finditer(text) if m.group(1) in numbers]
    if not cut:
        return text
    out, pos = [], 0
    for a, b in sorted(cut):
        if a >= pos:
            out.append(text[pos:a])
            out.append(" ")
            pos = b
        elif b > pos:
            pos = b
    out.append(text[pos:])
    return _SPACES.sub(" ", "".join(out)).strip()


def judgments_from_store(snapshot: Snapshot, *, kinds: Sequence[str] = JUDGMENT_KINDS,
                         as_of: int | None = None, warnings: list[str] | None = None,
                         left_out: dict[str, int] | None = None) -> list[Judgment]:
    """Judgments a store implies about itself, merged per query run.

    Kinds (:data:`JUDGMENT_KINDS`; ``issue`` in ``kinds`` stands for the first three):

    - ``"raised"``, ``"resolved"``, ``"reopened"``: a run R that raises an issue (opens it or
      lists it in its outcome), resolves it (or marks it wontfix) or reopens it should have been
      shown the runs that already carried that issue when R started: the runs that opened or
      reopened it and the runs whose outcome lists it, when they ended before R started. The query
      is R's task with the references to R's issues taken out (:func:`strip_references`), asked at
      R's start, with R's chat session but not its parent (see below).
    - ``"parent"``: a run C dispatched by parent P (P ended before C started), asked with C's
      task and ``parentRunId=P``, should retrieve P: the plan it executes. Dispatch shows the
      parent first (:func:`cybmem.retrieval.search.rank_query`'s ``pin_parent``), and tuning replays
      that, so these judgments are always met: they check the pin and move no weight.
    - ``"used"``: a run that used runs memory showed it (its output names them, it fetched them
      through ``cybmem mcp``: the project's used.jsonl, :func:`used_judgments`)
      should have been shown them first; asked with its task, as text alone.

    The issue kinds leave the parent out: where a parent is the run that carried the same issue
    (a follow-up), the link and the lineage are one signal, and lineage would decide the weights
    (dispatch shows that parent first anyway). previousRunId links are not used: "the latest run of
    the project" says nothing about relevance. Corrections (records that supersede another) are
    not used as queries.

    Args:
        snapshot: the project's snapshot.
        kinds: a subset of :data:`JUDGMENT_KINDS` (or ``issue``).
        as_of: only what was known then: query runs that had ended, ledger events up to then.
        warnings, left_out: what :func:`used_judgments` skipped or left out
            of the "used" kind (malformed used.jsonl lines; runs whose clock is implausible).

    Returns:
        Merged judgments, in the order their query runs started.
    """
    kinds = kinds_of(kinds)
    r = snapshot.records
    if r.num_rows == 0:
        return []
    ids = r.column("runId").to_pylist()
    tasks = r.column("task").to_pylist()
    started = r.column("startedAt").cast(pa.int64()).to_pylist()
    ended = r.column("endedAt").cast(pa.int64()).to_pylist()
    parents = r.column("parentRunId").to_pylist()
    chats = r.column("chatSessionId").to_pylist()
    corrections = r.column("supersedes").to_pylist()
    issue_lists = r.column("issues").to_pylist()
    known = [as_of is None or e <= as_of for e in ended]
    row = {rid: i for i, rid in enumerate(ids) if known[i]}
    out: list[tuple[int, Judgment]] = []

    def add(i: int, relevant: list[str], kind: str, query: str, parent: str | None) -> None:
        rel = [x for x in dict.fromkeys(relevant) if x != ids[i] and x in row and ended[row[x]] <= started[i]]
        if rel and not corrections[i]:
            out.append((started[i], Judgment(query=query, as_of=started[i], relevant=tuple(rel), query_run_id=ids[i],
                                             parent_run_id=parent, chat_session_id=chats[i], kind=kind)))

    wanted = [k for k in ISSUE_KINDS if k in kinds]
    if wanted:
        # Who carried each issue (opened / reopened it, or lists it), and what each run did to which issue.
        carriers: dict[str, list[str]] = {}
        did: dict[int, dict[str, str]] = {}  # row -> issue -> kind (resolved and reopened win over raised)
        for i, issues in enumerate(issue_lists):
            if known[i]:
                for iss in issues or ():
                    carriers.setdefault(iss, []).append(ids[i])
                    did.setdefault(i, {}).setdefault(iss, "raised")
        ev = snapshot.events
        if ev.num_rows:
            ats = ev.column("at").cast(pa.int64()).to_pylist()
            for issue, event, by, at in zip(ev.column("issueId").to_pylist(), ev.column("event").to_pylist(),
                                            ev.column("byRunId").to_pylist(), ats):
                if (as_of is not None and at > as_of) or by not in row:
                    continue
                kind = _EVENT_KIND.get(event)
                if kind is None:
                    continue
                if event in ("opened", "reopened"):
                    carriers.setdefault(issue, []).append(by)
                mine = did.setdefault(row[by], {})
                if mine.get(issue, "raised") == "raised":
                    mine[issue] = kind
        for i in sorted(did):
            query = strip_references(tasks[i], did[i])
            for issue, kind in did[i].items():
                if kind in wanted:
                    add(i, carriers.get(issue, []), kind, query, None)
    if "parent" in kinds:
        for i, p in enumerate(parents):
            if p and known[i]:
                add(i, [p], "parent", tasks[i], p)
    if "used" in kinds:
        out += [(t, j) for t, j in used_judgments(snapshot, as_of=as_of, warnings=warnings, left_out=left_out)
                if not corrections[row[j.query_run_id]]]
    out.sort(key=lambda t: t[0])
    return merge_judgments(j for _, j in out)


#: A "used" judgment counts only when the run's clock is plausible: its record written within
#: :data:`WRITE_LAG_MS` after it ended (and not before, beyond :data:`CLOCK_SLACK_MS` of skew), the
#: run no longer than :data:`MAX_RUN_MS`, and what it was shown shown while it ran. write accepts
#: any startedAt, so a run could otherwise place its judgment at any moment it likes (300 runs
#: backdated to just after a chosen moment got weights saved that lost on the store's own judgments).
CLOCK_SLACK_MS = 15 * 60_000
MAX_RUN_MS = 24 * 3_600_000
WRITE_LAG_MS = 24 * 3_600_000
#: Runs one run's "used" judgment names at most (its best-ranked ones): one run cannot outweigh many.
MAX_USED_PER_RUN = 3


def clock_problem(line: Mapping[str, Any], started: int, ended: int) -> str | None:
    """Why a used.jsonl ``line`` of a run that started and ended then cannot be a judgment (None: it can)."""
    at, span = line["at"], line.get("shownAt")
    if not 0 <= ended - started <= MAX_RUN_MS:
        return "clock"  # ends before it starts, or runs longer than a day
    if not ended - CLOCK_SLACK_MS <= at <= ended + WRITE_LAG_MS:
        return "clock"  # written before it ended, or long after
    if span is not None and not (started - CLOCK_SLACK_MS <= span[0] and span[1] <= ended + CLOCK_SLACK_MS):
        return "clock"  # shown what it used outside its own run
    return None


def used_judgments(snapshot: Snapshot, *, as_of: int | None = None,
                   used: Iterable[Mapping[str, Any]] | None = None, warnings: list[str] | None = None,
                   left_out: dict[str, int] | None = None) -> list[tuple[int, Judgment]]:
    """The "used" judgments: a run R that used runs it was shown should have been shown them
    first. Query: R's task as its record holds it (as dispatched, less the block); asOf: R's
    start; relevant: the runs it used that had ended by then (its best-ranked
    :data:`MAX_USED_PER_RUN`); R's chat session, not its parent (asked as text alone, as the issue
    kinds are: see :func:`judgments_from_store`). A run whose clock is
    not plausible (:func:`clock_problem`) gives none.

    Args:
        snapshot: the project.
        as_of: only what was known then: lines written and runs ended by then.
        used: the used.jsonl lines (default: the project's file).
        warnings: gets one line when malformed used.jsonl lines were skipped.
        left_out: counts what was left out, by why: ``clock`` (judgments), ``capped`` (used runs).

    Returns:
        (R's start, the judgment), in file order; runs without a readable record, or whose used
        runs had not ended when they started, give none.
    """
    r = snapshot.records
    if used is None:
        used = read_used(snapshot.store.dir, warnings=warnings) if snapshot.store is not None else []
    else:
        used = valid_used(used)
    if r.num_rows == 0:
        return []
    left_out = {} if left_out is None else left_out
    ids = r.column("runId").to_pylist()
    row = {rid: i for i, rid in enumerate(ids)}
    tasks, chats = r.column("task").to_pylist(), r.column("chatSessionId").to_pylist()
    started = r.column("startedAt").cast("int64").to_pylist()
    ended = r.column("endedAt").cast("int64").to_pylist()
    out = []
    for d in used:
        i = row.get(d["runId"])
        if i is None or (as_of is not None and (ended[i] > as_of or d["at"] > as_of)):
            continue
        rel = [u["runId"] for u in d.get("used") or [] if u["runId"] in row
               and u["runId"] != ids[i] and ended[row[u["runId"]]] <= started[i]]
        rel = list(dict.fromkeys(rel))
        if not rel:
            continue
        if (why := clock_problem(d, started[i], ended[i])) is not None:
            left_out[why] = left_out.get(why, 0) + 1
            continue
        if len(rel) > MAX_USED_PER_RUN:
            left_out["capped"] = left_out.get("capped", 0) + len(rel) - MAX_USED_PER_RUN
        out.append((started[i], Judgment(query=tasks[i], as_of=started[i], relevant=tuple(rel[:MAX_USED_PER_RUN]),
                                         query_run_id=ids[i], chat_session_id=chats[i], kind="used")))
    return out


#: "used" judgments are at most this share of the judgments that test the weights
#: (:attr:`Judgment.tests_weights`): the rest must come from the store's own history (the ledger and
#: the lineage), which no run can write by fetching. Those the pinned parent answers do not count
#: as the store's: they are met whatever the weights, so they could not hold any weights back.
MAX_USED_SHARE = 0.5


@dataclass
class JudgmentSet:
    """The judgments a tuning, an evaluation, the tuning widget or the notebook rest on (one rule:
    :func:`judgment_set`), where they came from, and what was left out."""

    judgments: list[Judgment]
    source: str  # for people: "from <path>", "given" or "derived from project <slug> (<n> <kind>, ...)"
    derived: bool
    history: list[Judgment]  # derived: the judgments of the store's own history (every kind but "used")
    left_out: dict[str, int]  # "used" judgments left out: clock (implausible), share (past MAX_USED_SHARE); capped runs
    warnings: list[str]  # e.g. malformed used.jsonl lines skipped


def judgment_set(snapshot: Snapshot, judgments: Sequence[Judgment] | str | Path | None = None, *,
                 kinds: Sequence[str] = JUDGMENT_KINDS, as_of: int | None = None) -> JudgmentSet:
    """The judgments to tune or score on: a list, a JSONL file the user names, or (None) those the
    store implies (:func:`judgments_from_store` with ``kinds``). Never a file found lying in the
    store: a ``qrels.jsonl`` in the memory root is no part of the store, so it is used only when named.

    Derived "used" judgments are at most :data:`MAX_USED_SHARE` of the judgments that test the
    weights: when they outnumber the store's own judgments that do (every kind but "used", derived
    whatever ``kinds`` asks for, less those the pinned parent answers: :attr:`Judgment.tests_weights`),
    an even spread of them in time is kept, as many as those.

    Raises:
        ValidationError: a named file is missing or malformed (naming the line).
    """
    if judgments is not None:
        if isinstance(judgments, (str, Path)):
            return JudgmentSet(load_judgments(judgments), f"from {judgments}", False, [], {}, [])
        return JudgmentSet(merge_judgments(judgments), "given", False, [], {}, [])
    kinds = kinds_of(kinds)
    warnings: list[str] = []
    left_out: dict[str, int] = {}
    js = judgments_from_store(snapshot, kinds=kinds, as_of=as_of, warnings=warnings, left_out=left_out)
    history = [j for j in js if j.kind != "used"]
    if "used" in kinds:
        others = [k for k in JUDGMENT_KINDS if k != "used"]
        if set(others) - set(kinds):
            history = judgments_from_store(snapshot, kinds=others, as_of=as_of)
        used = [j for j in js if j.kind == "used"]
        own = sum(j.tests_weights for j in history)
        room = int(own * MAX_USED_SHARE / (1 - MAX_USED_SHARE))
        if len(used) > room:
            keep = {id(used[int(i)]) for i in _spread(len(used), room)}
            left_out["share"] = len(used) - room
            js = [j for j in js if j.kind != "used" or id(j) in keep]
    return JudgmentSet(js, derived_source(snapshot.store.slug, js), True, history, left_out, warnings)


def _spread(n: int, m: int) -> list[int]:
    """``m`` positions spread evenly over ``range(n)`` (first and last included when m > 1)."""
    if m <= 0:
        return []
    if m == 1:
        return [n // 2]
    return sorted({round(i * (n - 1) / (m - 1)) for i in range(m)})


def derived_source(slug: str, judgments: Iterable[Judgment]) -> str:
    """``derived from project web (14 parent, 9 resolved)``: where derived judgments come from, for people."""
    counts: dict[str, int] = {}
    for j in judgments:
        counts[j.kind or "?"] = counts.get(j.kind or "?", 0) + 1
    return f"derived from project {slug} (" + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none") + ")"


def check_metric(metric: str, k: int) -> None:
    if metric not in METRICS:
        raise ValidationError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    if k < 1:
        raise ValidationError(f"k must be at least 1, got {k}")


def metric_at_k(ranked: Sequence[str], relevant: Iterable[str], *, metric: str = "mrr", k: int = 10) -> float:
    """One query's metric from its ranked run ids.

    Args:
        ranked: run ids, best first (only the first ``k`` are looked at).
        relevant: the relevant run ids (those that could have been retrieved).
        metric: ``mrr`` (1/rank of the first relevant within k), ``ndcg`` (binary gains,
            DCG = sum 1/log2(rank+1), divided by the ideal DCG of min(|relevant|, k) hits) or
            ``recall`` (share of the relevant found within k).
        k: the cut-off.

    Returns:
        A value in [0, 1]; 0 when ``relevant`` is empty.
    """
    check_metric(metric, k)
    rel = set(relevant)
    if not rel:
        return 0.0
    ranks = [i for i, rid in enumerate(list(ranked)[:k], 1) if rid in rel]
    if metric == "mrr":
        return 1.0 / ranks[0] if ranks else 0.0
    if metric == "recall":
        return len(ranks) / len(rel)
    ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(rel), k) + 1))
    return sum(1.0 / math.log2(r + 1) for r in ranks) / ideal
