"""What memory showed a run and what the run used: shown.jsonl (cybmem.dispatch.feedback), used.jsonl
(cybmem.store.feedback_log, feedback_match) and the "used" judgments of `cybmem tune`
(cybmem.retrieval.judgments).

The loop test is a scripted agent with real processes: `cybmem inject` with CYBERINE_RUN_ID, the
MCP server started by the SDK's client (as tests/mcp/test_server.py does) fetching a shown run, `cybmem
write` of the run's record naming another shown run, then `cybmem tune --derive used --json`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from cybmem.dispatch import feedback
from cybmem.dispatch.inject import inject_task
from cybmem.retrieval.judgments import judgments_from_store, used_judgments
from cybmem.store import feedback_log
from cybmem.store.feedback_match import names_run
from cybmem.operations.write import write_run
from cybmem.memory import Memory
from cybmem.settings import Settings
from cybmem.store.snapshot import load_snapshot
from cybmem.store.memory_store import MemoryStore

from conftest import FIXTURES, LEFTOVERS, make_run, write_json


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

CYBMEM = shutil.which("cybmem")
TASK = "Fix the flaky cart drawer test"
CART = "9b6b1e00-90b4-579e-9d84-2170f292abf9"  # web: "Stabilise the flaky cart drawer e2e test", first for TASK
CONSENT = "analytics-fires-before-the-consent-banner-is-answered-on-first"  # web's one open issue


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "memory"
    shutil.copytree(FIXTURES, root, ignore=LEFTOVERS)
    return root


def _env(root: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CYBERINE_")}
    env.update(CYBERINE_MEMORY_DIR=str(root), CYBERINE_MEMORY_RANKER="linear")  # the formula's order (see _linear_ranker)
    env.update(extra)
    return env


def _run(*args: str, env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CYBMEM, *args], env=env, capture_output=True, text=True, input=stdin, timeout=120)


def _settings(root: Path, **env: str) -> Settings:
    env = {"MEMORY_RANKER": "linear", **env}  # the formula's order (see _linear_ranker)
    return Settings.from_env({f"CYBERINE_{k}": v for k, v in env.items()}, memory_dir=root)


def _shown(root: Path, project: str = "web") -> list[dict]:
    return feedback_log.read_lines(root / project / feedback_log.SHOWN_FILE)


def _used(root: Path, project: str = "web") -> list[dict]:
    return feedback_log.read_used(root / project)


def _now() -> int:
    return int(time.time() * 1000)


def _write(root: Path, run_id: str, output: str, *, task: str = TASK, **env: str):
    """The record of a run that started a minute ago and ends in four (after what was shown to it)."""
    run = make_run(run_id, task, start=_now() - 60_000, minutes=5, output=output)
    return write_run(run, _settings(root, **env), project="web")


# --- the loop, with real processes ------------------------------------------------------------


def test_a_scripted_agent_is_shown_fetches_writes_and_tune_sees_one_used_judgment(tmp_path):
    from anyio.from_thread import start_blocking_portal
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    root = _root(tmp_path)
    env = _env(root, CYBERINE_RUN_ID="agent-run-1", CYBERINE_MEMORY_TOPK="3", CYBERINE_MEMORY_POINTERS="0")
    injected = _run("inject", TASK, "--project", "web", env=env)
    assert injected.returncode == 0 and injected.stderr == ""
    shown = re.findall(r"^- run ([0-9a-f]{8}) ", injected.stdout, re.M)
    assert len(shown) == 3 and shown[0] == CART[:8]
    [line] = _shown(root)
    assert line["source"] == "inject" and line["runId"] == "agent-run-1" and line["taskHash"] is None
    assert [r["runId"][:8] for r in line["runs"]] == shown and [r["rank"] for r in line["runs"]] == [1, 2, 3]
    assert TASK not in (root / "web" / feedback_log.SHOWN_FILE).read_text(), "never the task itself"

    # The agent fetches the second shown run through the MCP server (a subprocess of the SDK's client).
    params = StdioServerParameters(command=CYBMEM, args=["mcp", "--memory-dir", str(root), "--project", "web"], env=env)
    with ExitStack() as stack, (tmp_path / "server.log").open("w") as errlog:
        portal = stack.enter_context(start_blocking_portal())
        client = stack.enter_context(portal.wrap_async_context_manager(Client(stdio_client(params, errlog=errlog))))
        fetched = portal.call(client.call_tool, "show", {"run_id": shown[1]})
        assert not fetched.is_error, fetched.content[0].text
        second = fetched.structured_content["record"]["runId"]
    mcp_line = _shown(root)[-1]
    assert mcp_line["source"] == "mcp:show" and mcp_line["runId"] == "agent-run-1" and mcp_line["fetched"] == [second]

    # Its record: the worker's final answer names the first shown run by the 8 characters the block printed.
    now = _now()
    run = make_run("agent-run-1", f"{injected.stdout}", start=now - 600_000, minutes=5,
                   output=f"Waited for transitionend as run {shown[0]} did.\n\nACCOMPLISHED:\n- stabilised it\n"
                          "ISSUES:\n- none\nNEXT:\n- none")
    written = _run("write", str(write_json(tmp_path / "run.json", run)), "--project", "web", env=env)
    assert written.returncode == 0 and written.stderr == "", written.stderr
    [used] = _used(root)
    assert used["runId"] == "agent-run-1" and used["matchedBy"] == "runId" and used["lines"] == 2
    assert [(u["runId"], u["how"], u["rank"]) for u in used["used"]] == [(CART, ["named"], 1), (second, ["fetched"], 2)]
    assert [r["runId"][:8] for r in used["block"]] == shown

    tuned = _run("tune", "--project", "web", "--derive", "used", "--json", env=env)
    assert tuned.returncode == 0, tuned.stderr
    answer = json.loads(tuned.stdout)
    assert answer["kinds"] == {"used": 1} and answer["judgments"] == 1
    assert answer["source"] == "derived from project web (1 used)"


# --- matching ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, named", [
    ("as run 9b6b1e00 did", True),
    ("9b6b1e00", True),
    ("see 9b6b1e00-90b4.", True),
    (f"({CART})", True),
    ("9b6b1e00ab", False),  # another hex string
    ("x9b6b1e00", False),
    ("9b6b1e00-fix", False),  # another run's id that starts the same
    ("9b6b1e0", False),  # too short
])
def test_a_run_is_named_by_its_id_or_a_prefix_of_8_that_stands_alone(text, named):
    assert names_run(text, CART) is named


def test_a_prefix_in_the_output_is_used_and_the_echoed_block_is_not(tmp_path):
    root = _root(tmp_path)
    inj = inject_task(TASK, _settings(root, RUN_ID="r-prefix", MEMORY_TOPK="3", MEMORY_POINTERS="0"), project="web")
    assert inj.feedback_warning is None and len(inj.runs) == 3
    # A worker that echoes its prompt echoes the block, which names every shown run: that is no use.
    _write(root, "r-prefix", f"{inj.prompt}\n\nDone, following {inj.runs[2].run_id[:8]}.")
    [used] = _used(root)
    assert [(u["runId"], u["rank"], u["how"]) for u in used["used"]] == [(inj.runs[2].run_id, 3, ["named"])]


def test_a_run_the_task_names_is_not_used_for_being_named(tmp_path):
    root = _root(tmp_path)
    task = f"Follow up {CART[:8]}: the cart drawer test is flaky again"
    inj = inject_task(task, _settings(root, RUN_ID="r-asked"), project="web")
    assert CART in [h.run_id for h in inj.runs]
    _write(root, "r-asked", "Fixed the wait.", task=task)
    [used] = _used(root)
    assert used["used"] == [], "what it was asked is not what it said"


def test_an_issue_it_resolved_is_used(tmp_path):
    root = _root(tmp_path)
    inj = inject_task("Fix analytics firing before the consent banner is answered", _settings(root, RUN_ID="r-fix"),
                      project="web")
    assert CONSENT in feedback_log.read_lines(root / "web" / feedback_log.SHOWN_FILE)[0]["issues"]
    _write(root, "r-fix", f"Gated the script.\n\nACCOMPLISHED:\n- resolved {CONSENT}\nISSUES:\n- none\nNEXT:\n- none",
           task=inj.task)
    [used] = _used(root)
    assert used["usedIssues"] == [{"issueId": CONSENT, "how": ["resolved", "named"], "shownBy": ["inject"]}]


def test_a_run_fetched_through_the_server_is_used(tmp_path):
    from cybmem.mcp.tools import MemoryTools

    root = _root(tmp_path)
    settings = _settings(root, RUN_ID="r-fetch")
    memory = MemoryTools(Memory(settings, project="web"))
    memory.observers.append(feedback.mcp_observer(settings, memory.store))
    memory.call("search", {"query": TASK}, lambda: memory.search(TASK, k=3))
    memory.call("show", {"run_id": CART[:6]}, lambda: memory.show(CART[:6]))
    assert [d["source"] for d in _shown(root)] == ["mcp:search", "mcp:show"]
    _write(root, "r-fetch", "Did it without saying how.")
    [used] = _used(root)
    assert used["block"] is None, "no inject line: only what the agent fetched"
    assert used["used"] == [{"runId": CART, "how": ["fetched"], "rank": None, "shownBy": ["mcp:search", "mcp:show"]}]


def test_without_a_run_id_the_task_hash_matches(tmp_path):
    root = _root(tmp_path)
    late = _settings(root)
    inj = inject_task(TASK, late, project="web")
    [line] = _shown(root)
    assert line["runId"] is None and line["taskHash"] == feedback.task_hash(TASK) != feedback.task_hash("other")
    # The record's task is the dispatched prompt: its MEMORY block and TASK: wrapper come off before the hash.
    wrapped = f"You are an implementer.\nTASK:\n{inj.prompt}\n\nINSTRUCTIONS:\n- be brief\n"
    _write(root, "r-hash", f"Used {inj.runs[0].run_id[:8]}.", task=wrapped)
    [used] = _used(root)
    assert used["matchedBy"] == "taskHash" and used["used"][0]["runId"] == inj.runs[0].run_id
    # The same task dispatched only after a run ended is not what that run was shown.
    before = _now() - 3_600_000
    shutil.copy(root / "web" / feedback_log.SHOWN_FILE, tmp_path / "kept")
    (root / "web" / feedback_log.SHOWN_FILE).write_text("")
    inject_task(TASK, late, project="web")
    run = make_run("r-early", TASK, start=before - 600_000, minutes=5, output=f"Used {inj.runs[0].run_id[:8]}.")
    write_run(run, late, project="web")
    assert [d["runId"] for d in _used(root)] == ["r-hash"]


def test_nothing_shown_notes_nothing(tmp_path):
    root = _root(tmp_path)
    _write(root, "r-alone", f"Used {CART[:8]}.")
    web = root / "web"
    assert not (web / feedback_log.USED_FILE).exists() and not (web / feedback_log.SHOWN_FILE).exists()
    inject_task(TASK, _settings(root, RUN_ID="someone-else"), project="web")
    _write(root, "r-alone-2", f"Used {CART[:8]}.")
    assert not (root / "web" / feedback_log.USED_FILE).exists(), "shown to another run only"
    inject_task(TASK, _settings(root, RUN_ID="r-nothing-used"), project="web")
    _write(root, "r-nothing-used", "Done.")
    [used] = _used(root)
    assert used["used"] == [] and used["block"], "shown a block, used nothing: a line all the same (the denominator)"
    assert judgments_from_store(load_snapshot(MemoryStore(root, "web")), kinds=["used"]) == []


def test_a_replay_with_as_of_and_the_mcp_block_are_not_kept_as_inject(tmp_path):
    root = _root(tmp_path)
    inject_task(TASK, _settings(root, RUN_ID="r"), project="web", as_of=1_792_000_000_000)
    assert not (root / "web" / feedback_log.SHOWN_FILE).exists()
    from cybmem.mcp.tools import MemoryTools

    settings = _settings(root, RUN_ID="r")
    memory = MemoryTools(Memory(settings, project="web"))
    memory.observers.append(feedback.mcp_observer(settings, memory.store))
    memory.call("memory_block", {"task": TASK}, lambda: memory.memory_block(TASK))
    [line] = _shown(root)
    assert line["source"] == "mcp:memory_block" and line["runs"][0]["runId"] == CART and line["weights"]["source"] == "default"


def test_used_judgments_ask_the_runs_task_as_of_its_start(tmp_path):
    root = _root(tmp_path)
    inject_task(TASK, _settings(root, RUN_ID="r-judged"), project="web")
    result = _write(root, "r-judged", f"Used {CART[:8]}.")
    snap = load_snapshot(MemoryStore(root, "web"))
    [j] = judgments_from_store(snap, kinds=["used"])
    assert (j.query, j.as_of, j.relevant, j.query_run_id, j.parent_run_id, j.kind) == \
        (TASK, result.record.startedAt, (CART,), "r-judged", None, "used")
    assert judgments_from_store(snap, kinds=["used"], as_of=result.record.startedAt) == [], "not ended yet then"
    every = judgments_from_store(snap)
    assert sum(x.kind == "used" for x in every) == 1, "kept apart from the kinds derived from the ledger"


# --- the cap ------------------------------------------------------------------------------------


def test_a_write_cuts_the_shown_log_back_to_its_cap(tmp_path):
    root = _root(tmp_path)
    for i in range(8):
        inject_task(TASK, _settings(root, RUN_ID=f"r{i}", MEMORY_SHOWN_CAP="5"), project="web")
    assert len(_shown(root)) == 8, "the appender trims only a log far over its cap"
    _write(root, "r7", f"Used {CART[:8]}.", MEMORY_SHOWN_CAP="5")
    assert [d["runId"] for d in _shown(root)] == ["r3", "r4", "r5", "r6", "r7"], "the newest 5 kept"
    assert _used(root)[0]["runId"] == "r7"
    inject_task(TASK, _settings(root, RUN_ID="s1", MEMORY_SHOWN_CAP="5"), project="web")
    _write(root, "s1", "Done.", MEMORY_SHOWN_CAP="5")
    assert len(_shown(root)) == 6, "a quarter over the cap at most: left alone"


def test_an_appender_trims_a_log_that_no_write_trims(tmp_path):
    root = _root(tmp_path)
    settings = _settings(root, RUN_ID="r", MEMORY_SHOWN_CAP="2")
    path = root / "web" / feedback_log.SHOWN_FILE
    seen = []  # (lines, bytes) after each inject
    for _ in range(40):
        inject_task(TASK, settings, project="web")
        seen.append((len(_shown(root)), path.stat().st_size))
    cuts = [i for i in range(1, len(seen)) if seen[i][0] < seen[i - 1][0]]
    assert len(cuts) >= 2, seen
    valve = 2 * feedback_log.LINE_BYTES * 1.25
    for i in cuts:
        assert seen[i][0] == 2, "cut back to the cap"
        assert seen[i - 1][1] <= valve < seen[i - 1][1] + seen[i][1] / 2, "once it passed 4 kB a line of the cap, and a quarter"


def _search_answer(hits: int) -> dict:
    return {"hits": [{"runId": f"{i:08x}-0000-4000-8000-000000000000", "rank": i + 1, "score": 1 / (i + 1)}
                     for i in range(hits)]}


def test_a_shown_line_names_a_bounded_number_of_runs_and_issues_and_counts_the_rest(tmp_path):
    from cybmem.dispatch.feedback import mcp_entry

    settings = _settings(tmp_path, RUN_ID="r")
    n = feedback_log.LINE_ITEMS
    # One `search` with k=100000 wrote a 303 kB line.
    line = mcp_entry("search", {"query": "x", "k": 100_000}, _search_answer(100_000), settings)
    assert [r["rank"] for r in line["runs"]] == list(range(1, n + 1)), "the best ranked"
    assert line["runsCut"] == 100_000 - n and "issuesCut" not in line
    assert len(json.dumps(line)) < 10_000
    # `chain` with context=0 on a long chain (252 kB): runs, open issues, and the run fetched.
    chain = {"runId": "r-0", "runs": [{"runId": f"r-{i}"} for i in range(7_761)], "openIssues": [f"i-{i}" for i in range(3_000)]}
    line = mcp_entry("chain", {"run_id": "r-0", "context": 0}, chain, settings)
    assert (len(line["runs"]), line["runsCut"], len(line["issues"]), line["issuesCut"]) == (n, 7_761 - n, n, 3_000 - n)
    assert line["fetched"] == ["r-0"] and "fetchedCut" not in line
    assert feedback_log.shown_line_ok(line), "what a reader takes"
    shown = mcp_entry("show", {"run_id": "r-0"}, {"record": {"runId": "r-0"}, "supersededChain": [f"r-{i}" for i in range(1, 500)]},
                      settings)
    assert (len(shown["fetched"]), shown["fetchedCut"]) == (n, 500 - n)
    small = mcp_entry("search", {"query": "x"}, _search_answer(3), settings)
    assert not any(k.endswith("Cut") for k in small), "an ordinary answer's line is as it was"


def test_the_shown_log_stays_within_its_bytes_and_an_append_rewrites_it_rarely(tmp_path):
    from cybmem.dispatch.feedback import mcp_observer

    # 40 read-only calls made a 12.1 MB log against the documented 8 MB, re-read and rewritten each time.
    root = _root(tmp_path)
    cap = 5
    settings = _settings(root, RUN_ID="r", MEMORY_SHOWN_CAP=str(cap))
    observe = mcp_observer(settings, lambda project: MemoryStore(root, "web"))
    path = root / "web" / feedback_log.SHOWN_FILE
    bound = cap * feedback_log.LINE_BYTES * 1.25
    rewrites, appended, inode = 0, 0, None
    for i in range(60):
        observe("search", {"query": "x", "k": 2_000}, {**_search_answer(2_000), "project": "web"})
        appended += len(path.read_bytes().splitlines()[-1]) + 1
        assert path.stat().st_size <= bound, (i, path.stat().st_size)
        rewrites += inode is not None and path.stat().st_ino != inode  # a cut writes a new file over the log
        inode = path.stat().st_ino
    assert _shown(root)[-1]["runsCut"] == 2_000 - feedback_log.LINE_ITEMS
    # A cut comes once per a quarter of the byte cap appended, not on every append.
    assert 1 <= rewrites <= appended / (cap * feedback_log.LINE_BYTES * 0.25) + 1, (rewrites, appended)


def test_a_write_cuts_a_shown_log_that_is_over_its_bytes(tmp_path):
    # Lines as an older cybmem wrote them (a search's every hit): few lines, many bytes.
    root = _root(tmp_path)
    path = root / "web" / feedback_log.SHOWN_FILE
    entry = {"at": _now() - 30_000, "source": "mcp:search", "runId": "r7", "taskHash": None, "issues": [],
             "runs": [{"runId": CART if i == 0 else f"{i:040d}", "rank": i + 1} for i in range(250)]}
    path.write_bytes(json.dumps(entry).encode() + b"\n" * 1 + b"".join(
        json.dumps({**entry, "runId": f"other-{i}"}).encode() + b"\n" for i in range(11)))
    assert path.stat().st_size > 20 * feedback_log.LINE_BYTES * 1.25 and len(_shown(root)) <= 20
    res = _write(root, "r7", f"Used {CART[:8]}.", MEMORY_SHOWN_CAP="20")
    assert path.stat().st_size <= 20 * feedback_log.LINE_BYTES, "cut back to 20 x 4 kB"
    assert [d["runId"] for d in _shown(root)][-1] == "other-10", "the newest kept"
    assert _used(root)[-1]["runId"] == "r7" and _used(root)[-1]["used"][0]["runId"] == CART and not res.warnings


def test_a_bad_cap_is_one_warning_and_the_default():
    assert feedback.shown_cap(Settings.from_env({"CYBERINE_MEMORY_SHOWN_CAP": "lots"}, memory_dir="/x")) == (
        2000, "CYBERINE_MEMORY_SHOWN_CAP='lots' is not a whole number of at least 1; set it to e.g. 2000 or unset it "
              "(using 2000)")


# --- never on the failure path -----------------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["--json"], ["--strict"], ["--system"]])
def test_a_broken_log_never_changes_what_inject_prints(tmp_path, args):
    """shown.jsonl is a directory: inject prints what it prints without the log, exit 0, one warning line."""
    root = _root(tmp_path)
    off = _run("inject", TASK, "--project", "web", *args, env=_env(root, CYBERINE_MEMORY_FEEDBACK="0"))
    assert off.returncode == 0 and off.stderr == "" and "MEMORY" in off.stdout
    (root / "web" / feedback_log.SHOWN_FILE).mkdir()
    broken = _run("inject", TASK, "--project", "web", *args, env=_env(root))
    assert broken.returncode == 0
    if "--json" in args:  # recency moves with the clock between two processes: the scores may differ at 1e-6
        drop = lambda d: {k: v for k, v in d.items() if k not in ("runs", "floor", "issues")}  # noqa: E731
        a, b = json.loads(broken.stdout), json.loads(off.stdout)
        assert drop(a) == drop(b) and [r["runId"] for r in a["runs"]] == [r["runId"] for r in b["runs"]]
    else:
        assert broken.stdout == off.stdout
    assert broken.stderr.count("\n") == 1 and broken.stderr.startswith(
        f"warning: what was shown was not kept in {root / 'web' / feedback_log.SHOWN_FILE}: Is a directory")


def test_a_log_that_cannot_be_locked_never_changes_inject(tmp_path):
    root = _root(tmp_path)
    (root / "web" / ".feedback.lock").mkdir()
    inj = inject_task(TASK, _settings(root), project="web", strict=True)
    assert inj.block.startswith("MEMORY") and inj.warnings == [] and "not kept" in inj.feedback_warning


def test_damaged_logs_never_fail_a_write(tmp_path):
    root = _root(tmp_path)
    inject_task(TASK, _settings(root, RUN_ID="r-damaged"), project="web")
    with (root / "web" / feedback_log.SHOWN_FILE).open("ab") as fh:
        fh.write(b'{"at": "torn\n\xff\xfe not json\n[1, 2]\n{"runId": "r-damaged"}\n')
    _write(root, "r-damaged", f"Used {CART[:8]}.")
    [used] = _used(root)
    assert used["lines"] == 1 and used["used"][0]["runId"] == CART, "bad lines skipped"
    inject_task(TASK, _settings(root, RUN_ID="r-unwritable"), project="web")
    (root / "web" / feedback_log.USED_FILE).unlink()
    (root / "web" / feedback_log.USED_FILE).mkdir()
    result = _write(root, "r-unwritable", f"Used {CART[:8]}.")
    assert result.path.exists() and result.warnings == [
        f"what the run used was not noted in {root / 'web' / feedback_log.USED_FILE}: [Errno 21] Is a directory: "
        f"'{root / 'web' / feedback_log.USED_FILE}'"]


def test_off_keeps_nothing(tmp_path):
    root = _root(tmp_path)
    inject_task(TASK, _settings(root, RUN_ID="r", MEMORY_FEEDBACK="0"), project="web")
    _write(root, "r", f"Used {CART[:8]}.", MEMORY_FEEDBACK="0")
    logs = {feedback_log.SHOWN_FILE, feedback_log.USED_FILE, ".feedback.lock"}
    assert not logs & {p.name for p in (root / "web").iterdir()}


# --- redaction reaches the logs ------------------------------------------------------------------


def test_redact_renames_an_issue_id_in_the_logs(tmp_path):
    root = _root(tmp_path)
    secret = "purple-otter-vault"
    output = f"Done.\n\nACCOMPLISHED:\n- done\nISSUES:\n- The {secret} phrase leaks: in the logs\nNEXT:\n- none"
    write_run(make_run("r-leak", "Rotate the keys", start=_now() - 7_200_000, output=output), _settings(root),
              project="web")
    inject_task("The purple otter vault phrase leaks in the logs", _settings(root, RUN_ID="r-next"), project="web")
    leaked = f"the-{secret}-phrase-leaks"
    assert leaked in _shown(root)[0]["issues"]
    p = _run("redact", "r-leak", "--secret", secret, "--project", "web", env=_env(root))
    assert p.returncode == 0, p.stderr
    assert secret not in (root / "web" / feedback_log.SHOWN_FILE).read_text()
    assert "the-redacted-phrase-leaks" in _shown(root)[0]["issues"]
    assert str(root / "web" / feedback_log.SHOWN_FILE) not in p.stdout, "not named as still holding it"


# --- what the feedback says (cybmem.explore.usage, the notebook's functions) -----------------------------


def _line(run_id: str, started: int, block: int, used_ranks: list[int], fetched: int = 0) -> dict:
    used = [{"runId": f"u{k}", "how": ["named"], "rank": k, "shownBy": ["inject"]} for k in used_ranks]
    used += [{"runId": f"f{k}", "how": ["fetched"], "rank": None, "shownBy": ["mcp:show"]} for k in range(fetched)]
    return {"at": started + 1, "runId": run_id, "startedAt": started, "matchedBy": "runId", "lines": 1,
            "block": [{"runId": f"u{k}", "rank": k, "score": 1.0} for k in range(1, block + 1)], "blockIssues": [],
            "weights": {"source": "default"}, "used": used, "usedIssues": []}


def test_usage_by_rank_and_over_time():
    from cybmem.explore import usage

    day = 86_400_000
    frame = usage.used_frame([_line("a", T_2026, 3, [1]), _line("b", T_2026 + day, 2, [2], fetched=1),
                              _line("c", T_2026 + 40 * day, 3, []), _line("d", T_2026 + 41 * day, 0, [])])
    assert list(frame["runId"]) == ["a", "b", "c", "d"] and list(frame["usedRuns"]) == [1, 2, 0, 0]
    assert list(frame["fetched"]) == [0, 1, 0, 0] and list(frame["usedFromBlock"]) == [1, 1, 0, 0]
    by_rank = usage.usage_by_rank(frame)
    assert by_rank[["rank", "shown", "used"]].values.tolist() == [[1, 3, 1], [2, 3, 1], [3, 2, 0]]
    assert by_rank["rate"].round(3).tolist() == [0.333, 0.333, 0.0]
    monthly = usage.usage_over_time(frame, freq="MS")
    assert monthly.attrs["period"] == "month"
    assert monthly[["blocks", "usedBlock", "usedRuns"]].values.tolist() == [[2, 2, 2], [1, 0, 0]], "d showed no run"
    assert monthly["rate"].tolist() == [1.0, 0.0]
    from cybmem.explore import plots

    assert repr(plots.feedback_by_rank(by_rank)) == "<Figure: Block runs used, by rank (2 used)>"
    assert repr(plots.feedback_over_time(monthly)) == "<Figure: Runs that used the MEMORY block, per month (2 of 3 blocks)>"
    empty = usage.used_frame([])
    assert "no run was shown a block" in [t.get_text() for t in plots.feedback_by_rank(usage.usage_by_rank(empty)).axes[0].texts]
    assert len(usage.usage_over_time(empty)) == 0


T_2026 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def test_the_page_reads_the_stores_feedback_else_replays_it_and_says_so(tmp_path):
    from cybmem.explore import usage

    root = _root(tmp_path)
    store = MemoryStore(root, "web")
    replayed = usage.load_feedback(store, _settings(root))
    assert replayed.replayed and "a replay of its newest 46 runs (the project has no used.jsonl yet" in str(replayed)
    assert len(replayed.used) == 44 and not (root / "web" / feedback_log.USED_FILE).exists(), "a replay writes nothing"
    none = usage.load_feedback(store, _settings(root), replay_=False)
    assert none.used == [] and "none yet" in str(none)
    inject_task(TASK, _settings(root, RUN_ID="r-own"), project="web")
    _write(root, "r-own", f"Used {CART[:8]}.")
    own = usage.load_feedback(store, _settings(root))
    assert not own.replayed and [d["runId"] for d in own.used] == ["r-own"] and "1 written runs matched" in str(own)
    check = usage.check_weights(store, replayed.used, _settings(root))
    assert check.result.judgments == len(check.ranks) == 16 and check.result.derived is False
    assert sum(check.moves().values()) == 16 and check.moves()["higher"] >= 1
    assert check.summary().startswith("16 used judgments: MRR@10 0.9500 with the current weights, 1.0000 with the best")
    assert usage.check_weights(store, [], _settings(root)) is None


# --- malformed log lines (issue 29, item 7) -----------------------------------------------------

def _shown_then_damaged(tmp_path: Path, run_id: str, log: str, damage: bytes, *, write_first: bool = False) -> Path:
    """A root where ``run_id`` was shown the block (and, ``write_first``, written), then ``damage`` appended to ``log``."""
    root = _root(tmp_path)
    inject_task(TASK, _settings(root, RUN_ID=run_id), project="web")
    if write_first:
        _write(root, run_id, f"Used {CART[:8]}.")
    with (root / "web" / log).open("ab") as fh:
        fh.write(damage)
    return root


_BAD_USED = [
    b'{"at": 1, "runId": ["r"], "used": []}',
    b'{"at": 1, "runId": "r-judged", "used": [{"runId": ["a"]}]}',
    b'{"at": 1, "runId": "r-judged", "used": 5}',
    b'{"at": 1, "runId": "r-judged", "used": [{"runId": "a", "rank": "one"}]}',
    b'{"at": true, "runId": "r-judged", "used": []}',
    b'{"at": 1, "runId": "r-judged", "shownAt": "soon", "used": []}',
    b'{"at": "torn',
    b"[1, 2]",
]


@pytest.mark.parametrize("bad", _BAD_USED)
def test_a_malformed_used_line_is_skipped_with_one_warning_and_the_rest_kept(tmp_path, bad):
    """One malformed used.jsonl line broke `tune` and `eval` with a traceback (and the detached re-tune died)."""
    root = _shown_then_damaged(tmp_path, "r-judged", feedback_log.USED_FILE, bad + b"\n" + bad + b"\n",
                               write_first=True)
    env = _env(root)
    warning = f"warning: skipped 2 malformed line(s) of {root / 'web' / feedback_log.USED_FILE}"
    for args in (["tune", "--derive", "used", "--json"], ["eval", "--derive", "used", "--json"]):
        done = _run(*args, "--project", "web", env=env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("warning: ") == 1 and done.stderr.startswith(warning), done.stderr
        assert json.loads(done.stdout)["judgments"] == 1, "the good line still gives its judgment"
    auto = _run("tune", "--auto", "--project", "web", env=env)
    assert auto.returncode == 0 and auto.stdout.startswith("Kept the weights of project web"), auto.stdout + auto.stderr


_BAD_SHOWN = [
    b'{"at": %d, "source": "mcp:show", "runId": "r-torn", "runs": [{"runId": ["x"]}], "issues": []}',
    b'{"at": %d, "source": "mcp:show", "runId": "r-torn", "runs": 7, "issues": []}',
    b'{"at": %d, "source": "mcp:chain", "runId": "r-torn", "runs": [], "issues": [{"id": 1}]}',
    b'{"at": %d, "source": "mcp:show", "runId": "r-torn", "runs": [], "issues": [], "fetched": [3]}',
    b'{"at": %d, "source": ["inject"], "runId": "r-torn", "runs": [], "issues": []}',
    b'{"at": %d, "source": "inject", "runId": "r-torn", "runs": [{"runId": "x", "rank": [1]}], "issues": []}',
]


@pytest.mark.parametrize("bad", _BAD_SHOWN)
def test_a_malformed_shown_line_loses_nothing_else_of_the_run(tmp_path, bad):
    """One malformed shown.jsonl line lost the whole run's feedback."""
    root = _shown_then_damaged(tmp_path, "r-torn", feedback_log.SHOWN_FILE, (bad % _now()) + b"\n")
    result = _write(root, "r-torn", f"Used {CART[:8]}.")
    [used] = _used(root)
    assert used["lines"] == 1 and [u["runId"] for u in used["used"]] == [CART], "the good line still counts"
    assert result.warnings == [f"skipped 1 malformed line(s) of {root / 'web' / feedback_log.SHOWN_FILE} (not the JSON "
                               "object the log holds); the rest was read. A torn or hand-edited line can be deleted"]


