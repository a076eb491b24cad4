"""The core table of secret shapes, the first :func:`cybmem.store.secrets.scan` runs: keys with a
distinctive prefix (cloud, VCS and API tokens), private keys, JWTs, credentials in URLs and
headers, and secrets assigned to a name that says so (``password =``, ``--db-password``, YAML,
XML, .netrc), each with the check that keeps its look-alikes (placeholders, type names, shell
references, identifiers) out. The order of :data:`SHAPES` breaks ties between overlapping
findings (the more specific shape first). :mod:`cybmem.store.secret_shapes` adds the rest; the
kinds: docs/secrets.md.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass

from .secret_shapes import bounded as _bounded

__all__ = ["SHAPES", "Shape"]

_NOT_MARK = r"(?!\[REDACTED:)"  # a value never starts at a marker: keeps redact idempotent


@dataclass(frozen=True)
class Shape:
    """A secret shape: the regex, which group is the secret (0: all; a tuple: the first that
    took part), an optional check and optional needles (skip the regex unless one occurs)."""

    kind: str
    regex: re.Pattern[str]
    group: int | str | tuple[str, ...] = 0
    check: Callable[[str, re.Match[str]], bool] | None = None
    needles: tuple[str, ...] = ()


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


def _mixed_case(secret: str, _: re.Match[str]) -> bool:
    """Generated tokens mix upper and lower case (hf_hub_download does not)."""
    return any(c.isupper() for c in secret) and any(c.islower() for c in secret)


_HEX32 = re.compile(r"[0-9a-fA-F]{32}")


def _hex_mix(secret: str, _: re.Match[str]) -> bool:
    """A random 32-hex body has both digits and letters."""
    body = _HEX32.search(secret).group()
    return any(c.isdigit() for c in body) and any(c.isalpha() for c in body)


_AWS_WINDOW = 256
# A redaction marker ([REDACTED:aws_…]) is not evidence: it would let each redact pass reach
# one window further than the last, and redact would never settle.
_AWS_EVIDENCE = re.compile(
    r"(?:AKIA|ASIA)[A-Z0-9]{16}|(?<![A-Za-z])(?<!\[REDACTED:)[Aa][Ww][Ss](?![a-z])"
)


_AWS_LABEL = re.compile(r"(?i:secret_?access_?key|aws_?secret(?:_?key)?)[\"']?\s*[:=]\s*[\"']?$")
_CAMEL_WORD = re.compile(r"[A-Z][a-z]{5}")


def _camel_words(value: str) -> bool:
    """Two or more Capitalised 6-letter runs read as words (S3AccessPointAttachments); a random
    base64 string of 40 characters has two about 1% of the time."""
    return len(_CAMEL_WORD.findall(value)) >= 2


def _aws_secret_like(secret: str, match: re.Match[str]) -> bool:
    """Mixed case, a digit and a non-hex letter, with AWS evidence within _AWS_WINDOW chars;
    without a secret-access-key label, also not words (an IAM policy name such as
    AmazonRoute53RecoveryReadinessFullAccess, a URL path) and not mostly hex (30 of 40
    characters: an id; random base64 has about 14)."""
    if not (
        any(c.isupper() for c in secret)
        and any(c.islower() for c in secret)
        and any(c.isdigit() for c in secret)
        and re.search(r"[g-zG-Z/+]", secret)
    ):
        return False
    start, end = match.span()
    labelled = _AWS_LABEL.search(match.string, max(0, start - 40), start) is not None
    if not labelled and (
        _camel_words(secret)
        or _WORDY.search(secret)  # a URL path: Route53/latest/DeveloperGuide/domain
        or sum(c in string.hexdigits for c in secret) >= 30  # a hex id with a suffix
    ):
        return False
    lo, hi = max(0, start - _AWS_WINDOW), end + _AWS_WINDOW
    return _AWS_EVIDENCE.search(match.string, lo, hi) is not None


def _not_placeholder(secret: str, _: re.Match[str]) -> bool:
    """Skip ${VAR}, <password>, **** and similar stand-ins."""
    return not _placeholder(secret)


def _url_password(secret: str, match: re.Match[str]) -> bool:
    """Skip stand-ins and a port mistaken for a password (http://host:8080/@scope/pkg,
    http://localhost:3000?next=a@b)."""
    return not (_placeholder(secret) or re.match(r"\d+(?:[/?#]|$)", secret))


def _after_authorization(secret: str, match: re.Match[str]) -> bool:
    """The scheme word follows an Authorization header name."""
    start = match.start()
    return _AUTH_HEADER.search(match.string[max(0, start - 40) : start]) is not None


_AUTH_HEADER = re.compile(r"(?i:authorization)[\"']?\s*[:=]\s*[\"']?(?i:api-)?$")


def _bearer(secret: str, match: re.Match[str]) -> bool:
    """Bearer anywhere; Token only as an Authorization scheme. Either way an opaque token."""
    if match.group("scheme")[0] in "Tt" and not _after_authorization(secret, match):
        return False
    return _token_like(secret, match)


def _curl_user(secret: str, match: re.Match[str]) -> bool:
    """curl -u user:pass, not docker -u 1000:1000 or chown-like user:group."""
    start = match.start()
    before = match.string[max(0, start - 600) : start]  # bounded: linear on one long line
    # the curl command's line, and the lines it continues onto with a trailing backslash
    command = before[before.rfind("\n") + 1 :]
    lines = before.split("\n")[:-1]
    while lines and lines[-1].rstrip().endswith("\\"):
        command = lines.pop() + command
    if "curl" not in command:
        return False
    user = match.string[match.start() : match.start(1)].split()[-1].strip("\"':")
    bare = secret.strip("<>[]'\"").lower()
    return not (_placeholder(secret) or secret.isdigit() or bare in _STAND_IN_PASSWORDS
                or bare == user.strip("<>[]").lower())


_STAND_IN_PASSWORDS = frozenset({"pass", "password", "passwd", "token", "test", "secret", "changeit", "pwd"})
_FILLER = re.compile(r"(.)\1{15}|x{5}|X{5}|0{8}|#{4}|\*{4}")


def _filler(value: str) -> bool:
    """A run of 16 equal characters, xxxxx, 00000000, **** or ####: a stand-in (glpat-XXXX…,
    hvs.xxxx…)."""
    return bool(_FILLER.search(value))


_PLACEHOLDER = re.compile(
    r"\$[{(A-Za-z_0-9]|[<{\[:%]|![A-Za-z]+$|#[0-9a-fA-F]{3,8}$|(?i:your)(?![a-z])|(?i:[a-z]*fake)"
)
_MASKED = re.compile(r"\.\.\.|…|\*\*\*|%[sdr]")  # also printf templates: '%s:%s'


def _placeholder(value: str) -> bool:
    """${X}, <password>, {{x}}, {0}, %(pw)s, %PASSWORD%, [hidden], :term:, !vault, #d8dee9,
    your_token, xxxxxxxx, masked values a tool printed (sk-...abcd, ****abcd) and templates."""
    return bool(_PLACEHOLDER.match(value) or _MASKED.search(value)) or len(set(value)) == 1 or _filler(value)


# -- secret_assignment ---------------------------------------------------------------------

# A key ends with one of these words; after the _KEY_WORDS the value must be longer (below).
_WORDS = ("password", "passwd", "passphrase", "pwd", "pw", "pass", "secret", "token", "credentials",
          "creds", "private", "key", "apikey", "auth", "key_base", "signature")
_KEY_WORDS = frozenset({"key", "apikey", "auth", "key_base", "signature"})  # SECRET_KEY_BASE
# Words that are a key on their own; the others only end a compound key (DB_PASS, X_PRIVATE).
_BARE_WORDS = frozenset({"password", "passwd", "passphrase", "pwd", "secret", "token", "creds",
                         "credentials", "apikey"})  # fmt: skip
# Words long enough to end a key glued on without a separator (PGPASSWORD, csrftoken).
_GLUED_WORDS = _BARE_WORDS - {"pwd"}
# <prefix>_KEY names a secret...
_SECRET_KEY_PREFIXES = frozenset({
    "api", "secret", "private", "access", "signing", "sign", "encryption", "encrypt",
    "decryption", "enc", "master", "client", "app", "account", "storage", "shared", "license",
    "licence", "webhook", "hmac", "session", "auth", "consumer", "subscription", "service",
    "crypto", "jwt", "admin", "deploy", "vault", "cipher", "aes",
})  # fmt: skip
# ...or, for *_KEY and *_TOKEN, names something that is not one, whatever the value looks like:
# database and cache keys, AWS idempotency and pagination tokens (ChangeToken, NextToken).
_PLAIN_PREFIXES = frozenset({
    "public", "pub", "publishable", "primary", "foreign", "sort", "partition", "cache",
    "routing", "idempotency", "dedup", "dedupe", "unique", "lookup", "object", "row", "shard",
    "range", "hash", "index", "group", "order", "cursor", "map", "dict", "composite", "gpg",
    "pgp", "cluster", "distribution", "socket", "websocket", "result", "limit", "more", "input",
    "output", "next", "page", "forward", "backward", "continuation", "pagination", "starting",
    "sync", "change", "creation", "client", "request", "action", "sequence", "marker",
    "cancellation", "resumption", "lock", "update", "s3", "bucket",
})  # fmt: skip
_LITERALS = frozenset({
    "none", "null", "nil", "true", "false", "undefined", "required", "optional", "redacted",
    "yes", "no", "on", "off", "enabled", "disabled", "empty", "unset", "hidden", "masked",
    "include", "omit", "same-origin", "seconds", "minutes", "hours", "days",
    # GitHub Actions permissions (permissions: id-token: write)
    "read", "write", "read-all", "write-all",
    # code, not a value: password = await ..., token = yield ...
    "await", "async", "new", "yield", "lambda", "function", "return", "this", "self", "typeof",
})  # fmt: skip
_TYPE_WORDS = frozenset({"str", "bytes", "string", "number", "any", "unknown", "object", "text",
                         "int", "bool", "boolean", "varchar"})  # fmt: skip
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_TYPE_NAME = re.compile(r"[A-Z][A-Za-z]*(?:=.*)?")  # SecretStr, Token=None
# PKCS7PrivateKeyTypes: words and acronyms, one unit at a time with no choice between them
# (a nested (?:[A-Z0-9]+)+ backtracks exponentially on a long upper-case run).
_CAMEL_NAME = re.compile(r"(?:[A-Z][a-z]++|[0-9]|[A-Z](?![a-z]))++")
_KEY_CHARSET = frozenset(string.ascii_letters + string.digits + "_.-")
_PARTS = re.compile(r"[A-Z]?[a-z]+[0-9]*|[A-Z]+[0-9]*(?![a-z])|[0-9]+")  # S3Key -> s3, key
_PATH = re.compile(
    r"(?:/|~/|\.\.?/|[A-Za-z]:[\\/])|.*\.(?:json|pem|key|p12|pfx|crt|cer|txt|ya?ml|env|ini|toml|cfg|conf)$"
)
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|[0-9][0-9.:_-]*")  # 4096, 0x1F, 1.3.6.1, 2026-11-30
_NAME_WORD = re.compile(r"[A-Z][a-z]{3,}")
_COORDINATE = re.compile(r"[A-Za-z]{3,}[-_]v?\d+\.\d+(?:\.\d+)*$")
_LONG_DIGITS = re.compile(r"[0-9]{16,}")  # discordToken="893064019486956120": an id or a secret, not a count
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_WORDY = re.compile(r"(?:^|[/_.:-])[a-z]{4,}(?=[/_.:-]|$)")
_PASSWORD_WORDS = frozenset({"password", "passwd", "passphrase", "pwd", "pw"})
# What a glued "pwd" ends besides a password: OLDPWD, chpwd; these name a database password.
_PWD_OWNERS = ("db", "sql", "admin", "root", "user", "usr", "sys", "ftp", "smtp", "mail", "ldap", "vnc", "wifi")


def _parts(name: str) -> list[str]:
    """Lower-cased words of an identifier: DB_PASSWORD, dbPassword, X-Api -> db, password, …"""
    return [p.lower() for p in _PARTS.findall(name)]


def _names_a_secret(value: str) -> bool:
    """password=password, token=access_token, api_key=API_KEY, "fake-access-token": a name."""
    if not re.fullmatch(r"[A-Za-z_-]+", value):
        return False
    secret_words = ("pass", "pwd", "secret", "token", "cred", "key", "auth", "private")
    return any(p.startswith(secret_words) for p in _parts(value))


def _type_name(value: str) -> bool:
    """str, SecretStr, Token=None, or Capitalised words and acronyms (PKCS7PrivateKeyTypes; not
    Hunter22 nor base64 such as Ym9iOmh1bnRlcjJ)."""
    if value.lower() in _TYPE_WORDS or _TYPE_NAME.fullmatch(value):
        return True
    return bool(_CAMEL_NAME.fullmatch(value)) and len(re.findall(r"[A-Z][a-z]", value)) >= 2


def _random_like(value: str) -> bool:
    """A generated key: 16+ characters with letters and digits, no words, not a UUID."""
    return (
        len(value) >= 16
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
        and not _WORDY.search(value)
        and not _camel_words(value)
        and not _UUID.fullmatch(value)
    )


_REFERENCE = re.compile(r"arn:|[A-Za-z][A-Za-z0-9+.-]*://")  # arn:aws:…, fileb://key.bin


_IDENTIFIER = re.compile(r"[A-Za-z_]++|(?=[a-z0-9]*+_)[a-z_][a-z0-9_]*+")  # nextchar, s3_conn


def _generated_part(value: str) -> bool:
    """sandbox_2pj32ll7_xvavocjsc781zj0u: a part of 8+ characters mixing 2+ digits and letters
    is generated, not a name (s3_connection, get_token_v2)."""
    return any(len(p) >= 8 and sum(c.isdigit() for c in p) >= 2 and sum(c.isalpha() for c in p) >= 2
               for p in value.split("_"))


def _code_value(secret: str, match: re.Match[str], sep: str, flag: bool) -> bool:
    """An unquoted value that is code, not a secret: an expression in a comparison
    (token == END_ELEMENT), and a name (letters and _, or snake_case) after a spaced = as in
    code (token = nextchar, secret_key = s3_connection), before , ) or an operator as in a
    call or an expression (password=getpass_bytearray), or after a --flag in prose (--token
    requires)."""
    if sep == "==":
        return True
    if not _IDENTIFIER.fullmatch(secret) or _generated_part(secret):
        return False
    if flag:
        return True
    text, end = match.string, match.end()
    spaced = sep in ("=", ":=", "=>") and text[match.start("sep") - 1] in (" ", "\t")
    rest = text[end : end + 4].lstrip(" \t")
    # Not & or |: DB_PASSWORD=changeme && ./run is shell, and its value a password; nor "</",
    # which closes an element (<Postgres>…;Password=my_pw_9</Postgres>), not a comparison.
    after = "" if rest.startswith("</") else rest[:1]
    return spaced or (after != "" and after in ",)+-*/%<>=!?^")


def _key_prefix(text: str, word_start: int) -> str:
    """The key characters glued before the secret word (DB_ in DB_PASSWORD), at most 64."""
    start, stop = word_start, max(0, word_start - 64)
    while start > stop and text[start - 1] in _KEY_CHARSET:
        start -= 1
    return text[start:word_start]


_SHELL_REFERENCE = re.compile(r"\$(?:\{[^}]*\}|\([^)]*\)|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")


def _literal_dollar(secret: str, match: re.Match[str]) -> bool:
    """'$uperS3cret' in single quotes (dotenv, shell): literal text, not a $VARIABLE; and a value
    that, its $references taken out, still holds three or more of !@#%^&* ($omespeci@!ch@r$):
    no template leaves that many symbols ($user@$host, ${HOME}/.pw, $PASSWORD! leave one)."""
    if not secret.startswith("$") or secret[1:2] in ("{", "("):
        return False
    if match.groupdict().get("q") == "'":
        return not re.fullmatch(r"\$[A-Z_][A-Z0-9_]*", secret)
    return sum(c in "!@#%^&*" for c in _SHELL_REFERENCE.sub("", secret)) >= 3


# A config file's key: UPPER_SNAKE (MYSQL_ROOT_PASSWORD, an env var's name) or, at the start of a
# line (indented, after "- ", export, ENV or ARG), dotted lower case (spring.datasource.password,
# jdbc.password; not self.* / this.* / cls.*, which are code). Its value is data, not a variable.
_ENV_KEY = re.compile(r"[A-Z][A-Z0-9]*+(?:_[A-Z0-9]++)*+_?")
_DOTTED_KEY = re.compile(r"(?!(?:self|this|cls)\.)[a-z][a-z0-9_-]*+(?:\.[a-z][a-z0-9_-]*+)++\.?")
_LINE_HEAD = re.compile(r"(?:^|\n)[ \t]*+(?:-[ \t]++|(?:export|ENV|ARG)[ \t]++)?$")
_TYPE_SUFFIX = re.compile(r"(?:Str|String|Bytes|Type|Field|Int|Bool|Dict|List|Any)$")


def _config_key(text: str, key_start: int, word_end: int) -> bool:
    """The key (prefix and secret word) is a config file's own: an env var's name not glued to
    what comes before ($X, obj.X), or a dotted key at the start of its line."""
    if _ENV_KEY.fullmatch(text, key_start, word_end):
        return key_start == 0 or text[key_start - 1] not in "$.@\\" and not text[key_start - 1].isalnum()
    return bool(_DOTTED_KEY.fullmatch(text, key_start, word_end)
                and _LINE_HEAD.search(text, max(0, key_start - 40), key_start))


# The other keys of a connection string (ADO.NET, ODBC, JDBC, libpq): one of them near a password
# key makes its key=value list a connection string.
_CONNECTION_KEY = re.compile(
    r"(?i)(?<![\w-])(?:server|data[ \t]source|host(?:name)?|address|addr|database|initial[ \t]catalog|dbname|uid"
    r"|user(?:[ \t]?id|name)?|port|provider|driver|dsn)[ \t]*=[^=]")
# (a libpq pair's value ends at a space, not at "," or ")": login(username=username, password=…) is code)
_LIST_BEFORE = re.compile(r"(?:[;?&][ \t]*|(?i:user(?:name)?|dbname|host|port)=[^\s=;,()]+[ \t]+)$")


def _connection_list(text: str, key_start: int, value_end: int) -> bool:
    """The key at key_start is one of a connection string's: after a ";", "?", "&" (or a
    libpq "user=app " pair) or before a ";", with another connection key within its line."""
    line_start = text.rfind("\n", 0, key_start) + 1
    lo = max(line_start, key_start - 300)
    before = text[lo:key_start]
    if not (_LIST_BEFORE.search(before) or text[value_end:value_end + 3].lstrip(" \t\"'")[:1] == ";"):
        return False
    line_end = text.find("\n", value_end)
    hi = min(value_end + 300, len(text) if line_end < 0 else line_end)
    return _CONNECTION_KEY.search(before) is not None or _CONNECTION_KEY.search(text, value_end, hi) is not None


def _spells_key(value: str, key: str, prefix: str) -> bool:
    """DB_PASSWORD=db_password, apiPassword=API_PASSWORD: the value is the key's own name
    (a template's), not a stand-in password (a bare PASSWORD=password is one)."""
    def fold(s: str) -> str:
        return re.sub(r"[^a-z0-9]", "", s.lower())
    return bool(fold(prefix)) and fold(value) == fold(key)


def _password_like(value: str) -> bool:
    """6+ characters with a letter and a digit, and mixed case or a symbol (Vq7wZp2Lx9,
    s3cr3t!x): not a word, a number, a test id (test_1) nor a version."""
    return (len(value) >= 6 and any(c.isalpha() for c in value) and any(c.isdigit() for c in value)
            and ((any(c.isupper() for c in value) and any(c.islower() for c in value))
                 or any(not (c.isalnum() or c in "_-.") for c in value)))


def _assignment(secret: str, match: re.Match[str]) -> bool:
    """Decide whether the value after a secret-looking key is a secret (see module docstring)."""
    text, word = match.string, match.group("word")
    lower = word.lower()
    word_start = match.start("word")
    prefix = _key_prefix(text, word_start)
    key_start = word_start - len(prefix)
    key_quoted = bool(match.group("kq")) or (key_start > 0 and text[key_start - 1] in "\"'")
    compound = any(c.isalnum() for c in prefix) or prefix == "_"  # _auth= in .npmrc
    if not compound:
        # "auth" alone only as a quoted key: {"auth": "dXNlcjpwYXNz"} in .docker/config.json;
        # "pass" alone only assigned a quoted value: PASS = '…' (not go test's PASS: TestLogin)
        assigned_quote = match.groupdict().get("qv") is not None and match.group("sep") in ("=", ":=")
        # or unquoted, a value that reads as a generated password: PASS=Vq7wZp2Lx9 (not PASS=1)
        assigned_password = match.group("sep") in ("=", ":=") and _password_like(secret)
        if lower not in _BARE_WORDS and not (lower == "auth" and key_quoted) and not (
                lower == "pass" and (assigned_quote or assigned_password)) and not (lower == "pw" and assigned_password):
            return False  # PASS: TestLogin, key: value
    elif prefix[-1].isalnum():
        # Glued to the word before: dbPassword, PGPASSWORD, csrftoken, dbpwd; not monkey, OLDPWD.
        camel = word[0].isupper() and word[1:].islower()
        if not (camel or lower in _GLUED_WORDS or (lower == "pwd" and prefix.lower().endswith(_PWD_OWNERS))):
            return False
    if lower == "creds" and not compound:
        return _random_like(secret)  # creds = 07DDRPsVSy3VycEgPS6TzfhJHTTcTo, not creds: none
    is_key = lower in _KEY_WORDS
    parts = (_parts(prefix) if compound and (is_key or lower == "token") else None) or [""]
    last = parts[-1]
    if last in _PLAIN_PREFIXES or "public" in parts:
        return False  # SORT_KEY, PUBLIC_KEY, NextToken, publicKeyToken
    sep = match.group("sep") or match.groupdict().get("xml") or ""
    if (text.endswith((":", "://"), 0, key_start) and not text.endswith("/:", 0, key_start)
            and not (sep == "=>" and (key_start == 1 or text[key_start - 2] in " \t\n{(,["))
            and text[max(0, key_start - 5) : key_start].lower() != "$env:"):
        # A URL user name (https://x-access-token:…@host: url_password's job) or a part of a
        # colon path (arn:aws:secretsmanager:…:secret:name, AWS::ApiGateway::ApiKey); an
        # .npmrc line (//registry.npmjs.org/:_authToken=…) is neither, nor is a Ruby symbol
        # key (:password => '…').
        return False
    flag = sep.isspace()  # --password VALUE
    sep = sep.strip()
    if sep == ">" and not text.endswith("<", 0, key_start):
        return False  # not an XML element: <password>…</password>
    glued = text[match.end("sep") : match.end("sep") + 1] not in (" ", "\t", "\"", "'")
    if sep == ":" and not compound and glued:
        return False  # "passwd:gecos": a name with a colon, not a key and a value
    folded = secret.lower()
    # A config file's key (MYSQL_PASSWORD:, spring.datasource.password =) is given data, not a
    # variable: a CamelCase value there (MySQLPassword) is no name of a secret nor a type, and an
    # identifier after a spaced "=" is no code; a snake_case or UPPER name still is one
    # (DB_PASSWORD=db_password, API_KEY=API_KEY), and a type keeps its suffix (SecretStr).
    data = sep in ("=", ":") and _config_key(text, key_start, match.end("word"))
    # A password in a connection string's key=value list (Server=…;User ID=…;Password=…) is
    # data as well; and there, as after a config key, a stand-in (Password=secret,
    # DB_PASSWORD=changeme, Pwd=myPassword) is the password the string connects with; only a
    # value that spells the key again (DB_PASSWORD=db_password) stays a template's name.
    conn = sep == "=" and lower in _PASSWORD_WORDS and _connection_list(text, key_start, match.end())
    data = data or conn
    named = _names_a_secret(secret) and not (data and not re.fullmatch(r"[a-z_-]+|[A-Z_-]+", secret))
    if named and (conn or (data and lower in _PASSWORD_WORDS)) and not _spells_key(secret, prefix + word, prefix):
        named = False
    if (
        folded in _LITERALS
        or (_placeholder(secret) and not _literal_dollar(secret, match))
        or _DOTTED_NAME.fullmatch(secret)
        or _PATH.match(secret)
        or _REFERENCE.match(secret)
        or named
    ):
        return False
    if _COORDINATE.search(secret):
        return False  # io.jsonwebtoken:jjwt-jackson-0.11.2: a package and its version
    if (sep == ":" or flag) and _type_name(secret) and not (
            data and folded not in _TYPE_WORDS and not _TYPE_SUFFIX.search(secret)):
        return False  # a type: api_key: SecretStr, password: string, key: PKCS7PrivateKeyTypes
    quoted = match.groupdict().get("qv") is not None
    if quoted and any(c.isspace() for c in secret) and (lower not in _PASSWORD_WORDS or len(secret.split()) > 6):
        return False  # token: "a sentence"; a passphrase in quotes follows a password word
    if not quoted and not data and _code_value(secret, match, sep, flag):
        return False
    if sep == "==" and lower not in _PASSWORD_WORDS:
        return False  # if token == "integer": a parser, not a secret
    if lower not in _PASSWORD_WORDS and _NUMBER.fullmatch(secret) and not _LONG_DIGITS.fullmatch(secret):
        return False  # max_token=4096, NUM_PASS=1234, SERVER_AUTH = '1.3.6.1.5.5.7.3.1'
    if lower == "pwd" and not compound and sep != "=":
        return False  # pwd: command not found (PWD=/path is a path, ODBC's PWD=… a password)
    if is_key:
        if lower == "auth" and not compound:
            return _random_like(secret)
        if lower in ("apikey", "auth", "key_base") or last in _SECRET_KEY_PREFIXES:
            return len(secret) >= 8
        return _random_like(secret) or (quoted and bool(_UUID.fullmatch(secret)))
    if lower not in _PASSWORD_WORDS and len(_NAME_WORD.findall(secret)) >= 3 and not _generated_part(secret):
        return False  # token: AgencyIdentificationCodeContentType: a name, not a token
    if len(secret) >= 8:
        return True
    # A short value: after a bare key and a colon it must not read as a word (Password: reset).
    bare_colon = sep == ":" and not compound and not key_quoted
    return quoted or not bare_colon or not secret.isalpha()


# What a qualifier after a secret word names when the value is no secret (TOKEN_ID, secret_name,
# api_key_url, password_hash, token_expiry): ids, names, places, sizes, digests and settings.
_QUALIFIER_STOP = frozenset({
    "id", "ids", "name", "names", "label", "alias", "arn", "ref", "url", "uri", "urls", "endpoint", "host",
    "file", "files", "path", "dir", "location", "env", "var", "field", "header", "param", "count", "len",
    "length", "size", "min", "max", "type", "kind", "format", "mode", "version", "ver", "prefix", "suffix",
    "hash", "sha", "sha1", "sha256", "md5", "digest", "checksum", "fingerprint", "salt", "iv", "nonce",
    "rev", "etag", "expiry", "expires", "expire", "expiration", "ttl", "timeout", "age", "date", "time", "at",
    "hint", "policy", "pattern", "regex", "rule", "rules", "index", "scope", "scopes", "public", "pub", "enabled",
    "required", "set", "exists", "valid", "is", "has", "reset", "rotation", "provider", "manager", "store",
    "str", "string", "char", "chars", "alphabet", "charset", "event", "up", "down", "press", "pressed", "code",
})  # fmt: skip
_COUNTING = re.compile(r"0123456|1234567|(?i:abcdefg)")  # an alphabet or a counting run: a stand-in
# The words strong enough to name a secret with qualifiers after them.
_QUALIFIED_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "token", "apikey", "key", "credentials",
                              "creds"})


