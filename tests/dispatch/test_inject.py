"""Dispatch you can trust: `cybmem inject` always gives the task back, says what went wrong in
one line, explains itself, and keeps pandas (and the other heavy libraries) out of its process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cybmem.dispatch.inject import inject_task
from cybmem.errors import NotFoundError, ValidationError
from cybmem.settings import Settings


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

TASK = "Fix the flaky cart drawer test"
NOW = "2026-10-27"


def _cybmem(*args, env=None, input=None, cwd=None):
    exe = shutil.which("cybmem")
    cmd = [exe, *args] if exe else [sys.executable, "-c", "from cybmem.cli.app import main; main()", *args]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    full_env["CYBERINE_MEMORY_RANKER"] = "linear"  # the formula's order (see _linear_ranker)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, input=input, cwd=cwd, timeout=120)


@pytest.fixture
def root(fixture_copy) -> Path:
    return fixture_copy


def _broken(root: Path, how: str) -> dict:
    """Break memory one way; returns extra environment for the call."""
    if how == "unknown-project":
        return {}
    if how == "typo-in-root":
        return {"CYBERINE_MEMORY_DIR": str(root) + "-typo"}
    if how == "weights-file-corrupt":
        (root / "web" / "weights.json").write_text("{not json")
    elif how == "weights-env-not-a-number":
        return {"CYBERINE_MEMORY_W_KW": "abc"}
    elif how == "topk-not-a-number":
        return {"CYBERINE_MEMORY_TOPK": "many"}
    elif how == "records-unreadable":
        shutil.rmtree(root / "web" / "records")
        (root / "web" / "records").write_text("not a directory")
    elif how == "ledger-a-directory":
        (root / "web" / "issues.jsonl").unlink()
        (root / "web" / "issues.jsonl").mkdir()
    elif how == "projects-json-corrupt":
        (root / "projects.json").write_text("{broken")
    return {}


BROKEN = ["unknown-project", "typo-in-root", "weights-file-corrupt", "weights-env-not-a-number", "topk-not-a-number",
          "records-unreadable", "ledger-a-directory"]


@pytest.mark.parametrize("how", BROKEN)
def test_inject_gives_the_task_back_and_says_why_in_one_line(root, how):
    env = {"CYBERINE_MEMORY_DIR": str(root), **_broken(root, how)}
    project = "wbe" if how == "unknown-project" else "web"
    p = _cybmem("inject", TASK, "--project", project, "--as-of", NOW, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith(TASK)
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings and len(warnings) == len(p.stderr.splitlines()), p.stderr
    if how == "unknown-project":
        assert "no memory yet for project 'wbe'" in p.stderr and "known projects: api, web, web-7663e1" in p.stderr
    if how in ("weights-file-corrupt", "weights-env-not-a-number", "topk-not-a-number", "ledger-a-directory"):
        assert p.stdout.startswith("MEMORY (prior runs"), "the block is still built, with defaults / without issues"
    strict = _cybmem("inject", TASK, "--project", project, "--as-of", NOW, "--strict", env=env)
    assert strict.returncode == 1 and strict.stdout == "" and strict.stderr.startswith("Error: "), strict.stderr


def test_inject_strict_passes_on_a_healthy_store(root):
    p = _cybmem("inject", TASK, "--project", "web", "--strict", "--as-of", NOW, env={"CYBERINE_MEMORY_DIR": str(root)})
    assert p.returncode == 0 and p.stderr == "" and p.stdout.endswith(TASK)


def test_an_empty_task_is_a_usage_error(root):
    for task in ("", "   \n"):
        p = _cybmem("inject", task, "--project", "web", env={"CYBERINE_MEMORY_DIR": str(root)})
        assert p.returncode == 2 and "the task is empty" in p.stderr and p.stdout == ""
    p = _cybmem("inject", "", "--project", "web", "--json", env={"CYBERINE_MEMORY_DIR": str(root)})
    assert p.returncode == 2 and json.loads(p.stderr)["exitCode"] == 2


def test_library_rules(root):
    settings = Settings.from_env({}, memory_dir=root)
    result = inject_task(TASK, settings, project="nope")
    assert (result.block, result.prompt) == ("", TASK) and "known projects" in result.warnings[0]
    with pytest.raises(NotFoundError, match="known projects: api, web, web-7663e1"):
        inject_task(TASK, settings, project="nope", strict=True)
    bad = Settings.from_env({"CYBERINE_MEMORY_TOPK": "x"}, memory_dir=root, lenient=True)
    assert inject_task(TASK, bad, project="web").block and bad.topk == 8
    with pytest.raises(ValidationError, match="CYBERINE_MEMORY_TOPK"):
        inject_task(TASK, bad, project="web", strict=True)
    off = Settings.from_env({"CYBERINE_MEMORY": "0"}, memory_dir=root)
    assert inject_task(TASK, off, project="nope").prompt == TASK


def test_inject_json_says_how_the_block_was_made(root):
    p = _cybmem("inject", TASK, "--project", "web", "--as-of", NOW, "--json", env={"CYBERINE_MEMORY_DIR": str(root)})
    d = json.loads(p.stdout)
    assert d["prompt"].endswith(TASK) and d["block"] in d["prompt"]
    assert d["weights"]["w_kw"] == 0.5 and d["weightSources"]["w_kw"] == "default"
    ev = d["evidence"]
    assert ev["commonShare"] == 0.3 and ev["fullNats"] == 2.0 and "reason" not in ev and ev["specific"]
    assert all(r["evidence"]["tier"] in ("full", "pointer") for r in d["runs"])
    assert d["runs"][0]["runId"].startswith("9b6b1e00") and set(d["runs"][0]["contributions"]) == {"keyword", "recency", "lineage", "vector"}
    assert d["tokens"]["block"] <= d["tokens"]["budget"] == 1500 and d["tokens"]["runs"] > 0
    assert d["settings"] == {"topk": 8, "pointers": 10, "maxTokens": 1500, "issues": 5, "issueShare": 0.3333}
    assert set(d["cut"]) == {"runs", "issuesOverBudget", "issuesNotShown"}
    for issue in d["issues"]:
        assert issue["listed"] in ("issues", "raised", "no") and set(issue["contributions"]) == {"keyword", "lineage", "recency"}
    (root / "web" / "weights.json").write_text('{"w_rec": 0.3}')
    d = json.loads(_cybmem("inject", TASK, "--project", "web", "--json", env={"CYBERINE_MEMORY_DIR": str(root)}).stdout)
    assert d["weightSources"]["w_rec"] == str(root / "web" / "weights.json")


def test_inject_explain_goes_to_stderr_and_keeps_stdout_the_prompt(root):
    env = {"CYBERINE_MEMORY_DIR": str(root)}
    plain = _cybmem("inject", TASK, "--project", "web", "--as-of", NOW, env=env)
    p = _cybmem("inject", TASK, "--project", "web", "--as-of", NOW, "--explain", env=env)
    assert p.stdout == plain.stdout
    lines = p.stderr.splitlines()
    assert lines[0].startswith("project: web; block ") and "top-k 8, issue cap 5" in lines[0]
    assert lines[1] == "weights: w_kw=0.5, w_rec=0.35, w_lin=0.05, w_vec=0, half_life_days=30, floor_vec=0.6 (default)"
    assert lines[2] == "issues ranked with: w_kw=0.327, w_rec=0.54, w_lin=0.0327 (recency weighs more for an open issue)"
    assert lines[3].startswith("evidence: ") and "common here (held by >= 30 of " in lines[3]
    first = next(i for i, line in enumerate(lines) if line.startswith("run "))
    assert lines[first].startswith("run  1. 9b6b1e00  full ") and " nats [" in lines[first]
    assert lines[-1].startswith("cut for the budget:")


def test_the_parent_named_by_the_dispatcher_comes_first(root):
    """A follow-up names the run it follows up (CYBERINE_PARENT_RUN_ID): that run is shown first
    whatever its score, then the scorer's order; an unknown or later parent changes nothing."""
    env = {"CYBERINE_MEMORY_DIR": str(root)}
    args = ("--project", "web", "--as-of", NOW)
    plain = json.loads(_cybmem("inject", TASK, *args, "--json", env=env).stdout)
    shown = [r["runId"] for r in plain["runs"]]
    assert 0 < len(shown) <= 8 + 10 and not any("pinned" in r for r in plain["runs"])
    ranked = [h["runId"] for h in json.loads(_cybmem("search", TASK, *args, "-k", "100", "--json", env=env).stdout)["hits"]]
    parent = ranked[-1]  # the candidate the scorer likes least
    assert parent not in shown
    follow = {**env, "CYBERINE_PARENT_RUN_ID": parent}
    d = json.loads(_cybmem("inject", TASK, *args, "--json", env=follow).stdout)
    assert d["runs"][0]["runId"] == parent and d["runs"][0]["pinned"] == "parent" and d["warnings"] == []
    assert d["runs"][0]["contributions"]["lineage"] > 0, "its scores are still computed"
    assert d["runs"][0]["evidence"]["tier"] == "full", "shown in full whatever its evidence"
    others = [r["runId"] for r in d["runs"][1:]]
    assert parent not in others and set(others) <= set(ranked), "then the runs with evidence, in the block's order"
    first_run = next(line for line in d["block"].splitlines() if line.startswith("- run "))
    assert first_run.startswith(f"- run {parent[:8]} (the run this task follows up; ")
    p = _cybmem("inject", TASK, *args, "--explain", env=follow)
    run_lines = [line for line in p.stderr.splitlines() if line.startswith("run ")]
    assert run_lines[0].startswith(f"run  1. {parent[:8]}") and run_lines[0].endswith("(the run this task follows up: shown first)")
    assert not any("follows up" in line for line in run_lines[1:])
    # A parent already in the block also comes first; the others keep their places.
    top = shown[3]
    d = json.loads(_cybmem("inject", TASK, *args, "--json", env={**env, "CYBERINE_PARENT_RUN_ID": top}).stdout)
    assert d["runs"][0]["runId"] == top and top not in [r["runId"] for r in d["runs"][1:]]
    # A parent with no record (still running) or none yet as of then: nothing pinned, nothing to warn about.
    missing = "00000000-0000-4000-8000-000000000000"
    d = json.loads(_cybmem("inject", TASK, *args, "--json", env={**env, "CYBERINE_PARENT_RUN_ID": missing}).stdout)
    assert [r["runId"] for r in d["runs"]] == shown and d["warnings"] == []
    ended = {h["runId"]: h["endedAt"] for h in json.loads(_cybmem("search", TASK, *args, "-k", "100", "--json", env=env).stdout)["hits"]}
    newest = max(ended, key=ended.get)
    early = json.loads(_cybmem("inject", TASK, "--project", "web", "--as-of", str(ended[newest] - 1), "--json",
                               env={**env, "CYBERINE_PARENT_RUN_ID": newest}).stdout)
    assert early["runs"] and not any(r.get("pinned") or r["runId"] == newest for r in early["runs"])


