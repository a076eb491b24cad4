"""The MCP server over streamable HTTP on 127.0.0.1 (``cybmem mcp --http PORT``): the listening
socket (:func:`listen`), a deadline for each request (:data:`REQUEST_TIMEOUT`), the loop's handling
of running out of file descriptors, and uvicorn serving the SDK's app (:func:`serve_http`)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import CybmemError

if TYPE_CHECKING:  # pragma: no cover
    from mcp.server.mcpserver import MCPServer

__all__ = ["REQUEST_TIMEOUT", "listen", "serve_http"]


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


class _Deadlines:
    """The HTTP server's per-connection deadlines (:data:`REQUEST_TIMEOUT`): a connection that is
    due a request and has not sent all of it in time is answered ``408`` (when part came) and
    closed, the same for a request cut off in its headers or in its body.

    Two halves meet here: :meth:`protocol` wraps uvicorn's protocol for each connection (it sees
    the connection open, bytes arrive and the connection close) and :meth:`app` wraps the ASGI app
    (it reads the whole body before the app runs, and sees the answer sent), keyed by the client's
    address. The time the app takes to answer is not bounded: a search may take long, a stream
    stays open."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.connections: dict[tuple, _Guarded] = {}

    def protocol(self, inner: type[asyncio.Protocol]) -> Callable[..., asyncio.Protocol]:
        """The protocol factory uvicorn calls (with its keyword arguments) for each connection."""
        return lambda **kwargs: _Guarded(inner(**kwargs), self)

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

            async def answer(message: dict) -> None:
                await send(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    guard.due()  # the next request on this connection has its own deadline

            await app(scope, body, answer)

        return guarded


#: The largest request body the SDK takes (its DEFAULT_MAX_REQUEST_BODY_SIZE; a larger one is answered
#: 413): what the deadline's reader holds at most before the app runs (a test holds the two equal).
MAX_BODY = 4 * 1024 * 1024


class _Guarded(asyncio.Protocol):
    """One HTTP connection: uvicorn's protocol, with the deadline of :class:`_Deadlines`."""

    def __init__(self, inner: asyncio.Protocol, deadlines: _Deadlines):
        self.inner, self.deadlines = inner, deadlines
        self.transport: asyncio.Transport | None = None
        self.peer: tuple = ()
        self.timer: asyncio.TimerHandle | None = None
        self.partial = False

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
        if self.partial:  # a request begun, never ended (its headers or its body): the client is told why
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                                 b"connection: close\r\ncontent-length: 25\r\n\r\nrequest not sent in time\n")
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.partial = True
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.met()
        if self.deadlines.connections.get(self.peer) is self:
            del self.deadlines.connections[self.peer]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


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
    said = -60.0

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        nonlocal said
        exc = context.get("exception")
        if isinstance(exc, ValueError) and sock.fileno() == -1:
            return None
        if not (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)):
            return loop.default_exception_handler(context)
        if time.monotonic() - said >= 60:
            said = time.monotonic()
            print(f"cybmem mcp: warning: out of file descriptors ({exc.strerror}); new connections wait until "
                  "some close", file=sys.stderr, flush=True)

    return handle


async def serve_http(server: MCPServer, sock: socket.socket) -> None:
    """Serve ``server`` on ``sock``: only its own origin (the scheme, host and port it listens on,
    in one ``Origin`` header) is accepted, each request has :data:`REQUEST_TIMEOUT` to arrive, and
    running out of descriptors makes new connections wait instead of ending the server.

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
    deadlines = _Deadlines(REQUEST_TIMEOUT)
    sdk_app = server.streamable_http_app(host="127.0.0.1", transport_security=own, json_response=True)
    app = deadlines.app(_one_origin(sdk_app))
    config = uvicorn.Config(app, http=deadlines.protocol(H11Protocol), log_level="warning", lifespan="on",
                            timeout_keep_alive=int(REQUEST_TIMEOUT), backlog=_BACKLOG, access_log=False)
    await uvicorn.Server(config).serve(sockets=[sock])

