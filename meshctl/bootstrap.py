"""A complete Envoy bootstrap for a VM proxy: node identity, ADS to meshctl, and an admin port.

With it a VM needs only `meshctl bootstrap ... > envoy.yaml && envoy -c envoy.yaml`: everything
else (listeners, clusters, routes, endpoints) arrives over ADS.

Beyond that it carries what Istio's bootstrap gives every proxy (`tools/packaging/common/
envoy_bootstrap.json`, filled in by `pkg/bootstrap/config.go`), so that config which works under
Istio works here, and Envoy runs as it runs under Istio:

- a runtime layer (`RUNTIME`) with Istio's values, among them the RE2 program size limit that
  `meshctl validate` checks regexes against (`RE2_MAX_PROGRAM_SIZE`), and an admin layer so that
  `/runtime_modify` works;
- no limit on downstream connections, said the way Envoy 1.40 wants it (`overload_manager`);
- no giving up on the first config: CDS and LDS wait for meshctl however long it takes
  (`initial_fetch_timeout: 0s`), so an Envoy started while meshctl is down stays not ready
  (`/ready` answers 503) instead of going LIVE with no listeners after 15 s;
- Istio's stat names (`stats_config`): tag extractors that make `cluster_name`, `listener_address`,
  `http_conn_manager_prefix`, ... Prometheus labels, reading names Istio ends with `;`
  (`outbound|9080|v1|reviews.bookinfo.mesh;`) so that a host's dots do not split them; stats
  created only when first used (`deferred_stat_options`); and, when asked, Istio's
  proxyStatsMatcher: only the stats named by an inclusion list (`StatsInclusion`);
- Istio's Prometheus listener (15090): `/stats/prometheus` on every address, handed to the admin
  API through the static cluster `prometheus_stats`, and nothing else of the admin API, which
  stays on loopback;
- Istio's health listener (15021, routers only by default): `/healthz/ready` on every address,
  answered by Envoy's own readiness (the admin API's `/ready`: 200 `LIVE` once Envoy has its
  config, 503 `DRAINING` once its health checks are failed, as the Envoy unit's stop does first;
  like every static listener it opens with the first config). Under Istio pilot-agent answers
  it; a VM runs no agent, so the listener asks Envoy directly, through the static cluster
  `envoy_ready`.

With `XdsClientTls` the ADS connection is TLS: Envoy checks the server's certificate against a CA
and a SAN (the `sni` name, else the xDS host: a DNS SAN for a name, an IP SAN for an address, as
any TLS client checks the host it dialled; a chain check alone would accept any certificate the
CA ever signed), and presents its own certificate when one is given, which `meshctl serve
--client-ca` requires to name this node's workload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshctl.config.hosts import is_ip
from meshctl.config.validation.common import regex_problem
from meshctl.config.validation.regex_program import RE2_MAX_PROGRAM_SIZE
from meshctl.snapshot.node import ProxyNode, ProxyType

XDS_CLUSTER = "xds-grpc"
#: Istio's names for the Prometheus listener's cluster and port (`envoy_bootstrap.json`).
STATS_CLUSTER = "prometheus_stats"
STATS_PORT = 15090
STATS_PATH = "/stats/prometheus"
#: Istio's health port and path (`envoy_bootstrap.json`, the `agent` listener); the cluster is
#: ours: Istio's `agent` cluster is pilot-agent, this one is Envoy's admin API.
HEALTH_CLUSTER = "envoy_ready"
HEALTH_PORT = 15021
HEALTH_PATH = "/healthz/ready"
READY_PATH = "/ready"
#: What Istio ends a stat name with (`constants.StatPrefixDelimiter`, `util.DelimitedStatsPrefix`
#: in pilot/pkg/networking/util): a cluster's `alt_stat_name` is `NAME;`, an HTTP connection
#: manager's `stat_prefix` `PREFIX;`, so a tag extractor can find the end of a name with dots.
STAT_PREFIX_DELIMITER = ";"

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

#: The clusters of this bootstrap, which keep their plain names in Envoy's stats (`cluster.xds-grpc.
#: upstream_cx_active`, as `/stats?filter=` and Istio's own inclusion prefix `cluster.xds-grpc`
#: name them) and are still tagged `cluster_name` by `STATS_TAGS`.
_STATIC_CLUSTERS = (XDS_CLUSTER, STATS_CLUSTER, HEALTH_CLUSTER)

#: Istio's tag extractors (`stats_config.stats_tags` of envoy_bootstrap.json, as of Istio 1.23's
#: `;`-delimited stat names, istio/istio#51861), in Istio's order: each turns part of a stat name
#: into a Prometheus label (`envoy_cluster_upstream_rq_total{cluster_name="outbound|9080|v1|
#: reviews.bookinfo.mesh"}` rather than `envoy_cluster_bookinfo_mesh_upstream_rq_total{cluster_name=
#: "outbound|9080|v1|reviews"}`). Envoy removes the first group from the name; the second is the
#: value. One change from Istio: `cluster_name` also reads `_STATIC_CLUSTERS` by name, where Istio
#: gives its static clusters an `alt_stat_name` ending in `;` instead (which would rename the
#: `cluster.xds-grpc.*` stats that tools and tests read).
STATS_TAGS: Sequence[Mapping[str, str]] = (
    {"tag_name": "cluster_name", "regex": r"^cluster(\.(.+(?=;)|" + "|".join(_STATIC_CLUSTERS) + r")(?:;|(?=\.)))"},
    {
        "tag_name": "http_conn_manager_prefix",
        "regex": r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
    },
    {"tag_name": "thread_name", "regex": r"^server(\.(.+))\.watchdog"},
    {"tag_name": "tcp_prefix", "regex": r"^tcp\.((.*?)\.)\w+?$"},
    {"tag_name": "response_code", "regex": r"_rq(_(\d{3}))$"},
    {"tag_name": "response_code_class", "regex": r"_rq(_(\dxx))$"},
    {
        "tag_name": "http_conn_manager_listener_prefix",
        "regex": r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
    },
    {"tag_name": "listener_address", "regex": r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)"},
    {"tag_name": "mongo_prefix", "regex": r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$"},
    {"tag_name": "cache", "regex": r"(cache\.(.+?)\.)"},
    {"tag_name": "component", "regex": r"(component\.(.+?)\.)"},
    {"tag_name": "tag", "regex": r"(tag\.(.+?);\.)"},
    {"tag_name": "wasm_filter", "regex": r"(wasm_filter\.(.+?)\.)"},
    {"tag_name": "authz_enforce_result", "regex": r"rbac(\.(allowed|denied))"},
    {"tag_name": "authz_dry_run_action", "regex": r"(\.istio_dry_run_(allow|deny)_)"},
    {"tag_name": "authz_dry_run_result", "regex": r"(\.shadow_(allowed|denied))"},
)

#: The stats Istio always keeps when it filters them (`stats_matcher.inclusion_list` of
#: envoy_bootstrap.json, and `required*EnvoyStatsMatcherInclusion*` in pkg/bootstrap/config.go:
#: what readiness and xDS health need, RBAC results, VirtualService route stats, and Istio's
#: own `reporter=`, `component` and `istio` names, which meshctl's Envoy does not produce).
REQUIRED_INCLUSION_PREFIXES = ("reporter=", "cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm")
REQUIRED_INCLUSION_SUFFIXES = ("rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied")
REQUIRED_INCLUSION_REGEXES = (r"vhost\..*\.route\..*",)
_ALWAYS_INCLUDED_PREFIXES = ("component", "istio")


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
    #: A directory holding the certificate and key as `meshctl ca issue --proxy` and `ca renew`
    #: write them, read through file-based SDS that follows renewals (`xds_client_sds_file`);
    #: instead of `cert_file`/`key_file`.
    cert_dir: Path | None = None


#: The SDS secret of the xDS client certificate, and the file it is read from in `cert_dir`.
XDS_CLIENT_SECRET = "xds-client-cert"
_SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


def xds_client_sds_file(directory: Path) -> bytes:
    """The SDS file of `XdsClientTls.cert_dir` (JSON, which Envoy reads as YAML): one Secret naming
    the certificate and key files of `directory`.

    Envoy watches the directory of this file (`watched_directory`, `SDS_DIR` of `directory`, not
    `directory` itself) and, when a file is moved into it, reads this file and the pair again,
    checking that the pair did not change between the two reads. `meshctl ca renew` and `ca issue`
    write this file last, once key and certificate are both in place, so Envoy reads the pair
    once and whole; a certificate and key that do not match are refused and the last good pair
    kept. The connection to meshctl uses the new pair from its next handshake,
    with no restart, and the config Envoy holds does not change."""
    from meshctl.security.renewal import CERT_FILE, KEY_FILE, SDS_DIR

    watched = {"path": str((directory / SDS_DIR).absolute())}
    secret = {
        "@type": _SECRET,
        "name": XDS_CLIENT_SECRET,
        "tls_certificate": {
            "certificate_chain": _filename(directory / CERT_FILE),
            "private_key": _filename(directory / KEY_FILE),
            "watched_directory": watched,
        },
    }
    return (json.dumps({"resources": [secret]}, indent=2) + "\n").encode()


def xds_client_sds_config(directory: Path) -> dict[str, Any]:
    """The `tls_certificate_sds_secret_configs` entry reading `xds_client_sds_file` of `directory`."""
    from meshctl.security.renewal import SDS_DIR, SDS_FILE

    watched = {"path": str((directory / SDS_DIR).absolute())}
    source = {"path": str((directory / SDS_FILE).absolute()), "watched_directory": watched}
    return {"name": XDS_CLIENT_SECRET, "sds_config": {"path_config_source": source, "resource_api_version": "V3"}}


@dataclass(frozen=True, slots=True)
class StatsInclusion:
    """Istio's proxyStatsMatcher (ProxyConfig `inclusionPrefixes`, `inclusionSuffixes`,
    `inclusionRegexps`; the `sidecar.istio.io/statsInclusion*` annotations): when any is given,
    Envoy keeps only the stats they name, and the ones Istio always keeps. Empty: every stat."""

    prefixes: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    regexes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.prefixes or self.suffixes or self.regexes)

    def problem(self) -> str | None:
        """Why Envoy would refuse this list, or None: a regex RE2 does not take, an empty pattern."""
        for regex in self.regexes:
            if (problem := regex_problem(regex)) is not None:
                return problem
        if any(not pattern for pattern in (*self.prefixes, *self.suffixes)):
            return "an inclusion prefix or suffix must not be empty"
        return None


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    xds_host: str
    xds_port: int
    delta: bool = True
    admin_address: str = "127.0.0.1"
    admin_port: int = 15000
    labels: Mapping[str, str] = field(default_factory=dict)
    tls: XdsClientTls | None = None
    #: The Prometheus listener's port on every address (IPv4, or IPv6 for an IPv6 node); 0: none.
    stats_port: int = STATS_PORT
    #: The health listener's port on every address; 0: none; None: Istio's default for the node's
    #: type (`HEALTH_PORT` for a router, none for a sidecar: a VM's app is health-checked itself).
    health_port: int | None = None
    stats_inclusion: StatsInclusion = StatsInclusion()
    #: Further meshctl replicas (HOST, PORT) beside `xds_host`:`xds_port`: the `xds-grpc` cluster
    #: gets one endpoint each, so Envoy reconnects to a live one when its replica goes away.
    more_xds: tuple[tuple[str, int], ...] = ()
    #: The sidecar's DNS listener on 127.0.0.1 (`xds/dns_table.py`), sent as node metadata
    #: `DNS_PORT`; 0: none. `dns_forward`: names outside the mesh go to the VM's resolvers
    #: (`DNS_FORWARD`), else they are answered NXDOMAIN.
    dns_port: int = 0
    dns_forward: bool = True
    #: Further node metadata: the `ISTIO_META_*` variables of the proxy's ProxyConfig
    #: (`config/proxy_config.py`); the keys meshctl sets itself win over them.
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def xds_addresses(self) -> tuple[tuple[str, int], ...]:
        """Every replica's xDS address, the first one first."""
        return ((self.xds_host, self.xds_port), *self.more_xds)


