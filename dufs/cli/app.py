"""The ``dufs`` command line's frame: the typer app and its group (usage errors in one line), the error boundary
every command runs in (``error: ...``, exit 2; ``--debug`` for tracebacks), the checks of output paths, and the
cluster a command runs on (``--scheduler``, ``--workers``, or an embedded ``LocalCluster``)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from typer.core import TyperCommand, TyperGroup

from dufs.errors import DufsError, ParameterError


class _Console(Console):
    """rich's Console with its width read from ``COLUMNS`` when it prints: rich fixes the width of a console made
    while ``COLUMNS`` is set (as it is in pytest-xdist's workers), and a later ``COLUMNS`` would not change it."""

    @property
    def size(self) -> ConsoleDimensions:
        got = Console.size.fget(self)
        cols = os.environ.get("COLUMNS", "")
        return ConsoleDimensions(int(cols), got.height) if cols.isdigit() and int(cols) > 0 else got

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


# no emoji codes: "file.svm:100:" must not print as "file.svm💯"
console = _Console(stderr=True, emoji=False)
out = _Console(emoji=False)


# click's exception classes as this typer uses them (recent typer releases vendor their own click)
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_NoArgsIsHelp = getattr(sys.modules[_UsageError.__module__], "NoArgsIsHelpError", ())


def _no_bool_type(params: list) -> list:
    """Flags (``--debug``, ``--overwrite``, ``--help``) without the ``<bool>`` type column in ``--help``: they take no
    value."""
    for p in params:
        if getattr(p, "is_bool_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class _Command(TyperCommand):
    """A ``dufs`` command: its flags show no ``<bool>`` in ``--help``."""

    def get_params(self, ctx: Any) -> list:
        return _no_bool_type(super().get_params(ctx))


class _Group(TyperGroup):
    """The ``dufs`` group: usage errors (a missing option, a value of the wrong type, an unknown command) are one
    line, ``error: ... (see dufs CMD --help)``, exit 2, like every other error of the command line."""

    def get_params(self, ctx: Any) -> list:
        return _no_bool_type(super().get_params(ctx))

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NoArgsIsHelp as e:
            out.print(e.ctx.get_help(), highlight=False, markup=False)
            sys.exit(2)
        except _UsageError as e:
            where = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
            console.print(f"[bold red]error:[/] {escape(' '.join(e.format_message().split()))}{escape(where)}",
                          highlight=False, soft_wrap=True)
            sys.exit(2)
        except _ClickException as e:
            console.print(f"[bold red]error:[/] {escape(' '.join(e.format_message().split()))}", highlight=False,
                          soft_wrap=True)
            sys.exit(e.exit_code)
        except (typer.Abort, KeyboardInterrupt):
            console.print("interrupted", highlight=False)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="dufs: distributed, out-of-core feature selection for huge sparse data.")

SchedulerOpt = typer.Option(None, "--scheduler", help="Address of a running dask scheduler (tcp://host:8786).")
WorkersOpt = typer.Option(None, "--workers", help="Workers of the embedded LocalCluster (default: one a core, "
                                                   "but `select` runs a store of at most dufs.engine.inline-nnz "
                                                   "nonzeros in this process, and `convert` inputs of at most "
                                                   "dufs.convert.local-bytes on its threads; 0: local threads, no "
                                                   "cluster).")


_DEBUG = {"on": bool(os.environ.get("DUFS_DEBUG"))}


def _print_version(value: bool) -> None:
    if value:
        from dufs._version import versions

        for name, ver in versions().items():
            out.print(f"{name} {ver}", highlight=False, markup=False)
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks instead of one-line errors "
                                                             "(also DUFS_DEBUG=1)."),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print the versions of dufs, the libraries it runs on and "
                                            "Python, and exit.")) -> None:
    _DEBUG["on"] = debug or bool(os.environ.get("DUFS_DEBUG"))


