"""The commands of the dispatch path: ``search``, ``inject`` (the MEMORY block ahead of a task: it never
fails the dispatcher), ``strip`` and ``embed``; each calls one library function and renders its answer."""

from __future__ import annotations

import select
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..answers import subject_line
from ..memory import Memory
from .framework import AsOfOpt, Ctx, OffsetOpt, command, moment
from .render import echo, fmt_axes, no_match, print_json, table, warn, when, write_exact

__all__ = ["search_cmd", "inject_cmd", "strip_cmd", "embed_cmd"]


ParentOpt = Annotated[Optional[str], typer.Option("--parent", help="Parent run id of the run being dispatched, or a unique prefix of it (default: $CYBERINE_PARENT_RUN_ID).")]
ChatOpt = Annotated[Optional[str], typer.Option("--chat", help="Chat session id (default: $CYBERINE_CHAT_SESSION_ID).")]


def _task_text(task: Optional[str], file: Optional[Path]) -> str:
    if task is not None and file is not None:
        raise typer.BadParameter("give the task as an argument or with --file, not both", param_hint="TASK")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc.strerror or exc}", param_hint="--file") from None
    if task is None or task == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise typer.BadParameter("give the task as an argument, with --file, or on stdin", param_hint="TASK")
        return sys.stdin.read()
    return task


def _stdin_holds_input() -> bool:
    """Whether stdin holds text for an optional input (``inject --system``): a file, or a pipe
    with data or its end already there. A terminal does not, nor a pipe nobody has written to
    (a dispatcher that leaves its child's stdin open): reading it would wait for ever."""
    if sys.stdin is None or sys.stdin.isatty():
        return False
    try:
        return bool(select.select([sys.stdin], [], [], 0)[0])
    except (OSError, ValueError):  # no file descriptor (a test runner's stdin): it was given
        return True



@command("search", filters=True, free_text=True, quick=True)
def search_cmd(
    ctx: Ctx,
    query: Annotated[str, typer.Argument(help="What to look for (free text, e.g. the new task).")],
    k: Annotated[int, typer.Option("-k", "--top", "--limit", help="How many results.", min=1)] = 10,
    offset: OffsetOpt = 0,
    explain_: Annotated[bool, typer.Option("--explain", help="Show each result's per-axis contributions and the weights, and the learned ranker's score with the features that moved it most, by their tree SHAP values (--json: every feature's value and tree SHAP value).")] = False,
    as_of: AsOfOpt = None,
    parent: ParentOpt = None,
    chat: ChatOpt = None,
    f: Any = None,
):
    """Multi-axis scored search over a project's records (BM25 + recency + lineage).

    Filters (--state, --since, --until, --grep, --agent, --issue) narrow the candidates before
    ranking; --offset skips the first results (the next page).

    Example: cybmem search "flaky cart drawer test" -k 5 --explain --since 2026-10-01
    """
    store = ctx.memory.store()
    result = ctx.memory.search(query, project=store, k=k, offset=offset, as_of=moment(as_of, "--as-of"),
                               parent_run_id=parent, chat_session_id=chat, filter=f)
    warn(p.message for p in result.snapshot.problems)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict(explain=explain_))
        return
    if not result.hits:
        echo(no_match("matching records", store.slug, f) if not offset else f"No results after the first {offset}.")
        return
    rows = [[str(h.rank), f"{h.score:.3f}", h.run_id[:8], when(h.ended_at_ms), h.state, h.task] for h in result.hits]
    table(["#", "SCORE", "RUN", "ENDED (UTC)", "STATE", "TASK"], rows)
    if explain_:
        w = result.weights
        echo("")
        echo(f"weights: w_kw={w.w_kw:g} w_rec={w.w_rec:g} w_lin={w.w_lin:g} w_vec={w.w_vec:g} half_life_days={w.half_life_days:g}"
                   + (f"  as of {when(result.as_of)} UTC" if result.as_of is not None else "")
                   + (f"  among {result.candidates} records ({f.describe()})" if f.active else ""))
        if any(h.learned is not None for h in result.hits):
            echo("ranker: learned (the formula's pool reordered by the shipped trees; CYBERINE_MEMORY_RANKER=linear turns it off)")
        for h in result.hits:
            first = h.score if h.first_stage is None else h.first_stage
            echo(f"{h.rank:>2}. {h.run_id[:8]}  {fmt_axes(h.contributions)}  = {first:.3f}")
            if h.learned is not None:
                echo(f"    {_learned_line(h.explain_learned())}")


