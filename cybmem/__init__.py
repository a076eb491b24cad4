"""cybmem: long-term memory for a coding-agent orchestrator.

Episodic run records and an issue ledger on disk (../shared/spec/store-format.md),
lineage that traces every run, multi-axis retrieval and the MEMORY preamble.

Attributes are imported lazily (PEP 562) so that ``import cybmem`` and the
write path stay cheap; ``from cybmem import search`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "AmbiguousError": "errors",
    "ConflictError": "errors",
    "CybmemError": "errors",
    "IssueEvent": "schema",
    "Lineage": "schema",
    "MemoryRecord": "schema",
    "MemoryStore": "store",
    "NotFoundError": "errors",
    "Outcome": "schema",
    "Settings": "settings",
    "Snapshot": "frames",
    "StoreError": "errors",
    "ValidationError": "errors",
    "Weights": "scoring",
    "Worker": "schema",
    "chain": "lineage",
    "inject": "preamble",
    "inject_task": "search",
    "issue_events_frame": "frames",
    "issue_fold": "frames",
    "lineage_edges": "frames",
    "list_projects": "projects",
    "load_snapshot": "frames",
    "memory_block": "search",
    "records_frame": "frames",
    "resolve_slug": "projects",
    "search": "search",
    "strip": "preamble",
    "supersession_chain": "lineage",
    "tokenize": "scoring",
    "write_run": "runs",
}

__all__ = [
    "AmbiguousError",
    "ConflictError",
    "CybmemError",
    "IssueEvent",
    "Lineage",
    "MemoryRecord",
    "MemoryStore",
    "NotFoundError",
    "Outcome",
    "Settings",
    "Snapshot",
    "StoreError",
    "ValidationError",
    "Weights",
    "Worker",
    "chain",
    "inject",
    "inject_task",
    "issue_events_frame",
    "issue_fold",
    "lineage_edges",
    "list_projects",
    "load_snapshot",
    "memory_block",
    "records_frame",
    "resolve_slug",
    "search",
    "strip",
    "supersession_chain",
    "tokenize",
    "write_run",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cybmem' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
