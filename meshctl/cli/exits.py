"""How a command ends: the one place where errors become a line on stderr and an exit status.

A command raises an error of meshctl's tree (`meshctl.errors`) and never prints it or picks an
exit status for it; `@reported` on every command does both, the same way for all of them:

    MeshctlError     its findings, if it carries any (OfflineError), then `error: MESSAGE`   exit 2
    anything else    `error: internal error: TYPE: MESSAGE`                                   exit 2

0 and 1 are the commands' own answers ("valid", "invalid"; "nothing changes", "something does"),
raised as `typer.Exit` and passed through untouched, as are typer's own usage errors. A failure
of any kind exits 2, so it can never be read as an answer, and stdout holds nothing but what the
command was asked for.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from typer.exceptions import TyperException

from meshctl.errors import MeshctlError, OfflineError

#: The exit status of every error that ends a command: a bad flag or address, a missing file, a
#: server that is not there, input a command cannot work from, a crash.
EXIT_ERROR = 2

logger = logging.getLogger("meshctl.cli")

P = ParamSpec("P")
R = TypeVar("R")


def failure(exc: Exception) -> tuple[str, int]:
    """The line a person reads on stderr when `exc` ends a command, and the exit status.

    An error of meshctl's tree already says what is wrong and where, in the user's terms. Anything
    else is meshctl's own bug and is named as one, with its type, so that a report of it can be
    traced; it exits 2 like the rest, since 1 would read as "invalid" or "something changes"."""
    if isinstance(exc, MeshctlError):
        return str(exc), EXIT_ERROR
    return f"internal error: {type(exc).__name__}: {exc}", EXIT_ERROR


def reported(command: Callable[P, R]) -> Callable[P, R]:
    """`command` behind the edge every command shares (see the module's docstring). It wraps the
    function itself, not its registration in `meshctl.cli.app`, so a command run on its own
    (`typer.run(dump)`) ends the same way."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, TyperException):
            raise
        except Exception as exc:
            raise typer.Exit(report(exc)) from exc

    return run


def report(exc: Exception) -> int:
    """Print what ended a command and return its exit status (`failure`). A crash's traceback
    goes to the debug log only: the terminal gets one line, `serve --log-level debug` the rest."""
    from meshctl.cli import output as out

    message, status = failure(exc)
    if isinstance(exc, OfflineError) and exc.findings:
        from meshctl.config.findings import Finding

        out.print_findings([f for f in exc.findings if isinstance(f, Finding)], "text", sys.stderr)
    if not isinstance(exc, MeshctlError):
        logger.debug("%s", message, exc_info=exc)
    out.error(message)
    return status
