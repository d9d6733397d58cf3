"""`meshctl dump`: the Envoy config the server would send one proxy, without running the server.

It answers "what will this VM's Envoy get from this directory?" before the change is merged or
the server restarted: the tree is loaded as the server loads it (see `offline`), and the output
comes from the generators' single entry point, `generate`, so it is what the server sends.

`-o json` and `-o yaml` print Envoy's admin `/config_dump?include_eds` format (see
`meshctl.xds.config_dump`), which `istioctl proxy-config cluster --file` and jq scripts read.
`-o short` prints the tables `istioctl proxy-config` prints for a live proxy, with its columns.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl.cli import options
from meshctl.cli.exits import reported
from meshctl.snapshot.interception import InterceptionMode

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from meshctl.cli.output import TableData
    from meshctl.snapshot.model import Snapshot
    from meshctl.snapshot.proxy import Proxy

CLUSTER_COLUMNS = ("SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE")
ENDPOINT_COLUMNS = ("ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER")
LISTENER_COLUMNS = ("ADDRESSES", "PORT", "MATCH", "DESTINATION")
ROUTE_COLUMNS = ("NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE")

_TCP_PROXY = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
_PASSTHROUGH = "PassthroughCluster"


class Section(enum.StrEnum):
    clusters = "clusters"
    endpoints = "endpoints"
    listeners = "listeners"
    routes = "routes"
    secrets = "secrets"
    all = "all"


class Format(enum.StrEnum):
    json = "json"
    yaml = "yaml"
    short = "short"


@reported
def dump(
    config_dir: options.ConfigDir,
    proxy: Annotated[
        str,
        typer.Option(
            "--proxy",
            help="A full node id (sidecar~IP~NAME.NAMESPACE~DOMAIN) or a WorkloadEntry NAME.NAMESPACE.",
        ),
    ],
    consul: options.ConsulOnce = None,
    section: Annotated[Section, typer.Option("--type", "-t", help="Which resources to print.")] = Section.all,
    output: Annotated[
        Format,
        typer.Option(
            "--output", "-o", help="short (tables, as istioctl proxy-config), json or yaml (Envoy's /config_dump)."
        ),
    ] = Format.short,
    namespace: options.Namespace = "default",
    interception: options.Interception = InterceptionMode.NONE,
    mesh_config: options.MeshConfig = None,
    grpc: Annotated[
        bool,
        typer.Option("--grpc", help="A proxyless gRPC node (GENERATOR grpc, as `meshctl bootstrap --grpc` writes)."),
    ] = False,
) -> None:
    """Print what the server would send a proxy, in Envoy's /config_dump format or as tables.

    Exit status: 0 printed, 2 usage error, missing directory, a file that fails to load, a proxy
    that names nothing, or an unreadable Consul.
    """
    from meshctl.cli import offline
    from meshctl.xds.config_dump import subscribed
    from meshctl.xds.generate import generate

    tree = offline.load_tree(config_dir, consul=consul, namespace=namespace, mesh=offline.mesh_from(mesh_config))
    target = offline.resolve_proxy(tree, proxy, namespace, interception.value, grpc=grpc)
    offline.report(tree)
    _stderr(offline.proxy_note(target))
    if grpc:
        from meshctl.xds.grpc_gen import generate_grpc, grpc_notes

        for note in grpc_notes(tree.snapshot, target):
            _stderr(f"note: {note}")
        _print(generate_grpc(tree.snapshot, target), section, output)
        return
    for note in [
        *offline.hidden_port_notes(tree.snapshot, target),
        *offline.bypassed_port_notes(tree.snapshot, target),
        *offline.gateway_target_port_notes(tree.snapshot, target),
        *_unmatched_filter_notes(tree.snapshot, target),
        *offline.gateway_api_notes(tree.snapshot, target),
    ]:
        _stderr(f"note: {note}")
    resources, unrequested = subscribed(generate(tree.snapshot, target))
    if unrequested:
        _stderr(f"note: route config(s) {', '.join(unrequested)} left out: no listener names them, so Envoy never asks")
    _print(resources, section, output)


def _print(resources: Mapping[str, Sequence[Message]], section: Section, output: Format) -> None:
    from meshctl.cli import offline
    from meshctl.xds.config_dump import DUMP_ORDER, TYPE_BY_SECTION

    wanted = DUMP_ORDER if section is Section.all else (TYPE_BY_SECTION[section.value],)
    if output is Format.short:
        from meshctl.cli.output import print_tables

        print_tables(short_tables(resources, wanted))
        return
    from meshctl.xds.config_dump import build_config_dump, config_dump_dict

    data = config_dump_dict(build_config_dump(resources, wanted))
    if output is Format.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(offline.yaml_text(data))


def _unmatched_filter_notes(snapshot: Snapshot, proxy: Proxy) -> list[str]:
    """The EnvoyFilters selecting the proxy whose patches matched nothing in its config."""
    if not proxy.envoy_filters:
        return []
    from meshctl.xds.envoyfilter_report import unmatched_envoy_filters, unmatched_message
    from meshctl.xds.generate import unpatched_config

    config = unpatched_config(snapshot, proxy)
    return [unmatched_message(f, proxy) for f in unmatched_envoy_filters(config, proxy)]


def _stderr(message: str) -> None:
    from meshctl.cli import output as out

    out.stderr_console().print(message, markup=False, soft_wrap=True, highlight=False)


def short_tables(resources: Mapping[str, Sequence[Message]], type_urls: Iterable[str]) -> list[TableData]:
    """istioctl's `proxy-config` tables for each type in `type_urls`, in Envoy's order."""
    from meshctl.cli.output import TableData
    from meshctl.xds import types
    from meshctl.xds.config_dump import DUMP_ORDER, endpoint_assignments

    wanted = set(type_urls)
    tables = {
        types.CLUSTER: lambda: TableData("Clusters", CLUSTER_COLUMNS, cluster_rows(resources.get(types.CLUSTER, ()))),
        types.ENDPOINT: lambda: TableData(
            "Endpoints", ENDPOINT_COLUMNS, endpoint_rows(v.message for v in endpoint_assignments(resources))
        ),
        types.LISTENER: lambda: TableData(
            "Listeners", LISTENER_COLUMNS, listener_rows(resources.get(types.LISTENER, ()))
        ),
        types.ROUTE: lambda: TableData("Routes", ROUTE_COLUMNS, route_rows(resources.get(types.ROUTE, ()))),
        types.SECRET: lambda: TableData("Secrets", SECRET_COLUMNS, secret_rows(resources)),
    }
    return [tables[t]() for t in DUMP_ORDER if t in wanted]


SECRET_COLUMNS = ("RESOURCE NAME", "TYPE", "STATUS")


def secret_rows(resources: Mapping[str, Sequence[Message]]) -> list[list[str]]:
    """istioctl's `proxy-config secret` rows: the mesh secrets the config asks for. Offline they
    are not issued yet: `meshctl serve` issues them to the proxy whose connection proves it."""
    from meshctl.xds import types
    from meshctl.xds.mesh_tls import ROOT_SECRET, secret_names

    names = secret_names(resources.get(types.CLUSTER, ()), resources.get(types.LISTENER, ()))
    return [[name, "CA" if name == ROOT_SECRET else "Cert Chain", "issued by meshctl serve"] for name in sorted(names)]


def describe_config(metadata: Any) -> str:
    """The Istio config a resource came from, as istioctl shows it: `NAME.NAMESPACE`, read from
    `filter_metadata.istio.config` (`/apis/networking.istio.io/v1/namespaces/NS/KIND/NAME`)."""
    if "istio" not in metadata.filter_metadata:
        return ""
    fields = metadata.filter_metadata["istio"].fields
    if "config" not in fields:
        return ""
    parts = fields["config"].string_value.split("/")
    if len(parts) != 8 or parts[1:3] != ["apis", "networking.istio.io"] or parts[4] != "namespaces":
        return "<unknown>"
    return f"{parts[7]}.{parts[5]}"


def cluster_rows(clusters: Iterable[Message]) -> list[list[str]]:
    """SERVICE FQDN, PORT, SUBSET, DIRECTION, TYPE, DESTINATION RULE; sorted as istioctl sorts."""
    from meshctl.xds.cluster_dns import discovery_type
    from meshctl.xds.names import parse_cluster_name

    rows: list[tuple[tuple[str, str, int, str], list[str]]] = []
    for c in clusters:
        cluster: Any = c
        kind = discovery_type(cluster)
        rule = describe_config(cluster.metadata)
        parsed = parse_cluster_name(cluster.name)
        if parsed is None:
            rows.append(((cluster.name, "", 0, ""), [cluster.name, "-", "-", "-", kind, rule]))
            continue
        row = [parsed.host, str(parsed.port), parsed.subset or "-", parsed.direction.value, kind, rule]
        rows.append(((parsed.host, parsed.subset, parsed.port, parsed.direction.value), row))
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def endpoint_rows(assignments: Iterable[Message]) -> list[list[str]]:
    """ENDPOINT, STATUS, OUTLIER CHECK, CLUSTER. A dump has no outlier ejections (they happen in a
    running Envoy), so the check is always OK; an unset health status is healthy, as in Envoy."""
    from envoy.config.core.v3 import health_check_pb2

    rows = []
    for a in assignments:
        assignment: Any = a
        for locality in assignment.endpoints:
            for lb in locality.lb_endpoints:
                status = health_check_pb2.HealthStatus.Name(lb.health_status)
                rows.append(
                    [
                        _address_text(lb.endpoint.address),
                        "HEALTHY" if status == "UNKNOWN" else status,
                        "OK",
                        assignment.cluster_name,
                    ]
                )
    return rows


def _address_text(address: Any) -> str:
    if address.HasField("pipe"):
        return str(address.pipe.path)
    socket = address.socket_address
    host = f"[{socket.address}]" if ":" in socket.address else socket.address
    return f"{host}:{socket.port_value}" if socket.port_value else host


def _api_route(listener: Any) -> str:
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

    hcm = hcm_pb2.HttpConnectionManager()
    listener.api_listener.api_listener.Unpack(hcm)
    return f"Route: {hcm.rds.route_config_name}"


def listener_rows(listeners: Iterable[Message]) -> list[list[str]]:
    """ADDRESSES, PORT, MATCH, DESTINATION: a row per filter chain, listeners by port then address."""
    rows: list[tuple[tuple[int, str], list[str]]] = []
    for item in listeners:
        listener: Any = item
        if listener.HasField("api_listener"):  # a gRPC client's: named by the target it dials
            host, _, port = listener.name.rpartition(":")
            rows.append(((int(port) if port.isdigit() else 0, host), [host, port, "ALL", _api_route(listener)]))
            continue
        socket = listener.address.socket_address
        addresses = [socket.address] + [a.address.socket_address.address for a in listener.additional_addresses]
        chains = list(listener.filter_chains)
        if listener.HasField("default_filter_chain"):
            chains.append(listener.default_filter_chain)
        described = sorted((_describe_chain_match(fc), _describe_destination(fc)) for fc in chains)
        for match, destination in described or [("ALL", "Non-HTTP/Non-TCP")]:
            row = [",".join(addresses), str(socket.port_value), match, destination]
            rows.append(((socket.port_value, socket.address), row))
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def _describe_chain_match(chain: Any) -> str:
    match = chain.filter_chain_match
    parts = []
    if match.server_names:
        parts.append("SNI: " + ",".join(match.server_names))
    if match.transport_protocol:
        parts.append(f"Trans: {match.transport_protocol}")
    if match.application_protocols:
        parts.append("App: " + ",".join(match.application_protocols))
    port = f":{match.destination_port.value}" if match.HasField("destination_port") else ""
    if match.prefix_ranges:
        ranges = ",".join(f"{r.address_prefix}/{r.prefix_len.value}" for r in match.prefix_ranges)
        parts.append(f"Addr: {ranges}{port}")
    elif port:
        parts.append(f"Addr: *{port}")
    return "; ".join(parts) or "ALL"


def _describe_destination(chain: Any) -> str:
    from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
    from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

    from meshctl.xds.config_dump import HCM_TYPE

    for f in chain.filters:
        config = f.typed_config
        if config.type_url.endswith("/" + HCM_TYPE):
            hcm = http_connection_manager_pb2.HttpConnectionManager()
            config.Unpack(hcm)
            if hcm.HasField("rds"):
                return f"Route: {hcm.rds.route_config_name}"
            if hcm.HasField("route_config"):
                return "Inline Route: " + _describe_inline_routes(hcm.route_config)
            return "HTTP"
        if config.type_url.endswith("/" + _TCP_PROXY):
            tcp = tcp_proxy_pb2.TcpProxy()
            config.Unpack(tcp)
            if tcp.HasField("weighted_clusters"):
                return "Clusters: " + ",".join(c.name for c in tcp.weighted_clusters.clusters)
            return tcp.cluster if tcp.cluster.endswith("Cluster") else f"Cluster: {tcp.cluster}"
    return "Non-HTTP/Non-TCP"


def _describe_inline_routes(config: Any) -> str:
    """istioctl's form: each virtual host's domains (unless `*`) and its routes' matches."""
    hosts = []
    for vhost in config.virtual_hosts:
        matches = ", ".join(describe_match(r.match) for r in vhost.routes)
        domains = "" if list(vhost.domains) == ["*"] else "/".join(vhost.domains)
        hosts.append(f"{domains} {matches}".strip())
    return "; ".join(hosts)


