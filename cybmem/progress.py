"""A one-line progress bar on stderr for long jobs (tuning, reports, exports, backfills), and a
one-line notice for jobs that are usually quick (a cold load, a first index)."""

from __future__ import annotations

import sys
import time
from typing import IO

__all__ = ["Progress", "Notice", "end_line"]


#: The streams a bar was drawn on and not finished (a Ctrl-C between two redraws leaves one open).
_OPEN: set[int] = set()


def end_line(stream: IO[str] | None = None) -> None:
    """Finish a bar's line left open on ``stream`` (default stderr), so what follows starts a line."""
    stream = stream if stream is not None else sys.stderr
    if id(stream) in _OPEN:
        _OPEN.discard(id(stream))
        stream.write("\n")
        stream.flush()


class Notice:
    """``message`` as one line on stderr when a job outlasts ``after_s`` seconds (a dispatcher's
    terminal would otherwise sit silent for seconds on a large store): a timer that :meth:`done`,
    called at the end of the job, cancels."""

    def __init__(self, message: str, after_s: float = 1.0):
        import threading

        self._timer = threading.Timer(after_s, lambda: print(message, file=sys.stderr, flush=True))
        self._timer.daemon = True
        self._timer.start()

    def done(self) -> None:
        self._timer.cancel()


class Progress:
    """A one-line progress bar on stderr (``label [#####-----] 12/40 3.1s``), no dependency.

    Drawn only when ``enabled`` (default: the stream is a TTY); redraws at most every 0.1 s.
    """

    def __init__(self, total: int, label: str, *, enabled: bool | None = None, stream: IO[str] | None = None,
                 width: int = 28):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.width = width
        self.done = 0
        self._start = time.perf_counter()
        self._drawn = 0.0

    def update(self, n: int = 1, *, note: str = "") -> None:
        """Advance by ``n`` steps and redraw (throttled)."""
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        now = time.perf_counter()
        if self.enabled and (now - self._drawn >= 0.1 or self.done >= self.total):
            self._draw(note)
            self._drawn = now

    def _draw(self, note: str = "") -> None:
        frac = self.done / self.total if self.total else 1.0
        fill = int(round(frac * self.width))
        bar = "#" * fill + "-" * (self.width - fill)
        text = f"\r{self.label} [{bar}] {self.done}/{self.total} {time.perf_counter() - self._start:.1f}s"
        self.stream.write(text + (f" {note}" if note else "") + "\x1b[K")
        self.stream.flush()
        _OPEN.add(id(self.stream))

    def close(self) -> None:
        """Finish the line."""
        if self.enabled:
            self._draw()
            end_line(self.stream)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
