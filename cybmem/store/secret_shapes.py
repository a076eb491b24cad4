"""Secret shapes beyond the core table (:mod:`cybmem.store.secret_core`), found by :func:`find`.

cybmem.store.secrets.scan runs both tables over the text as written, then over the text decoded
(:mod:`cybmem.store.secret_decoders`). Here: vendor tokens with a distinctive prefix or structure
(each checked not to be a stand-in such as ``glpat-XXXX…``), passwords given on a command line or
in a config file, the families issue 29 found slipping through (passwords stated in prose,
Oracle/JDBC ``user/password@host``, session cookies, base64 key material, tokens cut across
lines), and a high-entropy rule for a bare 32-128 character base64 token that leaves
alone what only looks random (hex, UUIDs, versions, identifiers, paths, URLs, labelled digests).
The full list: USAGE.md, "Guarantees". Each rule's precision is measured by
benchmarks/bench_secrets.py: recall on other projects' examples (data-fixtures/secret-examples.jsonl)
and on the families' own (tests/data/secret-families.jsonl), and false alarms on every commit
message of four real histories.
"""

from __future__ import annotations

import binascii
import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Candidate", "Rule", "bounded", "find", "not_filler"]

Candidate = tuple[int, int, str]  # [start, end) in the text, kind
_NOT_MARK = r"(?!\[REDACTED:)"


@dataclass(frozen=True)
class Rule:
    """One shape: the regex, the group that is the secret, an optional check of the secret, and
    needles (the regex runs only when one occurs in the text)."""

    kind: str
    regex: _Lazy
    needles: tuple[str, ...]
    group: int = 0
    check: Callable[[str, re.Match[str]], bool] | None = None


class _Lazy:
    """A regex compiled on first use: most rules never meet their needle in a process, and the
    write path (a fresh interpreter per run) should not pay for compiling them."""

    __slots__ = ("pattern", "_compiled")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled: re.Pattern[str] | None = None

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern)
        return self._compiled.finditer(text)


_lazy = _Lazy


def _bounded_source(head: str, tail: str, edge: str, before: str | None) -> str:
    return rf"{head}(?<![{before or edge}]{head}){tail}(?![{edge}])"


def bounded(head: str, tail: str, edge: str = "A-Za-z0-9_-", before: str | None = None) -> re.Pattern[str]:
    """head + tail, not inside a longer run of edge characters (before the head: of before
    characters, by default the same).

    The regex starts with the fixed-width head and checks the edge behind it afterwards:
    Python's re searches a pattern that starts with a literal far faster than one that starts
    with a lookbehind (benchmarks/RESULTS.md, "Figures the module docstrings quoted").
    """
    return re.compile(_bounded_source(head, tail, edge, before))


# -- checks ------------------------------------------------------------------------------------

_REPEAT = re.compile(r"(.)\1{5}|(?i:xxxx|0123456789|abcdef0123|1234567890)|(...)\2{3}")


def not_filler(secret: str, _: re.Match[str] | None = None) -> bool:
    """Not a stand-in: no run of 6 equal characters (``glpat-XXXX…``, ``000000``), no counting
    run, and at least 6 distinct characters."""
    return not _REPEAT.search(secret) and len(set(secret)) >= 6


def _random(secret: str, m: re.Match[str] | None = None) -> bool:
    """A generated token: not filler, and a digit or mixed case."""
    if not not_filler(secret):
        return False
    return any(c.isdigit() for c in secret) or (
        any(c.isupper() for c in secret) and any(c.islower() for c in secret))


def _mixed(secret: str, m: re.Match[str] | None = None) -> bool:
    """Upper case, lower case and a digit, and not filler (a bare body with a weak prefix)."""
    return (not_filler(secret) and any(c.isupper() for c in secret) and any(c.islower() for c in secret)
            and any(c.isdigit() for c in secret))


# -- vendor tokens ------------------------------------------------------------------------------

_V: list[Rule] = []


def _vendor(kind: str, head: str, tail: str, *, needles: tuple[str, ...] = (), check=_random,
            edge: str = "A-Za-z0-9_-") -> None:
    """A token that starts with head; check sees the part after head when head is a literal."""
    literal = re.sub(r"\\(.)", r"\1", head)
    n = len(literal) if re.escape(literal).replace("\\", "") == head.replace("\\", "") else 0
    # Before the head only a word character continues a token: whsec_… may follow "=" or "/".
    _V.append(Rule(kind, _lazy(_bounded_source(head, tail, edge, "A-Za-z0-9_")), needles or (literal,),
                   check=lambda s, m: check(s[n:], m)))


_vendor("dockerhub_token", "dckr_pat_", r"[A-Za-z0-9_-]{20,}+")
_vendor("dockerhub_token", "dckr_oat_", r"[A-Za-z0-9_-]{20,}+")
_vendor("stripe_key", "whsec_", r"[A-Za-z0-9+/=]{24,}+", edge="A-Za-z0-9+/=_-")
_vendor("google_oauth_secret", "GOCSPX-", r"[A-Za-z0-9_-]{24,32}")
_vendor("google_oauth_token", r"ya29\.", r"[A-Za-z0-9_-]{20,}+", edge="A-Za-z0-9_.-")
_vendor("google_oauth_token", "1//0", r"[A-Za-z0-9_-]{30,}+", edge="A-Za-z0-9_/-")
_vendor("openrouter_key", "sk-or-", r"(?:v\d+-)?[a-f0-9]{64}", check=not_filler)
_vendor("xai_key", "xai-", r"[A-Za-z0-9]{60,100}")
_vendor("replicate_token", "r8_", r"[A-Za-z0-9]{37,40}")
_vendor("huggingface_token", "api_org_", r"[A-Za-z]{34}")
_vendor("groq_key", "gsk_", r"[A-Za-z0-9]{48,60}")
_vendor("grafana_token", "glc_", r"[A-Za-z0-9+/]{32,400}+={0,3}+", edge="A-Za-z0-9+/=_-")
_vendor("grafana_token", "glsa_", r"[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}")
_vendor("grafana_token", "eyJrIjoi", r"[A-Za-z0-9]{40,400}+={0,3}+", edge="A-Za-z0-9+/=_-")
_vendor("atlassian_token", "ATATT3", r"[A-Za-z0-9_=-]{150,}+", edge="A-Za-z0-9_=-")
_vendor("atlassian_token", "ATCTT3", r"[A-Za-z0-9_=-]{150,}+", edge="A-Za-z0-9_=-")
_vendor("linear_token", "lin_api_", r"[A-Za-z0-9]{40}")
_vendor("linear_token", "lin_oauth_", r"[a-f0-9]{64}")
_vendor("notion_token", "ntn_", r"[0-9]{11}[A-Za-z0-9]{35}")
_vendor("notion_token", "secret_", r"[A-Za-z0-9]{43}", check=_mixed)
_vendor("figma_token", "figd_", r"[A-Za-z0-9_-]{40,}+")
_vendor("postman_token", "PMAK-", r"[A-Fa-f0-9]{24}-[A-Fa-f0-9]{34}")
_vendor("doppler_token", r"dp\.", r"(?:pt|st|sa|ct|scim|audit)\.(?:[a-z0-9_-]{2,32}\.)?[A-Za-z0-9]{40,44}",
        edge="A-Za-z0-9_.-")
_vendor("pulumi_token", "pul-", r"[a-f0-9]{40}")
_V.append(Rule("terraform_token", _lazy(
    r"(?<![A-Za-z0-9_.-])[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,70}(?![A-Za-z0-9_=-])"), (".atlasv1.",),
    check=_random))
