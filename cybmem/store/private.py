"""``<private>...</private>``: what a person marks in a prompt or a reply as never to be stored.

The write path removes every such span from every text a record is made of, before the secrets
pass and before anything is cut or extracted (:func:`cybmem.operations.write.build_record`), so no
part of it reaches a record, the ledger, the index or an embedding. The rule, exactly:

- the tags are matched in any case, with optional white space before the ``>`` (``<Private >``);
- a span runs from an opening tag to its matching closing tag (spans nest);
- an opening tag that is never closed hides the rest of the text (the safe side: a forgotten
  ``</private>`` must not publish the secret it was meant to keep);
- a closing tag with no opening tag before it is dropped, and the text around it kept;
- a removed span leaves one space when it sat between two words, nothing otherwise.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["strip_private", "private_value"]

_TAG = re.compile(r"<(/?)private\s*>", re.IGNORECASE)


def strip_private(text: str) -> str:
    """``text`` without its ``<private>`` spans (module docstring); unchanged when it has none."""
    if not text or "<" not in text or _TAG.search(text) is None:
        return text
    out: list[str] = []
    depth, kept_from = 0, 0
    for m in _TAG.finditer(text):
        closing = bool(m.group(1))
        if depth == 0:
            out.append(text[kept_from:m.start()])
            if closing:  # a stray closing tag: drop it, keep going
                kept_from = m.end()
                continue
        depth += -1 if closing else 1
        if depth == 0:
            kept_from = m.end()
            if out and out[-1][-1:].strip() and text[kept_from:kept_from + 1].strip():
                out.append(" ")  # "a<private>b</private>c" -> "a c"
    if depth == 0:
        out.append(text[kept_from:])
    return "".join(out)


def private_value(value: Any) -> Any:
    """:func:`strip_private` of every string inside ``value`` (a str, or lists and dicts of them; keys
    left alone), as :func:`cybmem.store.secrets.redact_value` walks it."""
    if isinstance(value, str):
        return strip_private(value)
    if isinstance(value, list):
        return [private_value(v) for v in value]
    if isinstance(value, dict):
        return {k: private_value(v) for k, v in value.items()}
    return value
