"""Paths and environment, read once into one object.

Every other module takes a :class:`Settings` instead of reading ``os.environ``;
tests point ``CYBERINE_MEMORY_DIR`` at a temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import ValidationError

__all__ = ["Settings", "DEFAULT_TOPK", "DEFAULT_MAX_TOKENS", "DEFAULT_INDEX_CAP"]

DEFAULT_TOPK = 3
DEFAULT_MAX_TOKENS = 1500
# index.json keeps this many entries; older ones collapse into archive-summary.md (seeds 3.5).
DEFAULT_INDEX_CAP = 500

_FALSE = {"0", "false", "no", "off"}


def _int_env(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError(f"{name}={raw!r} is not a whole number; set it to e.g. {default} or unset it") from None
    if value < minimum:
        raise ValidationError(f"{name}={value} must be at least {minimum}")
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
    ``~/.cyberine/memory``.
    """

    memory_dir: Path
    enabled: bool = True
    topk: int = DEFAULT_TOPK
    max_tokens: int = DEFAULT_MAX_TOKENS
    run_id: str | None = None
    parent_run_id: str | None = None
    chat_session_id: str | None = None
    model: str | None = None
    embeddings: str | None = None
    redact_secrets: bool = True
    index_cap: int = DEFAULT_INDEX_CAP
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, memory_dir: str | os.PathLike | None = None) -> "Settings":
        """Read settings from ``env`` (default ``os.environ``); ``memory_dir`` overrides the root."""
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
            topk=_int_env(env, "CYBERINE_MEMORY_TOPK", DEFAULT_TOPK, 0),
            max_tokens=_int_env(env, "CYBERINE_MEMORY_MAX_TOKENS", DEFAULT_MAX_TOKENS, 0),
            run_id=_none_if_empty(env.get("CYBERINE_RUN_ID")),
            parent_run_id=_none_if_empty(env.get("CYBERINE_PARENT_RUN_ID")),
            chat_session_id=_none_if_empty(env.get("CYBERINE_CHAT_SESSION_ID")),
            model=_none_if_empty(env.get("CYBERINE_MEMORY_MODEL")),
            embeddings=_none_if_empty(env.get("CYBERINE_MEMORY_EMBEDDINGS")),
            redact_secrets=_flag(env, "CYBERINE_MEMORY_REDACT", True),
            index_cap=_int_env(env, "CYBERINE_MEMORY_INDEX_CAP", DEFAULT_INDEX_CAP, 0),
            env=env,
        )

    def with_(self, **changes) -> "Settings":
        """A copy with some fields changed."""
        return replace(self, **changes)
