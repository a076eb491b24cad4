import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cybmem.store.secrets import Finding, redact, scan

CORPUS_PATH = Path(__file__).resolve().parents[2] / "data-fixtures" / "redaction-corpus.jsonl"
CORPUS = [json.loads(line) for line in CORPUS_PATH.read_text(encoding="utf-8").splitlines()]
SECRETS = [row for row in CORPUS if row["secret"]]
LOOKALIKES = [row for row in CORPUS if not row["secret"]]

# Fake secrets in the real shapes (none of these is a live credential).
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GHP = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GH_PAT = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF"
GLPAT = "glpat-xxxxXXXX1234yyyyZZZZ"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
OPENAI = "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKL"
OPENAI_PROJ = "sk-proj-AbCdEf1234567890GhIjKlMnOp_qrstuv-WXyz"
ANTHROPIC = "sk-ant-api03-AbCdEf1234567890GhIjKlMnOp_qrstuv-WXyz"
GOOGLE = "AIzaSyA1234567890abcdefghijklmnopqrstuv"
STRIPE = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcDEF123_-xyz"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nabc+/==\n-----END RSA PRIVATE KEY-----"


def R(kind):
    return f"[REDACTED:{kind}]"


POSITIVE = [
    ("aws_access_key_id", f"key {AWS_ID} here", f"key {R('aws_access_key_id')} here"),
    ("aws_access_key_id", "ASIAY34FZKBOKMUTVV7A,", f"{R('aws_access_key_id')},"),
    ("aws_secret_access_key", f"aws_secret_access_key = {AWS_SECRET}", f"aws_secret_access_key = {R('aws_secret_access_key')}"),
    ("aws_secret_access_key", f'AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"', f'AWS_SECRET_ACCESS_KEY="{R("aws_secret_access_key")}"'),
    ("github_token", f"token {GHP}.", f"token {R('github_token')}."),
    ("github_token", f"use {GH_PAT}", f"use {R('github_token')}"),
    ("gitlab_token", f"GITLAB={GLPAT}", f"GITLAB={R('gitlab_token')}"),
    ("slack_token", f"slack: {SLACK}", f"slack: {R('slack_token')}"),
    ("openai_key", f"OPENAI_API_KEY={OPENAI}", f"OPENAI_API_KEY={R('openai_key')}"),
    ("openai_key", f"key {OPENAI_PROJ}", f"key {R('openai_key')}"),
    ("anthropic_key", f"key {ANTHROPIC}", f"key {R('anthropic_key')}"),
    ("google_api_key", f"?key={GOOGLE}&x=1", f"?key={R('google_api_key')}&x=1"),
    ("stripe_key", f"stripe {STRIPE}", f"stripe {R('stripe_key')}"),
    ("stripe_key", "rk_test_51HxYzAbCdEf", f"{R('stripe_key')}"),
    ("jwt", f"cookie={JWT};", f"cookie={R('jwt')};"),
    ("jwt", f"Authorization: Bearer {JWT}", f"Authorization: Bearer {R('jwt')}"),
    ("private_key", f"key:\n{PEM}\nafter", f"key:\n{R('private_key')}\nafter"),
    (
        "private_key",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAA\nThe rest of the text.",
        f"{R('private_key')}\nThe rest of the text.",
    ),
    ("bearer_token", "Authorization: Bearer abc123def456ghi789jkl", f"Authorization: Bearer {R('bearer_token')}"),
    ("bearer_token", "curl -H 'Authorization: bearer AbCdEfGhIjKlMnOpQrStUv'", f"curl -H 'Authorization: bearer {R('bearer_token')}'"),
    ("basic_auth", "Authorization: Basic dXNlcjpwYXNzd29yZA==", f"Authorization: Basic {R('basic_auth')}"),
    ("url_password", "postgres://admin:s3cr3tP4ss@db.example.com:5432/app", f"postgres://admin:{R('url_password')}@db.example.com:5432/app"),
    ("url_password", "redis://:hunter22@cache:6379", f"redis://:{R('url_password')}@cache:6379"),
    ("secret_assignment", 'password="hunter2hunter2"', f'password="{R("secret_assignment")}"'),
    ("secret_assignment", "DB_PASSWORD=hunter2hunter2", f"DB_PASSWORD={R('secret_assignment')}"),
    ("secret_assignment", "passwd: correcthorse", f"passwd: {R('secret_assignment')}"),
    ("secret_assignment", "api_key: abcdef123456", f"api_key: {R('secret_assignment')}"),
    ("secret_assignment", '{"client_secret": "x9y8z7w6v5"}', f'{{"client_secret": "{R("secret_assignment")}"}}'),
    ("secret_assignment", "SECRET_KEY = 'django-insecure-abc123'", f"SECRET_KEY = '{R('secret_assignment')}'"),
    ("secret_assignment", "?token=abcdef123456&page=2", f"?token={R('secret_assignment')}&page=2"),
]


