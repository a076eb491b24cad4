"""Paths and environment, read once into one object.

Every other module takes a :class:`Settings` (or one of its sub-configurations) instead of
reading ``os.environ``: this is the one module that reads ``CYBERINE_*`` variables, and the one
place their defaults and parsers live (tests/test_docs.py holds both rules). Tests point
``CYBERINE_MEMORY_DIR`` at a temporary directory.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ValidationError

__all__ = ["Settings", "EmbeddingSettings", "DistillSettings", "FeedbackSettings", "WeightSettings", "HookSettings",
           "McpSettings", "WEIGHT_VARIABLES", "HOOK_DEADLINE", "DEFAULT_OLLAMA_HOST", "DEFAULT_OPENAI_BASE",
           "ollama_base_url",
           "DEFAULT_TOPK", "DEFAULT_POINTERS", "DEFAULT_RANKER", "RANKERS", "DEFAULT_MAX_TOKENS", "DEFAULT_ISSUES", "DEFAULT_ISSUE_WINDOW_DAYS",
           "DEFAULT_INDEX_CAP", "DEFAULT_RETUNE", "DEFAULT_SHOWN_CAP", "DEFAULT_EMBED_MODEL", "EMBED_QUERY_TIMEOUT",
           "EMBED_WRITE_TIMEOUT", "MODEL_TIMEOUT"]

#: Prior runs in the MEMORY block: the smallest that names a judged-relevant run as often as the
#: dispatch issue asks (benchmarks/bench_dispatch.py; benchmarks/RESULTS.md, "Figures the module
#: docstrings quoted"); the token budget still bounds the block.
DEFAULT_TOPK = 8
#: How many weaker matches the MEMORY block may show as one-line pointers beside its full entries.
DEFAULT_POINTERS = 10
#: How runs are ordered (CYBERINE_MEMORY_RANKER): the learned ranker by default (issue 39), the linear
#: formula one setting away.
RANKERS = ("learned", "linear")
DEFAULT_RANKER = "learned"
DEFAULT_MAX_TOKENS = 1500
#: Open issues in the MEMORY block (their section also keeps to a third of the budget).
DEFAULT_ISSUES = 5
#: days a closed issue stays in the default `cybmem issues` view (CYBERINE_MEMORY_ISSUE_WINDOW_DAYS)
DEFAULT_ISSUE_WINDOW_DAYS = 90
# index.json keeps this many entries; older ones collapse into archive-summary.md (seeds 3.5).
DEFAULT_INDEX_CAP = 500
#: Re-tune a project's weights when its history has grown by this many percent since the last
#: tuning (CYBERINE_MEMORY_RETUNE; 0: never on its own).
DEFAULT_RETUNE = 0

#: Lines shown.jsonl keeps (CYBERINE_MEMORY_SHOWN_CAP; cybmem.dispatch.feedback).
DEFAULT_SHOWN_CAP = 2000
#: The embeddings layer's defaults (cybmem.clients.embeddings): the model, and the whole budget
#: of a dispatch-time query and of a written record's embedding, in seconds. Dispatch waits for
#: the query vector, so its budget is short: a local Ollama with the model loaded answers one short
#: text in tens of milliseconds; 2 s also covers a busy machine (a cold Ollama falls back to
#: keyword-only scoring, and the next query finds the model warm). Writes and backfills run off
#: the dispatch path and may hit a cold model: 30 s per attempt.
DEFAULT_EMBED_MODEL = "nomic-embed-text"
EMBED_QUERY_TIMEOUT = 2.0
EMBED_WRITE_TIMEOUT = 30.0
#: The whole budget of a distillation call: a chat model on a busy machine writes a few hundred
#: tokens in seconds; a run's hook waits.
MODEL_TIMEOUT = 30.0
#: How long an agent hook (``cybmem hook``) may take, in seconds, before it gives up and lets the
#: agent go on (CYBERINE_HOOK_DEADLINE): a warm block takes a fraction of a second, a record about
#: as long; the first block of a large store builds its cache (seconds), which the next ones reuse.
HOOK_DEADLINE = 10.0

#: The MCP server over HTTP (cybmem.mcp.http): sessions open at once (past it the one least worth
#: keeping is closed for the newcomer), seconds a session that has asked nothing since its
#: initialize is kept, seconds a client may take none of an answer, and MiB of answers waiting for
#: clients to take them, across connections.
MCP_SESSIONS = 1000
MCP_UNUSED_SESSION_TIMEOUT = 30.0
MCP_SEND_TIMEOUT = 10.0
MCP_UNSENT_MB = 64

#: The variable of each retrieval weight (cybmem.retrieval.weights), lowest precedence of none:
#: a set variable overrides every weights file.
WEIGHT_VARIABLES = {
    "w_kw": "CYBERINE_MEMORY_W_KW",
    "w_rec": "CYBERINE_MEMORY_W_REC",
    "w_lin": "CYBERINE_MEMORY_W_LIN",
    "w_vec": "CYBERINE_MEMORY_W_VEC",
    "half_life_days": "CYBERINE_MEMORY_HALF_LIFE_DAYS",
    "floor": "CYBERINE_MEMORY_FLOOR",
    "floor_vec": "CYBERINE_MEMORY_FLOOR_VEC",
}

#: The words that turn a switch off (any case); anything else set turns it on.
_FALSE = frozenset({"0", "false", "no", "off"})


def _text(env: Mapping[str, str], name: str) -> str:
    """A variable's value without surrounding white space ("" when unset)."""
    return (env.get(name) or "").strip()


