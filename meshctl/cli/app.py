"""The `meshctl` command: one typer app, each command in a module of its own.

The conventions istioctl, kubectl and kumactl users expect hold for every command, set here once:
`-h` as well as `--help`, `meshctl --version`, option values named for what they are (`ADDR`,
`PATH`, `NODE_ID`; `_name_values`) rather than for their Python type, and help paragraphs that
reflow to the terminal's width (`_reflow`) instead of keeping the docstrings' line breaks.

Every command ends the same way too: it raises an error of meshctl's tree and `@reported`
(`meshctl.cli.exits`) turns it into one line on stderr and exit 2.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import OptionInfo

from meshctl import __version__
from meshctl.cli import bootstrap as bootstrap_cmd
from meshctl.cli import ca as ca_cmd
from meshctl.cli import coercion
from meshctl.cli import delivery as delivery_cmd
from meshctl.cli import diff as diff_cmd
from meshctl.cli import dump as dump_cmd
from meshctl.cli import hosts as hosts_cmd
from meshctl.cli import kv as kv_cmd
from meshctl.cli import proxy_status as proxy_status_cmd
from meshctl.cli import serve as serve_cmd
from meshctl.cli import services as services_cmd
from meshctl.cli import simulate as simulate_cmd
from meshctl.cli import validate as validate_cmd
from meshctl.cli.exits import reported

try:  # a recent typer vendors click, and does not re-export this one of its errors
    from typer._click.core import Context
    from typer._click.exceptions import NoSuchOption
except ImportError:  # an older typer, on click itself
    from click.core import Context  # type: ignore[assignment,no-redef,import-not-found,unused-ignore]
    from click.exceptions import NoSuchOption  # type: ignore[no-redef,import-not-found,unused-ignore]


class _Group(TyperGroup):
    """typer's group, its own options (--version, the completion ones) converted without pydantic."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        for param in self.get_params(ctx):
            coercion.install(param)  # plain values without pydantic (`meshctl.cli.coercion`)
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_Group,
    name="meshctl",
    help="Istio's traffic API for Envoy on VMs and bare metal: Istio YAML in, xDS out.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: What each option's value is, by its long name, as help shows it.
_VALUE_NAMES = {
    "--config-dir": "PATH",
    "--mesh-config": "PATH",
    "--xds-address": "ADDR",
    "--admin-address": "ADDR",
    "--admin": "ADDR",
    "--server": "ADDR",
    "--consul": "ADDR",
    "--consul-token": "TOKEN",
    "--consul-ca-file": "PATH",
    "--consul-datacenter": "NAME",
    "--namespace": "NAMESPACE",
    "--debounce": "SECONDS",
    "--debounce-max": "SECONDS",
    "--resync-period": "SECONDS",
    "--tls-cert": "PATH",
    "--tls-key": "PATH",
    "--client-ca": "PATH",
    "--ca-dir": "PATH",
    "--state-dir": "PATH",
    "--admin-token-file": "PATH",
    "--known-host": "HOST",
    "--jobs": "N",
    "--proxy": "NODE_ID",
    "--ip": "IP",
    "--interception": "MODE",
    "--admin-port": "PORT",
    "--stats-port": "PORT",
    "--label": "KEY=VALUE",
    "--xds-ca": "PATH",
    "--xds-cert": "PATH",
    "--xds-key": "PATH",
    "--xds-sni": "NAME",
    "--output": "FORMAT",
    "--type": "TYPE",
    "--log-level": "LEVEL",
    "--log-format": "FORMAT",
}


def _name_values(command: Callable[..., Any]) -> None:
    """Give each option of `command` the value name help shows (`_VALUE_NAMES`; none for a
    flag), unless it names one itself. The commands' modules postpone annotations, which are
    evaluated afresh at each look, so the evaluated ones replace them."""
    hints = typing.get_type_hints(command, include_extras=True)
    command.__annotations__.update(hints)
    for name, hint in hints.items():
        if typing.get_origin(hint) is not Annotated:
            continue
        base, *extras = typing.get_args(hint)
        for info in extras:
            if not isinstance(info, OptionInfo) or info.metavar is not None:
                continue
            # Under Annotated, typer takes the first name given to Option() as its `default`.
            given = (info.default, *(info.param_decls or ()))
            decls = [d for d in given if isinstance(d, str) and d.startswith("--")]
            long_name = decls[0] if decls else "--" + name.replace("_", "-")
            info.metavar = "" if base is bool else _VALUE_NAMES.get(long_name)


