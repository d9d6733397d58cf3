"""Envoy pieces every listener is made of: the HTTP connection manager, tcp_proxy, listener
filters, downstream TLS, and the filter chain options listeners are merged from.

Sidecar, inbound and gateway listeners differ in which pieces they combine, not in the pieces, so
the pieces are built once here with Istio's defaults (`pilot/pkg/networking/core/
listener_builder.go`, `networkfilter.go`, `listener.go`): an HCM with websocket upgrades, no
stream idle timeout, path normalization, `Expect: 100-continue` passed to the upstream, a UUID
request id and RDS over ADS; `grpc_stats`, `fault`, `cors` and `router` HTTP filters (the route
configs carry per-route fault and CORS config under those filter names); tcp_proxy with the idle
timeout and connection duration of the DestinationRule.

What Istio's buildHTTPConnectionManager adds beyond this needs Istio's own Envoy build or its
telemetry: the `istio.metadata_exchange`, `istio.alpn` and `istio.stats` filters exist only in
istio-proxy, and access logs and tracing follow MeshConfig and Telemetry resources meshctl does
not read.

`ChainOpts` is Istio's `filterChainOpts`: a chain's match criteria and filters, kept apart until
every service on a port has been seen, because two chains with the same match make Envoy reject
the whole listener and only the complete set shows which of them is the catch-all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.grpc_stats.v3 import config_pb2 as grpc_stats_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.listener.http_inspector.v3 import http_inspector_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.listener.original_src.v3 import original_src_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from envoy.type.v3 import hash_policy_pb2, range_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

HCM: Final = "envoy.filters.network.http_connection_manager"
TCP_PROXY: Final = "envoy.filters.network.tcp_proxy"
TLS_INSPECTOR: Final = "envoy.filters.listener.tls_inspector"
HTTP_INSPECTOR: Final = "envoy.filters.listener.http_inspector"
ORIGINAL_DST: Final = "envoy.filters.listener.original_dst"
ORIGINAL_SRC: Final = "envoy.filters.listener.original_src"
GRPC_STATS_FILTER: Final = "envoy.filters.http.grpc_stats"
#: HTTP filter names: route configs refer to these two in `typed_per_filter_config`.
FAULT_FILTER: Final = "envoy.filters.http.fault"
CORS_FILTER: Final = "envoy.filters.http.cors"
ROUTER_FILTER: Final = "envoy.filters.http.router"
#: Istio's EnvoyServerName: the `server` header of responses from inbound and gateway listeners
#: (outbound ones keep Envoy's own `envoy`, a leftover Istio keeps for compatibility).
ISTIO_SERVER_NAME: Final = "istio-envoy"
TLS_TRANSPORT_SOCKET: Final = "envoy.transport_sockets.tls"

RAW_BUFFER: Final = "raw_buffer"
TLS_TRANSPORT: Final = "tls"
#: What the HTTP inspector reports for plaintext HTTP/1.1 and HTTP/2 (Istio's `plaintextHTTPALPNs`).
PLAINTEXT_HTTP_ALPNS: Final = ("http/1.1", "h2c")
#: ALPN a terminating listener offers (Istio's `util.ALPNHttp`).
ALPN_HTTP: Final = ("h2", "http/1.1")
#: The name Istio gives the catch-all chain of an outbound listener, whatever cluster it uses.
PASSTHROUGH_FILTER_CHAIN: Final = "PassthroughFilterChain"


def typed(message: Message) -> any_pb2.Any:
    """`message` packed deterministically: filter configs hold protobuf maps (RBAC policies, a
    JSON access log's Struct) that Pack otherwise writes in an order that differs between
    processes, and replicas must send the same bytes and versions."""
    packed = any_pb2.Any()
    packed.Pack(message, deterministic=True)
    return packed


def zero_duration() -> duration_pb2.Duration:
    """An explicit 0s: Envoy reads it as "disabled", which differs from an unset field."""
    return duration_pb2.Duration(seconds=0)


def socket_address(ip: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=ip, port_value=port))


def cidr_range(text: str) -> Any:
    """`10.0.0.0/8` or a bare IP (a /32 or /128) as Envoy's CidrRange; None for anything else."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    return address_pb2.CidrRange(
        address_prefix=str(net.network_address), prefix_len=wrappers_pb2.UInt32Value(value=net.prefixlen)
    )