def _qualified_assignment(secret: str, match: re.Match[str]) -> bool:
    """A secret word with qualifiers after it (todo_secret_do_not_commit, DB_PASSWORD_PROD,
    api_token_123): the word starts a key part (not monkey_x), no qualifier names what is no
    secret (_id, _name, _url, _hash, …) nor is a secret word itself (the last one is the key's,
    the plain rule's), and the value is generated (16+ letters and digits, no words, no counting
    run), or after a password word has a digit or a symbol among its 8+ characters."""
    text, word = match.string, match.group("word")
    lower = word.lower()
    if lower not in _QUALIFIED_WORDS or match.group("sep") == "==":
        return False
    prefix = _key_prefix(text, match.start("word"))
    if prefix and prefix[-1].isalnum() and not (word[0].isupper() and prefix[-1].islower()):
        return False  # glued to the word before: monkey_bars, turkey_time
    if lower == "key" and (_parts(prefix) or [""])[-1] not in _SECRET_KEY_PREFIXES:
        return False  # a key qualified is a secret only as api_key_*, secret_key_*, … (not key_down_event)
    qualifiers = _parts(match.group("suffix"))
    if any(q in _QUALIFIER_STOP or q in _WORDS or q.rstrip("s") in _WORDS for q in qualifiers):
        return False
    if (
        secret.lower() in _LITERALS
        or _placeholder(secret)
        or _DOTTED_NAME.fullmatch(secret)
        or _PATH.match(secret)
        or _REFERENCE.match(secret)
        or _names_a_secret(secret)
        or _COUNTING.search(secret)
    ):
        return False
    if lower in _PASSWORD_WORDS:
        return len(secret) >= 8 and any(c.isalpha() for c in secret) and any(not c.isalpha() for c in secret)
    return _random_like(secret)


