"""The session's plugin: the optional corpora, a private HOME, and every test reads only what a
clone has. pyproject.toml loads it for every run (``pythonpath`` and ``-p cybmem_test_session``),
so it covers tests/ and the notebooks alike, in each xdist worker.

The real-history corpora are not in the repository. The ``corpora`` fixture finds them where they
are (``../shared/corpora`` beside the checkout, as on CI, or ``CYBMEM_CORPORA``; the benchmarks'
rule, benchmarks/_corpus.py) and skips a test, with one line, when the archive it needs is not
there; ``corpus_1k`` unpacks one of them.

An audit hook (tests/audit/sitecustomize.py, which says what it sees and what it cannot) records
each file opened and each directory listed outside the allowed places, in this process and in
every Python process a test starts. A test that opened such a path fails at teardown, naming the
path and the process; opens made while collecting are charged to the first test that runs.

Allowed: the repository, the temporary directory (tmp_path, the HOME each test gets, the
session's HOME, the notebook copies), the Python installation and its site-packages, and the
operating system's own directories (/proc, /sys, /dev, /etc, /usr, ...). Not allowed even inside
the repository: benchmarks/.data (corpora the benchmarks unpack; a clone has none). The optional
corpora (CORPORA below) may be read only by tests that take the ``corpora`` fixture, which skip
when the corpora are absent. tests/test_reads_audit.py tests the check itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AUDIT_DIR = REPO / "tests" / "audit"
#: inside the repository but never in a clone (git-ignored data)
NOT_IN_A_CLONE = ("benchmarks/.data",)
#: the operating system's directories: devices, process info, configuration, shared libraries, fonts
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/run", "/var/tmp")
#: the fixture a test takes to read the optional corpora (corpus_1k takes it too)
CORPUS_FIXTURE = "corpora"


def _load(name: str, path: Path):
    """A module of this repository by its path (neither tests/ nor benchmarks/ is a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


#: where the corpus archives are (they may be absent)
CORPORA = _load("cybmem_bench_corpus", REPO / "benchmarks" / "_corpus.py").corpora_dir()


class Corpora:
    """The directory of the optional corpus archives, for the tests that read them."""

    def __init__(self, where: Path):
        self.dir = where

    def archive(self, name: str) -> Path:
        """``<name>.tar.gz``; skips the test, with one line, when it is not there."""
        path = self.dir / f"{name}.tar.gz"
        if not path.is_file():
            pytest.skip(f"needs the optional corpus {path.name} (not in the repository; CI has ../shared/corpora, "
                        "CYBMEM_CORPORA names another directory)")
        return path


@pytest.fixture(scope="session")
def corpora() -> Corpora:
    """The optional real-history corpora. A test that reads them takes this fixture: the read
    audit lets it read there, and it skips where the corpora are absent (a clone alone)."""
    return Corpora(CORPORA)


@pytest.fixture(scope="session")
def corpus_1k(tmp_path_factory, corpora) -> Path:
    """The 1,000-run pytest corpus, unpacked once per session: a memory root (skips without it)."""
    import tarfile

    archive = corpora.archive("pytest-memory-1k")
    dest = tmp_path_factory.mktemp("corpus")
    with tarfile.open(archive, "r:gz") as tf:
        tf.extractall(dest, filter="data")
    return dest / "pytest-memory-1k"


def _audit_module():
    """tests/audit/sitecustomize.py: the one this process started with (a session started by
    another one, e.g. an xdist worker), else loaded under its own name."""
    started = sys.modules.get("sitecustomize")
    if started is not None and Path(getattr(started, "__file__", "")).resolve() == AUDIT_DIR / "sitecustomize.py":
        return started
    return _load("cybmem_reads_audit", AUDIT_DIR / "sitecustomize.py")


def _trusted() -> list[str]:
    """The Python installation and the operating system's directories."""
    roots = {*SYSTEM_DIRS, sys.prefix, sys.base_prefix, sys.exec_prefix, site.getusersitepackages()}
    roots.update(p for p in sysconfig.get_paths().values() if p)
    roots.update(site.getsitepackages())
    return sorted(roots)


class ReadsAudit:
    """The session's side: the rule, the log children append to, and what each test opened."""

    def __init__(self, config: pytest.Config):
        audit = _audit_module()
        self.audit = audit
        made = tempfile.mkdtemp(prefix="cybmem-reads-")
        _MADE.append(made)
        self.log = Path(made) / f"reads-{os.getpid()}.log"
        self.log.touch()
        self.offset = 0
        self.found: list[tuple[str, str, str]] = []  # (event, path, who) since the last test ended
        self.corpora = os.path.normpath(os.path.abspath(CORPORA))
        deny = [str(REPO / p) for p in NOT_IN_A_CLONE]
        allow = [str(REPO), tempfile.gettempdir()]
        if config.option.basetemp:  # tmp_path lives there instead
            allow.append(os.path.abspath(config.option.basetemp))
        rule = {"allow": allow, "trusted": _trusted(), "deny": deny, "log": str(self.log)}
        os.environ[audit.ENV] = json.dumps(rule)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != AUDIT_DIR]
        os.environ["PYTHONPATH"] = os.pathsep.join([str(AUDIT_DIR), *paths])
        self.first = True
        audit.install(audit.Rule(rule["allow"], rule["deny"], rule["trusted"]), self._record)

    def _record(self, event: str, path: str) -> None:
        self.found.append((event, path, "this process"))

    def _drain(self) -> list[tuple[str, str, str]]:
        found, self.found = self.found, []
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        for line in whole.splitlines():
            row = json.loads(line)
            found.append((row["event"], row["path"], f"pid {row['pid']}: {row['argv'][:160]}"))
        return found

    def check(self, item: pytest.Item) -> str | None:
        """What ``item`` (and, for the first test, collection) opened outside, as one message; None if nothing."""
        found = self._drain()
        in_corpora = [f for f in found if f[1] == self.corpora or f[1].startswith(self.corpora + os.sep)]
        if CORPUS_FIXTURE in getattr(item, "fixturenames", ()):
            found = [f for f in found if f not in in_corpora]
        if not found:
            self.first = False
            return None
        when = "while collecting or during this test" if self.first else "during this test"
        self.first = False
        seen, lines = set(), []
        for event, path, who in found:
            if (path, who) not in seen:
                seen.add((path, who))
                lines.append(f"  {path}  ({event}, {who})")
        hint = (f"; a test that reads the optional corpora takes the `{CORPUS_FIXTURE}` fixture, which skips "
                "without them" if set(found) & set(in_corpora) else "")
        return (f"{len(lines)} path(s) outside the repository were opened {when}; a clone has no such "
                f"files (tests read data-fixtures/ or tmp_path; see tests/session/cybmem_test_session.py){hint}:\n"
                + "\n".join(lines[:40]))


