"""cybmem: long-term memory for a coding-agent orchestrator.

Episodic run records and an issue ledger on disk (docs/store-format.md in the repository),
lineage that traces every run, multi-axis retrieval and the MEMORY preamble.

The public API is the names in ``__all__`` (pinned by tests/test_api.py); USAGE.md, "Python
API", shows them in use. Attributes are imported lazily (PEP 562) so that ``import cybmem`` and
the write path stay cheap; ``from cybmem import search`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name is imported on first use
    from .memory import Memory
    from .operations.doctor import doctor
    from .dispatch.inject import inject_task, memory_block
    from .errors import AmbiguousError, ConflictError, CybmemError, NotFoundError, StoreError, ValidationError
    from .explore.frames import issue_events_frame, issue_fold, lineage_edges, records_frame
    from .store.ledger import IssueState
    from .retrieval.judgments import Judgment, load_judgments
    from .explore.lineage import chain, show_record
    from .dispatch.preamble import strip
    from .store.projects import list_projects
    from .retrieval.search import search
    from .operations.write import write_run
    from .store.records import IssueEvent, Lineage, MemoryRecord, Outcome, Worker
    from .settings import Settings
    from .store.loading import load_snapshot
    from .store.snapshot import Snapshot
    from .store.memory_store import MemoryStore
    from .retrieval.tuning import tune
    from .retrieval.weights import Weights, weights_for

__version__ = "0.1.0"

_LAZY = {
    # the handle: a memory root and its settings, every operation of the fronts as one method
    "Memory": "memory",
    # errors
    "CybmemError": "errors",
    "ValidationError": "errors",
    "NotFoundError": "errors",
    "AmbiguousError": "errors",
    "ConflictError": "errors",
    "StoreError": "errors",
    # the store and its records
    "Settings": "settings",
    "MemoryStore": "store.memory_store",
    "MemoryRecord": "store.records",
    "Lineage": "store.records",
    "Outcome": "store.records",
    "Worker": "store.records",
    "IssueEvent": "store.records",
    "IssueState": "store.ledger",
    "list_projects": "store.projects",
    # writing
    "write_run": "operations.write",
    # reading and lineage
    "chain": "explore.lineage",
    "show_record": "explore.lineage",
    "load_snapshot": "store.loading",
    "Snapshot": "store.snapshot",
    "records_frame": "explore.frames",
    "issue_events_frame": "explore.frames",
    "issue_fold": "explore.frames",
    "lineage_edges": "explore.frames",
    # retrieval and dispatch
    "Weights": "retrieval.weights",
    "weights_for": "retrieval.weights",
    "search": "retrieval.search",
    "inject_task": "dispatch.inject",
    "memory_block": "dispatch.inject",
    "strip": "dispatch.preamble",
    # tuning and checks
    "Judgment": "retrieval.judgments",
    "load_judgments": "retrieval.judgments",
    "tune": "retrieval.tuning",
    "doctor": "operations.doctor",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cybmem' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