# --- learning from use that cannot be gamed (issue 29, item 1) ------------------------------------


def _tide(tmp_path: Path, *, t0: int | None = None) -> Path:
    """The tide store (data-fixtures/time_related.py); ``t0``: when its first pair starts (default the fixture's own)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("time_related", FIXTURES.parent / "time_related.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write(tmp_path / "tide-memory", **({} if t0 is None else {"t0": t0}))


def _poison(root: Path, n: int, *, backdate: bool) -> None:
    """``n`` runs that fetch a decoy through the server's read-only `show`, then write their
    records saying nothing: each makes a "used" judgment that rewards the decoy (an old run that
    shares the follow-up's words, which the store's own judgments do not reward). Backdated:
    startedAt just after the follow-up started, where the store's judgment asks for the recent run."""
    recs = {p.stem: json.loads(p.read_text()) for p in (root / "tide" / "records").glob("*.json")}
    pairs = sorted(r[len("follows-"):] for r, rec in recs.items()
                   if r.startswith("follows-") and rec["endedAt"] < _now() - 86_400_000)
    for i in range(n):
        pair = pairs[i % len(pairs)]
        decoy, follows = f"decoy-{pair}", recs[f"follows-{pair}"]
        start = follows["startedAt"] + 60_000 + i if backdate else _now() - 120_000
        _fetch_then_write(root, "tide", make_run(f"poison-{i:03d}", follows["task"], start=start, minutes=1,
                                                 cwd="/home/dev/tide"), decoy)


