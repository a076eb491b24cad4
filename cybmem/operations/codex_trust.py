"""Codex's trust in cybmem's hooks, given through Codex's own interface for it.

Codex runs a hook only once it is trusted: a hash of the hook's definition kept in its
``config.toml`` (``[hooks.state."<key>"] trusted_hash``); an untrusted or changed hook is skipped
without a word. The hash is Codex's to compute, so cybmem never computes it: it asks ``codex
app-server`` (JSON-RPC over stdio, the interface Codex's own review screen uses) for the hooks it
sees (``hooks/list``, each with its ``key``, ``currentHash`` and ``trustStatus``), saves the trust of
cybmem's ones with ``config/batchWrite`` (``hooks.state``, upserted: every other entry stays),
and lists them again to check that Codex now reads them as trusted. Anything short of that is
:class:`TrustResult` ``trusted=False`` with the one line that says how the user gives the review.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TrustResult", "trust_hooks", "list_hooks", "REVIEW_HINT", "WAIT"]

#: How long the app-server may take to answer, in all (it starts in well under a second).
WAIT = 30.0
#: How the user trusts the hooks when cybmem could not: Codex asks at its next start.
REVIEW_HINT = ("Codex runs them once you trust them: start `codex` in the project and accept its review of the "
               "new hooks (or run `cybmem hooks install codex` again with codex on PATH)")


@dataclass
class TrustResult:
    """What Codex says of cybmem's hooks: ``trusted`` when every one of them is, and why not."""

    trusted: bool
    hooks: dict[str, str] = field(default_factory=dict)  # event -> trustStatus (after)
    newly: list[str] = field(default_factory=list)  # the events whose trust cybmem saved
    message: str = ""


class _AppServer:
    """``codex app-server`` on stdio: one request at a time, each answer awaited with a deadline."""

    def __init__(self, codex: str, cwd: str) -> None:
        # Codex finds its home as cybmem does (CODEX_HOME, else ~/.codex): the environment is handed on as it is.
        self.proc = subprocess.Popen([codex, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=cwd)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.next_id = 1
        self.until = time.monotonic() + WAIT
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict) -> dict:
        rid, self.next_id = self.next_id, self.next_id + 1
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            left = self.until - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"codex app-server did not answer {method} within {WAIT:g} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise ConnectionError(f"codex app-server ended before answering {method}")
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("id") == rid:
                if "error" in message:
                    raise RuntimeError(f"codex app-server refused {method}: {message['error'].get('message', message['error'])}")
                return message.get("result") or {}

    def notify(self, method: str) -> None:
        self._send({"jsonrpc": "2.0", "method": method})

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _open(codex: str | None, cwd: Path) -> _AppServer:
    exe = codex or shutil.which("codex")
    if not exe:
        raise FileNotFoundError("codex is not on PATH")
    server = _AppServer(exe, str(cwd))
    try:
        server.call("initialize", {"clientInfo": {"name": "cybmem", "title": "cybmem hooks install", "version": "1"}})
        server.notify("initialized")
    except BaseException:
        server.close()
        raise
    return server


def _ours(server: _AppServer, cwd: Path, command: str, source: Path) -> list[dict]:
    result = server.call("hooks/list", {"cwds": [str(cwd)]})
    hooks = [h for entry in result.get("data") or [] for h in entry.get("hooks") or []]
    return [h for h in hooks if h.get("command") == command and Path(h.get("sourcePath") or "") == source]


def list_hooks(command: str, source: Path, *, cwd: Path, codex: str | None = None) -> dict[str, str]:
    """The trust status Codex gives each of cybmem's hooks (event -> ``trusted`` / ``untrusted`` /
    ``modified``), as ``hooks/list`` reports them for ``cwd``.

    Raises:
        OSError, RuntimeError, TimeoutError: codex cannot be started or does not answer.
    """
    server = _open(codex, cwd)
    try:
        return {h["eventName"]: h.get("trustStatus", "?") for h in _ours(server, cwd, command, source)}
    finally:
        server.close()


def trust_hooks(command: str, source: Path, *, cwd: Path, codex: str | None = None) -> TrustResult:
    """Have Codex trust cybmem's hooks (those whose command is ``command``, in the file ``source``),
    as seen from ``cwd``; never raises: a failure is ``trusted=False`` with its reason and the
    review hint."""
    try:
        server = _open(codex, cwd)
    except (OSError, RuntimeError, TimeoutError, ConnectionError) as exc:
        return TrustResult(False, message=f"could not ask Codex to trust them ({' '.join(str(exc).split())}); {REVIEW_HINT}")
    try:
        found = _ours(server, cwd, command, source)
        if not found and source.parent.parent == cwd:  # a project's .codex/hooks.json
            return TrustResult(False, message=f"Codex reads {source.parent} only in a project it trusts: trust {cwd} in "
                                              "Codex (start `codex` there and accept, or run `codex exec --trust` there "
                                              "once), then run `cybmem hooks install codex --project` again")
        if not found:
            return TrustResult(False, message=f"Codex does not list them (is {source} a hooks file it reads from {cwd}?); "
                                              + REVIEW_HINT)
        pending = [h for h in found if h.get("trustStatus") != "trusted"]
        if pending:
            value = {h["key"]: {"trusted_hash": h["currentHash"]} for h in pending}
            server.call("config/batchWrite", {"edits": [{"keyPath": "hooks.state", "mergeStrategy": "upsert", "value": value}]})
            found = _ours(server, cwd, command, source)
        hooks = {h["eventName"]: h.get("trustStatus", "?") for h in found}
        ok = all(s == "trusted" for s in hooks.values())
        newly = [h["eventName"] for h in pending]
        message = "" if ok else f"Codex still reads them as {', '.join(sorted(set(hooks.values()) - {'trusted'}))}; {REVIEW_HINT}"
        return TrustResult(ok, hooks, newly, message)
    except (OSError, RuntimeError, TimeoutError, ConnectionError, KeyError) as exc:
        return TrustResult(False, message=f"could not ask Codex to trust them ({' '.join(str(exc).split())}); {REVIEW_HINT}")
    finally:
        server.close()
