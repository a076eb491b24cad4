"""The embeddings and distillation clients: config, batching, retries, validation, real servers.

Unit tests use httpx.MockTransport; integration tests talk to the real HTTP servers of
tests/servers.py on 127.0.0.1. Tests marked ``model`` use the real all-MiniLM-L6-v2 model
(skip them with ``-m "not model"``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from cybmem.errors import CybmemError, ValidationError
from cybmem.clients import distillation, embeddings
from cybmem.clients.distillation import DistillConfig, distill, parse_outcome
from cybmem.clients.embeddings import EmbedConfig, Embedder
from cybmem.clients.http_json import RemoteError
from cybmem.settings import DistillSettings, EmbeddingSettings, ollama_base_url
from servers import HANG, HASH_DIMS, Drip, Huge, MINILM_DIMS, MINILM_NAME, chat_server, embed_server, hash_encode, minilm, minilm_server  # noqa: F401

def embed_config(env: dict):
    """The embeddings configuration the variables in ``env`` give (as Settings reads them)."""
    return embeddings.embed_config(EmbeddingSettings.from_env(env))


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


def ollama_reply(n: int, dims: int = 3, value: float = 0.5) -> dict:
    return {"embeddings": [[value + i] * dims for i in range(n)]}


def mock_embedder(handler, **changes) -> Embedder:
    config = fast(EmbedConfig(kind="ollama", base_url="http://ollama.test"), **changes)
    return Embedder(config, transport=httpx.MockTransport(handler))


# --------------------------------------------------------------------------------------------
# Configuration


def test_remote_error_is_a_cybmem_error():
    assert issubclass(RemoteError, CybmemError)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_embeddings_off_when_unset_or_empty(value):
    env = {} if value is None else {"CYBERINE_MEMORY_EMBEDDINGS": value}
    assert embed_config(env) is None


def test_ollama_embeddings_defaults():
    config = embed_config({"CYBERINE_MEMORY_EMBEDDINGS": "ollama"})
    assert (config.kind, config.url, config.model) == ("ollama", "http://127.0.0.1:11434/api/embed", "nomic-embed-text")
    assert (config.query_timeout, config.write_timeout, config.batch_size, config.attempts) == (2.0, 30.0, 32, 3)
    assert config.api_key is None


@pytest.mark.parametrize(
    ("host", "base"),
    [
        ("", "http://127.0.0.1:11434"),
        ("gpu-box", "http://gpu-box:11434"),
        ("gpu-box:8080", "http://gpu-box:8080"),
        (":9999", "http://127.0.0.1:9999"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://gpu-box", "https://gpu-box:443"),
        ("https://gpu-box:8443/ollama/", "https://gpu-box:8443/ollama"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:11500", "http://127.0.0.1:11500"),
        ("[::1]:11434", "http://[::1]:11434"),
        ('"127.0.0.1:11434"', "http://127.0.0.1:11434"),
    ],
)
def test_ollama_host_is_read_as_ollama_reads_it(host, base):
    assert ollama_base_url(host) == base


@pytest.mark.parametrize("host", ["ftp://gpu-box", "gpu-box:notaport"])
def test_bad_ollama_host_is_a_config_error(host):
    with pytest.raises(ValidationError, match="OLLAMA_HOST"):
        ollama_base_url(host)


def test_url_embeddings_take_the_base_url_as_the_openai_sdk_does():
    env = {
        "CYBERINE_MEMORY_EMBEDDINGS": "http://127.0.0.1:8000/v1/",
        "CYBERINE_MEMORY_EMBED_KEY": "sk-embed-secret",
        "CYBERINE_MEMORY_EMBED_MODEL": "text-embedding-3-small",
        "CYBERINE_MEMORY_EMBED_TIMEOUT": "0.75",
        "OPENAI_API_KEY": "sk-openai-must-not-be-used",
    }
    config = embed_config(env)
    assert (config.kind, config.url, config.model, config.query_timeout) == (
        "openai", "http://127.0.0.1:8000/v1/embeddings", "text-embedding-3-small", 0.75)
    assert config.api_key == "sk-embed-secret"
    assert "sk-embed-secret" not in repr(config)
    # The OpenAI key never goes to an embeddings URL.
    assert embed_config({"CYBERINE_MEMORY_EMBEDDINGS": "https://x.test/v1", "OPENAI_API_KEY": "k"}).api_key is None


@pytest.mark.parametrize("value", ["nomic", "localhost:11434", "ftp://x/v1", "true"])
def test_unknown_embeddings_value_names_both_forms(value):
    with pytest.raises(ValidationError) as err:
        embed_config({"CYBERINE_MEMORY_EMBEDDINGS": value})
    message = str(err.value)
    assert "ollama" in message and "base URL" in message and "\n" not in message


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_bad_embed_timeout_is_a_config_error(value):
    with pytest.raises(ValidationError, match="CYBERINE_MEMORY_EMBED_TIMEOUT"):
        embed_config({"CYBERINE_MEMORY_EMBEDDINGS": "ollama", "CYBERINE_MEMORY_EMBED_TIMEOUT": value})


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


def test_importing_remote_stays_cheap():
    code = "import sys, cybmem.clients.embeddings, cybmem.clients.distillation; print(sorted(m for m in ('pandas', 'torch', 'pyarrow', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------------------------
# Embedder over MockTransport


def test_batches_in_order_with_the_ollama_payload():
    seen = []

    def handler(request):
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, json={"embeddings": [[float(t), 1.0] for t in body["input"]]})

    texts = [str(i) for i in range(70)]
    with mock_embedder(handler, batch_size=32) as embedder:
        vectors = embedder.embed(texts)
    assert [len(b["input"]) for b in seen] == [32, 32, 6]
    assert all(b["model"] == "nomic-embed-text" for b in seen)
    assert vectors.dtype == np.float32 and vectors.shape == (70, 2)
    assert vectors[:, 0].tolist() == list(range(70))
    assert embedder.dims == 2


def test_openai_form_sends_the_key_and_sorts_by_index():
    seen = []

    def handler(request):
        seen.append(request)
        n = len(json.loads(request.content)["input"])
        data = [{"object": "embedding", "embedding": [float(i), 0.0], "index": i} for i in range(n)]
        return httpx.Response(200, json={"data": data[::-1]})

    config = fast(embed_config({"CYBERINE_MEMORY_EMBEDDINGS": "http://emb.test/v1", "CYBERINE_MEMORY_EMBED_KEY": "sk-e"}))
    with Embedder(config, transport=httpx.MockTransport(handler)) as embedder:
        vectors = embedder.embed(["a", "b", "c"])
    assert str(seen[0].url) == "http://emb.test/v1/embeddings"
    assert seen[0].headers["authorization"] == "Bearer sk-e"
    assert vectors[:, 0].tolist() == [0.0, 1.0, 2.0]


def test_empty_input_makes_no_request():
    with mock_embedder(lambda request: pytest.fail("no request expected")) as embedder:
        assert embedder.embed([]).shape == (0, 0)


@pytest.mark.parametrize(("texts", "needle"), [("one string", "not one string"), (["ok", "  "], "texts[1] is empty"), (["ok", 3], "texts[1] is int")])
def test_bad_texts_are_refused_before_any_request(texts, needle):
    with mock_embedder(lambda request: pytest.fail("no request expected")) as embedder:
        with pytest.raises(ValidationError, match=re.escape(needle)):
            embedder.embed(texts)


def test_long_texts_are_cut_to_max_chars():
    seen = []

    def handler(request):
        seen.append(json.loads(request.content)["input"])
        return httpx.Response(200, json=ollama_reply(1))

    with mock_embedder(handler, max_chars=10) as embedder:
        embedder.embed(["x" * 50])
    assert seen == [["x" * 10]]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_5xx_and_429_are_retried_then_succeed(status):
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(status, json={"error": "busy"}) if len(calls) < 3 else httpx.Response(200, json=ollama_reply(1))

    with mock_embedder(handler) as embedder:
        assert embedder.embed(["x"]).shape == (1, 3)
    assert len(calls) == 3


def test_retries_are_bounded():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(500, json={"error": "model runner crashed"})

    with mock_embedder(handler, attempts=4) as embedder:
        with pytest.raises(RemoteError) as err:
            embedder.embed(["x"])
    assert len(calls) == 4
    message = str(err.value)
    assert "failed after 4 attempts" in message and "HTTP 500: model runner crashed" in message and "\n" not in message
    assert "ollama serve" in message


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("eof")])
def test_transport_errors_are_retried(exc):
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) < 3:
            raise exc
        return httpx.Response(200, json=ollama_reply(1))

    with mock_embedder(handler) as embedder:
        embedder.embed(["x"])
    assert len(calls) == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_4xx_is_not_retried(status):
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(status, json={"error": 'model "nomic-embed-text" not found, try pulling it first'})

    with mock_embedder(handler) as embedder:
        with pytest.raises(RemoteError) as err:
            embedder.embed(["x"])
    assert len(calls) == 1
    assert f"HTTP {status}" in str(err.value) and "ollama pull nomic-embed-text" in str(err.value)


def test_openai_error_objects_are_quoted():
    def handler(request):
        return httpx.Response(401, json={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})

    config = fast(embed_config({"CYBERINE_MEMORY_EMBEDDINGS": "http://emb.test/v1"}))
    with Embedder(config, transport=httpx.MockTransport(handler)) as embedder:
        with pytest.raises(RemoteError, match="HTTP 401: Incorrect API key provided; check .*CYBERINE_MEMORY_EMBED_KEY"):
            embedder.embed(["x"])


def test_retry_after_is_honoured_but_capped():
    calls = []

    def handler(request):
        calls.append(time.monotonic())
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "0.3"}, json={"error": "slow down"})
        return httpx.Response(200, json=ollama_reply(1))

    with mock_embedder(handler) as embedder:
        embedder.embed(["x"])
    assert 0.25 <= calls[1] - calls[0] < 2.0


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ({"embeddings": [[1.0, 2.0]]}, "expected 2 vectors, got 1"),
        ({"embeddings": [[1.0, 2.0], [1.0]]}, "vector 1 has 1 dimensions where 2 were expected"),
        ({"embeddings": [[1.0, "2"], [1.0, 2.0]]}, "vector 0 holds something that is not a number"),
        ({"embeddings": [[1.0, True], [1.0, 2.0]]}, "vector 0 holds something that is not a number"),
        ({"embeddings": [[1.0, None], [1.0, 2.0]]}, "vector 0 holds something that is not a number"),
        ({"embeddings": [[], []]}, "vector 0 is not a non-empty list"),
        ({"embeddings": [[1e39, 0.0], [1.0, 2.0]]}, "NaN or an infinite value"),
        ({"embedding": [1.0, 2.0]}, 'no "embeddings" list'),
        ([[1.0, 2.0], [3.0, 4.0]], "not an object"),
    ],
)
def test_malformed_replies_are_remote_errors(reply, needle):
    with mock_embedder(lambda request: httpx.Response(200, json=reply)) as embedder:
        with pytest.raises(RemoteError, match="is malformed") as err:
            embedder.embed(["a", "b"])
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ([{"embedding": [1.0], "index": 0}, {"embedding": [2.0], "index": 0}], "not 0..1 once each"),
        ([{"embedding": [1.0], "index": 0}], "expected 2 vectors, got 1"),
        ([{"embedding": [1.0], "index": 0}, "x"], "not an object"),
    ],
)
def test_malformed_openai_data_is_a_remote_error(data, needle):
    config = fast(embed_config({"CYBERINE_MEMORY_EMBEDDINGS": "http://emb.test/v1"}))
    with Embedder(config, transport=httpx.MockTransport(lambda request: httpx.Response(200, json={"data": data}))) as embedder:
        with pytest.raises(RemoteError, match=needle):
            embedder.embed(["a", "b"])


def test_non_json_body_is_a_remote_error():
    with mock_embedder(lambda request: httpx.Response(200, text="<html>proxy login</html>")) as embedder:
        with pytest.raises(RemoteError, match="not JSON"):
            embedder.embed(["a"])


def test_a_changed_vector_length_is_reported():
    dims = iter([3, 5])
    with mock_embedder(lambda request: httpx.Response(200, json=ollama_reply(1, next(dims)))) as embedder:
        embedder.embed(["a"])
        with pytest.raises(RemoteError, match="changed vector length.*re-embed"):
            embedder.embed(["b"])


def test_an_injected_client_is_not_closed():
    client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, json=ollama_reply(1))))
    with Embedder(fast(EmbedConfig(kind="ollama", base_url="http://o.test")), client=client) as embedder:
        embedder.embed(["a"])
    assert not client.is_closed
    client.close()


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
# Integration: the real embeddings server


def _ollama_env(server, **extra) -> dict:
    return {"CYBERINE_MEMORY_EMBEDDINGS": "ollama", "OLLAMA_HOST": f"{server.host}:{server.port}",
            "CYBERINE_MEMORY_EMBED_MODEL": server.model, **extra}


def _openai_env(server, **extra) -> dict:
    return {"CYBERINE_MEMORY_EMBEDDINGS": f"{server.url}/v1", "CYBERINE_MEMORY_EMBED_KEY": "sk-test",
            "CYBERINE_MEMORY_EMBED_MODEL": server.model, **extra}


def test_both_forms_give_the_same_vectors(embed_server):
    embed_server.reverse_data = True
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    with Embedder(dataclasses.replace(embed_config(_ollama_env(embed_server)), batch_size=2)) as ollama:
        a = ollama.embed(texts)
    with Embedder(embed_config(_openai_env(embed_server))) as openai:
        b = openai.embed(texts)
    np.testing.assert_array_equal(a, hash_encode(texts))
    np.testing.assert_array_equal(a, b)
    assert [r.path for r in embed_server.requests] == ["/api/embed"] * 3 + ["/v1/embeddings"]
    assert embed_server.requests[-1].headers["authorization"] == "Bearer sk-test"
    assert ollama.dims == HASH_DIMS


def test_unknown_model_is_not_retried(embed_server):
    env = {**_ollama_env(embed_server), "CYBERINE_MEMORY_EMBED_MODEL": "nomic-embed-text"}
    with Embedder(embed_config(env)) as embedder:
        with pytest.raises(RemoteError, match="HTTP 404: model \"nomic-embed-text\" not found.*ollama pull nomic-embed-text"):
            embedder.embed(["x"])
    assert embed_server.count == 1


def test_a_transient_500_is_ridden_out(embed_server):
    embed_server.fault, embed_server.fault_times = 500, 2
    with Embedder(embed_config(_ollama_env(embed_server))) as embedder:
        vector = embedder.embed_query("recovers")
    np.testing.assert_array_equal(vector, hash_encode(["recovers"])[0])
    assert embed_server.count == 3


def test_a_stopped_server_fails_fast(embed_server):
    config = embed_config(_ollama_env(embed_server))
    with Embedder(config) as embedder:
        embedder.embed(["warm the keep-alive connection"])
        embed_server.stop()
        start = time.monotonic()
        with pytest.raises(RemoteError) as err:
            embedder.embed(["x"])
        elapsed = time.monotonic() - start
    assert "connection refused" in str(err.value) and "failed after 3 attempts" in str(err.value)
    assert elapsed < 0.25 + 0.5 + 2.0  # two backoff sleeps and slack; no timeout was waited for


SERVERS = ["embed_server", pytest.param("minilm_server", marks=pytest.mark.model)]


@pytest.mark.parametrize("server_name", SERVERS)
@pytest.mark.parametrize("form", [_ollama_env, _openai_env])
def test_persistent_500_is_a_remote_error_after_bounded_retries(request, server_name, form):
    server = request.getfixturevalue(server_name)
    server.fault = 500
    with Embedder(embed_config(form(server))) as embedder:
        start = time.monotonic()
        with pytest.raises(RemoteError, match="failed after 3 attempts: HTTP 500: injected fault 500"):
            embedder.embed(["x"])
        elapsed = time.monotonic() - start
    assert server.count == 3
    assert elapsed < 0.25 + 0.5 + 2.0


@pytest.mark.parametrize("server_name", SERVERS)
def test_a_hang_on_the_query_path_ends_within_the_query_timeout(request, server_name):
    server = request.getfixturevalue(server_name)
    server.fault = HANG
    config = embed_config(_ollama_env(server, CYBERINE_MEMORY_EMBED_TIMEOUT="0.5"))
    with Embedder(config) as embedder:
        start = time.monotonic()
        with pytest.raises(RemoteError) as err:
            embedder.embed_query("login bug")
        elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 0.5 + 1.0
    assert "no complete reply within 0.5 s" in str(err.value) and "CYBERINE_MEMORY_EMBED_TIMEOUT" in str(err.value)
    assert server.count == 1  # no time was left for a second attempt


def test_a_query_deadline_covers_retries(embed_server):
    embed_server.fault, embed_server.fault_times = HANG, 1
    config = dataclasses.replace(embed_config(_ollama_env(embed_server, CYBERINE_MEMORY_EMBED_TIMEOUT="1.5")), write_timeout=0.4, backoff=0.05)
    with Embedder(config) as embedder:
        start = time.monotonic()
        vector = embedder.embed_query("second try answers")
        elapsed = time.monotonic() - start
    assert vector.shape == (HASH_DIMS,) and embed_server.count == 2
    assert 0.4 <= elapsed < 1.5


@pytest.mark.parametrize("fault", ["hang", "drip-body", "drip-headers"])
def test_a_hang_on_the_write_path_is_retried_per_attempt(embed_server, fault):
    """Each attempt ends within write_timeout whether the server says nothing or drips its reply (a
    byte every 0.1 s never trips httpx's per-read timeout: without the deadline, 20 s an attempt)."""
    if fault == "hang":
        embed_server.fault = HANG
    else:
        embed_server.delivery = Drip(interval=0.1, headers=fault == "drip-headers")
    config = dataclasses.replace(embed_config(_openai_env(embed_server)), write_timeout=0.3, backoff=0.05)
    with Embedder(config) as embedder:
        start = time.monotonic()
        with pytest.raises(RemoteError, match="failed after 3 attempts: no complete reply within 0.3 s"):
            embedder.embed(["a", "b"])
        elapsed = time.monotonic() - start
    assert embed_server.count == 3
    assert 0.9 <= elapsed < 0.9 + 0.15 + 1.5


# --------------------------------------------------------------------------------------------
# Deadlines, not timeouts: a server that drips or floods cannot hold a caller past its budget.
# httpx's own timeouts are per socket read, so each case below waited minutes before (a read
# that returns one byte every 0.1 s never times out) or buffered the whole flood.

DRIPS = [pytest.param(False, id="drip-body"), pytest.param(True, id="drip-headers")]
#: How a dripping server's call ends: its deadline, met while reading the reply or, on a loaded
#: machine (CI, stop 33's session), already while connecting.
DEADLINE = r"(no complete reply within|connecting timed out after)"


@pytest.mark.parametrize("headers", DRIPS)
@pytest.mark.parametrize("form", [_ollama_env, _openai_env])
def test_a_dripping_reply_ends_within_the_query_budget(embed_server, form, headers):
    embed_server.delivery = Drip(interval=0.1, headers=headers)  # a ~200-byte reply: 20 s and more
    config = embed_config(form(embed_server, CYBERINE_MEMORY_EMBED_TIMEOUT="0.6"))
    with Embedder(config) as embedder:
        start = time.monotonic()
        with pytest.raises(RemoteError, match=rf"{DEADLINE} 0.6 s") as err:
            embedder.embed_query("login bug")
        elapsed = time.monotonic() - start
    assert 0.55 <= elapsed < 0.6 + 0.9, elapsed  # not the 20 s and more of the whole reply
    assert embed_server.count <= 1 and "CYBERINE_MEMORY_EMBED_TIMEOUT" in str(err.value)


def test_a_whole_call_budget_covers_every_attempt_of_a_dripping_server(embed_server):
    embed_server.delivery = Drip(interval=0.1)
    with Embedder(embed_config(_ollama_env(embed_server))) as embedder:  # write_timeout 30 s per attempt
        start = time.monotonic()
        with pytest.raises(RemoteError, match=rf"\(time budget used up\): {DEADLINE} 0.8 s"):
            embedder.embed(["a"], timeout=0.8)
        assert time.monotonic() - start < 0.8 + 0.9


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_huge_embeddings_reply_is_cut_off_at_its_cap(embed_server, declared):
    embed_server.delivery = Huge(2 << 30, declared=declared)  # 2 GiB
    config = dataclasses.replace(embed_config(_ollama_env(embed_server)), backoff=0.05)
    with Embedder(config) as embedder:
        start = time.monotonic()
        with pytest.raises(RemoteError, match=r"answered with a reply over 327,680 bytes .*nothing kept") as err:
            embedder.embed(["one text"])
        elapsed = time.monotonic() - start
    assert embed_server.count == 1, "a reply too large is not asked for again"
    assert elapsed < 3.0, elapsed
    assert ("2,147,483,648 bytes" in str(err.value)) is declared
    assert embed_server.sent < 64 << 20, f"{embed_server.sent:,} bytes went out before the client hung up"


def test_the_reply_cap_grows_with_the_batch():
    from cybmem.clients.embeddings import embed_reply_limit

    assert embed_reply_limit(1) == 64 * 1024 + 256 * 1024
    assert embed_reply_limit(32) == 64 * 1024 + 32 * 256 * 1024
    # 32 vectors of 4096 dimensions, each number as JSON, fit
    reply = json.dumps({"embeddings": [[-0.012345678901234567] * 4096] * 32}).encode()
    assert len(reply) < embed_reply_limit(32)


def test_a_reply_over_the_cap_from_any_transport_is_refused():
    big = json.dumps(ollama_reply(1, dims=100_000)).encode()
    embedder = mock_embedder(lambda request: httpx.Response(200, content=big))
    with pytest.raises(RemoteError, match="reply over 327,680 bytes"):
        embedder.embed(["x"])


# --------------------------------------------------------------------------------------------
# Integration: the real MiniLM model

PARAPHRASE = ("the login page rejects valid passwords", "users cannot sign in with correct credentials")
UNRELATED = "the quarterly marketing budget was approved by finance"


@pytest.mark.model
def test_minilm_vectors_are_the_same_through_both_forms(minilm_server, minilm):
    texts = [*PARAPHRASE, UNRELATED]
    with Embedder(embed_config(_ollama_env(minilm_server))) as ollama, Embedder(embed_config(_openai_env(minilm_server))) as openai:
        a = ollama.embed(texts)
        b = openai.embed(texts)
        q = ollama.embed_query(PARAPHRASE[0])
    assert a.shape == (3, MINILM_DIMS) and ollama.dims == openai.dims == MINILM_DIMS
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a, minilm(texts), atol=1e-6)
    np.testing.assert_allclose(q, a[0], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)  # the model normalises
    assert [r.body["model"] for r in minilm_server.requests] == [MINILM_NAME] * 3


@pytest.mark.model
def test_minilm_puts_a_paraphrase_closer_than_an_unrelated_sentence(minilm_server):
    with Embedder(embed_config(_openai_env(minilm_server))) as embedder:
        login, signin, budget = embedder.embed([*PARAPHRASE, UNRELATED])
    cosine = lambda x, y: float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))  # noqa: E731
    assert cosine(login, signin) > 0.4
    assert cosine(login, signin) > cosine(login, budget) + 0.3
    assert cosine(login, signin) > cosine(signin, budget) + 0.3


@pytest.mark.model
def test_minilm_batches_match_one_request(minilm_server):
    texts = [f"record {i}: fixed the cart drawer test on attempt {i}" for i in range(7)]
    config = embed_config(_ollama_env(minilm_server))
    with Embedder(dataclasses.replace(config, batch_size=3)) as small, Embedder(config) as whole:
        np.testing.assert_allclose(small.embed(texts), whole.embed(texts), atol=1e-5)
    assert minilm_server.count == 3 + 1


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