def _fetch_then_write(root: Path, project: str, run: dict, fetched: str) -> None:
    """A run that fetches ``fetched`` through the server's read-only `show`, then writes ``run``
    (its record, saying nothing of it): the fetch alone makes its "used" judgment."""
    from cybmem.dispatch.feedback import mcp_entry
    from cybmem.store.feedback_log import keep_shown

    settings = Settings.from_env({"CYBERINE_RUN_ID": run["id"]}, memory_dir=root)
    keep_shown(root / project, [mcp_entry("show", {"run_id": fetched}, {"record": {"runId": fetched}}, settings)])
    write_run(run, settings, project=project)


def _history_score(root: Path, weights) -> float:
    from cybmem.retrieval.tuning import evaluate_weights

    ev = evaluate_weights(MemoryStore(root, "tide"), {"w": weights}, kinds=["issue", "parent"], progress=False, settings=Settings.from_env())
    return ev.rows["w"]["all"]


@pytest.mark.parametrize("backdate", [True, False])
def test_300_runs_that_fetch_a_shown_run_cannot_steer_the_weights(tmp_path, backdate):
    """The poisoning replayed through the real write path: the store tunes itself, then ~300 runs
    whose only act is a read-only `show` of a decoy write their records (backdated: to just after the
    moment the store's own judgment asks for the recent run; else at their real time). Without the
    guards `tune --save` saved weights that scored 1.0 -> 0.5 on the store's own judgments. Whatever it
    (or the automatic re-tune) saves now is no worse there, and weights.json says what it rested on."""
    from cybmem.operations.retune import auto_tune
    from cybmem.retrieval.weights import weights_for

    root = _tide(tmp_path)
    env = _env(root)
    first = _run("tune", "--project", "tide", "--save", env=env)
    assert first.returncode == 0, first.stderr
    settings = Settings.from_env(memory_dir=root)
    weights_file = root / "tide" / "weights.json"
    clean = weights_for(settings, MemoryStore(root, "tide")).weights
    _poison(root, 300, backdate=backdate)
    assert len(_used(root, "tide")) == 300, "every poisoned run made its used line"
    before = _history_score(root, clean)
    tuned = _run("tune", "--project", "tide", "--save", "--json", env=env)
    assert tuned.returncode in (0, 3), tuned.stderr
    answer = json.loads(tuned.stdout)
    assert answer["kinds"].get("used", 0) <= answer["kinds"]["raised"], "used judgments: at most half of the set"
    left = answer["usedLeftOut"]
    assert left == ({"clock": 300} if backdate else {"share": 300 - answer["kinds"]["used"]})
    production = weights_for(settings, MemoryStore(root, "tide")).weights
    assert _history_score(root, production) >= before, "never worse on the store's own judgments"
    if production != clean:
        saved = json.loads(weights_file.read_text())["tuned"]
        assert saved["kinds"] == answer["kinds"] and saved["usedLeftOut"] == left
    else:
        assert tuned.returncode == 3 and answer["notSaved"]
    line = auto_tune(MemoryStore(root, "tide"), settings)
    production = weights_for(settings, MemoryStore(root, "tide")).weights
    assert _history_score(root, production) >= before, line


