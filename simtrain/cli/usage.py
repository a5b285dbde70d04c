"""Usage errors (click's) in simtrain's one error format.

typer formats click's usage errors (an unknown flag, a missing value, ``--pp abc``) as a boxed,
five-line panel. :class:`OneLineErrors` is the app's command group: it runs click in
non-standalone mode and prints every click error as the one line simtrain uses everywhere,
``error: <message>`` on stderr, with click's exit status (2 for usage errors). Help
(``--help``, or no arguments) prints as before.
"""

from __future__ import annotations

import sys
from typing import Any

from typer.core import TyperGroup
from typer import exceptions as typer_errors
from typer._click import exceptions as click_errors


def _typed_value(exc: Exception, args: list[str]) -> str | None:
    """The value typed for the option a bad-parameter error is about (``--workers 0`` -> ``0``),
    which typer's range message (``Input should be greater than or equal to 1``) leaves out;
    None when it cannot be found."""
    param = getattr(exc, "param", None)
    names = getattr(param, "opts", None) or []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in names:
            return value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return None


class OneLineErrors(TyperGroup):
    """typer's command group, with click errors printed as one ``error:`` line."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode: bool = True, **extra: Any) -> Any:
        """Run the command line; see :class:`typer.core.TyperGroup`.

        Returns:
            The command's return value in non-standalone mode; otherwise exits.

        Raises:
            SystemExit: the exit status (0, or the command's / click's status).
        """
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:  # typer's rich help printed it already
            if exc.format_message().strip():
                print(exc.format_message())
            rv = 0 if standalone_mode else None
        except click_errors.ClickException as exc:
            command = f"{exc.ctx.command_path}: " if getattr(exc, "ctx", None) is not None else ""
            message = " ".join(exc.format_message().split())
            given = _typed_value(exc, sys.argv[1:] if args is None else list(args))
            if given is not None and f"'{given}'" not in message and f" {given} " not in f" {message} ":
                message += f" (given: {given})"
            print(f"error: {command}{message}", file=sys.stderr)
            if not standalone_mode:
                raise
            sys.exit(exc.exit_code)
        except typer_errors.Abort:
            print("error: aborted", file=sys.stderr)
            if not standalone_mode:
                raise
            sys.exit(1)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv
