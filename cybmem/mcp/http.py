"""The MCP server over streamable HTTP on 127.0.0.1 (``cybmem mcp --http PORT``): the listening
socket (:func:`listen`), a deadline for each request (:data:`REQUEST_TIMEOUT`) and for each answer
(:class:`_Deadlines`), the sessions a flood cannot use up (:class:`_Sessions`), the loop's handling
of running out of file descriptors, and uvicorn serving the SDK's app (:func:`serve_http`), which a
SIGTERM ends within :data:`SHUTDOWN_TIMEOUT` seconds whatever its clients do. The bounds are
:class:`cybmem.settings.McpSettings`."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import socket
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import TYPE_CHECKING

from ..errors import CybmemError

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server.mcpserver import MCPServer

    from ..settings import McpSettings

__all__ = ["REQUEST_TIMEOUT", "SHUTDOWN_TIMEOUT", "listen", "serve_http"]


#: Where the MCP endpoint is (the SDK's default).
_PATH = "/mcp"

#: Connections the kernel queues before the server accepts them (also how many the loop accepts
#: at a time).
_BACKLOG = 128


def listen(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:port (0: a free one); only this machine can connect.

    It listens before the line that names the URL is printed: a client that connects as soon as it
    reads the line waits in the backlog while the HTTP app starts, instead of being refused.

    The protocol is named (IPPROTO_TCP, not 0): asyncio turns Nagle's algorithm off only on sockets
    that say they are TCP, and the connections accepted here inherit it. With Nagle on, the end of
    a chunked answer waited for the client's delayed ACK: every call on a kept-alive connection
    took 40 ms more (benchmarks/bench_mcp.py: a search over HTTP 53 ms against 1.5 ms in process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise CybmemError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} (choose another --http PORT, "
                          "or 0 for a free one)") from None
    return sock


#: Seconds an HTTP client has to send a whole request (its headers and its body), counted from
#: when it connects or its last answer was sent; an idle connection is closed after as long.
REQUEST_TIMEOUT = 5.0

#: POST requests the SDK's app works on at once; the others wait their turn, holding only their
#: body. The calls are made on the event loop one after another anyway, but in a session an answer
#: made waits, whole, for the request's own task to write it, which runs only once every call queued
#: before it has been made too: forty sessions asking at once for a 3.6 MB answer held all forty
#: (RSS +295 MB at the peak; +110 MB with 8). An answer leaves the count when its first bytes are
#: handed to the connection, where the bound on unsent bytes takes it over.
_MAKING = 8

#: Seconds a SIGTERM (or Ctrl-C) waits for the answers being written and the calls being made
#: before it cancels them and the server ends (uvicorn's ``timeout_graceful_shutdown``; without it
#: uvicorn waited for every connection to close, and one whose client read nothing never did).
SHUTDOWN_TIMEOUT = 3

_said: dict[str, float] = {}


def _now_and_then(line: str) -> None:
    """``line`` on stderr as a warning, once a minute at most: a flood says so once, not once a
    request. Printed, not logged: it must still work with no descriptor left."""
    if time.monotonic() - _said.get(line, -60.0) >= 60:
        _said[line] = time.monotonic()
        print(f"cybmem mcp: warning: {line}", file=sys.stderr, flush=True)


class _Deadlines:
    """The HTTP server's per-connection deadlines and the bound on answers waiting to be taken.

    A request: a connection that is due a request and has not sent all of it in
    :data:`REQUEST_TIMEOUT` is answered ``408`` (when part came) and closed, the same for a request
    cut off in its headers or in its body. An answer: a connection whose client takes none of what
    is waiting for it for ``send_timeout`` seconds is closed, and what waited dropped (asyncio keeps
    whatever the socket would not take in the process's memory until it is taken: an answer no one
    reads was held for ever, and the connection with it). Across connections at most
    ``unsent_limit`` bytes of answers wait: past it the connections that have gone longest without
    taking anything are closed, but the one an answer was just written to (a single answer larger
    than the limit still reaches a client that reads it). At most :data:`_MAKING` answers are
    being made at once.

    Two halves meet here: :meth:`protocol` wraps uvicorn's protocol for each connection (it sees
    the connection open, bytes arrive, the socket's buffer fill and drain, the connection close)
    and :meth:`app` wraps the ASGI app (it reads the whole body before the app runs, and sees the
    answer sent), keyed by the client's address. The time the app takes to make an answer is not
    bounded: a search may take long, a stream stays open."""

    def __init__(self, seconds: float, send_timeout: float, unsent_limit: int):
        self.seconds, self.send_timeout, self.unsent_limit = seconds, send_timeout, unsent_limit
        self.connections: dict[tuple, _Guarded] = {}
        self.waiting: set[_Guarded] = set()  # connections with part of an answer not yet taken
        self.making = asyncio.Semaphore(_MAKING)

    def protocol(self, inner: type[asyncio.Protocol]) -> Callable[..., asyncio.Protocol]:
        """The protocol factory uvicorn calls (with its keyword arguments) for each connection."""
        return lambda **kwargs: _Guarded(inner(**kwargs), self)

    def drop_unsent(self) -> None:
        """Close the connections with part of an answer not taken yet (the server is ending: no
        client is waited for; uvicorn waited for each to take all of it)."""
        for guard in list(self.connections.values()):
            if guard.unsent():
                guard.abort(None)

    def bound(self, newest: _Guarded) -> None:
        """Close the connections that have waited longest for their client to take anything while
        more than ``unsent_limit`` bytes of answers wait, ``newest`` (just written to) spared."""
        total = sum(guard.unsent() for guard in self.waiting)
        for guard in sorted(self.waiting - {newest}, key=lambda guard: guard.taken_at):
            if total <= self.unsent_limit:
                break
            total -= guard.unsent()
            guard.abort(f"more than {self.unsent_limit // 2**20} MiB of answers waited for clients to take them: "
                        "closed the connections that took nothing for longest")

    def app(self, app: Callable) -> Callable:
        """``app`` called once the request's body has all come (replayed to it as one message): a
        request whose client leaves or whose deadline passes before then never reaches it, so the
        SDK has no half-read body to fail on (it printed a traceback of ClientDisconnect)."""

        async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
            guard = self.connections.get(tuple(scope.get("client") or ())) if scope["type"] == "http" else None
            if guard is None:
                return await app(scope, receive, send)
            whole = None
            sized = dict(scope["headers"]).get(b"content-length", b"")
            if sized.isdigit() and int(sized) > MAX_BODY:
                pass  # the SDK answers 413 from the header alone: nothing to wait for
            elif any(name in (b"content-length", b"transfer-encoding") for name, _ in scope["headers"]):
                chunks, size, more = [], 0, True
                while more and size <= MAX_BODY:  # past the SDK's limit it answers 413 at once: no more is held
                    message = await receive()
                    if message["type"] != "http.request":  # gone: the client, or the deadline (408 written)
                        return None
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    more = bool(message.get("more_body"))
                whole = {"type": "http.request", "body": b"".join(chunks), "more_body": more}
            guard.met()  # all of it came, or more than may (a GET has no body: e.g. a stream the client listens on)

            async def body() -> dict:
                nonlocal whole
                if whole is None:
                    return await receive()
                message, whole = whole, None
                return message

            making = scope["method"] == "POST"

            async def answer(message: dict) -> None:
                nonlocal making
                if message["type"] != "http.response.body":
                    return await send(message)
                if making:  # made: what waits for the client from here on is bounded in bytes
                    making = False
                    self.making.release()
                size = len(message.get("body", b""))
                if guard.paused:  # uvicorn holds it until the client has taken most of what waits before it
                    guard.pending = size
                    self.bound(guard)
                await send(message)
                guard.pending, guard.written = 0, guard.written + size
                if guard.unsent():
                    guard.watch()
                    self.bound(guard)
                if not message.get("more_body"):
                    guard.due()  # the next request on this connection has its own deadline

            if making:
                await self.making.acquire()
            try:
                await app(scope, body, answer)
            finally:
                if making:
                    self.making.release()

        return guarded


#: The largest request body the SDK takes (its DEFAULT_MAX_REQUEST_BODY_SIZE; a larger one is answered
#: 413): what the deadline's reader holds at most before the app runs (a test holds the two equal).
MAX_BODY = 4 * 1024 * 1024


class _Guarded(asyncio.Protocol):
    """One HTTP connection: uvicorn's protocol, with the deadlines of :class:`_Deadlines`."""

    def __init__(self, inner: asyncio.Protocol, deadlines: _Deadlines):
        self.inner, self.deadlines = inner, deadlines
        self.transport: asyncio.Transport | None = None
        self.peer: tuple = ()
        self.timer: asyncio.TimerHandle | None = None
        self.partial = False
        # what the client has taken of the answers written to it: bytes handed to uvicorn (``written``),
        # the one uvicorn holds until the socket drains (``pending``), the taken count at the last look
        # and when it last grew (``taken_at``), and the timer that looks every send_timeout seconds
        self.paused, self.written, self.pending = False, 0, 0
        self.taken, self.taken_at = 0, 0.0
        self.sending: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = tuple((transport.get_extra_info("peername") or ())[:2])
        self.deadlines.connections[self.peer] = self
        self.due()
        self.inner.connection_made(transport)

    def due(self) -> None:
        """A request is due: all of it must arrive within the deadline."""
        self.met()
        self.partial = False
        self.timer = asyncio.get_running_loop().call_later(self.deadlines.seconds, self._expired)

    def met(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.unsent():  # the client is still taking its last answer: the send deadline watches that
            self.timer = asyncio.get_running_loop().call_later(self.deadlines.seconds, self._expired)
            return
        if self.partial:  # a request begun, never ended (its headers or its body): the client is told why
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                                 b"connection: close\r\ncontent-length: 25\r\n\r\nrequest not sent in time\n")
        self.transport.close()

    def unsent(self) -> int:
        """Bytes of answers written to this connection that its client has not taken yet."""
        return self.transport.get_write_buffer_size() + self.pending

    def watch(self) -> None:
        """Part of an answer waits for the client: it must take some of it every send_timeout seconds."""
        if self.sending is None:
            self.taken, self.taken_at = self.written - self.transport.get_write_buffer_size(), time.monotonic()
            self.deadlines.waiting.add(self)
            self.sending = asyncio.get_running_loop().call_later(self.deadlines.send_timeout, self._look)

    def _look(self) -> None:
        self.sending = None
        taken = self.written - self.transport.get_write_buffer_size()
        if not self.unsent():
            self.deadlines.waiting.discard(self)
        elif taken <= self.taken:
            self.abort(f"a client took none of its answer for {self.deadlines.send_timeout:g} s: closed its connection")
        else:
            self.taken, self.taken_at = taken, time.monotonic()
            self.sending = asyncio.get_running_loop().call_later(self.deadlines.send_timeout, self._look)

    def abort(self, why: str | None) -> None:
        """Reset the connection at once, dropping what waits to be sent: in this process (``close``
        would wait for the client to take it) and in the kernel (a socket closed with unsent bytes
        lingers, holding them, for as long as the client keeps its window shut)."""
        if why:
            _now_and_then(why)
        self.deadlines.waiting.discard(self)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.partial = True
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.met()
        if self.sending is not None:
            self.sending.cancel()
            self.sending = None
        self.deadlines.waiting.discard(self)
        if self.deadlines.connections.get(self.peer) is self:
            del self.deadlines.connections[self.peer]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """The socket's buffer is full: what is written now waits in memory for the client (the
        answer that wrote it is watched once the write returns: :meth:`_Deadlines.app`)."""
        self.paused = True
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.paused = False
        self.taken_at = time.monotonic()  # the client took some
        self.inner.resume_writing()