@pytest.mark.parametrize("clock, counts", [
    ({}, True),
    ({"startedAt": -3 * 86_400_000}, False),  # backdated: the run would have lasted days
    ({"endedAt": -2 * 86_400_000, "startedAt": -2 * 86_400_000 - 60_000}, False),  # written long after it ended
    ({"endedAt": 3_600_000, "startedAt": 3_600_000 - 60_000}, False),  # written before it ended
    ({"shownAt": [-5 * 86_400_000, -5 * 86_400_000]}, False),  # shown what it used outside its run
])
def test_a_used_judgment_counts_only_when_the_runs_clock_is_plausible(tmp_path, clock, counts):
    root = _root(tmp_path)
    inject_task(TASK, _settings(root, RUN_ID="r-clock"), project="web")
    now = _now()
    start, end = now - 60_000 + clock.get("startedAt", 0), now + 240_000
    if "endedAt" in clock:
        start, end = now + clock["startedAt"], now + clock["endedAt"]
    write_run(make_run("r-clock", TASK, start=start, minutes=1, output=f"Used {CART[:8]}.", endedAt=end),
              _settings(root, RUN_ID="r-clock"))
    [line] = _used(root)
    assert line["startedAt"] == start and line["endedAt"] == end and line["shownAt"][0] <= line["shownAt"][1]
    if "shownAt" in clock:
        line["shownAt"] = [now + x for x in clock["shownAt"]]
    snap = load_snapshot(MemoryStore(root, "web"))
    left: dict = {}
    js = used_judgments(snap, used=[line], left_out=left)
    assert bool(js) == counts and left == ({} if counts else {"clock": 1})