_vendor("sentry_token", "sntrys_", r"[A-Za-z0-9+/=_-]{50,}+", edge="A-Za-z0-9+/=_-")
_vendor("sentry_token", "sntryu_", r"[a-f0-9]{64}")
_vendor("supabase_token", "sbp_", r"(?:v0_)?[a-f0-9]{40}")
_vendor("supabase_token", "sb_secret_", r"[A-Za-z0-9_-]{20,}+")
_vendor("planetscale_token", "pscale_", r"(?:tkn|pw|oauth)_[A-Za-z0-9_=.-]{32,64}", edge="A-Za-z0-9_=.-")
_vendor("settlemint_token", "sm_", r"(?:pat|aat|sat)_[A-Za-z0-9]{12,}+")
_vendor("rubygems_token", "rubygems_", r"[a-f0-9]{48}")
_vendor("prefect_token", "pnu_", r"[A-Za-z0-9]{36}")
_vendor("readme_token", "rdme_", r"[a-z0-9]{70}")
_vendor("castai_token", "castai_v1_", r"[A-Za-z0-9]{64}_[A-Za-z0-9]{8}")
_vendor("perplexity_key", "pplx-", r"[A-Za-z0-9]{48}")
_vendor("clojars_token", "CLOJARS_", r"[A-Za-z0-9]{60}")
_vendor("onepassword_token", "ops_eyJ", r"[A-Za-z0-9+/]{100,}+={0,3}+", edge="A-Za-z0-9+/=_-")
_vendor("onepassword_key", "A3-", r"[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}")
_vendor("artifactory_token", "AKCp", r"[A-Za-z0-9]{69}")
_vendor("artifactory_token", "cmVmd", r"[A-Za-z0-9]{59}")
_vendor("adobe_secret", "p8e-", r"[A-Za-z0-9]{32}")
_vendor("alibaba_key", "LTAI", r"[A-Za-z0-9]{20}", check=_mixed)
_vendor("authress_key", "sc_", r"[a-z0-9]{5,30}\.[a-z0-9]{4,6}\.acc[_-][a-z0-9-]{10,32}\.[A-Za-z0-9+/_=-]{30,120}")
_vendor("clickhouse_key", "4b1d", r"[A-Za-z0-9]{38}", check=_mixed)
_vendor("cloudflare_key", r"v1\.0-", r"[a-f0-9]{24}-[a-f0-9]{146}", edge="A-Za-z0-9_.-")
_vendor("duffel_token", "duffel_", r"(?:test|live)_[A-Za-z0-9_=-]{43}")
_vendor("dynatrace_token", r"dt0c01\.", r"[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}")
_vendor("easypost_token", "EZAK", r"[A-Za-z0-9]{54}")
_vendor("easypost_token", "EZTK", r"[A-Za-z0-9]{54}")
_vendor("frameio_token", "fio-u-", r"[A-Za-z0-9_=-]{64}")
_vendor("flyio_token", "fo1_", r"[A-Za-z0-9_-]{43}")
_vendor("flyio_token", "fm1", r"[ar]_[A-Za-z0-9+/]{100,}+={0,3}+", edge="A-Za-z0-9+/=_-")
_vendor("flyio_token", "fm2_", r"[A-Za-z0-9+/]{100,}+={0,3}+", edge="A-Za-z0-9+/=_-")
_vendor("flutterwave_key", "FLWSECK", r"(?:_TEST)?-[A-Za-z0-9]{12,32}(?:-X)?")
_vendor("harness_token", "pat", r"\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}")
_vendor("harness_token", "sat", r"\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}")
_vendor("heroku_token", "HRKU-AA", r"[A-Za-z0-9_-]{58}")
_vendor("infracost_token", "ico-", r"[A-Za-z0-9]{32}", check=_mixed)
_vendor("intra42_secret", "s-s4t2", r"(?:ud|af)-[a-f0-9]{64}")
_vendor("langsmith_key", "lsv2_", r"(?:pt|sk)_[a-z0-9]{32}_[a-z0-9]{10}")
_V.append(Rule("maxmind_key", _lazy(r"(?<![A-Za-z0-9_-])[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk(?![A-Za-z0-9_-])"),
               ("_mmk",), check=_random))
_vendor("newrelic_key", "NRAK-", r"[A-Z0-9]{27}")
_vendor("newrelic_key", "NRII-", r"[A-Za-z0-9-]{32}")
_vendor("newrelic_key", "NRJS-", r"[a-f0-9]{19}")
_vendor("octopus_key", "API-", r"[A-Z0-9]{26}", check=lambda s, m: not_filler(s) and sum(c.isdigit() for c in s) >= 3)
_vendor("openshift_token", "sha256~", r"[A-Za-z0-9_-]{43}")
_vendor("sendinblue_key", "xkeysib-", r"[a-f0-9]{64}-[A-Za-z0-9]{16}")
_vendor("shippo_token", "shippo_", r"(?:live|test)_[a-f0-9]{40}")
_vendor("sourcegraph_token", "sgp_", r"(?:[a-fA-F0-9]{16}_|local_)?[A-Za-z0-9]{40}")
_vendor("square_token", "sq0atp-", r"[A-Za-z0-9_-]{22,60}")
_vendor("square_token", "sq0csp-", r"[A-Za-z0-9_-]{43}")
_vendor("square_token", "EAAA", r"[A-Za-z0-9_-]{22,60}", check=_mixed)
_vendor("typeform_token", "tfp_", r"[A-Za-z0-9_.=-]{59}")
_vendor("yandex_token", "AQVN", r"[A-Za-z0-9_-]{35,38}")
_vendor("yandex_token", r"t1\.", r"[A-Za-z0-9_-]+=*\.[A-Za-z0-9_-]{86}=*", edge="A-Za-z0-9_.=-")
_vendor("gitlab_token", "gl", r"(?:cbt|ffct|ft|imt|agent|oas)-[A-Za-z0-9_-]{20,}+")
_vendor("gitlab_token", "GR1348941", r"[A-Za-z0-9_-]{20}")
_vendor("gitlab_token", "_gitlab_session=", r"[0-9a-z]{32}", edge="A-Za-z0-9")
for _head in ("ABIA", "ACCA", "A3T"):
    _vendor("aws_access_key_id", _head, rf"[A-Z0-9]{{{20 - len(_head)}}}", check=lambda s, m: not_filler(s))
_vendor("slack_token", "xox", r"[oe]-[0-9]{1,16}-[A-Za-z0-9-]{10,}+")
_vendor("slack_token", r"xoxe\.xox", r"[bp]-\d-[A-Za-z0-9]{100,}+", edge="A-Za-z0-9_.-")
_vendor("slack_token", "xox", r"[ar]-(?:\d-)?[A-Za-z0-9]{8,}+(?:-[A-Za-z0-9]+)*+")
_V.append(Rule("slack_webhook", _lazy(
    r"hooks\.slack\.com/(?:services|workflows|triggers)/([A-Za-z0-9+/_-]{40,}+)"), ("hooks.slack.com/",), group=1))
_vendor("vault_token", r"hv[sb]\.", r"[A-Za-z0-9_-]{24,}+", needles=("hvs.", "hvb."), edge="A-Za-z0-9_.-")
_vendor("vault_token", r"s\.", r"[A-Za-z0-9]{24,40}", check=_mixed, edge="A-Za-z0-9_.-")
_vendor("datafactory_key", "IR@", r"[0-9A-Za-z-]{36}@[^@\s]{1,80}@[0-9A-Za-z=-]*@[A-Za-z0-9+/=]{44}", edge="A-Za-z0-9@_-")
_vendor("mapbox_token", "sk", r"\.eyJ[A-Za-z0-9_-]{40,}\.[A-Za-z0-9_-]{20,}+", edge="A-Za-z0-9_.-")
_vendor("mailgun_key", "key-", r"[a-f0-9]{32}", check=lambda s, m: not_filler(s) and any(c.isalpha() for c in s))

# Azure AD client secret: three characters, a digit, "Q~", then 31-34 more.
_V.append(Rule("azure_client_secret", _lazy(
    r"Q~(?<=(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.]{3}\dQ~)[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])"), ("Q~",),
    check=lambda s, m: not_filler(s)))
# Discord bot token: a base64 user id, a timestamp, an HMAC.
_V.append(Rule("discord_token", _lazy(
    r"\.[A-Za-z0-9_-]{6}\.(?<=(?<![A-Za-z0-9_.-])[MNO][A-Za-z0-9_-]{23}\.[A-Za-z0-9_-]{6}\.)[A-Za-z0-9_-]{27,40}(?![A-Za-z0-9_.-])"),
    (".",), check=lambda s, m: _mixed(s)))
# Okta API token: "SSWS" as its Authorization scheme, or a bare 00-prefixed 42-character token.
_V.append(Rule("okta_token", _lazy(r"SSWS[ \t]++(00[A-Za-z0-9_-]{40})(?![A-Za-z0-9_-])"), ("SSWS",), group=1))
_V.append(Rule("okta_token", _lazy(r"00(?<![A-Za-z0-9_-]00)[A-Za-z0-9_-]{40}(?![A-Za-z0-9_-])"), ("00",),
               check=lambda s, m: _mixed(s) and sum(c.isdigit() for c in s) >= 4))
