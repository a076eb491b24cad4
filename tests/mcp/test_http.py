"""`cybmem mcp --http`: the server stays up and only its own origin is served (issue 29, item 3);
a flood of sessions locks no client out, unused sessions end, answers no one reads are dropped,
and SIGTERM ends the server in every state (issue 41, finding 6).

Real servers (subprocesses of the `cybmem` console script on 127.0.0.1) and real sockets: a server
under a low RLIMIT_NOFILE (set by a small wrapper that execs it) is given more half-open
connections than it has descriptors and still answers a normal request; a request that never
ends is closed after cybmem.mcp.http.REQUEST_TIMEOUT; an Origin of another local port is refused;
clients that ask for answers of megabytes and never read them are cut off (the bounds of
cybmem.settings.McpSettings, set short through their variables). Every loop is bounded by a deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from cybmem.mcp.http import REQUEST_TIMEOUT, SHUTDOWN_TIMEOUT

from conftest import FIXTURES, LEFTOVERS

CYBMEM = shutil.which("cybmem")
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}).encode()
#: Runs the command after it with RLIMIT_NOFILE set to the first argument (soft and hard).
LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
           "os.execvp(sys.argv[2], sys.argv[2:])")


@contextmanager
def http_server(where: Path, *, nofile: int | None = None, env: dict | None = None, root: Path = FIXTURES):
    """A `cybmem mcp --http 0` on a copy of ``root`` (the fixtures), with ``env`` added to the
    environment; yields (process, port, its stderr file)."""
    copy, log = where / "memory", where / "server.log"
    shutil.copytree(root, copy, ignore=LEFTOVERS)
    command = [CYBMEM, "mcp", "--http", "0", "--memory-dir", str(copy), "--project", "web"]
    if nofile:
        command = [sys.executable, "-c", LIMITED, str(nofile), *command]
    with log.open("w") as errlog:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog,
                                env=os.environ | (env or {}))
    try:
        deadline, found = time.monotonic() + 60, None
        while not found and proc.poll() is None and time.monotonic() < deadline:
            found = re.search(r"serving streamable HTTP at http://127\.0\.0\.1:(\d+)/mcp", log.read_text())
            time.sleep(0.05)
        assert found, log.read_text()
        yield proc, int(found.group(1)), log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post_initialize(port: int, *, origin: str | None = None, timeout: float = 30) -> int:
    """POST an MCP initialize request; the HTTP status of the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if origin:
        headers["Origin"] = origin
    try:
        conn.request("POST", "/mcp", body=INITIALIZE, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def half_open(port: int, head: bytes = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n") -> socket.socket:
    """A connection that sent part of a request and nothing more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    if head:
        sock.sendall(head)
    return sock


def closed_after(sock: socket.socket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closed ``sock`` (at most ``limit``), and what it sent before."""
    start, got = time.monotonic(), b""
    sock.settimeout(0.5)
    while time.monotonic() - start < limit:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return time.monotonic() - start, got


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with http_server(tmp_path_factory.mktemp("http")) as served:
        yield served


def test_a_normal_request_is_answered(server):
    assert post_initialize(server[1]) == 200


@pytest.mark.parametrize("head", [b"", b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"GET /mc"],
                         ids=["idle", "headers-unfinished", "request-line-unfinished"])
def test_a_request_that_never_ends_is_closed_after_the_timeout(server, head):
    sock = half_open(server[1], head)
    with sock:
        took, got = closed_after(sock, REQUEST_TIMEOUT + 10)
    assert REQUEST_TIMEOUT - 0.5 <= took < REQUEST_TIMEOUT + 5, took
    assert got.startswith(b"HTTP/1.1 408 Request Timeout") if head else got == b""


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_that_never_ends_is_answered_408_and_closed_after_the_timeout(server, framing):
    """As a request cut off in its headers: 408, closed, and nothing on stderr (the SDK's traceback
    of a ClientDisconnect was printed)."""
    _, port, log = server
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\n").encode()
    part = (b"Content-Length: %d\r\n\r\n" % len(INITIALIZE) + INITIALIZE[:20] if framing == "content-length" else
            b"Transfer-Encoding: chunked\r\n\r\n14\r\n" + INITIALIZE[:20] + b"\r\n")
    said = len(log.read_text())
    sock = half_open(port, head + part)
    with sock:
        took, got = closed_after(sock, REQUEST_TIMEOUT + 10)
    assert REQUEST_TIMEOUT - 0.5 <= took < REQUEST_TIMEOUT + 5, took
    assert got.startswith(b"HTTP/1.1 408 Request Timeout"), got
    assert post_initialize(port) == 200
    assert log.read_text()[said:] == ""


def test_a_client_that_leaves_mid_body_leaves_nothing_on_stderr(server):
    _, port, log = server
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: 500\r\n\r\n").encode()
    said = len(log.read_text())
    with half_open(port, head + INITIALIZE[:10]):
        time.sleep(0.2)
    assert post_initialize(port) == 200
    assert log.read_text()[said:] == ""


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_past_the_sdks_limit_is_answered_413_without_being_held(server, framing):
    """The reader that waits for a whole body before the app runs holds no more than the SDK takes
    (4 MiB): a larger one declared is answered 413 at once, one streamed past it 413 as it passes
    the limit, not held in memory until the deadline (408)."""
    from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE

    from cybmem.mcp.http import MAX_BODY

    assert MAX_BODY == DEFAULT_MAX_REQUEST_BODY_SIZE
    _, port, log = server
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\n").encode()
    if framing == "content-length":
        sent = b"Content-Length: %d\r\n\r\n" % (50 * MAX_BODY) + b"{" * 1000
    else:
        piece = b"x" * 65536
        sent = b"Transfer-Encoding: chunked\r\n\r\n" + (b"10000\r\n" + piece + b"\r\n") * (MAX_BODY // len(piece) + 2)
    said = len(log.read_text())
    sock = half_open(port, head)
    with sock:
        sock.settimeout(10)
        try:
            sock.sendall(sent)  # and then nothing: a body that never ends
        except OSError:  # answered and closed while sending
            pass
        start, got = time.monotonic(), b""
        while b"\r\n\r\n" not in got and time.monotonic() - start < REQUEST_TIMEOUT + 10:
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
        took = time.monotonic() - start  # the answer, not the close (the rest of the body is not waited for)
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    assert took < REQUEST_TIMEOUT - 1, took
    assert post_initialize(port) == 200
    assert "Traceback" not in log.read_text()[said:]


def test_a_slow_client_is_held_to_the_whole_request_not_to_each_byte(server):
    """A byte every second keeps no request alive past the deadline."""
    sock = half_open(server[1], b"P")
    with sock:
        start, closed = time.monotonic(), False
        while not closed and time.monotonic() - start < REQUEST_TIMEOUT + 5:
            try:
                sock.sendall(b"a")
                time.sleep(1)
            except OSError:  # the server closed it
                closed = True
    assert closed and time.monotonic() - start > REQUEST_TIMEOUT - 0.5


def test_an_idle_connection_between_requests_is_closed(server):
    conn = http.client.HTTPConnection("127.0.0.1", server[1], timeout=30)
    conn.request("POST", "/mcp", body=INITIALIZE, headers={"Content-Type": "application/json",
                                                           "Accept": "application/json, text/event-stream"})
    response = conn.getresponse()
    response.read()
    assert response.status == 200
    with conn.sock as sock:
        took, _ = closed_after(sock, REQUEST_TIMEOUT + 10)
    assert took < REQUEST_TIMEOUT + 5, took


def test_a_tool_call_is_answered_with_one_json_body_on_a_kept_alive_connection(server):
    """The server answers POSTs with a JSON body, not an event stream (json_response: less work per
    call, benchmarks/RESULTS.md, "The MCP server"), in a session opened by the initialize handshake
    and to a self-contained 2026-07-28 request, one after another on one connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server[1], timeout=30)
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    def post(message: dict, headers: dict) -> tuple[http.client.HTTPResponse, bytes]:
        conn.request("POST", "/mcp", body=json.dumps(message).encode(), headers=base | headers)
        response = conn.getresponse()
        return response, response.read()

    def searched(response: http.client.HTTPResponse, body: bytes, call_id: int) -> None:
        assert (response.status, response.getheader("Content-Type")) == (200, "application/json"), body
        message = json.loads(body)
        assert message["id"] == call_id and not message["result"]["isError"], body
        answer = message["result"]["structuredContent"]
        assert answer["project"] == "web" and answer["query"] == "login"
        assert json.loads(message["result"]["content"][0]["text"]) == answer

    try:
        response, body = post(json.loads(INITIALIZE), {})
        assert (response.status, response.getheader("Content-Type")) == (200, "application/json"), body
        assert json.loads(body)["result"]["serverInfo"]["name"] == "cybmem"
        sock = conn.sock
        session = {"Mcp-Session-Id": response.getheader("Mcp-Session-Id"), "Mcp-Protocol-Version": "2025-06-18"}
        assert post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)[0].status == 202
        call = {"name": "search", "arguments": {"query": "login", "k": 3}}
        searched(*post({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}, session), 2)
        modern = {"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "search"}
        envelope = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
        searched(*post({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call | {"_meta": envelope}}, modern), 3)
        assert conn.sock is sock  # kept alive throughout
    finally:
        conn.close()


def test_only_its_own_origin_is_served(server):
    port = server[1]
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other_port = other.getsockname()[1]
    assert post_initialize(port, origin=f"http://127.0.0.1:{port}") == 200
    for origin in (f"http://127.0.0.1:{other_port}", f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}",
                   "http://127.0.0.1", f"http://evil.example:{port}", "null"):
        assert post_initialize(port, origin=origin) == 403, origin


def raw_initialize(port: int, headers: str) -> bytes:
    """The status line of the answer to an initialize request sent with ``headers`` (CRLF-ended
    lines) as they are, repeated names and all."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST /mcp HTTP/1.1\r\n{headers}Content-Type: application/json\r\nAccept: application/json, "
                     f"text/event-stream\r\nContent-Length: {len(INITIALIZE)}\r\nConnection: close\r\n\r\n".encode()
                     + INITIALIZE)
        _, got = closed_after(sock, 30)
    return got.split(b"\r\n", 1)[0]


def test_a_second_origin_or_host_is_refused_as_a_foreign_one_is(server):
    """The SDK reads the first of repeated headers: its own origin first and another after passed."""
    _, port, log = server
    own, host = f"Origin: http://127.0.0.1:{port}\r\n", f"Host: 127.0.0.1:{port}\r\n"
    assert raw_initialize(port, host + own) == b"HTTP/1.1 200 OK"
    for twice in (own + "Origin: http://evil.example\r\n", "Origin: http://evil.example\r\n" + own, own + own):
        assert raw_initialize(port, host + twice) == b"HTTP/1.1 403 Forbidden", twice
    assert "more than one Origin header: 'http://evil.example', 'http://127.0.0.1:" in log.read_text()
    for empty in ("Origin: \r\n", "Origin:\r\n", "Origin:   \r\n"):  # no value is no origin of its own
        assert raw_initialize(port, host + empty) == b"HTTP/1.1 403 Forbidden", empty
    assert "an empty Origin header: ''" in log.read_text()
    # h11 refuses a second Host before the app (RFC 9112, section 3.2: 400)
    assert raw_initialize(port, host + "Host: evil.example\r\n" + own) == b"HTTP/1.1 400 Bad Request"
    assert raw_initialize(port, host + host + own) == b"HTTP/1.1 400 Bad Request"


def test_it_survives_running_out_of_descriptors(tmp_path):
    """More half-open connections than the server has descriptors: it waits for some to close
    (the deadline closes them) instead of exiting, and answers a normal request after them."""
    nofile = 96
    with http_server(tmp_path, nofile=nofile) as (proc, port, log):
        held, deadline = [], time.monotonic() + 60
        while len(held) < nofile + 40 and time.monotonic() < deadline:
            try:
                held.append(half_open(port))
            except OSError:  # the backlog is full: enough
                break
        try:
            assert len(held) > nofile, len(held)
            assert post_initialize(port, timeout=120) == 200
            assert proc.poll() is None, log.read_text()
        finally:
            for sock in held:
                sock.close()
        assert post_initialize(port) == 200
        assert proc.poll() is None
    assert "out of file descriptors" in log.read_text()


def test_connections_the_server_accepts_send_without_waiting_for_acks():
    """The listening socket names its protocol, so asyncio turns Nagle's algorithm off on every
    connection it accepts: otherwise the end of a chunked answer on a kept-alive connection waits
    for the client's delayed ACK, 40 ms a call (benchmarks/RESULTS.md, "The MCP server")."""
    import asyncio

    from cybmem.mcp.http import listen

    async def accepted_nodelay() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = listen(0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


# --- issue 41, finding 6: the server under abuse -------------------------------------------------

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def mcp_post(conn: http.client.HTTPConnection, message: dict | bytes, session: str | None = None,
             headers: dict | None = None) -> tuple[int, http.client.HTTPResponse, bytes]:
    """POST one JSON-RPC message on a kept-alive connection: (status, response, body)."""
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    sent = JSON_HEADERS | ({"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"} if session else {})
    conn.request("POST", "/mcp", body=body, headers=sent | (headers or {}))
    response = conn.getresponse()
    return response.status, response, response.read()


def open_session(conn: http.client.HTTPConnection, *, handshake: bool = True) -> str:
    """A new session's id: an initialize, then (``handshake``) the initialized notification."""
    status, response, body = mcp_post(conn, INITIALIZE)
    assert status == 200, body
    session = response.getheader("Mcp-Session-Id")
    if handshake:
        assert mcp_post(conn, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)[0] == 202
    return session


def ask(conn: http.client.HTTPConnection, session: str) -> int:
    """The status of a request in ``session`` (tools/list): 200 while it lives, 404 once it ended."""
    return mcp_post(conn, {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, session)[0]


def test_a_flood_of_bare_initializes_locks_no_client_out(tmp_path):
    """Five times the session limit of initialize POSTs that never ask anything: a new client is
    served at once, a client at work before the flood keeps its session, the oldest flooded ones
    are gone, and the server said so once (the SDK answered every new client 503 for 30 minutes)."""
    with http_server(tmp_path, env={"CYBERINE_MEMORY_MCP_SESSIONS": "20"}) as (proc, port, log):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        at_work = open_session(conn)
        assert ask(conn, at_work) == 200
        flooded = [open_session(conn, handshake=False) for _ in range(100)]
        fresh = open_session(conn)
        assert ask(conn, fresh) == 200
        assert ask(conn, at_work) == 200
        assert {ask(conn, session) for session in flooded[:80]} == {404}
        assert ask(conn, flooded[-1]) == 200
        conn.close()
        said = log.read_text()
        assert said.count("20 MCP sessions are open: each new one ends the oldest unused one") == 1, said
        assert "Too many open sessions" not in said and "Traceback" not in said
        assert proc.poll() is None


def test_a_flood_of_used_sessions_locks_no_client_out_either(tmp_path):
    """A flood whose sessions each ask something (a ping): they are not unused, and still a new
    client gets in; the least recently used sessions are the ones ended."""
    with http_server(tmp_path, env={"CYBERINE_MEMORY_MCP_SESSIONS": "10"}) as (proc, port, log):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        used = []
        for _ in range(40):
            used.append(open_session(conn, handshake=False))
            assert mcp_post(conn, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, used[-1])[0] == 200
        fresh = open_session(conn)
        assert ask(conn, fresh) == 200
        assert {ask(conn, session) for session in used[:30]} == {404}
        assert ask(conn, used[-1]) == 200
        conn.close()


def test_sessions_that_ask_nothing_end_after_the_unused_session_timeout(tmp_path):
    """A session that was only opened, or opened with the whole handshake (the initialized
    notification asks nothing), ends after CYBERINE_MEMORY_MCP_UNUSED_SESSION_TIMEOUT; one that
    asked something stays (the SDK kept each for 30 minutes after its last request)."""
    with http_server(tmp_path, env={"CYBERINE_MEMORY_MCP_UNUSED_SESSION_TIMEOUT": "1"}) as (proc, port, log):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        bare, handshaken, used = open_session(conn, handshake=False), open_session(conn), open_session(conn)
        assert ask(conn, used) == 200
        time.sleep(2.5)
        assert (ask(conn, bare), ask(conn, handshaken), ask(conn, used)) == (404, 404, 200)
        late = open_session(conn)  # the timer keeps running for the sessions opened later
        time.sleep(2.5)
        assert (ask(conn, late), ask(conn, used)) == (404, 200)
        conn.close()
        assert "Traceback" not in log.read_text()


def test_a_malformed_bound_is_said_at_start_and_its_default_used(tmp_path):
    env = {"CYBERINE_MEMORY_MCP_SESSIONS": "none", "CYBERINE_MEMORY_MCP_SEND_TIMEOUT": "-1"}
    with http_server(tmp_path, env=env) as (proc, port, log):
        assert post_initialize(port) == 200
        said = log.read_text()
    assert ("cybmem mcp: warning: CYBERINE_MEMORY_MCP_SESSIONS='none' is not a whole number; set it to e.g. 1000 or "
            "unset it (using 1000)") in said, said
    assert ("cybmem mcp: warning: CYBERINE_MEMORY_MCP_SEND_TIMEOUT='-1' is not a positive number of seconds; set it "
            "to e.g. 10 or unset it (using 10)") in said, said


#: A record whose `show` answer is 3.6 MB (its task, 1.8 MB, twice: the text and the structured content).
BIG_RUN = {"id": "big-answer", "cwd": "/home/dev/web", "workflowName": "implement-task",
           "task": "A large task: " + "word7 " * 300_000, "status": "done",
           "startedAt": 1790920800000, "endedAt": 1790922000000}
SHOW_BIG = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
    "name": "show", "arguments": {"run_id": "big-answer"}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """The fixtures and BIG_RUN, written by `cybmem write`, with a cache (no .nocache): the server
    holds the snapshot, so a call costs about what making its answer costs."""
    root = tmp_path_factory.mktemp("big") / "memory"
    shutil.copytree(FIXTURES, root, ignore=LEFTOVERS)
    (root / ".nocache").unlink()
    subprocess.run([CYBMEM, "write", "-", "--memory-dir", str(root), "--project", "web"], input=json.dumps(BIG_RUN),
                   text=True, check=True, capture_output=True, timeout=120)
    return root


def show_big(port: int) -> bytes:
    """A raw request for the big record's `show`, self-contained (the 2026-07-28 envelope)."""
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2026-07-28\r\n"
            f"Mcp-Method: tools/call\r\nMcp-Name: show\r\nContent-Length: {len(SHOW_BIG)}\r\n\r\n").encode() + SHOW_BIG


def never_reading(port: int, times: int) -> socket.socket:
    """A connection that asks for the big answer ``times`` over (pipelined) and reads nothing
    (a small receive buffer, so the kernel holds little of it for the client)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(show_big(port) * times)
    return sock


#: The TCP states (Linux's tcpi_state) of a connection open, and of one the other end has reset.
ESTABLISHED, RESET = 1, 7


def tcp_state(sock: socket.socket) -> int:
    """The state of ``sock``, seen without reading from it (reading would be taking the answer)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def wait_closed(socks: list[socket.socket], at_least: int, limit: float = 30) -> None:
    """Wait until the server has closed ``at_least`` of ``socks`` (or ``limit`` seconds pass)."""
    deadline = time.monotonic() + limit
    while sum(tcp_state(sock) != ESTABLISHED for sock in socks) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)


def read_all(sock: socket.socket, limit: float = 30) -> int:
    """Bytes read from ``sock`` until the server closes it, or it sends nothing for 3 seconds."""
    got, start = 0, time.monotonic()
    sock.settimeout(3)
    while time.monotonic() - start < limit:
        try:
            chunk = sock.recv(1 << 20)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        got += len(chunk)
    return got


def answer_size(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        status, _, body = mcp_post(conn, SHOW_BIG, headers={"Mcp-Protocol-Version": "2026-07-28",
                                                            "Mcp-Method": "tools/call", "Mcp-Name": "show"})
        assert status == 200 and json.loads(body)["result"]["structuredContent"]["record"]["runId"] == "big-answer"
        return len(body)
    finally:
        conn.close()


def test_a_client_that_reads_none_of_its_answers_is_closed_after_the_send_timeout(tmp_path, big_store):
    """Connections that ask for three answers of 3.6 MB each and read nothing: each is reset once
    it has taken nothing for CYBERINE_MEMORY_MCP_SEND_TIMEOUT, what waited for it dropped (it held
    its answers, and its connection, for ever), and a client that reads is served meanwhile."""
    with http_server(tmp_path, root=big_store, env={"CYBERINE_MEMORY_MCP_SEND_TIMEOUT": "1"}) as (proc, port, log):
        size = answer_size(port)
        assert size > 3_000_000
        stalled = [never_reading(port, 3) for _ in range(6)]
        try:
            assert answer_size(port) == size
            wait_closed(stalled, len(stalled))
            # reset, not closed: what the kernel held for the client is dropped too (a socket closed
            # with bytes unsent lingers, holding them, while the client's window stays shut)
            assert [tcp_state(sock) for sock in stalled] == [RESET] * len(stalled)
            taken = [read_all(sock) for sock in stalled]
        finally:
            for sock in stalled:
                sock.close()
        assert all(got < 2 * size for got in taken), (taken, size)
        said = log.read_text()
        assert "a client took none of its answer for 1 s: closed its connection" in said, said
        assert "Traceback" not in said


def test_answers_waiting_for_clients_are_bounded_in_bytes(tmp_path, big_store):
    """Past CYBERINE_MEMORY_MCP_UNSENT_MB of answers waiting, the connections that have taken
    nothing for longest are closed long before their send deadline (60 s here); the newest one is
    spared, so a single answer larger than the bound still reaches a client that reads it."""
    env = {"CYBERINE_MEMORY_MCP_SEND_TIMEOUT": "60", "CYBERINE_MEMORY_MCP_UNSENT_MB": "1"}
    with http_server(tmp_path, root=big_store, env=env) as (proc, port, log):
        size = answer_size(port)  # one answer (3.6 MB) over the bound, to a client that reads it
        stalled = []
        try:
            for _ in range(6):
                stalled.append(never_reading(port, 2))
                time.sleep(0.5)
            wait_closed(stalled, len(stalled) - 2)
            taken = [read_all(sock) for sock in stalled]
        finally:
            for sock in stalled:
                sock.close()
        whole = [got for got in taken if got >= 2 * size]
        assert len(whole) <= 2, (taken, size)  # the newest, and one its answer may have been spared for
        said = log.read_text()
        assert "more than 1 MiB of answers waited for clients to take them" in said, said
        assert "a client took none" not in said


def rss_mb(pid: int) -> float:
    """The resident memory of process ``pid``, in MiB."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


#: glibc returns a freed block of this size or more to the system at once (its default moves the bar
#: up to 32 MiB as big blocks are freed, keeping them in the heap): the server's RSS then follows the
#: memory it holds, not the most it once held.
RSS_FOLLOWS = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def session_calls(port: int, sessions: list[str]) -> list[socket.socket]:
    """A `show` of the big record in each of ``sessions``, each on a connection of its own, all
    arriving at once (each request's last byte is sent after every other part)."""
    call = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": "show", "arguments": {"run_id": "big-answer"}}}).encode()
    socks, requests = [], []
    for session in sessions:
        socks.append(socket.create_connection(("127.0.0.1", port)))
        requests.append((f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                         f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n"
                         f"Mcp-Protocol-Version: 2025-06-18\r\nContent-Length: {len(call)}\r\n\r\n").encode() + call)
    for sock, request in zip(socks, requests):
        sock.sendall(request[:-1])
    for sock, request in zip(socks, requests):
        sock.sendall(request[-1:])
    return socks


def read_answers(socks: list[socket.socket], size: int, pid: int) -> float:
    """Read every answer (each at least ``size`` bytes) on ``socks``; the most RSS ``pid`` had meanwhile."""
    import selectors

    most, left = rss_mb(pid), {sock: size for sock in socks}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + 120
        while left and time.monotonic() < deadline:
            most = max(most, rss_mb(pid))
            for key, _ in selector.select(0.02):
                chunk = key.fileobj.recv(1 << 20)
                left[key.fileobj] -= len(chunk)
                if not chunk or left[key.fileobj] <= 0:
                    selector.unregister(key.fileobj)
                    del left[key.fileobj]
    assert not left, "every answer came"
    return most


def big_answers_in_sessions(where: Path, root: Path, count: int) -> tuple[float, float, float]:
    """A server on ``root``; ``count`` sessions ask for the big answer at once and read it: the size
    of an answer (MiB), the most the server's RSS grew meanwhile, and what it grew by after."""
    with http_server(where, root=root, env=RSS_FOLLOWS) as (proc, port, log):
        size = answer_size(port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        sessions = [open_session(conn) for _ in range(count)]
        conn.close()
        before = rss_mb(proc.pid)
        socks = session_calls(port, sessions)
        try:
            most = read_answers(socks, size, proc.pid)
        finally:
            for sock in socks:
                sock.close()
        time.sleep(1)
        return size / 2**20, most - before, rss_mb(proc.pid) - before


def test_sessions_do_not_keep_their_last_big_answer(tmp_path, big_store):
    """Twenty sessions each ask for an answer of 3.6 MB and read it: the server's memory comes back
    (the SDK's transport kept each session's last answer until its next request, for the 30 minutes
    a used session lives: RSS +137 MB for twenty, for good)."""
    size, _, kept = big_answers_in_sessions(tmp_path, big_store, 20)
    assert kept < 10 * size, (kept, size)


def test_answers_are_made_a_few_at_a_time(tmp_path, big_store):
    """Forty sessions ask for an answer of 3.6 MB at the same moment: the server makes a few at a
    time (each answer made waited, whole, for the calls queued before it to be made too: RSS +283
    MB at the peak, about 80 times the size; +110 MB now)."""
    size, most, _ = big_answers_in_sessions(tmp_path, big_store, 40)
    assert most < 50 * size, (most, size)


def test_sigterm_ends_the_server_with_readers_stalled(tmp_path, big_store):
    """SIGTERM with connections that read none of their answers and calls queued behind them:
    the server ends within SHUTDOWN_TIMEOUT, quietly (uvicorn waited for every connection to be
    closed by its client, for ever; only a second Ctrl-C ended it)."""
    with http_server(tmp_path, root=big_store) as (proc, port, log):
        answer_size(port)
        stalled = [never_reading(port, 2) for _ in range(12)]
        try:
            time.sleep(2)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=SHUTDOWN_TIMEOUT + 5)
            took = time.monotonic() - start
        finally:
            for sock in stalled:
                sock.close()
        assert took < SHUTDOWN_TIMEOUT + 2, took
        said = log.read_text()
        assert "Traceback" not in said and "ERROR" not in said, said


def test_sigterm_ends_the_server_with_calls_queued_during_a_flood_and_with_a_stream_open(tmp_path, big_store):
    """SIGTERM while clients that read their answers have sixty calls queued (each answered on the
    event loop in turn), initialize POSTs pour in and a client listens on its session's event
    stream (a GET that never ends): the calls not yet begun are refused, not made (it made every
    queued answer first, seconds of them), and the server ends within SHUTDOWN_TIMEOUT."""
    import selectors

    with http_server(tmp_path, root=big_store) as (proc, port, log):
        size = answer_size(port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        session = open_session(conn)
        conn.request("GET", "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": session,
                                             "Mcp-Protocol-Version": "2025-06-18"})
        assert conn.getresponse().status == 200
        done = threading.Event()

        def flood() -> None:
            while not done.is_set():
                try:
                    post_initialize(port, timeout=5)
                except (OSError, http.client.HTTPException):  # refused or cut: the server is ending
                    time.sleep(0.05)

        readers = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        taken = [0]

        def read() -> None:  # every answer taken as it comes
            with selectors.DefaultSelector() as selector:
                for sock in readers:
                    selector.register(sock, selectors.EVENT_READ)
                while not done.is_set() and selector.get_map():
                    for key, _ in selector.select(0.2):
                        try:
                            chunk = key.fileobj.recv(1 << 20)
                        except OSError:
                            chunk = b""
                        if not chunk:
                            selector.unregister(key.fileobj)
                        taken[0] += len(chunk)

        threads = [threading.Thread(target=flood) for _ in range(3)] + [threading.Thread(target=read)]
        for thread in threads:
            thread.start()
        try:
            for sock in readers:
                sock.sendall(show_big(port) * 2)
            time.sleep(0.5)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            took = time.monotonic() - start
        finally:
            done.set()
            for thread in threads:
                thread.join()
            for sock in readers:
                sock.close()
            conn.close()
        assert took < SHUTDOWN_TIMEOUT + 3, took
        assert taken[0] < 30 * size, (taken[0], size)  # fewer than half the answers were made
        said = log.read_text()
        assert "Traceback" not in said and "ERROR" not in said, said