@pytest.mark.parametrize("kind, text, expected", POSITIVE)
def test_positive(kind, text, expected):
    assert redact(text) == (expected, [kind])


NEGATIVE = [
    ("aws_access_key_id", "AKIA is the prefix of AWS access key ids"),
    ("aws_access_key_id", "AKIAIOSFODNN7EXAMPL"),  # 15 after the prefix
    ("aws_access_key_id", "XAKIAIOSFODNN7EXAMPLE"),  # part of a longer word
    ("aws_secret_access_key", "aws_secret_access_key = <your key here>"),
    ("github_token", "ghp_short123"),
    ("github_token", "the gh_pages branch"),
    ("gitlab_token", "glpat-short"),
    ("slack_token", "xoxo-hugs-and-kisses-for-everyone"),
    ("openai_key", "sk-fix-the-login-page-redirect-bug"),
    ("openai_key", "risk-assessment-framework-0123456789"),
    ("google_api_key", "AIza is a prefix"),
    ("stripe_key", "pk_live_4eC39HqLyjWDarjtT1zdp7dc"),  # publishable, not secret
    ("jwt", "eyJ is how base64 JSON starts; a.b.c"),
    ("private_key", "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"),
    ("private_key", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"),
    ("bearer_token", "the bearer of bad news arrived yesterday"),
    ("bearer_token", "Bearer authentication is configured"),
    ("basic_auth", "Authorization: Basic"),
    ("basic_auth", "basic auth is used for the admin page"),
    ("url_password", "https://user@host.com/x"),
    ("url_password", "http://localhost:8080/path"),
    ("url_password", "postgres://user:${DB_PASS}@db/app"),
    ("secret_assignment", "the password is stored in vault"),
    ("secret_assignment", "password:"),
    ("secret_assignment", "password: short"),
    ("secret_assignment", "token = request.headers.get('x')"),
    ("secret_assignment", "password = os.environ['PW']"),
    ("secret_assignment", "password = settings.DB_PASSWORD"),
    ("secret_assignment", "api_key: SecretStr"),
    ("secret_assignment", "token: ${{ secrets.GITHUB_TOKEN }}"),
    ("secret_assignment", "password=<your-password>"),
    ("secret_assignment", "password: ********"),
    ("secret_assignment", "max_tokens: 15000000"),
    ("secret_assignment", "token_count = 12345678"),
    ("git sha", "commit 3f2a9c1e4b5d6a7f8e9d0c1b2a3f4e5d6c7b8a9f"),
    ("uuid", "run 550e8400-e29b-41d4-a716-446655440000"),
    ("prose", "Fixed the flaky login test; see PR #42 and docs/auth.md."),
]


@pytest.mark.parametrize("kind, text", NEGATIVE)
def test_near_miss_is_left_alone(kind, text):
    assert redact(text) == (text, [])
    assert scan(text) == []


def test_scan_spans():
    text = f"a {AWS_ID} b {GHP}"
    findings = scan(text)
    assert findings == [
        Finding("aws_access_key_id", 2, 2 + len(AWS_ID)),
        Finding("github_token", text.index(GHP), len(text)),
    ]
    assert [text[f.start : f.end] for f in findings] == [AWS_ID, GHP]


def test_specific_kind_wins_over_generic():
    assert redact(f"token={GHP}") == (f"token={R('github_token')}", ["github_token"])
    assert redact(f"Authorization: Bearer {GHP}") == (f"Authorization: Bearer {R('github_token')}", ["github_token"])


def test_several_kinds_sorted_unique():
    text = f"{GHP} {AWS_ID} {GHP} password=hunter2hunter2"
    out, kinds = redact(text)
    assert kinds == ["aws_access_key_id", "github_token", "secret_assignment"]
    assert out == f"{R('github_token')} {R('aws_access_key_id')} {R('github_token')} password={R('secret_assignment')}"


def test_empty():
    assert redact("") == ("", [])
    assert scan("") == []


@pytest.mark.parametrize("text, _", [(t, k) for k, t, _ in POSITIVE] + [(t, k) for k, t in NEGATIVE])
def test_idempotent_examples(text, _):
    once, _ = redact(text)
    assert redact(once) == (once, [])


FRAGMENTS = st.sampled_from(
    [AWS_ID, AWS_SECRET, GHP, GH_PAT, GLPAT, SLACK, OPENAI, OPENAI_PROJ, ANTHROPIC, GOOGLE, STRIPE, JWT, PEM,
     "-----BEGIN PRIVATE KEY-----\nAAAA", "-----END PRIVATE KEY-----", "aws_secret_access_key=", "password=",
     "token: ", "api_key=", "'", '"', "Bearer ", "Authorization: Basic ", "https://u:", "@host", "://", ":",
     "[REDACTED:jwt]", "[REDACTED:", "]", " ", "\n", "\r\n", "=", "hunter2hunter2", "abc123def456ghi789",
     "-----BEGIN RSA PRIVATE KEY----- ", "\\n", "MIIEowIBAAKCAQEA7", "aws ", "[REDACTED:aws_access_key_id]",
     "DB_PASSWORD=", "_PASS=", "dbPassword: ", "--password ", "curl -u a:", "<password>", "</password>",
     "Authorization: Token ", "AccountKey=", "?sig=", "hooks.slack.com/services/T0ABCDEFGH/", "npm_", "hf_",
     "hunter2", "p@ss", "pa/ss", "${X}", "/", "@", "changeme", "SORT_KEY=", "1234567890:AA", "_auth=",
     '"auth": "', "machine a.example login u password ", "X-Amz-Signature=", "Ym9iOmh1bnRlcjJ"]
)
# Every code point, lone surrogates and controls included.
RAW = st.text(alphabet=st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs", "Cc"])), max_size=20)
MIXED = st.lists(st.one_of(FRAGMENTS, RAW), max_size=12).map("".join)


@settings(deadline=None, max_examples=200)
@given(MIXED)
def test_idempotent(text):
    once, kinds = redact(text)
    assert redact(once) == (once, [])
    assert kinds == sorted(set(kinds))


@settings(deadline=None, max_examples=200)
@given(MIXED)
def test_scan_findings_are_disjoint_and_in_bounds(text):
    last = 0
    for f in scan(text):
        assert last <= f.start < f.end <= len(text)
        last = f.end


WORDS = st.lists(st.from_regex(r"[A-Za-z]{1,12}[.,]?", fullmatch=True), max_size=40).map(" ".join)


@settings(deadline=None, max_examples=200)
@given(WORDS)
def test_plain_prose_is_never_redacted(text):
    assert redact(text) == (text, [])


# -- the corpus: data-fixtures/redaction-corpus.jsonl --------------------------------------


def test_corpus_shape():
    assert len({row["note"] for row in SECRETS}) == len(SECRETS) >= 40  # distinct secret shapes
    assert len(LOOKALIKES) >= len(SECRETS)
    for row in CORPUS:
        assert set(row) >= {"text", "secret", "kind", "note"}
        assert (row["kind"] is not None) == row["secret"]


@pytest.mark.parametrize("row", SECRETS, ids=lambda row: row["note"])
def test_corpus_secret_is_redacted(row):
    out, kinds = redact(row["text"])
    assert (out, kinds) == (row["redacted"], [row["kind"]])
    assert row["value"] not in out
    start = row["text"].index(row["value"])
    assert scan(row["text"]) == [Finding(row["kind"], start, start + len(row["value"]))]


@pytest.mark.parametrize("row", LOOKALIKES, ids=lambda row: row["note"])
def test_corpus_lookalike_is_left_alone(row):
    assert redact(row["text"]) == (row["text"], [])


@pytest.mark.parametrize("row", CORPUS, ids=lambda row: row["note"])
def test_corpus_idempotent(row):
    once, _ = redact(row["text"])
    assert redact(once) == (once, [])


# -- rules that need more than one line to show ----------------------------------------------

BARE_AWS_SECRET = "Zq8Lm2Xv9Pw4Rt7Yu1Io3Kj6Hg5Fd0Sa/Ce+Bn2M"


def test_bare_aws_secret_needs_evidence_nearby():
    near = f"aws deploy user, secret {BARE_AWS_SECRET}"
    assert redact(near) == ("aws deploy user, secret [REDACTED:aws_secret_access_key]", ["aws_secret_access_key"])
    # Far from AWS evidence it is not called an AWS key; it is still a random 40-character
    # string, which the high-entropy rule (cybmem.store.secret_shapes) takes.
    far = "aws deploy user" + " filler" * 60 + f" secret {BARE_AWS_SECRET}"
    assert redact(far) == (far.replace(BARE_AWS_SECRET, "[REDACTED:high_entropy_string]"), ["high_entropy_string"])
    assert redact(f"secret {BARE_AWS_SECRET}") == ("secret [REDACTED:high_entropy_string]", ["high_entropy_string"])


def test_redaction_marker_is_not_aws_evidence():
    # Each pass would otherwise reach one window further from the last marker.
    text = f"{AWS_ID} " + " ".join([BARE_AWS_SECRET] * 40)
    once, _ = redact(text)
    assert redact(once) == (once, [])
    assert once.count("[REDACTED:aws_secret_access_key]") < 40


@pytest.mark.parametrize(
    "text, expected",
    [
        ("-----BEGIN RSA PRIVATE KEY----- MIIEow1 Zm9v+/ abc==", "[REDACTED:private_key]"),
        ("-----BEGIN RSA PRIVATE KEY----- MIIEow1 Zm9v and then the prose", "[REDACTED:private_key] and then the prose"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow1\n\nZm9v2\nThe end", "[REDACTED:private_key]\nThe end"),
        ('"-----BEGIN PRIVATE KEY-----\\nMIIEow1\\nZm9v2\\n"', '"[REDACTED:private_key]\\n"'),
    ],
)
def test_truncated_private_key_body_never_survives(text, expected):
    assert redact(text) == (expected, ["private_key"])


def test_url_password_is_not_a_port():
    assert redact("mysql://root:pa/ss@db") == ("mysql://root:[REDACTED:url_password]@db", ["url_password"])
    for text in ("http://localhost:4873/@babel/core", "http://host:8080/a/b@c"):
        assert redact(text) == (text, [])


# -- linear time on adversarial input ------------------------------------------------------

N = 50_000
ADVERSARIAL = {
    "password=": "password=" * N,
    "DB_PASSWORD=x ": "DB_PASSWORD=x " * N,
    "a_KEY=": "a_KEY=" * N,
    "long key": "a_" * N + "KEY=abc",
    "x://a:": "x://a:" * N,
    "x://a:a@": "x://a:" + "a@" * N,
    "collapsed BEGIN": "-----BEGIN RSA PRIVATE KEY----- " * N,
    "collapsed chunks": "-----BEGIN RSA PRIVATE KEY-----" + " AAAA" * N,
    "escaped chunks": "-----BEGIN PRIVATE KEY-----" + "\\nAAAA" * N,
    "PEM headers": "-----BEGIN PRIVATE KEY-----\n" + "Proc-Type: " * N,
    "aws candidates": "aws " + ("A" * 39 + "1 ") * (N // 4),
    "aws near key ids": AWS_ID + " " + (AWS_SECRET + " ") * (N // 8),
    "slack webhook": "hooks.slack.com/services/T" * N,
    "discord webhook": "discord.com/api/webhooks/" * N,
    "npm_": "npm_" * N,
    "hf_": "hf_" * N,
    "curl -u": "curl " + "-u a:" * N,
    "curl -u values": "curl " + "-u a:bbbb " * N,
    "Basic values": "Authorization: " + "Basic dXNlcjpwYXNz " * N,
    "aws secrets": "aws " + (BARE_AWS_SECRET + " ") * (N // 8),
    "--password": "--password " * N,
    "--a-": "--" + "a-" * N,
    "Token": "Authorization: " + "Token " * N,
    "sig=": "?sig=" * N,
    "AccountKey=": "AccountKey=" * N,
    "telegram": "1234567890:AA" * N,
    "quotes": 'password="' * N,
    "xml": "<password>" * N,
    "netrc": "machine a.example login u " * N,
    "X-Amz-Signature": "X-Amz-Signature=" * N,
    "long value": "password=" + "a" * (10 * N) + "(",
    # Checks on one long value (a nested quantifier once made the type-name check exponential).
    "upper-case run value": "password: " + "A" * (2 * N) + "a!",
    "base64 value": "authorizationToken: " + "QVdTOmV5SndZWGxzYjJKJFHDSFKJHERWUY65IOU36" * (N // 20),
    "snake value": "token = " + "a_" * N + "A",
    "dotted value": "token=" + "a." * N + "!",
    "digits": "1" * (10 * N) + ":AA",
    # round 6's shapes: a password named after it, a user and pass on one line, a value in
    # brackets, a session dict key, a connection string's list, a URL password with "@" and "#"
    "is the password": "x1Y is the password " * N,
    "user pass": "user: a pass: " * N,
    "password (": "password (" * N,
    "session dict": "'sessionid': '" * N,
    "connection list": "Server=a;Password=" * N,
    "url @#": "x://:a@#" * N,
    "password for": "password for a b: " * N,
    # a token cut in parts: every line a part that might start or end one (each run checked once)
    "cut parts": "Ab12cd34EF\n" * N,
    "cut ghp_ parts": "ghp_Ab12\n" * N,
    "cut escaped parts": "ghp_Ab12\\r\\n" * N,
    # issue 41's shapes: sudo's options after many sudos, echoes into a pipe, here-strings, the
    # command-line options, -AsPlainText looked for around each ConvertTo-SecureString, Twilio SIDs
    # among 32-character tokens
    "sudo -u": "sudo -u " * N,
    "echo | sudo": "echo abcd | sudo " * N,
    "here-strings": "sudo -S x " + "<<< " * N,
    "docker login": "docker login " * N,
    "ssh-keygen -N": "ssh-keygen -N " * N,
    "7z -p": "7z " + "-pab " * N,
    "zip -P": "zip " + "-P ab " * N,
    "-storepass": "-storepass " * N,
    "ConvertTo-SecureString": "ConvertTo-SecureString 'abc' -a " * N,
    "piped to ConvertTo-SecureString": "'abc' | " * N + "ConvertTo-SecureString",
    "twilio": ("AC" + "0123456789abcdef" * 2 + " " + "a1b2c3d4" * 4 + " ") * (N // 20),
    # and its decoded copies: invisible characters everywhere, base64 runs that decode to text
    "zero width": "ab\u200b" * N,
    "base64 of text": "aGVsbG8gd29ybGQh " * N,
    "one base64 run": "aGVsbG8g" * N,
}


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_input_is_linear(text):
    start = time.perf_counter()
    once, _ = redact(text)
    redact(once)
    # quadratic behaviour takes minutes here; the slowest shape takes 4 s on a quiet machine and took
    # over 10 on a loaded one (the full suite on two workers beside other jobs)
    assert time.perf_counter() - start < 30
