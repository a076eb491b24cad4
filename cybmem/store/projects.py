"""Project slugs and projects.json: which project a directory or a name belongs to.

Rules (in full: USAGE.md, "Which project a run belongs to"):

- A project's slug is the lowercased basename of its cwd; the first cwd to claim a slug keeps it,
  a later, different cwd with the same (or a look-alike, :func:`slug_key`) basename gets
  ``<base>-<hash6(cwd)>``. Slug dirs that predate projects.json are backfilled lazily from the
  cwd in their records, so an existing owner is never re-slugged.
- A directory belongs to the nearest registered project at or above it, as git finds its
  repository; the filesystem root and the home directory hold only runs made exactly there.
- A ``--project`` name that looks like an existing one (NFKC, case folding, accents, invisible
  characters, Latin look-alike Cyrillic and Greek letters, the separators ``-``, ``_`` and ``.``
  or none: ``web_7663e1`` and ``web7663e1`` look like ``web-7663e1``) is refused with the name it
  resembles;
  a new project's name must be one the slug rule could make.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from pathlib import Path

from .._io import atomic_write, ensure_dir, loads, locked, read_file
from ..errors import NotFoundError, StoreError, ValidationError

__all__ = [
    "slug_base", "hash6", "abs_cwd", "resolve_slug", "peek_slug", "list_projects", "load_projects", "project_dirs",
    "validate_slug", "is_safe_slug", "known_projects", "lookup_slug", "select_project", "check_root", "PROJECTS_FILE", "MAX_PROJECTS_BYTES",
    "slug_key", "look_alikes", "LOOK_ALIKE_RULE", "project_cwd", "owning_dir",
]

PROJECTS_FILE = "projects.json"
LOCK_FILE = ".projects.lock"
_MAX_SLUG = 64
_MAX_SLUG_NAME = 128  # what validate_slug accepts (slugs of other tools may be longer than ours)
_MAX_PATH = 4096  # PATH_MAX
MAX_PROJECTS_BYTES = 64 * 1024 * 1024
_UNSAFE = re.compile(r"[^a-z0-9._-]+")
# A slug names one directory under the memory root: no separators, no control characters,
# no leading dot (.cache, .lock and temp files live there), not "." or "..".
_SLUG_BAD = re.compile(r"[/\\\x00-\x1f\x7f]")


def validate_slug(slug: object) -> str:
    """Return ``slug`` if it is one safe directory name under the memory root, else raise ValidationError."""
    if (
        not isinstance(slug, str) or not slug or slug.startswith(".") or _SLUG_BAD.search(slug)
        or len(slug) > _MAX_SLUG_NAME or slug != slug.strip()
    ):
        raise ValidationError(
            f"project slug {slug!r} is not a single safe directory name; use up to {_MAX_SLUG_NAME} characters, "
            "no '/', '\\', control characters or leading '.' (see `cybmem projects`)"
        )
    try:
        slug.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"project slug {slug!r} is not valid UTF-8 text") from None
    return slug


def hash6(cwd: str) -> str:
    """First 6 hex digits of sha256 of the absolute cwd."""
    return hashlib.sha256(cwd.encode("utf-8", "surrogatepass")).hexdigest()[:6]


def abs_cwd(cwd: str | os.PathLike) -> str:
    """The absolute path of ``cwd`` as text; ValidationError when it cannot name a project."""
    text = os.fspath(cwd)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text or "\x00" in text:
        raise ValidationError(f"cwd {text!r} is not a usable path; pass an absolute directory path")
    if len(text) > _MAX_PATH:
        raise ValidationError(f"cwd is {len(text)} characters long; a directory path has at most {_MAX_PATH}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Records and projects.json are JSON text: a path that is not UTF-8 cannot be stored as it is.
        raise ValidationError(
            f"cwd {text!r} is not valid UTF-8; records store the cwd as JSON text, "
            "so run from (or pass --cwd) a directory whose path is UTF-8"
        ) from None
    return os.path.abspath(text)


def _fold_name(name: str) -> str:
    """``name`` as the slug rule folds a basename ("" when nothing usable is left)."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii").lower()
    slug = _UNSAFE.sub("-", folded).strip("-")[:_MAX_SLUG].strip("-")
    return "" if not slug or set(slug) <= {"."} or slug.startswith(".") else slug


