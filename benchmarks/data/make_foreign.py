"""Rebuild the "foreign task" sets (foreign-js.jsonl, foreign-ops.jsonl).

Stdlib only. Reads already-downloaded public changelogs; see README.md in
this folder for where each file comes from and how to fetch it.

    python make_foreign.py markdown CHANGELOG.md \
        --source react-router@7.18.7/CHANGELOG.md --limit 300 -o foreign-js.jsonl
    python make_foreign.py nginx changelog.gz \
        --source nginx-common@1.22.1-9+deb12u11/usr/share/doc/nginx-common/changelog.gz \
        --limit 150 -o foreign-ops.jsonl

Each output line is {"task": ..., "source": ...}; entries keep the file's
order (newest first), so --limit keeps the most recent ones.
"""

import argparse
import gzip
import json
import re
import sys

MIN_WORDS = 4
MAX_WORDS = 50  # longer entries are cut to their first sentence

LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")  # [text](url) -> text
URL = re.compile(r"<?https?://\S+>?")
_REF = r"\[*(?:#\d+|[0-9a-f]{7,40})\]*"
PR_REF = re.compile(r"\(\s*" + _REF + r"(?:\s*,\s*" + _REF + r")*\s*\)")
HASH_REF = re.compile(r"(?<![\w&])#\d+\b")
CVE = re.compile(r"\(?\bCVE-\d{4}-\d+(?:\s*,\s*CVE-\d{4}-\d+)*\)?")
HANDLE = re.compile(r"(?:Thanks|thanks)\s+@[\w-]+!?|\(@[\w-]+\)|\bby @[\w-]+")
THANKS = re.compile(r"\s*Thanks to .*$", re.S)  # nginx credits, always last
VERSION_BUMP = re.compile(
    r"^(updated? dependenc|bump(ed)?\b|upgrade[sd]? .* to v?\d|"
    r"`?@?[\w./-]+@v?\d[\w.-]*`?$|v?\d+\.\d+[\w.]*$|_?no changes_?$)",
    re.I,
)
NGINX_LABEL = re.compile(r"^(Bugfix|Change|Feature|Security|Workaround):\s*")


def clean(text, markdown=True):
    text = text.replace("()", "\0")  # keep call parentheses like href()
    if markdown:
        text = text.replace("\\[", "[").replace("\\]", "]")
        text = text.replace("`", "").replace("**", "")
    text = LINK.sub(r"\1", text)
    text = URL.sub("", text)
    text = PR_REF.sub("", text)
    text = HASH_REF.sub("", text)
    text = CVE.sub("", text)
    text = HANDLE.sub("", text)
    text = re.sub(r"\((?:\s*\w+:)?\s*\)", "", text)  # parentheses emptied above
    text = text.replace("\0", "()")
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([.,;:!?)])(?=\s|$)", r"\1", text)
    if len(text.split()) > MAX_WORDS:
        text = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return text.strip(" -:")


def markdown_entries(lines):
    """Top-level '- ' / '* ' bullets; first paragraph only (stops at a blank
    line, a nested bullet, a fence or a heading). Headings are not tasks in
    the changesets format (they are versions and 'Patch Changes')."""
    cur = None
    for line in lines:
        m = re.match(r"^[-*] (.*)", line)
        if m:
            if cur is not None:
                yield " ".join(cur)
            cur = [m.group(1)]
            continue
        if cur is not None:
            s = line.strip()
            if not s or s.startswith(("```", "- ", "* ", "#", "|")) or line.startswith("#"):
                yield " ".join(cur)
                cur = None
            else:
                cur.append(s)
    if cur is not None:
        yield " ".join(cur)


def nginx_entries(lines):
    """'    *) Label: text' entries of nginx's CHANGES, continuation lines
    indented; ends at a blank line."""
    cur = None
    for line in lines:
        if line.startswith("    *) "):
            if cur is not None:
                yield " ".join(cur)
            cur = [line[7:].strip()]
        elif cur is not None and line.strip():
            cur.append(line.strip())
        elif cur is not None:
            yield " ".join(cur)
            cur = None
    if cur is not None:
        yield " ".join(cur)


def build(kind, path, source, limit):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    entries = markdown_entries(lines) if kind == "markdown" else nginx_entries(lines)
    seen, out = set(), []
    for raw in entries:
        if kind == "nginx":
            raw = THANKS.sub("", raw)
        task = clean(raw, markdown=(kind == "markdown"))
        body = NGINX_LABEL.sub("", task) if kind == "nginx" else task
        if VERSION_BUMP.match(body) or len(body.split()) < MIN_WORDS:
            continue
        key = re.sub(r"\W+", " ", body.lower()).strip()
        if key in seen:
            continue
        seen.add(key)
        out.append({"task": task, "source": source})
        if limit and len(out) >= limit:
            break
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["markdown", "nginx"])
    ap.add_argument("path", help="downloaded changelog (.gz read as gzip)")
    ap.add_argument("--source", required=True, help="<package>@<version>/<path>")
    ap.add_argument("--limit", type=int, default=0, help="keep the first N (0: all)")
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args(argv)
    rows = build(args.kind, args.path, args.source, args.limit)
    fh = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    for row in rows:
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    if fh is not sys.stdout:
        fh.close()
    print(f"{args.output}: {len(rows)} tasks", file=sys.stderr)


if __name__ == "__main__":
    main()
