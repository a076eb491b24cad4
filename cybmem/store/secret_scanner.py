"""A maintained secret scanner, opt-in, whose rules join every redaction pass of the process
(``CYBERINE_MEMORY_SECRET_SCANNER``, as :class:`~cybmem.settings.Settings` reads it, handed to
:func:`use_scanner` by :class:`cybmem.memory.Memory`); its findings are candidates beside the
core table's and :mod:`cybmem.store.secret_shapes`' (:func:`cybmem.store.secrets.scan`).
"""

from __future__ import annotations

from .secret_shapes import Candidate, not_filler

__all__ = ["SCANNER_ENV", "scanner_candidates", "use_scanner"]


#: Names a maintained secret scanner to run inside the one pass as well (``kingfisher``: the
#: kingfisher-secret-scanner package, ``pip install 'cybmem[secrets]'``). Off by default: its
#: rules are slow to compile in every fresh interpreter, and every ``cybmem write`` is one
#: (benchmarks/bench_secrets.py prints the figures).
SCANNER_ENV = "CYBERINE_MEMORY_SECRET_SCANNER"
_SCANNERS: dict[str, object] = {}


def _scanner(name: str):
    from ..errors import ValidationError

    if name != "kingfisher":
        raise ValidationError(f"{SCANNER_ENV}={name}: unknown secret scanner; the one known is kingfisher "
                              "(or leave it unset)")
    if name not in _SCANNERS:
        try:
            from kingfisher_sdk import Scanner
        except ImportError:
            raise ValidationError(f"{SCANNER_ENV}=kingfisher needs the kingfisher-secret-scanner package: "
                                  "pip install 'cybmem[secrets]' (or unset it)") from None
        # base64=False: a finding inside decoded base64 would have no span in the text to replace
        _SCANNERS[name] = Scanner(base64=False)
    return _SCANNERS[name]


#: The scanner whose rules join every pass of this process (``settings.secret_scanner``, which
#: :class:`cybmem.memory.Memory` hands to :func:`use_scanner`); None: none.
_SCANNER_NAME: str | None = None


def use_scanner(name: str | None) -> str | None:
    """Add the rules of the scanner ``name`` (what SCANNER_ENV names, as the settings read it) to
    every redaction pass of this process (None: none); returns the one used until now."""
    global _SCANNER_NAME
    before, _SCANNER_NAME = _SCANNER_NAME, name
    return before


def scanner_candidates(text: str) -> list[Candidate]:
    """The findings of the scanner :func:`use_scanner` named, as candidates (kind: the rule's last
    id part, e.g. ``github_pat``); [] when none is. A stand-in it reports (xxxx…) is left out."""
    name = _SCANNER_NAME
    if not name:
        return []
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for finding in _scanner(name).scan(data):
        if not finding.visible or finding.is_base64_encoded:
            continue
        where = finding.location
        start, end = where["start_offset"], where["end_offset"]
        if len(data) != len(text):  # byte offsets of a non-ASCII text: count the characters before
            start = len(data[:start].decode("utf-8", "surrogatepass"))
            end = start + len(data[where["start_offset"]:end].decode("utf-8", "surrogatepass"))
        if end > start and not_filler(text[start:end]):
            out.append((start, end, finding.rule_id.rsplit(".", 1)[-1].replace("-", "_").lower()))
    return out