def health_port(node: ProxyNode, options: BootstrapOptions) -> int:
    """The health listener's port for `node` (0: none)."""
    if options.health_port is not None:
        return options.health_port
    return HEALTH_PORT if node.type is ProxyType.ROUTER else 0


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
    if tls.cert_dir is not None:
        common["tls_certificate_sds_secret_configs"] = [xds_client_sds_config(tls.cert_dir)]
    elif tls.cert_file is not None and tls.key_file is not None:
        common["tls_certificates"] = [
            {"certificate_chain": _filename(tls.cert_file), "private_key": _filename(tls.key_file)}
        ]
    context: dict[str, Any] = {"@type": _UPSTREAM_TLS, "common_tls_context": common}
    if not is_ip(server_name):
        context["sni"] = server_name
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _ads_source() -> dict[str, Any]:
    """CDS and LDS over ADS, as Istio's envoy_bootstrap.json (`dynamic_resources`) gives them:
    `initial_fetch_timeout: 0s` waits for the first response however long meshctl takes. Envoy's
    default (15 s) would then mark the resource initialized without any, and report LIVE with no
    listeners: a proxy that load balancers and `systemctl` take for ready and that drops every
    connection."""
    return {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}


def stats_config(inclusion: StatsInclusion = StatsInclusion()) -> dict[str, Any]:
    """Istio's `stats_config` (envoy_bootstrap.json): its tag extractors alone (no Envoy default
    tags, which would split names at every dot), and, with an inclusion list, Istio's stats
    matcher: the patterns Istio always keeps, then the given ones (pkg/bootstrap/config.go
    `getStatsOptions`, which appends its required patterns to the ProxyConfig's)."""
    config: dict[str, Any] = {"use_all_default_tags": False, "stats_tags": [dict(tag) for tag in STATS_TAGS]}
    if inclusion:
        patterns: list[dict[str, Any]] = []
        patterns += [{"prefix": p} for p in (*REQUIRED_INCLUSION_PREFIXES, *inclusion.prefixes)]
        patterns += [{"suffix": s} for s in (*REQUIRED_INCLUSION_SUFFIXES, *inclusion.suffixes)]
        patterns += [{"safe_regex": {"regex": r}} for r in (*REQUIRED_INCLUSION_REGEXES, *inclusion.regexes)]
        patterns += [{"prefix": p} for p in _ALWAYS_INCLUDED_PREFIXES]
        config["stats_matcher"] = {"inclusion_list": {"patterns": patterns}}
    return config


