"""The report notebooks (a package only so that pytest imports notebooks/conftest.py under its own name)."""