# A JWT without its signature (header.claims), and a signed one whose claims are not {"…
_V.append(Rule("jwt", _lazy(r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{10,}+\.eyJ[A-Za-z0-9_-]{10,}+(?:\.[A-Za-z0-9_-]*+)?"),
               ("eyJ",)))
_V.append(Rule("jwt", _lazy(r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{10,}+\.ey[A-Za-z0-9_-]{10,}+\.[A-Za-z0-9_-]{10,}+"),
               ("eyJ",)))
# A private key's DER body in base64 without its PEM lines: SEQUENCE, then INTEGER 0 (IBAA,
# PKCS#1) or INTEGER 0 and an AlgorithmIdentifier (IBAD, PKCS#8). A certificate never has them.
_V.append(Rule("private_key", _lazy(
    r"MII(?<![A-Za-z0-9+/]MII)[A-Za-z0-9+/]{3}IBA[AD][A-Za-z0-9+/]{40,}+(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/]{16,}+)*+={0,2}+"),
    ("MII",)))


# -- command-line and config-file passwords -------------------------------------------------------

_DOTTED = re.compile(r"[A-Za-z_]\w*+(?:\.[A-Za-z_]\w*+)++")
_ARG = r"(?P<q>[\"']?)(?P<v>[^\s\"'`;|&<>]{3,}+)(?P=q)"


def _not_stand_in(secret: str, m: re.Match[str]) -> bool:
    """Not $VAR, ${X}, <password>, ****, %s or a bare word like password / secret / token."""
    folded = secret.lower()
    return not (re.match(r"[$<%{*\[]|(?:\.\.\.|…)", secret) or len(set(secret)) == 1
                or folded in {"password", "passwd", "secret", "token", "pass", "xxxx", "changeit"}
                or folded.startswith(("your", "<", "fake", "example")))


_CLI: list[Rule] = [
    # mysql / mariadb / mysqldump / mysqladmin with the password glued to -p
    Rule("cli_password", _lazy(
        r"\b(?:mysql[a-z]*+|mariadb[a-z-]*+)\b[^\n|;&]{0,200}?[ \t]-p(?P<q>[\"']?)(?P<v>[^\s\"'`;|&<>-][^\s\"'`;|&<>]{2,}+)(?P=q)"),
        ("mysql", "mariadb"), group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(rf"\bsshpass[ \t]++-p[ \t]*+{_ARG}"), ("sshpass",), group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(rf"\bredis-cli\b[^\n|;&]{{0,200}}?[ \t]-a[ \t]++{_ARG}"), ("redis-cli",),
         group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(rf"(?:docker|podman|buildah|helm)[ \t]++(?:registry[ \t]++)?login\b[^\n|;&]{{0,200}}?[ \t]-p[ \t]++{_ARG}"),
         ("docker login", "podman login", "buildah login", "registry login"), group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(rf"-pass(?:in|out)?[ \t]++pass:{_ARG}"), ("pass:",), group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(
        rf"\bnet[ \t]++use\b[^\n]{{0,200}}?/u(?:ser)?:[^\s/]++[ \t]++(?!/){_ARG}"), ("net use", "NET USE"),
        group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(
        rf"\bnet[ \t]++use[ \t]++(?:[A-Za-z*]:[ \t]++)?\\\\[^\s]++[ \t]++(?!/){_ARG}"), ("net use", "NET USE"),
        group="v", check=_not_stand_in),
    # redis.conf
    Rule("config_password", _lazy(rf"(?m)^[ \t]*+(?:requirepass|masterauth)[ \t]++{_ARG}"),
         ("requirepass", "masterauth"), group="v", check=_not_stand_in),
    # SQL: CREATE USER … IDENTIFIED BY '…', CREATE ROLE … PASSWORD '…'
    Rule("config_password", _lazy(r"(?i:identified[ \t]++by(?:[ \t]++password)?)[ \t]++(?P<q>['\"])(?P<v>[^'\"\n]{3,}+)(?P=q)"),
         ("IDENTIFIED", "identified"), group="v", check=_not_stand_in),
    Rule("config_password", _lazy(r"(?i:\bpassword)[ \t]++(?P<q>')(?P<v>[^'\n]{3,}+)'"), ("PASSWORD '", "password '", "Password '"),
         group="v", check=_not_stand_in),
    # .pgpass: hostname:port:database:username:password
    Rule("config_password", _lazy(
        r"(?m)^(?:[A-Za-z0-9.-]++|\*):(?:\d{2,5}|\*):[A-Za-z0-9_.*-]++:[A-Za-z0-9_.*@-]++:(?P<v>[^\s:]{3,}+)$"), (":",),
        group="v", check=lambda s, m: _not_stand_in(s, m) and not _DOTTED.fullmatch(s)),
    # NuGet.config and friends: <add key="Password" value="…" />
    Rule("config_password", _lazy(
        r"key=\"(?i:[a-z]*(?:password|passwd|secret|token|apikey))\"[ \t]++value=\"(?P<v>[^\"]{4,}+)\""), ("key=\"",),
        group="v", check=_not_stand_in),
    # bundler credentials: BUNDLE_GEMS__CONTRIBSYS__COM=user:pass
    Rule("config_password", _lazy(
        r"BUNDLE_[A-Z0-9_]+?__[A-Z]{2,}+[\"']?[ \t]*[:=][ \t]*(?P<q>[\"']?)(?P<v>[^\s\"':]++:[^\s\"';&]++)(?P=q)"),
        ("BUNDLE_",), group="v", check=_not_stand_in),
    # yarn berry: npmAuthIdent "user:pass"
    Rule("config_password", _lazy(rf"npmAuthIdent[\"']?[ \t]*[:=][ \t]*{_ARG}"), ("npmAuthIdent",), group="v",
         check=_not_stand_in),
    # An Authorization header whose value has no scheme word (a bare token or UUID).
    Rule("bearer_token", _lazy(
        r"(?:[Aa]uthorization|AUTHORIZATION)[\"']?[ \t]*:[ \t]*(?!(?i:basic|bearer|token|digest|negotiate|ntlm|aws4|ssws)\b)"
        r"(?P<v>[A-Za-z0-9_~+/=-][A-Za-z0-9_~+/.=-]{15,}+)"), ("uthorization", "UTHORIZATION"), group="v",
        check=lambda s, m: _random(s) and not s.startswith("$")),
]


# -- the families an unseen set got through (issue 29): prose, Oracle/JDBC, cookies, kubeconfig ---

def _pgpass_value(secret: str, m: re.Match[str]) -> bool:
    return _not_stand_in(secret, m) and not _DOTTED.fullmatch(secret)


_PROSE_NUMBER = re.compile(r"[0-9]{1,5}|[0-9][0-9.,:x%-]*[a-z]{0,2}")  # 8, 64-bit, 1.2.3, 2x
_PROSE_PATH = re.compile(r"[/~\\$<%{(\[]|[A-Za-z]:\\|\w+://|.*\.(?:py|txt|json|ya?ml|cfg|ini|env|conf|toml|md|rst)$")


_PROSE_LITERALS = frozenset({"required", "optional", "none", "null", "empty", "blank", "hidden", "unset", "set",
                             "correct", "wrong", "invalid", "incorrect", "expired", "changed", "stored", "hashed",
                             "encrypted", "masked", "redacted", "true", "false", "missing", "ignored", "secure"})
_CLOSING = {"\"": "\"", "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019"}


def _prose_value(secret: str, m: re.Match[str]) -> bool:
    """A password a sentence states: a digit or a symbol among letters, or case changing inside
    it (Hunter2!, Tr0ub4dor&3, tiger123, s3cret), 6+ digits, or any word quoted as the password
    (the password is "centipede"); never a word or an identifier unquoted (required, None,
    is_valid, hashed), a literal quoted ("required"), a number with a unit (8, 64-bit), a path,
    a variable, a dotted name (config.password) nor a stand-in."""
    if (not _not_stand_in(secret, m) or _PROSE_PATH.match(secret) or _DOTTED.fullmatch(secret)
            or re.search(r"\w[(\[]", secret)):  # code: os.environ[, get_password()
        return False
    quote = m.group("q")
    if quote and m.string[m.end("v"):m.end("v") + 1] == _CLOSING[quote] and secret.lower() not in _PROSE_LITERALS:
        return True  # quoted whole: the sentence names this text as the password
    return _prose_word(secret)


def _prose_word(secret: str) -> bool:
    """A word that reads as a password unquoted: 6+ digits, or a digit or a symbol among
    letters, or case changing inside it (not a number with a unit nor a CamelCase name)."""
    if secret.isdigit():
        return len(secret) >= 6
    if _PROSE_NUMBER.fullmatch(secret) or not any(c.isalpha() for c in secret):
        return False
    digit_or_symbol, inner_case = _symbol_and_case(secret)
    return digit_or_symbol or (inner_case and not re.fullmatch(r"[A-Z]+[a-z]*|[A-Z][a-z]+(?:[A-Z][a-z]+)+", secret))


def _generated_word(secret: str) -> bool:
    """A letter and a digit, and mixed case or a symbol (Hunter22x, s3cr3t!x; not sha256, v2)."""
    digit_or_symbol, inner_case = _symbol_and_case(secret)
    return (any(c.isalpha() for c in secret) and any(c.isdigit() for c in secret)
            and (inner_case or any(not (c.isalnum() or c in "_-.") for c in secret)))


# "is the admin password": found forward (a word start is quick to search for), then the value
# just before it
_NAMED_AFTER = re.compile(
    r"\b(?i:is|was|will[ \t]+be)[ \t]++(?i:the|my|your|our|its|his|her|their)[ \t]++(?:[\w-]{1,20}[ \t]++){0,2}?"
    r"(?i:password)(?:[ \t]*+(?:[.,;:!)]|$|\n)|[ \t]++(?i:for|to|on|of|and|when|in|at|until|here|now)\b)")
_VALUE_BEFORE = re.compile(r"(?P<q>[\"'`\u201c\u2018]?)(?P<v>[^\s\"'`\u201d\u2019]{3,63})(?P=q)[ \t]++$")


def _reversed_prose(text: str) -> Iterator[Candidate]:
    """A password named after it: "Hunter22x is the admin password" (a word that reads as a
    generated password, or quoted whole), before the sentence ends or goes on (for, to, …;
    not "X is the password hasher")."""
    for m in _NAMED_AFTER.finditer(text):
        v = _VALUE_BEFORE.search(text, max(0, m.start() - 70), m.start())
        if v and _not_stand_in(v.group("v"), v) and (
                _generated_word(v.group("v")) or (v.group("q") and v.group("v").lower() not in _PROSE_LITERALS)):
            yield v.start("v"), v.end("v"), "prose_password"


def _symbol_and_case(secret: str) -> tuple[bool, bool]:
    """Whether ``secret`` holds a digit or a symbol (beyond _ - .), and whether its case changes
    inside it: what makes a word read as a password (Hunter2!, Tiger42, tiger123)."""
    digit_or_symbol = any(c.isdigit() or not (c.isalnum() or c in "_-.") for c in secret)
    inner_case = any(c.isupper() for c in secret[1:]) and any(c.islower() for c in secret)
    return digit_or_symbol, inner_case


def _login_value(secret: str, m: re.Match[str]) -> bool:
    """The password of a stated login (admin / Hunter2!): as a password in a sentence, and not the
    user name again, a URL's or a path's part (login: https://…, sign in with github/oauth2)."""
    user = m.group("u")
    if m.string[m.end("u"):m.start("v")].strip("\"'`\u201c\u2018") == "/" and re.fullmatch(r"[a-z0-9_.-]+", secret):
        return False  # sign in with sso/saml2, github/oauth2: a choice of methods, not a login
    if secret.lower() == user.lower() or user.lower() in ("http", "https", "ssh", "git", "ftp", "with", "via"):
        return False
    return _prose_value(secret, m)


_COOKIE_NOT_SECRET = frozenset({"path", "domain", "expires", "max-age", "samesite", "_ga", "_gid", "_gat", "_fbp",
                                "__utma", "__utmb", "__utmz", "lang", "locale", "theme", "tz"})
_SESSION_NAME = re.compile(
    r"(?i)(?:.*[._-])?(?:session(?:[_-]?(?:id|token|key))?|sess(?:id)?|sid|aspxauth|auth[_-]?token|remember[_-]\w+)"
    r"|(?i:jsessionid|phpsessid|asp\.net_sessionid|cfid|cftoken)|__(?:Secure|Host)-\S+|_\w+_sess(?:ion)?")
_COOKIE_PAIR = re.compile(r"(?P<n>[^\s=;,\"']{1,64})=(?P<v>[^\s;,\"'&<>]{8,1024}+)")
_COOKIE_LINE = re.compile(
    r"(?i:\b(?:set-)?cookie2?)[\"']?[ \t]*[:=][ \t]*[\"']?(?P<pairs>[^\n\"'{}]{1,2048})|"
    r"(?:[ \t](?:-b|--cookie)[ \t]+)(?P<q>[\"']?)(?P<curl>[^\n\"']{1,2048}?)(?P=q)(?=[\s]|$)")
_SESSION_PAIR = re.compile(
    r"(?<![\w.%-])(?P<n>(?:__(?:Secure|Host)-)?(?:[A-Za-z_.][\w.-]{0,40}?)?(?i:sessionid|session|sessid|sess|sid|aspxauth))"
    r"=(?P<v>[^\s;,\"'&<>]{16,1024}+)")
_COOKIE_JAR = re.compile(
    r"(?m)(?:^|(?<=[\s:]))(?:#HttpOnly_)?[\w.-]++\t(?:TRUE|FALSE)\t[^\t\n]*+\t(?:TRUE|FALSE)\t\d++\t[^\t\n]++\t(?P<v>[^\t\r\n]{8,}+)$")


_SESSION_NEEDLES = ("sess", "Sess", "SESS", "sid", "Sid", "SID", "ASPXAUTH")


# A session-named key of a dict or JSON object given a quoted value: cookies={'sessionid': '…'}
_SESSION_QUOTED = re.compile(
    r"(?P<kq>[\"'])(?P<n>(?:__(?:Secure|Host)-)?(?:[A-Za-z_.][\w.-]{0,40}?)?(?i:sessionid|session|sessid|sess|sid|aspxauth))"
    r"(?P=kq)[ \t]*:[ \t]*(?P<q>[\"'])(?P<v>[^\s\"'\\;,&<>]{16,1024}+)(?P=q)")


def _cookie_value(value: str) -> bool:
    """A session id or a signed cookie: generated (digits, or mixed case), not a word nor a
    Windows security id (S-1-5-21-…)."""
    body = value[4:] if value.lower().startswith("s%3a") else value
    return (len(body) >= 8 and _random(body) and not re.fullmatch(r"[0-9.]+|GA\d[.\d]+", body)
            and not re.match(r"S-1-\d", body))


def _cookies(text: str) -> Iterator[Candidate]:
    """Session cookies: the values in a Cookie / Set-Cookie header or a curl -b argument, a
    session-named pair anywhere (PHPSESSID=…, connect.sid=…), a Netscape cookie jar line."""
    if "ookie" in text or "OOKIE" in text or "-b" in text:
        for line in _COOKIE_LINE.finditer(text):
            group = "pairs" if line.group("pairs") is not None else "curl"
            base = line.start(group)
            for pair in _COOKIE_PAIR.finditer(line.group(group)):
                name, value = pair.group("n"), pair.group("v")
                if name.lower() in _COOKIE_NOT_SECRET or not _cookie_value(value):
                    continue
                if _SESSION_NAME.fullmatch(name) or len(value) >= 16:
                    yield base + pair.start("v"), base + pair.end("v"), "session_cookie"
    if any(n in text for n in _SESSION_NEEDLES):
        for pair in _SESSION_PAIR.finditer(text):
            if _SESSION_NAME.fullmatch(pair.group("n")) and _cookie_value(pair.group("v")):
                yield pair.start("v"), pair.end("v"), "session_cookie"
        for pair in _SESSION_QUOTED.finditer(text):
            if _SESSION_NAME.fullmatch(pair.group("n")) and _cookie_value(pair.group("v")):
                yield pair.start("v"), pair.end("v"), "session_cookie"
    if "\tTRUE\t" in text or "\tFALSE\t" in text:
        for m in _COOKIE_JAR.finditer(text):
            if _cookie_value(m.group("v")):
                yield m.start("v"), m.end("v"), "session_cookie"


_B64_PEM = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/]{20,}+(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/]{16,}+)*+={0,2}+")
_KEY_DATA = re.compile(
    r"(?i:key[-_]?data|tls\.key|ssh-privatekey|private[-_]?key|\.dockerconfigjson|\.dockercfg)[\"']?[ \t]*[:=][ \t]*"
    r"[\"']?(?P<v>[A-Za-z0-9+/]{40,}+={0,2}+)")
