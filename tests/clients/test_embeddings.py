"""The embeddings client (cybmem.clients.embeddings) and the one JSON POST under it
(cybmem.clients.http_json): config, batching, retries, validation, deadlines, real servers.

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
from cybmem.clients import embeddings
from cybmem.clients.embeddings import EmbedConfig, Embedder
from cybmem.clients.http_json import RemoteError
from cybmem.settings import EmbeddingSettings, ollama_base_url
from servers import DEADLINE, DRIPS, HANG, HASH_DIMS, Drip, Huge, MINILM_DIMS, MINILM_NAME, chat_server, embed_server, hash_encode, minilm, minilm_server  # noqa: F401

def embed_config(env: dict):
    """The embeddings configuration the variables in ``env`` give (as Settings reads them)."""
    return embeddings.embed_config(EmbeddingSettings.from_env(env))


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