def test_a_tiny_budget_still_yields_a_well_formed_block_or_none(root):
    env = {"CYBERINE_MEMORY_DIR": str(root), "CYBERINE_MEMORY_MAX_TOKENS": "40"}
    p = _cybmem("inject", TASK, "--project", "web", "--json", env=env)
    d = json.loads(p.stdout)
    assert d["tokens"]["block"] <= 40 and d["prompt"].endswith(TASK)


#: pydantic: typer coerces options through it (0.15-0.2 s to import); cybmem's plain options skip it.
HEAVY = ("pandas", "matplotlib", "ipywidgets", "nbconvert", "pydantic")


@pytest.mark.parametrize("verb", ["inject", "write"])
def test_write_and_inject_never_import_heavy_libraries(root, tmp_path, verb):
    if verb == "inject":
        args = ["inject", TASK, "--project", "web", "--memory-dir", str(root)]
    else:
        run = {"id": "lean-1", "cwd": "/home/dev/web", "task": "Lean write", "status": "done", "endedAt": 1_795_000_000_000}
        (tmp_path / "run.json").write_text(json.dumps(run))
        args = ["write", str(tmp_path / "run.json"), "--memory-dir", str(root)]
    code = ("import sys\nfrom cybmem.cli.app import main\nsys.argv = ['cybmem'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert "LOADED []" in p.stderr, p.stderr


def test_the_cached_issue_activity_is_the_computed_one(fixture_copy, tmp_path):
    """act-N.arrow (last activity and title codes per fold row) is what issue_activity computes
    from the files, after a cold load and after a write that carries an open issue."""
    import os

    from cybmem.operations.write import write_run
    from cybmem.settings import Settings
    from cybmem.store.snapshot import issue_activity, issue_carriers, load_snapshot
    from cybmem.store.memory_store import MemoryStore

    os.unlink(fixture_copy / ".nocache")
    store = MemoryStore(fixture_copy, "web")
    snap = load_snapshot(store)

    def fresh(s):
        return issue_activity(s.records, s.fold(), s.candidates(None), s.ended_ms())

    def carriers_ok(s):
        """car-N.arrow (which record carries which fold row) is the computed one, and every id
        a record carries is at its fold row."""
        record, fold_row = s.carriers()
        table = issue_carriers(s.records, s.fold())
        ids = s.fold().column("issueId").to_pylist()
        carried = [(r, i) for r, lst in enumerate(s.records.column("issues").to_pylist()) for i in lst or ()]
        return (record.tolist() == table.column("record").to_pylist() == [r for r, _ in carried]
                and fold_row.tolist() == table.column("foldRow").to_pylist()
                == [ids.index(i) if i in ids else -1 for _, i in carried])

    assert snap.files.activity is not None and snap.activity().equals(fresh(snap))
    assert snap.files.carriers is not None and carriers_ok(snap) and len(snap.carriers()[0])
    open_id = snap.open_issues().column("issueId")[0].as_py()
    from conftest import make_run

    later = make_run("act-1", "Look at it again", start=1_794_000_000_000, cwd="/home/dev/web",
                     output=f"Looked.\n\nACCOMPLISHED:\n- looked\nISSUES:\n- {open_id}\nNEXT:\n- none")
    write_run(later, Settings.from_env(env={}, memory_dir=fixture_copy))
    again = load_snapshot(store)
    act = again.activity()
    assert act.equals(fresh(again)) and again.files.activity != snap.files.activity
    assert carriers_ok(again) and again.files.carriers != snap.files.carriers
    row = again.fold().column("issueId").to_pylist().index(open_id)
    assert act.column("lastActivity")[row].as_py() == 1_794_000_000_000 + 10 * 60_000


def test_issues_are_ranked_over_the_snapshot_the_hits_came_from(fixture_copy):
    """search reads the store again when a hit changed on disk since the snapshot was loaded
    (here: touched, and other runs written meanwhile, as under concurrent writers); the issue
    ranking must use that newer snapshot, not the one the caller loaded (it was an
    ArrowIndexError under 8 writers and a reader)."""
    from conftest import make_run

    from cybmem.retrieval.issue_ranking import rank_issues
    from cybmem.retrieval.search import search
    from cybmem.operations.write import write_run
    from cybmem.settings import Settings
    from cybmem.store.snapshot import load_snapshot
    from cybmem.store.memory_store import MemoryStore

    store = MemoryStore(fixture_copy, "web")
    settings = Settings.from_env(env={}, memory_dir=fixture_copy)
    old = load_snapshot(store)
    first = search(old, "login", k=3, settings=settings)
    assert first.hits and first.snapshot is old
    open_id = old.open_issues().column("issueId")[0].as_py()
    for i in range(40):  # more rows than the old snapshot had
        write_run(make_run(f"later-{i}", f"Later login work {i}", start=1_794_000_000_000 + i * 3_600_000,
                           cwd="/home/dev/web", output=f"Did it.\n\nISSUES:\n- {open_id}\nNEXT:\n- none"), settings)
    hit = store.records_dir / f"{first.hits[0].run_id}.json"
    data = json.loads(hit.read_text())
    data["outcome"]["summary"] += " Edited by hand."
    with open(hit, "r+") as fh:  # changed in place (same inode) after the old snapshot read it
        fh.write(json.dumps(data))
        fh.truncate()
    result = search(old, "login", k=3, settings=settings)
    assert result.snapshot is not old and result.snapshot.n > old.n
    issues = rank_issues(result, result.weights)
    assert open_id in {i for c in issues for i in c.ids}
    # An issue's recency is scoring's kernel over its last activity, as a run's is over its end,
    # at the issues' weight (Weights.for_issues: ISSUE_REC_SHARE of the weights).
    import numpy as np

    from cybmem.retrieval.scoring import recency
    from cybmem.retrieval.weights import ISSUE_REC_SHARE

    w = result.weights.for_issues()
    assert w.w_rec == pytest.approx(ISSUE_REC_SHARE * (w.w_kw + w.w_lin + w.w_rec))
    assert w.w_kw / w.w_lin == pytest.approx(result.weights.w_kw / result.weights.w_lin)
    want = recency(np.array([c.last_at_ms for c in issues], np.int64), result.now_ms, w.half_life_days, weight=w.w_rec)
    assert [c.recency for c in issues] == want.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_the_top_of_the_issue_ranking_is_the_prefix_of_its_full_order(seed):
    """IssueRanking.top sorts only the best few of tens of thousands of open issues: it must give
    exactly the prefix of the full order, ties on score (broken by latest activity) and on both
    (kept in row order) included, with or without rows skipped."""
    import numpy as np
    import pyarrow as pa

    from cybmem.retrieval.issue_ranking import IssueRanking

    rng = np.random.default_rng(seed)
    m = 3000
    total = rng.choice(np.array([0.0, 0.1, 0.25, 0.5], np.float32), m)  # many ties
    last_at = rng.integers(0, 5, m) * 1000
    folded = pa.table({"issueId": [f"i{i}" for i in range(m)]})
    ranking = IssueRanking(folded, np.arange(m), total, total, total, total, last_at, np.full(m, -1),
                           pa.array([], pa.string()), np.zeros(m, np.int32))
    full = np.lexsort((-last_at, -total))
    skip = rng.random(m) < 0.3
    for count in (1, 5, 17, 400, m, m + 5):
        assert ranking.top(count).tolist() == full[:count].tolist()
        assert ranking.top(count, skip).tolist() == [i for i in full.tolist() if not skip[i]][:count]
    assert ranking.order.tolist() == full.tolist()


def test_an_open_issue_is_in_full_only_with_evidence(settings):
    """Issue 28, item 3: the issue section follows the runs' rule. An issue whose own text holds a
    task word that is not common, or whose run is shown in full, gets its whole line; one that is
    listed for recency alone gets a pointer line (its title cut, no run); its id is named either way."""
    from conftest import T0, make_run
    from cybmem.operations.write import write_run

    def out(issue: str) -> str:
        return f"Did it.\n\nACCOMPLISHED:\n- it\nISSUES:\n- {issue}\nNEXT:\n- none"

    drawer = "The cart drawer flickers when it closes on a slow phone over a throttled connection"
    footer = "The footer newsletter form posts twice when the button is pressed quickly on mobile Safari"
    write_run(make_run("run-drawer", "Animate the cart drawer"), settings)  # the run the task relates to
    write_run(make_run("run-footer", "Add a newsletter form to the footer", start=T0 + 3_600_000, output=out(footer)), settings)
    # An issue another tool opened (no run carries it) whose own text names the drawer.
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.records import IssueEvent

    MemoryStore(settings.memory_dir, "web").append_issue_events(
        [IssueEvent("the-cart-drawer-flickers", T0 + 1_800_000, "opened", "qa-bot", drawer)])
    for i in range(6):  # more runs, so that the words above are not common in the store
        write_run(make_run(f"run-{i}", f"Refactor module {i} of the checkout service", start=T0 - (i + 1) * 3_600_000), settings)
    block = inject_task("Fix the cart drawer animation", settings, cwd="/home/dev/web", now_ms=T0 + 86_400_000).block
    lines = block.splitlines()
    drawer_line = next(line for line in lines if line.startswith("- the-cart-drawer-flickers"))
    footer_line = next(line for line in lines if line.startswith("- the-footer-newsletter"))
    assert ", run qa-bot)" in drawer_line and "throttled connection" in drawer_line
    assert "the… (opened " in footer_line and ", run " not in footer_line and "Safari" not in footer_line
    assert len(footer_line) < len(drawer_line)


def test_an_open_issue_made_from_a_merge_commit_shows_the_pull_requests_title(settings):
    """Issue 39, item 4, for the issue lines too: an issue whose title is only GitHub's "Merge pull
    request #N from owner/branch" is shown with the title of the pull request its opening run
    merged (as that run's pointer is); a title that says something is kept; no opening run, no change."""
    from conftest import T0, make_run
    from cybmem.operations.write import write_run
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.records import IssueEvent

    merge = "Merge pull request #4683 from nicoddemus/skip-unicode"
    write_run(make_run("run-merge", merge + "\n\nHandle unittest.SkipTest exception with non-ascii characters"), settings)
    write_run(make_run("run-plain", "Merge pull request #12 from someone/branch", start=T0 + 60_000), settings)
    MemoryStore(settings.memory_dir, "web").append_issue_events([
        IssueEvent("ticket-4683", T0 + 1_000, "opened", "run-merge", merge),
        IssueEvent("ticket-12", T0 + 61_000, "opened", "run-plain", "Merge pull request #12 from someone/branch"),
        IssueEvent("ticket-7", T0 + 62_000, "opened", "nobody", "Merge pull request #7 from a/b"),
        IssueEvent("ticket-8", T0 + 63_000, "opened", "run-merge", "Skip tests with non-ascii reasons")])
    block = inject_task("Handle a SkipTest with non-ascii characters", settings, cwd="/home/dev/web",
                        now_ms=T0 + 86_400_000).block
    lines = {line.split(":")[0]: line for line in block.splitlines() if line.startswith("- ticket-")}
    assert "Handle unittest.SkipTest exception with non-ascii characters (#4683)" in lines["- ticket-4683"]
    assert "Merge pull request #12 from someone/branch" in lines["- ticket-12"]  # its run says no more
    assert "Merge pull request #7 from a/b" in lines["- ticket-7"]  # no such run
    assert "Skip tests with non-ascii reasons" in lines["- ticket-8"]


def test_an_open_issue_is_as_fresh_whatever_the_runs_evidence(settings):
    """An open issue's last activity counts every run the moment allows, not only the runs with
    evidence about the task: a run that shares no word with the task but raised the issue again
    yesterday keeps it fresh (the block's issue recency once came from the evidence runs alone, and
    an issue touched yesterday ranked as if last seen months ago)."""
    from conftest import MIN, T0, make_run
    from cybmem.operations.write import write_run

    DAY = 1440 * MIN

    def out(issue: str) -> str:
        return f"Did it.\n\nACCOMPLISHED:\n- it\nISSUES:\n- {issue}\nNEXT:\n- none"

    footer = "The footer newsletter form posts twice when the button is pressed quickly"
    write_run(make_run("run-drawer", "Animate the cart drawer", start=T0), settings)
    write_run(make_run("run-footer-1", "Add a newsletter form to the footer", start=T0 - 90 * DAY, output=out(footer)), settings)
    write_run(make_run("run-footer-2", "Style the newsletter form in the footer", start=T0 + 5 * DAY, output=out(footer)), settings)
    for i in range(6):  # more runs, so that the task's words are not common in the store
        write_run(make_run(f"run-{i}", f"Refactor module {i} of the checkout service", start=T0 - (i + 1) * DAY), settings)
    now = T0 + 6 * DAY
    with_evidence = inject_task("Fix the cart drawer animation", settings, cwd="/home/dev/web", now_ms=now)
    ended = T0 + 5 * DAY + 10 * MIN
    issue = next(i for i in with_evidence.issues if i.title == footer)
    assert issue.last_at_ms == ended
    assert "run-drawer" in with_evidence.block and "run-footer-2" not in with_evidence.block  # no evidence: not shown
