"""The distillation client (cybmem.clients.distillation): its configuration, the strict parser of
a reply, the request, and the real scripted chat server of tests/servers.py on 127.0.0.1.

Unit tests use httpx.MockTransport; the write path's distillation is tests/operations/test_write_distillation.py.
"""

from __future__ import annotations

import dataclasses
import json
import time

import httpx
import pytest

from cybmem.errors import ValidationError
from cybmem.clients import distillation
from cybmem.clients.distillation import DistillConfig, distill, parse_outcome
from cybmem.clients.http_json import RemoteError
from cybmem.settings import DistillSettings
from servers import DEADLINE, DRIPS, HANG, Drip, Huge, chat_server  # noqa: F401


def distill_config(env: dict):
    """The distillation configuration the variables in ``env`` give (as Settings reads them)."""
    return distillation.distill_config(DistillSettings.from_env(env))


GOOD = {
    "summary": "Fixed the flaky login test by waiting for the form. The suite passes.",
    "accomplished": ["fixed the login test wait"],
    "issues": ["Slow CI: the e2e job takes 20 minutes"],
    "next": ["split the e2e job"],
}
RUN = {
    "task": "Fix the flaky login test",
    "state": "done",
    "verdictSummary": "impl-1 wins: the only green run",
    "workers": [{"agentId": "impl-1", "state": "done", "output": "Waited for the form.\n\nACCOMPLISHED:\n- fixed it"}],
}
EXTRACTIVE = {"summary": "Fix the flaky login test — done.", "accomplished": ["fixed it"], "issues": [], "next": []}


def fast(config, **changes):
    """The config with no backoff sleeps (unit tests count attempts, not seconds)."""
    return dataclasses.replace(config, backoff=0.0, **changes)


# --------------------------------------------------------------------------------------------
# Configuration


def test_distillation_off_without_a_model():
    assert distill_config({}) is None
    assert distill_config({"CYBERINE_MEMORY_MODEL": " ", "OPENAI_API_KEY": "k"}) is None


def test_ollama_distillation_keeps_the_model_tag():
    config = distill_config({"CYBERINE_MEMORY_MODEL": "ollama:llama3.1:8b", "OLLAMA_HOST": "127.0.0.1:5555"})
    assert (config.kind, config.model, config.url) == ("ollama", "llama3.1:8b", "http://127.0.0.1:5555/api/chat")
    assert (config.timeout, config.attempts, config.redact) == (30.0, 2, True)


def test_openai_distillation_url_and_key_precedence():
    env = {
        "CYBERINE_MEMORY_MODEL": "gpt-4o-mini",
        "CYBERINE_MEMORY_MODEL_URL": "http://127.0.0.1:8000/v1",
        "CYBERINE_MEMORY_MODEL_KEY": "own-key",
        "OPENAI_BASE_URL": "http://other.test/v1",
        "OPENAI_API_KEY": "openai-key",
        "CYBERINE_MEMORY_MODEL_TIMEOUT": "12.5",
    }
    config = distill_config(env)
    assert (config.kind, config.model, config.url, config.api_key, config.timeout) == (
        "openai", "gpt-4o-mini", "http://127.0.0.1:8000/v1/chat/completions", "own-key", 12.5)
    assert "own-key" not in repr(config)
    del env["CYBERINE_MEMORY_MODEL_URL"], env["CYBERINE_MEMORY_MODEL_KEY"]
    config = distill_config(env)
    assert (config.url, config.api_key) == ("http://other.test/v1/chat/completions", "openai-key")
    del env["OPENAI_BASE_URL"]
    assert distill_config(env).url == "https://api.openai.com/v1/chat/completions"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"CYBERINE_MEMORY_MODEL": "gpt-4o-mini"}, "needs a key"),
        ({"CYBERINE_MEMORY_MODEL": "ollama:"}, "names no model"),
        ({"CYBERINE_MEMORY_MODEL": "http://127.0.0.1:8000/v1"}, "CYBERINE_MEMORY_MODEL_URL"),
        ({"CYBERINE_MEMORY_MODEL": "m", "CYBERINE_MEMORY_MODEL_URL": "127.0.0.1:8000"}, "not an http(s) URL"),
        ({"CYBERINE_MEMORY_MODEL": "ollama:m", "CYBERINE_MEMORY_MODEL_TIMEOUT": "0"}, "CYBERINE_MEMORY_MODEL_TIMEOUT"),
    ],
)
def test_bad_distillation_config_says_how_to_fix_it(env, needle):
    with pytest.raises(ValidationError, match="\\A[^\n]*\\Z") as err:
        distill_config(env)
    assert needle in str(err.value)


def test_redaction_can_be_turned_off_with_the_store_setting():
    assert distill_config({"CYBERINE_MEMORY_MODEL": "ollama:m", "CYBERINE_MEMORY_REDACT": "0"}).redact is False



# --------------------------------------------------------------------------------------------
# Distillation: parsing and the request


def test_parse_outcome_well_formed():
    assert parse_outcome(json.dumps(GOOD)) == GOOD