def _learned_line(learned: dict, n: int = 4) -> str:
    """The learned ranker's part of a hit's explanation: its score, the first stage's, and the
    features that moved it most (their tree SHAP values: they and the base add up to the raw score)."""
    top = sorted(((k, v) for k, v in learned["contributions"].items() if k != "(base)"), key=lambda kv: -abs(kv[1]))[:n]
    line = (f"learned {learned['score']:.3f} (raw {learned['raw']:+.2f}; first stage {learned['firstStage']:.3f}); tree SHAP: "
            + " ".join(f"{k} {v:+.2f}" for k, v in top))
    if learned.get("sharesWithQuery") is False:
        line += "; no word or lineage link in common with the query: listed after the runs that have one, score 0"
    return line


def _explain_lines(result) -> list[str]:
    """The human form of ``inject --explain``: what was retrieved, why, and what the budget cut."""
    d = result.to_dict()
    lines = [f"project: {d['project'] or '-'}; block {d['tokens']['block']} of {d['tokens']['budget']} tokens "
             f"(runs {d['tokens']['runs']}, issues {d['tokens']['issues']}); top-k {d['settings']['topk']}, "
             f"issue cap {d['settings']['issues']}"]
    if "weights" in d:
        by_source: dict[str, list[str]] = {}  # each source (a weights file, the environment) named once
        for k, v in d["weights"].items():
            if k != "floor":  # retired: the block judges each run's evidence (cybmem.retrieval.evidence)
                by_source.setdefault(d["weightSources"].get(k, "argument"), []).append(f"{k}={v:g}")
        lines.append("weights: " + "; ".join(f"{', '.join(ws)} ({src})" for src, ws in by_source.items()))
        if d.get("tuned"):
            lines.append(f"weights source: {d['tuned']}")
        if d["issues"] and "issueWeights" in d:
            lines.append("issues ranked with: " + ", ".join(f"{k}={v:.3g}" for k, v in d["issueWeights"].items())
                         + " (recency weighs more for an open issue)")
    ev = d.get("evidence")
    if ev:
        common = [t for t, n in zip(ev["terms"], ev["documentFrequency"]) if n >= ev["commonAt"]]
        unknown = [t for t, n in zip(ev["terms"], ev["documentFrequency"]) if n == 0]
        lines.append(f"evidence: {len(ev['terms'])} task term(s); common here (held by >= {ev['commonAt']} of "
                     f"{ev['runs']} runs, carry nothing alone): {' '.join(common) or '-'}; held by no run: "
                     f"{' '.join(unknown) or '-'}; full entry at >= {ev['fullNats']:g} nats")
        if ev.get("reason"):
            lines.append(f"evidence: {ev['reason']}")
    for h in d["runs"]:
        pin = "  (the run this task follows up: shown first)" if h.get("pinned") == "parent" else ""
        e = h.get("evidence")
        tier = ""
        if e:
            nats = "-" if e["nats"] is None else f"{e['nats']:.1f}"
            shown = "pointer*" if h.get("cutToPointer") else h.get("shown", e["tier"])
            tier = f"{shown:<8} {nats:>6} nats [{' '.join(e['terms'][:6])}{' ...' if len(e['terms']) > 6 else ''}]  "
        first = h["learned"]["firstStage"] if h.get("learned") else h["score"]
        lines.append(f"run {h['rank']:>2}. {h['runId'][:8]}  {tier}{fmt_axes(h['contributions'])}  = {first:.3f}  "
                     f"{subject_line(h['task'], 50)}{pin}")
        if h.get("learned"):
            lines.append(f"         {_learned_line(h['learned'])}")
    if any(h.get("cutToPointer") for h in d["runs"]):
        lines.append("pointer*: evidence for a full entry, shown as a pointer: the runs in full (CYBERINE_MEMORY_TOPK) were taken")
    for issue in d["issues"]:
        c = issue["contributions"]
        mark = {"issues": "listed", "raised": "raised", "no": "next  "}[issue["listed"]]
        if issue["listed"] == "issues":
            mark += f" {issue['tier']:<7}"  # its line in full, or a pointer (no evidence of its own)
        via = f" via run {issue['via'][:8]}" if issue["via"] else ""
        lines.append(f"issue {mark} {', '.join(issue['ids'])}  kw={c['keyword']:.3f} lin={c['lineage']:.3f} "
                     f"rec={c['recency']:.3f}  = {issue['score']:.3f}{via}")
    cut = d["cut"]
    lines.append(f"cut for the budget: {len(cut['runs'])} run(s) {' '.join(r[:8] for r in cut['runs'])}".rstrip()
                 + f"; {cut['issuesOverBudget']} issue line(s); {d['openIssues']} open issue(s) in all")
    return lines


