"""Start-up tricks of the console script, for the commands that opt in (``command(..., quick=True)``).

A dispatcher runs ``cybmem inject`` and ``cybmem write`` on every task, so their start-up is paid
on every run. Each trick applies only in a process that runs one command (:func:`cybmem.cli.app.main`
sets :data:`one_command_process`) and only to a command that asked for it; each has a subprocess
test of the console script in tests/cli/test_startup.py. Only public names of other libraries are used:
typer's ``TyperCommand``/``TyperOption``/``TyperArgument`` classes and Click's ``process_value``.

- plain options: str, Path, int and flag values are coerced here, not by typer's pydantic
  TypeAdapter (no pydantic import);
- no pandas: pyarrow's optional probe for pandas is refused;
- a quick pyarrow.compute: a stand-in for its docstring parser;
- only the named command is built;
- the process ends without the interpreter's teardown.

The import tricks need no Typer: this module imports it only where a parsing trick uses it, so that
``cybmem hook`` (an agent runs it on every prompt, without the app: :mod:`cybmem.hooks.entry`) takes
them without paying for Typer.

What each saves: benchmarks/RESULTS.md, "Figures the module docstrings quoted".
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

if typing.TYPE_CHECKING:  # pragma: no cover
    import typer

#: Set by :func:`cybmem.cli.app.main`: this process runs one command and exits.
one_command_process = False
#: Set by a command's wrapper: the command that ran opted in to ending without the teardown (see :func:`end`).
quick_ran = False


# --- plain options ---------------------------------------------------------------------

# What pydantic's lax int accepts from a string (tested against it): ASCII digits, underscores
# between them, a sign, surrounding whitespace and a zero fraction ("3.0").
_INT_TEXT = re.compile(r"\s*([+-]?\d+(?:_\d+)*)(?:\.0+)?\s*", re.ASCII)


def plain_int(value, lo: Optional[int], hi: Optional[int], param=None, ctx=None) -> int:
    """An int option's value as typer's pydantic coercion gives it, with its messages."""
    import typer

    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (m := _INT_TEXT.fullmatch(value)):
        number = int(m.group(1))
    else:
        raise typer.BadParameter("Input should be a valid integer, unable to parse string as an integer", ctx=ctx, param=param)
    if lo is not None and number < lo:
        raise typer.BadParameter(f"Input should be greater than or equal to {lo}", ctx=ctx, param=param)
    if hi is not None and number > hi:
        raise typer.BadParameter(f"Input should be less than or equal to {hi}", ctx=ctx, param=param)
    return number


def plain_flag(value, param, ctx):
    return value if isinstance(value, bool) else NotImplemented  # "--x VALUE" bools: typer's own parsing


def plain_coercion(annotation) -> Optional[Callable]:
    """The coercion of a plain option declared as ``Annotated[T, typer.Option(...)]`` (or Argument),
    T one of str, Path, int, bool (optional or not) with nothing to check beyond an int's range;
    None for anything else (a float, a choice, path checks, a parser: typer's own coercion)."""
    import typer

    if typing.get_origin(annotation) is not typing.Annotated:
        return None
    kind, *meta = typing.get_args(annotation)
    info = next((m for m in meta if isinstance(m, typer.models.ParameterInfo)), None)
    if typing.get_origin(kind) is typing.Union:
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = rest[0] if len(rest) == 1 else None
    if info is None or info.parser is not None or getattr(info, "click_type", None) is not None:
        return None
    if kind is str:
        return lambda value, param, ctx: str(value)
    if kind is bool:
        return plain_flag
    if kind is int and not info.clamp:
        return lambda value, param, ctx: plain_int(value, info.min, info.max, param, ctx)
    if kind is Path and not (info.exists or info.resolve_path or info.allow_dash or info.path_type is not None
                             or not info.file_okay or not info.dir_okay or info.writable or info.readable is False):
        return lambda value, param, ctx: Path(value)
    return None


def _plain_value(param, ctx, value, typers: Callable):
    """A parameter's value as the command's ``plain`` table coerces it (Click's public
    ``process_value``); a value it does not take, or a missing required one, goes to ``typers``."""
    if value is None and param.required:
        return typers(ctx, value)  # typer's message for a missing value
    if value is not None:
        plain = ctx.command.plain[param.name](value, param, ctx)
        if plain is NotImplemented:
            return typers(ctx, value)
        value = plain
    return param.callback(ctx, param, value) if param.callback is not None else value


@functools.cache
def _plain_classes() -> dict[type, type]:
    """Typer's option and argument classes, each with the plain coercion in its place."""
    from typer.core import TyperArgument, TyperOption

    class _PlainOption(TyperOption):
        def process_value(self, ctx, value):
            return _plain_value(self, ctx, value, super().process_value)

    class _PlainArgument(TyperArgument):
        def process_value(self, ctx, value):
            return _plain_value(self, ctx, value, super().process_value)

    return {TyperOption: _PlainOption, TyperArgument: _PlainArgument}


class _QuickCommand:
    """A command that opted in: its plain parameters (and its --help) are coerced by :func:`_plain_value`."""

    plain: dict[str, Callable] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name in self.plain:
                _make_plain(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        return option if option is None else _make_plain(option)


def _make_plain(param):
    plain = _plain_classes().get(type(param))
    if plain is not None:
        param.__class__ = plain
    return param


def quick_class(base: type, plain: dict[str, Callable]) -> type:
    """A command class for ``typer.Typer.command(cls=...)`` (or ``typer.Typer(cls=...)``): ``base``
    (a TyperCommand or TyperGroup) with the parameters named in ``plain`` (name -> coercion from
    :func:`plain_coercion`) and its --help option coerced here."""
    return type(f"Quick{base.__name__}", (_QuickCommand, base), {"plain": {"help": plain_flag, **plain}})


def is_quick(command_info) -> bool:
    """Whether a registered command (a typer CommandInfo) opted in."""
    return isinstance(command_info.cls, type) and issubclass(command_info.cls, _QuickCommand)


def named_only(app: "typer.Typer", args: list[str]) -> "typer.Typer":
    """The app, narrowed to the one command the arguments name when it opted in: Click then builds
    that command only; help, usage and errors read the same (the same command objects)."""
    chosen = [c for c in app.registered_commands if args and c.name == args[0] and is_quick(c)]
    if not chosen:
        return app
    one = copy.copy(app)
    one.registered_commands = chosen
    return one


# --- imports ----------------------------------------------------------------------------


class _RefusePandas:
    """A meta-path entry that makes ``import pandas`` fail (see :func:`quick_imports`)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of cybmem's dispatch path)", name=name)
        return None


def docstring_stand_in(doc: str | None) -> dict:
    """What pyarrow.compute asks its vendored numpydoc parser for (see :func:`quick_compute_import`)."""
    return {"Parameters": []}


def quick_compute_import() -> None:
    """Import pyarrow.compute with a stand-in for the numpydoc parsing behind its docstrings (15
    ms of the 30 its import takes): the ~280 generated functions lack their options' descriptions
    in ``help()``; functions, options and results are unchanged. A pyarrow whose compute module
    wants more of the parser than the stand-in has is imported the ordinary way."""
    if "pyarrow.compute" in sys.modules or "pyarrow.vendored.docscrape" in sys.modules:
        return
    fake = types.ModuleType("pyarrow.vendored.docscrape")
    fake.NumpyDocString = docstring_stand_in
    sys.modules[fake.__name__] = fake
    try:
        import pyarrow.compute  # noqa: F401
    except Exception:  # noqa: BLE001 - another pyarrow: the ordinary import below says what is wrong, if anything
        sys.modules.pop("pyarrow.compute", None)
    finally:
        sys.modules.pop(fake.__name__, None)
    import pyarrow.compute  # noqa: F401,F811


@contextlib.contextmanager
def quick_imports(compute: bool = True) -> Iterator[None]:
    """Keep a command that does not need them free of two import costs, in a process that runs
    one command and only there:

    - pandas: pyarrow imports it on its first numpy conversion only to look for optional pandas
      types, and works without it. pyarrow remembers a refused import for the life of the
      process, and a program that runs commands in-process (tests through CliRunner) may build
      DataFrames later; a process that already has pandas keeps it.
    - with ``compute`` (a command that reads a store), pyarrow.compute's docstring parsing
      (:func:`quick_compute_import`)."""
    if not one_command_process:
        yield
        return
    refuse = "pandas" not in sys.modules
    if refuse:
        sys.meta_path.insert(0, _RefusePandas)
    try:
        if compute:
            quick_compute_import()
        yield
    finally:
        if refuse:
            sys.meta_path.remove(_RefusePandas)


# --- the way out ----------------------------------------------------------------------------


def end(run: Callable[[], Any]) -> None:
    """Call ``run`` (the console script's main); after a command that opted in, the process ends as
    soon as stdout and stderr are flushed, without the interpreter's teardown (freeing numpy's and
    pyarrow's modules, which the dispatcher waits for on every run; and Arrow's thread pools, which a
    command that read Parquet leaves behind and whose teardown aborts the process now and then:
    "terminate called without an active exception", apache/arrow#34314). What such a command writes
    to files is closed or fsynced before it returns. Exit codes are the usual ones; an unexpected
    exception, a broken pipe or any other command takes the ordinary way out."""
    global quick_ran
    quick_ran = False
    try:
        run()
    except SystemExit as exc:
        code = exc.code
        if not quick_ran or not (code is None or isinstance(code, int)):
            raise
    else:
        code = 0
    if not quick_ran:
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code or 0)


__all__ = ["end", "is_quick", "named_only", "plain_coercion", "plain_flag", "plain_int",
           "quick_class", "quick_compute_import", "quick_imports"]