_KEY_DATA_NEEDLES = ("ey-data", "ey_data", "eyData", "EY_DATA", "tls.key", "rivatekey", "rivate-key", "rivate_key",
                     "rivateKey", "RIVATE_KEY", "EY-DATA", "ockerconfigjson", "ockercfg")
_SECRET_JSON = re.compile(r"\"kind\"[ \t]*:[ \t]*\"Secret\"")
_JSON_DATA = re.compile(r"\"(?:data|stringData)\"[ \t]*:[ \t]*\{(?P<body>[^{}]{1,65536}+)\}")
_JSON_VALUE = re.compile(r"\"[\w.-]++\"[ \t\r\n]*:[ \t\r\n]*\"(?P<v>[^\"\\]{8,}+)\"")


def _b64_head(value: str) -> bytes:
    body = re.sub(r"\s+", "", value)[:96]
    body = body[: len(body) // 4 * 4]
    try:
        return binascii.a2b_base64(body)
    except (binascii.Error, ValueError):
        return b""


def _key_material(text: str) -> Iterator[Candidate]:
    """Base64 key material as kubeconfig, Kubernetes and Docker files hold it: a PEM private
    key in base64 (LS0tLS1CRUdJTi…, the base64 of -----BEGIN), a *key-data / tls.key /
    private-key value, and the data values of a Secret written as JSON."""
    if "LS0tLS1CRUdJTi" in text:
        for m in _B64_PEM.finditer(text):
            if b"PRIVATE KEY" in _b64_head(m.group(0)):
                yield m.start(), m.end(), "private_key"
    if any(n in text for n in _KEY_DATA_NEEDLES):
        for m in _KEY_DATA.finditer(text):
            if _mixed(m.group("v")):
                yield m.start("v"), m.end("v"), "private_key"
    if "\"Secret\"" in text and _SECRET_JSON.search(text):
        for data in _JSON_DATA.finditer(text):
            base = data.start("body")
            for m in _JSON_VALUE.finditer(data.group("body")):
                if not_filler(m.group("v")):
                    yield base + m.start("v"), base + m.end("v"), "kubernetes_secret"


_PROSE_NEEDLES = ("assword", "ASSWORD", "asswd", "ASSWD", "assphrase", "ASSPHRASE", "asscode", "ASSCODE",
                  "pw", "PW", "Pw")
_ORACLE_NEEDLES = ("jdbc:oracle", "JDBC:ORACLE", "sqlplus", "SQLPLUS", "sqlcl", "expdp", "EXPDP", "impdp", "IMPDP",
                   "exp ", "EXP ", "imp ", "IMP ", "rman", "RMAN", "sqlldr", "SQLLDR", "dgmgrl", "DGMGRL", "onnect",
                   "ONNECT", "conn ", "CONN ", "userid=", "USERID=", "sql ", "SQL ")
_USER_BEFORE = re.compile(r"[A-Za-z_][\w$#.-]{0,40}$")


def _oracle_local(secret: str, m: re.Match[str]) -> bool:
    """user/password after an Oracle tool: any password but a stand-in or the user again; after a
    bare CONNECT / CONN (a word of prose too: connect client/server) only one that reads as a
    password in a sentence (Tiger42, not server)."""
    if not _not_stand_in(secret, m) or secret.lower() == m.group("u").lower() or _DOTTED.fullmatch(secret):
        return False
    tool = (m.group("tool") or "").strip().lower()
    if not tool.startswith("conn"):
        return True
    return len(secret) >= 5 and not re.fullmatch(r"v?[\d.]+", secret) and any(_symbol_and_case(secret))


def _user_pass_at(secret: str, m: re.Match[str]) -> bool:
    """user/password@host: a user name before the "/" (a word start, not a path's or a
    package's part), and a password that is not a stand-in nor the user name again."""
    start = m.start()
    user = _USER_BEFORE.search(m.string, max(0, start - 41), start)
    if user is None or (user.start() > 0 and re.match(r"[\w./@:%+-]", m.string[user.start() - 1])):
        return False
    return _not_stand_in(secret, m) and secret.lower() != user.group().lower()


_SECRET_NAME = r"[\w.:-]{0,60}?(?i:password|passwd|passphrase|pwd|pass|secret|token|api[_-]?key|credentials?)"
_NAMED_LITERALS = frozenset({"true", "false", "none", "null", "nil", "yes", "no", "on", "off", "empty", "required",
                             "optional", "changeme", "change_me", "redacted", "hidden", "masked"})


def _named_value(secret: str, m: re.Match[str]) -> bool:
    """The value of a setting a secret word names: not a stand-in, a reference (${X}, %X%, #{x},
    {{x}}), a literal (true, none), a number of up to 5 digits, nor a dotted name or an expression;
    and 4 characters or more (value="abc" is a test's stand-in)."""
    folded = secret.strip().lower()
    return (len(secret) >= 4 and _not_stand_in(secret, m) and folded not in _NAMED_LITERALS and not _DOTTED.fullmatch(secret)
            and not re.search(r"[$%#]\{|\{\{|^%[A-Za-z_]+%$|\w\(", secret) and not re.fullmatch(r"\d{1,5}", secret)
            and len(set(secret)) > 2)


def _braced_value(secret: str, m: re.Match[str]) -> bool:
    """A brace-quoted connection-string value, not a template field ({0}, {password}, {your_pwd})."""
    return _named_value(secret, m) and not re.fullmatch(r"[A-Za-z_]+|\d+", secret)


_FAMILIES: list[Rule] = [
    # a .pgpass line written by a command: echo "host:5432:db:user:pw" >> ~/.pgpass
    Rule("config_password", _lazy(
        r"(?<![^\s\"'=])(?:[A-Za-z0-9.-]++|\*):(?:\d{2,5}|\*):[A-Za-z0-9_.*-]++:[A-Za-z0-9_.*@-]++:"
        r"(?P<v>[^\s:\"'\\]{3,}+)(?=[\"']|\\n|[ \t]*+(?:$|>|\||\n))"), ("pgpass", "PGPASS"),
        group="v", check=_pgpass_value),
    # a password stated in a sentence: "the password is Hunter2!", "admin's pw was tiger123"
    Rule("prose_password", _lazy(
        r"(?i:\b(?:pass(?:word|wd|phrase|code)|pwd|pw))(?:s|'s)?(?P<for>[ \t]++(?i:for|of|on|to)(?:[ \t]++[^\s]{1,40}?){1,5}?)?"
        # is / was / has been / should be …, then maybe changed / reset / set … to / as;
        # or after "for <whom>" a colon: "the password for prod db: …"
        r"(?:[ \t]++(?i:(?:is|was|are|were|(?:has|have|had)[ \t]+been|(?:will|would|should|must)[ \t]+be|remains|becomes)"
        r"(?:[ \t]++(?:now|still|also))?(?:[ \t]++(?:changed|reset|set|updated)(?:[ \t]++(?:to|as))?)?"
        r"|(?:set|changed|reset|updated)[ \t]++(?:to|as)|now)(?:[ \t]++|(?=:))"
        r"|(?(for)(?<=[^\s:])(?=:[ \t])|(?!)))"
        r"(?:(?i:now|still|just|simply|literally|set[ \t]+to)[ \t]++)?[:\-]?[ \t]*+"
        r"(?P<q>[\"'`\u201c\u2018]?)(?P<v>[^\s\"'`\u201d\u2019]{3,63}[^\s\"'`\u201d\u2019.,;:)])"),
        _PROSE_NEEDLES, group="v", check=_prose_value),
    Rule("prose_password", _lazy(
        r"(?i:\b(?:use|using|with|enter|type|try|and)[ \t]++(?:the[ \t]++)?(?:pass(?:word|wd|phrase|code)|pwd|pw))"
        r"[ \t]++(?P<q>[\"'`\u201c\u2018]?)(?P<v>[^\s\"'`\u201d\u2019]{3,63}[^\s\"'`\u201d\u2019.,;:)])"),
        _PROSE_NEEDLES, group="v", check=_prose_value),
    # a value quoted or in parentheses right after the word: password "Hunter2!", password (tiger42)
    # (only one that reads as a password: password "field", password (optional) are words)
    Rule("prose_password", _lazy(
        r"(?i:\b(?:pass(?:word|wd|phrase|code)|pwd|pw))[ \t]*+(?:(?P<q>[\"'`\u201c\u2018])|\()"
        r"(?P<v>[^\s\"'`\u201d\u2019()]{3,63}[^\s\"'`\u201d\u2019.,;:()])(?(q)[\"'`\u201d\u2019]|\))"),
        _PROSE_NEEDLES, group="v", check=lambda s, m: _not_stand_in(s, m) and _generated_word(s)
        and not _PROSE_PATH.match(s)),
    # Oracle and JDBC: jdbc:oracle:thin:scott/tiger@host, sqlplus user/pass@db, CONNECT u/p@tns
    Rule("db_password", _lazy(
        r"(?:(?i:jdbc:oracle:[a-z0-9]+):|(?i:\b(?:sqlplus|sqlcl|sql|expdp|impdp|exp|imp|rman|sqlldr|dgmgrl|"
        r"connect|conn|userid=)\b)[ \t]*+(?:-[A-Za-z]++[ \t]++)*+(?:(?i:target|auxiliary|catalog)[ \t]++)?)"
        # the password may hold an "@" when another follows before the host (p@ss@db, as URLs)
        r"[\"']?(?P<u>[A-Za-z_$#][\w$#.]{0,40})/(?P<v>(?:[^\s/@\"']|@(?=[^\s/\"'@]*+@)){1,128}+)@"), _ORACLE_NEEDLES,
        group="v", check=_not_stand_in),
    # user/password@host:port or @//host: a connect string anywhere
    Rule("db_password", _lazy(
        # from the "/" (a literal start is fast to search for); the check finds the user before it
        r"/(?P<v>[^\s/@\"'<>()]{3,128}+)@(?://[\w.-]|[A-Za-z0-9][\w.-]*:\d{2,5}(?![\w.])|\(DESCRIPTION)"),
        ("@",), group="v", check=_user_pass_at),
]


# Rules whose needles are lower case, searched for in the text lower-cased (once per text): the
# shapes below need a cue next to their key word ("password to", "as the password", "login",
# "value=\"") in any case, and a handful of lower-case needles cost less than every case of each.
_FAMILIES_LOWER: list[Rule] = [
    # the Oracle tools' user/password without a connect identifier (the local database):
    # sqlplus scott/tiger, exp userid=app/tiger, CONNECT scott/Tiger42
    Rule("db_password", _lazy(
        r"(?P<tool>(?i:\b(?:sqlplus|sqlcl|expdp|impdp|rman|sqlldr|dgmgrl|connect|conn)\b)[ \t]++(?:-[A-Za-z]++[ \t]++)*+"
        r"(?:(?i:target|auxiliary|catalog)[ \t]++)?|(?i:\buserid=))"
        r"[\"']?(?P<u>[A-Za-z_$#][\w$#.]{0,40})/(?P<v>[^\s/@\"';,)]{1,128}+)(?=[\"']?(?:[ \t\r\n;,)]|$))"),
        ("sqlplus", "sqlcl", "expdp", "impdp", "rman", "sqlldr", "dgmgrl", "connect ", "conn ", "userid="), group="v",
        check=_oracle_local),
    # SQL Server's and Sybase's tools take the password as -P, MongoDB's shells as -p
    Rule("cli_password", _lazy(rf"\b(?:sqlcmd|bcp|isql|osql)\b[^\n|;&]{{0,200}}?[ \t]-P[ \t]*+{_ARG}"),
         ("sqlcmd", "bcp ", "isql", "osql"), group="v", check=_not_stand_in),
    Rule("cli_password", _lazy(rf"\bmongo(?:sh)?\b[^\n|;&]{{0,200}}?[ \t]-p[ \t]++{_ARG}"), ("mongo",), group="v",
         check=_not_stand_in),
    # Db2's CLP: connect to SAMPLE user db2inst1 using …
    Rule("cli_password", _lazy(
        rf"(?i:\bconnect[ \t]++to[ \t]++[\w.$#@-]++[ \t]++user[ \t]++[\w.$#@\\-]++[ \t]++using)[ \t]++{_ARG}"),
        ("connect to",), group="v", check=_not_stand_in),
    # "changed the root password to …", "reset my pw to …"
    Rule("prose_password", _lazy(
        r"(?i:\b(?:chang(?:e|ed|ing)|set(?:ting)?|reset(?:ting)?|updat(?:e|ed|ing))[ \t]++(?:[\w'-]{1,20}[ \t]++){0,3}?"
        r"(?:pass(?:word|wd|phrase|code)|pwd|pw)[ \t]++to)[ \t]++(?:[:\-][ \t]*+)?"
        r"(?P<q>[\"'`\u201c\u2018]?)(?P<v>[^\s\"'`\u201d\u2019]{3,63}[^\s\"'`\u201d\u2019.,;:)])"),
        ("password to", "passwd to", "passphrase to", "passcode to", "pw to", "pwd to"), group="v", check=_prose_value),
    # "use Hunter2! as the password"
    Rule("prose_password", _lazy(
        r"(?i:\b(?:use|using|set|chose|choose|pick|picked)[ \t]++)"
        r"(?P<q>[\"'`\u201c\u2018]?)(?P<v>[^\s\"'`\u201d\u2019]{3,63}[^\s\"'`\u201d\u2019.,;:)])(?P=q)"
        r"[ \t]++(?i:as[ \t]++(?:the[ \t]++|your[ \t]++|my[ \t]++|a[ \t]++)?(?:pass(?:word|wd|phrase|code)|pwd|pw))"
        # the password itself, not a password hasher, policy or field
        r"(?=[ \t]*+(?:[.,;:!)]|$|\n|[ \t](?i:for|to|on|of|and|when|in|at|until|here)\b))"),
        (" as the pass", " as pass", " as your pass", " as my pass", " as a pass", " as the pw", " as pw"),
        group="v", check=_prose_value),
    # a login stated as user and password: "Login: admin / Hunter2!", "credentials are admin:tiger123"
    Rule("prose_password", _lazy(
        r"(?i:\b(?:log[ -]?in|sign[ -]?in|credentials?|creds)\b)(?:[ \t]++(?i:is|are|with|as|using|was))?[ \t]*+[:=]?[ \t]*+"
        r"(?P<u>[A-Za-z][A-Za-z0-9_.@-]{0,40}?)(?:[ \t]++/[ \t]++|/|:)"
        r"(?P<q>[\"'`\u201c\u2018]?)(?P<v>[^\s/\"'`\u201d\u2019]{3,63}[^\s/\"'`\u201d\u2019.,;:)])(?=[\"'`\u201d\u2019]?(?:[\s.,;:)]|$))"),
        ("login", "log in", "log-in", "sign in", "sign-in", "signin", "credential", "creds"), group="v",
        check=_login_value),
    # SQL Server / ODBC brace-quoted values: password={p;w};  PWD={…}
    Rule("db_password", _lazy(
        r"(?i:\b(?:password|pwd))[ \t]*=[ \t]*\{(?P<v>[^{}\s]{4,128}+)\}(?=[ \t]*(?:;|$|[\"'<]))"),
        ("={", "= {"), group="v", check=_braced_value),
    # a setting given as a name and a value: <property name="db.password" value="…"/>,
    # <entry key="password">…</entry>, define('DB_PASSWORD', '…'), a Kubernetes env entry
    # (- name: DB_PASSWORD / value: …), Dockerfile's ENV KEY value and csh's setenv / fish's set -x
    Rule("config_password", _lazy(
        rf"<[A-Za-z][\w:.-]*+[ \t\r\n]++(?:[\w:.-]++=\"[^\"\n]{{0,80}}\"[ \t\r\n]++){{0,3}}?(?:name|key)=\"{_SECRET_NAME}\""
        rf"[ \t\r\n]++value=\"{_NOT_MARK}(?P<v>[^\"\n]{{3,200}}+)\""), ("value=\"",), group="v", check=_named_value),
    Rule("config_password", _lazy(
        rf"<(?P<tag>[A-Za-z][\w:.-]*+)[ \t]++(?:name|key)=\"{_SECRET_NAME}\"[ \t]*+>{_NOT_MARK}(?P<v>[^<>\s]{{3,200}}+)</(?P=tag)>"),
        ("key=\"", "name=\""), group="v", check=_named_value),
    Rule("config_password", _lazy(
        rf"\bdefine[ \t]*+\([ \t]*+(?P<kq>[\"']){_SECRET_NAME}(?P=kq)[ \t]*+,[ \t]*+(?P<q>[\"']){_NOT_MARK}"
        r"(?P<v>[^\"'\n]{3,200}+)(?P=q)[ \t]*+\)"), ("define(", "define ("), group="v", check=_named_value),
    Rule("config_password", _lazy(
        rf"(?m)^[ \t]*+-?[ \t]*+name:[ \t]*+(?P<kq>[\"']?){_SECRET_NAME}(?P=kq)[ \t]*+\r?\n[ \t]*+value:[ \t]*+"
        rf"(?P<q>[\"']?){_NOT_MARK}(?P<v>[^\s\"'#]{{3,200}}+)(?P=q)[ \t]*+$"), ("value:",), group="v", check=_named_value),
    Rule("config_password", _lazy(
        r"(?m)(?:^|(?<=[\s`;&|(]))(?:ENV|setenv|set[ \t]++-[a-z]*x[a-z]*)[ \t]++[A-Z][A-Z0-9_]{0,60}"
        r"(?:PASSWORD|PASSWD|PASS|PWD|SECRET|TOKEN)"
        rf"[ \t]++(?P<q>[\"']?){_NOT_MARK}(?P<v>[^\s\"'=;&|`)]{{3,200}}+)(?P=q)[ \t]*+(?:$|(?=[;&|`)]))"),
        ("env ", "setenv", "set -"), group="v", check=_named_value),
    # a bare pass / pw / pwd key after a user key on the same line: "user: admin pass: …",
    # "login=admin, pw=…" (a value that reads as a password, or quoted whole)
    Rule("config_password", _lazy(
        r"(?i:\b(?:user(?:name)?|login|uid))[ \t]*+[:=][ \t]*+[\"']?[\w.@+-]{1,64}+[\"']?(?:[ \t]*+[,;])?[ \t]++"
        r"(?i:pass|pwd?)[ \t]*+[:=][ \t]*+(?P<q>[\"']?)(?P<v>[^\s\"',;]{3,128}+)(?P=q)"),
        ("pass", "pw"), group="v", check=_prose_value),
    # a bare "pass" key on the line after a user key: [db] user = app / pass = …, YAML user: / pass:
    Rule("config_password", _lazy(
        r"(?im)^(?P<i>[ \t]*+)(?:user(?:name)?|login|uid)[ \t]*+[:=][ \t]*+[^\s]++[ \t]*+\r?\n(?P=i)pass[ \t]*+[:=][ \t]*+"
        rf"(?P<q>[\"']?){_NOT_MARK}(?P<v>[^\s\"'#;]{{3,200}}+)(?P=q)[ \t]*+(?:$|#)"),
        ("\npass", "\n pass", "\n  pass", "\n    pass", "\n\tpass"), group="v", check=_named_value),
]
# Two levels: a short needle every rule of a group needs (most texts have none), then the rules'
# own. One level of all the rules' needles cost a tenth of redact()'s time on a commit message.
_LOWER_GATES = ("sql", "rman", "dgmgrl", "dp", "conn", "userid=", "bcp ", "mongo", "pass", "pw", "log", "sign", "cred",
                "={", "= {", '="', "define", "value:", "env", "set -")


def _gates(rule: Rule) -> tuple[str, ...]:
    """The gates one of which each of rule's needles holds (every needle is behind one)."""
    gates = tuple(g for g in _LOWER_GATES if any(g in n for n in rule.needles))
    assert all(any(g in n for g in gates) for n in rule.needles), rule.needles
    return gates


_LOWER_NEEDLES = {gate: tuple((n, rule) for rule in _FAMILIES_LOWER if gate in _gates(rule) for n in rule.needles
                              if gate in n) for gate in _LOWER_GATES}

_CONNECT_CALL = re.compile(
    r"(?:\bnew[ \t]++PDO|\bDriverManager\.getConnection|\bmysqli?_connect|\bnew[ \t]++mysqli|\bmysqli_real_connect"
    r"|\bNetworkCredential)[ \t]*+\(")
# the password's place among the call's arguments (0-based)
_CONNECT_PASSWORD_ARG = {"NetworkCredential": 1, "mysqli_real_connect": 3}
_ARGUMENT = re.compile(r"[ \t\r\n]*+(?:\"(?P<d>[^\"\n]{0,300}+)\"|'(?P<s>[^'\n]{0,300}+)'|[^,()\"'\n]{1,100}+(?:\([^()\n]{0,100}+\))?)"
                       r"[ \t\r\n]*+(?:,|(?=\)))")


def _connect_calls(text: str) -> Iterator[Candidate]:
    """A database connection call given the password as a string literal: new PDO(dsn, user,
    "…"), DriverManager.getConnection(url, user, "…"), mysqli_connect(host, user, "…"),
    mysqli_real_connect($link, host, user, "…"), new NetworkCredential(user, "…")."""
    if "onnect" not in text and "PDO" not in text and "mysqli" not in text and "NetworkCredential" not in text:
        return  # getConnection, mysqli_connect, new PDO, new mysqli, NetworkCredential
    for call in _CONNECT_CALL.finditer(text):
        name = next((k for k in _CONNECT_PASSWORD_ARG if k in call.group(0)), "")
        want = _CONNECT_PASSWORD_ARG.get(name, 2)
        pos = call.end()
        for index in range(want + 1):
            arg = _ARGUMENT.match(text, pos)
            if arg is None:
                break
            pos = arg.end()
            if index == want:
                group = "d" if arg.group("d") is not None else "s" if arg.group("s") is not None else None
                if group and _named_value(arg.group(group), arg):
                    yield arg.start(group), arg.end(group), "db_password"


# -- the families issue 41 found slipping through: passwords given to a command, Twilio's pair -------------
#
# No public rule set carries the command-line shapes (gitleaks, Kingfisher, detect-secrets and trufflehog
# have none); each is cut from the tool's own documentation of the option, and takes only a literal (never
# $VAR, "$(cat pw.txt)", ${{ secrets.X }}, '$(adminPassword)', an empty '' nor a stand-in).
#   docker login --password-stdin (docs.docker.com, "docker login": "--password-stdin  Take the password
#     from stdin"; podman, buildah, nerdctl, helm registry, oras, skopeo, crane, regctl the same),
#     gh auth login --with-token (cli.github.com: "Read token from standard input"), passwd --stdin;
#   sudo -S / --stdin (sudo(8): "read the password from the standard input instead of using the terminal");
#   ssh-keygen -N new_passphrase / -P old_passphrase (ssh-keygen(1));
#   7z -p{Password} (7-Zip's -p switch: the password glued to it; rar / unrar the same, -p- is "no password");
#   zip / unzip -P password (Info-ZIP zip(1): "THIS IS INSECURE!");
#   keytool / jarsigner -storepass, -keypass, -srcstorepass, -deststorepass, -srckeypass, -destkeypass
#     (keytool docs; -storepass:env VAR and -storepass:file PATH name no password), keytool -new;
#   ConvertTo-SecureString 'PW' -AsPlainText (PowerShell's docs; PSScriptAnalyzer's
#     AvoidUsingConvertToSecureStringWithPlainText rule and sarif-pattern-matcher's SEC101/052
#     ConvertToSecureString test inputs, whose negatives '$(adminPassword)' and "$($x)" are left alone).

# A literal given to an option: quoted (it may hold spaces) or a bare word, 3 characters or more.
_GIVEN = (r"(?P<q>[\"'])?(?P<v>(?(q)[^\"'\n]{3,200}+|(?!-)[^\s\"'`;|&<>()]{3,200}+))"
          r"(?(q)(?P=q)|(?![^\s;|&)]))")
_TEMPLATE = re.compile(r"\$[{(]|\{\{|#\{|%\w+%")
_REPLIES = frozenset({"yes", "true", "false", "none", "null"})


def _given(secret: str, m: re.Match[str]) -> bool:
    """A literal a command line gives (the password itself), not a variable ($PW, "$PW",
    "${{ secrets.X }}", "pre$SUFFIX"), a command or a template ($(cat pw.txt), '$(adminPassword)',
    {{ .Password }}), a stand-in (<password>, ****, password, one repeated character) nor a reply (yes)."""
    if _TEMPLATE.search(secret) or (m.groupdict().get("q") != "'" and re.search(r"\$[A-Za-z_]", secret)):
        return False  # in single quotes $ is a character ('D$oodle3333'), elsewhere a variable
    return _not_stand_in(secret, m) and secret.lower() not in _REPLIES


def _option_value(secret: str, m: re.Match[str]) -> bool:
    """An option's value: a literal, and unquoted one that reads as a password (a digit, a symbol
    or a case change: not the word after an option named in prose, "unzip -P now documented")."""
    return _given(secret, m) and (m.group("q") is not None or _prose_word(secret))


_SSH_KEYGEN = re.compile(r"(?<![\w./-])ssh-keygen(?=[ \t])")


def _command_before(m: re.Match[str]) -> str:
    """The command line before a match, back to the last line break, pipe, ; or & (200 characters at most)."""
    before = m.string[max(0, m.start() - 200):m.start()]
    return before[max(before.rfind(c) for c in "\n|;&") + 1:]


# echo / printf a value into a pipe (printf '%s\n' 'PW' too); the command after the pipe reads it
_ECHOED = (rf"\b(?:echo|printf)(?:[ \t]++-[neE]++)*+(?:[ \t]++(?P<f>[\"'])%s(?:\\n)?(?P=f))?[ \t]++{_GIVEN}"
           r"[ \t]*+\|[ \t]*+")
# the commands that read a password on their standard input: sudo -S (an option cluster holding S,
# after sudo's other options: -u root -S, -kS), a registry login with --password-stdin, gh's
# --with-token, passwd --stdin
_SUDO_S = (r"sudo(?:[ \t]++(?:-[A-RT-Za-z]*[ugpCDhrtUTR][ \t]++(?:'[^'\n]*+'|\"[^\"\n]*+\"|[^\s|;&'\"-][^\s|;&]*+)"
           r"|-[A-RT-Za-z]++(?![^\s])|--(?!stdin)[a-z-]++(?:=[^\s|;&]*+)?(?![^\s]))){0,12}+[ \t]++"
           r"(?:-[A-Za-z]*?S[A-Za-z]*+|--stdin)(?![^\s;|&])")
_LOGIN_STDIN = (r"(?:(?:sudo[ \t]++)?(?:docker|podman|buildah|nerdctl|finch|oras|skopeo|crane"
                r"|(?:helm|regctl)(?:[ \t]++registry)?)[ \t]++login|gh[ \t]++auth[ \t]++login)(?![\w-])"
                r"[^\n|;&<>]{0,200}?[ \t](?:--password-stdin|--with-token)(?![\w-])"
                r"|(?:sudo[ \t]++)?passwd[ \t]++--stdin(?![\w-])")
_STDIN_NEEDLES = ("password-stdin", "with-token", "--stdin", "sudo -")
_SECURE_STRING = ("SecureString", "securestring", "SECURESTRING", "Securestring")
_SWITCH = re.compile(r"(?<![\w-])-(a[a-z]{0,10})(?![\w-])", re.IGNORECASE)


def _plain_text(secret: str, m: re.Match[str]) -> bool:
    """ConvertTo-SecureString given a literal with -AsPlainText (or a prefix of it, -AsPlain,
    -a) on its line, before or after it: without it the string is an encrypted standard string."""
    text, lo, hi = m.string, max(0, m.start() - 200), m.end() + 200  # bounded: linear on one long line
    start, end = text.rfind("\n", lo, m.start()), text.find("\n", m.end(), hi)
    line = (start + 1 if start >= 0 else lo, end if end >= 0 else hi)
    plain = any("asplaintext".startswith(w.group(1).lower()) for w in _SWITCH.finditer(text, *line))
    return plain and _given(secret, m)


_COMMANDS: list[Rule] = [
    # echo 'PW' | sudo -S …, echo PW | docker login -u me --password-stdin
    Rule("cli_password", _lazy(rf"{_ECHOED}(?:{_SUDO_S}|{_LOGIN_STDIN})"), _STDIN_NEEDLES, group="v", check=_given),
    # the same fed by a here-string: sudo -S apt-get update <<< 'PW'
    Rule("cli_password", _lazy(rf"(?:{_SUDO_S}|{_LOGIN_STDIN})[^\n|;&<>]{{0,200}}?<<<[ \t]*+{_GIVEN}"), _STDIN_NEEDLES,
         group="v", check=_given),
    # ssh-keygen -N 'new passphrase' and -P old, both on one command line (not -N '' nor -N "$PASS")
    Rule("cli_password", _lazy(rf"[ \t]-[A-Za-z]*?[NP][ \t]*+{_GIVEN}"), ("ssh-keygen",), group="v",
         check=lambda s, m: _option_value(s, m) and _SSH_KEYGEN.search(_command_before(m)) is not None),
    # 7z x b.7z -pPW, rar a -pPW (a bare -p asks for it, rar's -p- sets none)
    Rule("cli_password", _lazy(
        r"(?<![\w./-])(?:7z[arz]?|rar|unrar)(?=[ \t])[^\n|;&]{0,200}?[ \t]-p(?P<q>[\"'])?"
        r"(?P<v>(?(q)[^\"'\n]{1,200}+|[^\s\"'`;|&<>()-][^\s\"'`;|&<>()]{0,199}+))(?(q)(?P=q)|(?![^\s;|&)]))"),
        ("7z", "rar"), group="v", check=_given),
    # zip -P PW out.zip, unzip -P PW in.zip
    Rule("cli_password", _lazy(rf"(?<![\w./-])(?:zip|unzip|zipcloak)(?=[ \t])[^\n|;&]{{0,200}}?[ \t]-P[ \t]++{_GIVEN}"),
         ("zip",), group="v", check=_option_value),
    # keytool / jarsigner: -storepass PW, -srcstorepass, -deststorepass, -keypass … (not -storepass:env X)
    Rule("cli_password", _lazy(rf"(?<![\w-])-(?:src|dest)?(?:store|key)pass[ \t]++{_GIVEN}"), ("storepass", "keypass"),
         group="v", check=_option_value),
    Rule("cli_password", _lazy(rf"\bkeytool\b[^\n|;&]{{0,300}}?[ \t]-new[ \t]++{_GIVEN}"), ("keytool",), group="v",
         check=_option_value),
    # ConvertTo-SecureString [-String] 'PW' -AsPlainText -Force, in any parameter order, and 'PW' | ConvertTo-…
    # (a quoted string: PowerShell's docs and the rule sets' examples quote it)
    Rule("cli_password", _lazy(
        r"(?i:convertto-securestring)(?:[ \t]++-(?i:a\w*+|f\w*+)(?::\$\w++)?){0,6}+[ \t]++(?:-(?i:st\w*+):?[ \t]*+)?"
        r"(?P<q>[\"'])(?P<v>[^\"'\n]{3,200}+)(?P=q)"), _SECURE_STRING, group="v", check=_plain_text),
    Rule("cli_password", _lazy(r"(?P<q>[\"'])(?P<v>[^\"'\n]{3,200}+)(?P=q)[ \t]*+\|[ \t]*+(?i:convertto-securestring)"),
         _SECURE_STRING, group="v", check=_plain_text),
]

# Twilio: an Account SID (AC and 32 hex: Kingfisher's twilio.1, trufflehog's twilio detector,
# sarif-pattern-matcher's SEC101/018) and the auth token or API key secret given beside an account or
# API key SID (SK…: the core table's twilio_api_key), as Client('AC…', '…') does: 32 letters and
# digits within _TWILIO_WINDOW characters of one (trufflehog pairs a SID with any 32-hex key in the
# text; Kingfisher's twilio.2 asks for "twilio" and a secret word before it, secret_assignment's job).
_vendor("twilio_account_sid", "AC", r"[0-9a-fA-F]{32}",
        check=lambda s, m: not_filler(s) and any(c.isdigit() for c in s) and any(c.isalpha() for c in s))
_TWILIO_ID = re.compile(r"(?:AC|SK)(?<![A-Za-z0-9_]..)[0-9a-fA-F]{32}(?![A-Za-z0-9_])")
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]{32,}+")
_TWILIO_WINDOW = 200


