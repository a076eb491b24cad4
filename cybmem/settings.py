"""Paths and environment, read once into one object.

Every other module takes a :class:`Settings` instead of reading ``os.environ``;
tests point ``CYBERINE_MEMORY_DIR`` at a temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ValidationError

__all__ = ["Settings", "DEFAULT_TOPK", "DEFAULT_POINTERS", "DEFAULT_MAX_TOKENS", "DEFAULT_ISSUES", "DEFAULT_ISSUE_WINDOW_DAYS", "DEFAULT_INDEX_CAP", "DEFAULT_RETUNE"]

#: Prior runs in the MEMORY block: the smallest that names a judged-relevant run as often as the
#: dispatch issue asks (benchmarks/bench_dispatch.py; benchmarks/RESULTS.md, "Figures the module
#: docstrings quoted"); the token budget still bounds the block.
DEFAULT_TOPK = 8
#: How many weaker matches the MEMORY block may show as one-line pointers beside its full entries.
DEFAULT_POINTERS = 10
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

_FALSE = {"0", "false", "no", "off"}


def _int_env(env: Mapping[str, str], name: str, default: int, minimum: int, problems: list[str] | None = None) -> int:
    """An integer variable; with ``problems`` (lenient) a bad value is reported there and the default used."""
    raw = env.get(name, "").strip()
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


def _flag(env: Mapping[str, str], name: str, default: bool = True) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    return raw not in _FALSE


def _none_if_empty(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


@dataclass(frozen=True)
class Settings:
    """Everything cybmem reads from the environment, resolved once.

    Memory root: ``CYBERINE_MEMORY_DIR``, else ``$CYBERINE_HOME/memory``, else
    ``~/.cyberine/memory``. The optional layers read their own variables from ``env``
    (cybmem.clients.model_servers: embeddings and distillation; cybmem.retrieval.weights: retrieval weights).
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
    issue_window_days: int = DEFAULT_ISSUE_WINDOW_DAYS
    index_cap: int = DEFAULT_INDEX_CAP
    retune: int = DEFAULT_RETUNE
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    problems: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, memory_dir: str | os.PathLike | None = None,
                 lenient: bool = False) -> "Settings":
        """Read settings from ``env`` (default ``os.environ``); ``memory_dir`` overrides the root.

        A malformed number raises ValidationError naming the variable, or with ``lenient`` (the
        dispatch path) falls back to its default and is listed in ``problems``.
        """
        problems: list[str] | None = [] if lenient else None
        env = dict(os.environ if env is None else env)
        if memory_dir is not None:
            root = Path(memory_dir)
        elif env.get("CYBERINE_MEMORY_DIR", "").strip():
            root = Path(env["CYBERINE_MEMORY_DIR"].strip())
        else:
            home = env.get("CYBERINE_HOME", "").strip()
            base = Path(home) if home else Path(env.get("HOME") or Path.home()) / ".cyberine"
            root = base / "memory"
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
            issue_window_days=_int_env(env, "CYBERINE_MEMORY_ISSUE_WINDOW_DAYS", DEFAULT_ISSUE_WINDOW_DAYS, 0),
            index_cap=_int_env(env, "CYBERINE_MEMORY_INDEX_CAP", DEFAULT_INDEX_CAP, 0),
            retune=_int_env(env, "CYBERINE_MEMORY_RETUNE", DEFAULT_RETUNE, 0, problems),
            env=env,
            problems=tuple(problems or ()),
        )