def test_a_run_names_at_most_three_used_runs(tmp_path):
    root = _root(tmp_path)
    settings = _settings(root, RUN_ID="r-many", MEMORY_TOPK="8")
    inj = inject_task(TASK, settings, project="web")
    shown = [h.run_id for h in inj.runs]
    assert len(shown) >= 5
    _write(root, "r-many", "Used " + ", ".join(r[:8] for r in shown) + ".", RUN_ID="r-many")
    snap = load_snapshot(MemoryStore(root, "web"))
    left: dict = {}
    [(_, j)] = used_judgments(snap, left_out=left)
    ended = {r: e for r, e in zip(snap.records.column("runId").to_pylist(), snap.ended_ms())}
    assert len(j.relevant) == 3 and left == {"capped": sum(ended[r] <= j.as_of for r in shown) - 3}


def _words(rng, n: int = 3) -> str:
    return " ".join("".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3)) for _ in range(n))


def _parents_then_fetchers(root: Path, n: int = 40) -> None:
    """Project act: ``n`` runs over the last 20 hours, each dispatched by the one before (the store's
    only judgments are "parent" ones, met whatever the weights), then ``n`` runs with believable
    clocks that each fetch one of them with `show` and write a record that shares the first run's words."""
    import random

    rng, now, minute = random.Random(5), _now(), 60_000
    decoy = "zorblat quaxion miradel"
    ids: list[str] = []
    for i in range(n):
        end = now - 20 * 60 * minute + i * 25 * minute
        task = f"Implement the {decoy if i == 0 else _words(rng, 2)} module"
        run = make_run(f"legit-{i:03d}", task, start=end - 5 * minute, minutes=5, cwd="/home/dev/act",
                       **({"lineage": {"parentRunId": ids[-1]}} if ids else {}))
        write_run(run, Settings.from_env(memory_dir=root))
        ids.append(run["id"])
    for i, target in enumerate(ids):
        start = now - 20 * 60 * minute + i * 25 * minute + 12 * minute  # just after ``target`` ended
        run = make_run(f"fetcher-{i:03d}", f"Fix the {decoy} {_words(rng, 1)} handling", start=start, minutes=1,
                       cwd="/home/dev/act", endedAt=now)
        _fetch_then_write(root, "act", run, target)


