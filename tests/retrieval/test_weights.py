"""Tests for cybmem.retrieval.weights: defaults, validation, sources and saving."""

from __future__ import annotations

import json

import pytest

from cybmem.errors import StoreError, ValidationError
from cybmem.retrieval.weights import MIN_AXIS_WEIGHT, ISSUE_REC_SHARE, RANGES, Weights, load_weights, save_weights
from cybmem.settings import WeightSettings


# ---------------------------------------------------------------------------------------


def test_weights_defaults_and_dict_round_trip():
    w = Weights()
    assert w.to_dict() == {"w_kw": 0.5, "w_rec": 0.35, "w_lin": 0.05, "w_vec": 0.0, "half_life_days": 30.0,
                           "floor": 0.4, "floor_vec": 0.6}
    assert Weights.from_dict(w.to_dict()) == w
    assert Weights.from_dict({"w_vec": 0.2}).w_vec == 0.2


def test_issues_weigh_recency_at_its_share_and_keep_the_rest_in_the_runs_ratio():
    w = Weights(w_kw=0.5, w_rec=0.35, w_lin=0.05, w_vec=0.3, half_life_days=12.0, floor=0.2)
    i = w.for_issues()
    assert i.w_rec == pytest.approx(ISSUE_REC_SHARE * 0.9)
    assert i.w_kw == pytest.approx((1 - ISSUE_REC_SHARE) * 0.9 * 0.5 / 0.55)
    assert i.w_lin == pytest.approx((1 - ISSUE_REC_SHARE) * 0.9 * 0.05 / 0.55)
    # the rest is the runs' own: vector weight, half-life and floors
    assert (i.w_vec, i.half_life_days, i.floor, i.floor_vec) == (0.3, 12.0, 0.2, w.floor_vec)
    # weights that turn recency off, or leave issues nothing but recency, are used as they are
    for same in (Weights(w_kw=1, w_rec=0, w_lin=0.2), Weights(w_kw=0, w_rec=1, w_lin=0, w_vec=1)):
        assert same.for_issues() == same


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"w_kw": 1, "bogus": 2, "zzz": 1}, "bogus, zzz"),
        ({"w_rec": -0.1}, "w_rec"),
        ({"w_lin": float("nan")}, "w_lin"),
        ({"w_kw": float("inf")}, "w_kw"),
        ({"half_life_days": 0}, "half_life_days"),
        ({"w_vec": "0.3"}, "w_vec"),
        ({"w_vec": True}, "w_vec"),
        ({"w_kw": 0, "w_rec": 0, "w_lin": 0, "w_vec": 0}, "all 0"),
        ({"floor_vec": 1.5}, "floor_vec"),
        ({"floor": -1}, "floor"),
    ],
)
def test_weights_validation(d, match):
    with pytest.raises(ValueError, match=match):
        Weights.from_dict(d)


def test_load_weights_precedence(tmp_path):
    f1 = tmp_path / "global.json"
    f2 = tmp_path / "project.json"
    f1.write_text(json.dumps({"w_kw": 0.1, "w_rec": 0.2, "half_life_days": 10}))
    f2.write_text(json.dumps({"w_rec": 0.3, "savedAt": 123}))
    w = load_weights([f1, tmp_path / "missing.json", f2], variables=WeightSettings.from_env({"CYBERINE_MEMORY_HALF_LIFE_DAYS": "7",
                                                               "CYBERINE_MEMORY_W_VEC": " 0.5 ",
                                                               "CYBERINE_MEMORY_W_LIN": ""}))
    assert w.weights == Weights(w_kw=0.1, w_rec=0.3, w_lin=0.05, w_vec=0.5, half_life_days=7)
    assert w.sources == {"w_kw": str(f1), "w_rec": str(f2), "w_lin": "default", "w_vec": "CYBERINE_MEMORY_W_VEC",
                         "half_life_days": "CYBERINE_MEMORY_HALF_LIFE_DAYS", "floor": "default", "floor_vec": "default"}
    assert load_weights([]).weights == Weights()


