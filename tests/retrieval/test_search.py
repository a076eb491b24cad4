"""Retrieval on hand-made stores (one axis at a time), --as-of, and the preamble on golden files."""

import os
from pathlib import Path

import numpy as np
import pytest

from cybmem.dispatch.preamble import FOOTER, HEADER, estimate_tokens, inject, strip
from cybmem.operations.write import write_run
from cybmem.retrieval.weights import Weights
from cybmem.dispatch.inject import inject_task, memory_block
from cybmem.store.records import parse_time
from cybmem.retrieval.search import search
from cybmem.retrieval.weights import weights_for
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore

from conftest import FIXTURES, MIN, T0, make_run, synthetic_snapshot


#: These tests check the linear formula's order, or outputs written with it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("linear_ranker")

GOLDEN = Path(__file__).resolve().parents[2] / "data-fixtures" / "golden"
DAY = 86_400_000


@pytest.fixture(autouse=True)
def _pool_at_any_size(monkeypatch):
    """The bounded pool at every store size here (production scores every record below
    candidates.DENSE_BELOW): test_candidates.py checks the pool ranks exactly, the other modules the dense path."""
    monkeypatch.setattr("cybmem.retrieval.candidates.DENSE_BELOW", 0)


NOW = 1_793_491_200_000  # 2026-11-01, a fixed "now" for the fixture store (runs 2026-10-01 .. 2026-10-27)

KW = Weights(w_kw=1, w_rec=0, w_lin=0, w_vec=0)
REC = Weights(w_kw=0, w_rec=1, w_lin=0, w_vec=0, half_life_days=10)
LIN = Weights(w_kw=0, w_rec=0, w_lin=1, w_vec=0)


def three(settings, **lineage):
    """Three records: a (oldest), b, c (newest), with optional per-record lineage dicts."""
    tasks = {"a": "Fix the flaky login test in CI", "b": "Add dark mode to the settings page", "c": "Document the deploy pipeline"}
    for i, (rid, task) in enumerate(tasks.items()):
        write_run(make_run(rid, task, start=T0 + i * DAY, lineage=lineage.get(rid, {})), settings)
    return MemoryStore(settings.memory_dir, "web")


def ids(result):
    return [h.run_id for h in result.hits]


def test_keyword_axis(settings):
    store = three(settings)
    res = search(store, "flaky login", weights=KW, now_ms=NOW, settings=Settings.from_env())
    assert ids(res)[0] == "a" and res.hits[0].contributions["keyword"] == pytest.approx(1.0)
    assert all(h.contributions["keyword"] == 0 for h in res.hits[1:])


def test_recency_axis(settings):
    store = three(settings)
    now = T0 + 2 * DAY + 10 * MIN  # c ended just now
    res = search(store, "anything", weights=REC, now_ms=now, settings=Settings.from_env())
    assert ids(res) == ["c", "b", "a"]
    b = res.hits[1]
    assert b.values["recency"] == pytest.approx(pow(2.718281828, -1 / 10), rel=1e-4), "exp(-ageDays/halfLife), age 1 day"


def test_lineage_axis_parent_chain_and_chat(settings):
    store = three(settings, b={"chatSessionId": "chat-1"}, c={"parentRunId": "a"})
    res = search(store, "x", weights=LIN, now_ms=NOW, parent_run_id="c", settings=Settings.from_env())
    by = {h.run_id: h.values["lineage"] for h in res.hits}
    assert by["c"] == 1.0 and by["a"] == 1.0, "the parent and its ancestors"
    res = search(store, "x", weights=LIN, now_ms=NOW, chat_session_id="chat-1", settings=Settings.from_env())
    by = {h.run_id: h.values["lineage"] for h in res.hits}
    assert by["b"] > by["a"] and by["b"] >= 0.8


def test_superseded_records_never_rank(settings):
    store = three(settings)
    write_run(make_run("a2", "Fix the flaky login test in CI, corrected", start=T0 + 5 * DAY), settings, supersedes="a")
    res = search(store, "flaky login", weights=KW, now_ms=NOW, settings=Settings.from_env())
    assert "a" not in ids(res) and ids(res)[0] == "a2"


def test_as_of_ignores_later_records_and_measures_recency_from_then(settings):
    store = three(settings)
    as_of = T0 + DAY + 10 * MIN  # after b ended, before c
    res = search(store, "deploy pipeline dark mode login", weights=Weights(), as_of=as_of, settings=Settings.from_env())
    assert set(ids(res)) == {"a", "b"} and res.now_ms == as_of and res.candidates == 2
    assert res.hits[0].run_id == "b" or res.hits[0].values["recency"] < 1
    assert {h.run_id: h.values["recency"] for h in res.hits}["b"] == pytest.approx(1.0, abs=1e-6)