def _web_then_fetchers(root: Path, n: int = 40) -> None:
    """The fixtures' project web (9 resolved and 14 parent judgments), then ``n`` runs written now
    that each fetch the same run with `show`, with tasks made of its words and noise."""
    import random

    rng, words = random.Random(7), ["vite", "react", "skeleton", "typescript", "storefront", "strict"]
    for i in range(n):
        run = make_run(f"fetcher-{i:03d}", f"{' '.join(rng.sample(words, 3))} {_words(rng)}",
                       start=_now() - 10 * 60_000, minutes=10)
        _fetch_then_write(root, "web", run, "4403ccec-71ea-526d-8201-08eb54a78020")


@pytest.mark.parametrize("build, project, kinds, left, own", [
    (_parents_then_fetchers, "act", {"parent": 39}, {"share": 40}, 0),
    (_web_then_fetchers, "web", {"parent": 14, "resolved": 9, "used": 9}, {"share": 31}, 9),
])
def test_used_judgments_count_only_as_far_as_the_stores_own_judgments_that_test_the_weights(
        tmp_path, build, project, kinds, left, own):
    """Issue 29, item 1: parent judgments score 1.0 under any weights, yet the share cap counted
    them, so (act) 39 fetches filled a store whose own judgments were all parent ones and `tune
    --save` saved weights they alone had set (the history check, on those parent judgments, could
    not lose), and (web) 23 fetches were 72% of the judgments that test the weights and lifted the
    store over the minimum of 30. Now they count up to the store's own judgments that test the
    weights (0 and 9 here): nothing is saved, and why is on stderr."""
    root = _root(tmp_path) if project == "web" else tmp_path / "memory"
    build(root)
    assert len(_used(root, project)) == 40, "every fetch made its used line"
    env = _env(root)
    answer = json.loads(_run("tune", "--project", project, "--json", env=env).stdout)
    assert answer["kinds"] == kinds and answer["usedLeftOut"] == left
    assert answer["testsWeights"] == own + kinds.get("used", 0) < 30
    if kinds.get("used"):
        assert answer["validation"]["history"]["testsWeights"] == own
    saved = _run("tune", "--project", project, "--save", env=env)
    assert saved.returncode == 3, saved.stdout + saved.stderr
    assert f"Not saved: only {answer['testsWeights']} judgment(s) test the weights" in saved.stderr
    assert f'"used" judgments left out: {left["share"]} past as many as the store\'s own judgments' in saved.stdout
    assert not (root / project / "weights.json").exists()