def build_bootstrap(node: ProxyNode, options: BootstrapOptions) -> dict[str, Any]:
    """The bootstrap as plain data (YAML or JSON for Envoy's `-c`); raises ValueError for options
    Envoy could not run with (`port_problem`, `StatsInclusion.problem`)."""
    metadata: dict[str, Any] = {
        **options.metadata,
        "NAMESPACE": node.namespace,
        "INTERCEPTION_MODE": node.interception.value,
    }
    if group := node.metadata.get("AUTO_REGISTER_GROUP"):
        metadata["AUTO_REGISTER_GROUP"] = str(group)
    labels = {**node.labels, **options.labels}
    if labels:
        metadata["LABELS"] = dict(labels)
    if options.dns_port:
        metadata["DNS_PORT"] = str(options.dns_port)
        metadata["DNS_FORWARD"] = "true" if options.dns_forward else "false"
    problem = port_problem(node, options) or options.stats_inclusion.problem()
    if problem is not None:
        raise ValueError(problem)
    ipv6 = ":" in node.ip
    static: dict[str, Any] = {"clusters": [xds_cluster(options)], "listeners": []}
    if options.stats_port:
        static["clusters"].append(admin_cluster(STATS_CLUSTER, options))
        static["listeners"].append(stats_listener(options.stats_port, ipv6=ipv6))
    if port := health_port(node, options):
        static["clusters"].append(admin_cluster(HEALTH_CLUSTER, options))
        static["listeners"].append(health_listener(port, ipv6=ipv6))
    if not static["listeners"]:
        del static["listeners"]
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
        "stats_config": stats_config(options.stats_inclusion),
        # Istio's envoy_bootstrap.json `deferred_stat_options` (ENABLE_DEFERRED_STATS_CREATION,
        # istio/istio#52654, always on since #56252): a cluster's traffic stats are created when
        # the cluster first carries a request. A sidecar holds a cluster per service and subset
        # of the mesh and talks to a few of them.
        "deferred_stat_options": {"enable_deferred_creation_stats": True},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if options.delta else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
            },
            "cds_config": _ads_source(),
            "lds_config": _ads_source(),
        },
        # The Health Discovery Service on the same servers (same cluster, so the same TLS): the
        # server tells this Envoy how to probe its own workload, and Envoy reports the results.
        "hds_config": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
        },
        "static_resources": static,
    }


