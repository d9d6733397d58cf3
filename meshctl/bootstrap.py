"""A complete Envoy bootstrap for a VM proxy: node identity, ADS to meshctl, and an admin port.

With it a VM needs only `meshctl bootstrap ... > envoy.yaml && envoy -c envoy.yaml`: everything
else (listeners, clusters, routes, endpoints) arrives over ADS.

Beyond that it carries what Istio's bootstrap gives every proxy (`tools/packaging/common/
envoy_bootstrap.json`, filled in by `pkg/bootstrap/config.go`), so that config which works under
Istio works here:

- a runtime layer (`RUNTIME`) with Istio's values, among them the RE2 program size limit that
  `meshctl validate` checks regexes against (`RE2_MAX_PROGRAM_SIZE`), and an admin layer so that
  `/runtime_modify` works;
- no limit on downstream connections, said the way Envoy 1.40 wants it (`overload_manager`);
- Istio's Prometheus listener (15090): `/stats/prometheus` on every address, handed to the admin
  API through the static cluster `prometheus_stats`, and nothing else of the admin API, which
  stays on loopback.

With `XdsClientTls` the ADS connection is TLS: Envoy checks the server's certificate against a CA
and a SAN (the `sni` name, else the xDS host: a DNS SAN for a name, an IP SAN for an address, as
any TLS client checks the host it dialled; a chain check alone would accept any certificate the
CA ever signed), and presents its own certificate when one is given, which `meshctl serve
--client-ca` requires to name this node's workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshctl.config.hosts import is_ip
from meshctl.config.validation.regex_program import RE2_MAX_PROGRAM_SIZE
from meshctl.snapshot.proxy import ProxyNode

XDS_CLUSTER = "xds-grpc"
#: Istio's names for the Prometheus listener's cluster and port (`envoy_bootstrap.json`).
STATS_CLUSTER = "prometheus_stats"
STATS_PORT = 15090
STATS_PATH = "/stats/prometheus"
_UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_DOWNSTREAM_CONNECTIONS = (
    "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)

#: The static runtime layer: what Istio's `extractRuntimeFlags` (`pkg/bootstrap/config.go`) sets,
#: as far as Envoy 1.40 still knows it. Not carried over, and why:
#: - `overload.global_downstream_max_connections: 2147483647` (no limit, and no start-up warning
#:   that there is none): Envoy 1.40 logs the key as deprecated and warns about the missing limit
#:   all the same; `_overload_manager()` sets the same no-limit the way Envoy asks for.
#: - `envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst`:
#:   allows a deprecated field that Envoy 1.40's Listener no longer has (`use_original_dst`, which
#:   `virtualOutbound` sets, is the current field and needs no override).
#: - `envoy.reloadable_features.google_grpc_disable_tls_13` (Istio's FIPS policy only; meshctl's
#:   xDS client is `envoy_grpc`) and `http_strip_fragment_from_path_unsafe_if_disabled` (only with
#:   `HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED=false`; the flag is gone from Envoy 1.40).
#: Istio sets no `re2.max_program_size.warn_level`, so neither does this.
RUNTIME: Mapping[str, Any] = {
    # Istio's pkg/bootstrap/config.go: Envoy's default limit, 100, refuses ordinary VirtualService
    # regexes (`(a|b|c){20,40}` is 144), and one refused regex NACKs the whole route
    # configuration. `meshctl validate` checks regexes against this very constant.
    "re2.max_program_size.error_level": RE2_MAX_PROGRAM_SIZE,
    # Istio's pkg/bootstrap/config.go: Envoy answers 400 to a request whose path has a
    # `#fragment`; with this off it strips the fragment and routes the request, as under Istio.
    "envoy.reloadable_features.http_reject_path_with_fragment": False,
}


def _overload_manager() -> dict[str, Any]:
    """Istio's "no limit" on downstream connections (`overload.global_downstream_max_connections`
    2147483647 in pkg/bootstrap/config.go), as Envoy 1.40 takes it: a resource monitor, which also
    keeps Envoy from warning at start-up that no limit is configured."""
    monitor = {"@type": _DOWNSTREAM_CONNECTIONS, "max_active_downstream_connections": 2147483647}
    return {
        "resource_monitors": [
            {"name": "envoy.resource_monitors.global_downstream_max_connections", "typed_config": monitor}
        ]
    }


@dataclass(frozen=True, slots=True)
class XdsClientTls:
    """Envoy's side of xDS over TLS: the CA to check meshctl with, and this proxy's certificate."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    #: The server name to send and to find in the server's certificate (default: the xDS host).
    sni: str | None = None


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    xds_host: str
    xds_port: int
    delta: bool = False
    admin_address: str = "127.0.0.1"
    admin_port: int = 15000
    labels: Mapping[str, str] = field(default_factory=dict)
    tls: XdsClientTls | None = None
    #: The Prometheus listener's port on every address (IPv4, or IPv6 for an IPv6 node); 0: none.
    stats_port: int = STATS_PORT


def _filename(path: Path) -> dict[str, str]:
    # Absolute, as Envoy resolves relative names against its own working directory; not resolved,
    # so a symlink a rotation agent swaps keeps pointing at the current file.
    return {"filename": str(path.absolute())}


