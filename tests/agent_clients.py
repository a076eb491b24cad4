"""The real coding-agent CLIs, Claude Code and Codex, run offline against the model stand-ins of
tests/servers.py, and the pytest fixtures that give a test one of each.

Both are the pinned npm packages tests/node/install-clients.sh puts in tests/node/clients/
(git-ignored; .ci/run runs it, and :func:`agent_bins` runs it when the folder is missing). Tests
skip, with the reason, only where node or npm is missing; anything else wrong with the install
fails them. Each client runs with the test's own HOME (tests/conftest.py), its memory root
(``CYBERINE_MEMORY_DIR``) and a model stand-in on 127.0.0.1:

- Claude Code: ``ANTHROPIC_BASE_URL`` at a :class:`servers.MessagesServer`, any API key,
  ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (no update checks, telemetry or error reports:
  the stand-in is the only host it talks to), settings in ``$HOME/.claude/settings.json``.
- Codex: ``CODEX_HOME`` with a ``config.toml`` whose custom provider (``model_providers.standin``,
  ``wire_api = "responses"``) points at a :class:`servers.ResponsesServer`, its key in
  ``STANDIN_API_KEY``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from servers import MessagesServer, ResponsesServer, messages_server, responses_server  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "tests" / "node" / "install-clients.sh"
BIN = REPO / "tests" / "node" / "clients" / "node_modules" / ".bin"
#: The pins (tests/node/install-clients.sh installs these).
CLAUDE_CODE_VERSION = "2.1.328"
CODEX_VERSION = "0.169.0"
#: A run of a client in a test: a few seconds offline; a generous bound on a loaded machine.
RUN_TIMEOUT = 120


@pytest.fixture(scope="session")
def agent_bins() -> dict[str, Path]:
    """The real ``claude`` and ``codex`` executables at their pins, installed when missing."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the hook tests drive the real Claude Code and Codex CLIs, installed by npm: "
                    f"{' and '.join(missing)} not on PATH")
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=600)
    if done.returncode:
        pytest.fail(f"{INSTALL.relative_to(REPO)} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}",
                    pytrace=False)
    return {"claude": BIN / "claude", "codex": BIN / "codex"}


def _client_env(extra: dict[str, str]) -> dict[str, str]:
    """The test's environment (its HOME, its memory root, the venv's PATH) with ``extra``, without
    the variables that would point a client at a real account or another config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_", "CODEX_", "OPENAI_"))}
    env.update(extra)
    return env


class ClaudeCode:
    """The real ``claude`` in print mode (``claude -p``) against a :class:`MessagesServer`."""

    def __init__(self, exe: Path, server: MessagesServer, home: Path) -> None:
        self.exe, self.server, self.home = exe, server, home
        self.settings_path = home / ".claude" / "settings.json"

    def env(self, **extra: str) -> dict[str, str]:
        return _client_env({"HOME": str(self.home), "ANTHROPIC_BASE_URL": self.server.url,
                            "ANTHROPIC_API_KEY": "sk-ant-test-standin", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                            **extra})

    def args(self, prompt: str, *, resume: str | None = None, tools: tuple[str, ...] = ()) -> list[str]:
        args = [str(self.exe), "-p", prompt, "--output-format", "json"]
        if resume:
            args += ["--resume", resume]
        if tools:  # the tools a turn may run without asking (-p cannot ask); Write is an edit
            args += ["--permission-mode", "acceptEdits", "--allowedTools", " ".join(tools)]
        return args

    def start(self, prompt: str, cwd: Path, *, resume: str | None = None, tools: tuple[str, ...] = (),
              **env: str) -> subprocess.Popen:
        """Start a session (a turn of ``prompt``) without waiting for it."""
        return subprocess.Popen(self.args(prompt, resume=resume, tools=tools), cwd=cwd, env=self.env(**env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, prompt: str, cwd: Path, *, resume: str | None = None, tools: tuple[str, ...] = (), **env: str) -> dict:
        """Run a session of one turn to its end; its JSON result (``session_id``, ``result``...)."""
        return self.finish(self.start(prompt, cwd, resume=resume, tools=tools, **env))

    @staticmethod
    def finish(proc: subprocess.Popen) -> dict:
        """Wait for a session started by :meth:`start`; its JSON result (fails the test on an error)."""
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
        assert proc.returncode == 0, f"claude exited {proc.returncode}: {err.strip()[-2000:]} {out[-2000:]}"
        result = json.loads(out)
        assert not result.get("is_error"), result
        return result

    def transcript(self, cwd: Path, session_id: str) -> Path:
        """Where Claude Code keeps a session's transcript (JSONL)."""
        found = list((self.home / ".claude" / "projects").glob(f"*/{session_id}.jsonl"))
        assert len(found) == 1, found
        return found[0]


class Codex:
    """The real ``codex exec`` against a :class:`ResponsesServer`, through a custom provider."""

    def __init__(self, exe: Path, server: ResponsesServer, home: Path) -> None:
        self.exe, self.server, self.home = exe, server, home
        self.codex_home = home / ".codex"
        self.codex_home.mkdir(parents=True, exist_ok=True)
        (self.codex_home / "config.toml").write_text(
            'model = "standin-model"\nmodel_provider = "standin"\n\n[model_providers.standin]\n'
            f'name = "Stand-in"\nbase_url = "{server.url}/v1"\nwire_api = "responses"\nenv_key = "STANDIN_API_KEY"\n')

    def env(self, **extra: str) -> dict[str, str]:
        return _client_env({"HOME": str(self.home), "CODEX_HOME": str(self.codex_home),
                            "STANDIN_API_KEY": "sk-test-standin", **extra})

    def run(self, prompt: str, cwd: Path, *flags: str, resume: str | None = None, **env: str) -> subprocess.CompletedProcess:
        """``codex exec [FLAGS] PROMPT`` (``codex exec resume SESSION PROMPT`` to go on with a session)."""
        args = [str(self.exe), "exec", "--skip-git-repo-check", *flags] + (["resume", resume] if resume else []) + [prompt]
        done = subprocess.run(args, cwd=cwd, env=self.env(**env), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT)
        assert done.returncode == 0, f"codex exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        return done


@pytest.fixture
def claude_code(agent_bins, messages_server, tmp_path) -> Iterator[ClaudeCode]:
    """The real Claude Code CLI, with this test's HOME, against a fresh Messages API stand-in."""
    yield ClaudeCode(agent_bins["claude"], messages_server, Path(os.environ["HOME"]))


@pytest.fixture
def codex(agent_bins, responses_server, tmp_path) -> Iterator[Codex]:
    """The real Codex CLI, with this test's HOME and CODEX_HOME, against a fresh Responses API stand-in."""
    yield Codex(agent_bins["codex"], responses_server, Path(os.environ["HOME"]))