def _alternation(words: list[str]) -> str:
    """A regex matching any of words, with common prefixes factored out (a trie).

    Python's re tries every branch of an alternation in turn; sharing prefixes makes the
    secret-word search about twice as fast as a flat list of words.
    """
    branches: dict[str, list[str]] = {}
    for word in words:
        branches.setdefault(word[:1], []).append(word[1:])
    alts, optional = [], False
    for head, tails in sorted(branches.items()):
        if not head:
            optional = True
        elif len(tails) == 1:
            alts.append(re.escape(head + tails[0]))
        else:
            alts.append(re.escape(head) + _alternation(tails))
    if len(alts) == 1 and not optional:
        return alts[0]
    return f"(?:{'|'.join(alts)}){'?' if optional else ''}"


def _cases(*words: str) -> str:
    """Each word in lower, Capitalised and UPPER case (faster here than a (?i:...) group)."""
    return _alternation([w for word in words for w in (word, word.capitalize(), word.upper())])


_KEY_WORD = rf"(?P<word>{_cases(*_WORDS)})"
# A qualifier after a secret word: a part that is no secret word itself (secret_key_v2 is the
# key's, found from "key"), after a separator or as a capitalised word (apiSecretProd).
_QUALIFIER = rf"(?!(?i:{_alternation(sorted(_QUALIFIED_WORDS))})(?![a-z]))"
_QUALIFIERS = rf"(?P<suffix>(?:[_.-]{_QUALIFIER}[A-Za-z0-9]++|{_QUALIFIER}[A-Z][a-z0-9]++){{1,4}}+)"
_VALUE = (
    rf"(?:(?P<q>[\"']){_NOT_MARK}(?P<qv>[^\s\"'](?:[^\"'\n]{{2,198}}[^\s\"']|[^\s\"']{{2,}}+))(?P=q)"
    # Possessive: the value is every non-delimiter character, and a value that runs into
    # "(" or "[" is code (get_token(), os.environ[...]), not a secret.
    rf"|{_NOT_MARK}(?P<v>[^\s\"'`,;&()<>\[\]{{}}]{{4,}}+)(?![(\[]))"
)
_PEM_BEGIN = r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
_PEM_END = r"-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
# Between body chunks: whitespace, or an escaped newline inside a JSON string.
_PEM_GAP = r"(?:[ \t\r\n]|\\[rn])++"
_PEM_HEADER = r"(?:Proc-Type|DEK-Info|Comment|Version):[ \t]*+(?:\"[^\"\r\n]{0,200}+\"|[^\s\\]++)"
# A base64 chunk, unless it reads as a plain word (The, and): there the body has ended.
_PEM_CHUNK = r"(?![A-Za-z][a-z]*+(?![A-Za-z0-9+/=]))[A-Za-z0-9+/]++=*+"

