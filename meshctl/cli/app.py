"""The `meshctl` command: one typer app, each command in a module of its own."""

from __future__ import annotations

import logging

import typer

from meshctl import __version__
from meshctl.cli import validate as validate_cmd

app = typer.Typer(
    name="meshctl",
    help="Istio's traffic API for Envoy on VMs and bare metal: Istio YAML in, xDS out.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

app.command(
    "validate",
    epilog="Examples:\n\n  meshctl validate examples/configs/\n\n"
    "  meshctl validate -o github configs/   # annotations on a pull request\n\n"
    "  cat vs.yaml | meshctl validate -",
)(validate_cmd.validate)


@app.command("version")
def version() -> None:
    """Print meshctl's version."""
    typer.echo(__version__)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()