def stats_port_problem(options: BootstrapOptions) -> str | None:
    """Why the Prometheus listener cannot be built with `options`, or None."""
    return _listener_port_problem("stats", options.stats_port, options)


def health_port_problem(node: ProxyNode, options: BootstrapOptions) -> str | None:
    """Why the health listener cannot be built for `node` with `options`, or None."""
    port = health_port(node, options)
    if port and port == options.stats_port:
        return f"the health port and the stats port are both {port}"
    return _listener_port_problem("health", port, options)


def port_problem(node: ProxyNode, options: BootstrapOptions) -> str | None:
    """Why the stats or the health listener cannot be built, or None."""
    return (stats_port_problem(options) if options.stats_port else None) or (
        health_port_problem(node, options) if health_port(node, options) else None
    )


def _listener_port_problem(what: str, port: int, options: BootstrapOptions) -> str | None:
    if not 0 < port < 65536:
        return f"the {what} port {port} is not a TCP port (1-65535, or 0 for none)"
    if options.admin_port == 0:
        return f"the {what} listener forwards to the admin port, which must then be a fixed port, not 0"
    if port == options.admin_port:
        return f"the {what} port and the admin port are both {options.admin_port}"
    return None


def admin_cluster(name: str, options: BootstrapOptions) -> dict[str, Any]:
    """A static cluster to the admin API: `prometheus_stats` (Istio's, envoy_bootstrap.json) for
    the Prometheus listener, `envoy_ready` for the health listener."""
    # An admin API on every address is still reached on loopback.
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(options.admin_address, options.admin_address)
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "load_assignment": _load_assignment(name, address, options.admin_port),
    }