def command(*args: Any, **kwargs: Any) -> Any:
    """``app.command`` whose failures end in one line on stderr and exit 2 (bad input: a DufsError, an OSError, a
    ValueError, a truncated stream) or 1 (anything else, an internal error), never a traceback, unless ``--debug``.
    """
    def deco(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            except (typer.Exit, typer.Abort, SystemExit):
                raise
            except KeyboardInterrupt:  # said here: typer makes it a silent exit 130 before the group sees it
                console.print("interrupted", highlight=False)
                raise typer.Exit(130) from None
            except Exception as exc:  # noqa: BLE001 - the command line's boundary
                if _DEBUG["on"] or isinstance(exc, _ClickException):
                    raise
                fail(exc)
        kwargs.setdefault("cls", _Command)
        kwargs.setdefault("help", _help_text(fn.__doc__))
        return app.command(*args, **kwargs)(wrapper)
    return deco


def _help_text(doc: str | None) -> str | None:
    """A docstring as ``--help`` text: each paragraph one line (rich keeps a docstring's line breaks, so the list of
    commands broke sentences where the source did), paragraphs apart."""
    import inspect

    if not doc:
        return None
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


def one_line(exc: BaseException) -> str:
    """What a user reads: the message of an error (an OSError as ``path: reason``), on one line."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
        if exc.filename2 is not None:
            text += f" (-> {exc.filename2})"
    elif isinstance(exc, DufsError | OSError | ValueError | EOFError):
        text = str(exc) or type(exc).__name__
    else:
        text = f"internal error ({type(exc).__name__}: {exc}); run with --debug for the traceback"
    return " ".join(text.split())


def in_flags(exc: BaseException, flags: dict[str, str]) -> BaseException:
    """``exc`` in the command line's words: a library's ``The 'n_rows' parameter of make_synthetic must be an int
    in [1, n_features]`` as ``--rows must be an int in [1, --features]`` (``flags``: parameter name -> flag), and
    ``pass overwrite=True (--overwrite)`` as ``pass --overwrite``."""
    import re

    text = str(exc)
    m = re.match(r"The '(\w+)' (?:parameter|setting)(?: of \w+)? (must .*)", text, re.S)
    if m and m[1] in flags:
        rest = m[2]
        for name, flag in flags.items():  # the other parameters a constraint names
            rest = re.sub(rf"(?<![\w'-]){name}(?!\w)", flag, rest)
        text = f"{flags[m[1]]} {rest}"
    text = text.replace("overwrite=True (--overwrite)", "--overwrite")
    for name, flag in flags.items():  # name=value, as a library message says it
        text = re.sub(rf"(?<![\w-]){name}=True\b", flag, text)
        text = re.sub(rf"(?<![\w-]){name}=(?!True\b)(\S+)", rf"{flag} \1", text)
    if text == str(exc):
        return exc
    try:
        return type(exc)(text)
    except TypeError:
        return DufsError(text)


def check_output_file(path: Path | None, option: str) -> None:
    """Before any work: a file can be written at ``path`` (its folder exists and is writable; it is no folder)."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ParameterError(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise ParameterError(f"{option} {path}: the folder {parent} does not exist")
    _check_writable(parent, f"{option} {path}")


def _check_writable(folder: Path, what: str) -> None:
    """A file can be made in ``folder`` (tried, not guessed from permission bits: root passes those everywhere)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dufs-write-check-"):
            pass
    except OSError as exc:
        raise ParameterError(f"{what}: cannot write in the folder {folder} ({exc.strerror or exc})") from None


def check_output_dir(path: str | Path, what: str) -> None:
    """Before any work: a store (a folder) can be made at a local ``path``: its parent folder exists and is
    writable (URLs are checked by the store layer)."""
    if "://" in str(path):
        return
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ParameterError(f"{what} {path}: {parent} is not a folder")
    if not parent.is_dir():
        raise ParameterError(f"{what} {path}: the folder {parent} does not exist")
    _check_writable(parent, f"{what} {path}")


@contextlib.contextmanager
def cluster(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """A distributed Client on ``scheduler``, or on an embedded LocalCluster of processes; None for threads.

    A ``scheduler`` that cannot be reached (or is no address) is a :class:`DufsError` naming it, after at most
    ``dufs.cluster.connect-timeout`` (default 10 s), instead of distributed's traceback after 30 s.
    """
    from dufs.engine.cluster import get_client

    if scheduler:
        _probe_scheduler(scheduler)
    with contextlib.ExitStack() as stack:
        try:
            c = stack.enter_context(get_client(scheduler_address=scheduler, n_workers=workers,
                                               synchronous=workers == 0 and not scheduler))
        except (OSError, ValueError) as exc:
            if not scheduler or isinstance(exc, DufsError):
                raise
            raise _scheduler_error(scheduler, exc) from None
        yield c


def _scheduler_error(address: str, exc: BaseException) -> DufsError:
    why = " ".join(str(exc).split()) or type(exc).__name__  # one line
    return DufsError(f"cannot connect to the Dask scheduler at {address}: {why}")


def _probe_scheduler(address: str) -> None:
    """Open and close one connection to ``address`` within the connect timeout (the Client itself then connects
    with distributed's own timeouts, which its later calls also use)."""
    import asyncio

    import dask.utils
    from distributed.comm import connect
    from distributed.security import Security

    from dufs import config

    timeout = dask.utils.parse_timedelta(config.get("cluster.connect-timeout", "10s"), "s")

    async def probe() -> None:
        comm = await connect(address, timeout=timeout, **Security().get_connection_args("client"))
        await comm.close()

    try:
        asyncio.run(probe())
    except (OSError, ValueError, TypeError) as exc:
        raise _scheduler_error(address, exc) from None


def fail(exc: BaseException) -> None:
    if _DEBUG["on"]:  # --debug: the traceback (a DufsError the command caught itself included)
        raise exc
    user = isinstance(exc, DufsError | OSError | ValueError | EOFError)
    console.print(f"[bold red]error:[/] {escape(one_line(exc))}", highlight=False, soft_wrap=True)  # no wrapping
    raise typer.Exit(2 if user else 1)


def bytes_progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console,
                    disable=not console.is_terminal and not os.environ.get("DUFS_PROGRESS"))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)

