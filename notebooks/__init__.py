"""The report notebooks (a package only so that pytest imports notebooks/conftest.py under its own
name, never shadowing tests/conftest.py). Nothing to import here."""

__all__: list[str] = []
