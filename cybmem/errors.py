"""The one tree of errors cybmem raises (the CLI translates them in one place), and the one
prefix of the warnings it prints."""

from __future__ import annotations

__all__ = [
    "CybmemError",
    "ValidationError",
    "NotFoundError",
    "AmbiguousError",
    "ConflictError",
    "StoreError",
    "WARNING_PREFIX",
]

#: What starts every warning line cybmem prints on stderr (a problem that did not stop the command).
WARNING_PREFIX = "warning: "


class CybmemError(Exception):
    """Base class of every error cybmem raises on purpose."""


class ValidationError(CybmemError, ValueError):
    """Input (a record, a run.json, an id, a setting) is malformed."""


class NotFoundError(CybmemError, LookupError):
    """A record, project or file that was asked for does not exist."""


class AmbiguousError(NotFoundError):
    """A run id prefix matches more than one record."""


class ConflictError(CybmemError):
    """A write would overwrite something that is append-only."""


class StoreError(CybmemError, OSError):
    """The store on disk cannot be read or written as asked."""