def route_rows(route_configs: Iterable[Message]) -> list[list[str]]:
    """NAME, VHOST NAME, DOMAINS, MATCH, VIRTUAL SERVICE: a row per route (routes that only pass
    traffic through are left out, as istioctl does); a virtual host without routes shows 404."""
    rows = []
    for item in route_configs:
        config: Any = item
        for vhost in config.virtual_hosts:
            domains = describe_domains(list(vhost.domains))
            shown = [r for r in vhost.routes if not _is_passthrough(r)]
            for route in shown:
                rows.append(
                    [config.name, vhost.name, domains, describe_match(route.match), describe_config(route.metadata)]
                )
            if not vhost.routes:
                rows.append([config.name, vhost.name, domains, "/*", "404"])
    return rows


def _is_passthrough(route: Any) -> bool:
    return bool(route.HasField("route") and route.route.cluster == _PASSTHROUGH)


def describe_domains(domains: Sequence[str]) -> str:
    """istioctl's short form: the domains without a port (or bare IPv6), two at most, then a count."""
    if len(domains) <= 1:
        return domains[0] if domains else ""
    plain = [d for d in domains if ":" not in d or (d.count(":") > 2 and d.endswith("]"))]
    # The absolute form (`reviews.bookinfo.mesh.`) is the same host as the name beside it.
    plain = [d for d in plain if not (d.endswith(".") and d[:-1] in plain)]
    shown = [
        d
        for d in plain
        if not any(d != s and s in plain for s in (d.removesuffix(".svc.cluster.local"), d.removesuffix(".svc")))
    ]
    if len(shown) > 2:
        return f"{', '.join(shown[:2])} + {len(shown) - 2} more..."
    return ", ".join(shown)


def describe_match(match: Any) -> str:
    """A route's match as istioctl shows it (`/prefix*`, `/exact`, `regex R`), and the headers it
    requires, which istioctl leaves out but which tell a canary route from the default one."""
    parts = []
    if match.HasField("prefix"):
        parts.append(f"{match.prefix}*")
    if match.HasField("path_separated_prefix"):
        parts.append(f"PathPrefix:{match.path_separated_prefix}")
    if match.HasField("path"):
        parts.append(match.path)
    if match.HasField("safe_regex"):
        parts.append(f"regex {match.safe_regex.regex}")
    headers = [h.name for h in match.headers]
    if headers:
        parts.append(f"[headers: {', '.join(headers)}]")
    return " ".join(parts)
