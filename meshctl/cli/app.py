"""The `meshctl` command: one typer app, each command in a module of its own."""

from __future__ import annotations

import os

import typer

from meshctl import __version__
from meshctl.cli import bootstrap as bootstrap_cmd
from meshctl.cli import diff as diff_cmd
from meshctl.cli import dump as dump_cmd
from meshctl.cli import proxy_status as proxy_status_cmd
from meshctl.cli import serve as serve_cmd
from meshctl.cli import services as services_cmd
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


app.command(
    "serve",
    epilog="Examples:\n\n  meshctl serve --config-dir examples/configs\n\n"
    "  meshctl serve -c /etc/meshctl/mesh --consul 127.0.0.1:8500 --xds-address 0.0.0.0:15010\n\n"
    "  MESHCTL_CONFIG_DIR=/etc/meshctl/mesh MESHCTL_LOG_FORMAT=json meshctl serve"
    "   # every flag has a MESHCTL_ variable",
)(serve_cmd.serve)

app.command(
    "services",
    epilog="Examples:\n\n  meshctl services --config-dir examples/configs\n\n"
    "  meshctl services --consul 127.0.0.1:8500 -o json",
)(services_cmd.services)

app.command(
    "dump",
    epilog="Examples:\n\n  meshctl dump --config-dir examples/configs --proxy reviews-v1-vm.bookinfo\n\n"
    "  meshctl dump --config-dir configs/ --proxy ingressgateway-vm.bookinfo -o short --type routes",
)(dump_cmd.dump)

app.command(
    "diff",
    epilog="Examples:\n\n  meshctl diff old/ new/ --proxy reviews-v3-vm.bookinfo\n\n"
    "  meshctl diff main/ pr/ --all-proxies -o json",
)(diff_cmd.diff)

app.command(
    "bootstrap",
    epilog="Examples:\n\n  meshctl bootstrap --proxy reviews-v1-vm.bookinfo --ip 10.10.0.41"
    " --xds-address 10.10.0.1:15010 > envoy.yaml && envoy -c envoy.yaml",
)(bootstrap_cmd.bootstrap)

app.command(
    "proxy-status",
    epilog="Examples:\n\n  meshctl proxy-status\n\n  meshctl proxy-status --admin 10.10.0.1:15014 --errors",
)(proxy_status_cmd.proxy_status)


@app.command(
    "version", epilog="Examples:\n\n  meshctl version\n\n  meshctl --install-completion   # then restart the shell"
)
def version() -> None:
    """Print meshctl's version."""
    typer.echo(__version__)


def main() -> None:
    from meshctl.logs import configure_logging

    # Warnings and errors only until a command asks for more (`meshctl serve --log-level`).
    configure_logging("warning", "text", environ=os.environ)
    app()