_AUDIT: ReadsAudit | None = None
_SESSION_HOME = "CYBMEM_TEST_SESSION_HOME"
_MADE: list[str] = []  # temporary directories this process made for the session


def _session_home() -> None:
    """Point HOME at a private directory for the whole session, before anything is collected.

    Each test gets its own HOME (tests/conftest.py); this covers what runs outside a test's
    fixtures: collection, and the notebook kernels nbval starts, which would otherwise read the
    user's IPython profile (and run its startup scripts) and matplotlib's cache. MPLCONFIGDIR
    keeps one matplotlib font cache for every process of the session (xdist workers included),
    so each subprocess that draws does not build its own.
    """
    home = os.environ.get(_SESSION_HOME)
    if not home:
        home = os.environ[_SESSION_HOME] = tempfile.mkdtemp(prefix="cybmem-session-home-")
        _MADE.append(home)
    os.environ["HOME"] = home
    os.environ["MPLCONFIGDIR"] = os.path.join(home, ".config", "matplotlib")


def pytest_configure(config: pytest.Config) -> None:
    global _AUDIT
    _session_home()
    if _AUDIT is None:
        _AUDIT = ReadsAudit(config)


#: Files whose tests are independent of each other and long enough to be worth spreading over both
#: workers (USAGE.md's sections: about a fifth of the suite's time in one file).
SPREAD = {"tests/test_usage.py"}


def _scope(nodeid: str) -> str:
    """What runs on one worker: a whole file (a notebook's cells share one kernel, a module's
    fixtures are built once), each test of a SPREAD file on its own."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPREAD else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's own hook for choosing a scheduler: whole files to one worker, except SPREAD.

    Not ``--dist loadgroup`` with an ``xdist_group`` mark per file: xdist puts the group into a
    test's id by assigning ``item._nodeid``, which pytest 9.2 no longer reads (the id became
    structured), so every notebook's cells were spread over both workers and a cell ran in a
    kernel that had not run the cells before it. A scheduler is xdist's public interface."""
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    # The work goes out in the order pytest_collection_modifyitems below gives (xdist's own reorder
    # sorts by the number of tests, which put USAGE.md's sections, one test each and the longest
    # units of the suite, last: the run ended with one worker idle while the other ran them).
    config.option.loadscopereorder = False
    return FileScheduling(config, log)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order work is handed out in (the longest units first, so that the two workers end
    together): SPREAD files' tests, then the other files by their number of tests, most first
    (xdist's own order). Tests keep their order within a file."""
    if not getattr(config.option, "dist", "no") or config.option.dist == "no":
        return
    count: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        count[path] = count.get(path, 0) + 1
    first = {path: i for i, path in enumerate(dict.fromkeys(item.nodeid.split("::", 1)[0] for item in items))}

    def key(item: pytest.Item) -> tuple:
        path = item.nodeid.split("::", 1)[0]
        return (path not in SPREAD, -count[path], first[path])

    items.sort(key=key)  # stable: a file's tests stay in their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if call.when != "teardown" or _AUDIT is None:
        return
    message = _AUDIT.check(item)
    if message:
        report = outcome.get_result()
        report.outcome = "failed"
        report.longrepr = message


def pytest_unconfigure(config: pytest.Config) -> None:
    for made in _MADE:
        shutil.rmtree(made, ignore_errors=True)
