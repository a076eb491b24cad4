#!/usr/bin/env bash
# The real coding-agent CLIs the hook tests drive (tests/agent_clients.py), pinned, installed by npm
# into tests/node/clients/ (git-ignored). Run by .ci/run before the test suite, and by the tests
# themselves when the folder is missing; a second run with both at their pins does nothing.
set -euo pipefail
cd "$(dirname "$0")"
CLAUDE_CODE="@anthropic-ai/claude-code@2.1.328"
CODEX="@openai/codex@0.169.0"
dest=clients
have() { [ -x "$dest/node_modules/.bin/$1" ] && "$dest/node_modules/.bin/$1" --version 2>/dev/null | grep -q "$2"; }
# One install at a time: both test workers may ask at once (their session fixtures), and a run of
# a client while npm rewrites it fails with "Exec format error".
mkdir -p "$dest"
exec 9>"$dest/.install.lock"
if command -v flock >/dev/null; then flock 9; fi
if have claude "${CLAUDE_CODE##*@}" && have codex "${CODEX##*@}"; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm is not installed: install Node.js and npm, then run $0 again" >&2; exit 1; }
mkdir -p "$dest"
[ -f "$dest/package.json" ] || echo '{"private": true}' > "$dest/package.json"
# Claude Code's postinstall puts its native binary in place of a stub (bin/claude.exe).
npm install --prefix "$dest" --save-exact --no-audit --no-fund --loglevel=error "$CLAUDE_CODE" "$CODEX"
have claude "${CLAUDE_CODE##*@}" || { echo "claude did not install: $dest/node_modules/.bin/claude --version fails" >&2; exit 1; }
have codex "${CODEX##*@}" || { echo "codex did not install: $dest/node_modules/.bin/codex --version fails" >&2; exit 1; }
