"""Build data-fixtures/secret-examples.jsonl: other projects' secret-detection examples, to
measure cybmem's redaction on shapes it was not written from.

    python data-fixtures/secret_examples.py           # rewrites data-fixtures/secret-examples.jsonl
    python data-fixtures/secret_examples.py --check   # exit 1 when the file is not what the sources give

The sources (data-fixtures/secret_examples_sources.py) are the true-positive and false-positive
examples that public rule sets carry for their own rules, transcribed from the files and
commits named there with their licences: gitleaks' rule definitions
(cmd/generate/config/rules/*.go, MIT) and detect-secrets' plugin tests (tests/plugins/*_test.py,
Apache-2.0). All of them are fake secrets, written as test data by those projects.

gitleaks builds many of its examples at generation time: ``secrets.NewSecret(regex)`` draws a
random string from a regex, ``GenerateSampleSecret(id, s)`` puts it in one assignment and
``GenerateSampleSecrets(id, s)`` in each of 32 file formats (INI, JSON, escaped JSON, XML, YAML
blocks, C#, Go, Java, PHP, Python, CSV, logstash, Makefile). This script does the same from a
fixed seed (the strings differ from gitleaks' own run, their shapes do not), so the file is
reproducible. The templates are gitleaks' (cmd/generate/config/utils/generate.go).

One line per example: ``text``, ``secret`` (true: something in it must be redacted), ``value``
(the generated secret when there is one: it must not survive redaction), ``form`` (literal:
written out in the source; generated: drawn from the rule's regex; in a template when
``template`` is set), ``source``, ``rule``, ``repo``, ``path``, ``commit``, ``licence``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import warnings
from pathlib import Path

with warnings.catch_warnings():  # the regex parser is public only under these deprecated names
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_constants as C
    import sre_parse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

OUT = HERE / "secret-examples.jsonl"
SEED = 20

# gitleaks cmd/generate/config/utils/generate.go, GenerateSampleSecrets (MIT); {i} the identifier,
# {s} the secret.
TEMPLATES = {
    "ini - quoted1": '{i}Token="{s}"',
    "ini - quoted2": '{i}Token = "{s}"',
    "ini - unquoted1": "{i}Token={s}",
    "ini - unquoted2": "{i}Token = {s}",
    "json - string": '{\n    "{i}_token": "{s}"\n}',
    "json - escaped string": '\\{\n    \\"{i}_token\\": \\"{s}\\"\n\\}',
    "xml - element": "<{i}Token>{s}</{i}Token>",
    "xml - element multiline": "<{i}Token>\n    {s}\n</{i}Token>",
    "yaml - singleline - unquoted": "{i}_token: {s}",
    "yaml - singleline - single quote": "{i}_token: '{s}'",
    "yaml - singleline - double quote": '{i}_token: "{s}"',
    "yaml - multiline - literal": "{i}_token: |\n  {s}",
    "yaml - multiline - folding": "{i}_token: >\n  {s}",
    "C#": 'string {i}Token = "{s}";',
    "go - normal": 'var {i}Token string = "{s}"',
    "go - short": '{i}Token := "{s}"',
    "go - backticks": "{i}Token := `{s}`",
    "java": 'String {i}Token = "{s}";',
    "kotlin - notype": 'var {i}Token = "{s}"',
    "php - string concat": '${i}Token .= "{s}"',
    "python - single quote": "{i}Token = '{s}'",
    "python - double quote": '{i}Token = "{s}"',
    "csv - unquoted": "{i}Token,{s},",
    "logstash": '  "{i}Token" => "{s}"',
    "make - recursive assignment": '{i}_TOKEN = "{s}"',
    "make - simple assignment": '{i}_TOKEN := "{s}"',
    "make - shell assignment": '{i}_TOKEN ::= "{s}"',
    "make - evaluated shell assignment": '{i}_TOKEN :::= "{s}"',
    "make - conditional assignment": '{i}_TOKEN ?= "{s}"',
    "make - append": '{i}_TOKEN += "{s}"',
}
SINGLE = '{i}_api_token = "{s}"'  # GenerateSampleSecret

_CATEGORIES = {
    C.CATEGORY_DIGIT: string.digits,
    C.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    C.CATEGORY_SPACE: " ",
}


def _charset(items, rng: random.Random) -> str:
    chars: list[str] = []
    negate = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            chars.append(chr(av))
        elif op is C.RANGE:
            chars.extend(chr(c) for c in range(av[0], av[1] + 1))
        elif op is C.CATEGORY:
            chars.extend(_CATEGORIES.get(av, ""))
    if negate:
        chars = [c for c in string.ascii_letters + string.digits if c not in chars]
    return rng.choice(chars)


def _draw(parsed, rng: random.Random) -> str:
    """A random string matching a parsed regex (reggen's way: an open repeat adds at most one)."""
    out = []
    for op, av in parsed:
        if op is C.LITERAL:
            out.append(chr(av))
        elif op is C.NOT_LITERAL:
            out.append(rng.choice([c for c in string.ascii_letters if ord(c) != av]))
        elif op is C.ANY:
            out.append(rng.choice(string.ascii_letters))
        elif op is C.IN:
            out.append(_charset(av, rng))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            hi = lo + 1 if hi is C.MAXREPEAT else hi
            out.extend(_draw(sub, rng) for _ in range(rng.randint(lo, hi)))
        elif op is C.SUBPATTERN:
            out.append(_draw(av[-1], rng))
        elif op is C.BRANCH:
            out.append(_draw(rng.choice(av[1]), rng))
        elif op is C.CATEGORY:
            out.append(rng.choice(_CATEGORIES.get(av, "x")))
        # AT (anchors) and the like add nothing
    return "".join(out)


def draw(regex: str, rng: random.Random, plausible: bool = False) -> str:
    """gitleaks secrets.NewSecret(regex); ``plausible``: its newPlausibleSecret (a digit 1-9)."""
    parsed = sre_parse.parse(regex.replace("(?i)", ""))
    while True:
        value = _draw(parsed, rng)
        if not plausible or re.search("[1-9]", value):
            return value


def _value(parts, rng: random.Random) -> tuple[str, str]:
    """(the parts joined, the longest generated part)."""
    out, drawn = [], []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        else:
            drawn.append(draw(part["re"], rng, part.get("plausible", False)))
            out.append(drawn[-1])
    return "".join(out), max(drawn, key=len, default="")


def expand(rule: dict, rng: random.Random) -> list[dict]:
    """One rule's examples: its literal lines, and its generated ones through their templates."""
    base = {k: rule[k] for k in ("source", "rule", "repo", "path", "commit", "licence")}
    rows = []
    for secret, key in ((True, "tp"), (False, "fp")):
        for item in rule.get(key, []):
            if isinstance(item, str):
                rows.append({"text": item, "secret": secret, "value": None, "form": "literal", "template": None, **base})
                continue
            kind, ident, parts = item["kind"], item.get("id", ""), item["parts"]
            value, drawn = _value(parts, rng)
            if kind == "line":  # a line with generated parts: the longest one is (in) the secret
                rows.append({"text": value, "secret": secret, "value": drawn if secret and drawn else None,
                             "form": "generated", "template": None, **base})
                continue
            templates = TEMPLATES if kind == "samples" else {"sample": SINGLE}
            for name, template in templates.items():
                text = template.replace("{i}", ident).replace("{s}", value)
                rows.append({"text": text, "secret": secret, "value": value if secret else None,
                             "form": "generated", "template": name, **base})
    return rows


def build() -> list[dict]:
    from secret_examples_sources import RULES

    rng = random.Random(SEED)
    rows = []
    for rule in RULES:
        rows.extend(expand(rule, rng))
    return rows


def dumps(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = ap.parse_args()
    text = dumps(build())
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.name} is {'up to date' if same else 'out of date: run python data-fixtures/secret_examples.py'}")
        sys.exit(0 if same else 1)
    OUT.write_text(text, encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines()]
    print(f"wrote {OUT}: {sum(r['secret'] for r in rows)} secret examples, "
          f"{sum(not r['secret'] for r in rows)} look-alikes, from {len({(r['source'], r['rule']) for r in rows})} rules")


if __name__ == "__main__":
    main()
