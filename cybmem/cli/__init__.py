"""The ``cybmem`` command line. The Typer app is :mod:`cybmem.cli.app`; this file imports nothing,
it only hands the console script (pyproject's ``cybmem.cli:console``) on."""


def console() -> None:
    """The ``cybmem`` console script: :func:`cybmem.cli.app.console`."""
    from .app import console as run  # here, not at the top: `import cybmem.cli` stays empty

    run()
