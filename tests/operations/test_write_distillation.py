"""ADD-only distillation on the write path (CYBERINE_MEMORY_MODEL), through `cybmem write` as a real
subprocess against the scripted chat server of tests/servers.py.

Every reply the model can give (well-formed, malformed, an error, a hang past the timeout) leaves
a record on disk: the distilled outcome, or the extractive one and one line on stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import orjson
import pytest

from cybmem.operations.write import write_run
from cybmem.settings import Settings
from cybmem.store.memory_store import MemoryStore

from conftest import T0, make_run
from servers import HANG, Drip, chat_server  # noqa: F401

OUTPUT = ("Waited for the form to settle before asserting.\n\nACCOMPLISHED:\n- fixed the login test wait\n"
          "ISSUES:\n- Flaky login test: fails one run in ten\nNEXT:\n- none\n")
DISTILLED = {
    "summary": "Stabilised the login e2e test by waiting for the form; one flaky run in ten remains.",
    "accomplished": ["fixed the login test wait", "added a retry helper"],
    "issues": ["Slow CI: the e2e job takes 20 minutes", "Flaky login test: fails one run in ten"],
    "next": ["split the e2e job"],
}


def model_env(server, **extra) -> dict:
    return {"CYBERINE_MEMORY_MODEL": server.model, "CYBERINE_MEMORY_MODEL_URL": f"{server.url}/v1",
            "CYBERINE_MEMORY_MODEL_KEY": "sk-test", **extra}


def cli_write(memory_root, tmp_path, run: dict, env: dict, *args):
    exe = shutil.which("cybmem")
    assert exe, "pip install -e . provides the cybmem console script"
    path = tmp_path / f"{run['id']}.json"
    path.write_text(json.dumps(run))
    full = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root), **env}
    return subprocess.run([exe, "write", str(path), *args], env=full, capture_output=True, text=True, timeout=120)


def record(memory_root, run_id):
    return orjson.loads((memory_root / "web" / "records" / f"{run_id}.json").read_bytes())


def ledger(memory_root):
    path = memory_root / "web" / "issues.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_a_well_formed_reply_refines_the_new_record(memory_root, tmp_path, chat_server):
    chat_server.script = [json.dumps(DISTILLED)]
    p = cli_write(memory_root, tmp_path, make_run("r1", "Fix the flaky login e2e test", output=OUTPUT), model_env(chat_server))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert p.stdout == "Wrote r1 (done) to project web; opened flaky-login-test, slow-ci.\n"
    out = record(memory_root, "r1")["outcome"]
    assert out["summary"] == DISTILLED["summary"]
    assert out["accomplished"] == ["fixed the login test wait", "added a retry helper"], "extractive first, then added"
    assert out["issues"] == ["flaky-login-test", "slow-ci"], "the extractive issue stays, the distilled one is added"
    assert out["next"] == ["split the e2e job"]
    assert [(e["issueId"], e["event"], e["title"], e.get("detail")) for e in ledger(memory_root)] == [
        ("flaky-login-test", "opened", "Flaky login test", "fails one run in ten"),
        ("slow-ci", "opened", "Slow CI", "the e2e job takes 20 minutes"),
    ]
    request = chat_server.requests[0]
    assert request.path == "/v1/chat/completions" and request.headers["authorization"] == "Bearer sk-test"
    prompt = request.body["messages"][1]["content"]
    assert "Fix the flaky login e2e test" in prompt and "DRAFT OUTCOME" in prompt
    p = cli_write(memory_root, tmp_path, make_run("r2", "Another", start=T0 + 3_600_000), {}, "--json")
    assert json.loads(p.stdout)["distilled"] is False and len(chat_server.requests) == 1, "unset: no call"


@pytest.mark.parametrize("reply, needle", [
    ("Sure! The run fixed the login test.", "not JSON"),
    (json.dumps({"summary": "only a summary"}), "lacks accomplished, issues, next"),
    (500, "HTTP 500"),
    (HANG, "no complete reply within 0.5 s"),
], ids=["malformed", "missing-keys", "http-500", "hang"])
def test_a_bad_reply_keeps_the_extractive_outcome_and_says_so_once(memory_root, tmp_path, chat_server, reply, needle):
    chat_server.script = [reply, reply]  # the 500 and the hang are retried once
    env = model_env(chat_server, CYBERINE_MEMORY_MODEL_TIMEOUT="0.5")
    t = time.monotonic()
    p = cli_write(memory_root, tmp_path, make_run("r1", "Fix the flaky login e2e test", output=OUTPUT), env)
    took = time.monotonic() - t
    assert p.returncode == 0 and p.stdout == "Wrote r1 (done) to project web; opened flaky-login-test.\n"
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("warning: outcome not distilled: ")
    assert needle in p.stderr and p.stderr.rstrip().endswith("the extractive outcome is kept")
    out = record(memory_root, "r1")["outcome"]
    assert out["summary"].startswith("Fix the flaky login e2e test. Ended done.")
    assert out["issues"] == ["flaky-login-test"] and out["accomplished"] == ["fixed the login test wait"]
    assert took < 30, "a hang costs the timeout per attempt, not more"


def test_distillation_only_adds_and_everything_distilled_is_redacted(memory_root, chat_server):
    plain = Settings.from_env({}, memory_dir=memory_root)
    write_run(make_run("r0", "Set up the login page", output="x\n\nISSUES:\n- Old bug: still there\n"), plain)
    store = MemoryStore(memory_root, "web")
    before_record = store.record_path("r0").read_bytes()
    before_ledger = store.issues_path.read_bytes()
    secret = "AKIAIOSFODNN7EXAMPLE"
    chat_server.script = [json.dumps({
        "summary": f"Deployed with key {secret}.",
        "accomplished": [f"rotated {secret}"],
        "issues": [f"Key leaked: {secret} is in the logs", "Old bug: still there"],
        "next": [],
    })]
    settings = Settings.from_env(model_env(chat_server), memory_dir=memory_root)
    res = write_run(make_run("r1", "Deploy", start=T0 + 3_600_000, output="Done."), settings)
    assert res.distilled and res.warnings == [] and "aws_access_key_id" in res.redacted
    raw = store.record_path("r1").read_text()
    assert secret not in raw and "[REDACTED:aws_access_key_id]" in raw
    assert secret not in store.issues_path.read_text()
    assert store.record_path("r0").read_bytes() == before_record, "an existing record is never touched"
    assert store.issues_path.read_bytes().startswith(before_ledger), "the ledger is only appended to"
    new = [orjson.loads(line) for line in store.issues_path.read_bytes()[len(before_ledger):].splitlines()]
    assert [(e["issueId"], e["event"]) for e in new] == [("key-leaked", "opened")], "an open issue is not opened again"


def test_a_bad_model_setting_is_a_warning_not_a_failure(memory_root):
    settings = Settings.from_env({"CYBERINE_MEMORY_MODEL": "gpt-4o-mini"}, memory_dir=memory_root)  # no key for api.openai.com
    res = write_run(make_run("r1"), settings)
    assert not res.distilled and res.store.record_path("r1").exists()
    assert len(res.warnings) == 1 and res.warnings[0].startswith("outcome not distilled: CYBERINE_MEMORY_MODEL=gpt-4o-mini")


# --- distillation never holds the record ------------------------------------------------------


@pytest.mark.parametrize("headers", [False, True], ids=["drip-body", "drip-headers"])
def test_a_dripping_model_server_cannot_hold_the_write(memory_root, tmp_path, chat_server, headers):
    """A chat server that sends a byte every 0.1 s held `write` before its record was written
    (httpx's timeout is per read): the write goes on without the model once its budget is used."""
    chat_server.script = [json.dumps(DISTILLED)] * 2  # ~300 bytes: 30 s and more at that pace
    chat_server.delivery = Drip(interval=0.1, headers=headers)
    t = time.monotonic()
    p = cli_write(memory_root, tmp_path, make_run("r1", "Fix the flaky login e2e test", output=OUTPUT),
                  model_env(chat_server, CYBERINE_MEMORY_MODEL_TIMEOUT="1"))
    took = time.monotonic() - t
    assert p.returncode == 0 and p.stdout == "Wrote r1 (done) to project web; opened flaky-login-test.\n"
    assert p.stderr.startswith("warning: outcome not distilled: ") and "no complete reply within 1 s" in p.stderr
    assert record(memory_root, "r1")["outcome"]["summary"].startswith("Fix the flaky login e2e test. Ended done.")
    assert took < 10, f"write took {took:.1f}s against a 1 s distillation budget"


def test_sigterm_while_the_model_thinks_writes_the_record_without_it(memory_root, tmp_path, chat_server):
    """A hook that times out sends SIGTERM (Node's child_process does): the run must not be lost."""
    chat_server.script = [HANG]
    run = make_run("r1", "Fix the flaky login e2e test", output=OUTPUT)
    path = tmp_path / "r1.json"
    path.write_text(json.dumps(run))
    env = {**os.environ, "CYBERINE_MEMORY_DIR": str(memory_root), **model_env(chat_server, CYBERINE_MEMORY_MODEL_TIMEOUT="60")}
    proc = subprocess.Popen([shutil.which("cybmem"), "write", str(path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while chat_server.count == 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert chat_server.count == 1, "the write asked the model"
        proc.send_signal(signal.SIGTERM)
        t = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, err)
    assert out == "Wrote r1 (done) to project web; opened flaky-login-test.\n"
    assert err.startswith("warning: outcome not distilled: stopped by SIGTERM") and err.count("\n") == 1
    assert record(memory_root, "r1")["outcome"]["issues"] == ["flaky-login-test"]
    assert took < 5, f"the write took {took:.1f}s after SIGTERM"


def test_the_sigterm_handler_is_put_back_after_distilling(memory_root, chat_server):
    """The library installs no handler; the CLI's guard (cybmem.cli.signals) is there only while the model thinks."""
    from cybmem.cli.signals import sigterm_abandons

    def mine(signum, frame):  # pragma: no cover - never called
        pass

    seen = []

    @contextlib.contextmanager
    def watching():
        seen.append(signal.getsignal(signal.SIGTERM))
        yield

    @contextlib.contextmanager
    def guarded():
        with sigterm_abandons():
            seen.append(signal.getsignal(signal.SIGTERM))
            yield

    chat_server.script = [json.dumps(DISTILLED)] * 3
    settings = Settings.from_env(model_env(chat_server), memory_dir=memory_root)
    before = signal.signal(signal.SIGTERM, mine)
    try:
        res = write_run(make_run("r1", "Fix the flaky login e2e test", output=OUTPUT), settings)
        assert res.distilled and signal.getsignal(signal.SIGTERM) is mine
        res = write_run(make_run("r2", "Fix the flaky login e2e test again", output=OUTPUT), settings, while_distilling=watching)
        assert res.distilled and seen == [mine], "write_run itself leaves the handler alone, also while the model thinks"
        res = write_run(make_run("r3", "Fix the flaky login e2e test once more", output=OUTPUT), settings, while_distilling=guarded)
        assert res.distilled and seen[1] is not mine and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
