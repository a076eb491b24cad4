"""cybmem.settings is the one reader of the environment: every variable is read, parsed and
defaulted there, once, into typed sub-configurations; USAGE.md's table under "Set up" names
exactly the variables cybmem reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from cybmem import settings as S
from cybmem.clients import distillation, embeddings
from cybmem.errors import ValidationError

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "cybmem"
VARIABLE = re.compile(r"(?:CYBERINE|OPENAI|OLLAMA)_[A-Z_]*[A-Z]")
#: Reads of the environment outside settings.py: none (a notebook's $PWD, the secret scanner, a
#: test's seam all went through Settings or a parameter; issue 38).
ELSEWHERE: dict[str, int] = {}
#: The modules that may read the environment through Settings.from_env: the fronts, and the
#: handle's constructors they call (cybmem.memory.Memory.from_env, for_notebook).
FRONTS = ("cli/", "mcp/", "hooks/", "memory.py", "settings.py")


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("notebooks/"):
            continue
        yield rel, ast.parse(path.read_text(encoding="utf-8"))


def _environ_uses(tree: ast.AST) -> int:
    """``os.environ`` / ``os.getenv`` / ``os.environb`` uses, and ``<anything>.env.get(...)`` /
    ``.env[...]`` reads of a Settings-like ``env`` mapping."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv"):
            n += 1
        elif isinstance(node, ast.Attribute) and node.attr == "env" and isinstance(node.value, ast.Name) \
                and node.value.id in ("settings", "self"):
            n += 1
    return n


def test_only_settings_reads_the_environment():
    found = {rel: n for rel, tree in _sources() if rel != "settings.py" and (n := _environ_uses(tree))}
    assert found == ELSEWHERE, "read the variable in cybmem/settings.py and pass the typed value on"


def test_only_fronts_read_the_settings_from_the_environment():
    """The library takes its settings from the caller: Settings.from_env (and the sub-configurations'
    from_env) is called by the fronts and the handle's constructors alone, never as a fallback
    deep in the library (the seven `settings or Settings.from_env()` of issue 38)."""
    calls = []
    for rel, tree in _sources():
        if rel.startswith(FRONTS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_env":
                calls.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}")
    assert calls == [], "take the settings as an argument; the front that called reads them"


def test_the_fallbacks_are_gone():
    """The functions that fell back to the environment now take settings from their caller: called
    without them, they say so (a TypeError), never read CYBERINE_* behind the caller's back."""
    import inspect

    from cybmem.explore.usage import load_feedback
    from cybmem.explore.widgets import TuningView
    from cybmem.operations.retune import auto_tune
    from cybmem.retrieval.vectors import query_vectors
    from cybmem.retrieval.issue_ranking import rank_open_issues
    from cybmem.retrieval.search import search
    from cybmem.retrieval.tuning import evaluate_weights, prepare, tune
    from cybmem.retrieval.weights import save_project_weights

    for fn in (search, query_vectors, save_project_weights, tune, prepare, evaluate_weights, auto_tune, load_feedback,
               rank_open_issues, TuningView.__init__):
        p = inspect.signature(fn).parameters["settings"]
        assert p.default is inspect.Parameter.empty, fn.__qualname__


def test_no_variable_is_looked_up_by_name_outside_settings():
    """A variable's name may appear in a message elsewhere, never as the key of a lookup."""
    lookups = []
    for rel, tree in _sources():
        if rel == "settings.py":
            continue
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv") \
                    and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            if isinstance(key, str) and VARIABLE.fullmatch(key):
                lookups.append(f"{rel}:{node.lineno}: {key}")
    assert lookups == []


def test_one_parser_for_switches():
    """The words that turn a switch off are written once (settings._FALSE)."""
    sets = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
                words = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if {"0", "false", "off"} <= words:
                    sets.append(rel)
    assert sorted(sets) == ["settings.py"], "use settings._flag"


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("  ", True), ("0", False), ("FALSE", False),
                                       (" no ", False), ("Off", False), ("1", True), ("yes", True), ("whatever", True)])
def test_every_switch_reads_the_same_words(value, on):
    env = {"CYBERINE_MEMORY_MODEL": "ollama:m"}
    if value is not None:
        env.update(CYBERINE_MEMORY=value, CYBERINE_MEMORY_REDACT=value, CYBERINE_MEMORY_FEEDBACK=value)
    s = S.Settings.from_env(env, memory_dir="/x")
    assert (s.enabled, s.redact_secrets, s.feedback.enabled, s.distill.redact) == (on, on, on, on)
    assert distillation.distill_config(s.distill).redact is on, "the prompt is redacted as the record is: one reading"