# -- network filters --------------------------------------------------------------------------


def network_filter(name: str, message: Message) -> listener_components_pb2.Filter:
    return listener_components_pb2.Filter(name=name, typed_config=typed(message))


def http_filters() -> list[hcm_pb2.HttpFilter]:
    """Istio's buildHTTPConnectionManager filter chain as far as upstream Envoy has the filters:
    grpc_stats (xdsfilters.GrpcStats: gRPC status counters per cluster, and the filter state
    access logs read), then fault and cors before the router: routes carry their per-route config
    under these names, and Envoy needs the filter in the chain for that config to take effect."""
    grpc_stats = grpc_stats_pb2.FilterConfig(emit_filter_state=True)
    grpc_stats.stats_for_all_methods.value = False
    return [
        hcm_pb2.HttpFilter(name=GRPC_STATS_FILTER, typed_config=typed(grpc_stats)),
        hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=typed(fault_pb2.HTTPFault())),
        hcm_pb2.HttpFilter(name=CORS_FILTER, typed_config=typed(cors_pb2.Cors())),
        hcm_pb2.HttpFilter(name=ROUTER_FILTER, typed_config=typed(router_pb2.Router())),
    ]


def ads_rds(route_config_name: str) -> hcm_pb2.Rds:
    """RDS over the ADS stream, waiting for the routes without a timeout as Istio does (a
    listener whose routes are late should not start serving 404s)."""
    return hcm_pb2.Rds(
        route_config_name=route_config_name,
        config_source=config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource(),
            initial_fetch_timeout=zero_duration(),
            resource_api_version=config_source_pb2.ApiVersion.V3,
        ),
    )


def request_id_extension() -> hcm_pb2.RequestIDExtension:
    """Istio's requestidextension.UUIDRequestIDExtension: UUID request ids, also used to decide
    trace sampling (what Envoy does without it too; Istio spells it out)."""
    config = uuid_pb2.UuidRequestIdConfig(use_request_id_for_trace_sampling=wrappers_pb2.BoolValue(value=True))
    return hcm_pb2.RequestIDExtension(typed_config=typed(config))


def http_connection_manager(
    *,
    stat_prefix: str,
    rds: str = "",
    route_config: route_pb2.RouteConfiguration | None = None,
    use_remote_address: bool = False,
    server_name: str = "",
    leading_filters: Sequence[hcm_pb2.HttpFilter] = (),
    routing_filters: Sequence[hcm_pb2.HttpFilter] = (),
) -> hcm_pb2.HttpConnectionManager:
    """Istio's `buildHTTPConnectionManager` defaults. `use_remote_address` is true only on
    gateways, where the client address is the real one; sidecars keep the app's trusted headers.
    `server_name` is Istio's ProxyHeaders server name (`istio-envoy` on inbound and gateway
    listeners, Envoy's default on outbound ones). `leading_filters` go before `http_filters()`,
    where Istio puts its authentication and authorization filters (RBAC); `routing_filters` right
    before the router, where they see the route a request takes (the dynamic forward proxy's)."""
    hcm = hcm_pb2.HttpConnectionManager(
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        # Ended by `;` as Istio's DelimitedStatsPrefix, for the bootstrap's tag extractors.
        stat_prefix=stat_prefix if stat_prefix.endswith(";") else f"{stat_prefix};",
        normalize_path=wrappers_pb2.BoolValue(value=True),
        path_with_escaped_slashes_action=hcm_pb2.HttpConnectionManager.KEEP_UNCHANGED,
        use_remote_address=wrappers_pb2.BoolValue(value=use_remote_address),
        upgrade_configs=[hcm_pb2.HttpConnectionManager.UpgradeConfig(upgrade_type="websocket")],
        stream_idle_timeout=zero_duration(),
        http_filters=[*leading_filters, *_before_router(http_filters(), routing_filters)],
        request_id_extension=request_id_extension(),
        # features.Enable100ContinueHeaders (on by default): the upstream sees the client's
        # `Expect: 100-continue` and answers it, where Envoy would answer 100 itself and strip it.
        proxy_100_continue=True,
        server_name=server_name,
    )
    if rds:
        hcm.rds.CopyFrom(ads_rds(rds))
    elif route_config is not None:
        hcm.route_config.CopyFrom(route_config)
    return hcm


