"""`meshctl hosts`: a proxy's DNS table as /etc/hosts lines, or as a systemd-resolved drop-in.

The sidecar's DNS listener (`xds/dns_table.py`) answers the mesh's names on the VM. Where nothing
sends the app's lookups there, the same table does as /etc/hosts lines: the same names, the same
addresses (a TCP service's own loopback address, 127.0.0.1 for HTTP), read from the same
generators as `dump`. With `--resolved` it prints instead the drop-in that makes systemd-resolved
send the mesh's domains (and only those) to the Envoy's DNS listener, so a new service needs no
edit on the VM at all.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Annotated

import typer

from meshctl.cli import options
from meshctl.cli.exits import reported
from meshctl.snapshot.interception import DEFAULT_DNS_PORT, InterceptionMode


@reported
def hosts(
    config_dir: options.ConfigDir,
    proxy: Annotated[
        str,
        typer.Option(
            "--proxy",
            help="A full node id (sidecar~IP~NAME.NAMESPACE~DOMAIN) or a WorkloadEntry NAME.NAMESPACE.",
        ),
    ],
    resolved: Annotated[
        bool,
        typer.Option(
            "--resolved",
            help="Print a systemd-resolved drop-in sending the proxy's mesh domains to its DNS listener instead.",
        ),
    ] = False,
    dns_port: Annotated[
        int, typer.Option(help="The DNS listener's port (meshctl bootstrap --dns-port), for --resolved.", min=1)
    ] = DEFAULT_DNS_PORT,
    consul: options.ConsulOnce = None,
    namespace: options.Namespace = "default",
    interception: options.Interception = InterceptionMode.NONE,
    mesh_config: options.MeshConfig = None,
) -> None:
    """Print the /etc/hosts lines of a proxy's mesh names: the names and addresses its Envoy's
    DNS listener answers, for VMs whose lookups do not reach it. Names or addresses two
    services of the proxy's view claim are warned about on stderr.

    Exit status: 0 printed, 2 usage error, missing directory, a file that fails to load, or a
    proxy that names nothing.
    """
    from meshctl.cli import offline
    from meshctl.snapshot.scope import ProxyScope
    from meshctl.xds.dns_table import mesh_domains, name_table, table_conflicts
    from meshctl.xds.listeners_outbound import outbound_answers

    tree = offline.load_tree(config_dir, consul=consul, namespace=namespace, mesh=offline.mesh_from(mesh_config))
    target = offline.resolve_proxy(tree, proxy, namespace, interception.value)
    offline.report(tree)
    scope = ProxyScope(tree.snapshot, target)
    answers = outbound_answers(scope)
    names = name_table(scope, answers)
    for conflict in table_conflicts(scope, answers):
        _stderr(f"warning: {conflict}")
    if resolved:
        sys.stdout.write(resolved_drop_in(mesh_domains(scope, names), dns_port, target.id))
        return
    wildcards = sorted(n for n in names if n.startswith("*"))
    if wildcards:
        _stderr(f"note: /etc/hosts cannot hold wildcard names; left out: {', '.join(wildcards)}")
    sys.stdout.write(hosts_lines({n: a for n, a in names.items() if not n.startswith("*")}, target.id))


def _stderr(message: str) -> None:
    from meshctl.cli import output as out

    out.stderr_console().print(message, markup=False, soft_wrap=True, highlight=False)


def hosts_lines(names: Mapping[str, str], proxy_id: str) -> str:
    """`ADDRESS NAME...` per address, addresses and names sorted: what /etc/hosts takes."""
    by_address: dict[str, list[str]] = {}
    for name, address in names.items():
        by_address.setdefault(address, []).append(name)
    lines = [f"# the mesh's names for {proxy_id} (meshctl hosts)"]
    for address in sorted(by_address, key=_address_key):
        lines.append(f"{address} {' '.join(sorted(by_address[address]))}")
    return "\n".join(lines) + "\n"


def resolved_drop_in(domains: list[str], port: int, proxy_id: str) -> str:
    """A resolved.conf drop-in: the mesh's domains, routing-only (`~`), to 127.0.0.1:`port`."""
    routed = " ".join(f"~{d}" for d in domains)
    return (
        f"# The mesh's domains for {proxy_id}, answered by its Envoy (meshctl hosts --resolved).\n"
        "# Only these names go there; every other lookup goes where it went before.\n"
        "[Resolve]\n"
        f"DNS=127.0.0.1:{port}\n"
        f"Domains={routed}\n"
    )


def _address_key(address: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in address.split("."))