def test_load_weights_errors_name_the_source(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_weights([bad])
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="bad.json.*JSON object"):
        load_weights([bad])
    bad.write_text(json.dumps({"w_kw": -1}))
    with pytest.raises(ValueError, match="bad.json.*w_kw"):
        load_weights([bad])
    bad.write_text(json.dumps({"weight": 1}))
    with pytest.raises(ValueError, match="unknown weight key.*weight"):
        load_weights([bad])
    with pytest.raises(ValueError, match="CYBERINE_MEMORY_W_KW='abc'"):
        load_weights([], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_KW": "abc"}))
    with pytest.raises(ValueError, match="CYBERINE_MEMORY_W_REC"):
        load_weights([], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_REC": "-2"}))


def test_save_weights_atomic_sorted_with_saved_at(tmp_path):
    p = tmp_path / "sub" / "weights.json"
    w = Weights(w_kw=0.7, w_rec=0.2, w_lin=0.1)
    save_weights(w, p)
    text = p.read_text()
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert isinstance(data["savedAt"], int) and data["savedAt"] > 1_600_000_000_000
    assert load_weights([p]).weights == w
    assert [x.name for x in p.parent.iterdir()] == ["weights.json"]  # no temp file left
    save_weights(Weights(), p)  # replace in place
    assert load_weights([p]).weights == Weights()


def test_lenient_load_skips_broken_sources_and_says_why(tmp_path):
    bad = tmp_path / "weights.json"
    bad.write_text("{not json")
    good = tmp_path / "other.json"
    good.write_text(json.dumps({"w_lin": 0.5}))
    loaded = load_weights([bad, good], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_KW": "abc", "CYBERINE_MEMORY_W_REC": "0.1"}), lenient=True)
    assert loaded.weights == Weights(w_rec=0.1, w_lin=0.5)
    assert len(loaded.problems) == 2
    assert "weights.json is not valid JSON" in loaded.problems[0] and "CYBERINE_MEMORY_W_KW='abc'" in loaded.problems[1]
    with pytest.raises(ValidationError, match="not valid JSON"):
        load_weights([bad])


def test_weights_file_that_is_a_directory(tmp_path):
    d = tmp_path / "weights.json"
    d.mkdir()
    with pytest.raises(ValidationError, match="is a directory"):
        load_weights([d])
    with pytest.raises(StoreError, match="is a directory"):
        save_weights(Weights(), d)


def test_an_all_zero_weights_file_is_refused_and_skipped_on_the_dispatch_path(tmp_path):
    f = tmp_path / "weights.json"
    f.write_text(json.dumps({"w_kw": 0, "w_rec": 0, "w_lin": 0, "w_vec": 0}))
    with pytest.raises(ValidationError, match=r"weights.json.*all 0.*give at least one of them a positive value"):
        load_weights([f])
    lenient = load_weights([f], lenient=True)
    assert lenient.weights == Weights() and len(lenient.problems) == 1 and "all 0" in lenient.problems[0]
    with pytest.raises(ValidationError, match="all 0"):  # variables that zero the last positive weight, too
        load_weights([], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_KW": "0", "CYBERINE_MEMORY_W_REC": "0", "CYBERINE_MEMORY_W_LIN": "0"}))


def test_tuning_evidence_is_kept_and_named_as_the_source(tmp_path):
    from cybmem.retrieval.weights import tuned_note

    p = tmp_path / "weights.json"
    evidence = {"at": 1796083200000, "judgments": 412, "source": "derived", "kinds": {"raised": 380, "resolved": 32},
                "label": "MRR@10", "later": {"judgments": 206, "before": 0.312, "after": 0.341}}
    save_weights(Weights(w_kw=0.7), p, evidence=evidence)
    assert json.loads(p.read_text())["tuned"] == evidence
    loaded = load_weights([p])
    assert loaded.weights.w_kw == 0.7 and loaded.tuned == evidence
    assert loaded.tuned_note() == ("tuned 2026-12-01 on 412 derived judgments (raised 380, resolved 32): "
                                   "MRR@10 0.3120 -> 0.3410 on the later 206")
    # Variables that override every weight the tuned file set: the evidence no longer describes them.
    env = {f"CYBERINE_MEMORY_W_{a}": "0.2" for a in ("KW", "REC", "LIN", "VEC")}
    assert load_weights([p], variables=WeightSettings.from_env(env)).tuned is None
    assert tuned_note({"at": "soon"}) == "tuned (evidence unreadable)"


# --- ranges: every path that reads weights (issue 29, item 6) ------------------------------------------

_HUGE = [("w_kw", 1e300), ("w_rec", 101.0), ("w_lin", 1e300), ("w_vec", 1e9), ("half_life_days", 1e300),
         ("half_life_days", 1e-9), ("floor", 1e300)]


@pytest.mark.parametrize("name, value", _HUGE)
def test_weights_out_of_range_are_refused_naming_the_field_and_range(name, value):
    lo, hi = RANGES[name]
    with pytest.raises(ValidationError, match=rf"weight {name} must be a finite number from {lo:g} to {hi:g}"):
        Weights.from_dict({name: value})
    assert Weights.from_dict({name: hi}).to_dict()[name] == hi, "the ends are inside"


@pytest.mark.parametrize("name, value", _HUGE)
def test_files_and_variables_out_of_range_are_refused_or_skipped(tmp_path, name, value):
    f = tmp_path / "weights.json"
    f.write_text(json.dumps({name: value}))
    with pytest.raises(ValidationError, match=rf"weights.json: weight {name} must be a finite number from"):
        load_weights([f])
    var = {"w_kw": "CYBERINE_MEMORY_W_KW", "w_rec": "CYBERINE_MEMORY_W_REC", "w_lin": "CYBERINE_MEMORY_W_LIN",
           "w_vec": "CYBERINE_MEMORY_W_VEC", "half_life_days": "CYBERINE_MEMORY_HALF_LIFE_DAYS",
           "floor": "CYBERINE_MEMORY_FLOOR"}[name]
    with pytest.raises(ValidationError, match=rf"{var}=.* is not a usable weight: weight {name} must be a finite "
                                              rf"number from .* set it within that range or unset it"):
        load_weights([], variables=WeightSettings.from_env({var: repr(value)}))
    lenient = load_weights([f], variables=WeightSettings.from_env({var: repr(value)}), lenient=True)
    assert lenient.weights == Weights() and len(lenient.problems) == 2


def test_huge_weights_never_reach_the_dispatch_path_or_the_cli(fixture_copy, tmp_path):
    """A weights.json of 1e300 used to turn every score into NaN: the block came back empty."""
    import subprocess
    import shutil as sh

    (fixture_copy / "web" / "weights.json").write_text(json.dumps({"w_kw": 1e300, "floor": 1e300}))
    env = {"CYBERINE_MEMORY_DIR": str(fixture_copy), "PATH": __import__("os").environ["PATH"]}
    done = subprocess.run([sh.which("cybmem"), "inject", "Fix the flaky cart drawer test", "--project", "web"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "MEMORY (prior runs" in done.stdout and "- run " in done.stdout
    assert "weight w_kw must be a finite number from 0 to 100" in done.stderr and "overflow" not in done.stderr
    (fixture_copy / "web" / "weights.json").unlink()
    for args, needle in ((["eval", "--w-kw", "1e300"], "weight w_kw must be a finite number from 0 to 100"),
                         (["tune", "--half-lives", "1e300"], "weight half_life_days must be a finite number")):
        done = subprocess.run([sh.which("cybmem"), *args, "--project", "web"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode in (1, 2) and needle in done.stderr, (args, done.stderr)


_TINY = [("w_kw", 1e-300), ("w_rec", 1e-310), ("w_lin", 5e-324), ("w_vec", 1e-7)]


@pytest.mark.parametrize("name, value", _TINY)
def test_an_axis_weight_float32_cannot_hold_is_refused(tmp_path, name, value):
    """{"w_kw": 1e-310, "w_rec": 0, "w_lin": 0} passed and made every score 0.000 (float32 underflow)
    in search and inject, while tune and eval refused it: one rule, every path."""
    with pytest.raises(ValidationError, match=rf"weight {name} must be 0 \(the axis off\) or from 1e-06 to 100, got "):
        Weights.from_dict({name: value})
    assert Weights.from_dict({name: MIN_AXIS_WEIGHT}).to_dict()[name] == MIN_AXIS_WEIGHT
    assert Weights.from_dict({name: 0.0, "w_kw": 0.5}).to_dict()[name] in (0.0, 0.5)
    f = tmp_path / "weights.json"
    f.write_text(json.dumps({"w_kw": 0, "w_rec": 0, "w_lin": 0, name: value}))
    with pytest.raises(ValidationError, match=rf"weights.json: weight {name} must be 0 \(the axis off\)"):
        load_weights([f])
    assert load_weights([f], lenient=True).weights == Weights()


@pytest.mark.parametrize("raw", ["1_0", "１", "0x10", "infinity", "nan", "1e", "--1"])
def test_a_weight_variable_is_a_plain_number(raw):
    """float() reads "1_0" as 10 and full-width digits as digits: a variable is digits, a point and
    an exponent, as JSON writes a number, or it is refused (skipped with a warning on dispatch)."""
    with pytest.raises(ValidationError, match=r"CYBERINE_MEMORY_W_KW=.* is not a usable weight; set it to a finite number"):
        load_weights([], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_KW": raw}))
    for ok, value in (("0.3", 0.3), (" 1e-3 ", 0.001), (".5", 0.5), ("2.", 2.0), ("+1", 1.0)):
        assert load_weights([], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_KW": ok})).weights.w_kw == value


def test_tiny_weights_file_leaves_inject_and_search_on_the_defaults(fixture_copy):
    import subprocess
    import shutil as sh

    (fixture_copy / "web" / "weights.json").write_text(json.dumps({"w_kw": 1e-310, "w_rec": 0, "w_lin": 0}))
    env = {"CYBERINE_MEMORY_DIR": str(fixture_copy), "PATH": __import__("os").environ["PATH"]}
    done = subprocess.run([sh.which("cybmem"), "inject", "Fix the flaky cart drawer test", "--project", "web"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "- run " in done.stdout
    assert done.stderr.count("weight w_kw must be 0 (the axis off)") == 1, done.stderr
    search = subprocess.run([sh.which("cybmem"), "search", "cart drawer", "--project", "web", "--json"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert search.returncode == 1 and "weight w_kw must be 0 (the axis off)" in search.stderr, search.stderr


# --- the kept results of load_weights (a held process stats the files, issue 31) ----------------------


def _aged(p, seconds: float = 3600.0) -> None:
    """``p``'s mtime set back, out of the racy window in which a read result is not kept."""
    import os
    import time

    t = time.time_ns() - int(seconds * 1e9)
    os.utime(p, ns=(t, t))


def _counting_reads(monkeypatch) -> list:
    """The files load_weights actually reads from here on (a kept result reads none)."""
    import cybmem.retrieval.weights as W

    reads: list = []
    real = W._file_values

    def counted(p):
        reads.append(p)
        return real(p)

    monkeypatch.setattr(W, "_file_values", counted)
    return reads


def test_a_kept_result_is_used_until_the_file_changes(tmp_path, monkeypatch):
    f = tmp_path / "weights.json"
    missing = tmp_path / "project.json"
    f.write_text(json.dumps({"w_kw": 0.7}))
    _aged(f)
    reads = _counting_reads(monkeypatch)
    first = load_weights([f, missing])
    assert first.weights.w_kw == 0.7 and len(reads) == 2
    again = load_weights([f, missing])
    assert again.weights.w_kw == 0.7 and len(reads) == 2, "a second load reads no file"
    # A caller changing its result does not change the kept one.
    again.sources["w_kw"] = "changed"
    again.problems.append("changed")
    assert load_weights([f, missing]).sources["w_kw"] == str(f)
    assert load_weights([f, missing]).problems == []
    # Rewritten in place (same inode): the new weights, read at once.
    f.write_text(json.dumps({"w_kw": 0.2}))
    assert load_weights([f, missing]).weights.w_kw == 0.2
    # Rewritten within the racy window, each load reads it again (an edit in the same clock tick is seen).
    n = len(reads)
    load_weights([f, missing])
    assert len(reads) == n + 2
    # Replaced atomically (a new inode) and its mtime set back to the old value: still seen.
    _aged(f, 7200)
    assert load_weights([f, missing]).weights.w_kw == 0.2
    before = f.stat().st_mtime_ns
    save_weights(Weights(w_kw=0.9), f)
    import os

    os.utime(f, ns=(before, before))
    assert load_weights([f, missing]).weights.w_kw == 0.9
    # A file that appears where there was none, and one that goes away.
    missing.write_text(json.dumps({"w_kw": 0.3}))
    _aged(missing)
    assert load_weights([f, missing]).weights.w_kw == 0.3
    missing.unlink()
    assert load_weights([f, missing]).weights.w_kw == 0.9
    # Other variables, another result.
    assert load_weights([f, missing], variables=WeightSettings.from_env({"CYBERINE_MEMORY_W_KW": "0.4"})).weights.w_kw == 0.4
    assert load_weights([f, missing]).weights.w_kw == 0.9


def test_a_broken_file_is_never_kept(tmp_path, monkeypatch):
    f = tmp_path / "weights.json"
    f.write_text("{not json")
    _aged(f)
    lenient = load_weights([f], lenient=True)
    assert lenient.weights == Weights() and len(lenient.problems) == 1
    assert len(load_weights([f], lenient=True).problems) == 1
    with pytest.raises(ValidationError, match="not valid JSON"):
        load_weights([f])  # the lenient result is not what a strict load returns
    f.write_text(json.dumps({"w_rec": 0.1}))
    _aged(f, 10)
    assert load_weights([f]).weights.w_rec == 0.1


def test_a_held_search_uses_weights_saved_meanwhile(fixture_copy):
    """What a held process (``cybmem mcp``) ranks with follows ``cybmem tune --save`` at once."""
    from cybmem.retrieval.search import search
    from cybmem.retrieval.weights import save_project_weights
    from cybmem.settings import Settings
    from cybmem.store.memory_store import MemoryStore
    from cybmem.store.snapshot import holding_snapshots

    store = MemoryStore(fixture_copy, "web")
    settings = Settings.from_env({}, memory_dir=fixture_copy)
    with holding_snapshots():
        assert search(store, "cart drawer", settings=settings).weights == Weights()
        path, _ = save_project_weights(store, Weights(w_kw=0.8, w_rec=0.1), settings)
        _aged(path)
        first = search(store, "cart drawer", settings=settings)
        assert first.weights == Weights(w_kw=0.8, w_rec=0.1)
        assert search(store, "cart drawer", settings=settings).weights == first.weights
        save_project_weights(store, Weights(w_kw=0.3, w_rec=0.6), settings)  # a tuning saves again
        assert search(store, "cart drawer", settings=settings).weights == Weights(w_kw=0.3, w_rec=0.6)