@command("inject", free_text=True, quick=True)
def inject_cmd(
    ctx: Ctx,
    task: Annotated[Optional[str], typer.Argument(help="The task prompt (or - for stdin; stdin is also read when omitted).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the task from this file.")] = None,
    system: Annotated[bool, typer.Option("--system", help="Print only the MEMORY block (for a chat session's system message), ranked for the task when one is given (argument, --file or stdin).")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when memory is broken or the project unknown (default: print the task anyway and warn).")] = False,
    explain_: Annotated[bool, typer.Option("--explain", help="Also say on stderr what was retrieved and why: per-axis scores, weights and where each came from, issues, tokens, what the budget cut.")] = False,
    as_of: AsOfOpt = None,
    parent: ParentOpt = None,
    chat: ChatOpt = None,
):
    """Print the task with the MEMORY preamble ahead of it (what dispatch sends to the agent).

    Never fails the dispatcher: whatever is wrong with memory, the task is printed (with the block
    that could be built, possibly none) and one warning line goes to stderr; --strict exits 1
    instead. The block holds the most relevant prior runs (CYBERINE_MEMORY_TOPK) and open issues
    (CYBERINE_MEMORY_ISSUES), within CYBERINE_MEMORY_MAX_TOKENS; CYBERINE_MEMORY=0 turns it off.

    Example: cybmem inject "Fix the checkout error banner" --cwd ~/web --explain
    """
    # --system ranks for the task too when one is given (an argument, --file or stdin); without
    # one it builds the block for no task in particular.
    bare = task is None and file is None and not _stdin_holds_input()
    text = "" if system and bare else _task_text(task, file)
    if not system and not text.strip():
        raise typer.BadParameter("the task is empty; give the task prompt to put the MEMORY block ahead of", param_hint="TASK")
    try:
        when_ms, unusable = moment(as_of, "--as-of"), None
    except typer.BadParameter as exc:  # a moment that is none: the task goes out bare, never a replay from now
        if strict:
            raise
        when_ms, unusable = None, f"memory not injected: {exc.format_message()}"
    if unusable:
        result = Memory.not_injected(text, unusable, project=ctx.project)
    else:
        memory = Memory.from_env(memory_dir=ctx.memory_dir, lenient=not strict, cwd=ctx.cwd, project=ctx.project)
        result = memory.memory_block(text, as_of=when_ms, parent_run_id=parent, chat_session_id=chat,
                                     never_fail=not strict)
    warn(" ".join(message.split()) for message in result.warnings + [result.feedback_warning or ""] if message)
    if explain_:
        for line in _explain_lines(result):
            echo(line, err=True)
    if ctx.json:
        print_json(result.to_dict())
        return
    if system:
        write_exact(result.block)  # the block ends with its own newline
        return
    write_exact(result.prompt)


@command("strip", project=False, memory=False, free_text=True, quick=True)
def strip_cmd(
    ctx: Ctx,
    task: Annotated[Optional[str], typer.Argument(help="Text to clean (or - for stdin; stdin is also read when omitted).", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the text from this file.")] = None,
):
    """Remove the MEMORY block wherever it sits and lift the human task out of a TASK: wrapper.

    The inverse of inject: strip(inject(task)) == task. The write path uses the same function.

    Example: cybmem inject "Fix the login form" | cybmem strip
    """
    out = Memory.strip(_task_text(task, file))
    if ctx.json:
        print_json({"task": out})
        return
    write_exact(out)


@command("embed", quick=True)
def embed_cmd(
    ctx: Ctx,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).", show_default=False)] = None,
):
    """Embed the records that have no vector yet for the configured model (a backfill).

    Needs CYBERINE_MEMORY_EMBEDDINGS (ollama or an OpenAI-compatible base URL) and
    CYBERINE_MEMORY_EMBED_MODEL (default nomic-embed-text). Vectors are appended to the project's
    embeddings.jsonl, one per record and model; search then uses the vector axis.

    Example: CYBERINE_MEMORY_EMBEDDINGS=ollama cybmem embed --project web
    """
    result = ctx.memory.embed(progress=progress)
    warn(result.warnings)
    if ctx.json:
        print_json(result.to_dict())
        return
    if not result.embedded:
        typer.echo(f"Nothing to embed: all {result.had} records of project {result.project} already have a vector "
                   f"(model {result.model}" + (f", {result.dims} dimensions)" if result.dims else ")")
                   + (f" ({result.empty} have no text)." if result.empty else "."))
        return
    typer.echo(f"Embedded {result.embedded} records of project {result.project} with {result.model} ({result.dims} dimensions) "
               f"in {result.seconds:.1f}s: {result.rate:.1f} records/s; {result.had + result.embedded} of {result.records} "
               "records have a vector now.")