def test_parse_outcome_tolerates_a_code_fence_and_cleans_items():
    reply = {
        "summary": "  Did   the\nthing.  ",
        "accomplished": ["- fixed A", "  fixed A", "1. shipped B"],
        "issues": ["none"],
        "next": ["N/A", "* write docs", "x" * 400],
        "confidence": 0.9,
    }
    out = parse_outcome("```json\n" + json.dumps(reply, indent=2) + "\n```")
    assert out["summary"] == "Did the thing."
    assert out["accomplished"] == ["fixed A", "shipped B"]
    assert out["issues"] == []
    assert out["next"][0] == "write docs" and len(out["next"][1]) == 300 and out["next"][1].endswith("…")
    assert set(out) == {"summary", "accomplished", "issues", "next"}


def test_parse_outcome_caps_list_length():
    out = parse_outcome(json.dumps({**GOOD, "next": [f"step {i}" for i in range(20)]}))
    assert out["next"] == [f"step {i}" for i in range(8)]


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ("", "empty"),
        ("Sure! Here is the JSON: {}", "not JSON"),
        ('{"summary": "x", "accomplished": []', "not JSON"),
        ("[1, 2]", "not an object"),
        (json.dumps({"summary": "x", "accomplished": []}), "lacks issues, next"),
        (json.dumps({**GOOD, "summary": "   "}), "summary"),
        (json.dumps({**GOOD, "summary": ["a"]}), "summary"),
        (json.dumps({**GOOD, "issues": "Slow CI"}), '"issues" is a str'),
        (json.dumps({**GOOD, "next": ["ok", 3]}), "next[1] is a int"),
        (json.dumps({**GOOD, "accomplished": ["line one\nline two"]}), "accomplished[0] spans several lines"),
    ],
)
def test_parse_outcome_rejects_malformed_replies(reply, needle):
    with pytest.raises(RemoteError) as err:
        parse_outcome(reply)
    assert needle in str(err.value) and "\n" not in str(err.value)


def _capture(reply: dict):
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json=reply)

    return seen, httpx.MockTransport(handler)


def test_ollama_chat_request_and_reply():
    seen, transport = _capture({"message": {"role": "assistant", "content": json.dumps(GOOD)}, "done": True, "done_reason": "stop"})
    config = distill_config({"CYBERINE_MEMORY_MODEL": "ollama:llama3.1:8b"})
    assert distill(config, RUN, EXTRACTIVE, transport=transport) == GOOD
    body = json.loads(seen[0].content)
    assert str(seen[0].url) == "http://127.0.0.1:11434/api/chat"
    assert (body["model"], body["stream"], body["format"]) == ("llama3.1:8b", False, "json")
    system, user = body["messages"]
    assert system["role"] == "system" and "JSON" in system["content"]
    for needle in ("Fix the flaky login test", "FINAL STATE: done", "impl-1 wins", "Waited for the form", '"accomplished": ["fixed it"]'):
        assert needle in user["content"]


def test_openai_chat_request_and_reply():
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(GOOD)}, "finish_reason": "stop"}]}
    seen, transport = _capture(reply)
    config = distill_config({"CYBERINE_MEMORY_MODEL": "gpt-4o-mini", "CYBERINE_MEMORY_MODEL_URL": "http://llm.test/v1", "CYBERINE_MEMORY_MODEL_KEY": "k1"})
    assert distill(config, RUN, EXTRACTIVE, transport=transport) == GOOD
    body = json.loads(seen[0].content)
    assert str(seen[0].url) == "http://llm.test/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer k1"
    assert body["response_format"] == {"type": "json_object"} and body["model"] == "gpt-4o-mini"


def test_the_prompt_is_trimmed_and_redacted():
    huge = "start " + "filler " * 20000 + " the end: ACCOMPLISHED:\n- shipped it"
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    run = {"task": f"Deploy with token {secret}", "status": "error", "winnerOutput": huge,
           "workers": [{"agentId": f"w{i}", "state": "done", "output": f"answer {i} " * 3000} for i in range(9)]}
    seen, transport = _capture({"message": {"content": json.dumps(GOOD)}, "done_reason": "stop"})
    distill(DistillConfig(kind="ollama", base_url="http://o.test", model="m"), run, {}, transport=transport)
    user = json.loads(seen[0].content)["messages"][1]["content"]
    assert len(user) < 14_000
    assert secret not in user and "[REDACTED:" in user
    assert "shipped it" in user and "start" in user  # head and tail of a long answer survive
    assert user.count("--- worker") == 3  # the winning answer plus three more


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ({"choices": [{"message": {"content": '{"summary": "x", "accomp'}, "finish_reason": "length"}]}, "output limit"),
        ({"choices": [{"message": {"content": None, "refusal": "I can't help with that"}, "finish_reason": "stop"}]}, "refused"),
        ({"choices": []}, "no choices"),
        ({"choices": [{"message": {"content": "not json at all"}, "finish_reason": "stop"}]}, "not JSON"),
    ],
)
def test_unusable_chat_replies_are_remote_errors(reply, needle):
    _, transport = _capture(reply)
    config = DistillConfig(kind="openai", base_url="http://llm.test/v1", model="m")
    with pytest.raises(RemoteError, match=needle):
        distill(config, RUN, EXTRACTIVE, transport=transport)