def xds_transport_socket(tls: XdsClientTls, xds_host: str) -> dict[str, Any]:
    """The `xds-grpc` cluster's UpstreamTlsContext."""
    server_name = tls.sni or xds_host
    san_type = "IP_ADDRESS" if is_ip(server_name) else "DNS"
    common: dict[str, Any] = {
        # gRPC servers refuse TLS connections that do not negotiate HTTP/2 by ALPN.
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": _filename(tls.ca_file),
            "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": server_name}}],
        },
    }
    if tls.cert_file is not None and tls.key_file is not None:
        common["tls_certificates"] = [
            {"certificate_chain": _filename(tls.cert_file), "private_key": _filename(tls.key_file)}
        ]
    context: dict[str, Any] = {"@type": _UPSTREAM_TLS, "common_tls_context": common}
    if not is_ip(server_name):
        context["sni"] = server_name
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def build_bootstrap(node: ProxyNode, options: BootstrapOptions) -> dict[str, Any]:
    """The bootstrap as plain data (YAML or JSON for Envoy's `-c`)."""
    metadata: dict[str, Any] = {
        "NAMESPACE": node.namespace,
        "INTERCEPTION_MODE": node.interception.value,
    }
    labels = {**node.labels, **options.labels}
    if labels:
        metadata["LABELS"] = dict(labels)
    ads = {"ads": {}, "resource_api_version": "V3"}
    static: dict[str, Any] = {"clusters": [xds_cluster(options)]}
    if options.stats_port:
        problem = stats_port_problem(options)
        if problem is not None:
            raise ValueError(problem)
        static["clusters"].append(stats_cluster(options))
        static["listeners"] = [stats_listener(options.stats_port, ipv6=":" in node.ip)]
    return {
        "node": {
            "id": node.id,
            "cluster": f"{node.name}.{node.namespace}",
            "metadata": metadata,
        },
        "admin": {
            "address": {"socket_address": {"address": options.admin_address, "port_value": options.admin_port}},
        },
        # Istio's two layers (envoy_bootstrap.json): its values, then the admin API's
        # /runtime_modify, which needs a layer to write to.
        "layered_runtime": {
            "layers": [
                {"name": "global config", "static_layer": dict(RUNTIME)},
                {"name": "admin", "admin_layer": {}},
            ]
        },
        "overload_manager": _overload_manager(),
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if options.delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
            },
            "cds_config": ads,
            "lds_config": ads,
        },
        "static_resources": static,
    }


def stats_port_problem(options: BootstrapOptions) -> str | None:
    """Why the Prometheus listener cannot be built with `options`, or None."""
    if not 0 < options.stats_port < 65536:
        return f"the stats port {options.stats_port} is not a TCP port (1-65535, or 0 for none)"
    if options.admin_port == 0:
        return "the stats listener forwards to the admin port, which must then be a fixed port, not 0"
    if options.stats_port == options.admin_port:
        return f"the stats port and the admin port are both {options.admin_port}"
    return None


def stats_cluster(options: BootstrapOptions) -> dict[str, Any]:
    """`prometheus_stats`: the admin API, as the Prometheus listener's upstream (Istio's cluster)."""
    # An admin API on every address is still reached on loopback.
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(options.admin_address, options.admin_address)
    return {
        "name": STATS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "load_assignment": _load_assignment(STATS_CLUSTER, address, options.admin_port),
    }


def stats_listener(port: int, *, ipv6: bool = False) -> dict[str, Any]:
    """Istio's Prometheus listener (15090): `/stats/prometheus` on every address goes to the
    admin API; any other path is a 404 from this listener and never reaches the admin API."""
    # The path alone (Istio matches it as a prefix, which the admin API then refuses); the query
    # string is not part of it, so `?usedonly` and `?filter=` work as on the admin port.
    route = {"match": {"path": STATS_PATH}, "route": {"cluster": STATS_CLUSTER}}
    manager = {
        "@type": _HCM,
        "codec_type": "AUTO",
        "stat_prefix": "stats",
        # `/stats/prometheus/../config_dump` is `/config_dump` before routing, and so a 404.
        "normalize_path": True,
        "route_config": {
            "name": STATS_CLUSTER,
            "virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [route]}],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    return {
        "name": STATS_CLUSTER,
        "address": {"socket_address": {"address": "::" if ipv6 else "0.0.0.0", "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }


def _load_assignment(cluster: str, host: str, port: int) -> dict[str, Any]:
    """One endpoint, `host:port`, for a static or DNS cluster."""
    address = {"socket_address": {"address": host, "port_value": port}}
    return {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]}


def xds_cluster(options: BootstrapOptions) -> dict[str, Any]:
    """The `xds-grpc` cluster: HTTP/2 with keepalives to meshctl serve, over TLS when asked."""
    cluster: dict[str, Any] = {
        "name": XDS_CLUSTER,
        "type": "STATIC" if is_ip(options.xds_host) else "STRICT_DNS",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "connection_keepalive": {"interval": "30s", "timeout": "10s"},
                    }
                },
            }
        },
        "load_assignment": _load_assignment(XDS_CLUSTER, options.xds_host, options.xds_port),
    }
    if options.tls is not None:
        cluster["transport_socket"] = xds_transport_socket(options.tls, options.xds_host)
    return cluster
