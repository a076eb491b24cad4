"""Record every file a test process opens outside what a clone of the repository has.

The test session (tests/session/cybmem_test_session.py) installs :func:`install` in its own
process and puts this directory first on ``PYTHONPATH``, so every Python process a test starts
(the ``cybmem`` console script, ``python -m ...``, notebook kernels, Dask workers) imports this
file as its ``sitecustomize`` and records the same way into a log file the session reads after
each test. The rule travels in ``CYBMEM_READS_AUDIT`` (JSON: the allowed, trusted and denied
roots, see :class:`Rule`, and the log); without it this file does nothing but hand over to any other
``sitecustomize`` on the path.

What is checked: Python-level opens (``open``, ``io.open``, ``os.open``, so also ``tarfile``,
``shutil`` and ``json.load`` on a path), directory listings (``os.listdir``, ``os.scandir``,
so also ``glob`` and ``shutil.copytree``) and ``sqlite3.connect``, through the interpreter's
audit hooks (PEP 578). Not seen: files opened by C code directly (pyarrow's memory maps, DuckDB),
by non-Python children (Node), or by children started with an environment that drops
``CYBMEM_READS_AUDIT`` or ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import sys

ENV = "CYBMEM_READS_AUDIT"
EVENTS = frozenset({"open", "os.listdir", "os.scandir", "sqlite3.connect"})


class Rule:
    """Which absolute paths a test may open.

    ``allow``: where a test's data lives (the repository, the temporary directory); a path there
    is judged by where its symbolic links lead. ``trusted``: the interpreter and the operating
    system, taken as they are (most opens are imports; resolving each would cost). ``deny``:
    places inside those that a clone does not have.
    """

    def __init__(self, allow, deny, trusted=()):
        def roots(paths):
            return tuple(sorted({os.path.normpath(q) for p in paths for q in (p, os.path.realpath(p))}))

        self.allow, self.deny, self.trusted = roots(allow), roots(deny), roots(trusted)

    @staticmethod
    def _under(path, roots):
        for root in roots:
            if path == root or path.startswith(root) and path[len(root)] == os.sep:
                return True
        return False

    def outside(self, path):
        """True when ``path`` (absolute, normalised) is not something a clone and its machine have."""
        if self._under(path, self.deny):
            return True
        if self._under(path, self.trusted):
            return False
        real = os.path.realpath(path)
        return self._under(real, self.deny) or not (self._under(real, self.allow) or self._under(real, self.trusted))


def path_of(event, args):
    """The absolute path an audited event names, or None (a file descriptor, an in-memory db)."""
    if not args:
        return None
    target = args[0]
    if event == "os.scandir" and target is None:  # os.scandir() lists the current directory
        target = "."
    if isinstance(target, int) or target is None:
        return None
    try:
        target = os.fsdecode(os.fspath(target))
    except TypeError:
        return None
    if event == "sqlite3.connect" and (target == ":memory:" or target.startswith("file:")):
        return None
    return os.path.normpath(os.path.join(os.getcwd(), target))


_state = {"busy": False, "rule": None, "record": None}


def _hook(event, args):
    if event not in EVENTS or _state["busy"] or _state["rule"] is None:
        return
    _state["busy"] = True  # record() and realpath() may open files themselves
    try:
        path = path_of(event, args)
        if path is not None and _state["rule"].outside(path):
            _state["record"](event, path)
    except Exception:  # noqa: BLE001 - an audit hook must never break the process it watches
        pass
    finally:
        _state["busy"] = False


def install(rule, record):
    """Call ``record(event, path)`` for every audited event naming a path outside ``rule``.

    A process has at most one hook (audit hooks cannot be removed): installing again, as a test
    session started by another one does (an xdist worker), replaces the rule and the recorder.
    """
    first = _state["rule"] is None
    _state["rule"], _state["record"] = rule, record
    if first:
        sys.addaudithook(_hook)


def _child():
    """In a process a test started: append one line per outside open to the session's log."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    config = json.loads(raw)
    log = config["log"]
    who = " ".join(getattr(sys, "orig_argv", None) or sys.argv or [sys.executable])

    def record(event, path):
        line = json.dumps({"event": event, "path": path, "pid": os.getpid(), "argv": who}) + "\n"
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "replace"))  # one write per line: whole lines from every process
        finally:
            os.close(fd)

    install(Rule(config["allow"], config["deny"], config["trusted"]), record)


def _chain():
    """Hand over to the sitecustomize this file shadows, if the environment has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved, mod = list(sys.path), sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mod is not None:
            sys.modules["sitecustomize"] = mod


if __name__ == "sitecustomize":
    _child()
    _chain()