def _before_router(filters: list[hcm_pb2.HttpFilter], extra: Sequence[hcm_pb2.HttpFilter]) -> list[hcm_pb2.HttpFilter]:
    """`filters` (ending with the router) with `extra` just before the router."""
    return [*filters[:-1], *extra, filters[-1]]


def hcm_filter(hcm: hcm_pb2.HttpConnectionManager) -> listener_components_pb2.Filter:
    return network_filter(HCM, hcm)


@dataclass(frozen=True, slots=True)
class TcpSettings:
    """What a DestinationRule changes on a tcp_proxy (Istio reads these from the connection pool
    and the consistent-hash load balancer of the destination's rule)."""

    idle_timeout: duration_pb2.Duration | None = None
    max_connection_duration: duration_pb2.Duration | None = None
    hash_source_ip: bool = False


def tcp_proxy_filter(
    stat_prefix: str,
    cluster: str = "",
    weighted: Sequence[tuple[str, int]] = (),
    settings: TcpSettings | None = None,
) -> listener_components_pb2.Filter:
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix)
    if weighted:
        for name, weight in weighted:
            proxy.weighted_clusters.clusters.add(name=name, weight=weight)
    else:
        proxy.cluster = cluster
    if settings is not None:
        if settings.idle_timeout is not None:
            proxy.idle_timeout.CopyFrom(settings.idle_timeout)
        if settings.max_connection_duration is not None:
            proxy.max_downstream_connection_duration.CopyFrom(settings.max_connection_duration)
        if settings.hash_source_ip:
            proxy.hash_policy.append(hash_policy_pb2.HashPolicy(source_ip=hash_policy_pb2.HashPolicy.SourceIp()))
    return network_filter(TCP_PROXY, proxy)


def cluster_filters(cluster: str) -> list[listener_components_pb2.Filter]:
    """A chain that sends every connection to one fixed cluster (passthrough, blackhole)."""
    return [tcp_proxy_filter(cluster, cluster)]


# -- listener filters -------------------------------------------------------------------------


def listener_filter(name: str, message: Message) -> listener_components_pb2.ListenerFilter:
    return listener_components_pb2.ListenerFilter(name=name, typed_config=typed(message))


def exclude_ports_predicate(ports: Sequence[int]) -> listener_components_pb2.ListenerFilterChainMatchPredicate | None:
    """A predicate true for connections to any of `ports` (Istio's `listenerPredicateExcludePorts`)."""
    pred_cls = listener_components_pb2.ListenerFilterChainMatchPredicate
    rules = [pred_cls(destination_port_range=range_pb2.Int32Range(start=p, end=p + 1)) for p in ports]
    if not rules:
        return None
    if len(rules) == 1:
        return rules[0]
    return pred_cls(or_match=pred_cls.MatchSet(rules=rules))