def _twilio_secrets(text: str) -> Iterator[Candidate]:
    """A 32-character token of letters and digits (not filler) near a Twilio account or API key SID."""
    if "AC" not in text and "SK" not in text:
        return
    ids = [m.start() for m in _TWILIO_ID.finditer(text)]
    if not ids:
        return
    for m in _ALNUM_RUN.finditer(text):
        start, end = m.span()
        if (end - start != 32 or text[start - 1:start] in ("_", "+", "/", "=", "-", ".")
                or text[end:end + 1] in ("_", "+", "/", "=", "-")):
            continue
        token = m.group()
        if not (not_filler(token) and any(c.isdigit() for c in token) and any(c.isalpha() for c in token)):
            continue
        k = bisect_right(ids, start)  # the nearest SID before the token and the one after it
        if (k and start - (ids[k - 1] + 34) <= _TWILIO_WINDOW) or (k < len(ids) and ids[k] - end <= _TWILIO_WINDOW):
            yield start, end, "twilio_auth_token"


# -- blocks: Kubernetes secrets, PuTTY keys, headerless PEM bodies -------------------------------

_K8S_KIND = re.compile(r"(?im)^[ \t]*kind:[ \t]*[\"']?secret[\"']?[ \t]*$")
_K8S_DATA = re.compile(r"(?m)^([ \t]*)(?:data|stringData):[ \t]*$")
_K8S_VALUE = re.compile(
    r"(?m)^[ \t]++[\w.-]++:[ \t]*+(?:[|>][-+]?[ \t]*\r?\n[ \t]++)?[\"']?(?P<v>[A-Za-z0-9+/]{8,}+={0,3}+)[\"']?[ \t]*$")