def test_used_judgments_still_tune_a_store_with_enough_of_its_own(tmp_path):
    """A store with its own judgments (tide: 70 raised) and 30 runs that fetched the run the ledger
    says they needed: all 30 count, and `tune --save` saves what the store's judgments alone teach."""
    # The history ends a week before the honest runs, whatever the date: with the fixture's own
    # dates (into 2027) the honest runs' place among the pairs, and with it the score asserted
    # below, moved with the day the test ran on.
    now = _now()
    root = _tide(tmp_path, t0=now - 71 * 7 * 86_400_000)
    recs = {p.stem: json.loads(p.read_text()) for p in (root / "tide" / "records").glob("*.json")}
    for i in range(30):
        run = make_run(f"honest-{i:03d}", recs[f"follows-{i:03d}"]["task"], start=now - 120_000, minutes=1,
                       cwd="/home/dev/tide")
        _fetch_then_write(root, "tide", run, f"opens-{i:03d}")
    done = _run("tune", "--project", "tide", "--save", "--json", env=_env(root))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["kinds"] == {"raised": 70, "used": 30} and answer["usedLeftOut"] == {} and answer["refusal"] is None
    assert answer["validation"]["history"] == {"judgments": 70, "testsWeights": 70, "tuned": 1.0, "current": 0.335714}
    tuned = json.loads((root / "tide" / "weights.json").read_text())
    assert {k: tuned[k] for k in ("w_kw", "w_rec", "w_lin", "half_life_days")} == \
        {"w_kw": 0.9, "w_rec": 0.9, "w_lin": 0.2, "half_life_days": 1.0}
    assert tuned["tuned"]["history"]["testsWeights"] == 70 and tuned["tuned"]["kinds"] == answer["kinds"]


