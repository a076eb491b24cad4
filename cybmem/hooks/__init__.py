"""The agent hooks' front (``cybmem hook``): Claude Code's and Codex's lifecycle hooks; imports nothing."""
