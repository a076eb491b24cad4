"""httpx clients for the optional layers: embeddings and ADD-only LLM distillation.

Both are off unless configured; the configuration is what :class:`~cybmem.settings.Settings`
read and checked (``settings.embeddings``, ``settings.distill``): ``CYBERINE_MEMORY_EMBEDDINGS``
(``ollama`` or an OpenAI-compatible base URL), ``CYBERINE_MEMORY_MODEL`` (``ollama:<model>`` or a
model name) and their ``_KEY``, ``_URL`` and ``_TIMEOUT`` companions (USAGE.md, the configuration
table); here it becomes where and how to send requests. Every budget is a wall-clock deadline
for the whole exchange (:mod:`cybmem.clients.transport`), a reply is read up to a size cap, connection
errors, timeouts, 5xx and 429 are retried with backoff while the budget lasts, and every failure
is a :class:`RemoteError` with a one-line message. The model only ever refines the outcome of the
NEW record (Mem0's lesson); nothing here reads or changes stored records.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from ..errors import CybmemError, ValidationError
from ..settings import (DEFAULT_EMBED_MODEL, EMBED_QUERY_TIMEOUT, EMBED_WRITE_TIMEOUT, MODEL_TIMEOUT, DistillSettings,
                        EmbeddingSettings)

if TYPE_CHECKING:  # pragma: no cover - httpx is imported when a request is made (below)
    import httpx

__all__ = [
    "DEFAULT_EMBED_MODEL",
    "DistillConfig",
    "EmbedConfig",
    "Embedder",
    "RemoteError",
    "distill",
    "distill_config",
    "embed_config",
    "embed_reply_limit",
    "parse_outcome",
]

# The budgets' defaults (EMBED_QUERY_TIMEOUT, EMBED_WRITE_TIMEOUT, MODEL_TIMEOUT) and the default
# embedding model live with the variables that change them, in cybmem.settings.
CONNECT_TIMEOUT = 5.0
RETRY_AFTER_MAX = 5.0  # never sleep longer than this on a server's Retry-After

# Reply caps. A vector in JSON takes at most ~25 bytes a dimension: 256 KiB holds ~10k
# dimensions (the largest common models have 3-4k); the envelope of a reply is small.
_EMBED_REPLY_BASE = 64 * 1024
_EMBED_REPLY_PER_TEXT = 256 * 1024
# A chat reply is one message of at most ~1k tokens (num_predict) plus its envelope; servers
# that add reasoning text stay far below this.
MAX_CHAT_REPLY_BYTES = 4 * 1024 * 1024
_ERROR_BODY_BYTES = 64 * 1024  # of an error reply, only this much is read (for its message)


def embed_reply_limit(texts: int) -> int:
    """The most bytes an embeddings reply for ``texts`` texts may have; a longer one is refused unread."""
    return _EMBED_REPLY_BASE + _EMBED_REPLY_PER_TEXT * max(texts, 1)

# Distilled outcome limits: one-line items, short lists, a summary of a few sentences.
MAX_ITEMS = 8
MAX_ITEM_CHARS = 300
MAX_SUMMARY_CHARS = 1000
# The prompt: a coding run's answers can be huge; ~12k characters is ~3k tokens.
_TASK_CHARS = 3000
_ANSWERS_CHARS = 8000
_MAX_ANSWERS = 4

_USER_AGENT = "cybmem/0.1 (+remote.py)"


def _client(base_url: str, transport: httpx.BaseTransport | None) -> httpx.Client:
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


# --------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class EmbedConfig:
    """Where and how to embed; ``embed_config(settings.embeddings)`` builds one, ``dataclasses.replace`` tunes it.

    ``query_timeout`` is the whole budget of a dispatch-time query; ``write_timeout`` the whole
    budget of embedding a written record and of each attempt of a backfill batch (wall-clock:
    connect, request and the whole reply).
    """

    kind: str  # "ollama" | "openai"
    base_url: str
    model: str = DEFAULT_EMBED_MODEL
    api_key: str | None = field(default=None, repr=False)
    query_timeout: float = EMBED_QUERY_TIMEOUT
    write_timeout: float = EMBED_WRITE_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT
    batch_size: int = 32
    attempts: int = 3
    backoff: float = 0.25  # seconds before the 2nd attempt; doubles each time
    max_chars: int = 8000  # longer texts are cut: models have a context window

    @property
    def url(self) -> str:
        """The endpoint every request goes to."""
        return self.base_url + ("/api/embed" if self.kind == "ollama" else "/embeddings")


def embed_config(configured: EmbeddingSettings) -> EmbedConfig | None:
    """The embeddings configuration, or None when CYBERINE_MEMORY_EMBEDDINGS is unset or empty.

    Args:
        configured: ``settings.embeddings`` (:class:`~cybmem.settings.EmbeddingSettings`, which read
            and checked the variables).

    Raises:
        ValidationError: a value was not understood (``configured.problem``: the message names the
            accepted forms); raised here, where the layer is used, so that it costs only this layer.
    """
    if not configured.on:
        return None
    if configured.problem:
        raise ValidationError(configured.problem)
    return EmbedConfig(kind=configured.kind, base_url=configured.base_url, model=configured.model,
                       api_key=configured.key if configured.kind == "openai" else None,
                       query_timeout=configured.query_timeout, write_timeout=configured.write_timeout)


@dataclass(frozen=True)
class DistillConfig:
    """Which chat model refines a new record's outcome; ``distill_config(settings.distill)`` builds one.

    ``timeout`` is the whole budget of the call (both attempts, wall-clock).
    """

    kind: str  # "ollama" | "openai"
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = MODEL_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT
    attempts: int = 2  # one call is slow and costs money: one retry covers a blip
    backoff: float = 1.0
    redact: bool = True  # redact secrets (cybmem.store.secrets) from the prompt before it leaves

    @property
    def url(self) -> str:
        """The endpoint every request goes to."""
        return self.base_url + ("/api/chat" if self.kind == "ollama" else "/chat/completions")


def distill_config(configured: DistillSettings) -> DistillConfig | None:
    """The distillation configuration, or None when CYBERINE_MEMORY_MODEL is unset (no default).

    Args:
        configured: ``settings.distill`` (:class:`~cybmem.settings.DistillSettings`, which read and
            checked the variables).

    Raises:
        ValidationError: a value is malformed, or api.openai.com is the target and no key is set
            (``configured.problem``).
    """
    if not configured.on:
        return None
    if configured.problem:
        raise ValidationError(configured.problem)
    return DistillConfig(kind=configured.kind, base_url=configured.base_url, model=configured.model_name,
                         api_key=configured.key if configured.kind == "openai" else None, timeout=configured.timeout,
                         redact=configured.redact)


# --------------------------------------------------------------------------------------------
# One JSON POST with bounded retries


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_detail(content: bytes) -> str:
    """The server's own error message if the body carries one (Ollama/OpenAI style), else its head."""
    text = content.decode("utf-8", "replace")
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return _one_line(text)
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping):
            err = err.get("message")
        if isinstance(err, str):
            return _one_line(err)
    return _one_line(text)


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
    return _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


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


