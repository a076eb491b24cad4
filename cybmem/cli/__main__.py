"""``python -m cybmem.cli``: the console script (tuning's detached re-tune starts it this way)."""

from .app import console

console()