_PUTTY = re.compile(r"PuTTY-User-Key-File-\d[^\n]*+(?:\n(?!\n)[^\n]*+){0,60}?(?:\nPrivate-MAC:[^\n]*+|(?=\n\n)|\Z)")
_B64_LINE = r"[A-Za-z0-9+/]{60,80}"
_KEY_BLOCK = re.compile(rf"(?m)^[ \t]*{_B64_LINE}\r?\n(?:[ \t]*{_B64_LINE}\r?\n){{2,}}+[ \t]*[A-Za-z0-9+/]{{4,80}}={{0,2}}$")
# What a file in base64 begins with when it is an image, a document or an archive, not a key:
# PNG, JPEG, GIF, WebP / WAV (RIFF), PDF, ZIP, gzip, BMP, ICO.
_FILE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"%PDF", b"PK\x03\x04", b"\x1f\x8b", b"BM", b"\0\0\1\0")


def _a_file(block: str) -> bool:
    """A base64 block that decodes to a file's signature (lines added in a diff: without their +);
    one after a data: URI's ;base64, is a file whatever it holds."""
    lines = block.split()
    if all(line.startswith("+") for line in lines):
        lines = [line[1:] for line in lines]
    return _b64_head("".join(lines)).startswith(_FILE_MAGIC)


