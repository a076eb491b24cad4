"""nbval runs the notebooks as a user of the checkout would: nothing set, so they read the fixtures.

Their parameter cells leave MEMORY_DIR and PROJECT at None: the environment decides
(CYBERINE_MEMORY_DIR, CYBERINE_HOME, CYBERINE_MEMORY_PROJECT), else the checkout's fixtures
(cybmem.memory.Memory.for_notebook). The kernels inherit this process's environment, so those
variables are taken out of it first: a store of the person running the tests must not change
the outputs nbval compares. Reading the fixtures leaves nothing behind (they carry ``.nocache``;
tests/conftest.py checks at the end of the session).
"""

from __future__ import annotations

import os

_STORE_VARIABLES = ("CYBERINE_MEMORY_DIR", "CYBERINE_HOME", "CYBERINE_MEMORY_PROJECT")


def pytest_collection_modifyitems(session, config, items):
    if any(getattr(item, "cell", None) is not None for item in items):
        for name in _STORE_VARIABLES:
            os.environ.pop(name, None)
