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

from ._io import atomic_write, ensure_dir, locked
from .errors import NotFoundError, StoreError, ValidationError

__all__ = ["slug_base", "hash6", "resolve_slug", "peek_slug", "list_projects", "load_projects", "project_dirs"]

PROJECTS_FILE = "projects.json"
LOCK_FILE = ".projects.lock"
_MAX_SLUG = 64
_UNSAFE = re.compile(r"[^a-z0-9._-]+")


def hash6(cwd: str) -> str:
    """First 6 hex digits of sha256 of the absolute cwd."""
    return hashlib.sha256(cwd.encode("utf-8", "surrogatepass")).hexdigest()[:6]


def _abs_cwd(cwd: str | os.PathLike) -> str:
    text = os.fspath(cwd)
    if not text or "\x00" in text:
        raise ValidationError(f"cwd {text!r} is not a usable path; pass an absolute directory path")
    return os.path.abspath(text)


def slug_base(cwd: str | os.PathLike) -> str:
    """The lowercased basename of ``cwd``, made safe to use as one directory name.

    Characters outside ``[a-z0-9._-]`` become ``-``; a name that is empty, made
    only of dots, or has nothing usable (``/``, ``..``, non-Latin letters) falls
    back to ``project-<hash6>``; long names are cut to 64 characters.
    """
    path = _abs_cwd(cwd)
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
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(
            f"{path} is not valid JSON ({exc}); fix or move it aside, then run `cybmem doctor --repair`"
        ) from exc
    if not isinstance(data, dict):
        raise StoreError(f"{path} must hold a JSON object mapping slug to {{\"cwd\": ...}}")
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def project_dirs(root: Path) -> list[str]:
    """Slug directories on disk (those with a records/ dir or an issue ledger)."""
    root = Path(root)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    out = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
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
            cwd = json.loads((records / name).read_bytes()).get("cwd")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(cwd, str) and cwd:
            return cwd
    return None


def _backfill(root: Path, projects: dict[str, dict]) -> bool:
    changed = False
    for slug in project_dirs(root):
        if slug not in projects:
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
    path = _abs_cwd(cwd)
    base = slug_base(path)
    if not create and not root.exists():
        raise NotFoundError(f"no memory at {root}; nothing has been written there yet")
    if not create:
        projects = load_projects(root)
        slug = _lookup(projects, path, base)
        if slug in projects and not any(s not in projects for s in project_dirs(root)):
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
    slug = next((s for s, v in sorted(projects.items()) if v.get("cwd") == path), None)
    if slug is not None:
        return slug
    owner = projects.get(base, {}).get("cwd")
    return base if owner is None else f"{base}-{hash6(path)}"


def peek_slug(root: Path, cwd: str | os.PathLike) -> str:
    """The slug ``resolve_slug(create=True)`` would give ``cwd``, without writing anything."""
    root = Path(root)
    path = _abs_cwd(cwd)
    projects = load_projects(root) if root.exists() else {}
    _backfill(root, projects)
    return _lookup(projects, path, slug_base(path))


def list_projects(root: Path) -> list[dict]:
    """Every project of a memory root: slug, cwd (registered or backfilled) and record count."""
    root = Path(root)
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