def _blocks(text: str) -> Iterator[Candidate]:
    if "ecret" in text and "ata:" in text and _K8S_KIND.search(text):
        for data in _K8S_DATA.finditer(text):
            indent = len(data.group(1))
            pos = data.end()
            for m in _K8S_VALUE.finditer(text, pos):
                # stop at the first line indented no deeper than "data:"
                between = text[pos:m.start()]
                if re.search(rf"(?m)^[ \t]{{0,{indent}}}\S", between[1:] if between.startswith("\n") else between):
                    break
                if not_filler(m.group("v")):
                    yield m.start("v"), m.end("v"), "kubernetes_secret"
                pos = m.end()
    if "PuTTY-User-Key-File-" in text:
        for m in _PUTTY.finditer(text):
            yield m.start(), m.end(), "private_key"
    if "\n" in text:
        for m in _KEY_BLOCK.finditer(text):
            body = m.group(0)
            before = text[max(0, m.start() - 80):m.start()]
            if "-----" not in before and not before.rstrip().endswith(";base64,") and _mixed(body) and not _a_file(body):
                yield m.start() + len(body) - len(body.lstrip()), m.end(), "private_key"


# -- high entropy -------------------------------------------------------------------------------

_ENTROPY_CANDIDATE = re.compile(r"[A-Za-z0-9+/_-]{32,}+={0,2}+")
_ENTROPY_EDGE = frozenset("~.%@:=")
_WORD_PART = re.compile(r"(?:^|[-_/])[A-Za-z][a-z]{2,}(?:[A-Z][a-z]{2,})*+(?=[-_/]|$)")
_HEXISH = re.compile(r"[0-9a-fA-F-]++")
_LABEL = re.compile(
    r"(?i:sha-?\d*|md5|integrity|hash|checksum|digest|etag|nonce|salt|iv|ssh-(?:rsa|ed25519|dss)|ecdsa-sha2-\w+|"
    r"public[_ -]?(?:keys?|token)|pubkey|blob|data|image|base64|fingerprint|commit|revision|rev|oid|signature|sig|id|uuid|"
    r"guid|ref|cid|multihash)[\"']?\s*[:=,(\-]?\s*[\"']?$")