def test_with_used_judgments_the_stores_own_must_be_half_the_minimum():
    """The backstop of the share cap, which counts the judgments derived: those of the store's own
    that can be evaluated must still be MIN_OWN_JUDGMENTS, or the history check means nothing."""
    from cybmem.retrieval.validation import MIN_JUDGMENTS, MIN_OWN_JUDGMENTS, Validation, refusal_of
    from cybmem.retrieval.weights import Weights

    current = Weights()
    v = Validation(earlier=15, later=15, tuned=Weights(w_lin=0.5), tuned_earlier=1.0, current_earlier=0.5,
                   tuned_later=1.0, current_later=0.5, interval=(0.2, 0.4), history_judgments=14,
                   history_tests=MIN_OWN_JUDGMENTS - 1, history_tuned=1.0, history_current=1.0)
    assert MIN_OWN_JUDGMENTS == 15 == MIN_JUDGMENTS // 2
    assert refusal_of(30, 30, v, current) == (
        "only 14 of the store's own judgments (the ledger and the lineage, without what runs said they used) test "
        'the weights; with "used" judgments among them at least 15 must, since used ones may be at most half of the '
        "30 a tuning needs, or the check on the store's own history has too little behind it")
    v.history_tests = MIN_OWN_JUDGMENTS
    assert refusal_of(30, 30, v, current) is None
    v.history_tests = None  # no used judgment in the set
    assert refusal_of(30, 30, v, current) is None
