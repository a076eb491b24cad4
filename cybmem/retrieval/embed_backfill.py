"""The backfill behind ``cybmem embed``: embed the records that have no vector for the configured model."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..store.arrow_records import keyword_texts
from ..store.embeddings import embedding_text
from ..errors import ValidationError
from ..progress import Progress
from ..settings import Settings
from ..store.issue_tables import issue_texts
from ..store.loading import load_snapshot
from ..store.snapshot import Snapshot
from ..store.memory_store import MemoryStore
from .vector_cache import load_index
from .vectors import VectorIndex, embed_config_of

__all__ = ["EmbedResult", "embed_missing"]


# --- the backfill ---------------------------------------------------------------------------------


@dataclass
class EmbedResult:
    """What :func:`embed_missing` did."""

    project: str
    model: str
    records: int  # records in the project
    had: int  # records that already had a vector
    embedded: int
    empty: int  # records with no text to embed
    seconds: float
    dims: int | None
    warnings: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Records embedded per second."""
        return self.embedded / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"project": self.project, "model": self.model, "records": self.records, "had": self.had,
                "embedded": self.embedded, "empty": self.empty, "dims": self.dims, "seconds": round(self.seconds, 3),
                "recordsPerSecond": round(self.rate, 1), "warnings": list(self.warnings)}


def _work(snap: Snapshot, index: VectorIndex | None) -> tuple[list[tuple[str, str]], int, int]:
    """(runId, text) of the records without a vector in ``index``, how many of those have no text, how many have one."""
    has = index.has if index is not None else np.zeros(snap.n, bool)
    missing = np.flatnonzero(~has)
    sub = snap.records.take(pa.array(missing, pa.int64())) if len(missing) else snap.records.slice(0, 0)
    ids = sub.column("runId").to_pylist()
    titles = issue_texts(snap.events, sorted({i for lst in sub.column("issues").to_pylist() for i in lst or ()})) if sub.num_rows else {}
    texts = [embedding_text(t) for t in keyword_texts(sub, titles)] if sub.num_rows else []
    work = [(rid, t) for rid, t in zip(ids, texts) if t is not None]
    return work, len(ids) - len(work), int(has.sum())


def _probe_text(snap: Snapshot) -> str | None:
    """The newest record's embedding text (what a probe of the server's current dimension embeds)."""
    for row in range(snap.n - 1, -1, -1):
        one = snap.records.slice(row, 1)
        text = embedding_text(keyword_texts(one, issue_texts(snap.events, list(one.column("issues")[0].as_py() or ())))[0])
        if text is not None:
            return text
    return None


def embed_missing(store: MemoryStore, settings: Settings, *, progress: bool | None = None, batch_size: int | None = None,
                  embedder=None) -> EmbedResult:
    """Embed every record of a project that has no vector for the configured model (``cybmem embed``).

    Texts are the keyword index's (task, summary, titles of the raised issues), cut to
    EMBED_TEXT_CHARS; batches go to the server in one request each and are appended to
    embeddings.jsonl as they come back (at most one line per record and model, checked under the
    project lock against other writers), so an interrupted backfill keeps what it did.

    Vectors are keyed by model and dimension: when the project has vectors of the model, one
    text goes to the server first, and if its answer has another dimension than the stored ones
    (the model changed under the same name) every record is embedded again for the new key.

    Raises:
        ValidationError: embeddings are not configured.
        RemoteError: the server failed after its retries (what was embedded before stays).
    """
    config, problem = embed_config_of(settings)
    if config is None:
        raise ValidationError(problem or "embeddings are off: set CYBERINE_MEMORY_EMBEDDINGS to `ollama` or an "
                                         "OpenAI-compatible base URL (and CYBERINE_MEMORY_EMBED_MODEL)")
    from ..clients.embeddings import Embedder
    from ..clients.http_json import RemoteError

    t0 = time.perf_counter()
    snap = load_snapshot(store)
    warnings = [p.message for p in snap.problems]
    index = load_index(snap, config.model)
    work, empty, had = _work(snap, index)
    own = embedder is None
    embedder = embedder or Embedder(config)
    size = batch_size or config.batch_size
    done = 0
    dims = index.dims if index is not None else None
    ready: dict[str, np.ndarray] = {}  # texts already embedded (the first batch, or the probe)
    since: int | None = None  # the offset up to which no line of the key is unknown (append_embeddings)
    bar = None
    try:
        # The first batch goes out first (when every record has a vector of the stored key, the
        # newest record's text does): its answer says which key is current.
        first = [t for _, t in work[:size]] or ([text] if index is not None and (text := _probe_text(snap)) else [])
        if first:
            try:
                ready = dict(zip(first, embedder.embed(first)))
            except RemoteError as exc:
                raise RemoteError(f"embedded 0 of {len(work)} records, then: {exc}; run `cybmem embed` again") from None
            got = len(next(iter(ready.values())))
            if index is not None and got != index.dims:
                warnings.append(f"{config.model} now answers with {got} dimensions, the stored vectors have {index.dims}: "
                                "every record is embedded again (`cybmem doctor --repair` then drops the old ones)")
                index = load_index(snap, config.model, dims=got)
                work, empty, had = _work(snap, index)
                dims = got
                if index is None:  # no line of the new key anywhere: none can predate the file's end
                    since = store.embeddings_path.stat().st_size
        if since is None:
            since = index.consumed if index is not None else 0
        bar = Progress(len(work), f"embedding {store.slug}", enabled=progress)
        for i in range(0, len(work), size):
            chunk = work[i:i + size]
            try:
                asked = [t for _, t in chunk if t not in ready]
                fresh = dict(zip(asked, embedder.embed(asked))) if asked else {}
            except RemoteError as exc:
                raise RemoteError(f"embedded {done} of {len(work)} records, then: {exc}; run `cybmem embed` again to "
                                  "continue (what was embedded is kept)") from None
            vecs = [ready[t] if t in ready else fresh[t] for _, t in chunk]
            dims = len(vecs[0])
            wrote, since = store.append_embeddings([(rid, config.model, v) for (rid, _), v in zip(chunk, vecs)], since=since)
            done += wrote
            bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
        if own:
            embedder.close()
    return EmbedResult(store.slug, config.model, snap.n, had, done, empty, time.perf_counter() - t0, dims, warnings)