def _flag(env: Mapping[str, str], name: str, default: bool = True) -> bool:
    """A switch: off for 0, false, no or off (any case), ``default`` when unset or empty, on otherwise."""
    raw = _text(env, name).lower()
    if not raw:
        return default
    return raw not in _FALSE


def _choice_env(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str,
                problems: list[str] | None = None) -> str:
    """One of ``choices`` (any case); with ``problems`` (lenient) another value is reported there and the
    default used."""
    raw = _text(env, name).lower()
    if not raw:
        return default
    if raw in choices:
        return raw
    message = f"{name}={raw!r} is not one of {', '.join(choices)}; set it to e.g. {default} or unset it"
    if problems is None:
        raise ValidationError(message)
    problems.append(message)
    return default


def _int_env(env: Mapping[str, str], name: str, default: int, minimum: int, problems: list[str] | None = None) -> int:
    """An integer variable; with ``problems`` (lenient) a bad value is reported there and the default used."""
    raw = _text(env, name)
    if not raw:
        return default
    try:
        value = int(raw)
        if value < minimum:
            raise ValidationError(f"{name}={value} must be at least {minimum}; set it to e.g. {default} or unset it")
    except ValueError as exc:
        message = str(exc) if isinstance(exc, ValidationError) else f"{name}={raw!r} is not a whole number; set it to e.g. {default} or unset it"
        if problems is None:
            raise ValidationError(message) from None
        problems.append(f"{message} (using {default})")
        return default
    return value