def test_as_of_sees_the_record_before_its_correction(settings):
    store = three(settings)
    write_run(make_run("a2", "corrected", start=T0 + 5 * DAY), settings, supersedes="a")
    res = search(store, "flaky login", weights=KW, as_of=T0 + 3 * DAY, settings=Settings.from_env())
    assert ids(res)[0] == "a"


def test_parse_time():
    assert parse_time("1761955200000") == T0
    assert parse_time("2025-11-01") == T0
    assert parse_time("2025-11-01T01:00:00+01:00") == T0
    with pytest.raises(Exception, match="neither epoch milliseconds nor an ISO date"):
        parse_time("last week")


def test_weights_precedence_files_then_env(settings, monkeypatch):
    store = three(settings)
    (settings.memory_dir / "weights.json").write_text('{"w_kw": 0.9, "w_lin": 0.05}')
    (store.dir / "weights.json").write_text('{"w_kw": 0.7}')
    w = weights_for(settings, store).weights
    assert (w.w_kw, w.w_lin) == (0.7, 0.05)
    env = Settings.from_env({**os.environ, "CYBERINE_MEMORY_W_KW": "0.2"})
    assert weights_for(env, store).weights.w_kw == 0.2
    (store.dir / "weights.json").write_text('{"w_kw": "lots"}')
    with pytest.raises(Exception, match="weights.json"):
        weights_for(settings, store)


# --- the preamble -----------------------------------------------------------------


def fixture_settings(**env):
    return Settings.from_env({**{f"CYBERINE_{k}": str(v) for k, v in env.items()}}, memory_dir=FIXTURES)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CYBMEM_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"golden {name} differs; rerun with CYBMEM_UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize(
    "name, project, task, env",
    [
        ("web-checkout.txt", "web", "Fix the checkout error banner when the cart API is down", {}),
        ("web-cart-drawer-top5.txt", "web", "The cart drawer e2e test is flaky again", {"MEMORY_TOPK": 5}),
        ("web-token-cap.txt", "web", "Improve product search relevance", {"MEMORY_MAX_TOKENS": 200}),
        ("api-webhook.txt", "api", "Stripe webhook retries are not idempotent", {}),
    ],
)
def test_preamble_golden(fixture_copy, name, project, task, env):
    settings = Settings.from_env({f"CYBERINE_{k}": str(v) for k, v in env.items()}, memory_dir=fixture_copy)
    block = memory_block(MemoryStore(fixture_copy, project), task, settings, now_ms=NOW)
    check_golden(name, block)
    assert block.startswith(HEADER + "\n") and block.endswith("\n" + FOOTER + "\n")
    assert estimate_tokens(block) <= settings.max_tokens
    again = memory_block(MemoryStore(fixture_copy, project), task, settings, now_ms=NOW)
    assert again == block, "deterministic"


