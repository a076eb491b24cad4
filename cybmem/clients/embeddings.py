"""The embeddings client: where and how to embed (:class:`EmbedConfig`, from what
:class:`~cybmem.settings.Settings` read: ``CYBERINE_MEMORY_EMBEDDINGS``, ``ollama`` or an
OpenAI-compatible base URL, and its ``_MODEL``, ``_KEY`` and ``_TIMEOUT`` companions), and
:class:`Embedder`, which turns texts into checked float32 vectors in batches, each a JSON POST
(:mod:`cybmem.clients.http_json`) within its budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ValidationError
from ..settings import DEFAULT_EMBED_MODEL, EMBED_QUERY_TIMEOUT, EMBED_WRITE_TIMEOUT, EmbeddingSettings
from .http_json import CONNECT_TIMEOUT, RemoteError, deadline_client, post_json

if TYPE_CHECKING:  # pragma: no cover - httpx is imported when a request is made
    import httpx

__all__ = ["EmbedConfig", "Embedder", "embed_config", "embed_reply_limit"]

# Reply caps. A vector in JSON takes at most ~25 bytes a dimension: 256 KiB holds ~10k
# dimensions (the largest common models have 3-4k); the envelope of a reply is small.
_EMBED_REPLY_BASE = 64 * 1024
_EMBED_REPLY_PER_TEXT = 256 * 1024


def embed_reply_limit(texts: int) -> int:
    """The most bytes an embeddings reply for ``texts`` texts may have; a longer one is refused unread."""
    return _EMBED_REPLY_BASE + _EMBED_REPLY_PER_TEXT * max(texts, 1)


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
        self._client = client or deadline_client(config.base_url, transport)
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
        data = post_json(
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
