"""The console script's signal handling: Ctrl-C ends a command with exit 130 and one line, a
SIGTERM to an export likewise (exit 143), and a SIGTERM while a write waits for the distillation
model abandons that call, not the run.

The library installs no handler: a notebook, a test or a server that calls
:func:`cybmem.operations.write.write_run` keeps its own. The commands ask for these here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from ..errors import CybmemError

__all__ = ["INTERRUPTED_EXIT", "TERMINATED_EXIT", "Stopped", "catch_sigint", "catch_sigterm", "interrupted",
           "terminated", "restore_sigint", "sigterm_abandons"]

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended
TERMINATED_EXIT = 143  # 128 + SIGTERM

#: Set by :func:`_on_sigint`: the person pressed Ctrl-C (see :func:`cybmem.cli.app.main`).
_interrupted = False
#: Set by :func:`_on_sigterm_unwind`: a SIGTERM ended the command as Ctrl-C would have.
_terminated = False


def _on_sigint(signum, frame) -> None:
    """SIGINT: remember it, then raise KeyboardInterrupt as Python's own handler does (a library
    may turn it into another exception, e.g. asyncio's CancelledError: the flag still says why)."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def catch_sigint() -> None:
    """Route Ctrl-C through :func:`_on_sigint` (not when the process was started with SIGINT ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def interrupted() -> bool:
    """Whether Ctrl-C was pressed since :func:`catch_sigint`."""
    return _interrupted


def terminated() -> bool:
    """Whether a SIGTERM ended the command (after :func:`catch_sigterm`)."""
    return _terminated


def _on_sigterm_unwind(signum, frame) -> None:
    global _interrupted, _terminated
    _interrupted = _terminated = True
    raise KeyboardInterrupt


def catch_sigterm() -> None:
    """From here on a SIGTERM unwinds the command as Ctrl-C does (exit 143, ``cybmem: terminated``),
    so that what it was writing outside the store (an export's temp file, a SQLite transaction) is
    cleaned up at once instead of left for the next run. Main thread only, and not when SIGTERM
    is ignored or already handled."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm_unwind)


def restore_sigint() -> None:
    """The default SIGINT action again: one more Ctrl-C after the closing line ends the process at once."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Stopped(CybmemError):
    """SIGTERM arrived while the model was being asked."""


def _on_sigterm(signum, frame) -> None:
    raise Stopped("stopped by SIGTERM before the model answered (a hook's timeout?)")


@contextlib.contextmanager
def sigterm_abandons() -> Iterator[None]:
    """Inside the block a SIGTERM raises :class:`Stopped` instead of ending the process (main
    thread only: a handler can only be set there); the previous handler is back afterwards.

    A hook's timeout sends SIGTERM (Node's child_process does): around the distillation call
    (``write_run(..., while_distilling=sigterm_abandons)``) it costs the distilled outcome, and
    the record is written with its extractive one a moment later instead of being lost.
    """
    previous = None
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