def _seconds(env: Mapping[str, str], name: str, default: float, problems: list[str]) -> float:
    """A positive, finite number of seconds; a bad value is reported in ``problems`` and the default used."""
    raw = _text(env, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        problems.append(f"{name}={raw!r} is not a positive number of seconds; set it to e.g. {default:g} or unset it")
        return default
    return value


def _none_if_empty(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


#: Where a model server is when its variable names none: a local Ollama, OpenAI's API.
DEFAULT_OLLAMA_HOST = "http://127.0.0.1:11434"
DEFAULT_OPENAI_BASE = "https://api.openai.com/v1"


def _http_url(value: str, name: str) -> str:
    """A checked http(s) base URL without a trailing slash."""
    import urllib.parse  # here: only a configured layer's value is parsed

    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError(f"{name}={value!r} is not an http(s) URL; set it to a base URL such as http://127.0.0.1:8000/v1")
    if parts.query or parts.fragment:
        raise ValidationError(f"{name}={value!r} has a query or fragment; give the plain base URL, e.g. http://127.0.0.1:8000/v1")
    return value.rstrip("/")


def ollama_base_url(host: str) -> str:
    """Ollama's base URL from OLLAMA_HOST's value, read the way Ollama's own clients read it.

    "" -> http://127.0.0.1:11434; "host" -> http://host:11434; ":port" -> http://127.0.0.1:port;
    "https://host" -> https://host:443; a path is kept. The bind-all addresses 0.0.0.0 and [::]
    (a common OLLAMA_HOST for the server) are dialled as 127.0.0.1 / [::1].
    """
    import ipaddress
    import urllib.parse

    raw = (host or "").strip().strip("\"'")
    if not raw:
        return DEFAULT_OLLAMA_HOST
    port = 11434
    scheme, sep, hostport = raw.partition("://")
    if not sep:
        scheme, hostport = "http", raw
    elif scheme == "http":
        port = 80
    elif scheme == "https":
        port = 443
    else:
        raise ValidationError(f"OLLAMA_HOST={raw!r} has scheme {scheme!r}; use host:port or an http(s):// URL")
    try:
        split = urllib.parse.urlsplit(f"{scheme}://{hostport}")
        host = split.hostname or "127.0.0.1"
        port = split.port or port
    except ValueError:
        raise ValidationError(f"OLLAMA_HOST={raw!r} is not host:port or a URL; e.g. 127.0.0.1:11434") from None
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            host = f"[{host}]"
    except ValueError:
        pass
    path = split.path.strip("/")
    return f"{scheme}://{host}:{port}" + (f"/{path}" if path else "")


@dataclass(frozen=True)
class EmbeddingSettings:
    """The embeddings layer as configured: ``CYBERINE_MEMORY_EMBEDDINGS`` (``server``: ``ollama`` or
    an OpenAI-compatible base URL; empty: off) and its companions, read and checked: ``kind``
    (``ollama`` or ``openai``) and ``base_url`` say where requests go. ``problem`` holds the first
    value that could not be used (a malformed companion first, then the server's form); the layer
    raises it where it is used (:func:`cybmem.clients.embeddings.embed_config`), so that a bad
    value costs only the layer it belongs to."""

    server: str = ""
    model: str = DEFAULT_EMBED_MODEL  # CYBERINE_MEMORY_EMBED_MODEL
    key: str | None = field(default=None, repr=False)  # CYBERINE_MEMORY_EMBED_KEY (the URL form only)
    query_timeout: float = EMBED_QUERY_TIMEOUT  # CYBERINE_MEMORY_EMBED_TIMEOUT
    write_timeout: float = EMBED_WRITE_TIMEOUT  # CYBERINE_MEMORY_EMBED_WRITE_TIMEOUT
    ollama_host: str = ""  # OLLAMA_HOST, as Ollama's own clients read it (ollama_base_url)
    kind: str = ""  # "ollama" | "openai"; "" when off or not understood
    base_url: str = ""
    problem: str | None = None

    @property
    def on(self) -> bool:
        """Whether embeddings are configured at all (without importing the client)."""
        return bool(self.server)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "EmbeddingSettings":
        problems: list[str] = []
        server = _text(env, "CYBERINE_MEMORY_EMBEDDINGS")
        host = _text(env, "OLLAMA_HOST")
        query = _seconds(env, "CYBERINE_MEMORY_EMBED_TIMEOUT", EMBED_QUERY_TIMEOUT, problems)
        write = _seconds(env, "CYBERINE_MEMORY_EMBED_WRITE_TIMEOUT", EMBED_WRITE_TIMEOUT, problems)
        kind = base = ""
        if server and not problems:
            try:
                if server.lower() == "ollama":
                    kind, base = "ollama", ollama_base_url(host)
                elif re.match(r"https?://", server, re.IGNORECASE):
                    kind, base = "openai", _http_url(server, "CYBERINE_MEMORY_EMBEDDINGS")
                else:
                    raise ValidationError(
                        f"CYBERINE_MEMORY_EMBEDDINGS={server!r} is not understood; set it to `ollama` (a local Ollama "
                        "at OLLAMA_HOST) or to an OpenAI-compatible base URL such as http://127.0.0.1:11434/v1, or "
                        "unset it")
            except ValidationError as exc:
                kind, base = "", ""
                problems.append(str(exc))
        return cls(
            server=server,
            model=_text(env, "CYBERINE_MEMORY_EMBED_MODEL") or DEFAULT_EMBED_MODEL,
            key=_none_if_empty(env.get("CYBERINE_MEMORY_EMBED_KEY")),
            query_timeout=query,
            write_timeout=write,
            ollama_host=host,
            kind=kind,
            base_url=base,
            problem=problems[0] if problems else None,
        )


@dataclass(frozen=True)
class DistillSettings:
    """ADD-only distillation as configured: ``CYBERINE_MEMORY_MODEL`` (``model``: ``ollama:<model>``
    or a model name; empty: off) and its companions, read and checked: ``kind``, ``base_url`` and
    ``model_name`` say where requests go and for which model. ``problem`` holds the first value that
    could not be used; the layer raises it where it is used
    (:func:`cybmem.clients.distillation.distill_config`)."""

    model: str = ""
    url: str = ""  # CYBERINE_MEMORY_MODEL_URL
    openai_base_url: str = ""  # OPENAI_BASE_URL, when CYBERINE_MEMORY_MODEL_URL is not set
    key: str | None = field(default=None, repr=False)  # CYBERINE_MEMORY_MODEL_KEY, else OPENAI_API_KEY
    timeout: float = MODEL_TIMEOUT  # CYBERINE_MEMORY_MODEL_TIMEOUT
    redact: bool = True  # CYBERINE_MEMORY_REDACT: the prompt is redacted as the record is
    ollama_host: str = ""  # OLLAMA_HOST
    kind: str = ""  # "ollama" | "openai"; "" when off or not understood
    base_url: str = ""
    model_name: str = ""  # the model asked for (without ``ollama:``)
    problem: str | None = None

    @property
    def on(self) -> bool:
        """Whether distillation is configured at all (without importing the client)."""
        return bool(self.model)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "DistillSettings":
        problems: list[str] = []
        value = _text(env, "CYBERINE_MEMORY_MODEL")
        url, openai_base, host = _text(env, "CYBERINE_MEMORY_MODEL_URL"), _text(env, "OPENAI_BASE_URL"), _text(env, "OLLAMA_HOST")
        key = _none_if_empty(env.get("CYBERINE_MEMORY_MODEL_KEY")) or _none_if_empty(env.get("OPENAI_API_KEY"))
        timeout = _seconds(env, "CYBERINE_MEMORY_MODEL_TIMEOUT", MODEL_TIMEOUT, problems)
        kind = base = name = ""
        if value and not problems:
            try:
                kind, base, name = _distill_target(value, url, openai_base, host, key)
            except ValidationError as exc:
                problems.append(str(exc))
        return cls(model=value, url=url, openai_base_url=openai_base, key=key, timeout=timeout,
                   redact=_flag(env, "CYBERINE_MEMORY_REDACT", True), ollama_host=host, kind=kind, base_url=base,
                   model_name=name, problem=problems[0] if problems else None)


def _distill_target(value: str, url: str, openai_base: str, host: str, key: str | None) -> tuple[str, str, str]:
    """(kind, base URL, model) of CYBERINE_MEMORY_MODEL's ``value`` and its companions.

    Raises:
        ValidationError: a value is malformed, or api.openai.com is the target and no key is set.
    """
    if value.lower().startswith("ollama:"):
        model = value[len("ollama:"):].strip()
        if not model:
            raise ValidationError("CYBERINE_MEMORY_MODEL=ollama: names no model; use e.g. ollama:llama3.1:8b")
        return "ollama", ollama_base_url(host), model
    if re.match(r"https?://", value, re.IGNORECASE):
        raise ValidationError(
            f"CYBERINE_MEMORY_MODEL={value!r} is a URL; set it to a model name (or ollama:<model>) "
            "and put the base URL in CYBERINE_MEMORY_MODEL_URL"
        )
    if url:
        base = _http_url(url, "CYBERINE_MEMORY_MODEL_URL")
    elif openai_base:
        base = _http_url(openai_base, "OPENAI_BASE_URL")
    else:
        base = DEFAULT_OPENAI_BASE
    if key is None and base == DEFAULT_OPENAI_BASE:
        raise ValidationError(
            f"CYBERINE_MEMORY_MODEL={value} goes to {DEFAULT_OPENAI_BASE}, which needs a key: set "
            "CYBERINE_MEMORY_MODEL_KEY (or OPENAI_API_KEY), or point CYBERINE_MEMORY_MODEL_URL at a local server"
        )
    return "openai", base, value


@dataclass(frozen=True)
class FeedbackSettings:
    """The shown / used logs (cybmem.dispatch.feedback): kept unless ``CYBERINE_MEMORY_FEEDBACK``
    is off; shown.jsonl capped at ``CYBERINE_MEMORY_SHOWN_CAP`` lines (``problem``: why a set
    cap was not taken)."""

    enabled: bool = True
    shown_cap: int = DEFAULT_SHOWN_CAP
    problem: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "FeedbackSettings":
        raw, problem = _text(env, "CYBERINE_MEMORY_SHOWN_CAP"), None
        cap = DEFAULT_SHOWN_CAP
        if raw.isdigit() and int(raw) >= 1:
            cap = int(raw)
        elif raw:
            problem = (f"CYBERINE_MEMORY_SHOWN_CAP={raw!r} is not a whole number of at least 1; set it to e.g. "
                       f"{DEFAULT_SHOWN_CAP} or unset it (using {DEFAULT_SHOWN_CAP})")
        return cls(enabled=_flag(env, "CYBERINE_MEMORY_FEEDBACK", True), shown_cap=cap, problem=problem)


#: A number as a weight variable may give it: digits, a point, an exponent (what JSON writes), nothing
#: else (float() also takes "1_0" for 10, full-width digits and "infinity").
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


@dataclass(frozen=True)
class McpSettings:
    """The bounds of ``cybmem mcp --http`` (cybmem.mcp.http) under load it did not ask for:
    ``sessions`` open at once (``CYBERINE_MEMORY_MCP_SESSIONS``), ``unused_session_timeout``
    (``CYBERINE_MEMORY_MCP_UNUSED_SESSION_TIMEOUT``), ``send_timeout``
    (``CYBERINE_MEMORY_MCP_SEND_TIMEOUT``) and ``unsent_mb`` (``CYBERINE_MEMORY_MCP_UNSENT_MB``).
    A malformed one is said in ``problems`` and its default used (the server says so as it starts)."""

    sessions: int = MCP_SESSIONS
    unused_session_timeout: float = MCP_UNUSED_SESSION_TIMEOUT
    send_timeout: float = MCP_SEND_TIMEOUT
    unsent_mb: int = MCP_UNSENT_MB
    problems: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "McpSettings":
        problems: list[str] = []

        def seconds(name: str, default: float) -> float:
            said = len(problems)
            value = _seconds(env, name, default, problems)
            problems[said:] = [f"{problem} (using {default:g})" for problem in problems[said:]]
            return value

        return cls(
            sessions=_int_env(env, "CYBERINE_MEMORY_MCP_SESSIONS", MCP_SESSIONS, 1, problems),
            unused_session_timeout=seconds("CYBERINE_MEMORY_MCP_UNUSED_SESSION_TIMEOUT", MCP_UNUSED_SESSION_TIMEOUT),
            send_timeout=seconds("CYBERINE_MEMORY_MCP_SEND_TIMEOUT", MCP_SEND_TIMEOUT),
            unsent_mb=_int_env(env, "CYBERINE_MEMORY_MCP_UNSENT_MB", MCP_UNSENT_MB, 1, problems),
            problems=tuple(problems),
        )


@dataclass(frozen=True)
class WeightSettings:
    """Where retrieval weights come from beyond the weights.json files (cybmem.retrieval.weights):
    ``file``, the one ``CYBERINE_MEMORY_WEIGHTS`` names, and ``variables``, the
    :data:`WEIGHT_VARIABLES` that are set, in that order, as (weight, variable, its text, its value)
    with the value None when the text is no plain number (each weight's range is checked where the
    weights are loaded: :func:`cybmem.retrieval.weights.load_weights`, which says why in either case)."""

    file: Path | None = None
    variables: tuple[tuple[str, str, str, float | None], ...] = ()

    @property
    def names(self) -> list[str]:
        """The weight variables that are set."""
        return [var for _, var, _, _ in self.variables]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "WeightSettings":
        extra = _text(env, "CYBERINE_MEMORY_WEIGHTS")
        variables = []
        for weight, var in WEIGHT_VARIABLES.items():
            raw = env.get(var)
            if raw is None or not raw.strip():
                continue
            variables.append((weight, var, raw, float(raw) if _PLAIN_NUMBER.fullmatch(raw.strip()) else None))
        return cls(file=Path(extra) if extra else None, variables=tuple(variables))


@dataclass(frozen=True)
class HookSettings:
    """The agent hooks (cybmem.hooks): how long a hook may take before it gives up
    (``CYBERINE_HOOK_DEADLINE``, seconds; ``problem``: why a set value was not taken), and where the
    agents keep their settings: Claude Code under ``$HOME/.claude``, Codex in ``$CODEX_HOME``
    (default ``$HOME/.codex``)."""

    deadline: float = HOOK_DEADLINE
    home: Path = field(default_factory=Path.home)
    codex_home: Path = field(default_factory=lambda: Path.home() / ".codex")
    problem: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "HookSettings":
        problems: list[str] = []
        home = Path(_text(env, "HOME") or Path.home()).expanduser()
        codex = _text(env, "CODEX_HOME")
        return cls(deadline=_seconds(env, "CYBERINE_HOOK_DEADLINE", HOOK_DEADLINE, problems), home=home,
                   codex_home=Path(codex).expanduser() if codex else home / ".codex",
                   problem=problems[0] if problems else None)


@dataclass(frozen=True)
class Settings:
    """Everything cybmem reads from the environment, resolved once; no other module reads it.

    Memory root: ``CYBERINE_MEMORY_DIR``, else ``$CYBERINE_HOME/memory``, else
    ``~/.cyberine/memory`` (``memory_from`` says which). The optional layers and the weights have
    sub-configurations of their own: ``embeddings`` and ``distill`` (cybmem.clients.embeddings, cybmem.clients.distillation),
    ``feedback`` (cybmem.dispatch.feedback), ``weights`` (cybmem.retrieval.weights), ``hooks`` (the
    agent hooks: cybmem.hooks, cybmem.operations.hook_settings), ``mcp`` (cybmem.mcp.http). Every
    variable is listed, with its default, in USAGE.md's table under "Set up".
    """

    memory_dir: Path
    enabled: bool = True
    topk: int = DEFAULT_TOPK
    pointers: int = DEFAULT_POINTERS
    max_tokens: int = DEFAULT_MAX_TOKENS
    issues: int = DEFAULT_ISSUES
    run_id: str | None = None
    parent_run_id: str | None = None
    chat_session_id: str | None = None
    redact_secrets: bool = True
    #: the scanner whose rules join the redaction pass (CYBERINE_MEMORY_SECRET_SCANNER, lowercase; None: off)
    secret_scanner: str | None = None
    issue_window_days: int = DEFAULT_ISSUE_WINDOW_DAYS
    index_cap: int = DEFAULT_INDEX_CAP
    retune: int = DEFAULT_RETUNE
    #: the project the notebooks and ``cybmem report`` read when none is named (CYBERINE_MEMORY_PROJECT)
    project: str | None = None
    #: how search, inject and the MEMORY block order runs (CYBERINE_MEMORY_RANKER): "learned" (the linear
    #: formula's pool reordered by the shipped trees, cybmem.retrieval.ranker) or "linear" (the formula alone)
    ranker: str = DEFAULT_RANKER
    embeddings: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    distill: DistillSettings = field(default_factory=DistillSettings)
    feedback: FeedbackSettings = field(default_factory=FeedbackSettings)
    weights: WeightSettings = field(default_factory=WeightSettings)
    hooks: HookSettings = field(default_factory=HookSettings)
    mcp: McpSettings = field(default_factory=McpSettings)
    #: what chose ``memory_dir``: "argument", "CYBERINE_MEMORY_DIR", "CYBERINE_HOME" or "default"
    memory_from: str = field(default="argument", compare=False)
    problems: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @staticmethod
    def started_in(env: Mapping[str, str] | None = None) -> Path | None:
        """Where the shell that started this process stood (``$PWD`` of ``env``, default
        ``os.environ``), when it names a directory: a Jupyter kernel runs in the notebook's own
        directory but inherits the ``$PWD`` of the shell that started Jupyter, where the person who
        typed a relative CYBERINE_MEMORY_DIR stood (``relative_to`` of :meth:`from_env`)."""
        started = (os.environ if env is None else env).get("PWD", "")
        return Path(started) if os.path.isabs(started) and os.path.isdir(started) else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, memory_dir: str | os.PathLike | None = None,
                 lenient: bool = False, relative_to: str | os.PathLike | None = None) -> "Settings":
        """Read settings from ``env`` (default ``os.environ``); ``memory_dir`` overrides the root.

        A malformed number raises ValidationError naming the variable, or with ``lenient`` (the
        dispatch path) falls back to its default and is listed in ``problems``. A relative root in
        the variables is relative to ``relative_to`` when given (the notebooks: where Jupyter was
        started), else to the current directory.
        """
        problems: list[str] | None = [] if lenient else None
        env = dict(os.environ if env is None else env)
        if memory_dir is not None:
            root, memory_from = Path(memory_dir), "argument"
        else:
            name = next((n for n in ("CYBERINE_MEMORY_DIR", "CYBERINE_HOME") if _text(env, n)), None)
            if name is None:
                root, memory_from = Path(env.get("HOME") or Path.home()) / ".cyberine" / "memory", "default"
            else:
                root = Path(_text(env, name)).expanduser()
                if relative_to is not None and not root.is_absolute():
                    root = Path(relative_to) / root
                root, memory_from = (root if name == "CYBERINE_MEMORY_DIR" else root / "memory"), name
        return cls(
            memory_dir=root.expanduser().absolute(),
            enabled=_flag(env, "CYBERINE_MEMORY", True),
            topk=_int_env(env, "CYBERINE_MEMORY_TOPK", DEFAULT_TOPK, 0, problems),
            pointers=_int_env(env, "CYBERINE_MEMORY_POINTERS", DEFAULT_POINTERS, 0, problems),
            max_tokens=_int_env(env, "CYBERINE_MEMORY_MAX_TOKENS", DEFAULT_MAX_TOKENS, 0, problems),
            issues=_int_env(env, "CYBERINE_MEMORY_ISSUES", DEFAULT_ISSUES, 0, problems),
            run_id=_none_if_empty(env.get("CYBERINE_RUN_ID")),
            parent_run_id=_none_if_empty(env.get("CYBERINE_PARENT_RUN_ID")),
            chat_session_id=_none_if_empty(env.get("CYBERINE_CHAT_SESSION_ID")),
            redact_secrets=_flag(env, "CYBERINE_MEMORY_REDACT", True),
            secret_scanner=_text(env, "CYBERINE_MEMORY_SECRET_SCANNER").lower() or None
            if _flag(env, "CYBERINE_MEMORY_SECRET_SCANNER", False) else None,
            issue_window_days=_int_env(env, "CYBERINE_MEMORY_ISSUE_WINDOW_DAYS", DEFAULT_ISSUE_WINDOW_DAYS, 0),
            index_cap=_int_env(env, "CYBERINE_MEMORY_INDEX_CAP", DEFAULT_INDEX_CAP, 0),
            retune=_int_env(env, "CYBERINE_MEMORY_RETUNE", DEFAULT_RETUNE, 0, problems),
            project=_none_if_empty(env.get("CYBERINE_MEMORY_PROJECT")),
            ranker=_choice_env(env, "CYBERINE_MEMORY_RANKER", RANKERS, DEFAULT_RANKER, problems),
            embeddings=EmbeddingSettings.from_env(env),
            distill=DistillSettings.from_env(env),
            feedback=FeedbackSettings.from_env(env),
            weights=WeightSettings.from_env(env),
            hooks=HookSettings.from_env(env),
            mcp=McpSettings.from_env(env),
            memory_from=memory_from,
            problems=tuple(problems or ()),
        )
