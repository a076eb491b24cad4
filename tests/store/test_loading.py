"""The load path of a search crosses into each store module only a few times (issue 30: a search's
load visited snapshot.py and cache.py about twenty times each), counted by benchmarks/load_visits.py;
and the names snapshot.py had before it was split by job stay importable from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
A_FEW = 6


@pytest.fixture(scope="module")
def visits() -> dict:
    spec = importlib.util.spec_from_file_location("load_visits", REPO / "benchmarks" / "load_visits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure()


@pytest.mark.parametrize("when", ["load cold", "load warm"])
def test_a_load_visits_each_store_module_a_few_times(visits, when):
    counts = visits[when]["counts"]
    assert counts.get("snapshot.py", 0) <= 2 and counts.get("cache.py", 0) <= A_FEW, counts
    many = {m: c for m, c in counts.items() if c > A_FEW}
    assert not many, f"the load crosses into these store modules more than {A_FEW} times: {many}"
    assert visits[when]["rows"] > 0


def test_a_whole_search_reads_the_cache_a_few_times(visits):
    """The ranking reads the snapshot (its read model), never the cache files behind it."""
    for when in ("cold", "warm"):
        assert visits[when]["counts"].get("cache.py", 0) <= A_FEW, visits[when]["counts"]
    assert visits["cold"]["hits"] and visits["cold"]["hits"] == visits["warm"]["hits"]


def test_the_names_snapshot_py_had_stay_importable_from_it():
    from cybmem.store import issue_tables, loading, refresh, snapshot

    for name in ("load_snapshot", "holding_snapshots", "verified"):
        assert getattr(snapshot, name) is getattr(loading, name)
    for name in ("cached_snapshot", "cache_problem"):
        assert getattr(snapshot, name) is getattr(refresh, name)
    for name in ("issue_texts", "issue_activity", "issue_carriers", "open_rows", "opened_in"):
        assert getattr(snapshot, name) is getattr(issue_tables, name)
    from cybmem.store.snapshot import RECORD_SCHEMA, Snapshot, load_snapshot  # noqa: F401

    with pytest.raises(AttributeError):
        snapshot.no_such_name  # noqa: B018
