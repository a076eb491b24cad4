"""The fleet: many machines' exported memory read as one history, on Dask.

Every orchestrator appends its memory to one Hive-partitioned Parquet dataset
(:mod:`cybmem.exchange.parquet_dataset`); a :class:`Fleet` opens it in this process or on a Dask
cluster and runs the single-process rules over it unchanged: the issue fold
(:func:`cybmem.explore.frames.issue_fold`), search with the kernels of
:func:`cybmem.retrieval.search.search`, and the figures of :mod:`cybmem.explore.plots` fed with
counts summed over partitions. A (machine, project) is never split. This module runs the fleet
(the cluster, the partitions, the passes); what runs on each partition lives beside it:
reading the dataset (:mod:`~cybmem.exchange.fleet_dataset`), who owns a run id
(:mod:`~cybmem.exchange.fleet_claims`), the issue and lineage tables
(:mod:`~cybmem.exchange.fleet_tables`), search (:mod:`~cybmem.exchange.fleet_search`); the report's
figures and page are drawn by :mod:`cybmem.explore.fleet_report`.

Rules (in full: USAGE.md, "The fleet", "How it is computed" and "Damaged files, copies and claims"):

- What is global: BM25's statistics (summed over partitions) and the keyword maximum, so a fleet
  search ranks as one store holding every record; lineage stays inside a (machine, project); the
  merge of each partition's top k breaks ties as :func:`cybmem.retrieval.scoring.top_k` does.
- Who speaks for a run id: the (machine, project) that exported it first owns it; the others'
  copies leave search and the counts, and the hit names every claimant (:attr:`FleetHit.claimed_by`).
- A part file that is not what an export writes is skipped and named (:attr:`Fleet.skipped`).
- ``scheduler="auto"`` runs inline up to :data:`INLINE_MAX_BYTES`; :attr:`Fleet.ran_on` says where.

Nothing in the write or inject path imports this module; Dask is imported when a cluster is used.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import CybmemError
from ..retrieval.weights import Weights
from . import fleet_search
from .fleet_claims import Claim, find_claims, hidden_ids
from .fleet_dataset import Group, events_part, pack_groups, records_part, scan_dataset, select_groups
from .fleet_search import FleetHit, FleetSearchResult, Shard
from .fleet_tables import LINEAGE_COLUMNS, fold_part, issue_age_data, issue_summary_part, lineage_part

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..explore.frames import IssueAgeData

__all__ = [
    "FleetError",
    "Group",
    "scan_dataset",
    "Fleet",
    "FleetHit",
    "FleetSearchResult",
    "FleetReport",
    "Claim",
    "INLINE_MAX_BYTES",
]

#: Default Parquet bytes per partition when packing small (machine, project)s together.
PARTITION_BYTES = 64 << 20
#: ``scheduler="auto"`` runs in this process up to this much Parquet: where a LocalCluster of 2
#: workers starts to win a one-shot ``cybmem fleet search`` on a quiet 2-core machine
#: (``benchmarks/bench_fleet.py --crossover``; benchmarks/RESULTS.md, "One-shot search").
INLINE_MAX_BYTES = 100_000_000


class FleetError(CybmemError):
    """The Dask cluster cannot be reached or used."""


@dataclass
class FleetReport:
    """What :meth:`Fleet.report` wrote."""

    out: str
    files: list[str]
    machines: int
    projects: int  # distinct project names (one project exported by two machines is one)
    runs: int  # distinct run ids (a run id claimed by two machines counts once)
    issues: int
    seconds: float = 0.0
    claimed: int = 0  # run ids exported by more than one (machine, project)
    scheduler: str = ""

    def to_dict(self) -> dict:
        return {"out": self.out, "files": self.files, "machines": self.machines, "projects": self.projects,
                "runs": self.runs, "issues": self.issues, "claimed": self.claimed, "seconds": round(self.seconds, 3),
                "scheduler": self.scheduler}


def _now_ts(now: "pd.Timestamp | int | None") -> "pd.Timestamp":
    import pandas as pd

    if now is None:
        return pd.Timestamp.now(tz="UTC")
    if isinstance(now, (int, np.integer)):
        return pd.Timestamp(int(now), unit="ms", tz="UTC")
    ts = pd.Timestamp(now)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


class Fleet:
    """An exported Parquet dataset of many machines, opened on a Dask cluster.

    Use it as a context manager: it starts (or connects to) the cluster and closes what it
    started. Results are pandas objects computed on the cluster.

    Args:
        dataset: the directory ``cybmem export parquet --out`` writes.
        scheduler: ``"auto"``: in this process up to :data:`INLINE_MAX_BYTES` of Parquet, else
            a LocalCluster; ``"inline"`` uses no Dask at all (every partition function runs here,
            one after another); ``"local"`` or None starts a ``LocalCluster`` of ``workers``
            processes; else a Dask scheduler's address (``tcp://host:8786``). :attr:`ran_on`
            says which one runs.
        machines, projects: only these (default: all).
        workers, threads_per_worker, processes: the LocalCluster's shape (processes=False:
            threads in this process, quick to start, for small data and tests).
        partition_bytes: pack (machine, project)s into partitions of about this much Parquet.
        progress: draw a progress bar on stderr (default: when stderr is a terminal).
        timeout: seconds to wait for a scheduler's answer.

    Attributes:
        skipped: one line per part file left out (not Parquet, no runId / issueId, a column of
            another kind).
        ran_on: where the partition functions run, in words (``where``: as a value).
        claims: the run ids more than one (machine, project) exported, with their owners.

    Example:
        >>> with Fleet("fleet") as fleet:  # doctest: +SKIP
        ...     fleet.search("flaky login test", k=5).hits
    """

    def __init__(self, dataset: str | os.PathLike, *, scheduler: str | None = "auto",
                 machines: Sequence[str] | None = None, projects: Sequence[str] | None = None,
                 workers: int = 2, threads_per_worker: int = 1, processes: bool = True,
                 partition_bytes: int = PARTITION_BYTES, progress: bool | None = None, timeout: float = 10.0):
        self.dataset = Path(dataset)
        self.skipped: list[str] = []
        self.groups = select_groups(scan_dataset(self.dataset, skipped=self.skipped), machines, projects, self.dataset)
        self._partitions = pack_groups(self.groups, partition_bytes)
        self._claims: dict[str, Claim] | None = None
        size = sum(g.size for g in self.groups)
        if scheduler == "auto":
            small = size <= INLINE_MAX_BYTES
            scheduler = "inline" if small else None
            self.ran_on = (f"in this process (under {_mb(INLINE_MAX_BYTES)} of Parquet, a LocalCluster costs more than it saves)"
                           if small else f"on a LocalCluster of {workers} workers (over {_mb(INLINE_MAX_BYTES)} of Parquet)")
        elif scheduler in ("inline", "local", None):
            scheduler = None if scheduler == "local" else scheduler
            self.ran_on = "in this process" if scheduler == "inline" else f"on a LocalCluster of {workers} workers"
        else:
            self.ran_on = f"on the Dask scheduler at {scheduler}"
        self.scheduler = scheduler
        if progress is None:
            import sys

            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.progress = progress
        self.client = None
        self._cluster = None
        self._shards: list | None = None
        self._closed = False
        if scheduler == "inline":
            return
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise FleetError("the fleet needs Dask: pip install 'cybmem[fleet]'") from None
        if scheduler is None:
            self._cluster = LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker, processes=processes,
                                         dashboard_address=":0", silence_logs=logging.ERROR)
            self.client = Client(self._cluster, set_as_default=False)
        else:
            _probe(scheduler, timeout)
            error = None
            try:
                self.client = Client(scheduler, timeout=timeout, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                error = (f"cannot reach the Dask scheduler at {scheduler} within {timeout:g} s ({exc}); "
                         "is `dask scheduler` running there?")
            except Exception as exc:  # something answered, but not as a scheduler (garbage in the handshake)
                error = (f"{scheduler} answered, but not as a Dask scheduler ({type(exc).__name__}); "
                         "give the address `dask scheduler` prints (tcp://host:8786)")
            if error is not None:
                _collect_quietly()  # the half-started client complains as it is collected
                raise FleetError(error)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the cluster's data; close the client and the LocalCluster this fleet started."""
        if self._closed:
            return
        self._closed = True
        self._shards = None
        if self.client is not None:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def partitions(self) -> list[tuple[Group, ...]]:
        """The packed (machine, project)s, each knowing the run ids it does not own (:attr:`claims`)."""
        self.claims  # noqa: B018 - resolved once, before any reader sees a partition
        return self._partitions

    @property
    def where(self) -> str:
        """Where the partition functions run: ``"inline"``, ``"local"`` (a LocalCluster) or the scheduler's address."""
        return "inline" if self.client is None else (self.scheduler or "local")

    def __repr__(self) -> str:
        return (f"Fleet({str(self.dataset)!r}, {len(self.machines)} machines, {len(self.groups)} projects, "
                f"{len(self._partitions)} partitions, {self.where})")

    @property
    def machines(self) -> list[str]:
        return sorted({g.machine for g in self.groups})

    @property
    def inline(self) -> bool:
        return self.client is None

    def compute(self, *collections: Any) -> Any:
        """Compute Dask collections (e.g. from :meth:`records`) on this fleet's cluster; one result or a tuple.

        Example:
            >>> fleet.compute(fleet.records().groupby("machine")["runId"].count())  # doctest: +SKIP
        """
        if self.inline:
            import dask

            out = dask.compute(*collections, scheduler="sync")
        else:
            out = tuple(self.client.gather(self.client.compute(list(collections))))
        return out[0] if len(out) == 1 else out

    # -- running ---------------------------------------------------------------------------
    def _wait(self, futures: list, label: str) -> None:
        from distributed import as_completed

        from ..progress import Progress

        with self.client.as_current(), Progress(len(futures), label, enabled=self.progress) as bar:
            for _ in as_completed(futures):
                bar.update()

    def _frame(self, reader: Callable, fn: Callable | None, label: str, *args: Any) -> "pd.DataFrame":
        """Read the partitions, apply ``fn`` to each (``map_partitions``), and gather one pandas frame."""
        import pandas as pd

        if self.inline:
            frames = []
            for part in self.partitions:
                df = reader(part)
                frames.append(fn(df, *args) if fn is not None else df)
            return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        ddf = self._dask_frame(reader)
        if fn is not None:
            ddf = ddf.map_partitions(fn, *args, meta=fn(reader(()), *args))
        from distributed import futures_of

        done = self.client.persist(ddf)
        self._wait(futures_of(done), label)
        return self.client.compute(done).result().reset_index(drop=True)

    def _dask_frame(self, reader: Callable):
        import dask.dataframe as dd

        return dd.from_map(reader, self.partitions, meta=reader(()), enforce_metadata=False,
                           label=getattr(reader, "__name__", "cybmem").strip("_"))

    def _each(self, fn: Callable, parts: list, *args: Any) -> list:
        """``fn(partition, *args)`` over some partitions, here or on the cluster."""
        if self.inline:
            return [fn(p, *args) for p in parts]
        return self.client.gather([self.client.submit(fn, p, *args, pure=False) for p in parts])

    # -- who speaks for a run id -------------------------------------------------------------
    @property
    def claims(self) -> dict[str, Claim]:
        """The run ids more than one (machine, project) exported, each with its owner (module docstring).

        Found once, in two passes: the hashes of every group's run ids, then the records of the
        few ids whose hash is in more than one group. Afterwards each group's ``hidden`` holds the
        ids it does not own, which every reader of records leaves out.
        """
        if self._claims is None:
            claims = find_claims(self._each, self._partitions)
            hidden = hidden_ids(claims)
            if hidden:
                def own(g: Group) -> Group:
                    return dataclasses.replace(g, hidden=hidden.get(g.key, frozenset()))

                self.groups = [own(g) for g in self.groups]
                self._partitions = [tuple(own(g) for g in part) for part in self._partitions]
            self._claims = claims
        return self._claims

    def _map(self, fn: Callable, label: str | None, *args: Any) -> list:
        """``fn(shard, *args)`` over every shard (built and kept on the cluster on first use)."""
        shards = self._shard_handles()
        if self.inline:
            return [fn(s, *args) for s in shards]
        futures = [self.client.submit(fn, s, *args, pure=False) for s in shards]
        if label:
            self._wait(futures, label)
        return self.client.gather(futures)

    def _shard_handles(self) -> list:
        if self._shards is None:
            dataset = str(self.dataset)
            if self.inline:
                self._shards = [Shard.build(dataset, part) for part in self.partitions]
            else:
                self._shards = [self.client.submit(Shard.build, dataset, part, pure=False) for part in self.partitions]
                self._wait(self._shards, "fleet index")
        return self._shards

    # -- frames ------------------------------------------------------------------------------
    def records(self, columns: Sequence[str] | None = None):
        """The records of the fleet as a ``dask.dataframe`` (a pandas frame when inline).

        Columns: the dataset's (:data:`cybmem.exchange.export.RECORDS_SCHEMA`, or ``columns``) plus
        ``machine``, ``project`` and ``month``; one partition per packed set of (machine, project)s,
        rows oldest first within each; each run id once, in the (machine, project) that owns it.
        """
        reader = _Reader(records_part, tuple(columns) if columns else None)
        if self.inline:
            import pandas as pd

            return pd.concat([reader(p) for p in self.partitions], ignore_index=True)
        return self._dask_frame(reader)

    def events(self):
        """The ledger events of the fleet as a ``dask.dataframe`` (pandas when inline), in ledger order."""
        if self.inline:
            import pandas as pd

            return pd.concat([events_part(p) for p in self.partitions], ignore_index=True)
        return self._dask_frame(events_part)

    # -- issues ------------------------------------------------------------------------------
    def issues(self, *, now: "pd.Timestamp | int | None" = None) -> "pd.DataFrame":
        """The issue fold of every (machine, project): :func:`cybmem.explore.frames.issue_fold`, with machine and project.

        Args:
            now: the moment open issues' ages are measured to (default: now), one for the fleet.

        Returns:
            One row per issue, ordered by machine, project and first appearance in the ledger.
        """
        return self._frame(events_part, fold_part, "fleet issues", _now_ts(now))

    def open_issues(self, *, now: "pd.Timestamp | int | None" = None) -> "pd.DataFrame":
        """The fleet's open (opened or reopened) issues, oldest opened first (then machine, project,
        id), with ``ageDays``: their open age in days at ``now``."""
        fold = self.issues(now=now)
        opened = fold[fold["state"].isin(["opened", "reopened"])].sort_values(
            ["openedAt", "machine", "project", "issueId"], kind="stable")
        return opened.assign(ageDays=opened["openAge"].dt.total_seconds() / 86400)

    def issue_summary(self, *, now: "pd.Timestamp | int | None" = None) -> "pd.DataFrame":
        """Per machine and project: issues by state, reopens and the median age of the open ones (days)."""
        return self._frame(events_part, _FoldThen(issue_summary_part), "fleet issues", _now_ts(now))

    def issue_age_data(self, *, now: "pd.Timestamp | int | None" = None) -> "IssueAgeData":
        """The fleet's issue-age histograms (:class:`cybmem.explore.frames.IssueAgeData`), counted per partition.

        Equal to ``IssueAgeData.of(fleet.issues(now=now))`` without gathering the fold: three passes
        over each partition's fold, kept on the cluster (:func:`cybmem.exchange.fleet_tables.issue_age_data`).
        """
        folds = self._fold_handles(_now_ts(now))
        return issue_age_data(lambda fn, *args: self._on_folds(folds, fn, *args))

    def _fold_handles(self, now: "pd.Timestamp") -> list:
        """The fold of each partition, kept (on the cluster) for the passes over it."""
        if self.inline:
            return [fold_part(events_part(p), now) for p in self.partitions]
        from distributed import futures_of

        ddf = self._dask_frame(events_part)
        folded = self.client.persist(ddf.map_partitions(fold_part, now, meta=fold_part(events_part(()), now)))
        futures = futures_of(folded)
        self._wait(futures, "fleet issues")
        return futures

    def _on_folds(self, folds: list, fn: Callable, *args: Any) -> list:
        if self.inline:
            return [fn(f, *args) for f in folds]
        return self.client.gather([self.client.submit(fn, f, *args, pure=False) for f in folds])

    # -- lineage -----------------------------------------------------------------------------
    def lineage_summary(self) -> "pd.DataFrame":
        """Per machine and project: runs by state, lineage links by kind, chat sessions, first and last run.

        Links are :func:`cybmem.explore.frames.lineage_edges` (previous, parent, chat, superseded) within
        each (machine, project); runs are those it owns (a run id claimed by two counts once).
        """
        return self._frame(_Reader(records_part, LINEAGE_COLUMNS), lineage_part, "fleet lineage")

    # -- search ------------------------------------------------------------------------------
    def search(self, query: str, *, k: int = 10, weights: Weights | None = None, as_of: int | None = None,
               now_ms: int | None = None, parent_run_id: str | None = None,
               chat_session_id: str | None = None) -> FleetSearchResult:
        """Score every record of the fleet against ``query`` and return the top ``k``.

        The ranking equals :func:`cybmem.retrieval.search.search` over one store holding the fleet's
        records (module docstring: what is global). The first search builds each partition's
        keyword index and keeps it on the cluster; later searches reuse it.

        Args:
            query: free text.
            k: how many hits.
            weights: axis weights (default: :class:`Weights` defaults).
            as_of: only records that existed then count, and recency is measured from then.
            now_ms: the moment recency is measured from when ``as_of`` is not given.
            parent_run_id / chat_session_id: lineage of a run being dispatched.

        Returns:
            A :class:`FleetSearchResult`.
        """
        started = time.perf_counter()
        return fleet_search.search(lambda fn, *args: self._map(fn, None, *args), self.claims, query, k=k,
                                   weights=weights, as_of=as_of, now_ms=now_ms, parent_run_id=parent_run_id,
                                   chat_session_id=chat_session_id, partitions=len(self.partitions),
                                   scheduler=self.where, started=started)

    # -- report ------------------------------------------------------------------------------
    def report(self, out: str | os.PathLike, *, now: "pd.Timestamp | int | None" = None) -> FleetReport:
        """Write the fleet's figures and tables into ``out`` (created).

        Files: ``issue-ages.png`` (:func:`cybmem.explore.plots.issue_age_histograms` over the whole
        fleet), ``lineage-summary.png`` (:func:`cybmem.explore.plots.lineage_summary`, one row per machine
        and project), ``lineage-summary.csv``, ``issue-summary.csv`` and ``index.html`` showing them
        (drawn by :func:`cybmem.explore.fleet_report.write_fleet_report`).
        """
        from ..explore.fleet_report import report_dir, write_fleet_report

        started = time.perf_counter()
        now = _now_ts(now)
        out = report_dir(out)
        lineage = self.lineage_summary()
        ages = self.issue_age_data(now=now)
        summary = self.issue_summary(now=now)
        machines, projects = len(self.machines), len({g.project for g in self.groups})  # a project on two machines is one
        files = write_fleet_report(out, dataset=self.dataset, lineage=lineage, issue_summary=summary, ages=ages, now=now,
                                   machines=machines, projects=projects, claimed=len(self.claims),
                                   differ=sum(c.differ for c in self.claims.values()), skipped=self.skipped)
        return FleetReport(out=str(out), files=files, machines=machines, projects=projects, runs=int(lineage["runs"].sum()),
                           issues=int(ages.issues), seconds=time.perf_counter() - started, claimed=len(self.claims),
                           scheduler=self.where)