def test_token_cap_never_cuts_a_line(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    full = memory_block(store, "cart drawer", Settings.from_env({"CYBERINE_MEMORY_TOPK": "10"}, memory_dir=fixture_copy), now_ms=NOW)
    full_runs = [line for line in full.splitlines() if line.startswith("- run ")]
    for cap in (60, 120, 250, 400, 800):
        block = memory_block(store, "cart drawer", Settings.from_env({"CYBERINE_MEMORY_TOPK": "10", "CYBERINE_MEMORY_MAX_TOKENS": str(cap)}, memory_dir=fixture_copy), now_ms=NOW)
        assert estimate_tokens(block) <= cap
        if block:
            assert block.startswith(HEADER) and block.endswith(FOOTER + "\n")
            lines = block.splitlines()
            runs = [line for line in lines if line.startswith("- run ")]
            assert runs == full_runs[: len(runs)], "the runs that fit are the first of the uncapped block, whole"
            section = block.split("Open issues in this project:\n")[1].splitlines()[:-1] if "Open issues" in block else []
            for line in section:  # an issue listed here is one the uncapped block names (on a raised: line or listed)
                if not line.startswith("- ... and"):
                    assert line.split(":")[0][2:].split(", ")[0] in full, line
            rest = set(lines) - set(section) - {"Open issues in this project:"}
            assert rest <= set(full.splitlines()), "every other line is a whole line of the uncapped block"


def test_empty_store_has_no_block(settings):
    store = MemoryStore(settings.memory_dir, "web")
    assert memory_block(store, "anything", settings) == ""
    assert inject("anything", memory_block(store, "anything", settings)) == "anything"


def test_disabled_memory_has_no_block(fixture_copy):
    settings = Settings.from_env({"CYBERINE_MEMORY": "0"}, memory_dir=fixture_copy)
    result = inject_task("cart drawer", settings, project="web")
    assert (result.block, result.prompt, result.warnings) == ("", "cart drawer", [])


def test_strip_inverts_inject_on_every_fixture_task(fixture_copy):
    settings = Settings.from_env({}, memory_dir=fixture_copy)
    tasks = []
    for slug in ("web", "api", "web-7663e1"):
        tasks += [r.task for r in MemoryStore(fixture_copy, slug).records()]
    tasks += ["", "x", "multi\nline\r\nwith CRLF\n", "  padded  ", "mentions END MEMORY in prose", "TASK: looks wrapped?"]
    block = memory_block(MemoryStore(fixture_copy, "web"), "cart", settings, now_ms=NOW)
    assert block
    for task in tasks:
        clean = strip(task)
        assert strip(inject(clean, block)) == clean


def _issue_lines(block: str) -> list[str]:
    return [line for line in block.split("Open issues in this project:\n")[1].splitlines()[:-1]]


def test_open_issues_are_ranked_by_relevance_to_the_task(settings):
    out = "x\n\nACCOMPLISHED:\n- a\nISSUES:\n- {t}\nNEXT:\n- none\n"
    write_run(make_run("a", "Fix the cart drawer", start=T0, output=out.format(t="Cart drawer flickers on open")), settings)
    names = ["alpha", "bravo", "charlie", "delta", "echo"]
    for i, name in enumerate(names):
        write_run(make_run(f"o{i}", f"Unrelated chore {name}", start=T0 + (i + 1) * DAY, output=out.format(t=f"Chore problem {name}")), settings)
    one = Settings.from_env({"CYBERINE_MEMORY_TOPK": "1"}, memory_dir=settings.memory_dir)
    block = memory_block(MemoryStore(settings.memory_dir, "web"), "drawer flickering", one, now_ms=NOW)
    # The one run shown names its issue on its raised line, marked open; the section then brings the
    # others, most recent first (none of them matches the task, which relates to the project).
    assert "  raised: cart-drawer-flickers-on-open (open)" in block
    lines = _issue_lines(block)
    assert [line.split(":")[0] for line in lines] == [f"- chore-problem-{n}" for n in reversed(names)]
    # A task that relates to nothing here: no run, one line saying so, and only an issue whose own
    # text matches it.
    block = memory_block(MemoryStore(settings.memory_dir, "web"), "quantum entanglement routing", one, now_ms=NOW)
    assert block.splitlines()[1] == "- (no earlier run relates to this task: no run holds any of its words)"
    assert "Open issues in this project:" not in block and "- run " not in block
    write_run(make_run("q", "Unrelated chore", start=T0 + 9 * DAY, output=out.format(t="Quantum entanglement routing drops packets")),
              settings)
    block = memory_block(MemoryStore(settings.memory_dir, "web"), "quantum entanglement routing", one, now_ms=NOW)
    assert "- run " in block  # the run that raised it now relates to the task
    assert "quantum-entanglement-routing-drops-packets (open)" in block
    # An issue another tool opened (no run carries it): listed on its own text, under the one line.
    from cybmem.store.records import IssueEvent

    MemoryStore(settings.memory_dir, "web").append_issue_events(
        [IssueEvent("lidar-calibration-drift", T0 + 10 * DAY, "opened", "tracker", "Lidar calibration drift")])
    block = memory_block(MemoryStore(settings.memory_dir, "web"), "lidar calibration drift", one, now_ms=NOW)
    assert block.splitlines()[1].startswith("- (no earlier run relates to this task")
    assert _issue_lines(block) == ["- lidar-calibration-drift: Lidar calibration drift (opened 2025-11-11, run tracker)",
                                   "- ... and 7 more open issues (`cybmem issues` lists them)"]
    # Asked about one chore, its issue leads the section.
    block = memory_block(MemoryStore(settings.memory_dir, "web"), "the charlie chore", Settings.from_env(
        {"CYBERINE_MEMORY_TOPK": "0"}, memory_dir=settings.memory_dir), now_ms=NOW)
    assert _issue_lines(block)[0].startswith("- chore-problem-charlie:")


def test_issue_section_is_capped_deduplicated_and_says_how_many_more(settings):
    store = MemoryStore(settings.memory_dir, "web")
    out = "x\n\nACCOMPLISHED:\n- a\nISSUES:\n{items}\nNEXT:\n- none\n"
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]
    titles = [f"Problem number {w}" for w in words]
    write_run(make_run("a", "Big audit", start=T0, output=out.format(items="\n".join(f"- {t}" for t in titles))), settings)
    from cybmem.store.records import IssueEvent

    # One title under two ids (another tool opened it again under its own id): shown once.
    store.append_issue_events([IssueEvent("other-id", T0 + 1, "opened", "a", "Problem number eight")])
    s = Settings.from_env({"CYBERINE_MEMORY_TOPK": "0", "CYBERINE_MEMORY_ISSUES": "3"}, memory_dir=settings.memory_dir)
    lines = _issue_lines(memory_block(store, "problem number eight", s, now_ms=NOW))
    assert lines[0].startswith(("- problem-number-eight, other-id: Problem number eight", "- other-id, problem-number-eight"))
    assert len(lines) == 4 and lines[-1] == "- ... and 6 more open issues (`cybmem issues` lists them)"  # 10 ids, 4 shown
    off = Settings.from_env({"CYBERINE_MEMORY_ISSUES": "0"}, memory_dir=settings.memory_dir)
    assert "Open issues" not in memory_block(store, "problem", off, now_ms=NOW)