#: An answer this large (in a session) is let go of as soon as it is written: the SDK's transport
#: keeps the last message it routed for each session until the next, so sessions that each asked for
#: one answer of megabytes held them all, for the 30 minutes a used session lives (ten sessions and
#: a 3.6 MB answer each: RSS +100 MB for good). A ping of the server's own (:meth:`_Sessions._internal`)
#: is that next message.
_RELEASE = 256 * 1024
_PING = '{{"jsonrpc": "2.0", "id": "cybmem-release-{}", "method": "ping"}}'


def _header(scope: dict, name: bytes) -> str | None:
    """The first value of header ``name`` (lowercase), as the SDK reads it."""
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), None)


class _Session:
    """What :class:`_Sessions` knows of one session: when it opened or was last asked something,
    and its requests in flight (an open GET stream is none)."""

    __slots__ = ("id", "since", "busy")

    def __init__(self, session_id: str):
        self.id, self.since, self.busy = session_id, time.monotonic(), 0


class _Sessions:
    """The SDK's app behind a bound on its sessions that a flood of them cannot turn against new
    clients, and an early end for the sessions no client uses.

    The SDK keeps a session for 30 minutes after its last request and, once its limit is open,
    answers every new client ``503 Too many open sessions``: 10,000 bare ``initialize`` POSTs
    locked every client out for half an hour. Here a session that has been asked nothing since its
    initialize (no request the SDK answered 200: the ``initialized`` notification is answered 202)
    is ended after ``unused_timeout`` seconds, and a new session is never refused for want of room
    while one can be ended: the oldest unused session is, else the one least recently used, never
    one with a request in flight. A bound per client would not help: every client of a server on
    127.0.0.1 comes from 127.0.0.1. A session is ended as its client ends it, with a ``DELETE``
    to the SDK's app (its id then answers 404, on which an MCP client opens a new session)."""

    def __init__(self, app: Callable, *, limit: int, unused_timeout: float, host: str, path: str):
        # the SDK imported here, not with the module: cybmem.mcp.tools says what to install when it is missing
        from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
        from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS

        self.app, self.limit, self.unused_timeout, self.host, self.path = app, limit, unused_timeout, host, path
        self.id_header, self.handshakes = MCP_SESSION_ID_HEADER.encode(), HANDSHAKE_PROTOCOL_VERSIONS
        self.unused: OrderedDict[str, _Session] = OrderedDict()  # oldest first
        self.used: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self.opening = self.ending = 0  # requests that may open a session; sessions being ended
        self.admitting = asyncio.Lock()
        self.pings = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task] = set()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        session_id = _header(scope, self.id_header)
        if session_id is None:
            version = _header(scope, b"mcp-protocol-version")
            if version is not None and version not in self.handshakes:
                return await self.app(scope, receive, send)  # a self-contained request: no session
            return await self._open(scope, receive, send)
        session = self.unused.get(session_id) or self.used.get(session_id)
        if session is None:
            return await self.app(scope, receive, send)  # none of ours (any more): the SDK answers 404
        busy = int(scope["method"] != "GET")
        session.busy += busy
        status, size = None, 0

        async def watched(message: dict) -> None:
            nonlocal status, size
            if message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            elif message["type"] == "http.response.start":
                status = message["status"]
                if status == 200 and scope["method"] != "DELETE":  # asked something (a notification is a 202)
                    self.unused.pop(session.id, None)
                    self.used[session.id] = session
                    self.used.move_to_end(session.id)
                    session.since = time.monotonic()
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            session.busy -= busy
            if status == 404 or (scope["method"] == "DELETE" and status == 200):
                self._forget(session)  # ended: by its client, or by the SDK's own idle timeout
        if status == 200 and scope["method"] == "POST" and size >= _RELEASE:
            await self._internal(session.id, "POST", _PING.format(next(self.pings)).encode())


    async def _open(self, scope: dict, receive: Callable, send: Callable) -> None:
        """A request without a session: it opens one if the SDK takes it (an initialize)."""
        opened: list[_Session] = []

        async def watched(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                session_id = next((value for key, value in message.get("headers") or () if key.lower() == self.id_header),
                                  None)
                if session_id:
                    session = _Session(session_id.decode("latin-1"))
                    session.busy += 1  # until its answer is written
                    self.unused[session.id] = session
                    opened.append(session)
                    if self.timer is None:
                        self._sweep_in(self.unused_timeout)
            await send(message)

        self.opening += 1
        try:
            if self._full():
                async with self.admitting:  # one at a time, or each would end one for a room another freed
                    while self._full():
                        victim = next((s for s in (*self.unused.values(), *self.used.values()) if not s.busy), None)
                        if victim is None:
                            break  # every session has a request in flight: the SDK answers 503
                        _now_and_then(f"{self.limit} MCP sessions are open: each new one ends the oldest unused one "
                                      "(else the one least recently used)")
                        await self._end(victim)
            await self.app(scope, receive, watched)
        finally:
            self.opening -= 1
            for session in opened:
                session.busy -= 1

    def _full(self) -> bool:
        """Whether the sessions open, being opened and being ended (the SDK counts those until
        they are gone) are more than ``limit``."""
        return len(self.unused) + len(self.used) + self.opening + self.ending > self.limit

    def _forget(self, session: _Session) -> None:
        self.unused.pop(session.id, None)
        self.used.pop(session.id, None)

    def _end(self, session: _Session) -> Coroutine[None, None, None]:
        """End ``session`` as its client would: forgotten now, and a DELETE with its id to the SDK's app."""
        self._forget(session)
        self.ending += 1
        return self._delete(session.id)

    async def _delete(self, session_id: str) -> None:
        try:
            await self._internal(session_id, "DELETE")
        finally:
            self.ending -= 1

    async def _internal(self, session_id: str, method: str, body: bytes = b"") -> None:
        """A request of this server's own to the SDK's app in ``session_id``, as a client sends it;
        its answer is dropped."""
        headers = [(b"host", self.host.encode()), (self.id_header, session_id.encode()),
                   (b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
                   (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
                 "path": self.path, "raw_path": self.path.encode(), "query_string": b"", "root_path": "",
                 "client": None, "server": None, "headers": headers}
        sent = False

        async def receive() -> dict:
            nonlocal sent
            message = {"type": "http.disconnect"} if sent else {"type": "http.request", "body": body, "more_body": False}
            sent = True
            return message

        async def ignore(message: dict) -> None:
            pass

        try:
            await self.app(scope, receive, ignore)
        except Exception as exc:  # the server is ending (the SDK's task group is gone): nothing to do
            logging.getLogger(__name__).debug("%s in session %s not answered: %r", method, session_id, exc)

    def _sweep_in(self, seconds: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(max(seconds, 0.0), self._sweep)

    def _sweep(self) -> None:
        """End the sessions unused for ``unused_timeout`` seconds; look again when the next one is due."""
        self.timer, now, again = None, time.monotonic(), []
        for session in list(self.unused.values()):
            left = session.since + self.unused_timeout - now
            if left > 0:
                again.append(left)
                break
            if session.busy:
                again.append(min(1.0, self.unused_timeout))  # look again once its request is over
                continue
            task = asyncio.get_running_loop().create_task(self._end(session))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        if again:
            self._sweep_in(min(again))


def _one_origin(app: Callable) -> Callable:
    """``app`` behind a refusal of requests with more than one ``Origin`` header, or one with no value
    (403, as a foreign origin is): the SDK reads the first only, so its own origin first and another
    after passed, and takes an empty one as none (a client that sends no Origin at all is served). A
    second ``Host`` never gets here: h11 answers it 400 (RFC 9112, section 3.2)."""

    async def checked(scope: dict, receive: Callable, send: Callable) -> None:
        origins = [value for name, value in scope["headers"] if name == b"origin"] if scope["type"] == "http" else []
        if len(origins) > 1 or (origins and not origins[0].strip()):
            shown = ", ".join(repr(value.decode("latin-1")) for value in origins)
            logging.getLogger(__name__).warning("%s: %s", "more than one Origin header" if len(origins) > 1
                                                else "an empty Origin header", shown)
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")]})
            return await send({"type": "http.response.body", "body": b"Invalid Origin header"})
        return await app(scope, receive, send)

    return checked


def _loop_errors(sock: socket.socket) -> Callable[[asyncio.AbstractEventLoop, dict], None]:
    """The event loop's error handler: running out of file descriptors is one line, once a minute
    at most (the loop waits a second and accepts again; connections wait in the backlog
    meanwhile), without the traceback whose printing needs descriptors. The loop's later tries to
    accept again on ``sock`` once it is closed (at shutdown) are not errors; the rest is said as the
    loop says it."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if isinstance(exc, ValueError) and sock.fileno() == -1:
            return None
        if not (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)):
            return loop.default_exception_handler(context)
        _now_and_then(f"out of file descriptors ({exc.strerror}); new connections wait until some close")

    return handle


async def serve_http(server: MCPServer, sock: socket.socket, bounds: McpSettings,
                     stopping: threading.Event | None = None) -> None:
    """Serve ``server`` on ``sock``: only its own origin (the scheme, host and port it listens on,
    in one ``Origin`` header) is accepted, each request has :data:`REQUEST_TIMEOUT` to arrive and
    each answer ``bounds.send_timeout`` to be taken (:class:`_Deadlines`), sessions are bounded
    without locking new clients out (:class:`_Sessions`), running out of descriptors makes new
    connections wait instead of ending the server, and a SIGTERM ends it within
    :data:`SHUTDOWN_TIMEOUT` seconds of the call being answered: it sets ``stopping`` (the server's
    tools then refuse the calls queued behind that one), drops the answers no client is taking,
    gives the rest that long, and cancels what is left.

    A POST is answered with one JSON body rather than an event stream (the SDK's
    ``json_response``): no tool sends progress or log messages mid-call, and the stream cost a
    call 0.1-0.6 ms more (a task, a channel and a watcher of the connection for each request;
    benchmarks/RESULTS.md, "The MCP server"). A client may still open the GET stream of a
    session. No access log is written."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings
    from uvicorn.protocols.http.h11_impl import H11Protocol

    asyncio.get_running_loop().set_exception_handler(_loop_errors(sock))
    port = sock.getsockname()[1]
    own = TransportSecuritySettings(allowed_hosts=[f"127.0.0.1:{port}", f"localhost:{port}"],
                                    allowed_origins=[f"http://127.0.0.1:{port}"])
    deadlines = _Deadlines(REQUEST_TIMEOUT, bounds.send_timeout, bounds.unsent_mb * 2**20)
    sdk_app = server.streamable_http_app(host="127.0.0.1", transport_security=own, json_response=True,
                                         max_sessions=bounds.sessions, streamable_http_path=_PATH)
    sessions = _Sessions(sdk_app, limit=bounds.sessions, unused_timeout=bounds.unused_session_timeout,
                         host=f"127.0.0.1:{port}", path=_PATH)
    app = deadlines.app(_one_origin(sessions))
    config = uvicorn.Config(app, http=deadlines.protocol(H11Protocol), log_level="warning", lifespan="on",
                            timeout_keep_alive=int(REQUEST_TIMEOUT), backlog=_BACKLOG, access_log=False,
                            timeout_graceful_shutdown=SHUTDOWN_TIMEOUT)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:  # the signal handler
            if stopping is not None:
                stopping.set()
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            deadlines.drop_unsent()
            await super().shutdown(sockets)

    await Server(config).serve(sockets=[sock])
