"""An httpx transport that holds every exchange to a wall-clock deadline (the model clients': cybmem.clients.http_json).

httpx's timeouts are per socket operation: a server that sends one byte a second never trips a
2 s read timeout, so a dispatch with a 2 s budget waited minutes (encode/httpx#1450: httpx has
no total timeout). Here every socket operation of an exchange (connect, TLS handshake, sending
the request, each read of the status line, the headers and the body) waits at most for the time
left before the deadline that :func:`deadline` set, and fails with a timeout once it has
passed, so the whole exchange ends by then whatever the server does. No thread: the clock is
checked where the socket waits, through httpcore's public network-backend interface.

The deadline is a context variable: it holds for the code inside ``with deadline(at):`` in this
thread, which is where cybmem sends a request and reads its reply. An exchange outside such a
block has the plain per-operation timeouts. Proxies from the environment (HTTP(S)_PROXY,
ALL_PROXY, NO_PROXY) are honoured as httpx honours them, through the same deadline.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import httpcore
import httpx

__all__ = ["DeadlineTransport", "deadline"]

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("cybmem_http_deadline", default=None)


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Every socket operation inside the block ends by ``at`` (``time.monotonic()``; None: no deadline)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _left(timeout: float | None, exc: type[Exception]) -> float | None:
    """The socket timeout for one operation: ``timeout`` clipped to the time left; ``exc`` once none is."""
    at = _DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise exc("the deadline of the exchange passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A network stream whose every wait is clipped to the deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None) -> "_Stream":
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """httpcore's sync backend with deadline-clipped streams."""

    def __init__(self) -> None:
        self._sync = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None) -> _Stream:
        return _Stream(self._sync.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None) -> _Stream:  # pragma: no cover - no uds here
        return _Stream(self._sync.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@contextlib.contextmanager
def _as_httpx() -> Iterator[None]:
    """httpcore's exceptions as the httpx exceptions of the same name (httpx's own transport does the same)."""
    try:
        yield
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "httpcore":
            raise
        for cls in type(exc).__mro__:
            mapped = getattr(httpx, cls.__name__, None)
            if isinstance(mapped, type) and issubclass(mapped, httpx.TransportError):
                raise mapped(str(exc)) from exc
        raise httpx.TransportError(str(exc)) from exc  # pragma: no cover - every httpcore error has a twin


class _Body(httpx.SyncByteStream):
    def __init__(self, stream) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx():
            yield from self._stream

    def close(self) -> None:
        with _as_httpx():
            if hasattr(self._stream, "close"):
                self._stream.close()


def _proxy_for(url: str) -> str | None:
    """The proxy the environment sets for ``url`` (HTTP(S)_PROXY, ALL_PROXY, unless NO_PROXY lists the host)."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or (parts.hostname and urllib.request.proxy_bypass(parts.hostname)):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


class DeadlineTransport(httpx.BaseTransport):
    """An httpx transport for one base URL whose exchanges keep the deadline of :func:`deadline`.

    Plain-http URLs (a local Ollama) never load the CA bundle (slow, once a process: a dispatch
    would pay it); https ones verify as httpx does (SSL_CERT_FILE, SSL_CERT_DIR honoured).

    Raises:
        ValueError: the environment names a proxy httpx could not use either (SOCKS without socksio).
    """

    def __init__(self, base_url: str) -> None:
        tls = httpx.create_ssl_context() if base_url.lower().startswith("https://") else None
        proxy = _proxy_for(base_url)
        backend = _Backend()
        if proxy is None:
            self._pool: httpcore.ConnectionPool = httpcore.ConnectionPool(
                ssl_context=tls, network_backend=backend, max_keepalive_connections=4, keepalive_expiry=5.0)
        elif proxy.lower().startswith(("http://", "https://")):
            self._pool = httpcore.HTTPProxy(proxy_url=proxy, ssl_context=tls, network_backend=backend,
                                            max_keepalive_connections=4, keepalive_expiry=5.0)
        else:
            raise ValueError(f"the proxy {proxy.split('://')[0]}:// set in the environment for {base_url} is not an "
                             "http(s) proxy; add the host to NO_PROXY")

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx():
            resp = self._pool.handle_request(req)
        return httpx.Response(status_code=resp.status, headers=resp.headers, stream=_Body(resp.stream),
                              extensions=resp.extensions)

    def close(self) -> None:
        self._pool.close()
