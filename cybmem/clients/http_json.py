"""One JSON POST to a model server (embeddings or chat), as every model client sends it: a
wall-clock deadline for the whole exchange (:mod:`cybmem.clients.transport`), a reply read up to a
size cap, connection errors, timeouts, 5xx and 429 retried with backoff while the budget lasts, and
every failure a :class:`RemoteError` with a one-line message that says what to check.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import CybmemError

if TYPE_CHECKING:  # pragma: no cover - httpx is imported when a request is made (below)
    import httpx

__all__ = ["CONNECT_TIMEOUT", "RETRY_AFTER_MAX", "RemoteError", "deadline_client", "one_line", "post_json"]

CONNECT_TIMEOUT = 5.0
RETRY_AFTER_MAX = 5.0  # never sleep longer than this on a server's Retry-After
_ERROR_BODY_BYTES = 64 * 1024  # of an error reply, only this much is read (for its message)
_USER_AGENT = "cybmem/0.1 (+remote.py)"


def deadline_client(base_url: str, transport: httpx.BaseTransport | None) -> httpx.Client:
    """An httpx client for one base URL whose exchanges keep their deadline (:mod:`cybmem.clients.transport`)."""
    import httpx  # here, not at the top: reading the configuration (a dispatch's first step) stays cheap

    if transport is None:
        from .transport import DeadlineTransport

        try:
            transport = DeadlineTransport(base_url)
        except ValueError as exc:
            raise RemoteError(str(exc)) from None
    return httpx.Client(transport=transport, headers={"User-Agent": _USER_AGENT})


class RemoteError(CybmemError):
    """An embeddings or distillation server failed or answered something unusable."""


def one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, whitespace collapsed, cut to ``limit`` characters with "…"."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_detail(content: bytes) -> str:
    """The server's own error message if the body carries one (Ollama/OpenAI style), else its head."""
    text = content.decode("utf-8", "replace")
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return one_line(text)
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping):
            err = err.get("message")
        if isinstance(err, str):
            return one_line(err)
    return one_line(text)


def _retry_after(resp: httpx.Response) -> float | None:
    raw = resp.headers.get("retry-after", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return min(max(value, 0.0), RETRY_AFTER_MAX) if math.isfinite(value) else None


def _transport_reason(exc: httpx.TransportError, timeout: float) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return f"connecting timed out after {timeout:.3g} s"
    if isinstance(exc, httpx.TimeoutException):
        return f"no complete reply within {timeout:.3g} s"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused or host unreachable"
    return one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class _TooLarge(Exception):
    """A reply body over its cap."""


def _body(resp: httpx.Response, limit: int, end: float, *, cut: bool = False) -> bytes:
    """The reply body, read as it streams in, at most ``limit`` bytes (``cut``: the head of a longer
    one; else a longer one raises _TooLarge, declared or not), and by ``end`` (time.monotonic())."""
    import httpx

    declared = resp.headers.get("content-length", "")
    if not cut and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(int(declared))
    buf = bytearray()
    for chunk in resp.iter_bytes():
        buf += chunk
        if len(buf) > limit:
            if cut:
                return bytes(buf[:limit])
            raise _TooLarge(None)
        if time.monotonic() > end:  # the transport keeps the deadline; this covers any other transport
            raise httpx.ReadTimeout("the deadline of the exchange passed")
    return bytes(buf)


def post_json(
    client: httpx.Client,
    url: str,
    payload: dict,
    *,
    headers: Mapping[str, str],
    attempt_timeout: float,
    connect_timeout: float,
    attempts: int,
    backoff: float,
    deadline: float | None,
    budget: float | None = None,
    max_bytes: int,
    what: str,
    hint: str,
    reject_hint: str,
) -> Any:
    """POST ``payload`` and return the decoded JSON body; RemoteError when that cannot be had.

    Each attempt is one exchange (connect, request, status line, headers and the whole body)
    that ends within ``attempt_timeout`` seconds of wall-clock time, whatever the server does:
    the deadline is kept at every socket wait (:mod:`cybmem.clients.transport`). A reply body over
    ``max_bytes`` fails at once, unread (a declared length) or cut off as it streams. Retries
    transport errors, timeouts, 5xx and 429 up to ``attempts`` in all, sleeping
    ``backoff * 2**n`` (or a short Retry-After) between them. With a ``deadline``
    (time.monotonic()) every attempt also ends by then and none starts after it, so the call
    returns or raises by then; ``budget`` (the seconds that deadline stood for) is what a
    message then names.
    """
    import httpx

    from .transport import deadline as keep_deadline

    attempts = max(1, attempts)
    reason = ""
    tried = 0
    while tried < attempts:
        now = time.monotonic()
        end, shown = now + attempt_timeout, attempt_timeout
        if deadline is not None:
            left = deadline - now
            if left <= 0.01:
                break
            if deadline < end:
                end, shown = deadline, budget if budget is not None else left
        tried += 1
        per_op = end - now
        timeout = httpx.Timeout(per_op, connect=min(per_op, connect_timeout))
        wait = backoff * 2 ** (tried - 1)
        try:
            with keep_deadline(end), client.stream("POST", url, json=payload, headers=dict(headers), timeout=timeout) as resp:
                status = resp.status_code
                ok = 200 <= status < 300
                content = _body(resp, max_bytes if ok else _ERROR_BODY_BYTES, end, cut=not ok)
        except httpx.TransportError as exc:
            reason = _transport_reason(exc, shown)
        except _TooLarge as exc:
            size = f"{exc.args[0]:,} bytes, " if exc.args[0] else ""
            raise RemoteError(
                f"{what} to {url} answered with a reply over {max_bytes:,} bytes ({size}nothing kept); "
                "is that URL the API itself and not a proxy or a file server?"
            ) from None
        else:
            if ok:
                try:
                    return orjson.loads(content)
                except orjson.JSONDecodeError:
                    raise RemoteError(
                        f"{what} to {url} answered HTTP {status} with a body that is not JSON "
                        f"({one_line(content.decode('utf-8', 'replace'), 80)!r}); is that URL the API itself and not a proxy or web page?"
                    ) from None
            detail = _error_detail(content)
            if status != 429 and status < 500:
                raise RemoteError(f"{what} to {url} was rejected with HTTP {status}: {detail}; {reject_hint}")
            reason = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
            asked = _retry_after(resp)
            wait = wait if asked is None else asked
        if tried >= attempts:
            break
        if deadline is not None and time.monotonic() + wait >= deadline:
            break
        if wait > 0:
            time.sleep(wait)
    if not tried:
        reason = "no time was left for a request"
    spent = " (time budget used up)" if deadline is not None and tried < attempts else ""
    raise RemoteError(f"{what} to {url} failed after {tried} attempt{'s' * (tried != 1)}{spent}: {reason}; {hint}")