_RUNS = re.compile(r"[A-Z]++|[a-z]++|[0-9]++|[^A-Za-z0-9]++")


def _classes(token: str) -> int:
    """Switches between character classes (upper, lower, digit, other) along the token."""
    return len(_RUNS.findall(token)) - 1


def _entropy(token: str) -> float:
    """Shannon entropy in bits per character."""
    n = len(token)
    return -sum(k / n * math.log2(k / n) for k in Counter(token).values())


def _decodes_to_text(token: str) -> bool:
    """Base64 (standard or URL-safe) of ordinary text: most bytes printable ASCII."""
    body = token.rstrip("=")
    if len(body) < 16:
        return False
    body = body.replace("-", "+").replace("_", "/")
    try:
        data = binascii.a2b_base64(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return False
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in data)
    return printable >= 0.9 * len(data)


# An env file's assignment, NAME=value (at a line's start or after a space): any name may hold
# a secret there (mimi=gX69YO4…), unlike a query string's "=" (?state=, &sig=) or a digest's
# (sha256=, labelled: _LABEL).
_ENV_ASSIGNMENT = re.compile(r"(?:^|(?<=\s))[A-Za-z_][A-Za-z0-9_]{0,63}+=$")


def _env_value(text: str, start: int) -> bool:
    return text[start - 1] == "=" and _ENV_ASSIGNMENT.search(text, max(0, start - 65), start) is not None


def _high_entropy(text: str) -> Iterator[Candidate]:
    for m in _ENTROPY_CANDIDATE.finditer(text):
        token = m.group(0)
        start, end = m.span()
        if (len(token) > 130 or _HEXISH.fullmatch(token) or token.startswith(("pk_", "pub_"))
                or (start and text[start - 1] in _ENTROPY_EDGE and not _env_value(text, start))
                or text[end : end + 1] in _ENTROPY_EDGE):
            continue  # data, commit hashes, digests, UUIDs, publishable keys, part of a longer run
        if (sum(map(str.isdigit, token)) < 2 or sum(map(str.isupper, token)) < 2
                or sum(map(str.islower, token)) < 2):
            continue
        if _classes(token) < 0.45 * (len(token) - 1) or len(_WORD_PART.findall(token)) >= 2:
            continue  # identifiers, paths, words: long runs of one class, or word-parts
        if _entropy(token) < (4.0 if len(token) < 48 else 4.4):
            continue
        line_start = text.rfind("\n", 0, start) + 1
        before = text[max(line_start, start - 48):start]
        chunk = before[before.rfind(" ") + 1:]
        if "://" in chunk or chunk.endswith(("/", "?", "#")) or _LABEL.search(before):
            continue  # inside a URL, or a labelled digest / key / id
        if _decodes_to_text(token):
            continue
        yield start, end, "high_entropy_string"


# -- the search ---------------------------------------------------------------------------------

def _span(match: re.Match[str], group: int | str) -> tuple[int, int]:
    return match.span(group)


def _hits(rule: Rule, text: str) -> Iterator[Candidate]:
    """Where ``rule`` matches ``text`` and its check takes the secret."""
    for m in rule.regex.finditer(text):
        start, end = _span(m, rule.group)
        secret = text[start:end]
        if secret and (rule.check is None or rule.check(secret, m)):
            yield start, end, rule.kind


def find(text: str) -> list[Candidate]:
    """Every candidate secret these tables find in text, overlapping ones included (the caller
    resolves overlaps together with cybmem.store.secrets's core table)."""
    out: list[Candidate] = []
    for rule in (*_V, *_CLI, *_FAMILIES, *_COMMANDS):
        needles = rule.needles
        # one needle (most rules): a plain test, without a generator per rule and text
        if (needles[0] not in text) if len(needles) == 1 else not any(n in text for n in needles):
            continue
        out.extend(_hits(rule, text))
    low = text.lower()
    met = {rule for gate in _LOWER_GATES if gate in low for n, rule in _LOWER_NEEDLES[gate] if n in low}
    if met:  # rare: most texts meet no gate
        for rule in _FAMILIES_LOWER:  # in the table's order, as the rules above
            if rule in met:
                out.extend(_hits(rule, text))
    out.extend(_blocks(text))
    # a marker is never a value: redacting it again would keep redact from settling
    if met and "password" in low:
        out.extend(_reversed_prose(text))
    out.extend(c for c in (*_cookies(text), *_key_material(text), *_connect_calls(text), *_twilio_secrets(text))
               if "[REDACTED:" not in text[c[0]:c[1]])
    out.extend(_high_entropy(text))
    return out