def _collect_quietly() -> None:
    import gc
    import sys

    hook = sys.unraisablehook
    sys.unraisablehook = lambda _unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _probe(address: str, timeout: float) -> None:
    """Fail fast, naming the address, when nothing listens there (Dask would retry until the timeout)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(address if "://" in address else f"tcp://{address}")
    if url.scheme not in ("tcp", "tls") or not url.hostname:
        return  # inproc://, ucx://...: leave it to Dask
    try:
        with socket.create_connection((url.hostname, url.port or 8786), timeout=timeout):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
        raise FleetError(f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({why}); "
                         "is `dask scheduler` running there?") from None


class _Reader:
    """A partition reader with fixed columns (a picklable partial with a name for Dask's task keys)."""

    def __init__(self, fn: Callable, columns: tuple[str, ...] | None):
        self.fn, self.columns = fn, columns
        self.__name__ = fn.__name__

    def __call__(self, groups: tuple[Group, ...]) -> "pd.DataFrame":
        return self.fn(groups, self.columns)


class _FoldThen:
    """Fold a partition's events, then apply ``fn`` to the fold."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__name__ = fn.__name__

    def __call__(self, events: "pd.DataFrame", now: "pd.Timestamp") -> "pd.DataFrame":
        return self.fn(fold_part(events, now))


def _mb(size: int) -> str:
    return f"{size / 1e6:,.0f} MB"