def stats_cluster(options: BootstrapOptions) -> dict[str, Any]:
    """`prometheus_stats`: the admin API, as the Prometheus listener's upstream (Istio's cluster)."""
    return admin_cluster(STATS_CLUSTER, options)


def stats_listener(port: int, *, ipv6: bool = False) -> dict[str, Any]:
    """Istio's Prometheus listener (15090): `/stats/prometheus` on every address goes to the
    admin API; any other path is a 404 from this listener and never reaches the admin API."""
    # The path alone (Istio matches it as a prefix, which the admin API then refuses); the query
    # string is not part of it, so `?usedonly` and `?filter=` work as on the admin port.
    route = {"match": {"path": STATS_PATH}, "route": {"cluster": STATS_CLUSTER}}
    return _admin_listener(STATS_CLUSTER, port, route, stat_prefix="stats", ipv6=ipv6)


def health_listener(port: int, *, ipv6: bool = False) -> dict[str, Any]:
    """Istio's health listener (15021, envoy_bootstrap.json's second listener): `/healthz/ready`
    on every address answers from Envoy's readiness, the admin API's `/ready` (200 `LIVE`, 503
    `DRAINING`; Envoy opens its static listeners with its first config, so before that nothing
    answers); any other path is a 404. A load balancer health-checks a gateway VM here as it
    checks an Istio gateway pod."""
    route = {
        "match": {"path": HEALTH_PATH},
        # The whole path, query string aside: `/healthz/ready` is asked as `/ready`.
        "route": {"cluster": HEALTH_CLUSTER, "prefix_rewrite": READY_PATH},
    }
    # Istio's stat prefix for this listener (pilot-agent's); its stats read `http.agent.*`.
    return _admin_listener(HEALTH_CLUSTER, port, route, stat_prefix="agent", ipv6=ipv6)


