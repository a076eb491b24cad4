"""W3C PROV: the history as PROV-JSON and PROV-N, read back by prov's own reader, with exact counts."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prov.model as prov_model

from cybmem.cli.app import app  # noqa: E402
from cybmem.errors import CybmemError, NotFoundError  # noqa: E402
from cybmem.exchange.export import all_stores  # noqa: E402
from cybmem.exchange.prov import NAMESPACE, export_prov, prov_counts, provenance, provn_path  # noqa: E402
from cybmem.store.records import IssueEvent, Lineage, MemoryRecord, Outcome, Worker  # noqa: E402
from cybmem.store.memory_store import MemoryStore  # noqa: E402

from conftest import MIN, T0  # noqa: E402

runner = CliRunner()
PM = prov_model


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def expected_counts(root: Path, slug: str) -> dict:
    """The counts the mapping promises, computed from the raw files (not from cybmem's readers)."""
    recs = [json.loads(p.read_text()) for p in (root / slug / "records").glob("*.json")]
    ids = {r["runId"] for r in recs}
    events = [json.loads(x) for x in (root / slug / "issues.jsonl").read_text().splitlines() if x.strip()]
    chats = {r["lineage"]["chatSessionId"] for r in recs if r["lineage"].get("chatSessionId")}
    informed = sum(1 for r in recs for k in ("previousRunId", "parentRunId") if r["lineage"].get(k) in ids)
    sup = {}
    for r in recs:
        if r.get("supersededBy") in ids:
            sup.setdefault(r["runId"], r["supersededBy"])
    for r in recs:
        if r.get("supersedes") in ids:
            sup[r["supersedes"]] = r["runId"]
    periods = revisions = closes = 0
    state: dict[str, bool] = {}
    for e in events:  # open periods: an opening of a closed or new issue starts one, a close ends one
        is_open = state.get(e["issueId"], False)
        if e["event"] in ("opened", "reopened") and not is_open:
            periods += 1
            revisions += e["issueId"] in state
            state[e["issueId"]] = True
        elif e["event"] in ("resolved", "wontfix") and is_open:
            closes += 1
            state[e["issueId"]] = False
    workers = sum(len(r["workers"]) for r in recs)
    c = {
        "activities": len(recs) + len(chats),
        "entities": 3 * len(recs) + len(state) + periods,
        "agents": workers,
        "used": len(recs),
        "wasGeneratedBy": 2 * len(recs) + periods,
        "wasAssociatedWith": workers,
        "wasInformedBy": informed,
        "wasStartedBy": sum(1 for r in recs if r["lineage"].get("chatSessionId")),
        "wasRevisionOf": len(sup) + revisions,
        "wasInvalidatedBy": len(sup) + closes,
        "specializationOf": periods,
    }
    c["relations"] = sum(v for k, v in c.items() if k not in ("activities", "entities", "agents"))
    return {k: v for k, v in c.items() if v or k in ("activities", "entities", "agents", "relations")}


def test_exact_counts_on_the_fixture_store(fixture_copy):
    docs = {s.slug: provenance(s) for s in all_stores(fixture_copy)}
    got = {slug: prov_counts(d) for slug, d in docs.items()}
    assert got["web"] == {
        "activities": 49, "entities": 161, "agents": 61, "used": 47, "wasGeneratedBy": 104, "wasAssociatedWith": 61,
        "wasInformedBy": 60, "wasStartedBy": 10, "wasRevisionOf": 1, "wasInvalidatedBy": 10, "specializationOf": 10,
        "relations": 303,
    }
    assert got["api"] == {
        "activities": 17, "entities": 55, "agents": 20, "used": 15, "wasGeneratedBy": 35, "wasAssociatedWith": 20,
        "wasInformedBy": 17, "wasStartedBy": 2, "wasInvalidatedBy": 4, "specializationOf": 5, "relations": 98,
    }
    for slug in got:
        assert got[slug] == expected_counts(fixture_copy, slug), slug


def test_prov_json_round_trips_through_provs_own_reader(fixture_copy):
    doc = provenance(MemoryStore(fixture_copy, "web"))
    text = doc.serialize(format="json")
    back = PM.ProvDocument.deserialize(content=text, format="json")
    assert back == doc
    assert json.loads(text)["prefix"] == {"cybmem": NAMESPACE}


def test_all_projects_in_one_document_round_trip(fixture_copy):
    stores = all_stores(fixture_copy)
    doc = provenance(stores)
    assert PM.ProvDocument.deserialize(content=doc.serialize(format="json")) == doc
    total = prov_counts(doc)
    parts = [prov_counts(provenance(s)) for s in stores]
    assert total == {k: sum(p.get(k, 0) for p in parts) for k in total}, "projects never share an id"


def test_provn_serialization(fixture_copy):
    doc = provenance(MemoryStore(fixture_copy, "web"))
    text = doc.get_provn()
    lines = text.splitlines()
    assert lines[0] == "document" and lines[-1] == "endDocument"
    assert "  prefix cybmem <urn:cybmem:>" in lines
    run = "cybmem:web/run/9b6b1e00-90b4-579e-9d84-2170f292abf9"
    assert any(x.startswith(f"  activity({run}, 2026-10-02T") for x in lines)
    assert f"  used({run}, cybmem:web/task/9b6b1e00-90b4-579e-9d84-2170f292abf9, " in text
    assert "wasInvalidatedBy(cybmem:web/issue/flaky-cart-drawer-e2e-test/1, " + run in text
    kinds = Counter(x.strip().split("(")[0] for x in lines[3:-1] if x.strip())
    assert kinds["activity"] == 49 and kinds["agent"] == 61 and kinds["wasDerivedFrom"] == 1  # a revision in PROV-N


def test_the_run_the_task_the_record_and_the_workers(fixture_copy):
    store = MemoryStore(fixture_copy, "web")
    doc = provenance(store)
    rid = store.resolve_run_id("11509d26")  # error run with two workers
    rec = store.read_record(rid)
    ns = doc.get_registered_namespaces()
    cy = next(n for n in ns if n.prefix == "cybmem")
    run = doc.get_record(cy[f"web/run/{rid}"])[0]
    assert run.get_startTime().timestamp() * 1000 == rec.startedAt and run.get_endTime().timestamp() * 1000 == rec.endedAt
    assert set(run.get_attribute(cy["state"])) == {"error"}
    assoc = [r for r in doc.get_records(PM.ProvAssociation) if r.formal_attributes[0][1] == run.identifier]
    assert sorted((str(a.formal_attributes[1][1]), *a.get_attribute(cy["state"])) for a in assoc) == sorted(
        (f"cybmem:web/worker/{rid}/{w.agentId}", w.state) for w in rec.workers)
    gens = {r.formal_attributes[0][1] for r in doc.get_records(PM.ProvGeneration) if r.formal_attributes[1][1] == run.identifier}
    assert gens == {cy[f"web/record/{rid}"], cy[f"web/outcome/{rid}"]}
    task = doc.get_record(cy[f"web/task/{rid}"])[0]
    assert set(task.get_attribute("prov:value")) == {rec.task}


def _record(run_id, minute, *, supersedes=None, superseded_by=None, previous=None, parent=None, chat=None, workers=("impl 1",)):
    return MemoryRecord(
        runId=run_id, cwd="/home/dev/p", workflowName="w", task=f"Task {run_id}", state="done",
        startedAt=T0 + minute * MIN, endedAt=T0 + (minute + 5) * MIN,
        lineage=Lineage(previousRunId=previous, parentRunId=parent, chatSessionId=chat),
        outcome=Outcome(summary=f"Summary {run_id}"), workers=[Worker(agentId=w, state="done") for w in workers],
        supersedes=supersedes, supersededBy=superseded_by,
    )


@pytest.fixture
def crafted(tmp_path):
    """Supersession both ways and to missing runs; an issue opened, closed, reopened, closed; a chat."""
    store = MemoryStore(tmp_path / "root", "p")
    for rec in [
        _record("a", 0, chat="chat/1 é"),
        _record("b", 10, supersedes="a", previous="a"),  # b corrects a
        _record("c", 20, superseded_by="d", previous="b", parent="b"),  # d corrects c (said by c)
        _record("d", 30, previous="c", chat="chat/1 é"),
        _record("e", 40, supersedes="ghost", previous="zzz-not-here"),  # names a missing run: ignored
        _record("f", 50, superseded_by="ghost", workers=()),
    ]:
        store.write_record(rec)
    ev = [
        ("bug", 1, "opened", "a"), ("bug", 2, "opened", "b"),  # an open issue is not opened again
        ("bug", 3, "resolved", "c"), ("bug", 4, "resolved", "c"),  # closing a closed issue changes nothing
        ("bug", 5, "reopened", "d"), ("bug", 6, "wontfix", "outsider"),
        ("orphan", 7, "resolved", "e"),  # closed before any opening we know of
    ]
    store.append_issue_events([IssueEvent(issueId=i, at=T0 + m * MIN, event=k, byRunId=by, title=i.title())
                               for i, m, k, by in ev])
    return store


def _pairs(doc, cls, a=0, b=1):
    return sorted((str(r.formal_attributes[a][1]).split("/")[-1], str(r.formal_attributes[b][1]).split("/")[-1])
                  for r in doc.get_records(cls))


def test_supersession_both_directions_and_missing_runs_ignored(crafted):
    doc = provenance(crafted)
    revisions = [r for r in doc.get_records(PM.ProvDerivation) if "/record/" in str(r.formal_attributes[0][1])]
    assert sorted((str(r.formal_attributes[0][1]), str(r.formal_attributes[1][1]), str(r.formal_attributes[2][1]))
                  for r in revisions) == [
        ("cybmem:p/record/b", "cybmem:p/record/a", "cybmem:p/run/b"),
        ("cybmem:p/record/d", "cybmem:p/record/c", "cybmem:p/run/d"),
    ]
    inval = [(str(r.formal_attributes[0][1]), str(r.formal_attributes[1][1])) for r in doc.get_records(PM.ProvInvalidation)
             if "/record/" in str(r.formal_attributes[0][1])]
    assert sorted(inval) == [("cybmem:p/record/a", "cybmem:p/run/b"), ("cybmem:p/record/c", "cybmem:p/run/d")]
    informed = _pairs(doc, PM.ProvCommunication)
    assert informed == [("b", "a"), ("c", "b"), ("c", "b"), ("d", "c")], "zzz-not-here is left out"


def test_issue_periods_generation_invalidation_and_reopen(crafted):
    doc = provenance(crafted)
    cy = next(n for n in doc.get_registered_namespaces() if n.prefix == "cybmem")
    gens = [(str(r.formal_attributes[0][1]), r.formal_attributes[1][1], sorted(r.get_attribute(cy["event"])))
            for r in doc.get_records(PM.ProvGeneration) if "/issue/" in str(r.formal_attributes[0][1])]
    assert sorted(gens, key=str) == sorted([
        ("cybmem:p/issue/bug/1", cy["p/run/a"], ["opened"]),
        ("cybmem:p/issue/bug/2", cy["p/run/d"], ["reopened"]),
    ], key=str)
    closes = [(str(r.formal_attributes[0][1]), r.formal_attributes[1][1], sorted(r.get_attribute(cy["byRunId"])))
              for r in doc.get_records(PM.ProvInvalidation) if "/issue/" in str(r.formal_attributes[0][1])]
    assert sorted(closes, key=str) == sorted([
        ("cybmem:p/issue/bug/1", cy["p/run/c"], ["c"]),
        ("cybmem:p/issue/bug/2", None, ["outsider"]),  # not a run of the document: time and byRunId only
        ("cybmem:p/issue/orphan/1", cy["p/run/e"], ["e"]),
    ], key=str)
    specs = _pairs(doc, PM.ProvSpecialization)
    assert specs == [("1", "bug"), ("1", "orphan"), ("2", "bug")]
    reopen = [r for r in doc.get_records(PM.ProvDerivation) if "/issue/" in str(r.formal_attributes[0][1])]
    assert [(str(r.formal_attributes[0][1]), str(r.formal_attributes[1][1])) for r in reopen] == [
        ("cybmem:p/issue/bug/2", "cybmem:p/issue/bug/1")]
    assert PM.ProvDocument.deserialize(content=doc.serialize(format="json")) == doc


def test_odd_agent_and_chat_ids_are_encoded_and_round_trip(crafted):
    doc = provenance(crafted)
    ids = {str(r.identifier) for r in doc.get_records() if r.identifier is not None}
    assert "cybmem:p/worker/a/impl%201" in ids and "cybmem:p/chat/chat%2F1%20%C3%A9" in ids
    starts = _pairs(doc, PM.ProvStart, 0, 2)
    assert [s for s, _ in starts] == ["a", "d"]
    assert PM.ProvDocument.deserialize(content=doc.serialize(format="json")) == doc
    assert "cybmem:p/chat/chat%2F1%20%C3%A9" in doc.get_provn()


def test_chain_keeps_only_the_walk_and_its_issues(crafted, fixture_copy):
    doc = provenance(crafted, chain="b")
    runs = sorted(str(r.identifier) for r in doc.get_records(PM.ProvActivity) if "/run/" in str(r.identifier))
    assert runs == [f"cybmem:p/run/{x}" for x in "abcd"]  # e names a missing predecessor: its own chain
    assert not any("orphan" in str(r.identifier) for r in doc.get_records(PM.ProvEntity))
    web = MemoryStore(fixture_copy, "web")
    chain_doc = provenance(web, chain="4e96fd74")
    assert prov_counts(chain_doc)["activities"] == 46 + 2  # the 46 runs `cybmem chain 4e96fd74` lists, 2 chat sessions
    with pytest.raises(NotFoundError):
        provenance(web, chain="zzzz")


def test_export_prov_writes_json_and_provn_that_read_back(fixture_copy, tmp_path):
    out = tmp_path / "web.prov.json"
    summary = export_prov(MemoryStore(fixture_copy, "web"), out, provn=True)
    assert summary.files == {"json": str(out), "provn": str(tmp_path / "web.prov.provn")}
    back = PM.ProvDocument.deserialize(source=str(out), format="json")
    assert back == provenance(MemoryStore(fixture_copy, "web"))
    assert Path(summary.files["provn"]).read_text().startswith("document\n")
    assert provn_path("x.provn").name == "x.provn.provn"


def test_cli_prov(fixture_copy, tmp_path):
    res = cli("export", "prov", "--memory-dir", fixture_copy, "-p", "api", "--out", tmp_path / "api.json", "--provn")
    assert res.exit_code == 0, res.output
    assert res.stdout == (
        f"Wrote {tmp_path / 'api.json'} (PROV-JSON) and {tmp_path / 'api.provn'} (PROV-N): 17 activities, 55 entities, "
        "20 agents, 98 relations (used 15, wasGeneratedBy 35, wasAssociatedWith 20, wasInformedBy 17, wasStartedBy 2, "
        "specializationOf 5, wasInvalidatedBy 4).\n"
    )
    res = cli("export", "prov", "--memory-dir", fixture_copy, "-p", "web", "--out", tmp_path / "c.json", "--chain", "4e96", "--json")
    data = json.loads(res.stdout)
    assert data["chain"] == "4e96" and data["counts"]["activities"] == 48 and data["files"] == {"json": str(tmp_path / "c.json")}
    res = cli("export", "prov", "--memory-dir", fixture_copy, "-p", "web", "--out", tmp_path / "c2.json", "--chain", "zzzz")
    assert res.exit_code == 1 and res.stderr.startswith("Error: no record matches 'zzzz'")


def test_missing_prov_package_names_the_extra(fixture_copy, monkeypatch):
    monkeypatch.setitem(sys.modules, "prov.model", None)
    with pytest.raises(CybmemError, match=r"pip install 'cybmem\[export\]'"):
        provenance(MemoryStore(fixture_copy, "web"))
    res = cli("export", "prov", "--memory-dir", fixture_copy, "-p", "web", "--out", "x.json")
    assert res.exit_code == 1 and "pip install 'cybmem[export]'" in res.stderr