# Order matters on ties: when two shapes find the same span the earlier, more specific one wins.
SHAPES: tuple[Shape, ...] = (
    Shape(
        "private_key",
        re.compile(
            _PEM_BEGIN
            # The body stops at the next BEGIN/END marker (possessive, no backtracking), so
            # many unterminated BEGIN lines cost linear, not quadratic, time.
            + rf"(?:(?:(?!-----(?:BEGIN|END)).)*+{_PEM_END}"
            # Cut off before END: the header lines and base64 chunks that follow, not the prose.
            + rf"|(?:{_PEM_GAP}(?:{_PEM_HEADER}|{_PEM_CHUNK}))*+)",
            re.DOTALL,
        ),
    ),
    Shape("jwt", _bounded("eyJ", r"[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")),
    Shape(
        "aws_access_key_id",
        re.compile(r"(?:AKIA|ASIA)(?<![A-Za-z0-9]....)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        check=lambda secret, _: not _filler(secret[4:]),
    ),
    Shape(
        "aws_secret_access_key",
        # Labelled (aws_secret_access_key=…, "SecretAccessKey": …) or bare: the label or the
        # access key id next to it is the AWS evidence the check asks for.
        re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"),
        check=_aws_secret_like,
        needles=("aws", "AWS", "Aws", "AKIA", "ASIA"),
    ),
    Shape("github_token", _bounded("gh[pousr]_", r"[A-Za-z0-9]{36,251}")),
    Shape("github_token", _bounded("github_pat_", r"[A-Za-z0-9_]{22,255}")),
    Shape(
        "gitlab_token",
        re.compile(
            r"gl(?<![A-Za-z0-9_-]gl)(?:pat|dt|rt|ptt|soat)-[A-Za-z0-9_-]{20,}+(?![A-Za-z0-9_-])"
        ),
        check=lambda secret, m: _token_like(secret, m) and not _filler(secret),
    ),
    Shape(
        "slack_webhook",
        re.compile(
            r"hooks\.slack\.com/(?:services|workflows|triggers)/"
            r"(T[A-Z0-9]{6,12}/[A-Za-z0-9_/-]{16,}+)"
        ),
        group=1,
    ),
    # Slack tokens carry numeric workspace / user ids; the lookahead wants a digit.
    Shape("slack_token", _bounded("xox[abprs]-", r"(?=[A-Za-z-]*\d)[A-Za-z0-9-]{20,}"),
           check=lambda secret, m: not (_filler(secret) or _camel_words(secret)
                                        or m.string[m.end() : m.end() + 1] in ("#", "*"))),
    Shape("slack_token", _bounded("xapp-", r"\d-[A-Z0-9]{8,14}-\d{8,16}-[a-z0-9]{32,80}")),
    Shape(
        "discord_webhook",
        re.compile(
            r"discord(?:app)?\.com/api/(?:v\d{1,2}/)?webhooks/"
            r"(\d{15,22}/[A-Za-z0-9_-]{40,100}+)(?![A-Za-z0-9_-])"
        ),
        group=1,
    ),
    Shape(
        "teams_webhook",
        re.compile(
            r"\.office\.com/webhook(?:b2)?/"
            r"([0-9a-fA-F-]{36}@[0-9a-fA-F-]{36}/IncomingWebhook/[0-9a-fA-F]{32}/[0-9a-fA-F-]{36}"
            r"(?:/[A-Za-z0-9_-]{10,}+)?)"
        ),
        group=1,
    ),
    Shape("anthropic_key", _bounded("sk-ant-", r"[A-Za-z0-9_-]{20,}")),
    Shape(
        "openai_key",
        _bounded("sk-", r"(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        check=_openai_like,
    ),
    Shape("groq_key", _bounded("gsk_", r"[A-Za-z0-9]{52}")),
    Shape("google_api_key", _bounded("AIza", r"[A-Za-z0-9_-]{35}"), check=lambda secret, _: not _filler(secret)),
    Shape("stripe_key", _bounded("sk_", r"(?:live|test)_[A-Za-z0-9]{10,}", "A-Za-z0-9_")),
    Shape("stripe_key", _bounded("rk_", r"(?:live|test)_[A-Za-z0-9]{10,}", "A-Za-z0-9_")),
    Shape("sendgrid_key", _bounded(r"SG\.", r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}")),
    Shape("twilio_api_key", _bounded("SK", r"[0-9a-fA-F]{32}", "A-Za-z0-9"), check=_hex_mix),
    Shape("npm_token", _bounded("npm_", r"[A-Za-z0-9]{36}", "A-Za-z0-9_"), check=_token_like),
    Shape(
        "pypi_token",
        _bounded(r"pypi-", r"Ag(?:EIcHlwaS5vcmc|ENdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{40,}"),
    ),
    Shape(
        "huggingface_token",
        _bounded("hf_", r"[A-Za-z0-9]{34,40}", "A-Za-z0-9_"),
        check=_mixed_case,
    ),
    Shape("digitalocean_token", _bounded("do[opr]_v1_", r"[a-f0-9]{64}")),
    Shape("shopify_token", _bounded("shp(?:at|ca|pa|ss)_", r"[a-fA-F0-9]{32}")),
    Shape("databricks_token", _bounded("dapi", r"[a-f0-9]{32}(?:-\d{1,2})?"), check=_hex_mix),
    Shape(
        "telegram_bot_token",
        # <bot id>:<secret>; the bot id is public (the bot's user id), the part after the
        # colon is the secret.
        re.compile(r":(?<=[0-9]{5}:)(A[A-Za-z0-9_-]{34})(?![A-Za-z0-9_-])"),
        group=1,
        check=lambda secret, m: _token_like(secret, m) and not _camel_words(secret),
    ),
    Shape("vault_token", _bounded(r"hv[sb]\.", r"[A-Za-z0-9_-]{90,}"), check=lambda secret, _: not _filler(secret)),
    Shape("age_secret_key", _bounded("AGE-SECRET-KEY-1", r"[0-9A-Z]{58}")),
    Shape(
        "azure_key",
        re.compile(
            rf"(?:AccountKey|SharedAccessKey)=[\"']?{_NOT_MARK}"
            r"([A-Za-z0-9+/]{20,}+={0,2})(?![A-Za-z0-9+/=])"
        ),
        group=1,
        needles=("AccountKey=", "SharedAccessKey="),
    ),
    Shape(
        "azure_sas_signature",
        re.compile(
            rf"sig=(?<=[?&]sig=){_NOT_MARK}([A-Za-z0-9%+/_-]{{30,}}+(?:%3[Dd]|=){{0,2}}+)"
            r"(?![A-Za-z0-9%+/=_-])"
        ),
        group=1,
        check=_token_like,
    ),
    Shape(
        "url_password",
        re.compile(
            r"://(?<=[A-Za-z0-9+.-]://)[^\s:/@?#\[\]]*+:"
            # The password may hold "/", "@" (an "@" with another "@" before the host), and an
            # unencoded "?" or "#" when an "@" and a host follow (p#ss?w0rd@db: libpq and most
            # drivers split at the last "@"); it is bounded so that many "x://a:" without an "@"
            # cost linear time.
            # (an "@" may have a "#" after it before the next: p@ss#w0rd@db)
            rf"{_NOT_MARK}((?:[^\s@?#]|@(?=[^\s/?@]*@)|[?#](?=[^\s@]*@[A-Za-z0-9\[]))"
            r"{1,256}+)@"
        ),
        group=1,
        check=_url_password,
    ),
    Shape(
        "basic_auth",
        re.compile(r"(?:Basic|basic|BASIC)[ \t]+([A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])"),
        group=1,
        check=_after_authorization,
        needles=("uthorization", "UTHORIZATION"),
    ),
    Shape(
        "basic_auth",
        re.compile(
            r"-(?:u|-user)[ \t]+[\"']?[^\s:\"']*+:[\"']?"
            rf"{_NOT_MARK}([^\s\"']{{4,}}+)"
        ),
        group=1,
        check=_curl_user,
        needles=("curl",),
    ),
    Shape(
        "bearer_token",
        re.compile(
            rf"(?P<scheme>{_cases('bearer', 'token')})[ \t]+"
            r"([A-Za-z0-9._~+/-]{15,}[A-Za-z0-9_~+/-]=*)(?![A-Za-z0-9_~+/=-])"
        ),
        group=2,
        check=_bearer,
        needles=("earer", "EARER", "uthorization", "UTHORIZATION"),
    ),
    Shape(
        "secret_assignment",
        re.compile(
            # a typed declaration between key and value: var apiToken string = "…"
            # and a subscript's key: cfg['password'] = …, os.environ["DB_PASSWORD"] = …
            rf"{_KEY_WORD}(?P<kq>[\"'])?(?(kq)\]?)(?:[ \t]*+:?[ \t]*+(?:string|String|str)(?![\w:]))?"
            rf"[ \t]*+(?:(?P<sep>:{{1,3}}=|[?]=|=>|==|[:=])[ \t]*+"
            # a YAML block scalar: password: |\n  hunter22
            rf"(?:[|>][-+]?[ \t]*+\r?\n[ \t]++)?{_VALUE}"
            # or an XML element: <password>hunter2</password> (Maven settings.xml and the like)
            rf"|(?P<xml>>)[ \t\r\n]*+{_NOT_MARK}(?P<x>[^\s<>\"']{{4,}}+)[ \t\r\n]*+</)"
        ),
        group=("qv", "v", "x"),
        check=_assignment,
    ),
    Shape(
        "secret_assignment",
        # A secret word with qualifiers after it: todo_secret_do_not_commit =, DB_PASSWORD_PROD=
        re.compile(rf"{_KEY_WORD}{_QUALIFIERS}(?P<kq>[\"'])?[ \t]*+(?P<sep>:{{1,2}}=|=>|==|[:=])[ \t]*+{_VALUE}"),
        group=("qv", "v"),
        check=_qualified_assignment,
    ),
    Shape(
        "secret_assignment",
        # A .netrc entry: machine host login user password secret (on one line or several; the
        # host has a dot or is localhost, unlike "machine learning login page password reset").
        re.compile(
            r"machine[ \t\r\n]++(?:[^\s.]*+\.\S++|localhost)[ \t\r\n]++login[ \t\r\n]++\S++[ \t\r\n]++password[ \t\r\n]++"
            rf"{_NOT_MARK}(\S++)"
        ),
        group=1,
        check=_not_placeholder,
    ),
    Shape(
        "secret_assignment",
        # A command-line flag: --password VALUE, --db-password VALUE (not --password-file).
        re.compile(rf"--(?:[a-z0-9]+-)*+{_KEY_WORD}(?P<kq>)?(?P<sep>[ \t]++)(?!-){_VALUE}"),
        group=("qv", "v"),
        check=_assignment,
    ),
)
