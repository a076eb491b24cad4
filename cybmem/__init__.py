"""cybmem: long-term memory for a coding-agent orchestrator.

Episodic run records and an issue ledger on disk (../shared/spec/store-format.md),
lineage that traces every run, multi-axis retrieval and the MEMORY preamble.

The public API is the names in ``__all__`` (pinned by tests/test_api.py); USAGE.md, "Python
API", shows them in use. Attributes are imported lazily (PEP 562) so that ``import cybmem`` and
the write path stay cheap; ``from cybmem import search`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name is imported on first use
    from .checks import doctor
    from .dispatch import inject_task, memory_block
    from .errors import AmbiguousError, ConflictError, CybmemError, NotFoundError, StoreError, ValidationError
    from .frames import issue_events_frame, issue_fold, lineage_edges, records_frame
    from .issues import IssueState
    from .judgments import Judgment, load_judgments
    from .lineage import chain, show_record
    from .preamble import strip
    from .projects import list_projects
    from .retrieval import search
    from .runs import write_run
    from .schema import IssueEvent, Lineage, MemoryRecord, Outcome, Worker
    from .settings import Settings
    from .snapshot import Snapshot, load_snapshot
    from .store import MemoryStore
    from .tuning import tune
    from .weights import Weights, weights_for

__version__ = "0.1.0"

_LAZY = {
    # errors
    "CybmemError": "errors",
    "ValidationError": "errors",
    "NotFoundError": "errors",
    "AmbiguousError": "errors",
    "ConflictError": "errors",
    "StoreError": "errors",
    # the store and its records
    "Settings": "settings",
    "MemoryStore": "store",
    "MemoryRecord": "schema",
    "Lineage": "schema",
    "Outcome": "schema",
    "Worker": "schema",
    "IssueEvent": "schema",
    "IssueState": "issues",
    "list_projects": "projects",
    # writing
    "write_run": "runs",
    # reading and lineage
    "chain": "lineage",
    "show_record": "lineage",
    "load_snapshot": "snapshot",
    "Snapshot": "snapshot",
    "records_frame": "frames",
    "issue_events_frame": "frames",
    "issue_fold": "frames",
    "lineage_edges": "frames",
    # retrieval and dispatch
    "Weights": "weights",
    "weights_for": "weights",
    "search": "retrieval",
    "inject_task": "dispatch",
    "memory_block": "dispatch",
    "strip": "preamble",
    # tuning and checks
    "Judgment": "judgments",
    "load_judgments": "judgments",
    "tune": "tuning",
    "doctor": "checks",
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