def slug_base(cwd: str | os.PathLike) -> str:
    """The lowercased basename of ``cwd``, made safe to use as one directory name.

    Characters outside ``[a-z0-9._-]`` become ``-``; a name that is empty, made
    only of dots, or has nothing usable (``/``, ``..``, non-Latin letters) falls
    back to ``project-<hash6>``; long names are cut to 64 characters.
    """
    path = abs_cwd(cwd)
    return _fold_name(os.path.basename(path.rstrip("/")) or "") or f"project-{hash6(path)}"


# Letters of other scripts that look like Latin ones (after case folding), from Unicode's
# confusables (UTS #39) for the letters a slug is made of: a small table covers the usual
# look-alikes (Cyrillic and Greek) without a dependency on the write path.
_LOOKS_LATIN = str.maketrans({
    "а": "a", "в": "b", "с": "c", "ԁ": "d", "е": "e", "һ": "h", "н": "h", "і": "i", "ј": "j", "к": "k", "ӏ": "l",
    "м": "m", "о": "o", "р": "p", "ԛ": "q", "ѕ": "s", "т": "t", "ս": "u", "ѵ": "v", "ԝ": "w", "х": "x", "у": "y",
    "ү": "y", "α": "a", "β": "b", "ε": "e", "η": "h", "ι": "i", "ı": "i", "κ": "k", "μ": "m", "ν": "v", "ο": "o",
    "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "γ": "y", "ζ": "z", "ɑ": "a", "ɡ": "g", "ԍ": "g",
})


# The separators a slug may hold: read past, ``web_7663e1``, ``web.7663e1`` and ``web7663e1`` are
# ``web-7663e1`` to the eye (and to an agent typing a name it saw once).
_SEPARATORS = str.maketrans("", "", "-_.")
#: What :func:`slug_key` folds, as the messages that refuse a look-alike say it.
LOOK_ALIKE_RULE = "the same after Unicode NFKC, case folding, look-alike letters and dropping '-', '_' and '.'"


