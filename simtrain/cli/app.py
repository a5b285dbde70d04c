"""The ``simtrain`` typer application, its consoles and the error convention of every command.

Every user error ends as one line ``error: ...`` on stderr and exit status 2, never a traceback
(commands are wrapped by :func:`user_errors`; usage errors such as an unknown flag or a bad type by
:class:`simtrain.cli.usage.OneLineErrors`, also with 2).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import ConfigWarning, SimtrainError
from ..schedules import ScheduleWarning
from .usage import OneLineErrors

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Simulate pipeline-parallel training schedules on real models and hardware.",
)


class LazyConsole:
    """A rich ``Console`` on standard output or error, made on first use; every attribute is the
    console's. Importing rich costs ~30 ms of start-up that a ``--json`` run, which prints with
    ``print``, never needs. The width is the terminal's, or 160 columns on a pipe or file.

    Args:
        stderr: write to standard error instead of standard output.
    """

    def __init__(self, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None
        self._lock = threading.Lock()  # the progress bar's timer thread may make it first

    @property
    def console(self) -> Console:
        """The rich console (made on the first call)."""
        with self._lock:
            if self._console is None:
                from rich.console import Console

                stream = sys.stderr if self._stderr else sys.stdout
                self._console = Console(stderr=self._stderr, width=None if stream.isatty() else 160)
            return self._console

    @property
    def is_terminal(self) -> bool:
        """rich's ``Console.is_terminal``, without making the console where its answer is
        certainly False: neither ``TTY_COMPATIBLE`` nor ``FORCE_COLOR`` in the environment (rich
        15's only overrides that can make it True) and a stream that is not a tty (a ``--json``
        run's pipe, whose progress bar must not import rich, :mod:`simtrain.progress`)."""
        if self._console is None and not ({"TTY_COMPATIBLE", "FORCE_COLOR"} & os.environ.keys()):
            isatty = getattr(sys.stderr if self._stderr else sys.stdout, "isatty", None)
            try:
                if isatty is None or not isatty():
                    return False
            except ValueError:  # a closed stream
                return False
        return self.console.is_terminal

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)

    # Python looks special methods up on the type, past __getattr__: rich's Live (the progress
    # bars) enters its console with ``with console:``, so these two are forwarded by hand.
    def __enter__(self) -> Console:
        return self.console.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.console.__exit__(*exc)


out = LazyConsole()
err = LazyConsole(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"simtrain {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="print simtrain's version and exit")] = False) -> None:
    """Simulate pipeline-parallel training schedules on real models and hardware."""


def _print_warnings(caught: list[warnings.WarningMessage]) -> None:
    """Print schedule and config warnings as ``warning: ...`` lines on stderr, each text once (a
    check run once per simulated schedule says the same thing each time); pass others on."""
    said: set[str] = set()
    for w in caught:
        if issubclass(w.category, (ScheduleWarning, ConfigWarning)):
            if str(w.message) not in said:
                said.add(str(w.message))
                err.print(f"warning: {w.message}", markup=False, highlight=False, soft_wrap=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def user_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Decorate a command so a :class:`SimtrainError` prints ``error: ...`` and exits with 2, and
    schedule warnings print as ``warning: ...``."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ScheduleWarning)
            warnings.simplefilter("always", ConfigWarning)
            try:
                command(*args, **kwargs)
            except SimtrainError as exc:
                _print_warnings(caught)
                err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(2) from None
        _print_warnings(caught)

    return wrapper


def main() -> None:
    """Console-script entry point (``simtrain``)."""
    app(prog_name="simtrain")
