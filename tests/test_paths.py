"""Nothing a run, a record or a user types can lead cybmem outside the memory root, and
everything cybmem creates is private: directories 0700, files 0600."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cybmem.cli.app import app
from cybmem.errors import ConflictError, StoreError, ValidationError
from cybmem.store.projects import load_projects, resolve_slug, slug_base, validate_slug
from cybmem.store.records import IssueEvent, MemoryRecord, validate_run_id
from cybmem.store.memory_store import MemoryStore

from conftest import T0, make_run, write_json

runner = CliRunner()

ESCAPES = ["..", ".", "../x", "../../etc/passwd", "/etc/passwd", "a/b", "a\\b", "a\x00b", "x" * 129, "", " ", ".hidden",
           ".tmp-abc", "a\nb", "~root", "$(rm -rf)", "a b"]


@pytest.mark.parametrize("bad", ESCAPES)
def test_run_ids_that_could_escape_are_rejected(bad):
    with pytest.raises(ValidationError):
        validate_run_id(bad)


@pytest.mark.parametrize("ok", ["a", "3f2a9c1e-0b6c", "run.v2_final", "x" * 128, "a..b", "-dash"])
def test_plain_run_ids_are_accepted_and_stay_in_records(memory_root, ok):
    store = MemoryStore(memory_root, "web")
    assert store.record_path(ok).parent == store.records_dir


@pytest.mark.parametrize("bad", ["../x", "a/b", "x" * 129, "..", "a\x00", " "])
def test_issue_ids_that_could_escape_are_rejected(bad):
    with pytest.raises(ValidationError):
        IssueEvent.from_dict({"issueId": bad, "at": T0, "event": "opened"})


@pytest.mark.parametrize("bad", ["..", ".", "../x", "/etc", "a/b", "a\\b", "a\x00b", ".cache", ".lock", "x" * 129, "", " web",
                                 "tab\tname", "new\nline"])
def test_slugs_that_could_escape_are_rejected(memory_root, bad):
    with pytest.raises(ValidationError):
        validate_slug(bad)
    with pytest.raises(ValidationError):
        MemoryStore(memory_root, bad)


@pytest.mark.parametrize("bad", ["../evil", "/etc", "..", "x" * 300, ".cache"])
def test_project_option_cannot_escape(memory_root, tmp_path, bad):
    run = write_json(tmp_path / "run.json", make_run("r1"))
    for args in (["list", "--project", bad], ["write", str(run), "--project", bad], ["issues", "--project", bad],
                 ["doctor", "--project", bad]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, (args, res.output)
        assert res.stderr.startswith("Error: ") and "Traceback" not in res.output
    assert not (tmp_path / "evil").exists()
    assert not memory_root.exists() or not list(memory_root.rglob("*.json"))


@pytest.mark.parametrize("cwd", [
    "/", "/..", "/tmp/..", "/a/b/../..", "/tmp/a\\b", "/tmp/.hidden", "/tmp/...", "/tmp/" + "x" * 300, "/tmp/проект",
    "/tmp/\u202eevil\u202c", "/tmp/a b", "/tmp/-", "/tmp/.", "/tmp/.git", "relative/../../..", "/tmp/CON", "/tmp/\u200b",
])
def test_cwd_basenames_always_give_a_safe_slug(cwd):
    slug = slug_base(cwd)
    assert validate_slug(slug) == slug
    assert "/" not in slug and not slug.startswith(".") and len(slug) <= 71


@pytest.mark.parametrize("cwd", ["/home/dev/we\x00b", "/" + "a" * 5000, "/home/dev/\udcff\udcfe"])
def test_unusable_cwds_are_rejected(memory_root, cwd):
    with pytest.raises(ValidationError):
        resolve_slug(memory_root, cwd)
    assert not (memory_root / "projects.json").exists()


def test_hostile_projects_json_entries_are_ignored(memory_root):
    memory_root.mkdir(mode=0o700)
    (memory_root / "projects.json").write_text(json.dumps({
        "../../evil": {"cwd": "/home/dev/web"}, ".cache": {"cwd": "/home/dev/api"}, "web": "not an object",
        "ok": {"cwd": "/home/dev/ok"},
    }))
    assert set(load_projects(memory_root)) == {"ok"}
    assert resolve_slug(memory_root, "/home/dev/web") == "web"
    assert resolve_slug(memory_root, "/home/dev/api") == "api"
    assert not (memory_root.parent / "evil").exists()


def _rec(run_id="r1"):
    return MemoryRecord.from_dict({"runId": run_id, "cwd": "/home/dev/web", "workflowName": "w", "task": "t", "state": "done",
                                   "startedAt": T0, "endedAt": T0, "lineage": {}, "outcome": {}})


@pytest.mark.parametrize("which", ["records", "project"])
def test_writes_refuse_a_symlinked_project_or_records_dir(memory_root, tmp_path, which):
    outside = tmp_path / "outside"
    outside.mkdir()
    store = MemoryStore(memory_root, "web")
    if which == "records":
        store.dir.mkdir(parents=True)
        store.records_dir.symlink_to(outside, target_is_directory=True)
    else:
        memory_root.mkdir()
        store.dir.symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        store.write_record(_rec(), [IssueEvent(issueId="x", at=T0, event="opened", title="X")])
    assert list(outside.rglob("*")) == []


def _tree(d: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``d``: its size and mtime (what a write would change)."""
    return {str(p.relative_to(d)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(d.rglob("*"))}


CART = "9b6b1e00-90b4-579e-9d84-2170f292abf9"  # a run of the fixtures' project web


def test_nothing_is_created_or_written_through_a_symlinked_project_dir(fixture_copy, tmp_path, monkeypatch):
    """A project dir that is a symbolic link out of the memory root: every command, the read-only
    ones included (inject's shown.jsonl, the cache, locks), creates and writes nothing there;
    those that would write refuse with one line before they take a lock; inject still gives the
    task back."""
    root = fixture_copy
    (root / ".nocache").unlink()  # the cache in play, as on a real root
    outside = tmp_path / "outside"
    (root / "web").rename(outside)
    (root / "web").symlink_to(outside, target_is_directory=True)
    monkeypatch.setenv("CYBERINE_MEMORY_DIR", str(root))
    before = _tree(outside)
    fixed = Path(__file__).resolve().parent.parent / "data-fixtures" / "inputs"

    def cybmem(*args: str):
        return runner.invoke(app, [*args, "--project", "web"])

    for args in (["list"], ["show", CART], ["chain", CART], ["issues", "--all"], ["search", "cart drawer"],
                 ["inject", "Fix the cart drawer"], ["doctor"], ["doctor", "--repair", "--temp-age", "0"],
                 ["export", "csv", "--out", str(tmp_path / "web.csv")], ["export", "sqlite", "--out", str(tmp_path / "w.db")],
                 ["export", "parquet", "--out", str(tmp_path / "fleet")], ["tune"], ["tune", "--auto"]):
        res = cybmem(*args)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
    refused = (["mark", "product-images-load-slowly", "resolved"], ["write", str(fixed / "run.json")],
               ["supersede", CART, str(fixed / "fixed.json")], ["rebuild"], ["redact", CART, "--secret", "cart"],
               ["tune", "--save", "--force"])
    for args in refused:
        res = cybmem(*args)
        assert res.exit_code == 1 and "is a symbolic link; cybmem writes only inside the memory root" in res.output, (
            args, res.output)
    assert _tree(outside) == before
    assert not list(tmp_path.glob("outside*/.*lock")) and not (outside / "shown.jsonl").exists()


def test_inject_in_a_symlinked_project_gives_the_task_back_with_one_line(fixture_copy, tmp_path):
    """The dispatch path through the console script: the block and the task on stdout, exit 0, one
    warning line saying why nothing was kept; `tune --auto` says why it did not run."""
    import subprocess
    import shutil

    root = fixture_copy
    outside = tmp_path / "outside"
    (root / "web").rename(outside)
    (root / "web").symlink_to(outside, target_is_directory=True)
    before = _tree(outside)
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(root)}
    res = subprocess.run([shutil.which("cybmem"), "inject", "Fix the cart drawer", "--project", "web"], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.endswith("END MEMORY\n\nFix the cart drawer")
    assert res.stderr == (f"warning: what was shown was not kept in {root / 'web' / 'shown.jsonl'}: {root / 'web'} is a "
                          f"symbolic link; cybmem writes only inside the memory root {root}. Replace it with a real "
                          "directory (see `cybmem doctor`).\n"), res.stderr
    res = subprocess.run([shutil.which("cybmem"), "tune", "--auto", "--project", "web"], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0 and res.stdout == (f"Not re-tuned: {root / 'web'} is a symbolic link; cybmem writes only "
                                                  f"inside the memory root {root}. Replace it with a real directory "
                                                  "(see `cybmem doctor`).\n"), res.stdout
    assert _tree(outside) == before


def test_a_symlink_planted_at_a_record_path_is_never_written_through(memory_root, tmp_path):
    target = tmp_path / "victim.json"
    target.write_text("precious")
    store = MemoryStore(memory_root, "web")
    store.records_dir.mkdir(parents=True)
    (store.records_dir / "r1.json").symlink_to(target)
    with pytest.raises(ConflictError):
        store.write_record(_rec())
    assert target.read_text() == "precious"


def test_a_symlinked_ledger_is_never_appended_through(memory_root, tmp_path):
    target = tmp_path / "victim.jsonl"
    target.write_text("precious\n")
    store = MemoryStore(memory_root, "web")
    store.dir.mkdir(parents=True)
    store.issues_path.symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        store.write_record(_rec(), [IssueEvent(issueId="x", at=T0, event="opened", title="X")])
    assert target.read_text() == "precious\n"
    assert not store.record_path("r1").exists(), "the record is linked only after its events are in"
    assert not list(store.records_dir.glob(".tmp-*"))


def test_a_symlinked_index_is_replaced_not_followed(memory_root, tmp_path):
    target = tmp_path / "victim.json"
    target.write_text("precious")
    store = MemoryStore(memory_root, "web")
    store.dir.mkdir(parents=True)
    store.index_path.symlink_to(target)
    store.write_record(_rec())
    assert target.read_text() == "precious"
    assert not store.index_path.is_symlink()


def test_doctor_reports_symlinks(memory_root, tmp_path):
    outside = tmp_path / "outside"
    (outside / "records").mkdir(parents=True)
    memory_root.mkdir()
    (memory_root / "evil").symlink_to(outside, target_is_directory=True)
    store = MemoryStore(memory_root, "web")
    store.write_record(_rec())
    (store.records_dir / "link.json").symlink_to(tmp_path / "nowhere.json")
    res = runner.invoke(app, ["doctor", "--all", "--json"])
    assert res.exit_code == 1
    paths = {(f["check"], Path(f["path"]).name) for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"}
    assert ("paths", "evil") in paths and ("records", "link.json") in paths


def _all_modes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        out[dirpath] = stat.S_IMODE(os.stat(dirpath).st_mode)
        for name in filenames:
            out[os.path.join(dirpath, name)] = stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode)
    return out


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_every_file_kind_is_private(tmp_path, monkeypatch, umask):
    from cybmem.store.snapshot import load_snapshot
    from cybmem.operations.write import write_run
    from cybmem.retrieval.weights import Weights
    from cybmem.settings import Settings
    from cybmem.retrieval.tuning import save_project_weights

    root = tmp_path / "a" / "b" / "memory"  # parents that do not exist yet are created private too
    monkeypatch.setenv("CYBERINE_MEMORY_DIR", str(root))
    settings = Settings.from_env()
    old = os.umask(umask)
    try:
        out = "ok\nISSUES:\n- Flaky: x\nNEXT:\n- none"
        res = write_run(make_run("r1", output=out), settings)
        write_run(make_run("r2", start=T0 + 3_600_000), settings)
        write_run(make_run("r3", cwd="/srv/clients/web"), settings)  # a same-basename project
        store = res.store
        store.rebuild_index()
        load_snapshot(store)  # the Arrow cache
        save_project_weights(store, Weights(), settings)
        store.append_issue_events([IssueEvent(issueId="flaky", at=T0 + 1, event="resolved")])
    finally:
        os.umask(old)
    modes = _all_modes(tmp_path / "a")
    kinds = {".cache", "records", "issues.jsonl", "index.json", "projects.json", "weights.json", "manifest.json", ".lock",
             "r1.json"}
    seen = {Path(p).name for p in modes}
    assert kinds <= seen, kinds - seen
    assert any(p.endswith(".arrow") for p in modes)
    bad = {p: oct(m) for p, m in modes.items() if m != (0o700 if os.path.isdir(p) else 0o600)}
    assert not bad, bad
