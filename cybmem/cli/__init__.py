"""The ``cybmem`` command line. The Typer app is :mod:`cybmem.cli.app`; this file imports nothing,
it only hands the console script (pyproject's ``cybmem.cli:console``) on: ``cybmem hook`` (an agent's
hooks run it on every prompt and turn) straight to :mod:`cybmem.hooks.entry`, without the app."""


def console() -> None:
    """The ``cybmem`` console script: :func:`cybmem.cli.app.console`, or for ``cybmem hook [CLIENT]``
    (no option: ``cybmem hook --help`` is the app's) :func:`cybmem.hooks.entry.console`."""
    import sys

    args = sys.argv[1:]
    if args[:1] == ["hook"] and len(args) <= 2 and not any(a.startswith("-") for a in args):
        from ..hooks.entry import console as hook

        hook(args[1:])
    from .app import console as run  # here, not at the top: `import cybmem.cli` stays empty

    run()