def _admin_listener(name: str, port: int, route: dict[str, Any], *, stat_prefix: str, ipv6: bool) -> dict[str, Any]:
    """A listener on every address whose one route goes to an admin API cluster."""
    manager = {
        "@type": _HCM,
        "codec_type": "AUTO",
        "stat_prefix": stat_prefix,
        # `/stats/prometheus/../config_dump` is `/config_dump` before routing, and so a 404.
        "normalize_path": True,
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": [route]}],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "::" if ipv6 else "0.0.0.0", "port_value": port}},
        # Istio's static listeners (BYPASS_OVERLOAD_MANAGER_FOR_STATIC_LISTENERS): scrapes and
        # health checks are answered when a connection limit or overload turns traffic away.
        "ignore_global_conn_limit": True,
        "bypass_overload_manager": True,
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }


def _load_assignment(cluster: str, host: str, port: int) -> dict[str, Any]:
    """One endpoint, `host:port`, for a static or DNS cluster."""
    address = {"socket_address": {"address": host, "port_value": port}}
    return {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}]}


def xds_cluster(options: BootstrapOptions) -> dict[str, Any]:
    """The `xds-grpc` cluster: HTTP/2 with keepalives to meshctl serve, over TLS when asked.

    With several replicas (`BootstrapOptions.more_xds`) it has one endpoint per address (a name
    among them makes the cluster STRICT_DNS, which also takes every address a name resolves to)
    and, as Istio's xds-grpc cluster, TCP keepalive beside the HTTP/2 pings and a 1 s connect
    timeout: the ADS stream's replica dying ends the stream, and Envoy's retry picks the next
    endpoint (round robin), a dead one failing within the second. One address keeps the cluster
    as it always was.
    """
    addresses = options.xds_addresses
    static = all(is_ip(host) for host, _ in addresses)
    cluster: dict[str, Any] = {
        "name": XDS_CLUSTER,
        "type": "STATIC" if static else "STRICT_DNS",
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
    if options.more_xds:
        endpoints = [
            {"endpoint": {"address": {"socket_address": {"address": h, "port_value": n}}}} for h, n in addresses
        ]
        cluster["load_assignment"] = {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints": endpoints}]}
        # Istio's xds-grpc cluster (envoy_bootstrap.json): the kernel's keepalive on the connection.
        cluster["upstream_connection_options"] = {"tcp_keepalive": {"keepalive_time": 300}}
    if options.tls is not None:
        cluster["transport_socket"] = xds_transport_socket(options.tls, options.xds_host)
    return cluster
