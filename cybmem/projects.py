"""Project slugs and projects.json.

A project's slug is the lowercased basename of its cwd. The first cwd to claim
a slug keeps it; a later, different cwd with the same basename gets
``<base>-<hash6(cwd)>``. Slug dirs that predate projects.json are backfilled
lazily from the cwd carried in their records, so an existing owner is never
re-slugged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from pathlib import Path

from ._io import atomic_write, ensure_dir, loads, locked, read_file
from .errors import NotFoundError, StoreError, ValidationError

__all__ = [
    "slug_base", "hash6", "abs_cwd", "resolve_slug", "peek_slug", "list_projects", "load_projects", "project_dirs",
    "validate_slug", "is_safe_slug", "known_projects", "lookup_slug", "select_project", "check_root", "PROJECTS_FILE", "MAX_PROJECTS_BYTES",
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


def slug_base(cwd: str | os.PathLike) -> str:
    """The lowercased basename of ``cwd``, made safe to use as one directory name.

    Characters outside ``[a-z0-9._-]`` become ``-``; a name that is empty, made
    only of dots, or has nothing usable (``/``, ``..``, non-Latin letters) falls
    back to ``project-<hash6>``; long names are cut to 64 characters.
    """
    path = abs_cwd(cwd)
    name = os.path.basename(path.rstrip("/")) or ""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii").lower()
    slug = _UNSAFE.sub("-", folded).strip("-")[:_MAX_SLUG].strip("-")
    if not slug or set(slug) <= {"."} or slug.startswith("."):
        slug = f"project-{hash6(path)}"
    return slug


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
        if create and projects.get(slug, {}).get("cwd") == path:
            return slug  # registered already: entries are never changed, so no lock is needed
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


def _lookup(projects: dict[str, dict], path: str, base: str) -> str:
    owners = sorted(s for s, v in projects.items() if v.get("cwd") == path)
    if owners:
        # Runs filed elsewhere with --project carry this cwd, and the backfill registers their slug
        # with it: the slug the rule gives this cwd stays its project whatever sorts first.
        for canonical in (base, f"{base}-{hash6(path)}"):
            if canonical in owners:
                return canonical
        return owners[0]
    owner = projects.get(base, {}).get("cwd")
    return base if owner is None else f"{base}-{hash6(path)}"


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
        cwd: the project's directory (default: the current directory).
        project: a slug, which wins over ``cwd``.
        create: register the project of ``cwd`` when it has none (the write path).
        peek: write nothing at all, not even the lazy projects.json backfill (doctor).
        known: with ``peek``, the projects map to look ``cwd`` up in (default: :func:`known_projects`).

    Raises:
        NotFoundError: no such project (the message names the known ones).
        ValidationError: an unsafe slug or an unusable cwd.
    """
    root = check_root(root)
    if project:
        validate_slug(project)
        if not create and not (root / project).is_dir():
            try:
                names = sorted(set(project_dirs(root)) | set(known if known is not None else known_projects(root)))
            except StoreError:  # a broken projects.json: name the directories at least
                names = project_dirs(root)
            raise NotFoundError(f"no project {project!r} under {root}; known projects: {', '.join(names) or 'none'}")
        return project
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


def peek_slug(root: Path, cwd: str | os.PathLike) -> str:
    """The slug ``resolve_slug(create=True)`` would give ``cwd``, without writing anything."""
    root = Path(root)
    path = abs_cwd(cwd)
    projects = load_projects(root) if root.exists() else {}
    _backfill(root, projects)
    return _lookup(projects, path, slug_base(path))


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