def _reflow(doc: str | None) -> str | None:
    """A docstring's paragraphs each as one line, for the terminal to wrap; indented lines
    (examples) keep their breaks."""
    if not doc:
        return doc
    paragraphs = []
    for block in inspect.cleandoc(doc).split("\n\n"):
        lines = block.split("\n")
        paragraphs.append(block if any(line.startswith(" ") for line in lines) else " ".join(lines))
    return "\n\n".join(paragraphs)


#: How alike a mistyped option and a real one must be (difflib's ratio, dashes left out) for
#: the real one to be suggested: `--strcit` gets `--strict`, `--server` is not told `--errors`.
_SUGGEST_CUTOFF = 0.75


class _Command(TyperCommand):
    """typer's command, with usage errors that say only what helps: an unknown option is
    offered only the options it nearly spells, and a bad choice lists the choices without
    pydantic's "Value error," in front."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        for param in self.get_params(ctx):  # the help option too, made on demand
            coercion.install(param)  # plain values without pydantic (`meshctl.cli.coercion`)
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as exc:
            exc.possibilities = _alike(exc.option_name, exc.possibilities or ())
            raise
        except typer.BadParameter as exc:
            exc.message = _CHOICES.sub(_choices, exc.message.removeprefix("Value error, "))
            raise


#: typer's message for a value that is none of the choices: `'xml' is not one of 'text', 'json'.`
_CHOICES = re.compile(r"^(?P<value>.*) is not one of (?P<choices>'.*')\.$")


def _choices(match: re.Match[str]) -> str:
    return f"{match['value']} is not one of {match['choices'].replace(chr(39), '')}"


def _alike(typed: str, options: Iterable[str]) -> list[str]:
    word = typed.lstrip("-")
    return [o for o in options if difflib.SequenceMatcher(None, word, o.lstrip("-")).ratio() >= _SUGGEST_CUTOFF]


def _command(name: str, function: Callable[..., Any], epilog: str, group: typer.Typer = app) -> None:
    _name_values(function)
    group.command(name, cls=_Command, help=_reflow(function.__doc__), epilog=epilog)(function)


_command(
    "validate",
    validate_cmd.validate,
    "Examples:\n\n  meshctl validate examples/configs/\n\n"
    "  meshctl validate -o github configs/   # annotations on a pull request\n\n"
    "  cat vs.yaml | meshctl validate -",
)


_command(
    "serve",
    serve_cmd.serve,
    "Examples:\n\n  meshctl serve --config-dir examples/configs\n\n"
    "  meshctl serve -c /etc/meshctl/mesh --consul 127.0.0.1:8500 --xds-address 0.0.0.0:15010\n\n"
    "  MESHCTL_CONFIG_DIR=/etc/meshctl/mesh MESHCTL_LOG_FORMAT=json meshctl serve"
    "   # every flag has a MESHCTL_ variable",
)

_command(
    "services",
    services_cmd.services,
    "Examples:\n\n  meshctl services --config-dir examples/configs\n\n"
    "  meshctl services --consul 127.0.0.1:8500 -o json",
)

_command(
    "dump",
    dump_cmd.dump,
    "Examples:\n\n  meshctl dump --config-dir examples/configs --proxy reviews-v1-vm.bookinfo\n\n"
    "  meshctl dump --config-dir configs/ --proxy ingressgateway-vm.bookinfo -o short --type routes",
)

_command(
    "hosts",
    hosts_cmd.hosts,
    "Examples:\n\n  meshctl hosts --config-dir /etc/meshctl/mesh --proxy orders-vm.shop >> /etc/hosts\n\n"
    "  meshctl hosts --config-dir /etc/meshctl/mesh --proxy orders-vm.shop --resolved",
)

_command(
    "diff",
    diff_cmd.diff,
    "Examples:\n\n  meshctl diff old/ new/ --proxy reviews-v3-vm.bookinfo\n\n"
    "  meshctl diff main/ pr/ --all-proxies -o json",
)

_command(
    "simulate",
    simulate_cmd.simulate,
    "Examples:\n\n  meshctl simulate http://reviews.bookinfo.mesh:9080/reviews/1 --config-dir examples/configs"
    " --proxy productpage-v1-vm.bookinfo -H end-user:jason\n\n"
    "  meshctl simulate http://bookinfo.example.com:8080/productpage --config-dir configs/"
    " --proxy ingressgateway-vm.bookinfo -o json",
)

_command(
    "bootstrap",
    bootstrap_cmd.bootstrap,
    "Examples:\n\n  meshctl bootstrap --proxy reviews-v1-vm.bookinfo --ip 10.10.0.41"
    " --xds-address 10.10.0.1:15010 > envoy.yaml && envoy -c envoy.yaml",
)

_command(
    "proxy-status",
    proxy_status_cmd.proxy_status,
    "Examples:\n\n  meshctl proxy-status\n\n  meshctl proxy-status --admin 10.10.0.1:15014 --errors",
)


ca_app = typer.Typer(
    name="ca",
    help="The mesh's certificate authority: its root, and certificates for VM proxies and the xDS server.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_command(
    "root",
    ca_cmd.root,
    "Examples:\n\n  meshctl ca root > mesh-root.pem\n\n  meshctl ca root --ca-dir /etc/meshctl/cacerts",
    ca_app,
)
_command(
    "issue",
    ca_cmd.issue,
    "Examples:\n\n  meshctl ca issue --proxy reviews-v1-vm.bookinfo --service-account reviews --out /etc/envoy/xds\n\n"
    "  meshctl ca issue --server meshctl.example.com --server 10.10.0.1 --out /etc/meshctl/tls",
    ca_app,
)
_command(
    "renew",
    ca_cmd.renew,
    "Examples:\n\n  meshctl ca renew --server 10.10.0.1:15010 --dir /etc/meshctl/xds\n\n"
    "  meshctl ca renew --server meshctl.example.com:15010 --dir /etc/meshctl/xds --force",
    ca_app,
)
_command(
    "token",
    ca_cmd.token,
    "Examples:\n\n  meshctl ca token --proxy orders-vm.shop > orders-vm.token\n\n"
    "  meshctl ca token --proxy orders-vm.shop --ttl 15m",
    ca_app,
)
app.add_typer(ca_app)


kv_app = typer.Typer(
    name="kv",
    help="The mesh's config in Consul KV, for meshctl serve --config-consul-kv.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_command(
    "push",
    kv_cmd.push,
    "Examples:\n\n  meshctl kv push examples/configs --prefix meshctl/mesh --dry-run\n\n"
    "  meshctl kv push /srv/mesh --prefix meshctl/mesh --consul consul.internal:8500",
    kv_app,
)
_command(
    "pull",
    kv_cmd.pull,
    "Examples:\n\n  meshctl kv pull served/ --prefix meshctl/mesh --consul consul.internal:8500\n\n"
    "  meshctl dump --config-dir served/ --proxy reviews-v1-vm.bookinfo",
    kv_app,
)
app.add_typer(kv_app)


_command(
    "history",
    delivery_cmd.history,
    "Examples:\n\n  meshctl history --server 10.10.0.1:15014\n\n"
    "  meshctl history --server 10.10.0.1:15014 3f2a9c01 -o json",
)

rollout_app = typer.Typer(
    name="rollout",
    help="Staged rollout of new config versions (serve --canary): status, promote, hold, resume, rollback.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
for _verb in ("status", "promote", "hold", "resume"):
    _command(
        _verb,
        getattr(delivery_cmd, _verb),
        f"Examples:\n\n  meshctl rollout {_verb} --server 10.10.0.1:15014",
        rollout_app,
    )
_command(
    "rollback",
    delivery_cmd.rollback,
    "Examples:\n\n  meshctl rollout rollback --server 10.10.0.1:15014\n\n"
    "  meshctl rollout rollback --server 10.10.0.1:15014 3f2a9c01",
    rollout_app,
)
app.add_typer(rollout_app)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print meshctl's version and exit."),
    ] = False,
) -> None:
    """Istio's traffic API for Envoy on VMs and bare metal: Istio YAML in, xDS out."""


@reported
def version(
    server: Annotated[
        str | None,
        typer.Option(help="Also ask the meshctl serve at this admin address for its version and snapshot."),
    ] = None,
    admin_token_file: Annotated[
        str | None, typer.Option(help="File holding the admin bearer token.", envvar="MESHCTL_ADMIN_TOKEN_FILE")
    ] = None,
) -> None:
    """Print meshctl's version, and with --server the running server's version and the snapshot
    version it serves."""
    if server is None:
        typer.echo(__version__)
        return
    from meshctl.cli.admin_client import get_json

    remote = get_json(server, "/version", admin_token_file, expect=dict)
    typer.echo(f"client: {__version__}")
    typer.echo(f"server: {remote.get('version', '?')} (snapshot {remote.get('snapshot') or 'none yet'})")


_command(
    "version",
    version,
    "Examples:\n\n  meshctl version\n\n  meshctl version --server 10.10.0.1:15014\n\n"
    "  meshctl --install-completion   # then restart the shell",
)


def main() -> None:
    from meshctl.logs import configure_logging

    # Warnings and errors only until a command asks for more (`meshctl serve --log-level`).
    configure_logging("warning", "text", environ=os.environ)
    app()
