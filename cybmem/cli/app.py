"""The ``cybmem`` command line assembled: the app of :mod:`cybmem.cli.framework` with every group of
commands registered on it (reads, writes, the dispatch path, tuning, maintenance, export, mcp,
hooks, fleet: a module each), and the console script's entry (:func:`main`, :func:`console`). Heavy
modules are imported inside the commands that need them, so the write and inject paths never pay
for pandas or matplotlib.
"""

from __future__ import annotations

import contextlib
import sys

import typer

from . import _startup, signals
# the command modules register their commands on the app as they are imported, in the order
# `cybmem --help` lists them
from . import reads, writes, search, tuning, maintenance, exports, mcp, hooks, fleet, ranker  # noqa: F401
from .exports import export_app
from .fleet import fleet_app
from .framework import ClickException, UsageError, app, command, error_line
from .render import echo

__all__ = ["app", "command", "export_app", "fleet_app", "main", "console"]


def main() -> None:
    """Console-script entry point: runs the app and translates Click's usage errors (JSON under --json).

    Ctrl-C, wherever it lands (a command's body, a notebook kernel's event loop, a Dask client), ends
    the command with exit code 130 and one line on stderr, ``cybmem: interrupted``, with no
    traceback: every file cybmem writes goes to a temp file that is renamed into place only when
    whole, and the unwinding removes the temp file. A second Ctrl-C cuts that unwinding short; one
    more after the line ends the process at once.
    """
    _startup.one_command_process = True
    signals.catch_sigint()
    try:
        code = _main(sys.argv[1:])
    except KeyboardInterrupt:
        code = signals.INTERRUPTED_EXIT
    except BaseException:  # noqa: BLE001 - re-raised unless Ctrl-C caused it
        if not signals.interrupted():
            raise
    # typer turns a KeyboardInterrupt into exit code 130 (no command exits so otherwise); pyarrow's
    # readers take SIGINT for themselves while they run and raise it, past the handler.
    if signals.interrupted() or code == signals.INTERRUPTED_EXIT:
        signals.restore_sigint()
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            from ..progress import end_line

            end_line()  # a progress bar cut short: the message starts a line of its own
        if signals.terminated():
            echo("cybmem: terminated", err=True)
            sys.exit(signals.TERMINATED_EXIT)
        echo("cybmem: interrupted", err=True)
        sys.exit(signals.INTERRUPTED_EXIT)
    sys.exit(code)


def _main(args: list[str]) -> int:
    as_json = "--json" in args
    command_ = typer.main.get_command(_startup.named_only(app, args))
    try:
        code = command_.main(args=args, prog_name="cybmem", standalone_mode=False)
    except UsageError as exc:
        if as_json:
            error_line(exc.format_message(), exc.exit_code, True)
        else:
            exc.show()
        return exc.exit_code
    except typer.Abort:
        echo("Aborted!", err=True)
        return 1
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    return code if isinstance(code, int) else 0


def console() -> None:
    """The ``cybmem`` console script: :func:`main`, ended without the interpreter's teardown after
    a command that opted in (:func:`cybmem.cli._startup.end`)."""
    _startup.end(main)


if __name__ == "__main__":
    console()
