"""Find and redact well-known secret shapes before text is stored or shown.

Each secret is replaced with ``[REDACTED:<kind>]``. Only shapes with a distinctive prefix or an
explicit key (``password=``, ``Authorization:``, ``user:pass@``) are matched, to keep false
positives low; a bare random string is never guessed at. Kinds:

    private_key, jwt, aws_access_key_id, aws_secret_access_key, github_token, gitlab_token,
    slack_token, anthropic_key, openai_key, google_api_key, stripe_key, url_password,
    basic_auth, bearer_token, secret_assignment

Where the shape has a label (Bearer, user:…@host, password=) only the secret part is replaced.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Finding", "redact", "scan"]

_MARK = "[REDACTED:"
_NOT_MARK = r"(?!\[REDACTED:)"  # a value never starts at a marker: keeps redact idempotent
_MAX_PASSES = 8


@dataclass(frozen=True)
class Finding:
    """One secret: its kind and its [start, end) span in the scanned text."""

    kind: str
    start: int
    end: int


@dataclass(frozen=True)
class _Shape:
    """A secret shape: the regex, which group is the secret (0: all) and an optional check."""

    kind: str
    regex: re.Pattern[str]
    group: int = 0
    check: Callable[[str, re.Match[str]], bool] | None = None


def _openai_like(secret: str, _: re.Match[str]) -> bool:
    """Random keys carry a digit; a dash-separated body also mixes case (unlike a branch slug)."""
    body = secret[3:]
    return any(c.isdigit() for c in body) and (
        any(c.isupper() for c in body) or "-" not in body
    )


def _token_like(secret: str, _: re.Match[str]) -> bool:
    """An opaque token has a digit or mixed case over 20+ characters, unlike a prose word."""
    if any(c.isdigit() for c in secret):
        return True
    mixed = any(c.isupper() for c in secret) and any(c.islower() for c in secret)
    return mixed and len(secret) >= 20


_PLACEHOLDER = re.compile(r"\$[{(A-Za-z_]|<|\{\{|%\(|\*+$|x+$|X+$")
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_TYPE_NAME = re.compile(r"[A-Z][A-Za-z]*")
_LITERALS = frozenset(
    {"none", "null", "nil", "true", "false", "undefined", "required", "optional", "redacted"}
)


def _real_value(secret: str, match: re.Match[str]) -> bool:
    """Skip placeholders (${X}, <password>, ****), code references (config.password), literals
    and, after a colon, type annotations (api_key: SecretStr)."""
    if _PLACEHOLDER.match(secret) or _DOTTED_NAME.fullmatch(secret):
        return False
    if secret.lower() in _LITERALS:
        return False
    return not (":" in match.group("sep") and _TYPE_NAME.fullmatch(secret))


def _not_placeholder(secret: str, _: re.Match[str]) -> bool:
    """Skip ${VAR}, <password> and **** stand-ins."""
    return not _PLACEHOLDER.match(secret)


_KEYS = r"(?:password|passwd|passphrase|secret[_-]?key|secret|api[_-]?key|apikey|token)"
_ASSIGN = rf"(?<![A-Za-z0-9]){_KEYS}[\"']?(?P<sep>\s*[:=]\s*)"

# Order matters on ties: when two shapes find the same span the earlier, more specific one wins.
_SHAPES: tuple[_Shape, ...] = (
    _Shape(
        "private_key",
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            # The body stops at the next BEGIN/END marker (possessive, no backtracking), so
            # many unterminated BEGIN lines cost linear, not quadratic, time.
            r"(?:(?:(?!-----(?:BEGIN|END)).)*+-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            # Truncated block: take the base64 / PEM header lines that follow, not the prose.
            r"|(?:\r?\n(?:[A-Za-z0-9+/=]+|(?:Proc-Type|DEK-Info|Comment|Version):[^\r\n]*|[ \t]*)"
            r"(?=\r?\n|\Z))*)",
            re.DOTALL,
        ),
    ),
    _Shape(
        "jwt",
        re.compile(
            r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
            r"(?![A-Za-z0-9_-])"
        ),
    ),
    _Shape(
        "aws_access_key_id",
        re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ),
    _Shape(
        "aws_secret_access_key",
        re.compile(
            r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s*[:=]\s*[\"']?"
            r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
        ),
        group=1,
    ),
    _Shape(
        "github_token",
        re.compile(
            r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,255})"
            r"(?![A-Za-z0-9_])"
        ),
    ),
    _Shape(
        "gitlab_token",
        re.compile(r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}(?![A-Za-z0-9_-])"),
    ),
    _Shape(
        "slack_token",
        # Slack tokens carry numeric workspace / user ids; the lookahead wants a digit.
        re.compile(
            r"(?<![A-Za-z0-9_-])xox[abprs]-(?=[A-Za-z-]*\d)[A-Za-z0-9-]{10,}(?![A-Za-z0-9_-])"
        ),
    ),
    _Shape(
        "anthropic_key",
        re.compile(r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}(?![A-Za-z0-9_-])"),
    ),
    _Shape(
        "openai_key",
        re.compile(
            r"(?<![A-Za-z0-9_-])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}(?![A-Za-z0-9_-])"
        ),
        check=_openai_like,
    ),
    _Shape(
        "google_api_key",
        re.compile(r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])"),
    ),
    _Shape(
        "stripe_key",
        re.compile(r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}(?![A-Za-z0-9])"),
    ),
    _Shape(
        "url_password",
        re.compile(
            r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/@?#\[\]]*:"
            rf"{_NOT_MARK}([^\s/@?#]+)@"
        ),
        group=1,
        check=_not_placeholder,
    ),
    _Shape(
        "basic_auth",
        re.compile(
            r"(?i:(?<![A-Za-z0-9])authorization[\"']?\s*[:=]\s*[\"']?basic)\s+"
            r"([A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])"
        ),
        group=1,
    ),
    _Shape(
        "bearer_token",
        re.compile(
            r"(?i:(?<![A-Za-z0-9_])bearer)\s+"
            r"([A-Za-z0-9._~+/-]{15,}[A-Za-z0-9_~+/-]=*)(?![A-Za-z0-9_~+/=-])"
        ),
        group=1,
        check=_token_like,
    ),
    _Shape(
        "secret_assignment",
        re.compile(rf"(?i:{_ASSIGN})(?P<q>[\"']){_NOT_MARK}([^\s\"']{{8,}})(?P=q)"),
        group=3,
        check=_real_value,
    ),
    _Shape(
        "secret_assignment",
        # Possessive: the value is every non-delimiter character, and a value that runs into
        # "(" or "[" is code (get_token(), os.environ[...]), not a secret.
        re.compile(rf"(?i:{_ASSIGN}){_NOT_MARK}([^\s\"'`,;&()<>\[\]{{}}]{{8,}}+)(?![(\[])"),
        group=2,
        check=_real_value,
    ),
)


def scan(text: str) -> list[Finding]:
    """Find the secrets in text, one finding per secret, without overlaps.

    When spans overlap, the one that starts first wins, then the longer, then the more
    specific shape (the order of _SHAPES).

    Args:
        text: any text.

    Returns:
        The findings, sorted by start.
    """
    if not text:
        return []
    candidates: list[tuple[int, int, int, str]] = []
    for order, shape in enumerate(_SHAPES):
        for match in shape.regex.finditer(text):
            start, end = match.span(shape.group)
            secret = text[start:end]
            if not secret or (shape.check and not shape.check(secret, match)):
                continue
            candidates.append((start, -end, order, shape.kind))
    findings: list[Finding] = []
    last_end = 0
    for start, neg_end, _, kind in sorted(candidates):
        if start >= last_end:
            findings.append(Finding(kind, start, -neg_end))
            last_end = -neg_end
    return findings


def _redact_once(text: str) -> tuple[str, list[Finding]]:
    """Replace the findings of one scan."""
    findings = scan(text)
    parts: list[str] = []
    pos = 0
    for f in findings:
        parts.append(text[pos : f.start])
        parts.append(f"{_MARK}{f.kind}]")
        pos = f.end
    parts.append(text[pos:])
    return "".join(parts), findings


def redact(text: str) -> tuple[str, list[str]]:
    """Replace every secret in text with [REDACTED:<kind>].

    Scans again after each replacement round (at most a few rounds) in case removing one
    secret exposed another, so that redacting twice changes nothing.

    Args:
        text: any text.

    Returns:
        (redacted text, sorted unique kinds found).
    """
    kinds: set[str] = set()
    for _ in range(_MAX_PASSES):
        text, findings = _redact_once(text)
        if not findings:
            break
        kinds.update(f.kind for f in findings)
    return text, sorted(kinds)