def _inspector(
    chains: Sequence[ChainOpts], need: Callable[[ChainOpts], bool], name: str, config: Message
) -> listener_components_pb2.ListenerFilter | None:
    """An inspector enabled exactly on the destination ports whose chains need it.

    Listener filters run before any chain is picked, and with no listener filter timeout an
    inspector waits for the client's first bytes: on a server-first protocol (MySQL, SMTP) that
    never comes. So, like Istio's `buildTLSInspector`/`buildHTTPInspector`, an inspector is turned
    off (`filter_disabled`) for ports whose chains do not look at what it detects.
    """
    port_need: dict[int, bool] = {}
    default_need = False
    has_default = False
    for c in chains:
        if c.destination_port:
            port_need[c.destination_port] = port_need.get(c.destination_port, False) or need(c)
        else:
            has_default = True
            default_need = default_need or need(c)
    if not default_need and not any(port_need.values()):
        return None
    lf = listener_filter(name, config)
    if default_need:
        predicate = exclude_ports_predicate(sorted(p for p, n in port_need.items() if not n))
        if predicate is not None:
            lf.filter_disabled.CopyFrom(predicate)
    elif has_default or not all(port_need.values()):
        enabled = exclude_ports_predicate(sorted(p for p, n in port_need.items() if n))
        lf.filter_disabled.not_match.CopyFrom(enabled)
    return lf


def inspectors(
    chains: Sequence[ChainOpts], *, tls_with_http: bool = False
) -> list[listener_components_pb2.ListenerFilter]:
    """The TLS and HTTP inspectors `chains` need, TLS first (a connection it marks as TLS is not
    sniffed for HTTP). `tls_with_http` adds the TLS inspector wherever the HTTP inspector runs, as
    Istio does on outbound listeners so that Envoy never injects one by itself."""

    def needs_tls(c: ChainOpts) -> bool:
        return c.needs_tls_inspector() or (tls_with_http and c.needs_http_inspector())

    out = []
    tls = _inspector(chains, needs_tls, TLS_INSPECTOR, tls_inspector_pb2.TlsInspector())
    if tls is not None:
        out.append(tls)
    http = _inspector(chains, ChainOpts.needs_http_inspector, HTTP_INSPECTOR, http_inspector_pb2.HttpInspector())
    if http is not None:
        out.append(http)
    return out


def original_dst() -> listener_components_pb2.ListenerFilter:
    return listener_filter(ORIGINAL_DST, original_dst_pb2.OriginalDst())


def original_src() -> listener_components_pb2.ListenerFilter:
    return listener_filter(ORIGINAL_SRC, original_src_pb2.OriginalSrc())


# -- filter chains ----------------------------------------------------------------------------