# --------------------------------------------------------------------------------------------
# Integration: the scripted chat server


def _chat_config(server, form: str, **changes) -> DistillConfig:
    if form == "ollama":
        env = {"CYBERINE_MEMORY_MODEL": f"ollama:{server.model}", "OLLAMA_HOST": server.url}
    else:
        env = {"CYBERINE_MEMORY_MODEL": server.model, "CYBERINE_MEMORY_MODEL_URL": f"{server.url}/v1", "CYBERINE_MEMORY_MODEL_KEY": "sk-chat"}
    return dataclasses.replace(distill_config(env), **changes)


FORMS = ["ollama", "openai"]


@pytest.mark.parametrize("form", FORMS)
def test_a_well_formed_reply_is_the_outcome(chat_server, form):
    chat_server.script = [json.dumps(GOOD)]
    assert distill(_chat_config(chat_server, form), RUN, EXTRACTIVE) == GOOD
    (request,) = chat_server.requests
    if form == "ollama":
        assert request.path == "/api/chat" and request.body["stream"] is False and request.body["format"] == "json"
    else:
        assert request.path == "/v1/chat/completions" and request.body["response_format"] == {"type": "json_object"}
        assert request.headers["authorization"] == "Bearer sk-chat"


@pytest.mark.parametrize("form", FORMS)
def test_a_malformed_reply_is_a_remote_error_without_a_retry(chat_server, form):
    chat_server.script = ['{"summary": "Fixed it", "accomplished": "everything"}', json.dumps(GOOD)]
    with pytest.raises(RemoteError, match="lacks issues, next"):
        distill(_chat_config(chat_server, form), RUN, EXTRACTIVE)
    assert chat_server.count == 1


@pytest.mark.parametrize("form", FORMS)
def test_a_500_is_retried_once(chat_server, form):
    chat_server.script = [500, json.dumps(GOOD)]
    assert distill(_chat_config(chat_server, form, backoff=0.05), RUN, EXTRACTIVE) == GOOD
    chat_server.script = [500, 500, json.dumps(GOOD)]
    with pytest.raises(RemoteError, match="failed after 2 attempts: HTTP 500"):
        distill(_chat_config(chat_server, form, backoff=0.05), RUN, EXTRACTIVE)
    assert chat_server.count == 4


@pytest.mark.parametrize("form", FORMS)
def test_a_hang_is_a_remote_error_within_the_timeout(chat_server, form):
    # The timeout is the whole call's (a run's hook waits for it): a hung first attempt uses it up.
    chat_server.script = [HANG, HANG]
    config = _chat_config(chat_server, form, timeout=0.4, backoff=0.05)
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"after 1 attempt \(time budget used up\): no complete reply within 0.4 s.*CYBERINE_MEMORY_MODEL_TIMEOUT"):
        distill(config, RUN, EXTRACTIVE)
    elapsed = time.monotonic() - start
    assert chat_server.count == 1
    assert 0.35 <= elapsed < 0.4 + 1.0


def test_model_timeout_comes_from_the_environment(chat_server):
    env = {"CYBERINE_MEMORY_MODEL": f"ollama:{chat_server.model}", "OLLAMA_HOST": chat_server.url, "CYBERINE_MEMORY_MODEL_TIMEOUT": "0.3"}
    chat_server.script = [HANG, HANG]
    start = time.monotonic()
    with pytest.raises(RemoteError):
        distill(dataclasses.replace(distill_config(env), backoff=0.0), RUN, EXTRACTIVE)
    assert time.monotonic() - start < 0.6 + 1.5


@pytest.mark.parametrize("headers", DRIPS)
@pytest.mark.parametrize("form", FORMS)
def test_a_dripping_chat_server_ends_within_the_distillation_budget(chat_server, form, headers):
    chat_server.script = [json.dumps(GOOD), json.dumps(GOOD)]
    chat_server.delivery = Drip(interval=0.1, headers=headers)
    config = _chat_config(chat_server, form, timeout=0.8, backoff=0.05)
    start = time.monotonic()
    with pytest.raises(RemoteError, match=rf"\(time budget used up\): {DEADLINE} 0.8 s.*CYBERINE_MEMORY_MODEL_TIMEOUT"):
        distill(config, RUN, EXTRACTIVE)
    assert time.monotonic() - start < 0.8 + 0.9


def test_a_huge_chat_reply_is_refused(chat_server):
    chat_server.script = ["x"]
    chat_server.delivery = Huge(1 << 30, declared=False)
    start = time.monotonic()
    with pytest.raises(RemoteError, match="reply over 4,194,304 bytes"):
        distill(_chat_config(chat_server, "openai"), RUN, EXTRACTIVE)
    assert time.monotonic() - start < 3.0 and chat_server.sent < 64 << 20
