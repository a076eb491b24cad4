"""The optional parts of cybmem and the extra that installs each: a part imports what only its
extra brings through :func:`require`, so a base install that reaches it says in one line which
extra to install instead of ending in an ImportError.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import CybmemError

__all__ = ["require"]


def require(module: str, *, extra: str, what: str, package: str | None = None) -> ModuleType:
    """``module`` imported, or a :class:`~cybmem.errors.CybmemError` that names the extra to install.

    Args:
        module: the module to import (``"nbclient"``, ``"prov.model"``).
        extra: the extra of cybmem that installs it (``notebook``, ``export``, ``fleet``, ``secrets``).
        what: the part of cybmem that needs it, as the message's subject ("cybmem report").
        package: the distribution's name when it differs from the module's first part.

    Example: ``require("prov.model", extra="export", what="a PROV export", package="prov")`` raises
    "a PROV export needs the prov package: pip install 'cybmem[export]'" where prov is missing.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        name = package or module.split(".")[0]
        raise CybmemError(f"{what} needs the {name} package: pip install 'cybmem[{extra}]'") from None