@dataclass(slots=True)
class ChainOpts:
    """One filter chain before it becomes Envoy config: its match criteria and its filters."""

    filters: list[listener_components_pb2.Filter]
    sni_hosts: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()
    transport_protocol: str = ""
    application_protocols: tuple[str, ...] = ()
    destination_port: int = 0
    tls_context: Any = None  # DownstreamTlsContext
    name: str = ""
    #: The protocol family the chain serves (`http` or `tcp`), for merge decisions.
    kind: str = "tcp"
    #: For people reading logs: which service or config produced the chain.
    origin: str = field(default="", compare=False)

    def is_match_all(self) -> bool:
        """Istio's `isMatchAll`: a `*` SNI matches anything, like no SNI."""
        return (
            (not self.sni_hosts or "*" in self.sni_hosts)
            and not self.application_protocols
            and not self.transport_protocol
            and not self.cidrs
            and not self.destination_port
        )

    def _sni_keys(self) -> frozenset[str]:
        """The SNI values the chain is indexed under in Envoy; "" stands for "no SNI match"."""
        if not self.sni_hosts or "*" in self.sni_hosts:
            return frozenset({""})
        return frozenset(self.sni_hosts)

    def _cidr_keys(self) -> frozenset[str]:
        out = set()
        for c in self.cidrs:
            rng = cidr_range(c)
            if rng is not None and rng.address_prefix not in ("0.0.0.0", "::"):
                out.add(f"{rng.address_prefix}/{rng.prefix_len.value}")
        return frozenset(out or {""})

    def conflicts_with(self, other: ChainOpts) -> bool:
        """True when Envoy would reject the two chains together: it indexes chains by each value
        of each criterion (an empty criterion being a value of its own), and refuses a listener
        where two chains end up under the same combination. So chains conflict when every
        criterion shares a value, e.g. one SNI name in common (stricter than Istio's
        `conflictsWith`, which compares whole SNI sets and lets such listeners be rejected)."""
        return (
            self.transport_protocol == other.transport_protocol
            and self.destination_port == other.destination_port
            and bool(frozenset(self.application_protocols or ("",)) & frozenset(other.application_protocols or ("",)))
            and bool(self._sni_keys() & other._sni_keys())
            and bool(self._cidr_keys() & other._cidr_keys())
        )

    def match(self) -> listener_components_pb2.FilterChainMatch | None:
        if self.is_match_all():
            return None
        m = listener_components_pb2.FilterChainMatch(
            transport_protocol=self.transport_protocol,
            application_protocols=list(self.application_protocols),
        )
        if self.destination_port:
            m.destination_port.value = self.destination_port
        if self.sni_hosts and "*" not in self.sni_hosts:
            m.server_names.extend(sorted(set(self.sni_hosts)))
        for c in sorted(self.cidrs):
            rng = cidr_range(c)
            if rng is not None and rng.address_prefix not in ("0.0.0.0", "::"):
                m.prefix_ranges.append(rng)
        return m

    def to_chain(self) -> listener_components_pb2.FilterChain:
        chain = listener_components_pb2.FilterChain(name=self.name, filters=self.filters)
        match = self.match()
        if match is not None:
            chain.filter_chain_match.CopyFrom(match)
        if self.tls_context is not None:
            chain.transport_socket.CopyFrom(
                base_pb2.TransportSocket(name=TLS_TRANSPORT_SOCKET, typed_config=typed(self.tls_context))
            )
        return chain

    def needs_tls_inspector(self) -> bool:
        """SNI, ALPN and the `tls` transport are only known after the TLS inspector ran."""
        alpn = self.tls_context is not None and len(self.tls_context.common_tls_context.alpn_protocols) > 0
        return bool(self.sni_hosts) or alpn or self.transport_protocol == TLS_TRANSPORT

    def needs_http_inspector(self) -> bool:
        """ALPN values on a TLS chain come from the TLS handshake, not from sniffing HTTP."""
        return bool(self.application_protocols) and self.transport_protocol != TLS_TRANSPORT


def merge_chains(current: list[ChainOpts], incoming: Iterable[ChainOpts]) -> list[ChainOpts]:
    """Append to `current` each incoming chain Envoy can tell apart from those already there; the
    first chain for a match wins, as in Istio's `mergeTCPFilterChains`. Returns the dropped ones."""
    dropped = []
    for chain in incoming:
        if any(existing.conflicts_with(chain) for existing in current):
            dropped.append(chain)
        else:
            current.append(chain)
    return dropped


def assemble_chains(
    listener: listener_pb2.Listener,
    chains: Sequence[ChainOpts],
    fallback: Sequence[listener_components_pb2.Filter] | None,
) -> None:
    """Put `chains` on `listener` as Istio's `buildListenerFromEntry` does: a match-all chain
    becomes the default chain when there are others (so a connection that starts matching a
    specific chain but fails later criteria still has somewhere to go), a lone match-all chain
    stays a plain chain, and when no chain matches everything `fallback` (if given) becomes the
    default `PassthroughFilterChain`."""
    default = None
    for opts in chains:
        chain = opts.to_chain()
        if opts.is_match_all():
            default = chain
        else:
            listener.filter_chains.append(chain)
    if default is not None and not listener.filter_chains:
        listener.filter_chains.append(default)
    elif default is not None:
        listener.default_filter_chain.CopyFrom(default)
    elif fallback is not None:
        listener.default_filter_chain.CopyFrom(
            listener_components_pb2.FilterChain(
                name=PASSTHROUGH_FILTER_CHAIN,
                filter_chain_match=listener_components_pb2.FilterChainMatch(),
                filters=list(fallback),
            )
        )
