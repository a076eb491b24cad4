import json

import pytest

from cybmem.errors import NotFoundError
from cybmem.store.projects import hash6, list_projects, load_projects, peek_slug, resolve_slug, slug_base


def test_slug_is_lowercased_basename():
    assert slug_base("/home/dev/MyWeb") == "myweb"
    assert slug_base("/home/dev/web/") == "web"


@pytest.mark.parametrize("cwd", ["/", "/home/..", "/tmp/проект", "/tmp/..."])
def test_unusable_basenames_fall_back_to_a_hash(cwd):
    slug = slug_base(cwd)
    assert slug.startswith("project-") and "/" not in slug


def test_same_basename_collision_first_owner_keeps_it(memory_root):
    assert resolve_slug(memory_root, "/home/dev/web") == "web"
    second = resolve_slug(memory_root, "/srv/clients/web")
    assert second == f"web-{hash6('/srv/clients/web')}"
    # stable on later calls, and the owner is unchanged
    assert resolve_slug(memory_root, "/home/dev/web") == "web"
    assert resolve_slug(memory_root, "/srv/clients/web") == second
    data = json.loads((memory_root / "projects.json").read_text())
    assert data == {"web": {"cwd": "/home/dev/web"}, second: {"cwd": "/srv/clients/web"}}


def test_lazy_backfill_never_reslugs_the_existing_owner(memory_root):
    # A store written before projects.json existed: the dir "web" belongs to /srv/old/web.
    rec_dir = memory_root / "web" / "records"
    rec_dir.mkdir(parents=True)
    (rec_dir / "r1.json").write_text(json.dumps({"runId": "r1", "cwd": "/srv/old/web"}))
    assert not (memory_root / "projects.json").exists()
    assert peek_slug(memory_root, "/home/dev/web") == f"web-{hash6('/home/dev/web')}"
    assert not (memory_root / "projects.json").exists(), "peek writes nothing"
    slug = resolve_slug(memory_root, "/home/dev/web")
    assert slug == f"web-{hash6('/home/dev/web')}"
    assert load_projects(memory_root)["web"] == {"cwd": "/srv/old/web"}
    assert resolve_slug(memory_root, "/srv/old/web") == "web"


def test_read_path_does_not_register(memory_root):
    resolve_slug(memory_root, "/home/dev/api")
    with pytest.raises(NotFoundError, match="known projects: api"):
        resolve_slug(memory_root, "/home/dev/other", create=False)
    assert set(load_projects(memory_root)) == {"api"}


def test_list_projects_counts_records(memory_root):
    resolve_slug(memory_root, "/home/dev/api")
    (memory_root / "api" / "records").mkdir(parents=True)
    (memory_root / "api" / "records" / "a.json").write_text("{}")
    assert list_projects(memory_root) == [{"slug": "api", "cwd": "/home/dev/api", "records": 1}]