def test_sub_configurations_are_typed_and_read_once():
    env = {"CYBERINE_MEMORY_EMBEDDINGS": " ollama ", "CYBERINE_MEMORY_EMBED_TIMEOUT": "0.5", "OLLAMA_HOST": "gpu:1",
           "CYBERINE_MEMORY_MODEL": "gpt-4o-mini", "OPENAI_API_KEY": "k", "CYBERINE_MEMORY_SHOWN_CAP": "9",
           "CYBERINE_MEMORY_WEIGHTS": "/w.json", "CYBERINE_MEMORY_W_KW": "0.3", "CYBERINE_MEMORY_W_REC": " ",
           "CYBERINE_MEMORY_PROJECT": " web ", "CYBERINE_MEMORY_DIR": "/m"}
    s = S.Settings.from_env(env)
    assert (s.embeddings.on, s.embeddings.server, s.embeddings.query_timeout, s.embeddings.write_timeout) == (
        True, "ollama", 0.5, S.EMBED_WRITE_TIMEOUT)
    assert embeddings.embed_config(s.embeddings).url == "http://gpu:1/api/embed"
    assert (s.distill.on, s.distill.key, s.distill.timeout) == (True, "k", S.MODEL_TIMEOUT) and "'k'" not in repr(s)
    assert (s.feedback.shown_cap, s.feedback.problem) == (9, None)
    assert s.weights.file == Path("/w.json") and s.weights.variables == (("w_kw", "CYBERINE_MEMORY_W_KW", "0.3", 0.3),)
    assert (s.project, s.memory_dir, s.memory_from) == ("web", Path("/m"), "CYBERINE_MEMORY_DIR")
    assert hash(s) == hash(S.Settings.from_env(env)), "settings stay hashable"
    off = S.Settings.from_env({}, memory_dir="/m")
    assert not off.embeddings.on and not off.distill.on and off.weights.variables == () and off.memory_from == "argument"


def test_a_bad_companion_costs_only_its_layer():
    """A malformed timeout does not stop the settings (dispatch reads them on every run): the layer
    it belongs to raises it when it is used, as it did when the client read the variable itself."""
    s = S.Settings.from_env({"CYBERINE_MEMORY_EMBEDDINGS": "ollama", "CYBERINE_MEMORY_EMBED_TIMEOUT": "soon",
                             "CYBERINE_MEMORY_MODEL": "ollama:m", "CYBERINE_MEMORY_MODEL_TIMEOUT": "-1"}, memory_dir="/x")
    with pytest.raises(ValidationError, match="CYBERINE_MEMORY_EMBED_TIMEOUT='soon' is not a positive number"):
        embeddings.embed_config(s.embeddings)
    with pytest.raises(ValidationError, match="CYBERINE_MEMORY_MODEL_TIMEOUT='-1'"):
        distillation.distill_config(s.distill)
    quiet = S.Settings.from_env({"CYBERINE_MEMORY_EMBED_TIMEOUT": "soon"}, memory_dir="/x")
    assert embeddings.embed_config(quiet.embeddings) is None, "a companion of a layer that is off is never checked"


def test_a_relative_root_can_be_relative_to_another_directory(tmp_path):
    s = S.Settings.from_env({"CYBERINE_HOME": "home"}, relative_to=tmp_path)
    assert (s.memory_dir, s.memory_from) == (tmp_path / "home" / "memory", "CYBERINE_HOME")


def _usage_table() -> set[str]:
    text = (REPO / "USAGE.md").read_text(encoding="utf-8")
    start = text.index("| variable | default | what it does |")
    table = text[start:text.index("\n\n", start)]
    names = set(VARIABLE.findall(table))
    for first, rest in re.findall(r"`(CYBERINE_MEMORY)_[A-Z_]+`((?:, `_[A-Z_]+`)+)", table):  # `X_W_KW`, `_W_REC`
        names.update(first + suffix for suffix in re.findall(r"`(_[A-Z_]+)`", rest))
    return names


def test_usage_names_every_variable_cybmem_reads():
    read = set(re.findall(r'"((?:CYBERINE|OPENAI|OLLAMA)_[A-Z_]*[A-Z])"', (PACKAGE / "settings.py").read_text()))
    table = _usage_table()
    assert read - table == set(), "variables cybmem reads that USAGE.md's table under \"Set up\" does not name"
    assert table - read == set(), "variables USAGE.md's table names that cybmem does not read"