def slug_key(slug: str, *, separators: bool = True) -> str:
    """What a slug looks like: Unicode NFKC (full-width and compatibility forms), case folded,
    accents and invisible format characters dropped, Cyrillic or Greek letters that look
    Latin replaced by those, and the separators ``-``, ``_``, ``.`` dropped. Two names with the
    same key look alike (``wеb`` with a Cyrillic ``е``, ``ｗｅｂ``, ``WEB`` and ``Web`` all look like
    ``web``; ``web_7663e1``, ``web.7663e1`` and ``web7663e1`` like ``web-7663e1``).

    ``separators=False`` keeps the separators: the slug rule of a cwd (store-format.md, which the
    orchestrator computes too) gives ``web_7663e1`` to a directory of that name whatever else is
    registered, so only a name typed with ``--project`` is held to the separators."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", slug).casefold())
    kept = "".join(c for c in text if not unicodedata.combining(c) and unicodedata.category(c) != "Cf")
    kept = kept.translate(_LOOKS_LATIN)
    return kept.translate(_SEPARATORS) if separators else kept


def look_alikes(slug: str, names) -> list[str]:
    """The names (other than ``slug`` itself) that look like ``slug`` (:func:`slug_key`), sorted."""
    key = slug_key(slug)
    return sorted(n for n in set(names) if n != slug and slug_key(n) == key)


# What the slug rule can make (slug_base, plus "-<hash6>"): a name a new project may take.
_RULE_SLUG = re.compile(r"[a-z0-9_](?:[a-z0-9._-]{0,69}[a-z0-9._])?")


def load_projects(root: Path) -> dict[str, dict]:
    """Read projects.json (slug -> {"cwd": ...}); a missing file is an empty map."""
    path = Path(root) / PROJECTS_FILE
    try:
        raw = read_file(path, limit=MAX_PROJECTS_BYTES)
    except FileNotFoundError:
        return {}
    try:
        data = loads(raw)
    except ValueError as exc:
        raise StoreError(
            f"{path} is not valid JSON ({exc}); fix or move it aside, then run `cybmem doctor --repair`"
        ) from None
    if not isinstance(data, dict):
        raise StoreError(f"{path} must hold a JSON object mapping slug to {{\"cwd\": ...}}")
    # Entries that could not name a directory under the root (unsafe slugs) or lack a cwd are
    # ignored here; `cybmem doctor` reports them.
    return {k: v for k, v in data.items() if isinstance(v, dict) and is_safe_slug(k)}


def is_safe_slug(slug: str) -> bool:
    """True when ``slug`` can name a project directory (see :func:`validate_slug`)."""
    try:
        validate_slug(slug)
    except ValidationError:
        return False
    return True


def project_dirs(root: Path) -> list[str]:
    """Slug directories on disk (those with a records/ dir or an issue ledger)."""
    root = Path(root)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False) or not is_safe_slug(entry.name):
            continue
        if (Path(entry.path) / "records").is_dir() or (Path(entry.path) / "issues.jsonl").exists():
            out.append(entry.name)
    return out


def _cwd_from_records(slug_dir: Path) -> str | None:
    records = slug_dir / "records"
    try:
        names = sorted(n for n in os.listdir(records) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return None
    for name in names[:50]:
        try:
            cwd = loads(read_file(records / name, limit=_MAX_BACKFILL_READ)).get("cwd")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(cwd, str) and cwd and "\x00" not in cwd and len(cwd) <= _MAX_PATH:
            return cwd
    return None


_MAX_BACKFILL_READ = 4 * 1024 * 1024  # a record bigger than this is not worth parsing for its cwd


def _backfill(root: Path, projects: dict[str, dict]) -> bool:
    changed = False
    for slug in project_dirs(root):
        if slug not in projects and is_safe_slug(slug):
            cwd = _cwd_from_records(root / slug)
            if cwd:
                projects[slug] = {"cwd": cwd}
                changed = True
    return changed


def _write(root: Path, projects: dict[str, dict]) -> None:
    data = json.dumps(projects, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"
    atomic_write(root / PROJECTS_FILE, data)


def resolve_slug(root: Path, cwd: str | os.PathLike, *, create: bool = True) -> str:
    """The slug of the project at ``cwd``, registering it in projects.json when ``create``.

    Without ``create`` nothing is written unless slug dirs need backfilling,
    and a project that was never registered raises NotFoundError.
    """
    root = Path(root)
    path = abs_cwd(cwd)
    base = slug_base(path)
    if not create and not root.exists():
        raise NotFoundError(f"no memory at {root}; nothing has been written there yet")
    if root.exists():
        projects = load_projects(root)
        slug = _lookup(projects, path, base)
        if create and slug in projects:
            return slug  # registered already (this directory or one above it): entries never change, no lock needed
        if not create and slug in projects and not any(s not in projects for s in project_dirs(root)):
            return slug  # read path: nothing to register or backfill, take no lock
    try:
        ensure_dir(root)
        with locked(root / LOCK_FILE):
            projects = load_projects(root)
            changed = _backfill(root, projects)
            slug = _lookup(projects, path, base)
            if create and slug not in projects:
                projects[slug] = {"cwd": path}
                changed = True
            if changed:
                _write(root, projects)
    except PermissionError:
        if create:
            raise StoreError(f"memory dir {root} is not writable; point CYBERINE_MEMORY_DIR or --memory-dir elsewhere") from None
        # A read-only store (a shared copy): backfill in memory only.
        projects = load_projects(root)
        _backfill(root, projects)
        slug = _lookup(projects, path, base)
    if not create and slug not in projects:
        raise NotFoundError(
            f"no memory for project {path} under {root}; known projects: {', '.join(sorted(projects)) or 'none'}"
            " (pass --project SLUG or --cwd DIR)"
        )
    return slug


def _norm(cwd) -> str | None:
    return os.path.normpath(cwd) if isinstance(cwd, str) and cwd.startswith("/") else None


def owning_dir(projects: dict[str, dict], path: str) -> str | None:
    """The registered project directory that ``path`` (absolute) belongs to: ``path`` itself, else
    its nearest registered ancestor, as git finds its repository; None when there is none. The
    walk stops below the home directory (for a path under it) and below ``/``: a project there
    holds only runs made exactly there."""
    dirs = {d for d in (_norm(v.get("cwd")) for v in projects.values()) if d}
    path = os.path.normpath(path)
    if path in dirs:
        return path
    home = os.path.normpath(os.path.expanduser("~"))
    ceilings = {"/", home} if path.startswith(home.rstrip("/") + "/") else {"/"}
    cur = os.path.dirname(path)
    while cur not in ceilings and cur != os.path.dirname(cur):
        if cur in dirs:
            return cur
        cur = os.path.dirname(cur)
    return None


def _lookup(projects: dict[str, dict], path: str, base: str) -> str:
    home = owning_dir(projects, path)
    if home is not None:
        owners = sorted(s for s, v in projects.items() if _norm(v.get("cwd")) == home)
        # Runs filed elsewhere with --project carry this cwd, and the backfill registers their slug
        # with it: the slug the rule gives this cwd stays its project whatever sorts first.
        own = slug_base(home) if home != path else base
        for canonical in (own, f"{own}-{hash6(home)}"):
            if canonical in owners:
                return canonical
        return owners[0]
    owner = projects.get(base, {}).get("cwd")
    # A basename that only looks like a slug already taken (``Web`` beside ``web``) collides too;
    # one that differs in its separators is another directory's name, as the contract gives it.
    key = slug_key(base, separators=False)
    taken = owner is not None or any(n != base and slug_key(n, separators=False) == key for n in projects)
    return f"{base}-{hash6(path)}" if taken else base


def project_cwd(root: Path, slug: str, projects: dict[str, dict] | None = None) -> str | None:
    """The directory project ``slug`` is registered (or would be backfilled) with; None when unknown."""
    projects = known_projects(root) if projects is None else projects
    cwd = projects.get(slug, {}).get("cwd")
    return cwd if isinstance(cwd, str) and cwd else None


def lookup_slug(projects: dict[str, dict], cwd: str | os.PathLike) -> str:
    """The slug ``cwd`` has (or would get) in a projects map, without touching the disk."""
    path = abs_cwd(cwd)
    return _lookup(projects, path, slug_base(path))


def known_projects(root: Path, projects: dict[str, dict] | None = None) -> dict[str, dict]:
    """projects.json (or ``projects``, when given) plus the slug dirs it does not list yet,
    backfilled in memory from their records' cwd; nothing is written."""
    root = Path(root)
    projects = dict(projects) if projects is not None else (load_projects(root) if root.exists() else {})
    _backfill(root, projects)
    return projects