def test_issue_section_keeps_to_a_third_of_the_budget(settings):
    out = "x\n\nACCOMPLISHED:\n- a\nISSUES:\n{items}\nNEXT:\n- none\n"
    items = "\n".join(f"- A rather long issue title about subsystem {i} that keeps going on and on" for i in range(20))
    write_run(make_run("a", "Audit the subsystems", start=T0, output=out.format(items=items)), settings)
    for budget in (150, 300, 600, 1500):
        s = Settings.from_env({"CYBERINE_MEMORY_ISSUES": "20", "CYBERINE_MEMORY_MAX_TOKENS": str(budget)}, memory_dir=settings.memory_dir)
        block = memory_block(MemoryStore(settings.memory_dir, "web"), "subsystem", s, now_ms=NOW)
        if "Open issues in this project:" in block:
            section = "Open issues in this project:" + block.split("Open issues in this project:")[1].rsplit("END MEMORY", 1)[0]
            assert len(section) <= (budget * 4) / 3, (budget, len(section))


def test_candidates_hide_corrected_runs_and_hand_out_a_fresh_mask_each_time():
    """The current candidates (corrections looked up over every run id once per snapshot) are a new
    array on every call: a caller that narrows its own copy (tuning leaves the query's run out)
    changes nothing for the next."""
    import pyarrow as pa

    from cybmem.store.keyword_index import KeywordIndex
    from cybmem.store.snapshot import Snapshot

    n = 6
    ids = [f"r{i}" for i in range(n)]
    supersedes = [None, None, "r1", None, None, "r3"]
    nulls = pa.nulls(n, pa.string())
    snap = Snapshot(None, pa.table({
        "runId": ids, "parentRunId": nulls, "previousRunId": nulls, "rootRunId": nulls, "chatSessionId": nulls,
        "endedAt": pa.array([T0 + i * 3_600_000 for i in range(n)], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "supersedes": pa.array(supersedes, pa.string()), "supersededBy": nulls,
    }), None, KeywordIndex.build([["w"]] * n))
    first = snap.candidates(None)
    assert first.tolist() == [True, False, True, False, True, True]
    first[:] = False
    assert snap.candidates(None).tolist() == [True, False, True, False, True, True]
    assert snap.candidates(T0 + 4 * 3_600_000).tolist() == [True, False, True, True, True, False]  # r3 corrected later


@pytest.mark.parametrize("method", [None, "exact", "binary"])
def test_the_pinned_parent_comes_first_with_the_scores_it_would_have(method):
    """pin_parent: the parent row first whatever its score (pool, mat-vec and bounded vector
    paths alike), its per-axis scores those of scoring every record, then the top k - 1 others."""
    import numpy as np

    from cybmem.retrieval.search import dispatch_context, rank_query
    from cybmem.retrieval.scoring import lineage_affinity, score
    from cybmem.store.tokens import tokenize
    from cybmem.retrieval.vectors import VectorIndex, VectorQuery

    snap = synthetic_snapshot()
    r = snap.records
    rng = np.random.default_rng(11)
    index = VectorIndex.from_matrix(rng.standard_normal((snap.n, 16)).astype(np.float32))
    qvec = rng.standard_normal(16).astype(np.float32)
    weights = Weights(w_vec=0.05) if method else Weights()
    now = T0 + 3001 * 3_600_000
    mask = snap.candidates(None)
    for query in ("cart drawer", "teardown order fixture"):
        for parent in ("r00010", "r01500", "r02998"):
            vec = (lambda: VectorQuery(index, qvec, method)) if method else (lambda: None)
            plain = rank_query(snap, query, k=10, weights=weights, now_ms=now, parent_run_id=parent, vector=vec())
            pinned = rank_query(snap, query, k=10, weights=weights, now_ms=now, parent_run_id=parent, vector=vec(),
                                pin_parent=True)
            row = int(parent[1:])
            assert pinned.pinned == row and pinned.top[0] == row
            assert pinned.top[1:] == [i for i in plain.top if i != row][:9]
            ctx = dispatch_context(snap, mask, parent, None)
            lin = lineage_affinity(r.column("runId"), r.column("parentRunId"), r.column("previousRunId"),
                                   r.column("rootRunId"), r.column("chatSessionId"), ctx)
            dense = score(keyword_raw=snap.index.scores(tokenize(query)), ended_at_ms=snap.ended_ms(), now_ms=now,
                          lineage=lin, vector_cos=index.exact(qvec) if method else None, weights=weights, mask=mask)
            got = pinned.scored.total[pinned.local[0]]
            assert got == pytest.approx(dense.total[row], abs=1e-5), (query, parent)
    unknown = rank_query(snap, "cart drawer", k=10, weights=Weights(), now_ms=now, parent_run_id="nope", pin_parent=True)
    assert unknown.pinned is None and unknown.top == rank_query(snap, "cart drawer", k=10, weights=Weights(), now_ms=now,
                                                                  parent_run_id="nope").top


def test_a_corrected_parent_is_shown_by_its_correction(settings):
    """The parent a dispatcher names was corrected since (a record supersedes it): dispatch shows
    the correction first, as search would show it instead of the superseded record; as of a
    moment before the correction, the parent itself."""
    DAY = 86_400_000
    for i, task in enumerate(["Add client-side routing", "Write the release notes", "Bump the dependencies",
                              "Fix the login redirect loop", "Speed up the product list"]):
        write_run(make_run(f"r{i}", task, start=T0 + i * DAY), settings)
    write_run(make_run("r0-fix", "Add client-side routing, corrected", start=T0 + 10 * DAY), settings, supersedes="r0")
    task = "Tune the cache headers of the API"
    inj = inject_task(task, settings, project="web", parent_run_id="r0", now_ms=T0 + 12 * DAY)
    assert inj.runs[0].run_id == "r0-fix" and inj.runs[0].pinned == "parent"
    assert "r0" not in [h.run_id for h in inj.runs]
    before = inject_task(task, settings, project="web", parent_run_id="r0", as_of=T0 + 5 * DAY)
    assert before.runs[0].run_id == "r0" and before.runs[0].pinned == "parent"
    gone = inject_task(task, settings, project="web", parent_run_id="r9", now_ms=T0 + 12 * DAY)
    assert not any(h.pinned for h in gone.runs) and gone.warnings == []


# --- the floor: a run enters the block only on evidence about the task ---------------------------------


def _tiny_snapshot(texts: list[str]):
    import pyarrow as pa

    from cybmem.store.keyword_index import KeywordIndex
    from cybmem.store.snapshot import Snapshot
    from cybmem.store.tokens import tokenize

    n = len(texts)
    ids = [f"r{i}" for i in range(n)]
    nulls = pa.nulls(n, pa.string())
    table = pa.table({
        "runId": ids, "parentRunId": nulls, "previousRunId": pa.array([None] + ids[:-1], pa.string()), "rootRunId": nulls,
        "chatSessionId": nulls, "endedAt": pa.array([T0 + i * 3_600_000 for i in range(n)], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "supersedes": nulls, "supersededBy": nulls,
    })
    return Snapshot(None, table, None, KeywordIndex.build([tokenize(t) for t in texts]))


def test_evidence_is_judged_per_run_against_chance_in_the_store():
    from cybmem.retrieval.evidence import FULL, OUT, POINTER, judge, specific_terms
    from cybmem.retrieval.search import rank_query
    from cybmem.store.tokens import tokenize

    texts = ["rework the tokenizer for unicode identifiers", "tokenizer splits unicode identifiers wrongly",
             "bump the ci image", "release notes for 2.1", "bump the ci image again", "update the changelog",
             "fix the docs", "fix the build", "fix the release", "fix the tokenizer cache"]
    snap = _tiny_snapshot(texts + [f"routine chore {i} fix" for i in range(100)])
    w = Weights(w_kw=0.5, w_rec=0.35, w_lin=0.05)
    now = T0 + 10 * 3_600_000
    # "fix" is held by 104 of 110 runs (common at 30%): it carries nothing alone; "tokenizer" and
    # "unicode identifiers" are specific. The word no run holds ("breaks") counts for nothing.
    ev = specific_terms(snap.index, tokenize("fix: tokenizer breaks on unicode identifiers"))
    assert ev.common_df == 33 and ev.specific == ["token", "unicod", "identifi"]
    related = rank_query(snap, "fix: tokenizer breaks on unicode identifiers", k=8, weights=w, now_ms=now, evidence=True)
    assert sorted(related.top) == [0, 1, 9], "only runs holding a term that is not common; recency lets nothing in"
    tiers = dict(zip(related.top, related.tiers))
    assert tiers[0].tier == tiers[1].tier == FULL and tiers[0].nats > 2, "three rare terms together: beyond chance"
    assert tiers[9].tier == POINTER and "fix" in tiers[9].common and "token" in tiers[9].terms
    # Words no run holds do not count against a task: the same runs and tiers with a hash and a name added.
    longer = rank_query(snap, "fix: tokenizer breaks on unicode identifiers Change-Id I8f3a2b9c dmitri", k=8,
                        weights=w, now_ms=now, evidence=True)
    assert longer.top == related.top and [t.tier for t in longer.tiers] == [t.tier for t in related.tiers]
    # A task whose shared words are all common here: no run, and the reason says why.
    foreign = rank_query(snap, "fix the lidar sensor drift", k=8, weights=w, now_ms=now, evidence=True)
    assert foreign.top == [] and foreign.evidence.reason() == (
        "no earlier run relates to this task: the words runs share with it (1) are common here, each held by at least 33 "
        "of this project's 110 runs")
    none = rank_query(snap, "calibrate the lidar sensor", k=8, weights=w, now_ms=now, evidence=True)
    assert none.top == [] and none.evidence.reason() == "no earlier run relates to this task: no run holds any of its words"
    # The parent a dispatcher names is shown (in full) whatever its evidence; a close vector makes a pointer.
    pinned = rank_query(snap, "calibrate the lidar sensor", k=8, weights=w, now_ms=now, evidence=True,
                        parent_run_id="r3", pin_parent=True)
    assert pinned.top == [3] and pinned.tiers[0].tier == FULL
    cos = np.full(110, 0.1, dtype=np.float32)
    cos[3], cos[5] = 0.7, 0.59
    vw = Weights(w_kw=0.5, w_rec=0.35, w_lin=0.05, w_vec=0.2, floor_vec=0.6)
    by_vector = rank_query(snap, "calibrate the lidar sensor", k=8, weights=vw, now_ms=now, evidence=True, vector=cos)
    assert by_vector.top == [3] and by_vector.tiers[0].tier == POINTER, "a close vector lets a run in"
    # Without a word to judge by (a chat session's start) every run may enter, in full.
    bare = rank_query(snap, "the", k=3, weights=w, now_ms=now, evidence=True)
    assert len(bare.top) == 3 and {t.tier for t in bare.tiers} == {FULL}
    assert judge(snap.index, ev, []) == [] and OUT == "out"


def test_term_hits_are_the_postings_of_the_rows_asked_about():
    from cybmem.store.keyword_index import KeywordIndex

    docs = [["a", "b"], ["b", "c"], ["c"], ["a", "c", "d"]]
    idx = KeywordIndex.build(docs[:2]).extend(docs[2:])  # two segments
    hits = idx.term_hits(["c", "a", "zz", "a"], np.array([3, 0, 2]))
    assert hits.terms == ["c", "a", "zz"] and hits.df.tolist() == [3, 2, 0]
    assert hits.held.tolist() == [[True, True, False], [False, True, False], [True, False, False]]
    gone = idx.remove([3]).term_hits(["a"], np.array([3, 0]))
    assert gone.held.tolist() == [[False], [True]], "a removed document holds nothing"