def _post_json(
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
                        f"({_one_line(content.decode('utf-8', 'replace'), 80)!r}); is that URL the API itself and not a proxy or web page?"
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


# --------------------------------------------------------------------------------------------
# Embeddings


def _vectors(data: Any, kind: str, n: int) -> list:
    """The list of vectors in a reply, in input order; raises ValueError naming the fault."""
    if not isinstance(data, Mapping):
        raise ValueError(f"the reply is a JSON {type(data).__name__}, not an object")
    if kind == "ollama":
        vectors = data.get("embeddings")
        if not isinstance(vectors, list):
            raise ValueError("the reply has no \"embeddings\" list")
    else:
        items = data.get("data")
        if not isinstance(items, list):
            raise ValueError("the reply has no \"data\" list")
        if not all(isinstance(item, Mapping) for item in items):
            raise ValueError("an item of \"data\" is not an object")
        if len(items) != n:
            raise ValueError(f"expected {n} vectors, got {len(items)}")
        indexes = [item.get("index") for item in items]
        if all(i is None for i in indexes):
            pass  # some compatible servers leave index out; they answer in input order
        elif sorted(i for i in indexes if type(i) is int) != list(range(n)):
            raise ValueError(f"the \"index\" fields are not 0..{n - 1} once each")
        else:
            items = sorted(items, key=lambda item: item["index"])
        vectors = [item.get("embedding") for item in items]
    if len(vectors) != n:
        raise ValueError(f"expected {n} vectors, got {len(vectors)}")
    return vectors


def _matrix(vectors: list, dims: int | None) -> np.ndarray:
    """Check every vector (non-empty list of numbers, equal lengths, finite) -> float32 n x d."""
    for i, vec in enumerate(vectors):
        if not isinstance(vec, list) or not vec:
            raise ValueError(f"vector {i} is not a non-empty list of numbers")
        if dims is None:
            dims = len(vec)
        elif len(vec) != dims:
            raise ValueError(f"vector {i} has {len(vec)} dimensions where {dims} were expected")
        # orjson yields exact int / float; bool, str and None are not numbers here.
        if not all(type(x) is float or type(x) is int for x in vec):
            raise ValueError(f"vector {i} holds something that is not a number")
    with np.errstate(over="ignore"):
        matrix = np.array(vectors, dtype=np.float32)
    if not np.isfinite(matrix).all():
        raise ValueError("a vector holds NaN or an infinite value")
    return matrix


class Embedder:
    """Turns texts into vectors through Ollama or an OpenAI-compatible embeddings endpoint.

    Example:
        >>> config = embed_config(settings.embeddings)
        >>> if config:
        ...     with Embedder(config) as embedder:
        ...         vectors = embedder.embed(["fix the login form"])   # write path
        ...         query = embedder.embed_query("login bug")          # dispatch path, <= 2 s

    Pass ``client`` (an ``httpx.Client`` it will not close) or ``transport`` (for
    ``httpx.MockTransport`` in unit tests) to control the HTTP layer.
    """

    def __init__(
        self,
        config: EmbedConfig,
        *,
        client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if config.batch_size < 1:
            raise ValidationError(f"batch_size={config.batch_size} must be at least 1")
        self.config = config
        self._own = client is None
        self._client = client or _client(config.base_url, transport)
        self._dims: int | None = None
        self._headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    @property
    def model(self) -> str:
        """The embedding model's name as sent to the server."""
        return self.config.model

    @property
    def dims(self) -> int | None:
        """Vector length, known after the first successful reply (None before)."""
        return self._dims

    def close(self) -> None:
        """Close the HTTP client if this Embedder made it."""
        if self._own:
            self._client.close()

    def __enter__(self) -> "Embedder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Embedder({self.config.kind} {self.config.url} model={self.model!r} dims={self.dims})"

    def embed(self, texts: Sequence[str], *, timeout: float | None = None, budget: float | None = None) -> np.ndarray:
        """Embed texts in batches of ``config.batch_size``.

        Args:
            texts: non-empty strings; each is cut to ``config.max_chars``.
            timeout: None (backfill path): each attempt takes at most ``config.write_timeout``
                seconds. A number: the whole call, all batches and retries included, returns
                or raises within that many seconds. Both are wall-clock time for the whole
                exchange, kept whatever the server does.
            budget: the budget a message names when the call runs out of time (default
                ``timeout``; the caller's whole budget when ``timeout`` is what was left of it).

        Returns:
            float32 array of shape (len(texts), dims), rows in input order.

        Raises:
            ValidationError: texts is not a list of non-empty strings.
            RemoteError: the server failed after the retries, or its reply is malformed.
        """
        if isinstance(texts, (str, bytes)):
            raise ValidationError("embed() takes a list of texts, not one string; wrap it: embed([text])")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ValidationError(f"texts[{i}] is {'empty' if isinstance(text, str) else type(text).__name__}; every text must be a non-empty string")
        if not texts:
            return np.zeros((0, self._dims or 0), dtype=np.float32)
        deadline = None if timeout is None else time.monotonic() + timeout
        size = self.config.batch_size
        parts = [
            self._batch([t[: self.config.max_chars] for t in texts[i : i + size]], deadline, budget or timeout)
            for i in range(0, len(texts), size)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def embed_query(self, text: str, *, timeout: float | None = None, budget: float | None = None) -> np.ndarray:
        """One vector for a dispatch-time query, within ``config.query_timeout`` (or ``timeout``)."""
        return self.embed([text], timeout=self.config.query_timeout if timeout is None else timeout, budget=budget)[0]

    def _batch(self, texts: list[str], deadline: float | None, budget: float | None) -> np.ndarray:
        config = self.config
        where = f"embeddings reply from {config.url}"
        if config.kind == "ollama":
            hint = f"is Ollama running (`ollama serve`) at OLLAMA_HOST={config.base_url}?"
            reject = f"check the model (`ollama pull {config.model}`, CYBERINE_MEMORY_EMBED_MODEL)"
        else:
            hint = "check that the server at CYBERINE_MEMORY_EMBEDDINGS is up"
            reject = "check CYBERINE_MEMORY_EMBED_MODEL and CYBERINE_MEMORY_EMBED_KEY, and that the base URL ends in /v1"
        if deadline is not None:
            hint += " (or raise CYBERINE_MEMORY_EMBED_TIMEOUT)"
        data = _post_json(
            self._client,
            config.url,
            {"model": config.model, "input": texts},
            headers=self._headers,
            attempt_timeout=config.write_timeout,
            connect_timeout=config.connect_timeout,
            attempts=config.attempts,
            backoff=config.backoff,
            deadline=deadline,
            budget=budget,
            max_bytes=embed_reply_limit(len(texts)),
            what=f"embeddings request ({len(texts)} text{'s' * (len(texts) != 1)})",
            hint=hint,
            reject_hint=reject,
        )
        try:
            matrix = _matrix(_vectors(data, config.kind, len(texts)), self._dims)
        except ValueError as exc:
            if self._dims is not None and "dimensions" in str(exc):
                raise RemoteError(
                    f"{where} changed vector length ({exc}); the model behind it changed: "
                    "re-embed the store after changing CYBERINE_MEMORY_EMBED_MODEL"
                ) from None
            raise RemoteError(f"{where} is malformed: {exc}") from None
        self._dims = matrix.shape[1]
        return matrix


# --------------------------------------------------------------------------------------------
# Distillation

_SYSTEM = f"""You condense one finished coding-agent run into its outcome, for a long-term memory.
Reply with one JSON object and nothing else (no prose, no code fences), with exactly these keys:
{{"summary": "...", "accomplished": ["..."], "issues": ["..."], "next": ["..."]}}
- summary: 2 to 4 plain sentences: what was attempted and what actually happened, failures included.
- accomplished: concrete results that were actually achieved, e.g. "fixed X in Y".
- issues: problems that are still open, each written "Short title: detail".
- next: recommended next steps.
Each list has at most {MAX_ITEMS} items, each item one line; use [] for an empty list.
Use only facts from the run below; never invent files, results or numbers.
A draft outcome extracted mechanically is given at the end: correct and complete it."""

_FENCED = re.compile(r"\A```[A-Za-z]*[ \t]*\n(.*)\n[ \t]*```\Z", re.DOTALL)
_BULLET = re.compile(r"\A(?:[-*•]|\d{1,3}[.)])\s+")
_NONE_ITEM = re.compile(r"\A\(?(?:none|n/a|nothing|-)\)?\.?\Z", re.IGNORECASE)


def _first(d: Mapping, *keys: str) -> Any:
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return ""


def _clip(text: str, limit: int) -> str:
    """Cut the middle out of a long text: answers put their conclusions (the trailer) at the end."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head
    return f"{text[:head].rstrip()}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:].lstrip()}"


def _answers(run: Mapping) -> list[tuple[str, str]]:
    """(label, text) of the winning answer (if given) and the workers' final answers."""
    answers: list[tuple[str, str]] = []
    winner = _text(_first(run, "winnerOutput", "winner_output"))
    if winner.strip():
        answers.append(("winning answer", winner))
    workers = run.get("workers")
    for i, worker in enumerate(workers if isinstance(workers, list) else []):
        if not isinstance(worker, Mapping):
            continue
        text = _text(_first(worker, "output", "finalText", "finalAnswer", "answer", "text", "result"))
        if not text.strip() or any(text == seen for _, seen in answers):
            continue
        name = _first(worker, "agentId", "id")
        state = _first(worker, "state", "status")
        label = f"worker {name if isinstance(name, str) else i + 1}" + (f" ({state})" if isinstance(state, str) else "")
        answers.append((label, text))
    return answers[:_MAX_ANSWERS]


def _prompt(run: Mapping, extractive: Mapping) -> str:
    """The user message: the run, trimmed to ~12k characters, and the extractive draft."""
    parts = [f"TASK:\n{_clip(_text(_first(run, 'task', 'prompt')), _TASK_CHARS) or '(none)'}"]
    workflow = _first(run, "workflowName", "workflow_name")
    if isinstance(workflow, str):
        parts.append(f"WORKFLOW: {workflow}")
    state = _first(run, "state", "status")
    parts.append(f"FINAL STATE: {state if isinstance(state, str) else 'unknown'}")
    verdict = _first(run, "verdictSummary", "verdict")
    if isinstance(verdict, Mapping):
        verdict = _first(verdict, "summary", "reason", "verdict")
    if isinstance(verdict, str) and verdict.strip():
        parts.append(f"JUDGE VERDICT: {_one_line(verdict, 500)}")
    answers = _answers(run)
    if answers:
        share = _ANSWERS_CHARS // len(answers)
        parts.append("FINAL ANSWERS:\n" + "\n\n".join(f"--- {label} ---\n{_clip(text, share)}" for label, text in answers))
    else:
        parts.append("FINAL ANSWERS: (none)")
    draft = {key: extractive.get(key) for key in ("summary", "accomplished", "issues", "next") if key in extractive}
    parts.append("DRAFT OUTCOME:\n" + json.dumps(draft, ensure_ascii=False, default=str))
    return "\n\n".join(parts)


def _items(value: Any, key: str) -> list[str]:
    if not isinstance(value, list):
        raise RemoteError(f"distilled outcome: \"{key}\" is a {type(value).__name__}, not a list of strings; the extractive outcome is kept")
    items: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RemoteError(f"distilled outcome: {key}[{i}] is a {type(item).__name__}, not a string; the extractive outcome is kept")
        item = item.strip()
        if "\n" in item or "\r" in item:
            raise RemoteError(f"distilled outcome: {key}[{i}] spans several lines; the extractive outcome is kept")
        item = _BULLET.sub("", " ".join(item.split()))
        if not item or _NONE_ITEM.match(item):
            continue
        if len(item) > MAX_ITEM_CHARS:
            item = item[: MAX_ITEM_CHARS - 1].rstrip() + "…"
        if item not in items:
            items.append(item)
    return items[:MAX_ITEMS]


def parse_outcome(text: str) -> dict:
    """Strictly parse a model's reply into ``{"summary", "accomplished", "issues", "next"}``.

    The reply must be one JSON object (a single code fence around it is tolerated) with the
    four keys: summary a non-empty string, the others lists of one-line strings. Strings are
    trimmed, bullets and "none" items dropped, lists cut to MAX_ITEMS, items to MAX_ITEM_CHARS.
    Other keys are ignored.

    Raises:
        RemoteError: anything else, with a one-line reason.
    """
    if not isinstance(text, str) or not text.strip():
        raise RemoteError("distilled outcome: the model's reply is empty; the extractive outcome is kept")
    body = text.strip()
    fenced = _FENCED.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RemoteError(f"distilled outcome: the model's reply is not JSON ({_one_line(str(exc), 80)}); the extractive outcome is kept") from None
    if not isinstance(data, dict):
        raise RemoteError(f"distilled outcome: the reply is a JSON {type(data).__name__}, not an object; the extractive outcome is kept")
    missing = [key for key in ("summary", "accomplished", "issues", "next") if key not in data]
    if missing:
        raise RemoteError(f"distilled outcome: the reply lacks {', '.join(missing)}; the extractive outcome is kept")
    summary = data["summary"]
    if not isinstance(summary, str) or not summary.strip():
        raise RemoteError("distilled outcome: \"summary\" is not a non-empty string; the extractive outcome is kept")
    summary = " ".join(summary.split())
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[: MAX_SUMMARY_CHARS - 1].rstrip() + "…"
    return {
        "summary": summary,
        "accomplished": _items(data["accomplished"], "accomplished"),
        "issues": _items(data["issues"], "issues"),
        "next": _items(data["next"], "next"),
    }


def _reply_text(data: Any, kind: str, url: str) -> str:
    """The assistant message's content from an Ollama or OpenAI chat reply."""
    where = f"chat reply from {url}"
    if not isinstance(data, Mapping):
        raise RemoteError(f"{where} is a JSON {type(data).__name__}, not an object")
    if kind == "ollama":
        message, finish = data.get("message"), data.get("done_reason")
    else:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise RemoteError(f"{where} has no choices; is it an OpenAI-compatible /chat/completions endpoint?")
        message, finish = choices[0].get("message"), choices[0].get("finish_reason")
    if not isinstance(message, Mapping):
        raise RemoteError(f"{where} has no message object")
    if isinstance(message.get("refusal"), str) and message["refusal"].strip():
        raise RemoteError(f"{where}: the model refused ({_one_line(message['refusal'], 100)}); the extractive outcome is kept")
    if finish == "length":
        raise RemoteError(f"{where} was cut at the model's output limit; the extractive outcome is kept")
    content = message.get("content")
    if not isinstance(content, str):
        raise RemoteError(f"{where} has no text content")
    return content


def distill(
    config: DistillConfig,
    run: Mapping,
    extractive: Mapping,
    *,
    client: httpx.Client | None = None,
    transport: httpx.BaseTransport | None = None,
) -> dict:
    """Ask the configured chat model for a new record's outcome (one call, ADD-only).

    Args:
        config: from ``distill_config(settings.distill)``.
        run: the finished run: ``task``, ``state``, ``verdictSummary`` (or ``verdict``),
            ``winnerOutput`` and/or ``workers`` (each with ``agentId``, ``state``, ``output``);
            run.json's camelCase names and RunInput's snake_case ones both work. Long texts
            are trimmed; secrets are redacted unless ``config.redact`` is False.
        extractive: the outcome cybmem already extracted (summary, accomplished, issues, next),
            shown to the model as a draft.
        client / transport: the HTTP layer (tests); by default a fresh client, closed after.

    Returns:
        ``{"summary": str, "accomplished": [str], "issues": [str], "next": [str]}``; issues are
        "title: detail" lines like the outcome trailer's, for the caller to slug.

    Raises:
        RemoteError: the call failed after its retries, its ``config.timeout`` ran out, or
            the reply is malformed; the caller keeps the extractive outcome.
    """
    if config.redact:
        from ..store.secrets import redact, redact_value  # only the distillation path pays for the patterns

        # The write path's one pass over every text whole, before _prompt clips and collapses it
        # (a clip can part a key from its value: "DB_PASSWORD=" cut away, the password kept),
        # then over the prompt as sent.
        run, extractive = redact_value(dict(run))[0], redact_value(dict(extractive))[0]
        prompt, _kinds = redact(_prompt(run, extractive))
    else:
        prompt = _prompt(run, extractive)
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
    if config.kind == "ollama":
        payload: dict = {
            "model": config.model,
            "messages": messages,
            "stream": False,
            "format": "json",
            "options": {"temperature": 0, "num_predict": 1024},
        }
        hint = f"is Ollama running (`ollama serve`) at OLLAMA_HOST={config.base_url}? (or raise CYBERINE_MEMORY_MODEL_TIMEOUT)"
        reject = f"check the model (`ollama pull {config.model}`, CYBERINE_MEMORY_MODEL)"
    else:
        # No temperature: several OpenAI models reject any value but the default.
        payload = {"model": config.model, "messages": messages, "response_format": {"type": "json_object"}}
        hint = "check the server at CYBERINE_MEMORY_MODEL_URL (or raise CYBERINE_MEMORY_MODEL_TIMEOUT)"
        reject = "check CYBERINE_MEMORY_MODEL, CYBERINE_MEMORY_MODEL_KEY and CYBERINE_MEMORY_MODEL_URL (ending in /v1)"
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    own = client is None
    http = client or _client(config.base_url, transport)
    deadline = time.monotonic() + config.timeout  # the whole call: a run's hook waits for it
    try:
        data = _post_json(
            http,
            config.url,
            payload,
            headers=headers,
            attempt_timeout=config.timeout,
            connect_timeout=config.connect_timeout,
            attempts=config.attempts,
            backoff=config.backoff,
            deadline=deadline,
            budget=config.timeout,
            max_bytes=MAX_CHAT_REPLY_BYTES,
            what=f"distillation request (model {config.model})",
            hint=hint,
            reject_hint=reject,
        )
    finally:
        if own:
            http.close()
    return parse_outcome(_reply_text(data, config.kind, config.url))