def check_root(root: Path) -> Path:
    """``root`` if it is a directory or does not exist yet; StoreError (with the fix) otherwise."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise StoreError(f"memory root {root} is not a directory; point CYBERINE_MEMORY_DIR or --memory-dir at a directory")
    return root


def select_project(root: Path, *, cwd: str | os.PathLike | None = None, project: str | None = None,
                   create: bool = False, peek: bool = False, known: dict[str, dict] | None = None) -> str:
    """The project a command works on: ``project`` (a slug) if given, else the project of ``cwd``.

    The one place a project is chosen (every verb, the write path, inject and doctor).

    Args:
        root: the memory root.
        cwd: a directory of the project (default: the current directory); it belongs to the
            nearest registered project at or above it (:func:`owning_dir`).
        project: a slug, which wins over ``cwd``: an existing project's exact name; a name that
            only looks like one is refused (:func:`slug_key`), and a new one (``create``) must
            be one the slug rule makes.
        create: register the project of ``cwd`` when it has none (the write path).
        peek: write nothing at all, not even the lazy projects.json backfill (doctor).
        known: with ``peek``, the projects map to look ``cwd`` up in (default: :func:`known_projects`).

    Raises:
        NotFoundError: no such project (the message names the known ones).
        ValidationError: an unsafe slug, a look-alike of an existing project, a new name outside
            the slug rule, or an unusable cwd.
    """
    root = check_root(root)
    if project:
        return _named_project(root, project, create=create, known=known)
    cwd = cwd if cwd is not None else os.getcwd()
    if peek:
        path = abs_cwd(cwd)
        projects = known if known is not None else known_projects(root)
        slug = lookup_slug(projects, path)
        if slug not in projects or not (root / slug).is_dir():
            raise NotFoundError(f"no memory for project {path} under {root}; known projects: "
                                f"{', '.join(sorted(projects)) or 'none'} (pass --project SLUG or --cwd DIR)")
        return slug
    return resolve_slug(root, cwd, create=create)


def _dir_names(root: Path) -> set[str]:
    """The exact names of the directories in ``root`` (a case-insensitive filesystem would say
    ``WEB`` is a directory when ``web`` is)."""
    try:
        with os.scandir(root) as it:
            return {e.name for e in it if e.is_dir() and is_safe_slug(e.name)}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _named_project(root: Path, project: str, *, create: bool, known: dict[str, dict] | None) -> str:
    """The project a ``--project`` name gives (see :func:`select_project`)."""
    validate_slug(project)
    on_disk = _dir_names(root)
    if project in on_disk:
        return project
    try:
        known = known if known is not None else known_projects(root)
    except StoreError:  # a broken projects.json: the directories at least
        known = {}
    names = set(project_dirs(root)) | set(known)
    similar = look_alikes(project, names)
    if similar:
        shown = f"{project!r}" + (f" ({ascii(project)[1:-1]})" if not project.isascii() else "")
        raise ValidationError(
            f"project {shown} looks like existing project {similar[0]!r} ({LOOK_ALIKE_RULE}); "
            f"use --project {similar[0]}, or a name that does not look like it")
    if not create:
        raise NotFoundError(f"no project {project!r} under {root}; known projects: {', '.join(sorted(names)) or 'none'}")
    if project not in known and not (_RULE_SLUG.fullmatch(project) and not project.endswith("-")):
        hint = _fold_name(project)
        raise ValidationError(
            f"{project!r} is not a name the slug rule makes for a new project: lowercase ASCII letters, digits, '.', "
            "'_' and '-', not starting with '.' or '-' nor ending with '-', at most 71 characters"
            + (f"; e.g. --project {hint}" if hint else ""))
    return project


def peek_slug(root: Path, cwd: str | os.PathLike) -> str:
    """The slug ``resolve_slug(create=True)`` would give ``cwd``, without writing anything."""
    return lookup_slug(known_projects(root), cwd)


def list_projects(root: Path) -> list[dict]:
    """Every project of a memory root: slug, cwd (registered or backfilled) and record count."""
    root = check_root(root)
    projects = load_projects(root) if root.exists() else {}
    _backfill(root, projects)
    out = []
    for slug in sorted(set(projects) | set(project_dirs(root))):
        records = root / slug / "records"
        try:
            count = sum(1 for n in os.listdir(records) if n.endswith(".json") and not n.startswith("."))
        except OSError:
            count = 0
        out.append({"slug": slug, "cwd": projects.get(slug, {}).get("cwd"), "records": count})
    return out
